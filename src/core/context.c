/* context.c — the execution context: error state, thread count, grad mode,
 * allocator and backend selection. Owns ts_ctx; must not run ops. */
#include "core/core.h"
#include "core/cpu_isa.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern const ts_backend ts_cpu_backend;
#ifdef TS_HAVE_VULKAN
extern const ts_backend ts_vulkan_backend;
#endif

const ts_backend *ts_backend_of(ts_device_kind kind) {
    switch (kind) {
    case TS_DEVICE_CPU:
        return &ts_cpu_backend;
#ifdef TS_HAVE_VULKAN
    case TS_DEVICE_VULKAN:
        return &ts_vulkan_backend;
#endif
    default:
        return NULL;
    }
}

static const char *const status_names[] = {
    "TS_OK",        "TS_ERR_INVALID_ARG", "TS_ERR_SHAPE",
    "TS_ERR_DTYPE", "TS_ERR_RANGE",       "TS_ERR_OOM",
    "TS_ERR_IO",    "TS_ERR_STATE",       "TS_ERR_UNSUPPORTED"};

const char *ts_status_name(ts_status s) {
    return (unsigned)s < sizeof status_names / sizeof *status_names
               ? status_names[s]
               : "TS_ERR_UNKNOWN";
}

ts_status ts_set_error(ts_ctx *ctx, ts_status s, const char *fmt, ...) {
    if (!ctx)
        return s;
    ctx->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    va_end(ap);
    return s;
}

const char *ts_errmsg(const ts_ctx *ctx) {
    return ctx ? ctx->errmsg : "no context (ts_ctx_new failed?)";
}

ts_status ts_ctx_status(const ts_ctx *ctx) {
    return ctx ? ctx->status : TS_ERR_INVALID_ARG;
}

void ts_clear_error(ts_ctx *ctx) {
    if (!ctx)
        return;
    ctx->status = TS_OK;
    ctx->errmsg[0] = '\0';
}

static int default_threads(void) {
    const char *env = getenv("TS_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 1024)
            return (int)v;
        fprintf(stderr,
                "tessera: ignoring TS_NUM_THREADS=\"%s\" (want 1..1024)\n",
                env);
    }
    return ts_default_threads();
}

ts_status ts_ctx_new(ts_ctx **out, const ts_ctx_options *opt) {
    if (!out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    if (opt && (opt->num_threads < 0 || opt->num_threads > 1024))
        return TS_ERR_RANGE;
    char isa_err[512];
    if (!cpu_isa_init(isa_err, sizeof isa_err)) { /* a bad TS_CPU_ISA */
        fprintf(stderr, "tessera: %s\n", isa_err);
        return TS_ERR_UNSUPPORTED;
    }
    ts_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return TS_ERR_OOM;
    ctx->grad_enabled = true;
    ctx->num_threads =
        opt && opt->num_threads > 0 ? opt->num_threads : default_threads();
    ctx->alloc.no_cache = opt ? opt->no_alloc_cache : false;
    if (getenv("TS_NO_ALLOC_CACHE"))
        ctx->alloc.no_cache = true;
    ctx->device = (ts_device){TS_DEVICE_CPU, 0};
    const char *pe = getenv("TS_PROFILE");
    ctx->profile = pe && *pe && strcmp(pe, "0") != 0;
    const char *fe = getenv("TS_FORCE_EAGER");
    ctx->force_eager = fe && *fe && strcmp(fe, "0") != 0;
    ts_threads_apply(ctx->num_threads);
    *out = ctx;
    return TS_OK;
}

void ts_profile_report(ts_ctx *ctx, FILE *f);

void ts_ctx_free(ts_ctx *ctx) {
    if (!ctx)
        return;
    if (ctx->profile)
        ts_profile_report(ctx, stderr);
    ts_trace_destroy(ctx);
    for (int k = 0; k < TS_DEVICE_KINDS; k++) {
        const ts_backend *b = ts_backend_of((ts_device_kind)k);
        if (b && b->ctx_free)
            b->ctx_free(ctx);
    }
    ts_allocator_destroy(&ctx->alloc);
    free(ctx);
}

int ts_get_num_threads(const ts_ctx *ctx) {
    return ctx ? ctx->num_threads : 1;
}

ts_status ts_set_num_threads(ts_ctx *ctx, int n) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (n < 1 || n > 1024)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "ts_set_num_threads: %d threads (want 1..1024)", n);
    ctx->num_threads = n;
    ts_threads_apply(n);
    return TS_OK;
}

bool ts_set_grad_enabled(ts_ctx *ctx, bool enabled) {
    if (!ctx)
        return false;
    bool old = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return old;
}

bool ts_is_grad_enabled(const ts_ctx *ctx) {
    return ctx && ctx->grad_enabled;
}

const char *ts_file_in(const char *path, const char *name, char *buf,
                       size_t n) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(buf, n, "%s/%s", path, name);
    else
        snprintf(buf, n, "%s", path);
    return buf;
}
