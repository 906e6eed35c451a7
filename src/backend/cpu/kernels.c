/* kernels.c — compiled once per ISA level (cpu.h says how): this level's
 * kernel set, a kernel per op and the functions cpu_backend.c dispatches
 * to. */
#include "backend/cpu/cpu.h"

#if defined(__AVX512BF16__)
#define LEVEL CPU_ISA_AVX512_BF16
#elif defined(__AVX512F__)
#define LEVEL CPU_ISA_AVX512
#elif defined(__AVX2__)
#define LEVEL CPU_ISA_AVX2
#else
#define LEVEL CPU_ISA_SSE2
#endif

const cpu_kernel_set cpu_kernel_table = {
    .isa = LEVEL,
    .kernels =
        {
        [TS_OP_ADD] = cpu_binary,
        [TS_OP_SUB] = cpu_binary,
        [TS_OP_MUL] = cpu_binary,
        [TS_OP_DIV] = cpu_binary,
        [TS_OP_EQ] = cpu_binary,
        [TS_OP_ADD_SCALAR] = cpu_unary,
        [TS_OP_MUL_SCALAR] = cpu_unary,
        [TS_OP_NEG] = cpu_unary,
        [TS_OP_EXP] = cpu_unary,
        [TS_OP_LOG] = cpu_unary,
        [TS_OP_SQRT] = cpu_unary,
        [TS_OP_RSQRT] = cpu_unary,
        [TS_OP_ABS] = cpu_unary,
        [TS_OP_POW_SCALAR] = cpu_unary,
        [TS_OP_TANH] = cpu_unary,
        [TS_OP_SIGMOID] = cpu_unary,
        [TS_OP_RELU] = cpu_unary,
        [TS_OP_SILU] = cpu_unary,
        [TS_OP_GELU] = cpu_unary,
        [TS_OP_UNARY_BACKWARD] = cpu_unary_backward,
        [TS_OP_WHERE] = cpu_where,
        [TS_OP_MASKED_FILL] = cpu_masked_fill,
        [TS_OP_CAST] = cpu_copy,
        [TS_OP_COPY] = cpu_copy,
        [TS_OP_SUM] = cpu_reduce,
        [TS_OP_MEAN] = cpu_reduce,
        [TS_OP_AMAX] = cpu_reduce,
        [TS_OP_ARGMAX] = cpu_argmax,
        [TS_OP_SOFTMAX] = cpu_softmax,
        [TS_OP_LOG_SOFTMAX] = cpu_softmax,
        [TS_OP_MATMUL] = cpu_matmul,
        [TS_OP_EMBEDDING] = cpu_embedding,
        [TS_OP_EMBEDDING_BACKWARD] = cpu_embedding_backward,
        [TS_OP_CONCAT] = cpu_concat,
        [TS_OP_SLICE_SCATTER] = cpu_slice_scatter,
        [TS_OP_RMSNORM] = cpu_rmsnorm,
        [TS_OP_RMSNORM_BACKWARD] = cpu_rmsnorm_backward,
        [TS_OP_LAYERNORM] = cpu_layernorm,
        [TS_OP_LAYERNORM_BACKWARD] = cpu_layernorm_backward,
        [TS_OP_ROPE] = cpu_rope,
        [TS_OP_ATTENTION] = cpu_attention,
        [TS_OP_ATTENTION_BACKWARD] = cpu_attention_backward,
        [TS_OP_PAGED_ATTENTION] = cpu_paged_attention,
        [TS_OP_CROSS_ENTROPY] = cpu_cross_entropy,
        [TS_OP_CROSS_ENTROPY_BACKWARD] = cpu_cross_entropy_backward,
        [TS_OP_TOPK] = cpu_topk,
        [TS_OP_GATHER] = cpu_gather,
        [TS_OP_GATHER_BACKWARD] = cpu_gather_backward,
        [TS_OP_ONE_HOT] = cpu_one_hot,
        [TS_OP_MOE_EXPERTS] = cpu_moe_experts,
        [TS_OP_MOE_EXPERTS_BACKWARD] = cpu_moe_experts_backward,
        [TS_OP_COPY_INTO] = cpu_copy_into,
        [TS_OP_ADAMW] = cpu_adamw,
        [TS_OP_INDEX_ADD] = cpu_index_add,
        },
    .fusable = cpu_fusable,
    .run_fused = cpu_run_fused,
    .eval_scalar = cpu_eval_scalar,
    .gemm_f32 = cpu_gemm_f32,
    .gemm_f32_w16t = cpu_gemm_f32_w16t,
    .attention_fwd = cpu_attention_fwd,
    .attention_decode = cpu_attention_decode,
    .attention_bwd = cpu_attention_bwd,
};
