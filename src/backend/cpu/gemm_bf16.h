/* gemm_bf16.h — dense products with bf16 operands and f32 sums on
 * AVX512_BF16 (vdpbf16ps): C (M, N) (+)= A (M, K) @ B (K, N), A and B f32
 * or bf16 with any element strides (a linear layer's (N, K) weight seen as
 * W^T: b_rs = 1, b_cs = K; the transposed operands of a backward pass), f32
 * operands rounded to bf16 (nearest even, as ts_f32_to_bf16) while they
 * are packed. A weight that many products share can be packed once
 * (cpu_bf16_pack_b) and passed packed. Also the slow reference. */
#ifndef TS_CPU_GEMM_BF16_H
#define TS_CPU_GEMM_BF16_H

#include "core/cpu_isa.h"
#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* C (M, N) row-major, rows ldc apart: C = A @ B, or C += A @ B when acc.
 * Element (m, k) of A at A + m * a_rs + k * a_cs (elements of adt), (k, n)
 * of B at B + k * b_rs + n * b_cs; adt and bdt are TS_F32 or TS_BF16.
 * Each C element is one f32 chain over K in order, c = (acc ? C : 0) then
 * c = vdpbf16ps(c, a pair, b pair): its bits depend on row m of A, column
 * n of B and its old value only, never on M, the other rows, the tiles,
 * the threads or B being pre-packed (decode's rows alone or batched and a
 * prefill chunk agree). Up to 64 rows (decode) stream B once, shared out
 * among the threads; more rows are blocked for cache. Products run on the
 * pool. Returns false and leaves
 * C as it was when isa < CPU_ISA_AVX512_BF16, a dtype is neither f32 nor
 * bf16, or packing buffers cannot be allocated; true otherwise (M, N or K
 * 0 included). */
bool cpu_gemm_bf16(cpu_isa isa, int64_t M, int64_t N, int64_t K, const void *A,
                   ts_dtype adt, int64_t a_rs, int64_t a_cs, const void *B,
                   ts_dtype bdt, int64_t b_rs, int64_t b_cs, float *C,
                   int64_t ldc, bool acc);

/* The same product one element at a time: operands rounded to bf16,
 * products summed in double, C = (float)(acc ? C + sum : sum). false (C
 * untouched) when a dtype is neither f32 nor bf16. */
bool cpu_gemm_bf16_reference(int64_t M, int64_t N, int64_t K, const void *A,
                             ts_dtype adt, int64_t a_rs, int64_t a_cs,
                             const void *B, ts_dtype bdt, int64_t b_rs,
                             int64_t b_cs, float *C, int64_t ldc, bool acc);

/* B (K, N) packed once into the kernel's layout (bf16 pairs of K, panels
 * of columns; about 2 K N bytes), for products that share it: a model's
 * weights at load time. _new allocates (NULL when isa is below
 * CPU_ISA_AVX512_BF16, a dtype is unsupported or out of memory); _free
 * takes NULL. */
typedef struct cpu_bf16_packed cpu_bf16_packed;
cpu_bf16_packed *cpu_bf16_pack_b(cpu_isa isa, int64_t K, int64_t N,
                                 const void *B, ts_dtype bdt, int64_t b_rs,
                                 int64_t b_cs);
void cpu_bf16_packed_free(cpu_bf16_packed *p);
int64_t cpu_bf16_packed_k(const cpu_bf16_packed *p);
int64_t cpu_bf16_packed_n(const cpu_bf16_packed *p);
/* the memory p holds (0 for NULL) */
size_t cpu_bf16_packed_bytes(const cpu_bf16_packed *p);
/* p was packed from this B (the same address, dtype, shape and strides) */
bool cpu_bf16_packed_matches(const cpu_bf16_packed *p, int64_t K, int64_t N,
                             const void *B, ts_dtype bdt, int64_t b_rs,
                             int64_t b_cs);
/* cpu_gemm_bf16 with B packed: the same bits as the unpacked call. */
bool cpu_gemm_bf16_packed(cpu_isa isa, int64_t M, const void *A, ts_dtype adt,
                          int64_t a_rs, int64_t a_cs, const cpu_bf16_packed *B,
                          float *C, int64_t ldc, bool acc);

/* cpu_gemm_bf16 (B, or pb when it is not NULL: then B is not read and
 * pb's K and N must be K and N) through the cache-blocked path whatever M
 * (cpu_gemm_bf16 takes it above 64 rows only): the same bits, for tests
 * and benchmarks. */
bool cpu_gemm_bf16_blocked(cpu_isa isa, int64_t M, int64_t N, int64_t K,
                           const void *A, ts_dtype adt, int64_t a_rs,
                           int64_t a_cs, const void *B, ts_dtype bdt,
                           int64_t b_rs, int64_t b_cs,
                           const cpu_bf16_packed *pb, float *C, int64_t ldc,
                           bool acc);

#endif
