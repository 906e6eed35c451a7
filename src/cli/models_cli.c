/* models_cli.c — `tessera info` and `tessera logits`: a Hugging Face model
 * folder's architecture, size and the memory it needs to run, and the
 * logits of given token ids (any architecture, any device_map) written as
 * a .npy file (f32, (T, V)) for checking against other implementations. */
#include "tessera.h"
#include "tessera_io.h"
#include "tessera_models.h"

#include "cli/opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "tessera: %s: %s\n", what, ts_errmsg(ctx));
    ts_ctx_free(ctx);
    return 1;
}

static const char *act_name(ts_act a) {
    return a == TS_ACT_SILU        ? "silu"
           : a == TS_ACT_GELU_TANH ? "gelu (tanh)"
                                   : "gelu (erf)";
}

static const char *ordinal(int n) {
    return n % 100 / 10 == 1 ? "th"
           : n % 10 == 2     ? "nd"
           : n % 10 == 3     ? "rd"
                             : "th";
}

/* The decoder description, one line a part: what differs between the
 * families (ts_model_config's second half). */
static void print_description(const ts_model_config *c) {
    printf("norm           %s, eps %g%s%s\n",
           c->norm == TS_NORM_LAYER    ? "LayerNorm with bias"
           : c->norm == TS_NORM_RMS_1P ? "RMSNorm x (1 + w)"
                                       : "RMSNorm",
           c->norm_eps,
           c->sandwich_norm ? "; attention and MLP outputs normed too" : "",
           c->qk_norm ? "; q and k normed per head" : "");
    if (c->pos == TS_POS_LEARNED)
        printf("positions      learned (%lld)\n", (long long)c->max_positions);
    else {
        char scaling[160] = "";
        if (c->rope == TS_ROPE_LINEAR)
            snprintf(scaling, sizeof scaling, ", linear x%g", c->rope_factor);
        else if (c->rope == TS_ROPE_LLAMA3)
            snprintf(scaling, sizeof scaling,
                     ", llama3 x%g (frequency factors %g..%g, from %lld)",
                     c->rope_factor, c->rope_low_freq_factor,
                     c->rope_high_freq_factor,
                     (long long)c->rope_original_max_positions);
        else if (c->rope == TS_ROPE_LONGROPE)
            snprintf(scaling, sizeof scaling,
                     ", longrope x%g (%d factors, long past %lld; attention "
                     "x%.4g)",
                     c->rope_factor, c->rope_n_factors,
                     (long long)c->rope_original_max_positions,
                     c->rope_attention_factor);
        else if (c->rope == TS_ROPE_YARN)
            snprintf(scaling, sizeof scaling,
                     ", yarn x%g (from %lld, beta %g/%g; attention x%.4g)",
                     c->rope_factor, (long long)c->rope_original_max_positions,
                     c->rope_beta_fast, c->rope_beta_slow,
                     c->rope_attention_factor);
        char local[64] = "";
        if (c->rope_local_theta > 0)
            snprintf(local, sizeof local, "; sliding layers theta %g",
                     c->rope_local_theta);
        printf("positions      rope theta %g%s%s%s\n", c->rope_theta, scaling,
               local[0] && c->rope != TS_ROPE_DEFAULT ? " on global layers"
                                                      : "",
               local);
    }
    char scale[48];
    if (c->attn_scale > 0)
        snprintf(scale, sizeof scale, "scale %g", c->attn_scale);
    else
        snprintf(scale, sizeof scale, "scale 1/sqrt(%lld)",
                 (long long)c->head_dim);
    char cap[40] = "";
    if (c->attn_softcap > 0)
        snprintf(cap, sizeof cap, "; scores capped at %g", c->attn_softcap);
    printf("attention      %s%s%s%s%s\n", scale, cap,
           c->fused_qkv ? "; one qkv matrix" : "",
           c->attention_bias ? (c->o_bias ? "; biases on q, k, v and o"
                                          : "; biases on q, k and v")
                             : "",
           c->conv1d ? "; Conv1D (in, out) matrices" : "");
    if (c->sliding_window <= 0)
        printf("sliding window none\n");
    else {
        int64_t n = 0;
        for (int64_t i = 0; i < c->layers; i++)
            n += ts_model_layer_sliding(c, i);
        char which[96] = "every layer";
        if (c->sliding_pattern >= 2 && c->sliding_from > 0)
            snprintf(which, sizeof which, "layers from %lld but every %d%s",
                     (long long)c->sliding_from, c->sliding_pattern,
                     ordinal(c->sliding_pattern));
        else if (c->sliding_pattern >= 2)
            snprintf(which, sizeof which, "every layer but every %d%s",
                     c->sliding_pattern, ordinal(c->sliding_pattern));
        else if (c->sliding_from > 0)
            snprintf(which, sizeof which, "layers from %lld",
                     (long long)c->sliding_from);
        printf("sliding window %lld tokens on %s (%lld of %lld layers)\n",
               (long long)c->sliding_window, which, (long long)n,
               (long long)c->layers);
    }
    printf("mlp act        %s%s%s%s\n", act_name(c->act),
           c->gated ? ", gated (act(gate) x up)" : "",
           c->fused_gate_up ? "; one gate_up matrix" : "",
           c->mlp_bias ? "; biases" : "");
    if (c->n_experts <= 0)
        printf("experts        none\n");
    else {
        int64_t n = 0;
        for (int64_t i = 0; i < c->layers; i++)
            n += ts_model_layer_moe(c, i);
        printf("experts        %lld, top %lld%s, each %lld wide, on %lld of "
               "%lld layers; aux loss x%g\n",
               (long long)c->n_experts, (long long)c->experts_per_tok,
               c->norm_topk_prob ? " (weights renormalized)" : "",
               (long long)c->moe_intermediate, (long long)n,
               (long long)c->layers, c->router_aux_loss_coef);
    }
    char fcap[40] = "";
    if (c->final_softcap > 0)
        snprintf(fcap, sizeof fcap, "; logits capped at %g", c->final_softcap);
    printf("embedding      %s%s%s\n",
           c->tie_word_embeddings ? "tied" : "untied",
           c->embed_scale ? "; inputs x sqrt(hidden)" : "", fcap);
}

static const cli_opt INFO_OPTS[] = {
    {1, "-m, --model", CLI_STR, "DIR",
     .help = "the model folder; also the positional argument"},
    {0},
};

static const cli_cmd INFO_CMD = {
    .name = "info",
    .usage = "info [-m] DIR",
    .about = "A Hugging Face model folder's architecture, size and the memory "
             "it needs to run.",
    .opts = INFO_OPTS,
    .positional = "  DIR                         the model folder (as -m)\n",
    .short_threads = true,
};

int tessera_info(int argc, char **argv) {
    const char *dir = NULL;
    cli_parser p;
    cli_val v;
    cli_begin(&p, &INFO_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(&INFO_CMD, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (dir && id == CLI_POSITIONAL)
            return cli_fail(&INFO_CMD, "one model folder only (got %s and %s)",
                            dir, v.s);
        dir = v.s;
    }
    if (!dir)
        return cli_fail(&INFO_CMD, "no model: give its folder (-m DIR or DIR)");
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_model_config c;
    if (ts_model_dir_check(ctx, dir, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS) !=
        TS_OK)
        return fail(ctx, "-m takes a model folder");
    if (ts_config_load(ctx, dir, &c) != TS_OK)
        return fail(ctx, "config");
    ts_safetensors *st;
    if (ts_safetensors_open(ctx, dir, &st) != TS_OK)
        return fail(ctx, "weights");
    int64_t params = 0, bytes = 0;
    int dtypes[TS_DTYPE_COUNT] = {0};
    for (int i = 0; i < ts_safetensors_count(st); i++) {
        ts_tensor *t = ts_safetensors_get(st, ts_safetensors_name(st, i));
        if (!t) {
            ts_safetensors_close(st);
            return fail(ctx, "weights");
        }
        params += ts_tensor_numel(t);
        bytes += ts_dtype_nbytes(ts_tensor_dtype(t), ts_tensor_numel(t));
        dtypes[ts_tensor_dtype(t)]++;
        ts_release(t);
    }
    printf("architecture   %s\n", c.model_type);
    printf("layers         %lld\nhidden         %lld\nheads          %lld "
           "(%lld KV heads, "
           "head dim %lld)\nmlp            %lld\nvocab          %lld\nmax "
           "positions  %lld\n",
           (long long)c.layers, (long long)c.hidden, (long long)c.heads,
           (long long)c.kv_heads, (long long)c.head_dim,
           (long long)c.intermediate, (long long)c.vocab,
           (long long)c.max_positions);
    print_description(&c);
    printf("parameters     %lld (%.1f M) in %d tensors\n", (long long)params,
           params / 1e6, ts_safetensors_count(st));
    printf("stored dtypes ");
    for (int d = 0; d < TS_DTYPE_COUNT; d++)
        if (dtypes[d])
            printf(" %s x %d", ts_dtype_name((ts_dtype)d), dtypes[d]);
    printf("\nweights        %.1f MiB on disk; in memory %.1f MiB as f32, "
           "%.1f MiB as bf16 (--dtype bf16)\n",
           bytes / 1048576.0, params * 4 / 1048576.0, params * 2 / 1048576.0);
    /* K and V of every layer, f32, per position (sliding layers keep
     * fewer past their window; not counted) */
    int64_t kv_heads = c.kv_heads;
    double kv_tok =
        2.0 * (double)c.layers * (double)kv_heads * (double)c.head_dim * 4;
    int64_t ctx_len = c.max_positions < 4096 ? c.max_positions : 4096;
    printf("KV cache       %.1f KiB per token (f32); %lld tokens: %.1f MiB\n",
           kv_tok / 1024, (long long)ctx_len, kv_tok * ctx_len / 1048576.0);
    printf("memory needed  %.1f MiB (bf16 weights) / %.1f MiB (f32) for one "
           "sequence of %lld tokens, plus activations\n",
           (params * 2 + kv_tok * ctx_len) / 1048576.0,
           (params * 4 + kv_tok * ctx_len) / 1048576.0, (long long)ctx_len);
    ts_safetensors_close(st);
    ts_ctx_free(ctx);
    return 0;
}

/* A .npy file (format 1.0) of f32 data with the given shape. */
static int write_npy(const char *path, const float *data, int nd,
                     const int64_t *shape) {
    char hdr[256], dims[160] = "";
    for (int d = 0; d < nd; d++)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%lld%s",
                 (long long)shape[d], nd == 1 || d + 1 < nd ? ", " : "");
    int n = snprintf(
        hdr, sizeof hdr,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    unsigned short hl = (unsigned short)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f), fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    size_t count = 1;
    for (int d = 0; d < nd; d++)
        count *= (size_t)shape[d];
    size_t w = fwrite(data, sizeof(float), count, f);
    return fclose(f) == 0 && w == count ? 0 : -1;
}

enum { L_MODEL = 1, L_IDS, L_OUT, L_DEVICE_MAP, L_DTYPE, L_NO_CHECK };

static const cli_opt LOGITS_OPTS[] = {
    {L_MODEL, "-m, --model", CLI_STR, "DIR", .help = "the model folder"},
    {L_IDS, "--ids", CLI_STR, "1,2,3", .help = "the token ids (at most 4096)"},
    {L_OUT, "--out", CLI_STR, "FILE.npy",
     .help = "where the logits go: f32, (T, V)"},
    {L_DTYPE, "--dtype", CLI_CHOICE, .choices = "f32|bf16", .def = "f32",
     .help = "the weights' type in memory"},
    {L_DEVICE_MAP, "--device-map, --device", CLI_STR, "MAP", .def = "the CPU",
     .help = "a device (cpu, vulkan:0) or a split of the model over devices"},
    {L_NO_CHECK, "--no-check-weights", CLI_FLAG,
     .help = "load weights holding NaN/Inf"},
    {0},
};

static const cli_cmd LOGITS_CMD = {
    .name = "logits",
    .usage = "logits -m DIR --ids 1,2,3 --out FILE.npy [options]",
    .about = "The logits of every position of the given token ids, as a .npy "
             "file, for checking against other implementations.",
    .opts = LOGITS_OPTS,
    .short_threads = true,
};

int tessera_logits(int argc, char **argv) {
    const char *dir = NULL, *ids_arg = NULL, *out = NULL, *map = NULL;
    ts_dtype wdt = TS_F32;
    bool no_check = false;
    cli_parser p;
    cli_val v;
    cli_begin(&p, &LOGITS_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        switch (id) {
        case CLI_HELP:
            cli_help(&LOGITS_CMD, stdout);
            return 0;
        case CLI_ERROR:
            return 2;
        case CLI_POSITIONAL:
            return cli_fail(&LOGITS_CMD, "unexpected argument \"%s\"", v.s);
        case L_MODEL:
            dir = v.s;
            break;
        case L_IDS:
            ids_arg = v.s;
            break;
        case L_OUT:
            out = v.s;
            break;
        case L_DEVICE_MAP:
            map = v.s;
            break;
        case L_DTYPE:
            wdt = v.choice ? TS_BF16 : TS_F32;
            break;
        case L_NO_CHECK:
            no_check = true;
            break;
        }
    }
    if (!dir || !ids_arg || !out)
        return cli_fail(&LOGITS_CMD,
                        "%s is required (see tessera logits "
                        "--help)",
                        !dir       ? "-m DIR"
                        : !ids_arg ? "--ids"
                                   : "--out");
    int64_t ids[4096];
    int n = 0;
    for (const char *p = ids_arg; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || n == 4096 || (*end && *end != ',')) {
            fprintf(
                stderr,
                "tessera logits: --ids wants comma-separated token ids >= 0 "
                "(at most 4096); got \"%s\"\n",
                ids_arg);
            return 2;
        }
        ids[n++] = v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "tessera logits: --ids is empty\n");
        return 2;
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_lm *m;
    ts_load_options lo = {
        .weight_dtype = wdt, .device_map = map, .no_check_weights = no_check};
    if (ts_lm_load(ctx, dir, &lo, &m) != TS_OK)
        return fail(ctx, "model");
    int64_t shape[2] = {1, n};
    ts_tensor *t = ts_from_data(ctx, TS_I64, 2, shape, ids);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *logits = ts_lm_forward(m, t);
    ts_set_grad_enabled(ctx, old);
    ts_release(t);
    if (!logits) {
        ts_lm_free(m);
        return fail(ctx, "forward");
    }
    ts_tensor *hl = ts_to_device(logits, (ts_device){TS_DEVICE_CPU, 0});
    ts_release(logits);
    logits = hl;
    if (!logits) {
        ts_lm_free(m);
        return fail(ctx, "forward");
    }
    int64_t oshape[2] = {n, ts_tensor_dim(logits, 2)};
    int rc = write_npy(out, ts_tensor_data(logits), 2, oshape);
    if (rc)
        fprintf(stderr, "tessera logits: cannot write %s: %s\n", out,
                strerror(errno));
    ts_release(logits);
    ts_lm_free(m);
    ts_ctx_free(ctx);
    return rc ? 1 : 0;
}
