/* decoder_spec.c — the families' parameter names (one table per naming
 * scheme: Llama-style, Gemma's four norms, Mixtral's block_sparse_moe,
 * GPT-2's transformer.h) and, from a config, the parameters a decoder
 * holds: which roles are present, their shapes, init and names. Data
 * only; decoder.c and decoder_load.c read it. */
#include "decoder_spec.h"

#include <stdio.h>
#include <string.h>

/* A naming scheme: the layer prefix, each role's name (layer roles after
 * the prefix; experts with %lld for the expert and, for the stacked
 * parameter, the name without it), the state_dict order of the layer's
 * roles, and whether the residual projections start smaller (GPT-2). */
typedef struct {
    const char *prefix;
    const char *name[R_COUNT];
    const char *stacked[R_COUNT];
    dec_role order[R_LAYER_COUNT];
    int n_order;
    bool residual_init;
} name_scheme;

#define LLAMA_ATTN                                                             \
    [R_ATTN_NORM] = "input_layernorm.weight",                                  \
    [R_Q] = "self_attn.q_proj.weight", [R_Q_B] = "self_attn.q_proj.bias",      \
    [R_K] = "self_attn.k_proj.weight", [R_K_B] = "self_attn.k_proj.bias",      \
    [R_V] = "self_attn.v_proj.weight", [R_V_B] = "self_attn.v_proj.bias",      \
    [R_QKV] = "self_attn.qkv_proj.weight",                                     \
    [R_QKV_B] = "self_attn.qkv_proj.bias", [R_O] = "self_attn.o_proj.weight",  \
    [R_O_B] = "self_attn.o_proj.bias", [R_Q_NORM] = "self_attn.q_norm.weight", \
    [R_K_NORM] = "self_attn.k_norm.weight"
#define LLAMA_MODEL                                                            \
    [R_EMBED] = "model.embed_tokens.weight",                                   \
    [R_FINAL_NORM] = "model.norm.weight", [R_HEAD] = "lm_head.weight"
#define LLAMA_MLP                                                              \
    [R_GATE] = "mlp.gate_proj.weight", [R_GATE_B] = "mlp.gate_proj.bias",      \
    [R_UP] = "mlp.up_proj.weight", [R_UP_B] = "mlp.up_proj.bias",              \
    [R_GATE_UP] = "mlp.gate_up_proj.weight",                                   \
    [R_DOWN] = "mlp.down_proj.weight", [R_DOWN_B] = "mlp.down_proj.bias"

static const name_scheme llama = {
    .prefix = "model.layers.%lld.",
    .name = {LLAMA_ATTN, LLAMA_MODEL,
             LLAMA_MLP, [R_MLP_NORM] = "post_attention_layernorm.weight",
             [R_ROUTER] = "mlp.gate.weight",
             [R_EXP_GATE] = "mlp.experts.%lld.gate_proj.weight",
             [R_EXP_UP] = "mlp.experts.%lld.up_proj.weight",
             [R_EXP_DOWN] = "mlp.experts.%lld.down_proj.weight"},
    .stacked = {[R_EXP_GATE] = "mlp.experts.gate_proj",
                [R_EXP_UP] = "mlp.experts.up_proj",
                [R_EXP_DOWN] = "mlp.experts.down_proj"},
    .order = {R_Q,        R_Q_B,    R_K,      R_K_B,       R_V,
              R_V_B,      R_QKV,    R_QKV_B,  R_O,         R_O_B,
              R_Q_NORM,   R_K_NORM, R_ROUTER, R_EXP_GATE,  R_EXP_UP,
              R_EXP_DOWN, R_GATE,   R_GATE_B, R_UP,        R_UP_B,
              R_GATE_UP,  R_DOWN,   R_DOWN_B, R_ATTN_NORM, R_MLP_NORM},
    .n_order = 25};

static const name_scheme gemma = {
    .prefix = "model.layers.%lld.",
    .name = {LLAMA_ATTN, LLAMA_MODEL,
             LLAMA_MLP, [R_POST_ATTN_NORM] = "post_attention_layernorm.weight",
             [R_MLP_NORM] = "pre_feedforward_layernorm.weight",
             [R_POST_MLP_NORM] = "post_feedforward_layernorm.weight"},
    .order = {R_Q, R_Q_B, R_K, R_K_B, R_V, R_V_B, R_O, R_O_B, R_Q_NORM,
              R_K_NORM, R_GATE, R_UP, R_DOWN, R_ATTN_NORM, R_POST_ATTN_NORM,
              R_MLP_NORM, R_POST_MLP_NORM},
    .n_order = 17};

static const name_scheme mixtral = {
    .prefix = "model.layers.%lld.",
    .name = {LLAMA_ATTN,
             LLAMA_MODEL, [R_MLP_NORM] = "post_attention_layernorm.weight",
             [R_ROUTER] = "block_sparse_moe.gate.weight",
             [R_EXP_GATE] = "block_sparse_moe.experts.%lld.w1.weight",
             [R_EXP_UP] = "block_sparse_moe.experts.%lld.w3.weight",
             [R_EXP_DOWN] = "block_sparse_moe.experts.%lld.w2.weight"},
    .stacked = {[R_EXP_GATE] = "block_sparse_moe.experts.w1",
                [R_EXP_UP] = "block_sparse_moe.experts.w3",
                [R_EXP_DOWN] = "block_sparse_moe.experts.w2"},
    .order = {R_Q, R_K, R_V, R_O, R_ROUTER, R_EXP_GATE, R_EXP_DOWN, R_EXP_UP,
              R_ATTN_NORM, R_MLP_NORM},
    .n_order = 10};

static const name_scheme gpt2 = {
    .prefix = "transformer.h.%lld.",
    .name = {[R_ATTN_NORM] = "ln_1.weight",
             [R_ATTN_NORM_B] = "ln_1.bias",
             [R_QKV] = "attn.c_attn.weight",
             [R_QKV_B] = "attn.c_attn.bias",
             [R_O] = "attn.c_proj.weight",
             [R_O_B] = "attn.c_proj.bias",
             [R_MLP_NORM] = "ln_2.weight",
             [R_MLP_NORM_B] = "ln_2.bias",
             [R_UP] = "mlp.c_fc.weight",
             [R_UP_B] = "mlp.c_fc.bias",
             [R_DOWN] = "mlp.c_proj.weight",
             [R_DOWN_B] = "mlp.c_proj.bias",
             [R_EMBED] = "transformer.wte.weight",
             [R_POS] = "transformer.wpe.weight",
             [R_FINAL_NORM] = "transformer.ln_f.weight",
             [R_FINAL_NORM_B] = "transformer.ln_f.bias",
             [R_HEAD] = "lm_head.weight"},
    .order = {R_ATTN_NORM, R_ATTN_NORM_B, R_QKV, R_QKV_B, R_O, R_O_B,
              R_MLP_NORM, R_MLP_NORM_B, R_UP, R_UP_B, R_DOWN, R_DOWN_B},
    .n_order = 12,
    .residual_init = true};

static const name_scheme *scheme_of(const ts_model_config *c) {
    switch (c->arch) {
    case TS_ARCH_GPT2:
        return &gpt2;
    case TS_ARCH_GEMMA2:
    case TS_ARCH_GEMMA3:
        return &gemma;
    case TS_ARCH_MIXTRAL:
        return &mixtral;
    default:
        return &llama;
    }
}

/* whether layer (or the model, layer -1) of c has role r */
static bool has_role(const ts_model_config *c, int64_t layer, dec_role r) {
    bool ln = c->norm == TS_NORM_LAYER, moe = ts_model_layer_moe(c, layer);
    bool dense = !moe, gated = c->gated, fqkv = c->fused_qkv;
    switch (r) {
    case R_ATTN_NORM:
    case R_MLP_NORM:
    case R_O:
    case R_FINAL_NORM:
    case R_EMBED:
        return true;
    case R_ATTN_NORM_B:
    case R_MLP_NORM_B:
    case R_FINAL_NORM_B:
        return ln;
    case R_Q:
    case R_K:
    case R_V:
        return !fqkv;
    case R_Q_B:
    case R_K_B:
    case R_V_B:
        return !fqkv && c->attention_bias;
    case R_QKV:
        return fqkv;
    case R_QKV_B:
        return fqkv && c->attention_bias;
    case R_O_B:
        return c->o_bias;
    case R_Q_NORM:
    case R_K_NORM:
        return c->qk_norm;
    case R_POST_ATTN_NORM:
    case R_POST_MLP_NORM:
        return c->sandwich_norm;
    case R_ROUTER:
    case R_EXP_UP:
    case R_EXP_DOWN:
        return moe;
    case R_EXP_GATE:
        return moe && gated;
    case R_GATE:
        return dense && gated && !c->fused_gate_up;
    case R_UP:
        return dense && (!gated || !c->fused_gate_up);
    case R_GATE_UP:
        return dense && gated && c->fused_gate_up;
    case R_DOWN:
        return dense;
    case R_GATE_B:
        return dense && gated && !c->fused_gate_up && c->mlp_bias;
    case R_UP_B:
    case R_DOWN_B:
        return dense && c->mlp_bias && !(gated && c->fused_gate_up);
    case R_POS:
        return c->pos == TS_POS_LEARNED;
    case R_HEAD:
        return !c->tie_word_embeddings;
    default:
        return false;
    }
}

/* shape (HF's (out, in) for matrices), init and kind of role r */
static void role_shape(const ts_model_config *c, dec_role r, dec_param *p) {
    int64_t C = c->hidden, D = c->head_dim, F = c->intermediate;
    int64_t HD = c->heads * D, KVD = c->kv_heads * D, E = c->n_experts;
    int64_t Fm = c->moe_intermediate;
    int64_t s[3] = {0};
    int nd = 2;
    dec_init init = INIT_NORMAL;
    switch (r) {
    case R_Q:
        s[0] = HD, s[1] = C;
        break;
    case R_K:
    case R_V:
        s[0] = KVD, s[1] = C;
        break;
    case R_QKV:
        s[0] = HD + 2 * KVD, s[1] = C;
        break;
    case R_O:
        s[0] = C, s[1] = HD;
        init = scheme_of(c)->residual_init ? INIT_RESIDUAL : INIT_NORMAL;
        break;
    case R_GATE:
    case R_UP:
        s[0] = F, s[1] = C;
        break;
    case R_GATE_UP:
        s[0] = 2 * F, s[1] = C;
        break;
    case R_DOWN:
        s[0] = C, s[1] = F;
        init = scheme_of(c)->residual_init ? INIT_RESIDUAL : INIT_NORMAL;
        break;
    case R_ROUTER:
        s[0] = E, s[1] = C;
        break;
    case R_EXP_GATE:
    case R_EXP_UP:
        nd = 3, s[0] = E, s[1] = Fm, s[2] = C;
        break;
    case R_EXP_DOWN:
        nd = 3, s[0] = E, s[1] = C, s[2] = Fm;
        break;
    case R_EMBED:
    case R_HEAD:
        s[0] = c->vocab, s[1] = C;
        break;
    case R_POS:
        s[0] = c->max_positions, s[1] = C;
        break;
    case R_Q_B:
        nd = 1, s[0] = HD, init = INIT_ZEROS;
        break;
    case R_K_B:
    case R_V_B:
        nd = 1, s[0] = KVD, init = INIT_ZEROS;
        break;
    case R_QKV_B:
        nd = 1, s[0] = HD + 2 * KVD, init = INIT_ZEROS;
        break;
    case R_UP_B:
    case R_GATE_B:
        nd = 1, s[0] = F, init = INIT_ZEROS;
        break;
    case R_O_B:
    case R_DOWN_B:
    case R_ATTN_NORM_B:
    case R_MLP_NORM_B:
    case R_FINAL_NORM_B:
        nd = 1, s[0] = C, init = INIT_ZEROS;
        break;
    case R_Q_NORM:
    case R_K_NORM:
        nd = 1, s[0] = D;
        init = c->norm == TS_NORM_RMS_1P ? INIT_ZEROS : INIT_ONES;
        break;
    default: /* the (C) norms */
        nd = 1, s[0] = C;
        init = c->norm == TS_NORM_RMS_1P ? INIT_ZEROS : INIT_ONES;
        break;
    }
    bool conv = c->conv1d && nd == 2 &&
                (r == R_QKV || r == R_O || r == R_UP || r == R_DOWN ||
                 r == R_Q || r == R_K || r == R_V || r == R_GATE);
    if (conv) { /* Conv1D keeps (in, out) */
        int64_t t = s[0];
        s[0] = s[1], s[1] = t;
    }
    p->ndim = nd;
    memcpy(p->shape, s, sizeof s);
    p->matrix = nd >= 2;
    p->init = init;
    p->parts = nd == 3 ? E : 1;
}

static const char *const role_names[R_COUNT] = {
    [R_ATTN_NORM] = "the attention norm",
    [R_ATTN_NORM_B] = "the attention norm's bias",
    [R_Q] = "q_proj",
    [R_Q_B] = "the q_proj bias",
    [R_K] = "k_proj",
    [R_K_B] = "the k_proj bias",
    [R_V] = "v_proj",
    [R_V_B] = "the v_proj bias",
    [R_QKV] = "a fused qkv projection",
    [R_QKV_B] = "a fused qkv bias",
    [R_O] = "o_proj",
    [R_O_B] = "the o_proj bias",
    [R_Q_NORM] = "q_norm",
    [R_K_NORM] = "k_norm",
    [R_POST_ATTN_NORM] = "a post-attention norm",
    [R_MLP_NORM] = "the MLP norm",
    [R_MLP_NORM_B] = "the MLP norm's bias",
    [R_POST_MLP_NORM] = "a post-MLP norm",
    [R_ROUTER] = "an experts router",
    [R_EXP_GATE] = "experts' gate projections",
    [R_EXP_UP] = "experts' up projections",
    [R_EXP_DOWN] = "experts' down projections",
    [R_GATE] = "gate_proj",
    [R_GATE_B] = "the gate_proj bias",
    [R_UP] = "up_proj",
    [R_UP_B] = "an up-projection bias",
    [R_GATE_UP] = "a fused gate_up projection",
    [R_DOWN] = "down_proj",
    [R_DOWN_B] = "a down-projection bias",
    [R_EMBED] = "the token embedding",
    [R_POS] = "learned positions",
    [R_FINAL_NORM] = "the final norm",
    [R_FINAL_NORM_B] = "the final norm's bias",
    [R_HEAD] = "an untied LM head"};

ts_status dec_plan_check(ts_ctx *ctx, const ts_model_config *cfg,
                         const dec_param *plan, int n) {
    for (int i = 0; i < n; i++)
        if (strchr(plan[i].name, '?'))
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "%s: the config asks for %s (layer %lld), "
                                "which the family's parameter table does not "
                                "have",
                                ts_arch_name(cfg->arch),
                                dec_role_name(plan[i].role),
                                (long long)plan[i].layer);
    return TS_OK;
}

const char *dec_role_name(dec_role r) {
    return (unsigned)r < R_COUNT && role_names[r] ? role_names[r] : "?";
}

/* a role the config asks for that the scheme's order leaves out: listed
 * with a "?" name, which ts_decoder_new refuses by the role's name */
static bool in_order(const name_scheme *ns, dec_role r) {
    for (int k = 0; k < ns->n_order; k++)
        if (ns->order[k] == r)
            return true;
    return false;
}

static void add(const ts_model_config *c, const name_scheme *ns, dec_role r,
                int64_t layer, dec_param *out, int cap, int *n) {
    if (!has_role(c, layer, r))
        return;
    if (*n < cap) {
        dec_param *p = &out[*n];
        memset(p, 0, sizeof *p);
        p->role = r, p->layer = layer;
        role_shape(c, r, p);
        const char *nm = p->parts > 1 ? ns->stacked[r] : ns->name[r];
        if (layer < 0)
            snprintf(p->name, sizeof p->name, "%s", nm ? nm : "?");
        else {
            char pre[64];
            snprintf(pre, sizeof pre, ns->prefix, (long long)layer);
            snprintf(p->name, sizeof p->name, "%s%s", pre, nm ? nm : "?");
        }
    }
    (*n)++;
}

int dec_plan(const ts_model_config *c, dec_param *out, int cap) {
    const name_scheme *ns = scheme_of(c);
    int n = 0;
    add(c, ns, R_EMBED, -1, out, cap, &n);
    add(c, ns, R_POS, -1, out, cap, &n);
    for (int64_t l = 0; l < c->layers; l++) {
        for (int k = 0; k < ns->n_order; k++)
            add(c, ns, ns->order[k], l, out, cap, &n);
        for (int r = 0; r < R_LAYER_COUNT; r++)
            if (!in_order(ns, (dec_role)r) && has_role(c, l, (dec_role)r)) {
                if (n < cap) {
                    memset(&out[n], 0, sizeof out[n]);
                    out[n].role = (dec_role)r, out[n].layer = l;
                    snprintf(out[n].name, sizeof out[n].name, "?");
                }
                n++;
            }
    }
    add(c, ns, R_FINAL_NORM, -1, out, cap, &n);
    add(c, ns, R_FINAL_NORM_B, -1, out, cap, &n);
    add(c, ns, R_HEAD, -1, out, cap, &n);
    return n;
}

void dec_part_name(const ts_model_config *c, const dec_param *p, int64_t part,
                   char *out, size_t cap) {
    if (p->parts <= 1) {
        snprintf(out, cap, "%s", p->name);
        return;
    }
    const name_scheme *ns = scheme_of(c);
    char pre[64], suf[DEC_NAME_LEN];
    snprintf(pre, sizeof pre, ns->prefix, (long long)p->layer);
    snprintf(suf, sizeof suf, ns->name[p->role], (long long)part);
    snprintf(out, cap, "%s%s", pre, suf);
}

void dec_layout_name(int layout, const char *name, char *out, size_t cap) {
    if (layout == DEC_LAYOUT_LM_PREFIX)
        snprintf(out, cap, "language_model.%s", name);
    else if (layout == DEC_LAYOUT_MODEL_LM && !strncmp(name, "model.", 6))
        snprintf(out, cap, "model.language_model.%s", name + 6);
    else
        snprintf(out, cap, "%s", name);
}

const char *dec_alt_name(const char *name) {
    return !strncmp(name, "transformer.", 12) ? name + 12 : NULL;
}
