/* grammar_internal.h — the structured-output grammar's shared internals:
 * the expression tree that the three front ends (json_schema.c,
 * grammar_regex.c, grammar_ebnf.c) build, its lowering to flat rules, and
 * the byte-level pushdown automaton (grammar.c) that the matcher, the token
 * masks and the tests run. Nothing outside src/engine/grammar*.c and
 * json_schema.c (and tests/test_grammar.c) includes it. */
#ifndef TS_GRAMMAR_INTERNAL_H
#define TS_GRAMMAR_INTERNAL_H

#include "tessera_grammar.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- expression trees (front ends -> lowering) ------------------------ */

typedef enum {
    GX_EMPTY,   /* matches "" */
    GX_BYTES,   /* a literal byte string */
    GX_CLASS,   /* a set of Unicode code points, matched as UTF-8 */
    GX_BYTESET, /* one byte from a set (raw bytes, no UTF-8) */
    GX_SEQ,
    GX_ALT,
    GX_REPEAT, /* kid{min,max}; max < 0: unbounded */
    GX_REF     /* a rule by id */
} gx_kind;

typedef struct gx gx;
struct gx {
    gx_kind kind;
    int n, cap;
    gx **kids;            /* SEQ, ALT; REPEAT: kids[0] */
    unsigned char *bytes; /* BYTES */
    size_t len;
    uint32_t *ranges; /* CLASS: n pairs [lo, hi], sorted, disjoint */
    uint8_t set[32];  /* BYTESET */
    int min, max;     /* REPEAT */
    int rule;         /* REF */
};

/* The builder owns every node and the named rules; a failed allocation
 * makes constructors return NULL and sets oom (checked once at the end),
 * so front ends need not test each call. */
typedef struct {
    gx **nodes;
    size_t n_nodes, cap_nodes;
    char **names;
    gx **bodies; /* NULL until defined */
    int n_rules, cap_rules;
    int32_t *name_hash; /* open addressing: each name's first rule, -1 */
    uint32_t name_hcap;
    bool oom;
} gbuild;

void gb_init(gbuild *b);
void gb_free(gbuild *b);
gx *gx_empty(gbuild *b);
gx *gx_lit(gbuild *b, const void *bytes, size_t len);
gx *gx_str(gbuild *b, const char *s);
/* ranges: n pairs (code points); negate: the complement within Unicode
 * scalar values */
gx *gx_class(gbuild *b, const uint32_t *ranges, int n, bool negate);
gx *gx_byteset(gbuild *b, const uint8_t set[32]);
gx *gx_seq(gbuild *b);
gx *gx_alt(gbuild *b);
gx *gx_add(gbuild *b, gx *parent, gx *kid); /* returns parent */
gx *gx_rep(gbuild *b, gx *kid, int min, int max);
gx *gx_ref(gbuild *b, int rule);
/* a new rule (name copied; for messages); -1 when out of memory */
int gb_rule(gbuild *b, const char *name);
void gb_define(gbuild *b, int rule, gx *body);
/* the rule of that name, or -1 */
int gb_find(const gbuild *b, const char *name);

/* Front ends: each defines its rules in b and gives the start's id in
 * *root, or sets an error naming what is wrong (TS_ERR_INVALID_ARG). */
ts_status tsg_json_schema(ts_ctx *ctx, gbuild *b, const char *src, int *root);
ts_status tsg_json_object(ts_ctx *ctx, gbuild *b, int *root);
/* regex -> a tree; *anchored_start / *anchored_end (may be NULL) say
 * whether it began with ^ / ended with $ (dropped from the tree) */
ts_status tsg_regex(ts_ctx *ctx, gbuild *b, const char *src, gx **out,
                    bool *anchored_start, bool *anchored_end);
gx *tsg_regex_class(ts_ctx *ctx, gbuild *b, const char *src, size_t *i,
                    ts_status *st);
int32_t tsg_regex_escape(ts_ctx *ctx, const char *src, size_t *i,
                         ts_status *st);
ts_status tsg_ebnf(ts_ctx *ctx, gbuild *b, const char *src, int *root);

/* ---- the flat grammar ------------------------------------------------- */

enum { G_END = 0, G_SET = 1, G_REF = 2 };
typedef struct {
    uint8_t type;
    int32_t v; /* G_SET: a set's index; G_REF: a rule */
} gelem;

/* Stack nodes: cont -1 is the bottom (the text may end), -2 a context
 * left unknown (the token-mask cache's own stacks). */
#define TSG_ROOT    (-1)
#define TSG_UNKNOWN (-2)
/* how many stack frames key a token-mask cache entry */
#define TSG_CTX 6

typedef struct mask_entry mask_entry;

struct ts_grammar {
    int refs; /* atomic */
    const ts_vocab *vocab;
    gelem *el;
    int32_t n_el;
    int32_t *alt_first; /* per rule: index into alt_pos */
    int32_t *alt_count;
    int32_t *alt_pos; /* first element of each alternative */
    int32_t n_rules;
    uint8_t (*sets)[32];
    int32_t n_sets;
    int32_t start; /* a position holding [REF root, END] */
    void *cache;   /* mask entries by context (grammar.c) */
};

/* Lowers b (rule 0 the start) to g's flat form; errors name the rule.
 * Rules keep their ids; helper rules come after b's. */
ts_status tsg_lower(ts_ctx *ctx, gbuild *b, ts_grammar *g);

/* ---- the pushdown automaton ------------------------------------------- */

/* Hash-consed stack nodes (pos, cont), so a set of stacks is a set of
 * node ids and equal stacks are one id. Nodes made while testing a token
 * are dropped again (tsg_pda_rollback). */
typedef struct {
    const ts_grammar *g;
    int32_t *pos, *cont;
    uint32_t *seen; /* the closure generation that visited the node */
    int32_t *next;  /* hash chain */
    int32_t n, cap;
    int32_t *head;
    uint32_t hcap; /* power of two */
    uint32_t gen;
    int32_t *work; /* (pos, cont) pairs */
    int32_t n_work, cap_work;
    bool oom;
} tsg_pda;

typedef struct {
    int32_t *ids; /* leaf nodes: their pos is a G_SET */
    int32_t n, cap;
    bool accept;  /* a stack reached the bottom */
    bool escaped; /* a stack popped into TSG_UNKNOWN */
} tsg_set;

bool tsg_pda_init(tsg_pda *p, const ts_grammar *g);
void tsg_pda_free(tsg_pda *p);
void tsg_set_free(tsg_set *s);
int32_t tsg_node(tsg_pda *p, int32_t pos, int32_t cont);
/* the leaves reachable from (pos, cont) without reading a byte */
bool tsg_closure(tsg_pda *p, int32_t pos, int32_t cont, tsg_set *out);
/* out := the set after byte c; false when out of memory or when the
 * closure ran past its budget (then out is empty). *matched: leaves that
 * took c (a token ending here is consumed). */
bool tsg_step(tsg_pda *p, const tsg_set *in, uint8_t c, tsg_set *out,
              int *matched);
static inline int32_t tsg_mark(const tsg_pda *p) {
    return p->n;
}
void tsg_pda_rollback(tsg_pda *p, int32_t mark);

/* The slow reference: whether bytes could follow the matcher's text
 * (walks the automaton byte by byte, no cache); the matcher is unchanged */
bool tsg_matcher_try_bytes(ts_matcher *m, const unsigned char *bytes,
                           size_t len);
/* advances by raw bytes (all or nothing); false when they do not fit */
bool tsg_matcher_feed(ts_matcher *m, const unsigned char *bytes, size_t len);
/* a token's bytes (NULL for special/empty tokens) */
const unsigned char *tsg_vocab_token(const ts_vocab *v, int32_t t, size_t *len);
/* the internal form's size, for tests and logs */
void tsg_grammar_stats(const ts_grammar *g, int *rules, int *elements,
                       int *cache_entries);

#endif
