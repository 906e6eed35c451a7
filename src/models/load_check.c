/* load_check.c — the checkpoint checks every model loader makes: expected
 * tensors and their shapes from the header (nothing allocated yet), one
 * pass for NaN/Inf over the weights used, and a warning, as Hugging Face
 * gives, for the checkpoint's tensors that the model does not use. */
#include "load_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNUSED_LISTED 5

ts_status ckpt_review_begin(ckpt_review *r, ts_ctx *ctx, const char *dir,
                            ts_safetensors *st, const ts_load_options *opt) {
    int n = ts_safetensors_count(st);
    *r = (ckpt_review){ctx, dir, st, opt, calloc((size_t)n + 1, sizeof(bool))};
    return r->used ? TS_OK
                   : ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
}

void ckpt_review_end(ckpt_review *r) {
    free(r->used);
    r->used = NULL;
}

int ckpt_find(const ckpt_review *r, const char *name) {
    return ts_safetensors_find(r->st, name);
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "",
                               (long long)shape[d]);
    if (at < n)
        snprintf(buf + at, n - at, "]");
}

ts_status ckpt_expect(ckpt_review *r, int k, const char *name, int ndim,
                      const int64_t *want) {
    const char *stored = ts_safetensors_name(r->st, k);
    if (!stored)
        return ts_set_error(r->ctx, TS_ERR_IO,
                            "%s: the checkpoint has no tensor \"%s\"", r->dir,
                            name);
    int nd = 0;
    int64_t shape[TS_MAX_DIMS];
    ts_safetensors_shape(r->st, stored, NULL, &nd, shape);
    if (nd != ndim || memcmp(shape, want, sizeof(int64_t) * (size_t)nd)) {
        char a[200], b[200];
        shape_text(nd, shape, a, sizeof a);
        shape_text(ndim, want, b, sizeof b);
        return ts_set_error(r->ctx, TS_ERR_SHAPE,
                            "%s: tensor \"%s\" has shape %s in the "
                            "checkpoint; the config needs %s",
                            r->dir, name, a, b);
    }
    r->used[k] = true;
    if (r->opt && r->opt->no_check_weights)
        return TS_OK;
    return ts_safetensors_check_finite(r->st, stored);
}

void ckpt_warn_unused(ckpt_review *r, bool (*ignore)(const char *name),
                      int64_t (*layer_of)(const char *name), int64_t layers,
                      const char *layers_field) {
    char msg[2048];
    size_t at = 0;
    int count = 0;
    int64_t top = -1;
    for (int k = 0; k < ts_safetensors_count(r->st); k++) {
        const char *name = ts_safetensors_name(r->st, k);
        if (r->used[k] || (ignore && ignore(name)))
            continue;
        if (layer_of && layer_of(name) > top)
            top = layer_of(name);
        if (count++ < UNUSED_LISTED && at < sizeof msg)
            at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%s",
                                   count > 1 ? ", " : "", name);
    }
    if (!count)
        return;
    char text[2600];
    int len =
        snprintf(text, sizeof text,
                 "Some weights of the checkpoint at %s were not used: "
                 "%s%s (%d in all)",
                 r->dir, msg, count > UNUSED_LISTED ? ", ..." : "", count);
    if (top >= layers && len > 0 && (size_t)len < sizeof text)
        snprintf(text + len, sizeof text - (size_t)len,
                 "; the checkpoint has layers up to %lld, config.json's "
                 "%s is %lld",
                 (long long)top, layers_field, (long long)layers);
    if (r->opt && r->opt->warn)
        r->opt->warn(r->opt->warn_user, text);
    else
        fprintf(stderr, "tessera: warning: %s\n", text);
}
