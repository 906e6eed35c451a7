/* cpu_backend.c — the CPU backend: its vtable, its kernel table (one entry
 * per op id), and the helpers every CPU kernel shares (strided iteration,
 * gathers and scatters with dtype conversion). */
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_bf16.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* each level's kernels (kernels.c, compiled per level) */
extern const cpu_kernel_set cpu_kernel_table_sse2, cpu_kernel_table_avx2,
    cpu_kernel_table_avx512, cpu_kernel_table_avx512bf16;
static const cpu_kernel_set *const level_sets[CPU_ISA_COUNT] = {
    &cpu_kernel_table_sse2, &cpu_kernel_table_avx2, &cpu_kernel_table_avx512,
    &cpu_kernel_table_avx512bf16,
    &cpu_kernel_table_avx512bf16 /* AMX: its own kernels come later */};

const cpu_kernel_set *cpu_kernels_for(cpu_isa isa) {
    return (unsigned)isa <= (unsigned)cpu_isa_detected() ? level_sets[isa]
                                                         : NULL;
}

const cpu_kernel_set *cpu_kernels_active(void) {
    static const cpu_kernel_set *active;
    const cpu_kernel_set *k = __atomic_load_n(&active, __ATOMIC_ACQUIRE);
    if (!k) {
        k = level_sets[cpu_isa_active()];
        __atomic_store_n(&active, k, __ATOMIC_RELEASE);
    }
    return k;
}

/* The slow references: the baseline compile's (all compiles agree). */
void cpu_gemm_f32_reference_sse2(int64_t M, int64_t N, int64_t K,
                                 const float *A, int64_t lda, const float *B,
                                 int64_t ldb, float *C, int64_t ldc, bool acc);
void cpu_attention_reference_sse2(const cpu_attn_shape *p, const float *q,
                                  const float *k, const float *v, float *out,
                                  float *lse);
void cpu_attention_bwd_reference_sse2(const cpu_attn_shape *p, const float *q,
                                      const float *k, const float *v,
                                      const float *dout, float *dq, float *dk,
                                      float *dv);
void cpu_gemm_f32_reference(int64_t M, int64_t N, int64_t K, const float *A,
                            int64_t lda, const float *B, int64_t ldb, float *C,
                            int64_t ldc, bool acc) {
    cpu_gemm_f32_reference_sse2(M, N, K, A, lda, B, ldb, C, ldc, acc);
}
void cpu_attention_reference(const cpu_attn_shape *p, const float *q,
                             const float *k, const float *v, float *out,
                             float *lse) {
    cpu_attention_reference_sse2(p, q, k, v, out, lse);
}
void cpu_attention_bwd_reference(const cpu_attn_shape *p, const float *q,
                                 const float *k, const float *v,
                                 const float *dout, float *dq, float *dk,
                                 float *dv) {
    cpu_attention_bwd_reference_sse2(p, q, k, v, dout, dq, dk, dv);
}

/* Outside the kernel files these names call the active level's. */
bool cpu_fusable(int op) {
    return cpu_kernels_active()->fusable(op);
}
ts_status cpu_run_fused(ts_ctx *ctx, const ts_fused *f) {
    return cpu_kernels_active()->run_fused(ctx, f);
}
float cpu_eval_scalar(const ts_node *n, const float *args) {
    return cpu_kernels_active()->eval_scalar(n, args);
}
void cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float *C, int64_t ldc,
                  bool acc) {
    cpu_kernels_active()->gemm_f32(M, N, K, A, lda, B, ldb, C, ldc, acc);
}
bool cpu_gemm_f32_w16t(int64_t R, int64_t N, int64_t K, const float *A,
                       int64_t lda, const uint16_t *W, int64_t ldw, bool bf16,
                       float *Y) {
    return cpu_kernels_active()->gemm_f32_w16t(R, N, K, A, lda, W, ldw, bf16,
                                               Y);
}
void cpu_attention_fwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, float *out, float *lse) {
    cpu_kernels_active()->attention_fwd(p, q, k, v, out, lse);
}
void cpu_attention_decode(const cpu_attn_shape *p, const float *q,
                          const float *k, int64_t kst_b, int64_t kst_h,
                          const float *v, int64_t vst_b, int64_t vst_h,
                          float *out, float *lse) {
    cpu_kernels_active()->attention_decode(p, q, k, kst_b, kst_h, v, vst_b,
                                           vst_h, out, lse);
}
void cpu_attention_bwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, const float *out, const float *lse,
                       const float *dout, float *dq, float *dk, float *dv) {
    cpu_kernels_active()->attention_bwd(p, q, k, v, out, lse, dout, dq, dk, dv);
}

static ts_status cpu_run_node(ts_ctx *ctx, ts_node *n) {
    ts_cpu_kernel k = cpu_kernels_active()->kernels[n->op];
    if (!k)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "the CPU backend has no kernel for op %s",
                            ts_op_table[n->op].name);
    /* what an in-place op writes loses its packed copy here, when the
     * write happens (a compiled plan records it long before) */
    if (ts_op_table[n->op].in_place) {
        ts_storage_drop_packed(n->in[0]->storage);
        if (n->op == TS_OP_ADAMW)
            ts_storage_drop_packed(n->in[2]->storage),
                ts_storage_drop_packed(n->in[3]->storage);
    }
    return k(ctx, n);
}

/* ---- packed weights ---- */

static void packed_release(void *p) {
    cpu_bf16_packed_free(p);
}

const cpu_bf16_packed *cpu_packed_operand(ts_tensor *b, cpu_isa isa,
                                          bool make) {
    ts_storage *s = b->storage;
    if (b->dtype != TS_BF16 || b->ndim != 2 || !ts_storage_on_host(s) ||
        s->pending || !s->data)
        return NULL;
    int64_t K = b->shape[0], N = b->shape[1];
    const void *p = ts_tensor_ptr(b);
    if (s->packed && s->packed_free == packed_release &&
        cpu_bf16_packed_matches(s->packed, K, N, p, TS_BF16, b->strides[0],
                                b->strides[1]))
        return s->packed;
    /* another view's copy stays unless asked (one copy a storage) */
    if (!make && (!s->pack_wanted || s->packed))
        return NULL;
    cpu_bf16_packed *np =
        cpu_bf16_pack_b(isa, K, N, p, TS_BF16, b->strides[0], b->strides[1]);
    if (!np)
        return NULL;
    ts_storage_drop_packed(s);
    s->packed = np;
    s->packed_bytes = cpu_bf16_packed_bytes(np);
    s->packed_free = packed_release;
    return np;
}

/* ts_backend.prepack: the bf16 GEMM's layout at the AVX512_BF16 level
 * (below it, and for other dtypes, nothing to do) */
static ts_status cpu_prepack(ts_ctx *ctx, ts_tensor *b) {
    cpu_isa isa = cpu_isa_active();
    if (!b || b->dtype != TS_BF16 || b->ndim != 2 || isa < CPU_ISA_AVX512_BF16)
        return TS_OK;
    if (ts_materialize(b) != TS_OK)
        return ctx->status;
    if (!cpu_packed_operand(b, isa, true))
        return ts_set_error(ctx, TS_ERR_OOM,
                            "prepack: out of memory for the packed copy of a "
                            "bf16 [%lld, %lld] weight",
                            (long long)b->shape[1], (long long)b->shape[0]);
    return TS_OK;
}

static ts_status cpu_sync(ts_ctx *ctx) {
    (void)ctx;
    return TS_OK; /* kernels run synchronously */
}

static void *cpu_alloc(ts_ctx *ctx, int dev, size_t bytes) {
    (void)dev; /* the host's pools share one allocator */
    return ts_alloc_bytes(ctx, bytes);
}

static void cpu_free(ts_ctx *ctx, int dev, void *p, size_t bytes) {
    (void)dev;
    ts_free_bytes(ctx, p, bytes);
}

static ts_status cpu_copy_bytes(ts_ctx *ctx, int dev, void *dst,
                                const void *src, size_t bytes) {
    (void)ctx, (void)dev;
    if (bytes)
        memcpy(dst, src, bytes);
    return TS_OK;
}

static ts_status cpu_fill(ts_ctx *ctx, int dev, void *dst, size_t count,
                          const void *pattern, size_t elem_bytes) {
    (void)ctx, (void)dev;
    char *p = dst;
    for (size_t i = 0; i < count; i++)
        memcpy(p + i * elem_bytes, pattern, elem_bytes);
    return TS_OK;
}

static ts_status cpu_sync_dev(ts_ctx *ctx, int dev) {
    (void)dev;
    return cpu_sync(ctx);
}

static int cpu_count(ts_ctx *ctx) {
    (void)ctx;
    return TS_MAX_DEVICES;
}

/* the processor's model name from /proc/cpuinfo */
static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "x86-64 CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    fclose(f);
}

static ts_status cpu_info(ts_ctx *ctx, int dev, ts_device_info *out) {
    (void)dev;
    memset(out, 0, sizeof *out);
    cpu_model(out->name, sizeof out->name);
    snprintf(out->type, sizeof out->type, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
         psz = sysconf(_SC_PAGESIZE);
    out->total_bytes = pages > 0 ? (size_t)pages * (size_t)psz : 0;
    out->free_bytes = avail > 0 ? (size_t)avail * (size_t)psz : 0;
    char feats[400];
    cpu_features_str(feats, sizeof feats);
    snprintf(out->features, sizeof out->features,
             "threads=%d isa=%s (max %s) %s", ctx->num_threads,
             cpu_isa_name(cpu_isa_active()), cpu_isa_name(cpu_isa_detected()),
             feats);
    return TS_OK;
}

const ts_backend ts_cpu_backend = {.name = "cpu",
                                   .kind = TS_DEVICE_CPU,
                                   .alloc = cpu_alloc,
                                   .free = cpu_free,
                                   .copy = cpu_copy_bytes,
                                   .upload = cpu_copy_bytes,
                                   .download = cpu_copy_bytes,
                                   .fill = cpu_fill,
                                   .run_node = cpu_run_node,
                                   .sync = cpu_sync_dev,
                                   .fusable = cpu_fusable,
                                   .run_fused = cpu_run_fused,
                                   .eval_scalar = cpu_eval_scalar,
                                   .count = cpu_count,
                                   .info = cpu_info,
                                   .prepack = cpu_prepack};

void cpu_iter_init(cpu_iter *it, int ndim, const int64_t *shape, int nops,
                   int64_t (*strides)[TS_MAX_DIMS]) {
    it->nops = nops;
    it->ndim = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        int j = it->ndim;
        /* merge with the previous kept dim when contiguous for all */
        if (j > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (it->st[k][j - 1] != strides[k][d] * shape[d])
                    merge = false;
            if (merge) {
                it->shape[j - 1] *= shape[d];
                for (int k = 0; k < nops; k++)
                    it->st[k][j - 1] = strides[k][d];
                continue;
            }
        }
        it->shape[j] = shape[d];
        for (int k = 0; k < nops; k++)
            it->st[k][j] = strides[k][d];
        it->ndim++;
    }
    if (it->ndim == 0) { /* a single element */
        it->ndim = 1;
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++)
            it->st[k][0] = 0;
    }
    /* an empty shape iterates nothing */
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) {
            it->ndim = 1;
            it->shape[0] = 0;
        }
}

void cpu_gather_f32(float *dst, const char *src, ts_dtype dt, int64_t stride,
                    int64_t n) {
    if (stride == 0) {
        float v = ts_load_f32(src, dt);
        for (int64_t i = 0; i < n; i++)
            dst[i] = v;
        return;
    }
    switch (dt) {
    case TS_F32: {
        const float *s = (const float *)src;
        if (stride == 1)
            memcpy(dst, s, sizeof(float) * (size_t)n);
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = s[i * stride];
        break;
    }
    case TS_BF16: {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i * stride] << 16;
            memcpy(&dst[i], &u, 4);
        }
        break;
    }
    case TS_F16: {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = ts_f16_to_f32(s[i * stride]);
        break;
    }
    default: {
        size_t es = ts_dtype_size(dt);
        for (int64_t i = 0; i < n; i++)
            dst[i] = ts_load_f32(src + (size_t)(i * stride) * es, dt);
    }
    }
}

void cpu_scatter_f32(char *dst, ts_dtype dt, int64_t stride, const float *src,
                     int64_t n) {
    switch (dt) {
    case TS_F32: {
        float *d = (float *)dst;
        if (stride == 1)
            memcpy(d, src, sizeof(float) * (size_t)n);
        else
            for (int64_t i = 0; i < n; i++)
                d[i * stride] = src[i];
        break;
    }
    case TS_BF16: {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i * stride] = ts_f32_to_bf16(src[i]);
        break;
    }
    case TS_F16: {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i * stride] = ts_f32_to_f16(src[i]);
        break;
    }
    default: {
        size_t es = ts_dtype_size(dt);
        for (int64_t i = 0; i < n; i++)
            ts_store_f32(dst + (size_t)(i * stride) * es, dt, src[i]);
    }
    }
}

typedef struct {
    char *dst;
    const char *src;
    ts_dtype ddt;
    ts_dtype sdt;
    const cpu_iter *itp;
    int64_t inner;
    size_t des;
    size_t ses;
    int64_t ds;
    int64_t ss;
    bool ints;
} copy_rows_args;

static void copy_rows(void *p_, int64_t lo_, int64_t hi_) {
    const copy_rows_args *a_ = p_;
    char *dst = a_->dst;
    const char *src = a_->src;
    ts_dtype ddt = a_->ddt;
    ts_dtype sdt = a_->sdt;
    const cpu_iter *itp = a_->itp;
    int64_t inner = a_->inner;
    size_t des = a_->des;
    size_t ses = a_->ses;
    int64_t ds = a_->ds;
    int64_t ss = a_->ss;
    bool ints = a_->ints;
    for (int64_t r = lo_; r < hi_; r++) {
        int64_t off[2];
        cpu_iter_offsets(itp, r, off);
        char *d = dst + off[0] * (int64_t)des;
        const char *s = src + off[1] * (int64_t)ses;
        if (ddt == sdt && ds == 1 && ss == 1) {
            memcpy(d, s, (size_t)inner * des);
        } else if (ddt == sdt) {
            for (int64_t i = 0; i < inner; i++)
                memcpy(d + i * ds * (int64_t)des, s + i * ss * (int64_t)ses,
                       des);
        } else if (ints) {
            for (int64_t i = 0; i < inner; i++)
                ts_store_f64(d + i * ds * (int64_t)des, ddt,
                             ts_load_f64(s + i * ss * (int64_t)ses, sdt));
        } else {
            float buf[1024];
            for (int64_t i0 = 0; i0 < inner; i0 += 1024) {
                int64_t m = inner - i0 < 1024 ? inner - i0 : 1024;
                cpu_gather_f32(buf, s + i0 * ss * (int64_t)ses, sdt, ss, m);
                cpu_scatter_f32(d + i0 * ds * (int64_t)des, ddt, ds, buf, m);
            }
        }
    }
}

void cpu_copy_strided(char *dst, ts_dtype ddt, const int64_t *dst_strides,
                      const char *src, ts_dtype sdt, const int64_t *src_strides,
                      int ndim, const int64_t *shape) {
    int64_t st[2][TS_MAX_DIMS];
    memcpy(st[0], dst_strides, sizeof(int64_t) * (size_t)ndim);
    memcpy(st[1], src_strides, sizeof(int64_t) * (size_t)ndim);
    cpu_iter it;
    cpu_iter_init(&it, ndim, shape, 2, st);
    int64_t rows = cpu_iter_rows(&it), inner = cpu_iter_inner(&it);
    size_t des = ts_dtype_size(ddt), ses = ts_dtype_size(sdt);
    int64_t ds = it.st[0][it.ndim - 1], ss = it.st[1][it.ndim - 1];
    bool ints = !ts_dtype_is_float(ddt) || !ts_dtype_is_float(sdt);
    copy_rows_args job = {dst, src, ddt, sdt, &it, inner,
                          des, ses, ds,  ss,  ints};
    ts_parallel_for(rows, cpu_grain(inner, 32768), copy_rows, &job);
}

/* Kernel temporaries: a few freed blocks per thread are kept and handed
 * out again. Decoding runs the same kernels with the same sizes token after
 * token (attention copies a KV-cache view, 2 MiB per layer for Qwen3-0.6B
 * at 512 positions); through malloc/free, blocks past glibc's mmap
 * threshold were fresh mappings each time, their page faults costing more
 * than the attention itself. */
#define TMP_SLOTS     8
#define TMP_MAX_BYTES ((size_t)256 << 20)
static _Thread_local struct {
    void *p;
    size_t size;
} tmp_cache[TMP_SLOTS];

/* a thread that ends (a server's engine thread) frees what it kept */
static pthread_key_t tmp_key;
static pthread_once_t tmp_once = PTHREAD_ONCE_INIT;
static void tmp_release(void *unused) {
    (void)unused;
    for (int i = 0; i < TMP_SLOTS; i++) {
        free(tmp_cache[i].p);
        tmp_cache[i].p = NULL;
    }
}
static void tmp_key_init(void) {
    pthread_key_create(&tmp_key, tmp_release);
}

void *cpu_tmp_alloc(size_t bytes) {
    pthread_once(&tmp_once, tmp_key_init);
    if (!pthread_getspecific(tmp_key))
        pthread_setspecific(tmp_key, (void *)1); /* run tmp_release at exit */
    int best = -1;
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_cache[i].p && tmp_cache[i].size >= bytes &&
            (best < 0 || tmp_cache[i].size < tmp_cache[best].size))
            best = i;
    if (best < 0)
        return malloc(bytes ? bytes : 1);
    void *p = tmp_cache[best].p;
    tmp_cache[best].p = NULL;
    return p;
}

void cpu_tmp_free(void *p) {
    if (!p)
        return;
    size_t size = malloc_usable_size(p);
    int slot = -1;
    for (int i = 0; i < TMP_SLOTS && size <= TMP_MAX_BYTES; i++)
        if (!tmp_cache[i].p) {
            slot = i;
            break;
        } else if (tmp_cache[i].size < size &&
                   (slot < 0 || tmp_cache[i].size < tmp_cache[slot].size))
            slot = i; /* evict the smallest kept block */
    if (slot < 0) {
        free(p);
        return;
    }
    free(tmp_cache[slot].p);
    tmp_cache[slot].p = p;
    tmp_cache[slot].size = size;
}

const float *cpu_as_f32(const ts_tensor *t, float **tmp) {
    *tmp = NULL;
    if (t->dtype == TS_F32 && ts_tensor_is_contiguous(t))
        return (const float *)ts_tensor_ptr(t);
    int64_t n = ts_tensor_numel(t);
    *tmp = cpu_tmp_alloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!*tmp)
        return NULL;
    int64_t cst[TS_MAX_DIMS];
    ts_contiguous_strides(t->ndim, t->shape, cst);
    cpu_copy_strided((char *)*tmp, TS_F32, cst, ts_tensor_ptr(t), t->dtype,
                     t->strides, t->ndim, t->shape);
    return *tmp;
}

typedef struct {
    const ts_tensor *t;
    char *d;
    const float *src;
    int64_t n;
} store_job;

/* 4096-element blocks [b0, b1) of cpu_store_out */
static void store_blocks(void *p, int64_t b0, int64_t b1) {
    const store_job *j = p;
    size_t es = ts_dtype_size(j->t->dtype);
    for (int64_t i0 = b0 * 4096; i0 < j->n && i0 < b1 * 4096; i0 += 4096) {
        int64_t m = j->n - i0 < 4096 ? j->n - i0 : 4096;
        cpu_scatter_f32(j->d + i0 * (int64_t)es, j->t->dtype, 1, j->src + i0,
                        m);
    }
}

void cpu_store_out(ts_tensor *t, const float *src) {
    int64_t n = ts_tensor_numel(t);
    char *d = ts_tensor_ptr(t);
    if (t->dtype == TS_F32 && (const float *)d == src)
        return;
    store_job j = {t, d, src, n};
    ts_parallel_for((n + 4095) / 4096, 8, store_blocks, &j);
}
