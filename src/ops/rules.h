/* rules.h — the shape rules (shape_rules.c), backward rules (grad_rules.c)
 * and internal op builders (api.c) that op_table.c assembles into rows. */
#ifndef TS_RULES_H
#define TS_RULES_H

#include "ops/ops.h"

#define TS_INFER(name)                                                         \
    ts_status ts_infer_##name(ts_ctx *ctx, const ts_node *n, ts_desc *o,       \
                              ts_desc *s, int *ns)
TS_INFER(reshape);
TS_INFER(permute);
TS_INFER(slice);
TS_INFER(expand);
TS_INFER(binary);
TS_INFER(unary);
TS_INFER(where);
TS_INFER(masked_fill);
TS_INFER(cast);
TS_INFER(reduce);
TS_INFER(matmul);
TS_INFER(embedding);
TS_INFER(embedding_bwd);
TS_INFER(index_add);
TS_INFER(concat);
TS_INFER(slice_scatter);
TS_INFER(rmsnorm);
TS_INFER(layernorm);
TS_INFER(norm_bwd);
TS_INFER(rope);
TS_INFER(attention);
TS_INFER(attention_bwd);
TS_INFER(paged_attention);
TS_INFER(cross_entropy);
TS_INFER(ce_bwd);
TS_INFER(topk);
TS_INFER(gather);
TS_INFER(gather_bwd);
TS_INFER(one_hot);
TS_INFER(moe_experts);
TS_INFER(moe_experts_bwd);
TS_INFER(copy_into);
TS_INFER(adamw);
TS_INFER(checkpoint);
TS_INFER(conv2d);
TS_INFER(conv2d_bwd);
TS_INFER(group_norm);
TS_INFER(pool2d);
TS_INFER(pool2d_bwd);

#define TS_GRAD(name)                                                          \
    ts_status ts_grad_##name(ts_ctx *ctx, const ts_node *n, ts_tensor *g,      \
                             const bool *want, ts_tensor **gin)
TS_GRAD(reshape);
TS_GRAD(permute);
TS_GRAD(slice);
TS_GRAD(expand);
TS_GRAD(add);
TS_GRAD(sub);
TS_GRAD(mul);
TS_GRAD(div);
TS_GRAD(add_scalar);
TS_GRAD(checkpoint);
TS_GRAD(mul_scalar);
TS_GRAD(neg);
TS_GRAD(unary);
TS_GRAD(where);
TS_GRAD(masked_fill);
TS_GRAD(cast);
TS_GRAD(copy);
TS_GRAD(sum);
TS_GRAD(mean);
TS_GRAD(amax);
TS_GRAD(softmax);
TS_GRAD(log_softmax);
TS_GRAD(matmul);
TS_GRAD(embedding);
ts_status ts_accum_embedding(ts_ctx *ctx, const ts_node *n, ts_tensor *g, int i,
                             ts_tensor *acc);
TS_GRAD(concat);
TS_GRAD(rmsnorm);
TS_GRAD(layernorm);
TS_GRAD(rope);
TS_GRAD(attention);
TS_GRAD(cross_entropy);
TS_GRAD(gather);
TS_GRAD(moe_experts);
TS_GRAD(conv2d);
TS_GRAD(group_norm);
TS_GRAD(upsample_nearest);
TS_GRAD(avg_pool2d);

ts_status ts_check_copy_shapes(ts_ctx *ctx, const ts_tensor *dst,
                               const ts_tensor *src);
bool ts_view_strides(const ts_tensor *x, int nd, const int64_t *shape,
                     int64_t *strides);

/* Internal ops used by backward rules (not in the public header). */
ts_tensor *ts_eq(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_unary_backward(ts_tensor *g, ts_tensor *x, ts_tensor *out,
                             ts_op_id fwd, const ts_attrs *fwd_attrs);
ts_tensor *ts_embedding_backward(ts_tensor *g, ts_tensor *ids, int64_t V);
/* dst rows at ids += src rows, in place (TS_OP_INDEX_ADD) */
ts_status ts_index_add_(ts_tensor *dst, ts_tensor *ids, ts_tensor *src);
ts_tensor *ts_slice_scatter(ts_tensor *g, const ts_attrs *slice_attrs, int ndim,
                            const int64_t *shape);
ts_tensor *ts_rope_dir(ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                       double direction);
ts_tensor *ts_op_n(ts_op_id op, int n, ts_tensor **in, const ts_attrs *a);
/* zeros of (ndim, shape) with g scatter-added at index along dim (the
 * gradient of ts_gather) */
ts_tensor *ts_gather_backward(ts_tensor *g, ts_tensor *index, int dim, int ndim,
                              const int64_t *shape);

#endif
