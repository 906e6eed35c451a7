/* decoder_spec.h — what a decoder of a given config holds (internal to
 * src/models): its parameters by role, with their Hugging Face names and
 * shapes, from the family's name table. decoder.c builds the model from
 * it; decoder_load.c checks a checkpoint's header against it before the
 * model is allocated. */
#ifndef TS_MODELS_DECODER_SPEC_H
#define TS_MODELS_DECODER_SPEC_H

#include "tessera_models.h"

/* a parameter's role in a layer (or, below R_LAYER_COUNT's end, in the
 * model: embeddings, positions, final norm, head) */
typedef enum {
    R_ATTN_NORM,
    R_ATTN_NORM_B,
    R_Q,
    R_Q_B,
    R_K,
    R_K_B,
    R_V,
    R_V_B,
    R_QKV,
    R_QKV_B,
    R_O,
    R_O_B,
    R_Q_NORM,
    R_K_NORM,
    R_POST_ATTN_NORM,
    R_MLP_NORM,
    R_MLP_NORM_B,
    R_POST_MLP_NORM,
    R_ROUTER,
    R_EXP_GATE,
    R_EXP_UP,
    R_EXP_DOWN,
    R_GATE,
    R_GATE_B,
    R_UP,
    R_UP_B,
    R_GATE_UP,
    R_DOWN,
    R_DOWN_B,
    R_LAYER_COUNT,
    /* the model's own */
    R_EMBED = R_LAYER_COUNT,
    R_POS,
    R_FINAL_NORM,
    R_FINAL_NORM_B,
    R_HEAD,
    R_COUNT
} dec_role;

/* How a parameter starts (HF's _init_weights). */
typedef enum { INIT_NORMAL, INIT_RESIDUAL, INIT_ONES, INIT_ZEROS } dec_init;

#define DEC_NAME_LEN 128

typedef struct {
    dec_role role;
    int64_t layer; /* -1 for the model's own */
    int ndim;
    int64_t shape[3];
    bool matrix; /* kept in the weight dtype (else f32) */
    dec_init init;
    int64_t parts; /* checkpoint tensors: E for stacked experts, else 1 */
    char name[DEC_NAME_LEN];
} dec_param;

/* The parameters of cfg in state_dict order into out (up to cap); returns
 * how many there are. */
int dec_plan(const ts_model_config *cfg, dec_param *out, int cap);
/* The checkpoint name of part `part` of p (p->name itself when parts ==
 * 1). */
void dec_part_name(const ts_model_config *cfg, const dec_param *p, int64_t part,
                   char *out, size_t cap);
/* TS_OK, or an error naming a parameter the config asks for that the
 * family's table does not have (a "?" in the plan). */
ts_status dec_plan_check(ts_ctx *ctx, const ts_model_config *cfg,
                         const dec_param *plan, int n);
/* What a role is, for messages ("the q_proj bias", ...). */
const char *dec_role_name(dec_role r);
/* A multimodal checkpoint's layout of the text weights (Gemma 3's
 * *ForConditionalGeneration): none, "language_model." before every name
 * (transformers 4.50), or "model." read as "model.language_model."
 * (4.52 on; lm_head.weight stays at the top). */
enum {
    DEC_LAYOUT_PLAIN = 0,
    DEC_LAYOUT_LM_PREFIX,
    DEC_LAYOUT_MODEL_LM,
    DEC_LAYOUT_COUNT
};
/* name as a checkpoint of that layout spells it */
void dec_layout_name(int layout, const char *name, char *out, size_t cap);
/* Other names a checkpoint may use for the tensor called name (GPT-2's
 * without "transformer."): the alternative, or NULL. */
const char *dec_alt_name(const char *name);

#endif
