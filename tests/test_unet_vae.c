/* test_unet_vae.c — Diffusers' UNet2DConditionModel and AutoencoderKL
 * loaded from the folders tests/ref/ref_unet_vae.py writes (argv[1]) and
 * run against its plain-PyTorch reference: every block's output and the
 * whole model's within 1e-4 of max(1, max|ref|) with f32 weights (SD 1.x
 * conv projections, SD 2.x linear projections with per-block head counts
 * and two transformer layers, three levels with a scaled mid block; VAE
 * encode (mean, logvar) and decode, two and three levels, with and without
 * the mid attention and the quant convs, legacy attention names); bf16
 * weights within 1e-2 of the reference run with the same bf16-rounded
 * weights; compiled == eager; the UNet split over cpu:0 / cpu:1 at two
 * points == on one device, bit for bit; errors naming the fault. */
#include "models/diffusion_blocks.h"
#include "tessera_diffusion.h"
#include "tessera_io.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *root;

#define F32_TOL  1e-4 /* of max(1, max|ref|) */
#define BF16_TOL 1e-2 /* bf16 weights vs the reference with them rounded */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_safetensors *io_open(ts_ctx *ctx, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s.io.safetensors", root, name);
    ts_safetensors *st = NULL;
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    return st;
}

static ts_tensor *io_get(ts_safetensors *st, const char *fmt, int k) {
    char name[128];
    snprintf(name, sizeof name, fmt, k);
    return st ? ts_safetensors_get(st, name) : NULL;
}

static float *read_all(ts_tensor *t) {
    int64_t n = ts_tensor_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (v && ts_tensor_read(t, v, TS_F32) != TS_OK) {
        free(v);
        return NULL;
    }
    return v;
}

static bool same_shape(ts_tensor *a, ts_tensor *b) {
    return a && b && ts_tensor_ndim(a) == ts_tensor_ndim(b) &&
           !memcmp(ts_tensor_shape(a), ts_tensor_shape(b),
                   sizeof(int64_t) * (size_t)ts_tensor_ndim(a));
}

/* max |a - ref| / max(1, max |ref|); 1e30 when shapes differ */
static double rel_err(ts_tensor *a, ts_tensor *ref) {
    if (!same_shape(a, ref))
        return 1e30;
    float *x = read_all(a), *y = read_all(ref);
    double d = 0, m = 1;
    for (int64_t i = 0; x && y && i < ts_tensor_numel(a); i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        d = e > d || isnan(e) ? e : d;
        m = fabs((double)y[i]) > m ? fabs((double)y[i]) : m;
    }
    if (!x || !y)
        d = 1e30;
    free(x), free(y);
    return d / m;
}

static void check_close(const char *what, ts_tensor *a, ts_tensor *ref,
                        double tol) {
    double e = rel_err(a, ref);
    printf("  %-34s rel err %.3g\n", what, e);
    ts_test_checks++;
    if (!(e <= tol)) {
        ts_test_failures++;
        fprintf(stderr, "%s: rel err %.3g > %g\n", what, e, tol);
    }
}

static bool same_bits(ts_tensor *a, ts_tensor *b) {
    if (!same_shape(a, b))
        return false;
    float *x = read_all(a), *y = read_all(b);
    bool eq =
        x && y && !memcmp(x, y, sizeof(float) * (size_t)ts_tensor_numel(a));
    free(x), free(y);
    return eq;
}

static void path(char *p, size_t cap, const char *name) {
    snprintf(p, cap, "%s/%s", root, name);
}

/* ---- UNet ---- */

static void test_unet(ts_ctx *ctx, const char *name, bool split_and_time) {
    printf("%s\n", name);
    char p[1024];
    path(p, sizeof p, name);
    ts_unet *u = NULL;
    CHECK_OK(ctx, ts_unet_load(ctx, p, NULL, &u));
    ts_safetensors *io = io_open(ctx, name);
    if (!u || !io) {
        ts_unet_free(u);
        if (io)
            ts_safetensors_close(io);
        return;
    }
    CHECK(ts_unet_in_channels(u) == 4 && ts_unet_sample_size(u) == 16 &&
          ts_unet_cross_attention_dim(u) == 32 && ts_unet_param_bytes(u) > 0);
    ts_tensor *sample = io_get(io, "sample", 0), *t = io_get(io, "timestep", 0),
              *ehs = io_get(io, "ehs", 0), *ref = io_get(io, "out", 0),
              *ref16 = io_get(io, "out_bf16", 0);
    int nb = ts_unet_num_blocks(u);
    ts_tensor *blocks[2 * DZ_MAX_ARRAY + 3] = {0};
    ts_tensor *out = dz_unet_forward_blocks(u, sample, t, ehs, blocks);
    CHECK(out != NULL);
    for (int k = 0; k < nb; k++) {
        char what[64];
        snprintf(what, sizeof what, "block %d", k);
        ts_tensor *r = io_get(io, "block.%d", k);
        check_close(what, blocks[k], r, F32_TOL);
        ts_release(r), ts_release(blocks[k]);
    }
    check_close("unet output (f32 weights)", out, ref, F32_TOL);
    /* the public entry is the same computation */
    ts_tensor *again = ts_unet_forward(u, sample, t, ehs);
    CHECK(same_bits(again, out));
    ts_release(again);

    /* compiled: recorded and replayed */
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *comp = ts_unet_forward(u, sample, t, ehs);
    double ce = rel_err(comp, out);
    ts_set_mode(ctx, TS_MODE_EAGER);
    printf("  compiled vs eager: %s (rel %.3g)\n",
           same_bits(comp, out) ? "same bits" : "differ", ce);
    CHECK(ce <= 1e-6);
    ts_release(comp);

    if (split_and_time) {
        double t0 = now_s();
        int reps = 3;
        for (int r = 0; r < reps; r++)
            ts_release(ts_unet_forward(u, sample, t, ehs));
        printf("  forward (B 2, 16x16, eager, f32): %.1f ms\n",
               1e3 * (now_s() - t0) / reps);
        /* split over cpu:0 / cpu:1 at two points == one device, bit for bit */
        int splits[2] = {2, nb - 2};
        for (int s = 0; s < 2; s++) {
            ts_component_opts o = {.dtype = TS_F32,
                                   .set = true,
                                   .device = {TS_DEVICE_CPU, 0},
                                   .split_block = splits[s],
                                   .device2 = {TS_DEVICE_CPU, 1}};
            ts_unet *us = NULL;
            CHECK_OK(ctx, ts_unet_load(ctx, p, &o, &us));
            ts_device_stats before, after;
            ts_device_get_stats(ctx, o.device2, &before);
            ts_tensor *so = ts_unet_forward(us, sample, t, ehs);
            ts_device_get_stats(ctx, o.device2, &after);
            CHECK(so && ts_tensor_device(so).index == 1);
            CHECK(after.transfers_in > before.transfers_in);
            CHECK(same_bits(so, out));
            printf("  split at block %d over cpu:0/cpu:1: %s\n", splits[s],
                   same_bits(so, out) ? "same bits" : "DIFFERS");
            ts_release(so);
            ts_unet_free(us);
        }
    }

    /* bf16 weights */
    ts_component_opts o16 = {.dtype = TS_BF16};
    ts_unet *u16 = NULL;
    CHECK_OK(ctx, ts_unet_load(ctx, p, &o16, &u16));
    CHECK(u16 && ts_unet_param_bytes(u16) < ts_unet_param_bytes(u));
    ts_tensor *o_16 = ts_unet_forward(u16, sample, t, ehs);
    check_close("unet output (bf16 weights)", o_16, ref16, BF16_TOL);
    printf("  bf16 weights vs the f32 reference: rel %.3g\n",
           rel_err(o_16, ref));
    ts_release(o_16);
    ts_unet_free(u16);

    ts_release(out);
    ts_release(sample), ts_release(t), ts_release(ehs), ts_release(ref);
    ts_release(ref16);
    ts_safetensors_close(io);
    ts_unet_free(u);
}

/* ---- VAE ---- */

static void test_vae(ts_ctx *ctx, const char *name, const char *io_name,
                     double scaling, int downscale) {
    printf("%s\n", name);
    char p[1024];
    path(p, sizeof p, name);
    ts_vae *v = NULL;
    CHECK_OK(ctx, ts_vae_load(ctx, p, NULL, &v));
    ts_safetensors *io = io_open(ctx, io_name);
    if (!v || !io) {
        ts_vae_free(v);
        if (io)
            ts_safetensors_close(io);
        return;
    }
    CHECK(ts_vae_scaling_factor(v) == scaling);
    CHECK(ts_vae_shift_factor(v) == 0);
    CHECK(ts_vae_latent_channels(v) == 4 && ts_vae_downscale(v) == downscale);
    CHECK(ts_vae_param_bytes(v) > 0);
    ts_tensor *image = io_get(io, "image", 0), *z = io_get(io, "z", 0);
    int ns = dz_vae_stages(v);
    ts_tensor *st[DZ_MAX_ARRAY + 3] = {0};
    /* decoder, stage by stage */
    ts_tensor *dec = dz_vae_decode_stages(v, z, st);
    for (int k = 0; k < ns; k++) {
        char what[64];
        snprintf(what, sizeof what, "decoder stage %d", k);
        ts_tensor *r = io_get(io, "dec.%d", k);
        check_close(what, st[k], r, F32_TOL);
        ts_release(r), ts_release(st[k]);
    }
    ts_tensor *rdec = io_get(io, "dec", 0);
    ts_tensor *dec2 = ts_vae_decode(v, z);
    check_close("vae decode (f32 weights)", dec2, rdec, F32_TOL);
    CHECK(same_bits(dec, dec2));
    /* encoder, stage by stage */
    ts_tensor *mom = dz_vae_encode_stages(v, image, st);
    for (int k = 0; k < ns; k++) {
        char what[64];
        snprintf(what, sizeof what, "encoder stage %d", k);
        ts_tensor *r = io_get(io, "enc.%d", k);
        check_close(what, st[k], r, F32_TOL);
        ts_release(r), ts_release(st[k]);
    }
    ts_release(mom);
    ts_tensor *mean = NULL, *logvar = NULL;
    CHECK_OK(ctx, ts_vae_encode(v, image, &mean, &logvar));
    ts_tensor *rmean = io_get(io, "mean", 0), *rlv = io_get(io, "logvar", 0);
    check_close("vae encode mean (f32 weights)", mean, rmean, F32_TOL);
    check_close("vae encode logvar (f32 weights)", logvar, rlv, F32_TOL);

    /* compiled == eager */
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *cdec = ts_vae_decode(v, z);
    ts_tensor *cm = NULL, *clv = NULL;
    CHECK_OK(ctx, ts_vae_encode(v, image, &cm, &clv));
    double e1 = rel_err(cdec, dec), e2 = rel_err(cm, mean),
           e3 = rel_err(clv, logvar);
    ts_set_mode(ctx, TS_MODE_EAGER);
    printf("  compiled vs eager: decode %s, mean %s, logvar %s (rel %.3g)\n",
           same_bits(cdec, dec) ? "same bits" : "differ",
           same_bits(cm, mean) ? "same bits" : "differ",
           same_bits(clv, logvar) ? "same bits" : "differ",
           fmax(e1, fmax(e2, e3)));
    CHECK(e1 <= 1e-6 && e2 <= 1e-6 && e3 <= 1e-6);
    ts_release(cdec), ts_release(cm), ts_release(clv);

    /* bf16 weights */
    ts_component_opts o16 = {.dtype = TS_BF16};
    ts_vae *v16 = NULL;
    CHECK_OK(ctx, ts_vae_load(ctx, p, &o16, &v16));
    ts_tensor *d16 = ts_vae_decode(v16, z), *m16 = NULL, *l16 = NULL;
    CHECK_OK(ctx, ts_vae_encode(v16, image, &m16, &l16));
    ts_tensor *rd16 = io_get(io, "dec_bf16", 0),
              *rm16 = io_get(io, "mean_bf16", 0),
              *rl16 = io_get(io, "logvar_bf16", 0);
    check_close("vae decode (bf16 weights)", d16, rd16, BF16_TOL);
    check_close("vae encode mean (bf16 weights)", m16, rm16, BF16_TOL);
    check_close("vae encode logvar (bf16 weights)", l16, rl16, BF16_TOL);
    ts_release(d16), ts_release(m16), ts_release(l16);
    ts_release(rd16), ts_release(rm16), ts_release(rl16);
    ts_vae_free(v16);

    ts_release(dec), ts_release(dec2), ts_release(rdec);
    ts_release(mean), ts_release(logvar), ts_release(rmean), ts_release(rlv);
    ts_release(image), ts_release(z);
    ts_safetensors_close(io);
    ts_vae_free(v);
}

/* ---- errors ---- */

static void expect_unet_error(ts_ctx *ctx, const char *name, const char *n1,
                              const char *n2) {
    char p[1024];
    path(p, sizeof p, name);
    ts_unet *u = NULL;
    ts_clear_error(ctx);
    ts_status s = ts_unet_load(ctx, p, NULL, &u);
    printf("  %s: %s\n", name, ts_errmsg(ctx));
    CHECK(s != TS_OK && u == NULL);
    CHECK_MSG(ctx, n1);
    if (n2)
        CHECK_MSG(ctx, n2);
    ts_unet_free(u);
}

static void test_errors(ts_ctx *ctx) {
    printf("errors\n");
    expect_unet_error(ctx, "err_no_weights",
                      "diffusion_pytorch_model.safetensors", "err_no_weights");
    expect_unet_error(ctx, "err_block_type", "down_block_types[1]",
                      "unknown block type \"SimpleCrossAttnDownBlock2D\"");
    expect_unet_error(ctx, "err_shape", "down_blocks.0.resnets.0.conv1.weight",
                      "(32, 32, 3, 1)");
    expect_unet_error(ctx, "err_missing",
                      "mid_block.attentions.0.proj_out.bias", "missing");
    expect_unet_error(ctx, "err_scale_shift", "resnet_time_scale_shift",
                      "scale_shift");
    expect_unet_error(ctx, "no_such_folder", "config.json", NULL);
    char p[1024];
    path(p, sizeof p, "err_vae_block_type");
    ts_vae *v = NULL;
    ts_clear_error(ctx);
    CHECK(ts_vae_load(ctx, p, NULL, &v) != TS_OK && !v);
    printf("  err_vae_block_type: %s\n", ts_errmsg(ctx));
    CHECK_MSG(ctx, "up_block_types[1]");
    CHECK_MSG(ctx, "AttnUpDecoderBlock2D");
    /* a UNet folder is not a VAE */
    path(p, sizeof p, "unet_a");
    ts_clear_error(ctx);
    CHECK(ts_vae_load(ctx, p, NULL, &v) != TS_OK);
    CHECK_MSG(ctx, "UNet2DConditionModel");
    /* a split past the last block */
    ts_component_opts o = {.split_block = 99, .device2 = {TS_DEVICE_CPU, 1}};
    ts_unet *u = NULL;
    ts_clear_error(ctx);
    CHECK(ts_unet_load(ctx, p, &o, &u) != TS_OK && !u);
    CHECK_MSG(ctx, "split_block 99");
    /* bad inputs to the forwards */
    CHECK_OK(ctx, ts_unet_load(ctx, p, NULL, &u));
    int64_t s_bad[4] = {2, 3, 16, 16}, s_ok[4] = {2, 4, 16, 16},
            s_odd[4] = {2, 4, 15, 16}, e_bad[3] = {2, 7, 16}, t_sh[1] = {2};
    ts_tensor *bad = ts_zeros(ctx, TS_F32, 4, s_bad),
              *ok = ts_zeros(ctx, TS_F32, 4, s_ok),
              *odd = ts_zeros(ctx, TS_F32, 4, s_odd),
              *eb = ts_zeros(ctx, TS_F32, 3, e_bad),
              *tt = ts_zeros(ctx, TS_F32, 1, t_sh);
    int64_t e_ok[3] = {2, 7, 32};
    ts_tensor *eo = ts_zeros(ctx, TS_F32, 3, e_ok);
    ts_clear_error(ctx);
    CHECK(!ts_unet_forward(u, bad, tt, eo));
    CHECK_MSG(ctx, "sample");
    ts_clear_error(ctx);
    CHECK(!ts_unet_forward(u, ok, tt, eb));
    CHECK_MSG(ctx, "encoder_hidden_states");
    ts_clear_error(ctx);
    CHECK(!ts_unet_forward(u, odd, tt, eo));
    CHECK_MSG(ctx, "multiples of 2");
    ts_clear_error(ctx);
    ts_release(bad), ts_release(ok), ts_release(odd), ts_release(eb);
    ts_release(tt), ts_release(eo);
    ts_unet_free(u);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_unet_vae FIXTURE_DIR\n");
        return 2;
    }
    root = argv[1];
    ts_ctx *ctx = test_ctx();
    test_unet(ctx, "unet_a", true);
    test_unet(ctx, "unet_b", false);
    test_unet(ctx, "unet_c", false);
    test_vae(ctx, "vae_a", "vae_a", 0.18215, 2);
    test_vae(ctx, "vae_b", "vae_b", 0.13025, 4);
    test_vae(ctx, "vae_c", "vae_c", 0.18215, 2);
    test_vae(ctx, "vae_legacy", "vae_a", 0.18215, 2);
    test_errors(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_unet_vae");
}
