/* diffuse.c — `tessera diffuse -m DIR ...`: an image from a Diffusers
 * pipeline folder (text-to-image, image-to-image, class-to-image), written
 * as a PNG (libpng, src/io/image.c), a float array in [0, 1] or the final
 * latents (.npy), with a progress bar over the denoising steps. */
#include "opts.h"
#include "tessera_diffusion.h"
#include "tessera_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    O_MODEL = 1,
    O_PROMPT,
    O_NEG,
    O_STEPS,
    O_GUIDANCE,
    O_SEED,
    O_SIZE,
    O_SCHED,
    O_OUT,
    O_CLASS,
    O_IMAGE,
    O_STRENGTH,
    O_LATENTS,
    O_OTYPE,
    O_N,
    O_DTYPE,
    O_DEVICES,
    O_MAP,
    O_CFGPAR,
    O_BATCHDEV,
    O_QUIET,
    O_COMPILE
};

static const cli_opt DIFFUSE_OPTS[] = {
    {O_MODEL, "-m, --model", CLI_STR, "DIR",
     .help = "a Diffusers pipeline folder (model_index.json)"},
    {O_PROMPT, "-p, --prompt", CLI_STR, "TEXT",
     .help = "what to draw (text-to-image pipelines)"},
    {O_NEG, "--negative-prompt", CLI_STR, "TEXT", .def = "\"\"",
     .help = "what to steer away from (the unconditional branch)"},
    {O_CLASS, "--class", CLI_STR, "LABEL",
     .help = "class-conditional models: a label of id2label (\"A\") or a "
             "class number"},
    {O_STEPS, "--steps", CLI_INT, "N", 1, 1000, .def = "25",
     .help = "denoising steps"},
    {O_GUIDANCE, "--guidance", CLI_NUM, "G", 0, 100, .def = "7.5",
     .help = "classifier-free guidance scale (<= 1: none)"},
    {O_SEED, "--seed", CLI_INT, "N", 0, 9007199254740991.0, .def = "0",
     .help = "seed of the initial noise"},
    {O_SIZE, "--size", CLI_STR, "WxH", .def = "the model's",
     .help = "image size, multiples of the VAE's factor"},
    {O_SCHED, "--scheduler", CLI_CHOICE, "NAME",
     .choices = "ddim|euler|dpm++2m", .def = "the folder's",
     .help = "the sampler"},
    {O_N, "-n, --num-images", CLI_INT, "N", 1, 64, .def = "1",
     .help = "images in the batch (written OUT, OUT-1, ...)"},
    {O_IMAGE, "--image", CLI_STR, "IN.png",
     .help = "image-to-image: the starting image"},
    {O_STRENGTH, "--strength", CLI_NUM, "S", 0.001, 1, .def = "0.8",
     .help = "image-to-image: how much noise replaces the image"},
    {O_LATENTS, "--latents", CLI_STR, "IN.npy",
     .help = "the initial noise (B, C, h, w), as a Diffusers pipeline's "
             "latents= argument"},
    {O_OTYPE, "--output-type", CLI_CHOICE, "TYPE", .choices = "png|np|latent",
     .def = "png",
     .help = "png; np: the image as a float array in [0, 1] (.npy, (B, H, "
             "W, C) as Diffusers' output_type=\"np\"); latent: the final "
             "latents (.npy)"},
    {O_OUT, "-o, --out", CLI_STR, "FILE", .def = "out.png or out.npy",
     .help = "where to write"},
    {O_DTYPE, "--dtype", CLI_CHOICE, "T", .choices = "f32|bf16", .def = "f32",
     .help = "the weights' dtype"},
    {O_DEVICES, "--devices", CLI_STR, "LIST", .def = "cpu:0",
     .help = "devices for balanced, cfg-parallel and batch splitting "
             "(\"cpu:0,cpu:1\")"},
    {O_MAP, "--device-map", CLI_STR, "MAP",
     .help = "balanced, or per component: \"unet=cpu:1,vae=cpu:0\"; "
             "\"unet=cpu:0+cpu:1[@BLOCK]\" splits the UNet"},
    {O_CFGPAR, "--cfg-parallel", CLI_FLAG,
     .help = "guidance's two branches on two of --devices"},
    {O_BATCHDEV, "--batch-devices", CLI_INT, "N", 1, 8, .def = "1",
     .help = "split the batch's images over N of --devices"},
    {O_COMPILE, "--compile", CLI_FLAG,
     .help = "compiled mode (each step captured once and replayed)"},
    {O_QUIET, "-q, --quiet", CLI_FLAG, .help = "no progress bar"},
    {0},
};

static const cli_cmd DIFFUSE_CMD = {
    .name = "diffuse",
    .usage = "diffuse -m DIR (--prompt TEXT | --class LABEL) [--steps 25] "
             "[--guidance 7.5] [--seed 1] [--size 512x512] [--out out.png]",
    .about = "Draws images with a Diffusers pipeline folder as downloaded: "
             "Stable Diffusion-style (CLIP text encoder, UNet, VAE) from a "
             "prompt, optionally starting from --image; DiT-style "
             "class-conditional models from --class.",
    .opts = DIFFUSE_OPTS,
};

typedef struct {
    bool quiet;
    double t0;
} bar_state;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bar(void *arg, int i, int n) {
    bar_state *b = arg;
    if (b->quiet)
        return;
    int w = 30, fill = n ? i * w / n : w;
    double el = now() - b->t0;
    fprintf(stderr, "\r%3d%%|", n ? 100 * i / n : 100);
    for (int k = 0; k < w; k++)
        fputc(k < fill ? '#' : ' ', stderr);
    fprintf(stderr, "| %d/%d [%.1fs, %.2f s/step]", i, n, el, i ? el / i : 0.0);
    if (i == n)
        fputc('\n', stderr);
    fflush(stderr);
}

/* out, out-1, out-2 ... before the extension */
static void nth_path(const char *out, int k, char *buf, size_t cap) {
    if (k == 0) {
        snprintf(buf, cap, "%s", out);
        return;
    }
    const char *dot = strrchr(out, '.');
    const char *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash))
        dot = out + strlen(out);
    snprintf(buf, cap, "%.*s-%d%s", (int)(dot - out), out, k, dot);
}

static int write_outputs(ts_ctx *ctx, ts_tensor *img, int otype,
                         const char *out) {
    if (otype != 0) { /* np: (B, H, W, C); latent: as is */
        int perm[4] = {0, 2, 3, 1};
        ts_tensor *pm = otype == 1 ? ts_permute(img, perm) : ts_retain(img);
        ts_tensor *c = pm ? ts_contiguous(pm) : NULL;
        ts_release(pm);
        ts_status s = c ? ts_npy_write(ctx, out, c) : ts_ctx_status(ctx);
        ts_release(c);
        if (s)
            return fprintf(stderr, "tessera diffuse: %s\n", ts_errmsg(ctx)), 1;
        fprintf(stderr, "wrote %s\n", out);
        return 0;
    }
    int64_t B = ts_tensor_dim(img, 0);
    for (int64_t b = 0; b < B; b++) {
        char path[1100];
        nth_path(out, (int)b, path, sizeof path);
        ts_tensor *v = ts_slice(img, 0, b, b + 1, 1);
        ts_tensor *one = v ? ts_squeeze(v, 0) : NULL;
        ts_release(v);
        ts_status s = one ? ts_png_write(ctx, path, one) : ts_ctx_status(ctx);
        ts_release(one);
        if (s)
            return fprintf(stderr, "tessera diffuse: %s\n", ts_errmsg(ctx)), 1;
        fprintf(stderr, "wrote %s\n", path);
    }
    return 0;
}

int tessera_diffuse(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *size = NULL, *image = NULL,
               *latents = NULL, *cls = NULL, *devices = NULL, *map = NULL;
    ts_diffusion_request r = {.guidance = 7.5, .strength = 0.8, .class_id = -1};
    ts_pipeline_opts po = {.dtype = TS_F32};
    int otype = 0;
    bool quiet = false, compile = false;
    static const char *sched_names[] = {"ddim", "euler", "dpm++2m"};
    cli_parser p;
    cli_val v;
    cli_begin(&p, &DIFFUSE_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        switch (id) {
        case CLI_HELP:
            return cli_help(&DIFFUSE_CMD, stdout), 0;
        case CLI_ERROR:
            return 2;
        case CLI_POSITIONAL:
            return cli_fail(&DIFFUSE_CMD, "unexpected argument \"%s\"", v.s);
        case O_MODEL:
            model = v.s;
            break;
        case O_PROMPT:
            r.prompt = v.s;
            break;
        case O_NEG:
            r.negative_prompt = v.s;
            break;
        case O_CLASS:
            cls = v.s;
            break;
        case O_STEPS:
            r.steps = (int)v.i;
            break;
        case O_GUIDANCE:
            r.guidance = v.num;
            break;
        case O_SEED:
            r.seed = (uint64_t)v.i;
            break;
        case O_SIZE:
            size = v.s;
            break;
        case O_SCHED:
            r.scheduler = sched_names[v.choice];
            break;
        case O_N:
            r.num_images = (int)v.i;
            break;
        case O_IMAGE:
            image = v.s;
            break;
        case O_STRENGTH:
            r.strength = v.num;
            break;
        case O_LATENTS:
            latents = v.s;
            break;
        case O_OTYPE:
            otype = v.choice;
            break;
        case O_OUT:
            out = v.s;
            break;
        case O_DTYPE:
            po.dtype = v.choice ? TS_BF16 : TS_F32;
            break;
        case O_DEVICES:
            devices = v.s;
            break;
        case O_MAP:
            map = v.s;
            break;
        case O_CFGPAR:
            po.cfg_parallel = true;
            break;
        case O_BATCHDEV:
            po.batch_devices = (int)v.i;
            break;
        case O_COMPILE:
            compile = true;
            break;
        case O_QUIET:
            quiet = true;
            break;
        default:
            break;
        }
    }
    if (!model)
        return cli_fail(&DIFFUSE_CMD, "give the pipeline folder with -m DIR");
    if (size) {
        char x;
        if (sscanf(size, "%d%c%d", &r.width, &x, &r.height) != 3 ||
            (x != 'x' && x != 'X') || r.width < 1 || r.height < 1)
            return cli_fail(&DIFFUSE_CMD,
                            "--size \"%s\": expected WIDTHxHEIGHT, e.g. "
                            "512x512",
                            size);
    }
    if (!out)
        out = otype == 0 ? "out.png" : "out.npy";
    po.devices = devices;
    po.device_map = map;
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_pipeline *pl = NULL;
    ts_tensor *img = NULL;
    int rc = 1;
    if (ts_pipeline_load(ctx, model, &po, &pl))
        goto done;
    if (ts_pipeline_is_class_conditional(pl)) {
        if (!cls) {
            fprintf(stderr,
                    "tessera diffuse: %s is class-conditional: give "
                    "--class LABEL\n",
                    model);
            rc = 2;
            goto quiet_done;
        }
        if ((r.class_id = ts_pipeline_class_id(pl, cls)) < 0)
            goto done;
    } else if (!r.prompt) {
        fprintf(stderr, "tessera diffuse: %s draws from text: give --prompt\n",
                model);
        rc = 2;
        goto quiet_done;
    }
    if (image && !(r.init_image = ts_png_read(ctx, image)))
        goto done;
    if (latents && !(r.latents = ts_npy_read(ctx, latents)))
        goto done;
    if (!image)
        r.strength = 0;
    r.latents_only = otype == 2;
    bar_state bs = {.quiet = quiet, .t0 = now()};
    r.progress = bar;
    r.progress_arg = &bs;
    if (!quiet) {
        char desc[1024];
        ts_pipeline_describe(pl, desc, sizeof desc);
        fputs(desc, stderr);
    }
    if (compile)
        ts_set_mode(ctx, TS_MODE_COMPILED);
    if (ts_pipeline_generate(pl, &r, &img))
        goto done;
    rc = write_outputs(ctx, img, otype, out);
    goto quiet_done;
done:
    fprintf(stderr, "tessera diffuse: %s\n", ts_errmsg(ctx));
quiet_done:
    ts_release(img);
    ts_release(r.init_image);
    ts_release(r.latents);
    ts_pipeline_free(pl);
    ts_ctx_free(ctx);
    return rc;
}
