/* attention.c — fused scaled-dot-product attention on the CPU, in the
 * manner of FlashAttention-2: queries in blocks of BQ rows, keys in blocks
 * of BK, an online softmax (running max and sum per row), so no T x S score
 * matrix is ever stored. Grouped-query heads read their shared K/V head.
 * Options (ts_attn_opts): a sliding window, whose key blocks wholly outside
 * it are skipped like the causal future, and a tanh softcap on the scores.
 * The backward recomputes the probabilities from the saved log-sum-exp.
 * Also the paged serving kernel (f32, bf16 and int8 KV pools, tiled by
 * GQA group and token run; its slow reference is in tests/test_engine_kv.c,
 * which reads the pools' own rows), and the slow reference kernels the
 * tests hold the fast ones against. */
#include "backend/cpu/cpu.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ 32
#define BK 64

#ifdef __AVX2__
/* row[j] = exp(row[j] - m) for j < n; returns the sum */
static float exp_sub_sum(float *row, int64_t n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8], s = 0;
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; i++)
        s += lanes[i];
    for (; j < n; j++) {
        row[j] = row[j] - m < -87.3f ? 0.0f : expf(row[j] - m);
        s += row[j];
    }
    return s;
}

/* row[j] = cap tanh(row[j] / cap) for j < n, and (dcap non-NULL) the
 * derivative 1 - tanh^2 in dcap[j]; the tail through a padded vector, so
 * every element is computed alike */
static void softcap_row(float *row, int64_t n, float cap, float *dcap) {
    __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap),
           one = _mm256_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 8) {
        float buf[8] = {0};
        int64_t m = n - j < 8 ? n - j : 8;
        memcpy(buf, row + j, sizeof(float) * (size_t)m);
        __m256 t = cpu_tanh8(_mm256_mul_ps(_mm256_loadu_ps(buf), ic));
        _mm256_storeu_ps(buf, _mm256_mul_ps(c, t));
        memcpy(row + j, buf, sizeof(float) * (size_t)m);
        if (dcap) {
            _mm256_storeu_ps(buf, _mm256_fnmadd_ps(t, t, one));
            memcpy(dcap + j, buf, sizeof(float) * (size_t)m);
        }
    }
}

#else
/* Without AVX2: libm's expf one element at a time. */
static float exp_sub_sum(float *row, int64_t n, float m) {
    float s = 0;
    for (int64_t j = 0; j < n; j++) {
        row[j] = row[j] - m < -87.3f ? 0.0f : expf(row[j] - m);
        s += row[j];
    }
    return s;
}

static void softcap_row(float *row, int64_t n, float cap, float *dcap) {
    for (int64_t j = 0; j < n; j++) {
        float t = tanhf(row[j] / cap);
        row[j] = cap * t;
        if (dcap)
            dcap[j] = 1.0f - t * t;
    }
}
#endif

/* O[d] += w V[d] for d < D */
static inline void axpy(float *O, float w, const float *V, int64_t D) {
    int64_t d = 0;
#ifdef __AVX2__
    __m256 wv = _mm256_set1_ps(w);
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(O + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(V + d),
                                                _mm256_loadu_ps(O + d)));
#endif
    for (; d < D; d++)
        O[d] += w * V[d];
}

/* the keys query t sees: [key_lo, key_hi) (the mask may hide more) */
static int64_t key_lo(const cpu_attn_shape *p, int64_t t) {
    int64_t lo = t + p->S - p->T - p->window + 1;
    return p->window > 0 && lo > 0 ? lo : 0;
}
static int64_t key_hi(const cpu_attn_shape *p, int64_t t) {
    int64_t hi = t + p->S - p->T + 1;
    return !p->causal || hi > p->S ? p->S : hi;
}

/* scores of one (BQ x BK) block: scale, softcap (its derivative into
 * dcap when given), mask, causal and window limits */
static void finish_scores(const cpu_attn_shape *p, float *sb, int64_t bq,
                          int64_t bk, int64_t b, int64_t h, int64_t t0,
                          int64_t s0, float *dcap) {
    for (int64_t i = 0; i < bq; i++) {
        float *row = sb + i * BK;
        int64_t t = t0 + i;
        for (int64_t j = 0; j < bk; j++)
            row[j] *= p->scale;
        if (p->softcap > 0)
            softcap_row(row, bk, p->softcap, dcap ? dcap + i * BK : NULL);
        if (p->mask) {
            const float *mr = p->mask + b * p->mask_st[0] + h * p->mask_st[1] +
                              t * p->mask_st[2];
            for (int64_t j = 0; j < bk; j++)
                row[j] += mr[(s0 + j) * p->mask_st[3]];
        }
        int64_t lo = key_lo(p, t) - s0, hi = key_hi(p, t) - s0;
        for (int64_t j = 0; j < lo && j < bk; j++)
            row[j] = -INFINITY;
        for (int64_t j = hi > 0 ? hi : 0; j < bk; j++)
            row[j] = -INFINITY;
    }
}

/* keys a query block [t0, t0 + bq) can see: [key_begin, key_end); the
 * blocks outside (the future, past the window) are never computed */
static int64_t key_begin(const cpu_attn_shape *p, int64_t t0) {
    return key_lo(p, t0);
}
static int64_t key_end(const cpu_attn_shape *p, int64_t t0, int64_t bq) {
    return key_hi(p, t0 + bq - 1);
}

/* (rows x cols) src with leading dim lds -> dst (cols x rows), ldd */
static void transpose(const float *src, int64_t rows, int64_t cols, int64_t lds,
                      float *dst, int64_t ldd) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

typedef struct {
    const cpu_attn_shape *p;
    const float *k;
    float *kt;
} transpose_job;

/* heads [i0, i1) of transpose_heads */
static void transpose_range(void *arg, int64_t i0, int64_t i1) {
    const transpose_job *j = arg;
    const cpu_attn_shape *p = j->p;
    int64_t per = p->S * p->D;
    for (int64_t i = i0; i < i1; i++)
        transpose(j->k + i * per, p->S, p->D, p->D, j->kt + i * per, p->S);
}

/* per (b, kv head): K (S x D) -> Kt (D x S) */
static float *transpose_heads(const cpu_attn_shape *p, const float *k) {
    int64_t per = p->S * p->D;
    float *kt = cpu_tmp_alloc(sizeof(float) * (size_t)(p->B * p->KV * per + 1));
    if (!kt)
        return NULL;
    transpose_job j = {p, k, kt};
    ts_parallel_for(p->B * p->KV, 1, transpose_range, &j);
    return kt;
}

typedef struct {
    const cpu_attn_shape *p;
    const float *q;
    const float *v;
    float *out;
    float *lse;
    const float *kt;
} attention_fwd_items_args;

static void attention_fwd_items(void *p_, int64_t lo_, int64_t hi_) {
    const attention_fwd_items_args *a_ = p_;
    const cpu_attn_shape *p = a_->p;
    int64_t H = p->H, KV = p->KV, T = p->T, S = p->S, D = p->D,
            G = p->H / p->KV, nqb = (p->T + BQ - 1) / BQ;
    const float *q = a_->q;
    const float *v = a_->v;
    float *out = a_->out;
    float *lse = a_->lse;
    const float *kt = a_->kt;
    float *sb = malloc(sizeof(float) * BQ * BK);
    float *o = malloc(sizeof(float) * (size_t)(BQ * D));
    float m[BQ], l[BQ];
    for (int64_t item = lo_; item < hi_; item++) {
        if (!sb || !o)
            continue;
        int64_t b = item / (H * nqb), h = item / nqb % H, qb = item % nqb;
        int64_t t0 = qb * BQ, bq = T - t0 < BQ ? T - t0 : BQ;
        int64_t kvh = h / G;
        const float *Q = q + ((b * H + h) * T + t0) * D;
        const float *Kt = kt + (b * KV + kvh) * S * D;
        const float *Vh = v + (b * KV + kvh) * S * D;
        memset(o, 0, sizeof(float) * (size_t)(bq * D));
        for (int64_t i = 0; i < bq; i++)
            m[i] = -INFINITY, l[i] = 0;
        int64_t s_end = key_end(p, t0, bq);
        for (int64_t s0 = key_begin(p, t0); s0 < s_end; s0 += BK) {
            int64_t bk = s_end - s0 < BK ? s_end - s0 : BK;
            cpu_gemm_f32(bq, bk, D, Q, D, Kt + s0, S, sb, BK, false);
            finish_scores(p, sb, bq, bk, b, h, t0, s0, NULL);
            for (int64_t i = 0; i < bq; i++) {
                float *row = sb + i * BK, mx = m[i];
                for (int64_t j = 0; j < bk; j++)
                    mx = row[j] > mx ? row[j] : mx;
                if (mx == -INFINITY) { /* nothing visible yet */
                    memset(row, 0, sizeof(float) * (size_t)bk);
                    continue;
                }
                float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
                float s = exp_sub_sum(row, bk, mx);
                l[i] = l[i] * corr + s;
                m[i] = mx;
                if (corr != 1.0f)
                    for (int64_t d = 0; d < D; d++)
                        o[i * D + d] *= corr;
            }
            cpu_gemm_f32(bq, D, bk, sb, BK, Vh + s0 * D, D, o, D, true);
        }
        float *O = out + ((b * H + h) * T + t0) * D;
        float *L = lse + (b * H + h) * T + t0;
        for (int64_t i = 0; i < bq; i++) {
            /* a row that sees no key gives 0 (PyTorch gives NaN) */
            float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
            for (int64_t d = 0; d < D; d++)
                O[i * D + d] = o[i * D + d] * inv;
            L[i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
        }
    }
    free(sb);
    free(o);
}

void cpu_attention_fwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, float *out, float *lse) {
    int64_t nqb = (p->T + BQ - 1) / BQ;
    float *kt = transpose_heads(p, k);
    attention_fwd_items_args job = {p, q, v, out, lse, kt};
    if (kt)
        ts_parallel_for(p->B * p->H * nqb, 1, attention_fwd_items, &job);
    cpu_tmp_free(kt);
}

#ifdef __AVX2__
static float dot8(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i),
                              acc);
    float lanes[8], s = 0;
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++)
        s += lanes[j];
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* out[r] = dot(q, k[r]) for four rows at once: four independent FMA
 * chains instead of one, so the dot products are not latency-bound */
static void dot8x4(const float *q, const float *const k[4], int64_t n,
                   float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[0] + i), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[1] + i), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[2] + i), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[3] + i), a3);
    }
    __m256 acc[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; r++) {
        float lanes[8], sum = 0;
        _mm256_storeu_ps(lanes, acc[r]);
        for (int j = 0; j < 8; j++)
            sum += lanes[j];
        for (int64_t t = i; t < n; t++)
            sum += q[t] * k[r][t];
        out[r] = sum;
    }
}

#else
static float dot8(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void dot8x4(const float *q, const float *const k[4], int64_t n,
                   float *out) {
    for (int r = 0; r < 4; r++)
        out[r] = dot8(q, k[r], n);
}
#endif

typedef struct {
    const cpu_attn_shape *p;
    const float *q;
    const float *k;
    int64_t kst_b;
    int64_t kst_h;
    const float *v;
    int64_t vst_b;
    int64_t vst_h;
    float *out;
    float *lse;
} attention_decode_items_args;

static void attention_decode_items(void *p_, int64_t lo_, int64_t hi_) {
    const attention_decode_items_args *a_ = p_;
    const cpu_attn_shape *p = a_->p;
    int64_t H = p->H, T = p->T, S = p->S, D = p->D, G = p->H / p->KV;
    const float *q = a_->q;
    const float *k = a_->k;
    int64_t kst_b = a_->kst_b;
    int64_t kst_h = a_->kst_h;
    const float *v = a_->v;
    int64_t vst_b = a_->vst_b;
    int64_t vst_h = a_->vst_h;
    float *out = a_->out;
    float *lse = a_->lse;
    float *sc = malloc(sizeof(float) * (size_t)(S + 8));
    for (int64_t item = lo_; item < hi_; item++) {
        int64_t b = item / (H * T), h = item / T % H, t = item % T;
        const float *Q = q + ((b * H + h) * T + t) * D;
        /* keys this query sees: [lo, lo + n) */
        int64_t lo = key_lo(p, t), n = key_hi(p, t) - lo;
        const float *K = k + b * kst_b + (h / G) * kst_h + lo * D;
        const float *V = v + b * vst_b + (h / G) * vst_h + lo * D;
        float *O = out + ((b * H + h) * T + t) * D;
        float mx = -INFINITY;
        int64_t s = 0;
        for (; sc && s + 4 <= n; s += 4) {
            const float *rows[4] = {K + s * D, K + (s + 1) * D, K + (s + 2) * D,
                                    K + (s + 3) * D};
            dot8x4(Q, rows, D, sc + s);
        }
        for (; sc && s < n; s++)
            sc[s] = dot8(Q, K + s * D, D);
        for (s = 0; sc && s < n; s++)
            sc[s] *= p->scale;
        if (sc && p->softcap > 0 && n > 0)
            softcap_row(sc, n, p->softcap, NULL);
        for (s = 0; sc && s < n; s++)
            mx = sc[s] > mx ? sc[s] : mx;
        memset(O, 0, sizeof(float) * (size_t)D);
        if (!sc || n <= 0) {
            lse[(b * H + h) * T + t] = -INFINITY;
            continue;
        }
        float l = exp_sub_sum(sc, n, mx), inv = 1.0f / l;
        for (int64_t s = 0; s < n; s++)
            axpy(O, sc[s] * inv, V + s * D, D);
        lse[(b * H + h) * T + t] = mx + logf(l);
    }
    free(sc);
}

void cpu_attention_decode(const cpu_attn_shape *p, const float *q,
                          const float *k, int64_t kst_b, int64_t kst_h,
                          const float *v, int64_t vst_b, int64_t vst_h,
                          float *out, float *lse) {
    attention_decode_items_args job = {p, q,     k,     kst_b, kst_h,
                                       v, vst_b, vst_h, out,   lse};
    ts_parallel_for(p->B * p->H * p->T, cpu_grain(p->S * p->D, 16384),
                    attention_decode_items, &job);
}

/* the reference's score of query t (row qr) and key s (row kr), in f64;
 * *dcap (when given) gets the softcap's derivative 1 - tanh^2 */
static double ref_score(const cpu_attn_shape *p, const float *qr,
                        const float *kr, int64_t b, int64_t h, int64_t t,
                        int64_t s, double *dcap) {
    double d = 0;
    for (int64_t i = 0; i < p->D; i++)
        d += (double)qr[i] * kr[i];
    d *= p->scale;
    if (dcap)
        *dcap = 1;
    if (p->softcap > 0) {
        double th = tanh(d / p->softcap);
        d = p->softcap * th;
        if (dcap)
            *dcap = 1 - th * th;
    }
    if (p->mask)
        d += p->mask[b * p->mask_st[0] + h * p->mask_st[1] + t * p->mask_st[2] +
                     s * p->mask_st[3]];
    int64_t pos = t + p->S - p->T;
    if ((p->causal && s > pos) || (p->window > 0 && pos - s >= p->window))
        d = -INFINITY;
    return d;
}

void cpu_attention_reference(const cpu_attn_shape *p, const float *q,
                             const float *k, const float *v, float *out,
                             float *lse) {
    int64_t H = p->H, T = p->T, S = p->S, D = p->D, G = p->H / p->KV;
    double *sc = malloc(sizeof(double) * (size_t)(S + 1));
    if (!sc)
        return;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *qr = q + ((b * H + h) * T + t) * D;
                const float *K = k + (b * p->KV + h / G) * S * D;
                const float *V = v + (b * p->KV + h / G) * S * D;
                double mx = -INFINITY;
                for (int64_t s = 0; s < S; s++) {
                    double d = ref_score(p, qr, K + s * D, b, h, t, s, NULL);
                    sc[s] = d;
                    if (d > mx)
                        mx = d;
                }
                double sum = 0;
                for (int64_t s = 0; s < S; s++)
                    sum += sc[s] = mx == -INFINITY ? 0 : exp(sc[s] - mx);
                float *o = out + ((b * H + h) * T + t) * D;
                for (int64_t i = 0; i < D; i++) {
                    double acc = 0;
                    for (int64_t s = 0; s < S; s++)
                        acc += sc[s] * V[s * D + i];
                    o[i] = sum > 0 ? (float)(acc / sum) : 0.0f;
                }
                lse[(b * H + h) * T + t] =
                    sum > 0 ? (float)(mx + log(sum)) : -INFINITY;
            }
    free(sc);
}

typedef struct {
    const cpu_attn_shape *p;
    const float *q;
    const float *k;
    const float *out;
    const float *lse;
    const float *dout;
    float *dq;
    float *dk;
    float *dv;
    const float *kt;
    const float *vt;
} attention_bwd_items_args;

static void attention_bwd_items(void *p_, int64_t lo_, int64_t hi_) {
    const attention_bwd_items_args *a_ = p_;
    const cpu_attn_shape *p = a_->p;
    int64_t H = p->H, KV = p->KV, T = p->T, S = p->S, D = p->D,
            G = p->H / p->KV, nqb = (p->T + BQ - 1) / BQ;
    const float *q = a_->q;
    const float *k = a_->k;
    const float *out = a_->out;
    const float *lse = a_->lse;
    const float *dout = a_->dout;
    float *dq = a_->dq;
    float *dk = a_->dk;
    float *dv = a_->dv;
    const float *kt = a_->kt;
    const float *vt = a_->vt;
    float *sb = malloc(sizeof(float) * BQ * BK);
    float *dp = malloc(sizeof(float) * BQ * BK);
    float *tr = malloc(sizeof(float) * BQ * BK);
    float *dcap = p->softcap > 0 ? malloc(sizeof(float) * BQ * BK) : NULL;
    float di[BQ];
    for (int64_t item = lo_; item < hi_; item++) {
        if (!sb || !dp || !tr || (p->softcap > 0 && !dcap))
            continue;
        int64_t b = item / KV, kvh = item % KV;
        const float *Kh = k + item * S * D, *Kt = kt + item * S * D;
        const float *Vt = vt + item * S * D;
        float *dK = dk + item * S * D, *dV = dv + item * S * D;
        for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
            for (int64_t qb = 0; qb < nqb; qb++) {
                int64_t t0 = qb * BQ, bq = T - t0 < BQ ? T - t0 : BQ;
                int64_t row0 = (b * H + h) * T + t0;
                const float *Q = q + row0 * D, *dO = dout + row0 * D;
                const float *O = out + row0 * D, *L = lse + row0;
                float *dQ = dq + row0 * D;
                for (int64_t i = 0; i < bq; i++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)dO[i * D + d] * O[i * D + d];
                    di[i] = (float)s;
                }
                int64_t s_end = key_end(p, t0, bq);
                for (int64_t s0 = key_begin(p, t0); s0 < s_end; s0 += BK) {
                    int64_t bk = s_end - s0 < BK ? s_end - s0 : BK;
                    cpu_gemm_f32(bq, bk, D, Q, D, Kt + s0, S, sb, BK, false);
                    finish_scores(p, sb, bq, bk, b, h, t0, s0, dcap);
                    for (int64_t i = 0; i < bq; i++) { /* P = exp(s - lse) */
                        float *row = sb + i * BK;
                        if (L[i] == -INFINITY)
                            memset(row, 0, sizeof(float) * (size_t)bk);
                        else
                            exp_sub_sum(row, bk, L[i]);
                    }
                    /* dV += P^T dO */
                    transpose(sb, bq, bk, BK, tr, BQ);
                    cpu_gemm_f32(bk, D, bq, tr, BQ, dO, D, dV + s0 * D, D,
                                 true);
                    /* dP = dO V^T;  dS = P (dP - Di) scale, times the
                     * softcap's 1 - tanh^2 */
                    cpu_gemm_f32(bq, bk, D, dO, D, Vt + s0, S, dp, BK, false);
                    for (int64_t i = 0; i < bq; i++)
                        for (int64_t j = 0; j < bk; j++)
                            dp[i * BK + j] = sb[i * BK + j] *
                                             (dp[i * BK + j] - di[i]) *
                                             p->scale;
                    if (dcap)
                        for (int64_t i = 0; i < bq; i++)
                            for (int64_t j = 0; j < bk; j++)
                                dp[i * BK + j] *= dcap[i * BK + j];
                    /* dQ += dS K;  dK += dS^T Q */
                    cpu_gemm_f32(bq, D, bk, dp, BK, Kh + s0 * D, D, dQ, D,
                                 true);
                    transpose(dp, bq, bk, BK, tr, BQ);
                    cpu_gemm_f32(bk, D, bq, tr, BQ, Q, D, dK + s0 * D, D, true);
                }
            }
    }
    cpu_tmp_free(sb), cpu_tmp_free(dp), cpu_tmp_free(tr), cpu_tmp_free(dcap);
}

void cpu_attention_bwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, const float *out, const float *lse,
                       const float *dout, float *dq, float *dk, float *dv) {
    int64_t B = p->B, H = p->H, KV = p->KV, T = p->T, S = p->S, D = p->D;
    memset(dq, 0, sizeof(float) * (size_t)(B * H * T * D));
    memset(dk, 0, sizeof(float) * (size_t)(B * KV * S * D));
    memset(dv, 0, sizeof(float) * (size_t)(B * KV * S * D));
    float *kt = transpose_heads(p, k), *vt = transpose_heads(p, v);
    /* one work item per (b, kv head): it owns dK, dV of that head and dQ of
     * the query heads in its group, so no two threads write one element */
    attention_bwd_items_args job = {p,  q,  k,  out, lse, dout,
                                    dq, dk, dv, kt,  vt};
    if (kt && vt)
        ts_parallel_for(B * KV, 1, attention_bwd_items, &job);
    cpu_tmp_free(kt), cpu_tmp_free(vt);
}

/* ---- kernels: convert operands to contiguous f32, run, store ---- */

static void mask_strides(const ts_tensor *m, int64_t *st) {
    int64_t cst[TS_MAX_DIMS];
    ts_contiguous_strides(m->ndim, m->shape, cst);
    for (int i = 0; i < 4; i++) {
        int im = m->ndim - 4 + i;
        st[i] = im >= 0 && m->shape[im] != 1 ? cst[im] : 0;
    }
}

static void attn_shape(const ts_node *n, cpu_attn_shape *p, int mask_index) {
    const ts_tensor *q = n->in[mask_index == 3 ? 0 : 1];
    const ts_tensor *k = n->in[mask_index == 3 ? 1 : 2];
    p->B = q->shape[0], p->H = q->shape[1], p->T = q->shape[2],
    p->D = q->shape[3];
    p->KV = k->shape[1], p->S = k->shape[2];
    p->causal = n->attrs.i[0] != 0;
    p->scale = (float)n->attrs.f[0];
    p->window = n->attrs.i[2];
    p->softcap = (float)n->attrs.f[1];
    p->mask = NULL;
    if (n->attrs.i[1])
        mask_strides(n->in[mask_index], p->mask_st);
}

/* ---- paged attention ----
 * First the new tokens' K/V rows go into their blocks, converted to the
 * pools' type (f32; bf16 rounded to nearest even; int8 rows with their
 * absmax / 127 scale). Then tiles attend: a tile is one sequence, one KV
 * head, some of its G query heads and a run of its new tokens (its rows:
 * heads x tokens), taken against the sequence's positions in chunks of
 * PG_CH positions aligned to position 0, with an online softmax (running
 * max and sum) per row. A tile reads each K/V row it needs once, widened
 * to f32 in registers, or into an f32 scratch chunk when it has rows
 * enough to share it; so a prefill chunk over a long cached prefix reads
 * the cache once per ~PG_ROWS rows, not once per row.
 * Bitwise rule: a row's arithmetic depends on the row alone (its query,
 * position and window, the rows it sees), never on the other rows of its
 * tile or step: every score is the same dot product (PG_VL lanes over D in
 * order, a fixed lane sum, the tail in order) whatever the block shape;
 * the chunks are aligned to absolute positions; the exponentials are
 * elementwise and a chunk's sum has one structure over its PG_CH slots
 * (the slots a row does not see hold 0); V rows are added in position
 * order over the row's own visible range. So decoding one token alone or
 * among many, and a prompt in one chunk or several, give the same bits. */

typedef enum { PG_F32, PG_BF16, PG_I8 } pg_type;

#define PG_CH     64 /* positions per chunk */
#define PG_ROWS   64 /* rows per tile (about: whole GQA groups) */
#define PG_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
#define PG_VL 16 /* lanes */
#define PG_NK 4  /* keys per dot block */
typedef __m512 pg_vec;
PG_INLINE pg_vec pg_zero(void) {
    return _mm512_setzero_ps();
}
PG_INLINE pg_vec pg_load(const float *p) {
    return _mm512_loadu_ps(p);
}
PG_INLINE void pg_store(float *p, pg_vec v) {
    _mm512_storeu_ps(p, v);
}
PG_INLINE pg_vec pg_set1(float x) {
    return _mm512_set1_ps(x);
}
PG_INLINE pg_vec pg_fma(pg_vec a, pg_vec b, pg_vec c) {
    return _mm512_fmadd_ps(a, b, c);
}
PG_INLINE pg_vec pg_add(pg_vec a, pg_vec b) {
    return _mm512_add_ps(a, b);
}
PG_INLINE pg_vec pg_vmax(pg_vec a, pg_vec b) {
    return _mm512_max_ps(a, b);
}
PG_INLINE pg_vec pg_load_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
PG_INLINE pg_vec pg_load_i8(const int8_t *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
/* the lane sum: halves added down to one lane, always this tree */
PG_INLINE float pg_hsum(pg_vec v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi =
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 t8 = _mm256_add_ps(lo, hi);
    __m128 t4 =
        _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}
#elif defined(__AVX2__)
#define PG_VL 8
#define PG_NK 2
typedef __m256 pg_vec;
PG_INLINE pg_vec pg_zero(void) {
    return _mm256_setzero_ps();
}
PG_INLINE pg_vec pg_load(const float *p) {
    return _mm256_loadu_ps(p);
}
PG_INLINE void pg_store(float *p, pg_vec v) {
    _mm256_storeu_ps(p, v);
}
PG_INLINE pg_vec pg_set1(float x) {
    return _mm256_set1_ps(x);
}
PG_INLINE pg_vec pg_fma(pg_vec a, pg_vec b, pg_vec c) {
    return _mm256_fmadd_ps(a, b, c);
}
PG_INLINE pg_vec pg_add(pg_vec a, pg_vec b) {
    return _mm256_add_ps(a, b);
}
PG_INLINE pg_vec pg_vmax(pg_vec a, pg_vec b) {
    return _mm256_max_ps(a, b);
}
PG_INLINE pg_vec pg_load_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
PG_INLINE pg_vec pg_load_i8(const int8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
PG_INLINE float pg_hsum(pg_vec v) {
    __m128 t4 =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}
#else
/* baseline x86-64: one float a "vector" (no FMA: a x b + c rounds twice,
 * the same everywhere) */
#define PG_VL 1
#define PG_NK 4
typedef float pg_vec;
PG_INLINE pg_vec pg_zero(void) {
    return 0.0f;
}
PG_INLINE pg_vec pg_load(const float *p) {
    return *p;
}
PG_INLINE void pg_store(float *p, pg_vec v) {
    *p = v;
}
PG_INLINE pg_vec pg_set1(float x) {
    return x;
}
PG_INLINE pg_vec pg_fma(pg_vec a, pg_vec b, pg_vec c) {
    return a * b + c;
}
PG_INLINE pg_vec pg_add(pg_vec a, pg_vec b) {
    return a + b;
}
PG_INLINE pg_vec pg_load_bf16(const uint16_t *p) {
    uint32_t u = (uint32_t)*p << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
PG_INLINE pg_vec pg_load_i8(const int8_t *p) {
    return (float)*p;
}
PG_INLINE float pg_hsum(pg_vec v) {
    return v;
}
#endif

#if defined(__AVX512F__)
/* sums[r][s] = pg_hsum(a[r][s]) for a 4 x 4 block at once, by the same
 * tree per element (halves of 256, 128, 64 bits, then the last pair),
 * transposing as it goes: 45 instructions instead of 16 sums of 8 */
PG_INLINE void pg_hsum16(pg_vec a[4][PG_NK], float sums[4][PG_NK]) {
    const pg_vec *A = &a[0][0]; /* A[4 r + s] */
    __m512 x[8], y[4], w[2];
    for (int k = 0; k < 8; k++) /* [t8(A2k) | t8(A2k+1)] */
        x[k] =
            _mm512_add_ps(_mm512_shuffle_f32x4(A[2 * k], A[2 * k + 1], 0x44),
                          _mm512_shuffle_f32x4(A[2 * k], A[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++) /* lane j: t4(A4k+j) */
        y[k] =
            _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x88),
                          _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++) /* lane j: t2(A8k+j), t2(A8k+4+j) */
        w[k] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * k], y[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(y[2 * k], y[2 * k + 1], 0xEE));
    /* lane 4 j + m: t1(A4m+j), i.e. element (r m, s j) */
    __m512 u = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88),
                             _mm512_shuffle_ps(w[0], w[1], 0xDD));
    float t[16];
    _mm512_storeu_ps(t, u);
    for (int s = 0; s < 4; s++)
        for (int r = 0; r < 4; r++)
            sums[r][s] = t[4 * s + r];
}
#endif

/* a x b + c for the tails past the last whole vector */
PG_INLINE float pg_fmas(float a, float b, float c) {
#ifdef __FMA__
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* PG_VL values of a row of type t from element d, as f32 */
PG_INLINE pg_vec pg_load_t(pg_type t, const void *row, int64_t d) {
    switch (t) {
    case PG_BF16:
        return pg_load_bf16((const uint16_t *)row + d);
    case PG_I8:
        return pg_load_i8((const int8_t *)row + d);
    default:
        return pg_load((const float *)row + d);
    }
}

PG_INLINE float pg_elem_t(pg_type t, const void *row, int64_t d) {
    switch (t) {
    case PG_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)row)[d] << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    case PG_I8:
        return (float)((const int8_t *)row)[d];
    default:
        return ((const float *)row)[d];
    }
}

/* out[r * ldo + s] = q[r] . k[s] for r < nr, s < nk, k rows of type t.
 * Each element alike whatever nr and nk: PG_VL lane sums over d in order,
 * pg_hsum, then the tail in order. */
PG_INLINE void pg_dots(pg_type t, int nr, int nk, const float *const *q,
                       const void *const *k, int64_t D, float *out,
                       int64_t ldo) {
    pg_vec acc[4][PG_NK];
    for (int r = 0; r < nr; r++)
        for (int s = 0; s < nk; s++)
            acc[r][s] = pg_zero();
    int64_t d = 0;
    for (; d + PG_VL <= D; d += PG_VL) {
        pg_vec kv[PG_NK];
        for (int s = 0; s < nk; s++)
            kv[s] = pg_load_t(t, k[s], d);
        for (int r = 0; r < nr; r++) {
            pg_vec qv = pg_load(q[r] + d);
            for (int s = 0; s < nk; s++)
                acc[r][s] = pg_fma(qv, kv[s], acc[r][s]);
        }
    }
    float sums[4][PG_NK];
#if defined(__AVX512F__)
    if (nr == 4 && nk == 4)
        pg_hsum16(acc, sums);
    else
#endif
        for (int r = 0; r < nr; r++)
            for (int s = 0; s < nk; s++)
                sums[r][s] = pg_hsum(acc[r][s]);
    for (int r = 0; r < nr; r++)
        for (int s = 0; s < nk; s++) {
            float x = sums[r][s];
            for (int64_t e = d; e < D; e++)
                x = pg_fmas(q[r][e], pg_elem_t(t, k[s], e), x);
            out[r * ldo + s] = x;
        }
}

/* scores of nr (1..4) query rows against nk key rows, in blocks of PG_NK
 * keys and single keys after them */
PG_INLINE void pg_dot_rows(pg_type t, int nr, int64_t nk, const float *const *q,
                           const void *const *k, int64_t D, float *out,
                           int64_t ldo) {
    int64_t s = 0;
#define PG_ROWS_CASE(R)                                                        \
    case R:                                                                    \
        for (; s + PG_NK <= nk; s += PG_NK)                                    \
            pg_dots(t, R, PG_NK, q, k + s, D, out + s, ldo);                   \
        for (; s < nk; s++)                                                    \
            pg_dots(t, R, 1, q, k + s, D, out + s, ldo);                       \
        break;
    switch (nr) {
        PG_ROWS_CASE(1)
        PG_ROWS_CASE(2)
        PG_ROWS_CASE(3)
        PG_ROWS_CASE(4)
    }
#undef PG_ROWS_CASE
}

static void pg_dot_rows_f32(int nr, int64_t nk, const float *const *q,
                            const void *const *k, int64_t D, float *out,
                            int64_t ldo) {
    pg_dot_rows(PG_F32, nr, nk, q, k, D, out, ldo);
}
static void pg_dot_rows_bf16(int nr, int64_t nk, const float *const *q,
                             const void *const *k, int64_t D, float *out,
                             int64_t ldo) {
    pg_dot_rows(PG_BF16, nr, nk, q, k, D, out, ldo);
}
static void pg_dot_rows_i8(int nr, int64_t nk, const float *const *q,
                           const void *const *k, int64_t D, float *out,
                           int64_t ldo) {
    pg_dot_rows(PG_I8, nr, nk, q, k, D, out, ldo);
}

/* o[0..D) += sum over s < n of w[s] v[s] (rows of type t): each element
 * summed over s in order, whatever the blocking over d */
PG_INLINE void pg_pv(pg_type t, float *o, const float *w, const void *const *v,
                     int64_t n, int64_t D) {
    int64_t d = 0;
    for (; d + 8 * PG_VL <= D; d += 8 * PG_VL) {
        pg_vec a[8];
        for (int i = 0; i < 8; i++)
            a[i] = pg_load(o + d + i * PG_VL);
        for (int64_t s = 0; s < n; s++) {
            pg_vec ws = pg_set1(w[s]);
            for (int i = 0; i < 8; i++)
                a[i] = pg_fma(ws, pg_load_t(t, v[s], d + i * PG_VL), a[i]);
        }
        for (int i = 0; i < 8; i++)
            pg_store(o + d + i * PG_VL, a[i]);
    }
    for (; d + PG_VL <= D; d += PG_VL) {
        pg_vec a = pg_load(o + d);
        for (int64_t s = 0; s < n; s++)
            a = pg_fma(pg_set1(w[s]), pg_load_t(t, v[s], d), a);
        pg_store(o + d, a);
    }
    for (; d < D; d++) {
        float x = o[d];
        for (int64_t s = 0; s < n; s++)
            x = pg_fmas(w[s], pg_elem_t(t, v[s], d), x);
        o[d] = x;
    }
}

/* accumulators a block of pg_pvn may hold in registers */
#if defined(__AVX512F__)
#define PG_ACC 16
#else
#define PG_ACC 8
#endif

/* pg_pv for nr (1..4) rows over the same keys o[r] += sum w[r][s] v[s],
 * nv vectors of d a pass (nr x nv accumulators), each V vector loaded once
 * for all rows; every element as pg_pv computes it (the rest of d by
 * pg_pv itself) */
PG_INLINE void pg_pvn(pg_type t, int nr, int nv, float *const *o,
                      const float *const *w, const void *const *v, int64_t n,
                      int64_t D) {
    int64_t d = 0;
    for (; d + nv * PG_VL <= D; d += nv * PG_VL) {
        pg_vec a[4][8];
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < nv; i++)
                a[r][i] = pg_load(o[r] + d + i * PG_VL);
        for (int64_t s = 0; s < n; s++) {
            pg_vec vv[8];
            for (int i = 0; i < nv; i++)
                vv[i] = pg_load_t(t, v[s], d + i * PG_VL);
            for (int r = 0; r < nr; r++) {
                pg_vec ws = pg_set1(w[r][s]);
                for (int i = 0; i < nv; i++)
                    a[r][i] = pg_fma(ws, vv[i], a[r][i]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < nv; i++)
                pg_store(o[r] + d + i * PG_VL, a[r][i]);
    }
    if (d < D) {
        const void *vs[PG_CH];
        int64_t eb = t == PG_BF16 ? 2 : t == PG_I8 ? 1 : 4;
        for (int64_t s = 0; s < n; s++)
            vs[s] = (const char *)v[s] + d * eb;
        for (int r = 0; r < nr; r++)
            pg_pv(t, o[r] + d, w[r], vs, n, D - d);
    }
}

/* the weighted V rows into nr (1..4) rows over the same keys */
PG_INLINE void pg_pv_rows(pg_type t, int nr, float *const *o,
                          const float *const *w, const void *const *v,
                          int64_t n, int64_t D) {
    switch (nr) {
    case 1:
        pg_pv(t, o[0], w[0], v, n, D);
        break;
    case 2:
        pg_pvn(t, 2, PG_ACC / 2 < 8 ? PG_ACC / 2 : 8, o, w, v, n, D);
        break;
    case 3:
        pg_pvn(t, 3, PG_ACC / 4, o, w, v, n, D);
        break;
    default:
        pg_pvn(t, 4, PG_ACC / 4, o, w, v, n, D);
        break;
    }
}

static void pg_pv_f32(int nr, float *const *o, const float *const *w,
                      const void *const *v, int64_t n, int64_t D) {
    pg_pv_rows(PG_F32, nr, o, w, v, n, D);
}
static void pg_pv_bf16(int nr, float *const *o, const float *const *w,
                       const void *const *v, int64_t n, int64_t D) {
    pg_pv_rows(PG_BF16, nr, o, w, v, n, D);
}
static void pg_pv_i8(int nr, float *const *o, const float *const *w,
                     const void *const *v, int64_t n, int64_t D) {
    pg_pv_rows(PG_I8, nr, o, w, v, n, D);
}

/* x[j] = e^(x[j] - m) for j < n, elementwise (the tail through a padded
 * vector, so every element is computed alike) */
static void pg_exp_shift(float *x, int64_t n, float m) {
#ifdef __AVX2__
    __m256 mv = _mm256_set1_ps(m);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(x + j,
                         cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    if (j < n) {
        float buf[8] = {0};
        memcpy(buf, x + j, sizeof(float) * (size_t)(n - j));
        _mm256_storeu_ps(buf,
                         cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(buf), mv)));
        memcpy(x + j, buf, sizeof(float) * (size_t)(n - j));
    }
#else
    for (int64_t j = 0; j < n; j++)
        x[j] = x[j] - m < -87.3f ? 0.0f : expf(x[j] - m);
#endif
}

/* max of x[0..n) (-inf for n 0) */
static float pg_row_max(const float *x, int64_t n) {
    float mx = -INFINITY;
    int64_t j = 0;
#if PG_VL > 1
    if (n >= PG_VL) {
        pg_vec v = pg_load(x);
        for (j = PG_VL; j + PG_VL <= n; j += PG_VL)
            v = pg_vmax(v, pg_load(x + j));
        float lanes[PG_VL];
        pg_store(lanes, v);
        for (int i = 0; i < PG_VL; i++)
            mx = lanes[i] > mx ? lanes[i] : mx;
    }
#endif
    for (; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* the sum of a chunk's PG_CH slots, one structure for every row */
static float pg_chunk_sum(const float *x) {
    pg_vec acc = pg_load(x);
    for (int i = PG_VL; i < PG_CH; i += PG_VL)
        acc = pg_add(acc, pg_load(x + i));
    return pg_hsum(acc);
}

/* bf16 of x, rounded to nearest even (ts_f32_to_bf16's rule, inline) */
static inline uint16_t pg_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: kept, quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* one row of D values into the pool's row at dst (rb bytes) */
static void pg_store_row(pg_type t, char *dst, int64_t rb, const float *x,
                         int64_t D) {
    if (t == PG_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)D);
        return;
    }
    if (t == PG_BF16) {
        uint16_t *o = (uint16_t *)(void *)dst;
        for (int64_t d = 0; d < D; d++)
            o[d] = pg_bf16(x[d]);
        return;
    }
    /* int8: q = x / scale rounded to nearest, scale = max |x| / 127 */
    float amax = 0;
    bool finite = true;
    for (int64_t d = 0; d < D; d++) {
        float a = fabsf(x[d]);
        finite = finite && a <= FLT_MAX;
        amax = a > amax ? a : amax;
    }
    float scale = finite ? amax / 127.0f : NAN;
    int8_t *o = (int8_t *)dst;
    memset(dst, 0, (size_t)rb);
    for (int64_t d = 0; finite && amax > 0 && d < D; d++) {
        float r = nearbyintf(x[d] / scale);
        o[d] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
    memcpy(dst + rb - 4, &scale, 4);
}

/* row (bytes) of type t widened to D floats (int8: the values, unscaled) */
static void pg_widen(pg_type t, const char *row, float *dst, int64_t D) {
    int64_t d = 0;
    if (t == PG_BF16)
        for (; d + PG_VL <= D; d += PG_VL)
            pg_store(dst + d,
                     pg_load_bf16((const uint16_t *)(const void *)row + d));
    else if (t == PG_I8)
        for (; d + PG_VL <= D; d += PG_VL)
            pg_store(dst + d, pg_load_i8((const int8_t *)row + d));
    for (; d < D; d++)
        dst[d] = pg_elem_t(t, row, d);
}

/* rows (heads h0 .. h0 + nh of KV head kvh's group) x (tokens j0 .. j0 +
 * nj) of sequence seq */
typedef struct {
    int32_t seq, kvh, h0, nh, j0, nj;
    int64_t cost;
} pg_tile;

typedef struct {
    const float *q, *k, *v; /* (1, H, N, D), (1, KV, N, D) */
    float *out;             /* (1, H, N, D) */
    char *K, *V;            /* the pools' bytes */
    pg_type t;
    int64_t rb; /* bytes per pool row */
    const int32_t *start, *clen, *table, *seq_of;
    float scale, softcap;
    int64_t window, N, H, KV, BS, MB, D, G;
    const pg_tile *tiles;
    int failed; /* out of memory in a tile */
} pg_job;

/* the pool row of sequence i's position s, KV head kvh */
static inline char *pg_row(const pg_job *J, char *P, int64_t i, int64_t s,
                           int64_t kvh) {
    int64_t blk = J->table[i * J->MB + s / J->BS];
    return P + ((blk * J->KV + kvh) * J->BS + s % J->BS) * J->rb;
}

/* the new tokens [j0, j1): their K/V rows into the pools */
static void pg_store_items(void *arg, int64_t j0, int64_t j1) {
    const pg_job *J = arg;
    for (int64_t j = j0; j < j1; j++) {
        int64_t i = J->seq_of[j], pos = J->clen[i] + (j - J->start[i]);
        for (int64_t h = 0; h < J->KV; h++) {
            pg_store_row(J->t, pg_row(J, J->K, i, pos, h), J->rb,
                         J->k + (h * J->N + j) * J->D, J->D);
            pg_store_row(J->t, pg_row(J, J->V, i, pos, h), J->rb,
                         J->v + (h * J->N + j) * J->D, J->D);
        }
    }
}

static inline int64_t pg_min(int64_t a, int64_t b) {
    return a < b ? a : b;
}
static inline int64_t pg_max(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static inline float pg_scale_of(const char *row, int64_t rb) {
    float s;
    memcpy(&s, row + rb - 4, 4);
    return s;
}

/* one tile: its rows' online softmax over the chunks, then out */
static void pg_tile_run(void *arg, int64_t c) {
    pg_job *J = arg;
    const pg_tile *T = &J->tiles[c];
    const int64_t D = J->D, R = (int64_t)T->nh * T->nj, i = T->seq;
    /* widened once into scratch when enough rows share a chunk */
    bool scratch = J->t != PG_F32 && R >= 4;
    pg_type et = scratch ? PG_F32 : J->t;
    void (*dots)(int, int64_t, const float *const *, const void *const *,
                 int64_t, float *, int64_t) = et == PG_BF16 ? pg_dot_rows_bf16
                                              : et == PG_I8 ? pg_dot_rows_i8
                                                            : pg_dot_rows_f32;
    void (*pv)(int, float *const *, const float *const *, const void *const *,
               int64_t, int64_t) = et == PG_BF16 ? pg_pv_bf16
                                   : et == PG_I8 ? pg_pv_i8
                                                 : pg_pv_f32;
    size_t nf = (size_t)(R * PG_CH + R * D + 2 * R + 2 * PG_CH +
                         (scratch ? 2 * PG_CH * D : 0));
    size_t bytes = sizeof(float) * nf + sizeof(int64_t) * 2 * (size_t)R +
                   sizeof(void *) * ((size_t)R + 2 * PG_CH) + (size_t)R + 64;
    char *mem = cpu_tmp_alloc(bytes);
    if (!mem) {
        __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const float **qp = (const float **)(void *)mem;
    const void **kp = (const void **)(qp + R), **vp = kp + PG_CH;
    int64_t *pos = (int64_t *)(void *)(vp + PG_CH), *lo = pos + R;
    float *sc = (float *)(void *)(lo + R), *o = sc + R * PG_CH, *m = o + R * D,
          *l = m + R, *ks = l + R, *vs = ks + PG_CH, *kf = vs + PG_CH,
          *vf = kf + PG_CH * D;
    bool *live = (bool *)(void *)(kf + (scratch ? 2 * PG_CH * D : 0));
    /* rows by token, then head: positions (and windows) never decrease */
    for (int64_t r = 0; r < R; r++) {
        int64_t j = T->j0 + r / T->nh, h = T->kvh * J->G + T->h0 + r % T->nh;
        qp[r] = J->q + (h * J->N + j) * D;
        pos[r] = J->clen[i] + (j - J->start[i]);
        lo[r] = J->window > 0 ? pg_max(pos[r] - J->window + 1, 0) : 0;
        m[r] = -INFINITY, l[r] = 0;
    }
    memset(o, 0, sizeof(float) * (size_t)(R * D));
    int64_t t_lo = lo[0], t_hi = pos[R - 1] + 1;
    for (int64_t c0 = t_lo / PG_CH * PG_CH; c0 < t_hi; c0 += PG_CH) {
        int64_t a = pg_max(c0, t_lo), b = pg_min(c0 + PG_CH, t_hi);
        /* the rows that see something in [a, b): a contiguous run */
        int64_t ra = 0, rb = R;
        while (ra < R && pos[ra] < a)
            ra++;
        while (rb > ra && lo[rb - 1] >= b)
            rb--;
        if (ra >= rb)
            continue;
        int64_t ka = pg_max(a, lo[ra]), kb = pg_min(b, pos[rb - 1] + 1);
        for (int64_t s = ka; s < kb; s++) {
            char *kr = pg_row(J, J->K, i, s, T->kvh),
                 *vr = pg_row(J, J->V, i, s, T->kvh);
            if (J->t == PG_I8)
                ks[s - c0] = pg_scale_of(kr, J->rb),
                       vs[s - c0] = pg_scale_of(vr, J->rb);
            if (scratch) {
                pg_widen(J->t, kr, kf + (s - c0) * D, D);
                pg_widen(J->t, vr, vf + (s - c0) * D, D);
                kp[s - c0] = kf + (s - c0) * D;
                vp[s - c0] = vf + (s - c0) * D;
            } else
                kp[s - c0] = kr, vp[s - c0] = vr;
        }
        /* scores, four rows at a time over the keys any of them sees */
        for (int64_t g0 = ra; g0 < rb; g0 += 4) {
            int64_t g1 = pg_min(g0 + 4, rb);
            int64_t s0 = pg_max(ka, lo[g0]), s1 = pg_min(kb, pos[g1 - 1] + 1);
            if (s1 > s0)
                dots((int)(g1 - g0), s1 - s0, qp + g0, kp + (s0 - c0), D,
                     sc + g0 * PG_CH + (s0 - c0), PG_CH);
        }
        for (int64_t r = ra; r < rb; r++) {
            int64_t va = pg_max(a, lo[r]) - c0, vb = pg_min(b, pos[r] + 1) - c0;
            float *x = sc + r * PG_CH;
            if (J->t == PG_I8) /* the K row's scale first */
                for (int64_t s = va; s < vb; s++)
                    x[s] = x[s] * ks[s] * J->scale;
            else
                for (int64_t s = va; s < vb; s++)
                    x[s] *= J->scale;
            if (J->softcap > 0)
                softcap_row(x + va, vb - va, J->softcap, NULL);
            float mx = pg_row_max(x + va, vb - va);
            float mn = mx > m[r] ? mx : m[r];
            live[r] = mn != -INFINITY;
            if (!live[r])
                continue;
            float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            pg_exp_shift(x + va, vb - va, mn);
            memset(x, 0, sizeof(float) * (size_t)va);
            memset(x + vb, 0, sizeof(float) * (size_t)(PG_CH - vb));
            l[r] = l[r] * corr + pg_chunk_sum(x);
            m[r] = mn;
            float *orow = o + r * D;
            if (corr != 1.0f)
                for (int64_t d = 0; d < D; d++)
                    orow[d] *= corr;
            if (J->t == PG_I8) /* p x the V row's scale */
                for (int64_t s = va; s < vb; s++)
                    x[s] *= vs[s];
        }
        /* the weighted V rows: up to four rows that see the same keys (the
         * heads of a token; every row where the chunk is whole) at a time */
        for (int64_t r = ra; r < rb;) {
            if (!live[r]) {
                r++;
                continue;
            }
            int64_t va = pg_max(a, lo[r]) - c0, vb = pg_min(b, pos[r] + 1) - c0;
            float *orows[4];
            const float *wrows[4];
            int nr = 0;
            for (; nr < 4 && r + nr < rb && live[r + nr] &&
                   pg_max(a, lo[r + nr]) - c0 == va &&
                   pg_min(b, pos[r + nr] + 1) - c0 == vb;
                 nr++) {
                orows[nr] = o + (r + nr) * D;
                wrows[nr] = sc + (r + nr) * PG_CH + va;
            }
            pv(nr, orows, wrows, vp + va, vb - va, D);
            r += nr;
        }
    }
    for (int64_t r = 0; r < R; r++) {
        int64_t j = T->j0 + r / T->nh, h = T->kvh * J->G + T->h0 + r % T->nh;
        float *O = J->out + (h * J->N + j) * D,
              inv = l[r] > 0 ? 1.0f / l[r] : 0;
        for (int64_t d = 0; d < D; d++)
            O[d] = o[r * D + d] * inv;
    }
    cpu_tmp_free(mem);
}

static int pg_tile_cmp(const void *x, const void *y) {
    const pg_tile *a = x, *b = y;
    if (a->cost != b->cost)
        return a->cost > b->cost ? -1 : 1; /* the longest first */
    return a->seq != b->seq   ? a->seq - b->seq
           : a->kvh != b->kvh ? a->kvh - b->kvh
           : a->j0 != b->j0   ? a->j0 - b->j0
                              : a->h0 - b->h0;
}

/* the tiles of the step: per sequence and KV head, its tokens in runs of
 * about PG_ROWS / G (whole groups); the groups split by head too when
 * that leaves fewer tiles than twice the threads (decoding few sequences).
 * The tiling never changes a row's bits, only who computes it. *n gets
 * the count; NULL when out of memory. */
static pg_tile *pg_tiles(const pg_job *J, int64_t S, int64_t *n) {
    int64_t G = J->G, per = PG_ROWS / G > 1 ? PG_ROWS / G : 1, base = 0;
    for (int64_t i = 0; i < S; i++) {
        int64_t ni = J->start[i + 1] - J->start[i];
        base += (ni + per - 1) / per * J->KV;
    }
    int64_t want = 2 * (int64_t)ts_threads_count(), split = 1;
    if (base > 0 && base < want && G > 1)
        split = pg_min(G, (want + base - 1) / base);
    int64_t nh = (G + split - 1) / split;
    split = (G + nh - 1) / nh;
    pg_tile *t = cpu_tmp_alloc(sizeof(pg_tile) * (size_t)(base * split + 1));
    if (!t)
        return NULL;
    int64_t k = 0;
    for (int64_t i = 0; i < S; i++) {
        int64_t ni = J->start[i + 1] - J->start[i];
        if (ni <= 0)
            continue;
        int64_t runs = (ni + per - 1) / per;
        for (int64_t u = 0; u < runs; u++) {
            int64_t j0 = ni * u / runs, j1 = ni * (u + 1) / runs;
            int64_t p0 = J->clen[i] + j0, p1 = J->clen[i] + j1;
            int64_t lo0 = J->window > 0 ? pg_max(p0 - J->window + 1, 0) : 0;
            for (int64_t kvh = 0; kvh < J->KV; kvh++)
                for (int64_t h0 = 0; h0 < G; h0 += nh)
                    t[k++] = (pg_tile){.seq = (int32_t)i,
                                       .kvh = (int32_t)kvh,
                                       .h0 = (int32_t)h0,
                                       .nh = (int32_t)pg_min(nh, G - h0),
                                       .j0 = (int32_t)(J->start[i] + j0),
                                       .nj = (int32_t)(j1 - j0),
                                       .cost = (j1 - j0) * (p1 - lo0)};
        }
    }
    qsort(t, (size_t)k, sizeof *t, pg_tile_cmp);
    *n = k;
    return t;
}

/* Paged attention (see ts_paged_attention_ex and ts_kv_dtype): the new
 * tokens' keys and values go into their sequences' blocks, converted to
 * the pools' type (f32, bf16, or i32 words of int8 rows), then each new
 * token attends to the positions of its sequence up to its own (the last
 * `window` of them when attrs.i[0] > 0), reading K/V rows through the
 * block table; attrs f[0] scale, f[1] softcap. */
CPU_KERNEL(paged_attention) {
    ts_tensor *qt = n->in[0], *kp = n->in[3], *vp = n->in[4];
    int64_t H = qt->shape[1], N = qt->shape[2], D = qt->shape[3];
    int64_t KV = n->in[1]->shape[1], BS = kp->shape[2];
    if (N == 0 || H == 0 || D == 0)
        return TS_OK;
    const int32_t *m = (const int32_t *)ts_tensor_ptr(n->in[5]);
    int64_t S = m[0], MB = m[1];
    pg_type t = kp->dtype == TS_BF16  ? PG_BF16
                : kp->dtype == TS_I32 ? PG_I8
                                      : PG_F32;
    int64_t rb = kp->shape[3] * (int64_t)ts_dtype_size(kp->dtype);
    float *tq = NULL, *tk = NULL, *tv = NULL;
    const float *q = cpu_as_f32(qt, &tq), *k = cpu_as_f32(n->in[1], &tk),
                *v = cpu_as_f32(n->in[2], &tv);
    int32_t *seq_of = cpu_tmp_alloc(sizeof(int32_t) * (size_t)(N + 1));
    pg_job J = {.q = q,
                .k = k,
                .v = v,
                .out = (float *)ts_tensor_ptr(n->out),
                .K = (char *)ts_tensor_ptr(kp),
                .V = (char *)ts_tensor_ptr(vp),
                .t = t,
                .rb = rb,
                .start = m + 2,
                .clen = m + 2 + S + 1,
                .table = m + 2 + 2 * S + 1,
                .seq_of = seq_of,
                .scale = (float)n->attrs.f[0],
                .softcap = (float)n->attrs.f[1],
                .window = n->attrs.i[0],
                .N = N,
                .H = H,
                .KV = KV,
                .BS = BS,
                .MB = MB,
                .D = D,
                .G = H / KV};
    pg_tile *tiles = NULL;
    int64_t n_tiles = 0;
    if (q && k && v && seq_of) {
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = J.start[i]; j < J.start[i + 1]; j++)
                seq_of[j] = (int32_t)i;
        ts_parallel_for(N, cpu_grain(KV * D, 4096), pg_store_items, &J);
        tiles = pg_tiles(&J, S, &n_tiles);
    }
    if (tiles) {
        J.tiles = tiles;
        ts_parallel_chunks(n_tiles, pg_tile_run, &J);
    }
    cpu_tmp_free(tq), cpu_tmp_free(tk), cpu_tmp_free(tv);
    cpu_tmp_free(seq_of), cpu_tmp_free(tiles);
    if (!tiles || J.failed)
        return ts_set_error(ctx, TS_ERR_OOM, "paged_attention: out of memory");
    return TS_OK;
}

/* K or V (B, KV, S, D) f32 whose S x D rows are contiguous per head */
static bool rows_in_place(const ts_tensor *t) {
    return t->dtype == TS_F32 && t->strides[3] == 1 &&
           (t->shape[2] == 1 || t->strides[2] == t->shape[3]);
}

#define DECODE_MAX_T 4 /* query rows up to which decoding's kernel runs */

CPU_KERNEL(attention) {
    cpu_attn_shape p;
    attn_shape(n, &p, 3);
    ts_tensor *qt = n->in[0], *kt = n->in[1], *vt = n->in[2];
    if (p.T <= DECODE_MAX_T && !n->attrs.i[1] && qt->dtype == TS_F32 &&
        ts_tensor_is_contiguous(qt) && n->out->dtype == TS_F32 &&
        rows_in_place(kt) && rows_in_place(vt)) {
        cpu_attention_decode(&p, (const float *)ts_tensor_ptr(qt),
                             (const float *)ts_tensor_ptr(kt), kt->strides[0],
                             kt->strides[1], (const float *)ts_tensor_ptr(vt),
                             vt->strides[0], vt->strides[1],
                             (float *)ts_tensor_ptr(n->out),
                             (float *)ts_tensor_ptr(n->saved[0]));
        return TS_OK;
    }
    float *tq = NULL, *tk = NULL, *tv = NULL, *tm = NULL, *to = NULL;
    const float *q = cpu_as_f32(n->in[0], &tq), *k = cpu_as_f32(n->in[1], &tk);
    const float *v = cpu_as_f32(n->in[2], &tv);
    if (n->attrs.i[1])
        p.mask = cpu_as_f32(n->in[3], &tm);
    ts_tensor *y = n->out;
    float *o =
        y->dtype == TS_F32
            ? (float *)ts_tensor_ptr(y)
            : (to = malloc(sizeof(float) * (size_t)(ts_tensor_numel(y) + 1)));
    ts_status st = TS_OK;
    if (!q || !k || !v || (n->attrs.i[1] && !p.mask) || !o)
        st = ts_set_error(ctx, TS_ERR_OOM, "attention: out of memory");
    else {
        cpu_attention_fwd(&p, q, k, v, o, (float *)ts_tensor_ptr(n->saved[0]));
        if (to)
            cpu_store_out(y, to);
    }
    cpu_tmp_free(tq), cpu_tmp_free(tk), cpu_tmp_free(tv), cpu_tmp_free(tm),
        cpu_tmp_free(to);
    return st;
}

/* inputs g, q, k, v, out, lse, [mask] -> packed [dq | dk | dv] */
CPU_KERNEL(attention_backward) {
    cpu_attn_shape p;
    attn_shape(n, &p, 6);
    float *tg = NULL, *tq = NULL, *tk = NULL, *tv = NULL, *to = NULL,
          *tm = NULL;
    const float *g = cpu_as_f32(n->in[0], &tg), *q = cpu_as_f32(n->in[1], &tq);
    const float *k = cpu_as_f32(n->in[2], &tk), *v = cpu_as_f32(n->in[3], &tv);
    const float *o = cpu_as_f32(n->in[4], &to);
    const float *lse = (const float *)ts_tensor_ptr(n->in[5]);
    if (n->attrs.i[1])
        p.mask = cpu_as_f32(n->in[6], &tm);
    ts_tensor *y = n->out;
    int64_t total = ts_tensor_numel(y);
    float *res = y->dtype == TS_F32
                     ? (float *)ts_tensor_ptr(y)
                     : malloc(sizeof(float) * (size_t)(total + 1));
    ts_status st = TS_OK;
    if (!g || !q || !k || !v || !o || (n->attrs.i[1] && !p.mask) || !res)
        st = ts_set_error(ctx, TS_ERR_OOM, "attention_backward: out of memory");
    else {
        int64_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.KV * p.S * p.D;
        cpu_attention_bwd(&p, q, k, v, o, lse, g, res, res + nq, res + nq + nk);
        if (res != (float *)ts_tensor_ptr(y))
            cpu_store_out(y, res);
    }
    if (res && res != (float *)ts_tensor_ptr(y))
        cpu_tmp_free(res);
    cpu_tmp_free(tg), cpu_tmp_free(tq), cpu_tmp_free(tk), cpu_tmp_free(tv),
        cpu_tmp_free(to), cpu_tmp_free(tm);
    return st;
}

/* The slow reference of the backward: one query row at a time, in f64. */
void cpu_attention_bwd_reference(const cpu_attn_shape *p, const float *q,
                                 const float *k, const float *v,
                                 const float *dout, float *dq, float *dk,
                                 float *dv) {
    int64_t H = p->H, T = p->T, S = p->S, D = p->D, G = p->H / p->KV;
    memset(dq, 0, sizeof(float) * (size_t)(p->B * H * T * D));
    memset(dk, 0, sizeof(float) * (size_t)(p->B * p->KV * S * D));
    memset(dv, 0, sizeof(float) * (size_t)(p->B * p->KV * S * D));
    double *pr = malloc(sizeof(double) * (size_t)(3 * S + 1));
    if (!pr)
        return;
    double *dpr = pr + S, *dcap = pr + 2 * S;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t kv = b * p->KV + h / G;
                const float *qr = q + ((b * H + h) * T + t) * D;
                const float *dor = dout + ((b * H + h) * T + t) * D;
                const float *K = k + kv * S * D, *V = v + kv * S * D;
                double mx = -INFINITY, sum = 0, dot = 0;
                for (int64_t s = 0; s < S; s++) {
                    double d =
                        ref_score(p, qr, K + s * D, b, h, t, s, &dcap[s]);
                    pr[s] = d;
                    mx = d > mx ? d : mx;
                }
                if (mx == -INFINITY)
                    continue;
                for (int64_t s = 0; s < S; s++)
                    sum += pr[s] = exp(pr[s] - mx);
                for (int64_t s = 0; s < S; s++) {
                    pr[s] /= sum;
                    double d = 0;
                    for (int64_t i = 0; i < D; i++)
                        d += (double)dor[i] * V[s * D + i];
                    dpr[s] = d;
                    dot += pr[s] * d;
                }
                float *dqr = dq + ((b * H + h) * T + t) * D;
                for (int64_t s = 0; s < S; s++) {
                    double ds = pr[s] * (dpr[s] - dot) * p->scale * dcap[s];
                    for (int64_t i = 0; i < D; i++) {
                        dv[kv * S * D + s * D + i] += (float)(pr[s] * dor[i]);
                        dqr[i] += (float)(ds * K[s * D + i]);
                        dk[kv * S * D + s * D + i] += (float)(ds * qr[i]);
                    }
                }
            }
    free(pr);
}
