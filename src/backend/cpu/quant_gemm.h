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
 * them; parallel over N. At AVX2 and up this is the path for every R (on
 * this project's machine it beat dequantize + OpenBLAS at every R from 16
 * to 512: bench/bench_quant.c), so row r of Y is the same bits whatever R:
 * a prefill and a decode step agree. At SSE2 the scalar dots take R up to
 * CPU_WQ_SCALAR_MAX_ROWS, more rows the f32 path (cpu_gemm_wq_f32). false
 * when out of memory (Y unspecified). */
#define CPU_WQ_SCALAR_MAX_ROWS 2
bool cpu_gemm_wq(cpu_isa isa, int64_t R, int64_t N, int64_t K, const float *A,
                 int64_t lda, const void *W, int64_t w_row_bytes, ts_dtype wdt,
                 float *Y);

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
