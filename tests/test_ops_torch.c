/* test_ops_torch.c — every op of tessera.h, forward and backward, against
 * PyTorch. The cases (inputs, views, expected outputs and gradients,
 * tolerances) are made by tests/ref/op_cases.py, which documents the file
 * format; this driver loads them, rebuilds each input with ts_from_data,
 * applies the view chain, runs the op, compares the result, runs
 * ts_backward(out, gout) and compares the gradients of the inputs.
 * It ends with a few error-path checks (status codes and messages).
 *
 * Usage: test_ops_torch CASES.bin [NAME_SUBSTRING]
 *
 * CTest wiring (tests/CMakeLists.txt): generate the cases first, as a
 * fixture, then run the driver on them:
 *
 *   add_test(NAME ops_torch_cases
 *            COMMAND /usr/bin/python3
 *                    ${CMAKE_CURRENT_SOURCE_DIR}/ref/op_cases.py
 *                    ${CMAKE_CURRENT_BINARY_DIR}/cases.bin)
 *   set_tests_properties(ops_torch_cases PROPERTIES
 *                        FIXTURES_SETUP ops_torch_cases)
 *   ts_add_test(test_ops_torch ${CMAKE_CURRENT_BINARY_DIR}/cases.bin)
 *   set_tests_properties(test_ops_torch PROPERTIES
 *                        FIXTURES_REQUIRED ops_torch_cases)
 *
 * (ts_add_test already sets ENVIRONMENT TS_NUM_THREADS=2; the second
 * set_tests_properties only adds the fixture.)
 *
 * Op-specific attrs (besides vN, aN, rtol/atol/grtol/gatol, exact, isview,
 * gabs; see op_cases.py): s (add_scalar, mul_scalar), p (pow_scalar),
 * approx (gelu), value (masked_fill), dims + keepdim (sum, mean, amax; dims
 * empty = all),
 * dim + keepdim (max, argmax), dim (softmax, log_softmax, concat),
 * dim + sizes (split), dt (cast), eps (rmsnorm, layernorm),
 * T, D, theta, pos0 (rope_tables), causal + scale (attention),
 * causal + scale + window + softcap (attention_ex), k (topk), dim (gather),
 * n (one_hot), act (moe_experts: 6 inputs gated, 5 ungated),
 * ignore + red (cross_entropy). Optional inputs: rmsnorm's weight (in1),
 * attention's mask (in3). Op "id" returns the viewed input itself: it checks
 * the view ops (reshape, permute, transpose, slice, expand, squeeze,
 * unsqueeze) and the gradients through them.
 */
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the case file ------------------------------------------------------- */

typedef struct {
    char *name;
    int dt;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    void *data; /* malloc'd, so aligned */
    uint64_t nbytes;
} tinfo;

typedef struct {
    char *name, *op, *attrs;
    int nt;
    tinfo *t;
} tcase;

typedef struct {
    const unsigned char *p, *end;
    int bad;
} reader;

static int rd(reader *r, void *dst, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return 0;
    }
    memcpy(dst, r->p, n);
    r->p += n;
    return 1;
}

static uint32_t rd_u32(reader *r) {
    uint32_t v = 0;
    rd(r, &v, 4);
    return v;
}

static char *rd_str(reader *r) {
    uint32_t n = rd_u32(r);
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc(n + 1);
    memcpy(s, r->p, n);
    s[n] = 0;
    r->p += n;
    return s;
}

static tcase *load_cases(const char *path, int *ncases) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (run tests/ref/op_cases.py first)\n",
                path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(buf);
        fprintf(stderr, "cannot read %s\n", path);
        return NULL;
    }
    fclose(f);
    reader r = {buf, buf + len, 0};
    char magic[8];
    if (!rd(&r, magic, 8) || memcmp(magic, "TSCASE01", 8) != 0) {
        free(buf);
        fprintf(stderr, "%s: bad magic\n", path);
        return NULL;
    }
    uint32_t n = rd_u32(&r);
    tcase *cs = calloc(n ? n : 1, sizeof *cs);
    uint32_t i;
    for (i = 0; i < n && !r.bad; i++) {
        tcase *c = &cs[i];
        c->name = rd_str(&r);
        c->op = rd_str(&r);
        c->attrs = rd_str(&r);
        c->nt = (int)rd_u32(&r);
        if (r.bad || c->nt < 0 || c->nt > 64) {
            r.bad = 1;
            break;
        }
        c->t = calloc((size_t)c->nt + 1, sizeof *c->t);
        for (int j = 0; j < c->nt && !r.bad; j++) {
            tinfo *t = &c->t[j];
            t->name = rd_str(&r);
            t->dt = (int)rd_u32(&r);
            t->ndim = (int)rd_u32(&r);
            if (r.bad || t->ndim > TS_MAX_DIMS || t->dt >= TS_DTYPE_COUNT) {
                r.bad = 1;
                break;
            }
            for (int d = 0; d < t->ndim; d++)
                rd(&r, &t->shape[d], 8);
            rd(&r, &t->nbytes, 8);
            if (r.bad || (uint64_t)(r.end - r.p) < t->nbytes) {
                r.bad = 1;
                break;
            }
            t->data = malloc(t->nbytes ? t->nbytes : 1);
            memcpy(t->data, r.p, t->nbytes);
            r.p += t->nbytes;
        }
    }
    free(buf);
    if (r.bad) {
        fprintf(stderr, "%s: truncated or malformed at case %u\n", path, i);
        *ncases = (int)i;
        return cs; /* what was read is freed by the caller */
    }
    *ncases = (int)n;
    return cs;
}

static void free_cases(tcase *cs, int n) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; cs[i].t && j < cs[i].nt; j++) {
            free(cs[i].t[j].name);
            free(cs[i].t[j].data);
        }
        free(cs[i].t);
        free(cs[i].name);
        free(cs[i].op);
        free(cs[i].attrs);
    }
    free(cs);
}

static const tinfo *find_t(const tcase *c, const char *name) {
    for (int i = 0; i < c->nt; i++)
        if (c->t[i].name && strcmp(c->t[i].name, name) == 0)
            return &c->t[i];
    return NULL;
}

static ts_tensor *make_t(ts_ctx *ctx, const tinfo *t) {
    return ts_from_data(ctx, (ts_dtype)t->dt, t->ndim, t->shape, t->data);
}

/* ---- attrs ("key=value;key=value") -----------------------------------------
 */

static const char *attr(const tcase *c, const char *key) {
    size_t kl = strlen(key);
    const char *s = c->attrs;
    while (s && *s) {
        if (strncmp(s, key, kl) == 0 && s[kl] == '=')
            return s + kl + 1;
        s = strchr(s, ';');
        if (s)
            s++;
    }
    return NULL;
}

static long long attr_int(const tcase *c, const char *key, long long def) {
    const char *v = attr(c, key);
    return v ? strtoll(v, NULL, 10) : def;
}

static double attr_dbl(const tcase *c, const char *key, double def) {
    const char *v = attr(c, key);
    return v ? strtod(v, NULL) : def;
}

/* Comma-separated integers up to ';' or the end; returns the count. */
static int parse_ints(const char *v, int64_t *out, int max) {
    int n = 0;
    while (v && *v && *v != ';' && *v != '/' && n < max) {
        char *e;
        long long x = strtoll(v, &e, 10);
        if (e == v)
            break;
        out[n++] = x;
        v = e;
        if (*v == ',')
            v++;
    }
    return n;
}

static int attr_ints(const tcase *c, const char *key, int64_t *out, int max) {
    const char *v = attr(c, key);
    return v ? parse_ints(v, out, max) : -1;
}

/* ---- views ------------------------------------------------------------------
 */

/* Applies the view chain spec (see op_cases.py) to x; consumes x. */
static ts_tensor *apply_views(ts_tensor *x, const char *spec) {
    const char *p = spec;
    while (x && p && *p && *p != ';') {
        char op = *p++;
        int64_t a[TS_MAX_DIMS + 2];
        int n = parse_ints(p, a, TS_MAX_DIMS + 2);
        int perm[TS_MAX_DIMS];
        ts_tensor *y = NULL;
        switch (op) {
        case 'T':
            y = ts_transpose(x, (int)a[0], (int)a[1]);
            break;
        case 'P':
            for (int i = 0; i < n; i++)
                perm[i] = (int)a[i];
            y = ts_permute(x, perm);
            break;
        case 'S':
            y = ts_slice(x, (int)a[0], a[1], a[2], a[3]);
            break;
        case 'E':
            y = ts_expand(x, n, a);
            break;
        case 'R':
            y = ts_reshape(x, n, a);
            break;
        case 'U':
            y = ts_unsqueeze(x, (int)a[0]);
            break;
        case 'Q':
            y = ts_squeeze(x, (int)a[0]);
            break;
        default:
            fprintf(stderr, "bad view spec %s\n", spec);
        }
        ts_release(x);
        x = y;
        while (*p && *p != '/' && *p != ';')
            p++;
        if (*p == '/')
            p++;
    }
    return x;
}

/* ---- running an op
 * ------------------------------------------------------------ */

typedef ts_tensor *(*unary_fn)(ts_tensor *);
typedef ts_tensor *(*binary_fn)(ts_tensor *, ts_tensor *);

static const struct {
    const char *name;
    unary_fn fn;
} UNARY[] = {
    {"neg", ts_neg},   {"exp", ts_exp},         {"log", ts_log},
    {"sqrt", ts_sqrt}, {"rsqrt", ts_rsqrt},     {"abs", ts_abs},
    {"tanh", ts_tanh}, {"sigmoid", ts_sigmoid}, {"relu", ts_relu},
    {"silu", ts_silu}, {"copy", ts_copy},
};

static const struct {
    const char *name;
    binary_fn fn;
} BINARY[] = {
    {"add", ts_add}, {"sub", ts_sub},       {"mul", ts_mul},
    {"div", ts_div}, {"matmul", ts_matmul}, {"embedding", ts_embedding},
};

#define MAX_OUTS 8

/* Runs c's op on inputs x[0..nin); fills outs, returns their count, or -1
 * when the op is unknown or the arity is wrong. A NULL out is an op error. */
static int run_op(ts_ctx *ctx, const tcase *c, ts_tensor **x, int nin,
                  ts_tensor **outs) {
    const char *op = c->op;
    for (size_t i = 0; i < sizeof UNARY / sizeof UNARY[0]; i++)
        if (strcmp(op, UNARY[i].name) == 0 && nin == 1) {
            outs[0] = UNARY[i].fn(x[0]);
            return 1;
        }
    for (size_t i = 0; i < sizeof BINARY / sizeof BINARY[0]; i++)
        if (strcmp(op, BINARY[i].name) == 0 && nin == 2) {
            outs[0] = BINARY[i].fn(x[0], x[1]);
            return 1;
        }
    int64_t v[TS_MAX_DIMS + 1];
    if (strcmp(op, "id") == 0 && nin == 1) {
        outs[0] = ts_retain(x[0]);
        return 1;
    }
    if (strcmp(op, "add_scalar") == 0 && nin == 1) {
        outs[0] = ts_add_scalar(x[0], attr_dbl(c, "s", 0));
        return 1;
    }
    if (strcmp(op, "mul_scalar") == 0 && nin == 1) {
        outs[0] = ts_mul_scalar(x[0], attr_dbl(c, "s", 1));
        return 1;
    }
    if (strcmp(op, "pow_scalar") == 0 && nin == 1) {
        outs[0] = ts_pow_scalar(x[0], attr_dbl(c, "p", 1));
        return 1;
    }
    if (strcmp(op, "gelu") == 0 && nin == 1) {
        outs[0] = ts_gelu(x[0], (ts_gelu_approx)attr_int(c, "approx", 0));
        return 1;
    }
    if (strcmp(op, "where") == 0 && nin == 3) {
        outs[0] = ts_where(x[0], x[1], x[2]);
        return 1;
    }
    if (strcmp(op, "masked_fill") == 0 && nin == 2) {
        outs[0] = ts_masked_fill(x[0], x[1], attr_dbl(c, "value", 0));
        return 1;
    }
    if ((strcmp(op, "sum") == 0 || strcmp(op, "mean") == 0 ||
         strcmp(op, "amax") == 0) &&
        nin == 1) {
        int nd = attr_ints(c, "dims", v, TS_MAX_DIMS);
        int dims[TS_MAX_DIMS];
        if (nd < 0)
            nd = 0;
        for (int i = 0; i < nd; i++)
            dims[i] = (int)v[i];
        bool keep = attr_int(c, "keepdim", 0) != 0;
        outs[0] = op[0] == 's'   ? ts_sum(x[0], nd, dims, keep)
                  : op[0] == 'm' ? ts_mean(x[0], nd, dims, keep)
                                 : ts_amax(x[0], nd, dims, keep);
        return 1;
    }
    if (strcmp(op, "max") == 0 && nin == 1) {
        outs[0] = ts_max(x[0], (int)attr_int(c, "dim", 0),
                         attr_int(c, "keepdim", 0) != 0);
        return 1;
    }
    if (strcmp(op, "argmax") == 0 && nin == 1) {
        outs[0] = ts_argmax(x[0], (int)attr_int(c, "dim", 0),
                            attr_int(c, "keepdim", 0) != 0);
        return 1;
    }
    if (strcmp(op, "softmax") == 0 && nin == 1) {
        outs[0] = ts_softmax(x[0], (int)attr_int(c, "dim", -1));
        return 1;
    }
    if (strcmp(op, "log_softmax") == 0 && nin == 1) {
        outs[0] = ts_log_softmax(x[0], (int)attr_int(c, "dim", -1));
        return 1;
    }
    if (strcmp(op, "concat") == 0 && nin >= 1) {
        outs[0] = ts_concat(nin, x, (int)attr_int(c, "dim", 0));
        return 1;
    }
    if (strcmp(op, "split") == 0 && nin == 1) {
        int n = attr_ints(c, "sizes", v, MAX_OUTS);
        if (n <= 0)
            return -1;
        for (int i = 0; i < n; i++)
            outs[i] = NULL;
        if (ts_split(x[0], (int)attr_int(c, "dim", 0), n, v, outs) != TS_OK)
            for (int i = 0; i < n; i++) {
                ts_release(outs[i]);
                outs[i] = NULL;
            }
        return n;
    }
    if (strcmp(op, "cast") == 0 && nin == 1) {
        outs[0] = ts_cast(x[0], (ts_dtype)attr_int(c, "dt", 0));
        return 1;
    }
    if (strcmp(op, "rmsnorm") == 0 && (nin == 1 || nin == 2)) {
        outs[0] =
            ts_rmsnorm(x[0], nin == 2 ? x[1] : NULL, attr_dbl(c, "eps", 1e-6));
        return 1;
    }
    if (strcmp(op, "layernorm") == 0 && nin == 3) {
        outs[0] = ts_layernorm(x[0], x[1], x[2], attr_dbl(c, "eps", 1e-5));
        return 1;
    }
    if (strcmp(op, "conv2d") == 0 && (nin == 2 || nin == 3)) {
        int64_t a[9];
        if (attr_ints(c, "conv", a, 9) != 9)
            return 0;
        ts_conv2d_opts o = {(int)a[0], (int)a[1], (int)a[2],
                            (int)a[3], (int)a[4], (int)a[5],
                            (int)a[6], (int)a[7], (int)a[8]};
        outs[0] = ts_conv2d(x[0], x[1], nin == 3 ? x[2] : NULL, &o);
        return 1;
    }
    if (strcmp(op, "group_norm") == 0 && (nin == 1 || nin == 3)) {
        outs[0] = ts_group_norm(x[0], attr_int(c, "groups", 1),
                                nin == 3 ? x[1] : NULL, nin == 3 ? x[2] : NULL,
                                attr_dbl(c, "eps", 1e-5));
        return 1;
    }
    if (strcmp(op, "upsample_nearest") == 0 && nin == 1) {
        int64_t a[2];
        if (attr_ints(c, "scale", a, 2) != 2)
            return 0;
        outs[0] = ts_upsample_nearest2d(x[0], (int)a[0], (int)a[1]);
        return 1;
    }
    if (strcmp(op, "avg_pool2d") == 0 && nin == 1) {
        int64_t a[4];
        if (attr_ints(c, "pool", a, 4) != 4)
            return 0;
        outs[0] =
            ts_avg_pool2d(x[0], (int)a[0], (int)a[1], (int)a[2], (int)a[3]);
        return 1;
    }
    if (strcmp(op, "rope") == 0 && nin == 3) {
        outs[0] = ts_rope(x[0], x[1], x[2]);
        return 1;
    }
    if (strcmp(op, "rope_tables") == 0 && nin == 0) {
        outs[0] = outs[1] = NULL;
        if (ts_rope_tables(ctx, attr_int(c, "T", 1), attr_int(c, "D", 2),
                           attr_dbl(c, "theta", 10000.0),
                           attr_int(c, "pos0", 0), &outs[0],
                           &outs[1]) != TS_OK) {
            ts_release(outs[0]);
            ts_release(outs[1]);
            outs[0] = outs[1] = NULL;
        }
        return 2;
    }
    if (strcmp(op, "attention") == 0 && (nin == 3 || nin == 4)) {
        outs[0] = ts_attention(x[0], x[1], x[2], nin == 4 ? x[3] : NULL,
                               attr_int(c, "causal", 0) != 0,
                               attr_dbl(c, "scale", 0));
        return 1;
    }
    if (strcmp(op, "attention_ex") == 0 && (nin == 3 || nin == 4)) {
        ts_attn_opts o = {.causal = attr_int(c, "causal", 0) != 0,
                          .scale = attr_dbl(c, "scale", 0),
                          .window = attr_int(c, "window", 0),
                          .softcap = attr_dbl(c, "softcap", 0)};
        outs[0] = ts_attention_ex(x[0], x[1], x[2], nin == 4 ? x[3] : NULL, &o);
        return 1;
    }
    if (strcmp(op, "topk") == 0 && nin == 1) {
        outs[0] = ts_topk(x[0], attr_int(c, "k", 1));
        return 1;
    }
    if (strcmp(op, "gather") == 0 && nin == 2) {
        outs[0] = ts_gather(x[0], (int)attr_int(c, "dim", 0), x[1]);
        return 1;
    }
    if (strcmp(op, "one_hot") == 0 && nin == 1) {
        outs[0] = ts_one_hot(x[0], attr_int(c, "n", 1));
        return 1;
    }
    if (strcmp(op, "moe_experts") == 0 && (nin == 5 || nin == 6)) {
        bool gated = nin == 6;
        outs[0] = ts_moe_experts(x[0], x[1], x[2], gated ? x[3] : NULL,
                                 x[gated ? 4 : 3], x[gated ? 5 : 4],
                                 (ts_act)attr_int(c, "act", 0));
        return 1;
    }
    if (strcmp(op, "cross_entropy") == 0 && nin == 2) {
        outs[0] = ts_cross_entropy(x[0], x[1], attr_int(c, "ignore", -100),
                                   (ts_reduction)attr_int(c, "red", 0));
        return 1;
    }
    return -1;
}

/* ---- comparisons
 * ----------------------------------------------------------------- */

static void shape_str(ts_tensor *t, char *buf, size_t n) {
    int p = snprintf(buf, n, "[");
    for (int i = 0; i < ts_tensor_ndim(t) && (size_t)p < n; i++)
        p += snprintf(buf + p, n - (size_t)p, "%s%lld", i ? ", " : "",
                      (long long)ts_tensor_shape(t)[i]);
    if ((size_t)p < n)
        snprintf(buf + p, n - (size_t)p, "]");
}

static int same_shape(ts_tensor *a, ts_tensor *b) {
    return ts_tensor_ndim(a) == ts_tensor_ndim(b) &&
           memcmp(ts_tensor_shape(a), ts_tensor_shape(b),
                  sizeof(int64_t) * (size_t)ts_tensor_ndim(a)) == 0;
}

/* Bit-exact equality (NaN equals NaN); ints compared as i64. */
static int check_exact(const char *what, ts_tensor *a, ts_tensor *b) {
    ts_test_checks++;
    if (!same_shape(a, b)) {
        char sa[128], sb[128];
        shape_str(a, sa, sizeof sa);
        shape_str(b, sb, sizeof sb);
        ts_test_failures++;
        fprintf(stderr, "%s: shape %s, expected %s\n", what, sa, sb);
        return 0;
    }
    int64_t n = ts_tensor_numel(a);
    int fl = ts_dtype_is_float(ts_tensor_dtype(b));
    size_t es = 8;
    char *x = calloc((size_t)(n ? n : 1), es),
         *y = calloc((size_t)(n ? n : 1), es);
    int ok = 1;
    ts_dtype rdt = fl ? TS_F32 : TS_I64;
    if (ts_tensor_read(a, x, rdt) != TS_OK ||
        ts_tensor_read(b, y, rdt) != TS_OK) {
        fprintf(stderr, "%s: cannot read tensors: %s\n", what,
                ts_errmsg(ts_tensor_ctx(a)));
        ok = 0;
    } else {
        for (int64_t i = 0; i < n && ok; i++) {
            if (fl) {
                float fa = ((float *)x)[i], fb = ((float *)y)[i];
                uint32_t ua, ub;
                memcpy(&ua, &fa, 4);
                memcpy(&ub, &fb, 4);
                if (ua != ub && !(isnan(fa) && isnan(fb))) {
                    fprintf(stderr,
                            "%s: flat index %lld: got %.9g (0x%08x), "
                            "expected %.9g (0x%08x)\n",
                            what, (long long)i, fa, ua, fb, ub);
                    ok = 0;
                }
            } else if (((int64_t *)x)[i] != ((int64_t *)y)[i]) {
                fprintf(stderr,
                        "%s: flat index %lld: got %lld, expected %lld\n", what,
                        (long long)i, (long long)((int64_t *)x)[i],
                        (long long)((int64_t *)y)[i]);
                ok = 0;
            }
        }
    }
    free(x);
    free(y);
    if (!ok)
        ts_test_failures++;
    return ok;
}

static void check_dtype(const char *what, ts_tensor *a, ts_dtype want) {
    ts_test_checks++;
    if (ts_tensor_dtype(a) != want) {
        ts_test_failures++;
        fprintf(stderr, "%s: dtype %s, expected %s\n", what,
                ts_dtype_name(ts_tensor_dtype(a)), ts_dtype_name(want));
    }
}

/* The absolute tolerance scales with the expected tensor when all its values
 * are small (|e| <= m < 1: atol * m), so that tiny results (the gradient of a
 * mean over 1000 elements, softmax gradients) are still checked to their
 * precision rather than passing any value below atol. */
static double scaled_atol(ts_tensor *e, double atol) {
    int64_t n = ts_tensor_numel(e);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    double m = 0;
    if (ts_tensor_read(e, v, TS_F32) == TS_OK)
        for (int64_t i = 0; i < n; i++)
            if (isfinite(v[i]) && fabs(v[i]) > m)
                m = fabs(v[i]);
    free(v);
    if (m <= 0)
        return atol;
    return m < 1 ? atol * m : atol;
}

/* ---- one case
 * ------------------------------------------------------------------ */

#define MAX_INS 8

/* Fingerprint of every output and gradient of the current case (FNV-1a
 * over their bytes in their own dtype): the compiled run of a case must
 * give the eager run's bits (one op per graph: same kernels, same order). */
static uint64_t g_fp;

static void fingerprint(ts_tensor *t) {
    if (!t)
        return;
    size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    unsigned char *b = malloc(n ? n : 1);
    if (!b)
        return;
    if (ts_tensor_read(t, b, ts_tensor_dtype(t)) == TS_OK)
        for (size_t i = 0; i < n; i++)
            g_fp = (g_fp ^ b[i]) * 1099511628211ull;
    free(b);
}

static void run_case(ts_ctx *ctx, const tcase *c) {
    g_fp = 1469598103934665603ull;
    char what[256], nm[16];
    ts_tensor *leaf[MAX_INS] = {0}, *x[MAX_INS] = {0};
    ts_tensor *outs[MAX_OUTS] = {0};
    int nin = 0, nout = 0;
    double rtol = attr_dbl(c, "rtol", 1e-4), atol = attr_dbl(c, "atol", 1e-5);
    double grtol = attr_dbl(c, "grtol", rtol),
           gatol = attr_dbl(c, "gatol", atol);
    int exact = attr_int(c, "exact", 0) != 0;
    int gabs = attr_int(c, "gabs", 0) != 0;

    for (nin = 0; nin < MAX_INS; nin++) {
        snprintf(nm, sizeof nm, "in%d", nin);
        const tinfo *ti = find_t(c, nm);
        snprintf(nm, sizeof nm, "a%d", nin);
        long long alias = attr_int(c, nm, -1);
        if (!ti && (alias < 0 || alias >= nin))
            break;
        if (!ti) {
            /* the same leaf as an earlier input */
            leaf[nin] = ts_retain(leaf[alias]);
        } else {
            leaf[nin] = make_t(ctx, ti);
            snprintf(nm, sizeof nm, "grad%d", nin);
            if (leaf[nin] && find_t(c, nm))
                CHECK_OK(ctx, ts_set_requires_grad(leaf[nin], true));
        }
        snprintf(nm, sizeof nm, "v%d", nin);
        x[nin] = apply_views(ts_retain(leaf[nin]), attr(c, nm));
        if (!x[nin]) {
            ts_test_checks++;
            ts_test_failures++;
            fprintf(stderr, "%s: building input %d failed: %s\n", c->name, nin,
                    ts_errmsg(ctx));
            ts_clear_error(ctx);
            goto done;
        }
    }

    nout = run_op(ctx, c, x, nin, outs);
    if (nout < 0) {
        ts_test_checks++;
        ts_test_failures++;
        fprintf(stderr, "%s: unknown op %s/%d\n", c->name, c->op, nin);
        nout = 0;
        goto done;
    }
    for (int j = 0; j < nout; j++) {
        ts_test_checks++;
        if (!outs[j]) {
            ts_test_failures++;
            fprintf(stderr, "%s: %s returned NULL: %s (%s)\n", c->name, c->op,
                    ts_errmsg(ctx), ts_status_name(ts_ctx_status(ctx)));
            ts_clear_error(ctx);
            goto done;
        }
    }

    /* forward */
    for (int j = 0; j < nout; j++) {
        if (nout == 1 && find_t(c, "out"))
            snprintf(nm, sizeof nm, "out");
        else
            snprintf(nm, sizeof nm, "out%d", j);
        const tinfo *te = find_t(c, nm);
        snprintf(what, sizeof what, "%s: %s", c->name, nm);
        if (!te) {
            ts_test_checks++;
            ts_test_failures++;
            fprintf(stderr, "%s: no expected value\n", what);
            continue;
        }
        ts_tensor *e = make_t(ctx, te);
        check_dtype(what, outs[j], (ts_dtype)te->dt);
        if (exact || !ts_dtype_is_float((ts_dtype)te->dt))
            check_exact(what, outs[j], e);
        else
            test_allclose(what, outs[j], e, rtol, scaled_atol(e, atol));
        ts_release(e);
    }
    if (attr_int(c, "isview", 0)) {
        snprintf(what, sizeof what, "%s: out shares storage with in0", c->name);
        ts_test_checks++;
        if (!ts_tensor_shares_storage(outs[0], leaf[0])) {
            ts_test_failures++;
            fprintf(stderr, "%s: not a view\n", what);
        }
    }
    if (strcmp(c->op, "split") == 0)
        for (int j = 0; j < nout; j++) {
            ts_test_checks++;
            if (!ts_tensor_shares_storage(outs[j], x[0])) {
                ts_test_failures++;
                fprintf(stderr, "%s: split output %d is not a view\n", c->name,
                        j);
            }
        }
    if (strcmp(c->op, "copy") == 0) {
        CHECK(ts_tensor_is_contiguous(outs[0]));
        CHECK(!ts_tensor_shares_storage(outs[0], leaf[0]));
    }

    for (int j = 0; j < nout; j++)
        fingerprint(outs[j]);
    /* backward: loss = sum_j sum(out_j * gout_j), one ts_backward per output
     * (gradients accumulate) */
    int any_grad = 0;
    for (int j = 0; j < nout; j++) {
        if (nout == 1 && find_t(c, "gout"))
            snprintf(nm, sizeof nm, "gout");
        else
            snprintf(nm, sizeof nm, "gout%d", j);
        const tinfo *tg = find_t(c, nm);
        if (!tg)
            continue;
        any_grad = 1;
        ts_tensor *g = make_t(ctx, tg);
        ts_status s = ts_backward(outs[j], g);
        ts_test_checks++;
        if (s != TS_OK) {
            ts_test_failures++;
            fprintf(stderr, "%s: ts_backward(out%d) returned %s: %s\n", c->name,
                    j, ts_status_name(s), ts_errmsg(ctx));
            ts_clear_error(ctx);
        }
        ts_release(g);
    }
    for (int i = 0; any_grad && i < nin; i++) {
        snprintf(nm, sizeof nm, "grad%d", i);
        const tinfo *te = find_t(c, nm);
        if (!te)
            continue;
        snprintf(what, sizeof what, "%s: %s", c->name, nm);
        ts_tensor *g = ts_grad(leaf[i]);
        fingerprint(g);
        ts_test_checks++;
        if (!g) {
            ts_test_failures++;
            fprintf(stderr, "%s: no gradient\n", what);
            continue;
        }
        ts_tensor *e = make_t(ctx, te);
        check_dtype(what, g, (ts_dtype)te->dt);
        test_allclose(what, g, e, grtol, gabs ? gatol : scaled_atol(e, gatol));
        ts_release(e);
    }

done:
    if (ts_ctx_status(ctx) != TS_OK) {
        ts_test_checks++;
        ts_test_failures++;
        fprintf(stderr, "%s: error left in the context: %s\n", c->name,
                ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    for (int j = 0; j < nout; j++)
        ts_release(outs[j]);
    for (int i = 0; i < MAX_INS; i++) {
        ts_release(x[i]);
        ts_release(leaf[i]);
    }
}

/* ---- error paths
 * ----------------------------------------------------------------- */

static ts_tensor *filled(ts_ctx *ctx, ts_dtype dt, int ndim,
                         const int64_t *shape) {
    return ts_full(ctx, dt, ndim, shape, 1.0);
}

static void error_paths(ts_ctx *ctx) {
    int64_t s23[] = {2, 3}, s4[] = {4}, s45[] = {4, 5}, s32[] = {3, 2};
    ts_tensor *a = filled(ctx, TS_F32, 2, s23);
    ts_tensor *b = filled(ctx, TS_F32, 1, s4);
    ts_tensor *c = filled(ctx, TS_F32, 2, s45);
    ts_tensor *h = filled(ctx, TS_BF16, 2, s23);
    ts_tensor *ok = filled(ctx, TS_F32, 2, s32);
    CHECK(a && b && c && h && ok);

    /* broadcast mismatch: both shapes in the message */
    ts_clear_error(ctx);
    ts_tensor *r = ts_add(a, b);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "[2, 3]");
    CHECK_MSG(ctx, "[4]");
    /* a NULL input gives NULL and keeps the first error */
    ts_tensor *r2 = ts_neg(r);
    CHECK(r2 == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "[2, 3]");
    ts_release(r2);
    ts_clear_error(ctx);
    CHECK(ts_ctx_status(ctx) == TS_OK);

    /* matmul inner dims 3 vs 4 */
    r = ts_matmul(a, c);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "[2, 3]");
    CHECK_MSG(ctx, "[4, 5]");
    ts_clear_error(ctx);
    /* a good matmul still works after clearing */
    r = ts_matmul(a, ok);
    CHECK(r != NULL && ts_tensor_dim(r, 0) == 2 && ts_tensor_dim(r, 1) == 2);
    ts_release(r);

    /* dtype mismatch */
    r = ts_add(a, h);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, ts_dtype_name(TS_F32));
    CHECK_MSG(ctx, ts_dtype_name(TS_BF16));
    ts_clear_error(ctx);

    /* reduction dim out of range */
    int dims[] = {5};
    r = ts_sum(a, 1, dims, false);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "5");
    ts_clear_error(ctx);
    dims[0] = -3;
    r = ts_sum(a, 1, dims, false);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    ts_clear_error(ctx);

    /* embedding id out of range: the message names the bad id */
    int64_t vs[] = {10, 4}, ns[] = {3};
    int64_t ids[] = {1, 12, 3};
    ts_tensor *w = filled(ctx, TS_F32, 2, vs);
    ts_tensor *id = ts_from_data(ctx, TS_I64, 1, ns, ids);
    r = ts_embedding(w, id);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "12");
    ts_clear_error(ctx);
    int32_t ids32[] = {-1, 0, 0};
    ts_tensor *id32 = ts_from_data(ctx, TS_I32, 1, ns, ids32);
    r = ts_embedding(w, id32);
    CHECK(r == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "-1");
    ts_clear_error(ctx);

    ts_release(w);
    ts_release(id);
    ts_release(id32);
    ts_release(a);
    ts_release(b);
    ts_release(c);
    ts_release(h);
    ts_release(ok);
}

/* a call that must fail with status st and a message naming needle */
#define CHECK_FAILS(ctx, expr, st, needle)                                     \
    do {                                                                       \
        ts_tensor *r_ = (expr);                                                \
        CHECK(r_ == NULL);                                                     \
        CHECK(ts_ctx_status(ctx) == (st));                                     \
        CHECK_MSG(ctx, needle);                                                \
        ts_release(r_);                                                        \
        ts_clear_error(ctx);                                                   \
    } while (0)

/* bad input to the attention options, top-k, gather, one-hot and the
 * experts MLP: a status and a message naming what is wrong */
static void moe_error_paths(ts_ctx *ctx) {
    int64_t s_q[4] = {1, 2, 4, 8}, s_kv[4] = {1, 1, 4, 8};
    ts_tensor *q = filled(ctx, TS_F32, 4, s_q),
              *kv = filled(ctx, TS_F32, 4, s_kv);
    ts_attn_opts o = {.causal = true, .window = -1};
    CHECK_FAILS(ctx, ts_attention_ex(q, kv, kv, NULL, &o), TS_ERR_RANGE,
                "window -1");
    o = (ts_attn_opts){.softcap = NAN};
    CHECK_FAILS(ctx, ts_attention_ex(q, kv, kv, NULL, &o), TS_ERR_RANGE,
                "softcap");
    o = (ts_attn_opts){.scale = INFINITY};
    CHECK_FAILS(ctx, ts_attention_ex(q, kv, kv, NULL, &o), TS_ERR_RANGE,
                "scale");
    ts_tensor *r = ts_attention_ex(q, kv, kv, NULL, NULL); /* defaults */
    CHECK(r != NULL);
    ts_release(r);

    /* top-k */
    int64_t s_x[2] = {3, 5}, s_i[2] = {3, 2};
    ts_tensor *x = filled(ctx, TS_F32, 2, s_x);
    CHECK_FAILS(ctx, ts_topk(x, 0), TS_ERR_RANGE, "k = 0");
    CHECK_FAILS(ctx, ts_topk(x, 6), TS_ERR_RANGE, "last dim of 5");
    int64_t ids[6] = {0, 4, 1, 5, 2, 3};
    ts_tensor *ix = ts_from_data(ctx, TS_I64, 2, s_i, ids);
    CHECK_FAILS(ctx, ts_topk(ix, 1), TS_ERR_DTYPE, "i64");
    ts_tensor *sc = ts_scalar(ctx, TS_F32, 1.0);
    CHECK_FAILS(ctx, ts_topk(sc, 1), TS_ERR_SHAPE, "scalar");

    /* gather: index 5 of a dim of 5, in compiled mode too (the kernel
     * finds it when the graph runs) */
    CHECK_FAILS(ctx, ts_gather(x, 1, ix), TS_ERR_RANGE, "index 5");
    ts_set_mode(ctx, TS_MODE_COMPILED);
    r = ts_gather(x, 1, ix);
    CHECK(r != NULL);
    CHECK(ts_sync(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "index 5 out of range [0, 5)");
    ts_release(r);
    ts_clear_error(ctx);
    ts_set_mode(ctx, TS_MODE_EAGER);
    ts_clear_error(ctx);
    CHECK_FAILS(ctx, ts_gather(x, 2, ix), TS_ERR_RANGE, "dim 2");
    CHECK_FAILS(ctx, ts_gather(x, 1, x), TS_ERR_DTYPE, "index");
    int64_t s_big[2] = {4, 2};
    ts_tensor *big = filled(ctx, TS_I64, 2, s_big);
    CHECK_FAILS(ctx, ts_gather(x, 1, big), TS_ERR_SHAPE, "[4, 2]");

    /* one-hot */
    CHECK_FAILS(ctx, ts_one_hot(ix, 5), TS_ERR_RANGE, "index 5");
    CHECK_FAILS(ctx, ts_one_hot(ix, 0), TS_ERR_RANGE, "n = 0");
    CHECK_FAILS(ctx, ts_one_hot(x, 5), TS_ERR_DTYPE, "idx");

    /* experts MLP: N 3, C 5, k 2, E 4, F 6 */
    int64_t s_up[3] = {4, 6, 5}, s_down[3] = {4, 5, 6}, s_bad[3] = {4, 5, 5};
    ts_tensor *up = filled(ctx, TS_F32, 3, s_up);
    ts_tensor *down = filled(ctx, TS_F32, 3, s_down);
    ts_tensor *bad = filled(ctx, TS_F32, 3, s_bad);
    ts_tensor *w = filled(ctx, TS_F32, 2, s_i);
    int64_t e_ok[6] = {0, 3, -1, 2, 1, 1}, e_bad[6] = {0, 3, 1, 4, 2, 2};
    ts_tensor *eok = ts_from_data(ctx, TS_I64, 2, s_i, e_ok);
    ts_tensor *ebad = ts_from_data(ctx, TS_I64, 2, s_i, e_bad);
    r = ts_moe_experts(x, eok, w, up, up, down, TS_ACT_SILU);
    CHECK(r != NULL);
    ts_release(r);
    CHECK_FAILS(ctx, ts_moe_experts(x, ebad, w, up, up, down, TS_ACT_SILU),
                TS_ERR_RANGE, "idx[1, 1] = 4");
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, w, up, up, bad, TS_ACT_SILU),
                TS_ERR_SHAPE, "down");
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, w, bad, up, down, TS_ACT_SILU),
                TS_ERR_SHAPE, "gate");
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, eok, up, up, down, TS_ACT_SILU),
                TS_ERR_DTYPE, "routing weights");
    CHECK_FAILS(ctx, ts_moe_experts(x, w, w, up, up, down, TS_ACT_SILU),
                TS_ERR_DTYPE, "idx");
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, w, up, up, down, (ts_act)7),
                TS_ERR_INVALID_ARG, "activation 7");
    ts_tensor *h = ts_cast(up, TS_F16);
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, w, NULL, h, down, TS_ACT_GELU),
                TS_ERR_DTYPE, "f16");
    ts_tensor *xb = ts_cast(x, TS_BF16);
    CHECK_FAILS(ctx, ts_moe_experts(xb, eok, w, NULL, up, down, TS_ACT_GELU),
                TS_ERR_DTYPE, "x must be f32");
    CHECK_FAILS(ctx, ts_moe_experts(x, eok, w, NULL, NULL, down, TS_ACT_GELU),
                TS_ERR_INVALID_ARG, "NULL");

    ts_release(q), ts_release(kv), ts_release(x), ts_release(ix);
    ts_release(sc), ts_release(big), ts_release(up), ts_release(down);
    ts_release(bad), ts_release(w), ts_release(eok), ts_release(ebad);
    ts_release(h), ts_release(xb);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASES.bin [NAME_SUBSTRING]\n", argv[0]);
        return 2;
    }
    int n = 0;
    tcase *cs = load_cases(argv[1], &n);
    if (!cs)
        return 1;
    ts_ctx *ctx = test_ctx();
    /* TS_TEST_MODE=compiled runs every case through the compiled mode:
     * each op call is recorded and runs when its result is read */
    const char *mode = getenv("TS_TEST_MODE");
    bool compiled = mode && !strcmp(mode, "compiled");
    if (compiled)
        ts_set_mode(ctx, TS_MODE_COMPILED);
    int failed_cases = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 2 && !strstr(cs[i].name, argv[2]))
            continue;
        int before = ts_test_failures;
        uint64_t eager_fp = 0;
        if (compiled) { /* the same case eagerly first, for its bits */
            ts_ctx *ce = test_ctx();
            run_case(ce, &cs[i]);
            eager_fp = g_fp;
            ts_ctx_free(ce);
        }
        run_case(ctx, &cs[i]);
        if (compiled) {
            ts_test_checks++;
            if (g_fp != eager_fp) {
                ts_test_failures++;
                fprintf(stderr, "%s: compiled results differ from eager bits\n",
                        cs[i].name);
            }
        }
        ran++;
        if (ts_test_failures != before) {
            failed_cases++;
            fprintf(stderr, "FAIL %s (op %s)\n", cs[i].name, cs[i].op);
        }
    }
    printf("test_ops_torch (%s): %d cases, %d failed\n",
           compiled ? "compiled" : "eager", ran, failed_cases);
    if (compiled) {
        ts_compile_stats cs_stats;
        ts_get_compile_stats(ctx, &cs_stats);
        printf(
            "compiled graphs run: %llu, compilations %llu, cache hits %llu\n",
            (unsigned long long)cs_stats.graphs_run,
            (unsigned long long)cs_stats.compilations,
            (unsigned long long)cs_stats.cache_hits);
        CHECK(cs_stats.graphs_run > 0);
        ts_set_mode(ctx, TS_MODE_EAGER);
    }
    error_paths(ctx);
    moe_error_paths(ctx);
    ts_ctx_free(ctx);
    free_cases(cs, n);
    return test_finish("test_ops_torch");
}
