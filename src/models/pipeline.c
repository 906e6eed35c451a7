/* pipeline.c — a Diffusers pipeline folder run end to end: model_index.json
 * read, the components loaded (unet.c, vae.c, clip_text.c, dit.c, the
 * tokenizer, scheduler.c) and placed on devices, and the denoising loop of
 * StableDiffusionPipeline / StableDiffusionImg2ImgPipeline / DiTPipeline
 * with classifier-free guidance. Placement (ts_pipeline_opts): one device,
 * "balanced", a map per component, the UNet split over two devices, the
 * guidance branches on two devices, a batch's images over several. The
 * loop runs each branch and each device's images as their own denoiser
 * call, so every placement computes the same products on the same rows
 * and gives the same bits as one device. */
#include "diffusion_internal.h"

#include "tessera_tokenizer.h"

#include "core/core.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_REPLICAS TS_MAX_DEVICES
#define MAX_LABELS   4096

enum { C_TEXT, C_UNET, C_VAE, C_DIT, C_COUNT };
static const char *comp_names[C_COUNT] = {"text_encoder", "unet", "vae",
                                          "transformer"};

struct ts_pipeline {
    ts_ctx *ctx;
    char dir[DZ_PATH_LEN];
    char class_name[64];
    bool class_cond;
    ts_pipeline_opts opts;
    ts_device host;
    /* the devices "balanced", CFG-parallel and batch splitting use */
    int n_devices;
    ts_device devices[TS_MAX_DEVICES];
    /* placement per component, and the UNet's split */
    ts_device place[C_COUNT];
    int unet_split;
    ts_device unet_dev2;
    /* components; the denoiser (unet or dit) replicated per device for
     * CFG-parallel and batch splitting */
    ts_tokenizer *tok;
    ts_clip_text *text;
    ts_vae *vae;
    int n_rep;
    ts_unet *unet[MAX_REPLICAS];
    ts_dit *dit[MAX_REPLICAS];
    ts_device rep_dev[MAX_REPLICAS];
    ts_scheduler *sched;
    ts_scheduler_kind sched_kind; /* the folder's; a request may pick another */
    char sched_path[DZ_PATH_LEN];
    /* DiT: id2label */
    int n_labels;
    char **labels;
    size_t bytes[C_COUNT];
};

/* ---- model_index.json -----------------------------------------------------
 */

static bool is_dir_entry(json_t *v, const char *cls) {
    /* a component: ["diffusers", "UNet2DConditionModel"] */
    return json_is_array(v) && json_array_size(v) == 2 &&
           json_is_string(json_array_get(v, 1)) &&
           (!cls || !strcmp(json_string_value(json_array_get(v, 1)), cls));
}

static ts_status read_labels(ts_pipeline *p, json_t *id2label,
                             const char *path) {
    if (!id2label)
        return TS_OK;
    if (!json_is_object(id2label))
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                            "%s: id2label should be an object of \"id\": "
                            "\"label\"",
                            path);
    size_t n = json_object_size(id2label);
    if (n > MAX_LABELS)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                            "%s: id2label has %zu entries (at most %d)", path,
                            n, MAX_LABELS);
    p->labels = calloc(n + 1, sizeof(char *));
    if (!p->labels)
        return ts_set_error(p->ctx, TS_ERR_OOM, "id2label: out of memory");
    p->n_labels = (int)n;
    const char *key;
    json_t *v;
    json_object_foreach(id2label, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        if (*end || end == key || id < 0 || id >= (long)n ||
            !json_is_string(v) || p->labels[id])
            return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                                "%s: id2label entry \"%s\" should map a "
                                "unique id 0..%zu to a string",
                                path, key, n - 1);
        p->labels[id] = strdup(json_string_value(v));
        if (!p->labels[id])
            return ts_set_error(p->ctx, TS_ERR_OOM, "id2label: out of memory");
    }
    return TS_OK;
}

/* ---- placement -------------------------------------------------------------
 */

static ts_status parse_devices(ts_pipeline *p, const char *list) {
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                            "devices: list too long");
    p->n_devices = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        if (p->n_devices == TS_MAX_DEVICES)
            return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                                "devices: more than %d", TS_MAX_DEVICES);
        if (ts_device_parse(p->ctx, t, &p->devices[p->n_devices]))
            return p->ctx->status;
        p->n_devices++;
    }
    if (!p->n_devices)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG, "devices: empty list");
    return TS_OK;
}

static int comp_index(const char *name, size_t len) {
    for (int k = 0; k < C_COUNT; k++)
        if (strlen(comp_names[k]) == len && !strncmp(comp_names[k], name, len))
            return k;
    return -1;
}

/* "unet=cpu:0+cpu:1@4,vae=cpu:1" */
static ts_status parse_map(ts_pipeline *p, const char *map) {
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", map) >= (int)sizeof buf)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG, "device_map: too long");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        int c = eq ? comp_index(t, (size_t)(eq - t)) : -1;
        if (c < 0)
            return ts_set_error(
                p->ctx, TS_ERR_INVALID_ARG,
                "device_map: \"%s\" should be COMPONENT=DEVICE with "
                "COMPONENT one of text_encoder, unet, vae, transformer "
                "(or the whole map \"balanced\")",
                t);
        char *dev = eq + 1, *plus = strchr(dev, '+');
        if (plus && c != C_UNET)
            return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                                "device_map: \"%s\": only the unet splits "
                                "over two devices",
                                t);
        if (plus) {
            *plus = 0;
            char *at = strchr(plus + 1, '@');
            if (at) {
                *at = 0;
                char *end;
                long b = strtol(at + 1, &end, 10);
                if (*end || b < 1 || b > 1000)
                    return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                                        "device_map: unet split block \"%s\" "
                                        "should be a block number >= 1",
                                        at + 1);
                p->unet_split = (int)b;
            } else {
                p->unet_split = -1; /* at the middle block */
            }
            if (ts_device_parse(p->ctx, plus + 1, &p->unet_dev2))
                return p->ctx->status;
        }
        if (ts_device_parse(p->ctx, dev, &p->place[c]))
            return p->ctx->status;
    }
    return TS_OK;
}

/* ---- loading ---------------------------------------------------------------
 */

static ts_component_opts comp_opts(const ts_pipeline *p, ts_device d) {
    return (ts_component_opts){
        .dtype = p->opts.dtype, .set = true, .device = d};
}

static ts_status sub_dir(ts_pipeline *p, const char *name, char *out) {
    if (snprintf(out, DZ_PATH_LEN, "%s/%s", p->dir, name) >= DZ_PATH_LEN)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG, "path too long: %s",
                            p->dir);
    return TS_OK;
}

/* sizes of the components from their weights files' headers, for
 * "balanced" before anything is loaded */
static size_t comp_file_bytes(ts_pipeline *p, const char *name) {
    char d[DZ_PATH_LEN];
    if (sub_dir(p, name, d))
        return 0;
    const char *files[2] = {"diffusion_pytorch_model.safetensors",
                            "model.safetensors"};
    for (int k = 0; k < 2; k++) {
        char f[DZ_PATH_LEN + 64];
        snprintf(f, sizeof f, "%s/%s", d, files[k]);
        FILE *fp = fopen(f, "rb");
        if (!fp)
            continue;
        fseek(fp, 0, SEEK_END);
        long n = ftell(fp);
        fclose(fp);
        return n > 0 ? (size_t)n : 0;
    }
    return 0;
}

static ts_status place_balanced(ts_pipeline *p, const bool *present) {
    size_t size[C_COUNT] = {0}, load[TS_MAX_DEVICES] = {0};
    bool done[C_COUNT] = {false};
    for (int c = 0; c < C_COUNT; c++)
        size[c] = present[c] ? comp_file_bytes(p, comp_names[c]) : 0;
    for (int round = 0; round < C_COUNT; round++) {
        int best = -1;
        for (int c = 0; c < C_COUNT; c++)
            if (present[c] && !done[c] && (best < 0 || size[c] > size[best]))
                best = c;
        if (best < 0)
            break;
        int dv = 0;
        for (int k = 1; k < p->n_devices; k++)
            if (load[k] < load[dv])
                dv = k;
        p->place[best] = p->devices[dv];
        load[dv] += size[best];
        done[best] = true;
    }
    return TS_OK;
}

/* the UNet's blocks (ts_unet_num_blocks: conv_in and the time embedding,
 * each down block, the mid block, each up block, the output) counted from
 * dir/config.json before loading; 0 when it cannot be read (the load then
 * reports why) */
static int unet_blocks(const char *dir) {
    char path[DZ_PATH_LEN + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    json_t *down = json_object_get(j, "down_block_types");
    json_t *up = json_object_get(j, "up_block_types");
    int n = json_is_array(down) && json_is_array(up)
                ? (int)(json_array_size(down) + json_array_size(up)) + 3
                : 0;
    json_decref(j);
    return n;
}

static ts_status load_denoiser(ts_pipeline *p) {
    char d[DZ_PATH_LEN];
    if (sub_dir(p, p->class_cond ? "transformer" : "unet", d))
        return p->ctx->status;
    /* replica 0 where the map puts it, the others on the next devices */
    int want = 1;
    if (p->opts.cfg_parallel)
        want = 2;
    if (p->opts.batch_devices > 1)
        want = p->opts.batch_devices;
    if (want > 1 && p->n_devices < want)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                            "%s needs %d devices; --devices lists %d",
                            p->opts.cfg_parallel ? "cfg-parallel"
                                                 : "batch over devices",
                            want, p->n_devices);
    if (want > 1 && p->unet_split)
        return ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                            "a split unet and cfg-parallel or batch over "
                            "devices cannot be combined");
    int c = p->class_cond ? C_DIT : C_UNET;
    for (int r = 0; r < want; r++) {
        ts_device dev = r == 0 ? p->place[c] : p->devices[r];
        if (r > 0 && ts_device_equal(dev, p->place[c]))
            dev = p->devices[0];
        ts_component_opts o = comp_opts(p, dev);
        p->rep_dev[r] = dev;
        ts_status s;
        if (p->class_cond) {
            s = ts_dit_load(p->ctx, d, &o, &p->dit[r]);
        } else {
            if (r == 0 && p->unet_split) {
                o.device2 = p->unet_dev2;
                o.split_block = p->unet_split > 0 ? p->unet_split : 0;
                if (p->unet_split < 0) /* the middle block */
                    o.split_block = (unet_blocks(d) + 1) / 2;
            }
            s = ts_unet_load(p->ctx, d, &o, &p->unet[r]);
        }
        if (s)
            return s;
        p->n_rep = r + 1;
    }
    p->bytes[c] = p->class_cond ? ts_dit_param_bytes(p->dit[0])
                                : ts_unet_param_bytes(p->unet[0]);
    return TS_OK;
}

ts_status ts_pipeline_load(ts_ctx *ctx, const char *dir,
                           const ts_pipeline_opts *opts, ts_pipeline **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_pipeline_load: NULL argument");
    *out = NULL;
    ts_pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return ts_set_error(ctx, TS_ERR_OOM, "pipeline: out of memory");
    p->ctx = ctx;
    p->opts = opts ? *opts : (ts_pipeline_opts){0};
    p->host = (ts_device){TS_DEVICE_CPU, 0};
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    char path[DZ_PATH_LEN + 32];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    json_error_t je;
    json_t *mi = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    ts_status s = TS_OK;
    bool present[C_COUNT] = {false};
    if (!mi || !json_is_object(mi)) {
        s = ts_set_error(ctx, TS_ERR_IO,
                         "%s: %s (a Diffusers pipeline folder has a "
                         "model_index.json)",
                         path, mi ? "not a JSON object" : je.text);
        goto done;
    }
    const char *cls = json_string_value(json_object_get(mi, "_class_name"));
    snprintf(p->class_name, sizeof p->class_name, "%s", cls ? cls : "");
    static const char *known[] = {"StableDiffusionPipeline",
                                  "StableDiffusionImg2ImgPipeline",
                                  "DiTPipeline"};
    bool known_class = false;
    for (size_t k = 0; k < sizeof known / sizeof *known; k++)
        known_class = known_class || (cls && !strcmp(cls, known[k]));
    if (!known_class) {
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: _class_name \"%s\" is not supported "
                         "(StableDiffusionPipeline, "
                         "StableDiffusionImg2ImgPipeline, DiTPipeline)",
                         path, cls ? cls : "");
        goto done;
    }
    for (int c = 0; c < C_COUNT; c++)
        present[c] = is_dir_entry(json_object_get(mi, comp_names[c]), NULL);
    p->class_cond = present[C_DIT];
    if (p->class_cond ? false : !(present[C_UNET] && present[C_TEXT])) {
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: pipeline \"%s\" has neither a transformer "
                         "(DiTPipeline) nor a unet with a text_encoder "
                         "(StableDiffusionPipeline)",
                         path, p->class_name);
        goto done;
    }
    if (p->class_cond && !is_dir_entry(json_object_get(mi, "transformer"),
                                       "DiTTransformer2DModel")) {
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: transformer class %s is not supported (only "
                         "DiTTransformer2DModel)",
                         path,
                         json_string_value(json_array_get(
                             json_object_get(mi, "transformer"), 1)));
        goto done;
    }
    if ((s = read_labels(p, json_object_get(mi, "id2label"), path)))
        goto done;
    /* devices and placement */
    ts_device here = ts_get_device(ctx);
    p->devices[0] = here;
    p->n_devices = 1;
    if (p->opts.devices && (s = parse_devices(p, p->opts.devices)))
        goto done;
    for (int c = 0; c < C_COUNT; c++)
        p->place[c] = p->devices[0];
    const char *map = p->opts.device_map;
    if (map && !strcmp(map, "balanced"))
        s = place_balanced(p, present);
    else if (map && *map)
        s = parse_map(p, map);
    if (s)
        goto done;
    if (p->opts.batch_devices < 0 || p->opts.batch_devices > TS_MAX_DEVICES) {
        s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "batch over devices: %d devices (1 to %d)",
                         p->opts.batch_devices, TS_MAX_DEVICES);
        goto done;
    }
    /* components */
    char d[DZ_PATH_LEN];
    if ((s = load_denoiser(p)))
        goto done;
    if (present[C_VAE]) {
        ts_component_opts o = comp_opts(p, p->place[C_VAE]);
        if ((s = sub_dir(p, "vae", d)) ||
            (s = ts_vae_load(ctx, d, &o, &p->vae)))
            goto done;
        p->bytes[C_VAE] = ts_vae_param_bytes(p->vae);
    } else if (!p->class_cond) {
        s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "%s: a text-to-image pipeline needs a vae", path);
        goto done;
    }
    if (!p->class_cond) {
        ts_component_opts o = comp_opts(p, p->place[C_TEXT]);
        if ((s = sub_dir(p, "text_encoder", d)) ||
            (s = ts_clip_text_load(ctx, d, &o, &p->text)))
            goto done;
        p->bytes[C_TEXT] = ts_clip_text_param_bytes(p->text);
        if (ts_unet_cross_attention_dim(p->unet[0]) !=
            ts_clip_text_hidden_size(p->text)) {
            s = ts_set_error(ctx, TS_ERR_SHAPE,
                             "%s: the unet's cross_attention_dim (%lld) is "
                             "not the text_encoder's hidden_size (%lld)",
                             dir,
                             (long long)ts_unet_cross_attention_dim(p->unet[0]),
                             (long long)ts_clip_text_hidden_size(p->text));
            goto done;
        }
        if ((s = sub_dir(p, "tokenizer", d)) ||
            (s = ts_tokenizer_load(ctx, d, &p->tok)))
            goto done;
    }
    snprintf(p->sched_path, sizeof p->sched_path,
             "%s/scheduler/scheduler_config.json", dir);
    if ((s = ts_scheduler_load(ctx, p->sched_path, &p->sched)))
        goto done;
    p->sched_kind = ts_scheduler_get_kind(p->sched);
done:
    if (mi)
        json_decref(mi);
    if (s) {
        ts_pipeline_free(p);
        return s;
    }
    *out = p;
    return TS_OK;
}

void ts_pipeline_free(ts_pipeline *p) {
    if (!p)
        return;
    for (int r = 0; r < MAX_REPLICAS; r++) {
        ts_unet_free(p->unet[r]);
        ts_dit_free(p->dit[r]);
    }
    ts_vae_free(p->vae);
    ts_clip_text_free(p->text);
    ts_tokenizer_free(p->tok);
    ts_scheduler_free(p->sched);
    for (int k = 0; k < p->n_labels; k++)
        free(p->labels[k]);
    free(p->labels);
    free(p);
}

bool ts_pipeline_is_class_conditional(const ts_pipeline *p) {
    return p && p->class_cond;
}

int ts_pipeline_num_classes(const ts_pipeline *p) {
    return p && p->class_cond ? (int)ts_dit_num_classes(p->dit[0]) : 0;
}

static bool label_matches(const char *label, const char *want, bool fold) {
    /* "tench, Tinca tinca": each comma-separated synonym */
    size_t wl = strlen(want);
    for (const char *s = label; *s;) {
        while (*s == ' ')
            s++;
        const char *e = strchr(s, ',');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        while (l && s[l - 1] == ' ')
            l--;
        if (l == wl && (fold ? !strncasecmp(s, want, l) : !strncmp(s, want, l)))
            return true;
        if (!e)
            break;
        s = e + 1;
    }
    return false;
}

int ts_pipeline_class_id(ts_pipeline *p, const char *label) {
    if (!p || !label)
        return -1;
    int n = ts_pipeline_num_classes(p);
    for (int fold = 0; fold < 2; fold++)
        for (int k = 0; k < p->n_labels; k++)
            if (p->labels[k] && label_matches(p->labels[k], label, fold))
                return k;
    char *end;
    long v = strtol(label, &end, 10);
    if (*label && !*end && v >= 0 && v < n)
        return (int)v;
    ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                 "class \"%s\": not a label of %s/model_index.json's "
                 "id2label (%d labels) nor a class number 0..%d",
                 label, p->dir, p->n_labels, n - 1);
    return -1;
}

void ts_pipeline_default_size(const ts_pipeline *p, int *width, int *height) {
    int64_t s = p->class_cond ? ts_dit_sample_size(p->dit[0])
                              : ts_unet_sample_size(p->unet[0]);
    int f = p->vae ? ts_vae_downscale(p->vae) : 1;
    *width = *height = (int)(s * f);
}

void ts_pipeline_describe(const ts_pipeline *p, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int c = 0; c < C_COUNT && o < cap; c++) {
        if (!p->bytes[c])
            continue;
        char d1[32], d2[32];
        ts_device_name(c == C_UNET || c == C_DIT ? p->rep_dev[0] : p->place[c],
                       d1);
        o += (size_t)snprintf(buf + o, cap - o, "%s: %s", comp_names[c], d1);
        if (c == C_UNET && p->unet_split && o < cap)
            o += (size_t)snprintf(buf + o, cap - o, " + %s",
                                  ts_device_name(p->unet_dev2, d2));
        for (int r = 1; r < p->n_rep && (c == C_UNET || c == C_DIT) && o < cap;
             r++)
            o += (size_t)snprintf(buf + o, cap - o, ", replica on %s",
                                  ts_device_name(p->rep_dev[r], d2));
        if (o < cap)
            o += (size_t)snprintf(buf + o, cap - o, " (%.1f MB)\n",
                                  (double)p->bytes[c] / 1e6);
    }
}

/* ---- the loop --------------------------------------------------------------
 */

static ts_tensor *on(ts_tensor *t, ts_device d) {
    if (!t)
        return NULL;
    if (ts_device_equal(ts_tensor_device(t), d))
        return ts_retain(t);
    return ts_to_device(t, d);
}

/* rows [a, b) of x along dim 0 as a contiguous tensor on d */
static ts_tensor *rows_on(ts_tensor *x, int64_t a, int64_t b, ts_device d) {
    ts_tensor *v = ts_slice(x, 0, a, b, 1);
    ts_tensor *c = v ? ts_contiguous(v) : NULL;
    ts_release(v);
    ts_tensor *r = on(c, d);
    ts_release(c);
    return r;
}

/* the prompt's embeddings (B, 77, D) on the text encoder's device */
static ts_tensor *encode_prompt(ts_pipeline *p, const char *text, int64_t B) {
    int T = (int)ts_clip_text_max_positions(p->text);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * B + 1)), nv;
    if (!ids) {
        ts_set_error(p->ctx, TS_ERR_OOM, "prompt: out of memory");
        return NULL;
    }
    ts_tensor *emb = NULL;
    if (ts_tokenizer_encode_padded(p->tok, text, strlen(text), T, ids, &nv) ==
        TS_OK) {
        for (int64_t b = 1; b < B; b++)
            memcpy(ids + b * T, ids, sizeof(int32_t) * (size_t)T);
        int64_t shape[2] = {B, T};
        ts_tensor *t = ts_from_data(p->ctx, TS_I32, 2, shape, ids);
        ts_tensor *td = on(t, p->place[C_TEXT]);
        emb = td ? ts_clip_text_forward(p->text, td) : NULL;
        ts_release(t), ts_release(td);
    }
    free(ids);
    return emb;
}

/* one denoiser call for the rows of x on replica r */
static ts_tensor *denoise(ts_pipeline *p, int r, ts_tensor *x, double t,
                          ts_tensor *cond) {
    ts_device d = p->rep_dev[r];
    int64_t B = ts_tensor_dim(x, 0);
    ts_tensor *tt = ts_full(p->ctx, TS_F32, 1, &B, t);
    ts_tensor *td = on(tt, d), *xd = on(x, d), *cd = on(cond, d);
    ts_release(tt);
    ts_tensor *y = NULL;
    if (td && xd && cd)
        y = p->class_cond ? ts_dit_forward(p->dit[r], xd, td, cd)
                          : ts_unet_forward(p->unet[r], xd, td, cd);
    ts_release(td), ts_release(xd), ts_release(cd);
    ts_tensor *yh = on(y, p->host);
    ts_release(y);
    return yh;
}

/* The denoiser's prediction for latents x (B, ...) on the host: the
 * conditional branch (cond) and with guidance the unconditional one
 * (uncond), each split over the replicas by rows, combined as
 * uncond + g (cond - uncond). DiT's learned sigma channels are dropped. */
static ts_tensor *predict(ts_pipeline *p, ts_tensor *x, double t,
                          ts_tensor *cond, ts_tensor *uncond, double g,
                          int64_t C) {
    int64_t B = ts_tensor_dim(x, 0);
    int branches = uncond ? 2 : 1;
    ts_tensor *out[2] = {NULL, NULL};
    for (int br = 0; br < branches; br++) {
        ts_tensor *c = br == 0 ? cond : uncond;
        /* replicas: cfg-parallel gives each branch its own; batch
         * splitting gives each its rows */
        int parts = p->opts.cfg_parallel ? 1 : p->n_rep;
        ts_tensor *pieces[MAX_REPLICAS] = {NULL};
        int np = 0;
        for (int k = 0; k < parts; k++) {
            int64_t a = B * k / parts, b = B * (k + 1) / parts;
            if (a == b)
                continue;
            int r = p->opts.cfg_parallel ? br : k;
            ts_tensor *xs = rows_on(x, a, b, p->host);
            ts_tensor *cs = rows_on(c, a, b, p->host);
            pieces[np++] = xs && cs ? denoise(p, r, xs, t, cs) : NULL;
            ts_release(xs), ts_release(cs);
        }
        out[br] = np == 1 ? ts_retain(pieces[0]) : ts_concat(np, pieces, 0);
        for (int k = 0; k < np; k++)
            ts_release(pieces[k]);
        if (out[br] && ts_tensor_dim(out[br], 1) != C) { /* learned sigma */
            ts_tensor *e = ts_slice(out[br], 1, 0, C, 1);
            ts_release(out[br]);
            out[br] = e;
        }
    }
    if (branches == 1)
        return out[0];
    ts_tensor *diff = out[0] && out[1] ? ts_sub(out[0], out[1]) : NULL;
    ts_tensor *sc = diff ? ts_mul_scalar(diff, g) : NULL;
    ts_tensor *r = sc ? ts_add(out[1], sc) : NULL;
    ts_release(out[0]), ts_release(out[1]), ts_release(diff), ts_release(sc);
    return r;
}

/* (C, H, W) or (B, C, H, W) in [0, 1] -> (B, C, H, W) in [-1, 1], B rows */
static ts_tensor *image_in(ts_pipeline *p, ts_tensor *img, int64_t B) {
    ts_tensor *x =
        ts_tensor_ndim(img) == 3 ? ts_unsqueeze(img, 0) : ts_retain(img);
    if (!x)
        return NULL;
    const int64_t *s = ts_tensor_shape(x);
    if (ts_tensor_ndim(x) != 4 || (s[0] != 1 && s[0] != B)) {
        ts_release(x);
        ts_set_error(p->ctx, TS_ERR_SHAPE,
                     "init image: want (C, H, W) or (%lld, C, H, W)",
                     (long long)B);
        return NULL;
    }
    int64_t full[4] = {B, s[1], s[2], s[3]};
    ts_tensor *e = ts_expand(x, 4, full);
    ts_tensor *m = e ? ts_mul_scalar(e, 2.0) : NULL;
    ts_tensor *r = m ? ts_add_scalar(m, -1.0) : NULL;
    ts_release(x), ts_release(e), ts_release(m);
    return r;
}

static ts_tensor *clamp01(ts_tensor *x) {
    /* (x / 2 + 0.5).clamp(0, 1) */
    ts_tensor *h = ts_mul_scalar(x, 0.5);
    ts_tensor *a = h ? ts_add_scalar(h, 0.5) : NULL;
    ts_release(h);
    if (!a)
        return NULL;
    ts_tensor *c = ts_contiguous(a);
    ts_release(a);
    if (!c)
        return NULL;
    float *v = ts_tensor_data(c);
    if (!v) {
        ts_release(c);
        return NULL;
    }
    for (int64_t k = 0, n = ts_tensor_numel(c); k < n; k++)
        v[k] = v[k] < 0 ? 0 : v[k] > 1 ? 1 : v[k];
    return c;
}

static ts_status check_request(ts_pipeline *p, const ts_diffusion_request *r,
                               int W, int H, int f) {
    ts_ctx *ctx = p->ctx;
    if (r->num_images < 0 || r->num_images > 64)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "num_images = %d (1 to 64)", r->num_images);
    if (r->steps < 0 || r->steps > 1000)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "steps = %d (1 to 1000)",
                            r->steps);
    if (!(r->guidance >= 0) || r->guidance > 100)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "guidance = %g (0 to 100)",
                            r->guidance);
    if (W < f || H < f || W > 4096 || H > 4096 || W % f || H % f)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "size %dx%d: width and height must be multiples "
                            "of %d, from %d to 4096",
                            W, H, f, f);
    if (p->class_cond &&
        (r->class_id < 0 || r->class_id >= ts_pipeline_num_classes(p)))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "class %d: this model has classes 0..%d",
                            r->class_id, ts_pipeline_num_classes(p) - 1);
    if (!p->class_cond && !r->prompt)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "a text-to-image pipeline needs a prompt");
    if (r->init_image && !(r->strength > 0 && r->strength <= 1))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "strength = %g (image-to-image: 0 < strength "
                            "<= 1)",
                            r->strength);
    if (r->init_image && !p->vae)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "image-to-image needs a pipeline with a vae");
    return TS_OK;
}

ts_status ts_pipeline_generate(ts_pipeline *p, const ts_diffusion_request *r,
                               ts_tensor **images) {
    if (!p || !r || !images)
        return p ? ts_set_error(p->ctx, TS_ERR_INVALID_ARG,
                                "ts_pipeline_generate: NULL argument")
                 : TS_ERR_INVALID_ARG;
    *images = NULL;
    ts_ctx *ctx = p->ctx;
    int W = r->width, H = r->height, dw, dh;
    ts_pipeline_default_size(p, &dw, &dh);
    W = W ? W : dw;
    H = H ? H : dh;
    int f = p->vae ? ts_vae_downscale(p->vae) : 1;
    ts_status s = check_request(p, r, W, H, f);
    if (s)
        return s;
    int64_t B = r->num_images ? r->num_images : 1;
    int steps = r->steps ? r->steps : 25;
    bool cfg = r->guidance > 1.0;
    int64_t C = p->class_cond ? ts_dit_in_channels(p->dit[0])
                              : ts_unet_in_channels(p->unet[0]);
    int64_t lat[4] = {B, C, H / f, W / f};
    if (r->latents) {
        const int64_t *ls = ts_tensor_shape(r->latents);
        if (ts_tensor_ndim(r->latents) != 4 || ls[1] != C ||
            (r->width && ls[3] != lat[3]) || (r->height && ls[2] != lat[2]) ||
            (r->num_images && ls[0] != B))
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "latents: want (%lld, %lld, %lld, %lld) for "
                                "this request",
                                (long long)lat[0], (long long)lat[1],
                                (long long)lat[2], (long long)lat[3]);
        memcpy(lat, ls, sizeof lat);
        B = lat[0];
        if (B < 1 || B > 64)
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "latents: %lld images (1 to 64)", (long long)B);
    }
    /* the request's sampler, else the folder's (a request before may have
     * picked another) */
    static const char *kinds[] = {[TS_SCHED_DDIM] = "ddim",
                                  [TS_SCHED_EULER] = "euler",
                                  [TS_SCHED_DPMPP_2M] = "dpm++2m",
                                  [TS_SCHED_DDPM] = "ddpm"};
    const char *kind = r->scheduler ? r->scheduler : kinds[p->sched_kind];
    if (strcmp(kind, kinds[ts_scheduler_get_kind(p->sched)]) &&
        (s = ts_scheduler_set_kind(p->sched, kind)))
        return s;
    if ((s = ts_scheduler_set_timesteps(p->sched, steps)))
        return s;
    int t0 = 0;
    if (r->init_image &&
        (s = ts_scheduler_set_strength(p->sched, r->strength, &t0)))
        return s;
    ts_tensor *cond = NULL, *uncond = NULL, *x = NULL, *noise = NULL;
    /* conditioning */
    if (p->class_cond) {
        int64_t ids[64];
        for (int64_t b = 0; b < B; b++)
            ids[b] = r->class_id;
        cond = ts_from_data(ctx, TS_I64, 1, &B, ids);
        if (cfg) {
            for (int64_t b = 0; b < B; b++)
                ids[b] = ts_pipeline_num_classes(p); /* the null class */
            uncond = ts_from_data(ctx, TS_I64, 1, &B, ids);
        }
    } else {
        ts_tensor *c = encode_prompt(p, r->prompt, B);
        cond = on(c, p->host);
        ts_release(c);
        if (cfg) {
            ts_tensor *u = encode_prompt(
                p, r->negative_prompt ? r->negative_prompt : "", B);
            uncond = on(u, p->host);
            ts_release(u);
        }
    }
    if (!cond || (cfg && !uncond))
        goto fail;
    /* initial latents */
    noise = r->latents ? on(r->latents, p->host)
                       : ts_randn(ctx, TS_F32, 4, lat, 1.0, r->seed);
    if (!noise)
        goto fail;
    if (r->init_image) {
        ts_tensor *img = image_in(p, r->init_image, B);
        ts_tensor *id = on(img, p->place[C_VAE]), *mean = NULL, *logvar = NULL;
        ts_release(img);
        if (!id || ts_vae_encode(p->vae, id, &mean, &logvar)) {
            ts_release(id);
            goto fail;
        }
        ts_release(id);
        /* latent_dist.sample: mean + exp(logvar / 2) eps, eps seeded apart
         * from the noise */
        const int64_t *ms = ts_tensor_shape(mean);
        ts_tensor *eps = ts_randn(ctx, TS_F32, 4, ms, 1.0, r->seed + 1);
        ts_tensor *hv = ts_mul_scalar(logvar, 0.5);
        ts_tensor *sd = hv ? ts_exp(hv) : NULL;
        ts_tensor *e1 = on(eps, ts_tensor_device(mean));
        ts_tensor *z = sd && e1 ? ts_mul(sd, e1) : NULL;
        ts_tensor *zz = z ? ts_add(mean, z) : NULL;
        ts_tensor *zs =
            zz ? ts_mul_scalar(zz, ts_vae_scaling_factor(p->vae)) : NULL;
        ts_tensor *init = on(zs, p->host);
        ts_release(mean), ts_release(logvar), ts_release(eps), ts_release(hv);
        ts_release(sd), ts_release(e1), ts_release(z), ts_release(zz);
        ts_release(zs);
        if (init && !ts_shape_equal(4, ts_tensor_shape(init), 4,
                                    ts_tensor_shape(noise))) {
            ts_set_error(ctx, TS_ERR_SHAPE,
                         "init image: its latents do not match the "
                         "requested size");
            ts_release(init);
            goto fail;
        }
        x = init ? ts_scheduler_add_noise(p->sched, init, noise, t0) : NULL;
        ts_release(init);
    } else {
        x = ts_mul_scalar(noise, ts_scheduler_init_noise_sigma(p->sched));
    }
    if (!x)
        goto fail;
    int n = ts_scheduler_num_steps(p->sched);
    for (int i = t0; i < n; i++) {
        double t = ts_scheduler_timestep(p->sched, i);
        ts_tensor *xin = ts_scheduler_scale_model_input(p->sched, x, i);
        ts_tensor *eps =
            xin ? predict(p, xin, t, cond, uncond, r->guidance, C) : NULL;
        ts_release(xin);
        ts_tensor *nx = eps ? ts_scheduler_step(p->sched, eps, i, x) : NULL;
        ts_release(eps);
        ts_release(x);
        x = nx;
        /* materialize each step (compiled mode: one graph per step) */
        if (!x || ts_sync(ctx))
            goto fail;
        if (r->progress)
            r->progress(r->progress_arg, i - t0 + 1, n - t0);
    }
    if (r->latents_only) {
        *images = x;
        x = NULL;
    } else if (p->vae) {
        ts_tensor *xs = ts_mul_scalar(x, 1.0 / ts_vae_scaling_factor(p->vae));
        ts_tensor *xd = on(xs, p->place[C_VAE]);
        ts_tensor *img = xd ? ts_vae_decode(p->vae, xd) : NULL;
        ts_tensor *ih = on(img, p->host);
        ts_release(xs), ts_release(xd), ts_release(img);
        *images = ih ? clamp01(ih) : NULL;
        ts_release(ih);
    } else {
        *images = clamp01(x);
    }
    ts_release(x), ts_release(noise), ts_release(cond), ts_release(uncond);
    return *images ? TS_OK : ctx->status;
fail:
    ts_release(x), ts_release(noise), ts_release(cond), ts_release(uncond);
    return ctx->status ? ctx->status : TS_ERR_STATE;
}
