/* test_util.c — shared test helpers (see test_util.h). */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

int ts_test_failures = 0;
int ts_test_checks = 0;

ts_ctx *test_ctx(void) {
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) {
        fprintf(stderr, "cannot create a context\n");
        exit(1);
    }
    return ctx;
}

int test_allclose(const char *what, ts_tensor *a, ts_tensor *b, double rtol,
                  double atol) {
    ts_test_checks++;
    if (!a || !b) {
        ts_test_failures++;
        fprintf(stderr, "%s: missing tensor (%s)\n", what,
                a ? "expected" : "actual");
        return 0;
    }
    if (ts_tensor_ndim(a) != ts_tensor_ndim(b) ||
        ts_tensor_numel(a) != ts_tensor_numel(b) ||
        memcmp(ts_tensor_shape(a), ts_tensor_shape(b),
               sizeof(int64_t) * (size_t)ts_tensor_ndim(a)) != 0) {
        ts_test_failures++;
        char sa[256], sb[256];
        int na = ts_tensor_ndim(a), nb = ts_tensor_ndim(b);
        int pa = snprintf(sa, sizeof sa, "[");
        for (int i = 0; i < na; i++)
            pa += snprintf(sa + pa, sizeof sa - (size_t)pa, "%s%lld",
                           i ? ", " : "", (long long)ts_tensor_shape(a)[i]);
        snprintf(sa + pa, sizeof sa - (size_t)pa, "]");
        int pb = snprintf(sb, sizeof sb, "[");
        for (int i = 0; i < nb; i++)
            pb += snprintf(sb + pb, sizeof sb - (size_t)pb, "%s%lld",
                           i ? ", " : "", (long long)ts_tensor_shape(b)[i]);
        snprintf(sb + pb, sizeof sb - (size_t)pb, "]");
        fprintf(stderr, "%s: shape %s, expected %s\n", what, sa, sb);
        return 0;
    }
    int64_t n = ts_tensor_numel(a);
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
    int ok = 1;
    /* read as f32 then widen: every dtype we compare fits f32 exactly */
    float *fx = malloc(sizeof(float) * (size_t)(n ? n : 1));
    float *fy = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (ts_tensor_read(a, fx, TS_F32) != TS_OK ||
        ts_tensor_read(b, fy, TS_F32) != TS_OK) {
        fprintf(stderr, "%s: cannot read tensors\n", what);
        ok = 0;
    } else {
        double worst = 0;
        int64_t wi = -1;
        for (int64_t i = 0; i < n; i++) {
            x[i] = fx[i];
            y[i] = fy[i];
            double err;
            if (isnan(x[i]) || isnan(y[i]))
                err = (isnan(x[i]) && isnan(y[i])) ? 0 : INFINITY;
            else if (isinf(y[i]) || isinf(x[i]))
                err = x[i] == y[i] ? 0 : INFINITY;
            else
                err = fabs(x[i] - y[i]) / (atol + rtol * fabs(y[i]));
            if (err > worst || wi < 0) {
                if (err > worst)
                    worst = err;
                wi = i;
            }
        }
        if (worst > 1.0) {
            ok = 0;
            fprintf(stderr,
                    "%s: mismatch at flat index %lld: got %.9g, expected %.9g"
                    " (rtol %g, atol %g; %.3g x tolerance)\n",
                    what, (long long)wi, x[wi], y[wi], rtol, atol, worst);
        }
    }
    free(x), free(y), free(fx), free(fy);
    if (!ok)
        ts_test_failures++;
    return ok;
}

int test_finish(const char *name) {
    if (ts_test_failures) {
        fprintf(stderr, "%s: %d of %d checks failed\n", name, ts_test_failures,
                ts_test_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, ts_test_checks);
    return 0;
}

ts_model_config tu_config(const char *model_type) {
    ts_model_config c;
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK ||
        ts_model_config_preset(ctx, model_type, &c) != TS_OK) {
        fprintf(stderr, "tu_config(%s): %s\n", model_type,
                ctx ? ts_errmsg(ctx) : "no context");
        exit(2);
    }
    ts_ctx_free(ctx);
    return c;
}

void *tu_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 &&
        fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)len + 1);
    size_t k = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!buf || k != (size_t)len) {
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    if (n)
        *n = k;
    return buf;
}
