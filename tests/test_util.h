/* test_util.h — the few helpers every test file uses: checks that report
 * file:line and keep going, a fresh context, and closeness checks. */
#ifndef TS_TEST_UTIL_H
#define TS_TEST_UTIL_H

#include "tessera.h"

#include <stdio.h>
#include <string.h>

extern int ts_test_failures;
extern int ts_test_checks;

#define CHECK(cond)                                                            \
    do {                                                                       \
        ts_test_checks++;                                                      \
        if (!(cond)) {                                                         \
            ts_test_failures++;                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
        }                                                                      \
    } while (0)

#define CHECK_OK(ctx, expr)                                                    \
    do {                                                                       \
        ts_test_checks++;                                                      \
        ts_status s_ = (expr);                                                 \
        if (s_ != TS_OK) {                                                     \
            ts_test_failures++;                                                \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, \
                    #expr, ts_status_name(s_), ts_errmsg(ctx));                \
        }                                                                      \
    } while (0)

/* Checks that msg contains needle. */
#define CHECK_MSG(ctx, needle)                                                 \
    do {                                                                       \
        ts_test_checks++;                                                      \
        if (!strstr(ts_errmsg(ctx), (needle))) {                               \
            ts_test_failures++;                                                \
            fprintf(stderr, "%s:%d: error message \"%s\" lacks \"%s\"\n",      \
                    __FILE__, __LINE__, ts_errmsg(ctx), (needle));             \
        }                                                                      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                  \
    do {                                                                       \
        ts_test_checks++;                                                      \
        double a_ = (a), b_ = (b);                                             \
        if (!(a_ - b_ <= (tol) && b_ - a_ <= (tol))) {                         \
            ts_test_failures++;                                                \
            fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tol %g)\n",      \
                    __FILE__, __LINE__, #a, a_, b_, (double)(tol));            \
        }                                                                      \
    } while (0)

ts_ctx *test_ctx(void);
/* A family's description (ts_model_config_preset of model_type) with the
 * sizes left to the caller; exits on an unknown family. */
#include "tessera_io.h"
ts_model_config tu_config(const char *model_type);
/* The whole file, NUL-terminated (malloc'd), its length in *n (n may be
 * NULL); NULL when it cannot be read. */
void *tu_read_file(const char *path, size_t *n);
/* Max |a-b| / (atol + rtol*|b|) over all elements (<= 1 passes); prints the
 * worst element when it fails. Both tensors are read as f64. */
int test_allclose(const char *what, ts_tensor *a, ts_tensor *b, double rtol,
                  double atol);
/* Final report; returns the process exit code. */
int test_finish(const char *name);

#endif
