/* cpu_isa_names.h — included by cpu.h when a kernel file compiles for one
 * ISA level (CPU_ISA_SUFFIX set, e.g. _avx2): each name the kernel files
 * export gets the level's suffix, so the levels link side by side. A new
 * exported kernel name goes here too (else the link reports it defined
 * once per level). */
#ifndef TS_CPU_ISA_NAMES_H
#define TS_CPU_ISA_NAMES_H

#define CPU_ISA_CAT2(a, b) a##b
#define CPU_ISA_CAT(a, b)  CPU_ISA_CAT2(a, b)
#define CPU_ISA_NAME(name) CPU_ISA_CAT(name, CPU_ISA_SUFFIX)

#define cpu_adamw                   CPU_ISA_NAME(cpu_adamw)
#define cpu_argmax                  CPU_ISA_NAME(cpu_argmax)
#define cpu_attention               CPU_ISA_NAME(cpu_attention)
#define cpu_attention_backward      CPU_ISA_NAME(cpu_attention_backward)
#define cpu_attention_bwd           CPU_ISA_NAME(cpu_attention_bwd)
#define cpu_attention_bwd_reference CPU_ISA_NAME(cpu_attention_bwd_reference)
#define cpu_attention_decode        CPU_ISA_NAME(cpu_attention_decode)
#define cpu_attention_fwd           CPU_ISA_NAME(cpu_attention_fwd)
#define cpu_attention_reference     CPU_ISA_NAME(cpu_attention_reference)
#define cpu_binary                  CPU_ISA_NAME(cpu_binary)
#define cpu_concat                  CPU_ISA_NAME(cpu_concat)
#define cpu_copy                    CPU_ISA_NAME(cpu_copy)
#define cpu_copy_into               CPU_ISA_NAME(cpu_copy_into)
#define cpu_cross_entropy           CPU_ISA_NAME(cpu_cross_entropy)
#define cpu_cross_entropy_backward  CPU_ISA_NAME(cpu_cross_entropy_backward)
#define cpu_embedding               CPU_ISA_NAME(cpu_embedding)
#define cpu_embedding_backward      CPU_ISA_NAME(cpu_embedding_backward)
#define cpu_eval_scalar             CPU_ISA_NAME(cpu_eval_scalar)
#define cpu_fusable                 CPU_ISA_NAME(cpu_fusable)
#define cpu_gather                  CPU_ISA_NAME(cpu_gather)
#define cpu_gather_backward         CPU_ISA_NAME(cpu_gather_backward)
#define cpu_gemm_f32                CPU_ISA_NAME(cpu_gemm_f32)
#define cpu_gemm_f32_reference      CPU_ISA_NAME(cpu_gemm_f32_reference)
#define cpu_gemm_f32_w16t           CPU_ISA_NAME(cpu_gemm_f32_w16t)
#define cpu_index_add               CPU_ISA_NAME(cpu_index_add)
#define cpu_layernorm               CPU_ISA_NAME(cpu_layernorm)
#define cpu_layernorm_backward      CPU_ISA_NAME(cpu_layernorm_backward)
#define cpu_masked_fill             CPU_ISA_NAME(cpu_masked_fill)
#define cpu_matmul                  CPU_ISA_NAME(cpu_matmul)
#define cpu_matmul_epilogue         CPU_ISA_NAME(cpu_matmul_epilogue)
#define cpu_moe_experts             CPU_ISA_NAME(cpu_moe_experts)
#define cpu_moe_experts_backward    CPU_ISA_NAME(cpu_moe_experts_backward)
#define cpu_one_hot                 CPU_ISA_NAME(cpu_one_hot)
#define cpu_paged_attention         CPU_ISA_NAME(cpu_paged_attention)
#define cpu_reduce                  CPU_ISA_NAME(cpu_reduce)
#define cpu_rmsnorm                 CPU_ISA_NAME(cpu_rmsnorm)
#define cpu_rmsnorm_backward        CPU_ISA_NAME(cpu_rmsnorm_backward)
#define cpu_rope                    CPU_ISA_NAME(cpu_rope)
#define cpu_run_fused               CPU_ISA_NAME(cpu_run_fused)
#define cpu_slice_scatter           CPU_ISA_NAME(cpu_slice_scatter)
#define cpu_softmax                 CPU_ISA_NAME(cpu_softmax)
#define cpu_topk                    CPU_ISA_NAME(cpu_topk)
#define cpu_unary                   CPU_ISA_NAME(cpu_unary)
#define cpu_unary_backward          CPU_ISA_NAME(cpu_unary_backward)
#define cpu_where                   CPU_ISA_NAME(cpu_where)
#define cpu_widen_rows              CPU_ISA_NAME(cpu_widen_rows)
#define cpu_kernel_table            CPU_ISA_NAME(cpu_kernel_table)

#endif
