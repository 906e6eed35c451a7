/* attention.c — fused scaled-dot-product attention on the CPU, in the
 * manner of FlashAttention-2: queries in blocks of BQ rows, keys in blocks
 * of BK, an online softmax (running max and sum per row), so no T x S score
 * matrix is ever stored. Grouped-query heads read their shared K/V head.
 * Options (ts_attn_opts): a sliding window, whose key blocks wholly outside
 * it are skipped like the causal future, and a tanh softcap on the scores.
 * The backward recomputes the probabilities from the saved log-sum-exp.
 * Also the paged serving kernel, and the slow reference kernels the tests
 * hold the fast ones against. */
#include "backend/cpu/cpu.h"

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

/* where row s of sequence i lives, for head kvh */
#define ROW_AT(P, i, s, kvh)                                                   \
    ((P) + ((table[(i)*MB + (s) / BS] * KV + (kvh)) * BS + (s) % BS) * D)
typedef struct {
    const float *q;
    float *K;
    float *V;
    float *out;
    const int32_t *seq_of;
    const int32_t *start;
    const int32_t *clen;
    const int32_t *table;
    float scale, softcap;
    int64_t window;
    int64_t N;
    int64_t H;
    int64_t KV;
    int64_t BS;
    int64_t MB;
    int64_t D;
    int64_t G;
} paged_items_args;

static void paged_items(void *p_, int64_t lo_, int64_t hi_) {
    const paged_items_args *a_ = p_;
    const float *q = a_->q;
    float *K = a_->K;
    float *V = a_->V;
    float *out = a_->out;
    const int32_t *seq_of = a_->seq_of;
    const int32_t *start = a_->start;
    const int32_t *clen = a_->clen;
    const int32_t *table = a_->table;
    float scale = a_->scale, softcap = a_->softcap;
    int64_t window = a_->window;
    int64_t N = a_->N;
    int64_t H = a_->H;
    int64_t KV = a_->KV;
    int64_t BS = a_->BS;
    int64_t MB = a_->MB;
    int64_t D = a_->D;
    int64_t G = a_->G;
    int64_t cap = 0;
    float *sc = NULL;
    for (int64_t item = lo_; item < hi_; item++) {
        int64_t j = item / H, h = item % H, i = seq_of[j], kvh = h / G;
        /* causal, within the window: positions [lo, lo + nvis) */
        int64_t pos = clen[i] + (j - start[i]);
        int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        int64_t nvis = pos + 1 - lo;
        if (nvis > cap) {
            free(sc);
            cap = nvis + 256;
            sc = malloc(sizeof(float) * (size_t)cap);
        }
        const float *Q = q + (h * N + j) * D;
        float *O = out + (h * N + j) * D;
        memset(O, 0, sizeof(float) * (size_t)D);
        if (!sc)
            continue;
        float mx = -INFINITY;
        int64_t s = 0;
        for (; s + 4 <= nvis; s += 4) {
            const float *rows[4] = {
                ROW_AT(K, i, lo + s, kvh), ROW_AT(K, i, lo + s + 1, kvh),
                ROW_AT(K, i, lo + s + 2, kvh), ROW_AT(K, i, lo + s + 3, kvh)};
            dot8x4(Q, rows, D, sc + s);
        }
        for (; s < nvis; s++)
            sc[s] = dot8(Q, ROW_AT(K, i, lo + s, kvh), D);
        for (s = 0; s < nvis; s++)
            sc[s] *= scale;
        if (softcap > 0)
            softcap_row(sc, nvis, softcap, NULL);
        for (s = 0; s < nvis; s++)
            mx = sc[s] > mx ? sc[s] : mx;
        float inv = 1.0f / exp_sub_sum(sc, nvis, mx);
        for (int64_t s = 0; s < nvis; s++) {
            const float *Vr = ROW_AT(V, i, lo + s, kvh);
            axpy(O, sc[s] * inv, Vr, D);
        }
    }
    free(sc);
}

/* Paged attention (see ts_paged_attention_ex): the new tokens' keys and
 * values go into their sequences' blocks, then each new token attends to
 * the positions of its sequence up to its own (the last `window` of them
 * when attrs.i[0] > 0), reading K/V rows through the block table; attrs
 * f[0] scale, f[1] softcap. */
CPU_KERNEL(paged_attention) {
    (void)ctx;
    ts_tensor *qt = n->in[0], *kp = n->in[3], *vp = n->in[4];
    int64_t H = qt->shape[1], N = qt->shape[2], D = qt->shape[3];
    int64_t KV = n->in[1]->shape[1], BS = kp->shape[2], G = H / KV;
    const int32_t *m = (const int32_t *)ts_tensor_ptr(n->in[5]);
    int64_t S = m[0], MB = m[1];
    const int32_t *start = m + 2, *clen = start + S + 1, *table = clen + S;
    float *tq = NULL, *tk = NULL, *tv = NULL;
    const float *q = cpu_as_f32(qt, &tq), *k = cpu_as_f32(n->in[1], &tk),
                *v = cpu_as_f32(n->in[2], &tv);
    float *K = (float *)ts_tensor_ptr(kp), *V = (float *)ts_tensor_ptr(vp);
    float *out = (float *)ts_tensor_ptr(n->out);
    float scale = (float)n->attrs.f[0], softcap = (float)n->attrs.f[1];
    int32_t *seq_of = cpu_tmp_alloc(sizeof(int32_t) * (size_t)(N + 1));
    if (!q || !k || !v || !seq_of) {
        cpu_tmp_free(tq), cpu_tmp_free(tk), cpu_tmp_free(tv);
        cpu_tmp_free(seq_of);
        return ts_set_error(ctx, TS_ERR_OOM, "paged_attention: out of memory");
    }
    for (int64_t i = 0; i < S; i++)
        for (int64_t j = start[i]; j < start[i + 1]; j++) {
            seq_of[j] = (int32_t)i;
            int64_t pos = clen[i] + (j - start[i]);
            for (int64_t h = 0; h < KV; h++) {
                memcpy(ROW_AT(K, i, pos, h), k + (h * N + j) * D,
                       sizeof(float) * (size_t)D);
                memcpy(ROW_AT(V, i, pos, h), v + (h * N + j) * D,
                       sizeof(float) * (size_t)D);
            }
        }
    paged_items_args job = {q,
                            K,
                            V,
                            out,
                            seq_of,
                            start,
                            clen,
                            table,
                            scale,
                            softcap,
                            n->attrs.i[0],
                            N,
                            H,
                            KV,
                            BS,
                            MB,
                            D,
                            G};
    ts_parallel_for(N * H, 4, paged_items, &job);
#undef ROW_AT
    cpu_tmp_free(tq), cpu_tmp_free(tk), cpu_tmp_free(tv);
    cpu_tmp_free(seq_of);
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
