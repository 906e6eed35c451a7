/* quant_gemm.h — products with weights in llama.cpp's block formats (q8_0,
 * q4_0, q4_K, q5_K, q6_K; src/core/quant.h) on the CPU, per ISA level:
 * the activations quantized to int8 (Q8_0 or Q8_K, as ggml does), integer
 * dot products against the weight blocks, f32 scales per block. Every entry
 * takes the level to run at (cpu_isa_active() in the runtime, each level
 * up to cpu_isa_detected() in tests) and never runs code above it. */
#ifndef TS_CPU_QUANT_GEMM_H
#define TS_CPU_QUANT_GEMM_H

#include "backend/cpu/isa.h"
#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of k activations quantized for weights of dtype wdt (Q8_0 blocks
 * beside q8_0/q4_0, Q8_K beside the k-quants); 0 when wdt is not a block
 * format or k is not whole blocks. */
size_t cpu_act_bytes(ts_dtype wdt, int64_t k);
/* out = x (k values) quantized for weights of dtype wdt, the bytes of
 * ts_quantize_act_ref at every level. */
void cpu_quantize_act(cpu_isa isa, ts_dtype wdt, const float *x, int64_t k,
                      void *out);

/* Y (R, N), rows N apart = A (R, K), rows lda apart, @ W^T with W (N, K)
 * in block format wdt, row n at W + n * w_row_bytes (K whole blocks).
 * Each activation row is quantized once; each weight row is read once per
 * 8 activation rows, its blocks unpacked once and dotted with all of
 * them; parallel over N. Where cpu_gemm_wq_uses_f32 says so, blocks of W
 * dequantized through OpenBLAS instead (f32 activations). Along the int8
 * path row r of Y is the same bits whatever R, so a prefill agrees with
 * decode steps. false when out of memory (Y unspecified). */
bool cpu_gemm_wq(cpu_isa isa, int64_t R, int64_t N, int64_t K, const float *A,
                 int64_t lda, const void *W, int64_t w_row_bytes, ts_dtype wdt,
                 float *Y);

/* The path cpu_gemm_wq takes, as measured on this project's machine by
 * bench/bench_quant.c: the int8 kernels, except at SSE2 past
 * CPU_WQ_SCALAR_MAX_ROWS rows (the scalar dots lose to OpenBLAS from 3
 * rows) and for the 32-value formats (q8_0, q4_0) past
 * CPU_WQ_BLOCK32_MAX_ROWS (dequantize + OpenBLAS about even at 64 rows,
 * 1.1 to 1.5x faster at 512). The k-quants' int8 kernels stay ahead to 512 rows
 * (1.2 to 3x at AVX-512, about even at AVX2). */
#define CPU_WQ_SCALAR_MAX_ROWS  2
#define CPU_WQ_BLOCK32_MAX_ROWS 64
/* q8_0/q4_0 prefill rows (past CPU_WQ_BLOCK32_MAX_ROWS) at the
 * AVX512_BF16 level: blocks of W dequantized, then the bf16 GEMM
 * (vdpbf16ps; activations and dequantized weights rounded to bf16, f32
 * sums; cpu_gemm_wq_bf16), faster there than the int8 kernels and
 * OpenBLAS (the k-quants' int8 kernels keep up). */
bool cpu_gemm_wq_uses_bf16(cpu_isa isa, ts_dtype wdt, int64_t R);
bool cpu_gemm_wq_bf16(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                      const float *A, int64_t lda, const void *W,
                      int64_t w_row_bytes, ts_dtype wdt, float *Y);
bool cpu_gemm_wq_uses_f32(cpu_isa isa, ts_dtype wdt, int64_t R);

/* The two paths cpu_gemm_wq chooses between, for tests and benchmarks:
 * the int8 kernels (any R; activation rows in tiles of 8) and dequantized
 * blocks of W through ts_sgemm. */
bool cpu_gemm_wq_int8(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                      const float *A, int64_t lda, const void *W,
                      int64_t w_row_bytes, ts_dtype wdt, float *Y);
bool cpu_gemm_wq_f32(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                     const float *A, int64_t lda, const void *W,
                     int64_t w_row_bytes, ts_dtype wdt, float *Y);

/* out (nrows, K) f32 = rows of W (block format wdt, w_row_bytes apart)
 * dequantized, bit for bit ts_dequantize_row's; parallel over rows. */
void cpu_dequant_rows(cpu_isa isa, ts_dtype wdt, const void *W,
                      int64_t w_row_bytes, int64_t nrows, int64_t K,
                      float *out);

#endif
