/* grammar_build.c — the expression trees the grammar front ends build and
 * their lowering to flat rules (alternatives of byte-set / rule-reference
 * sequences): code-point classes become UTF-8 byte-range sequences,
 * repetition becomes right-recursive helper rules (never left recursion,
 * so the pushdown automaton's stacks stay bounded by nesting). The
 * automaton itself is grammar.c's. */
#include "grammar_internal.h"

#include <stdio.h>
#include <string.h>

/* the lowered grammar's size limits: hostile input fails, never hangs */
#define MAX_ELEMENTS (4 << 20)
#define MAX_REPEAT   10000
/* expression nesting lowered by recursion: the front ends' own limits
 * (groups 100 deep, schemas 64) stay well below it; past it the grammar
 * is refused rather than the stack overflowed */
#define MAX_TREE_DEPTH 256

/* ---- builder ---------------------------------------------------------- */

void gb_init(gbuild *b) {
    memset(b, 0, sizeof *b);
}

void gb_free(gbuild *b) {
    for (size_t i = 0; i < b->n_nodes; i++) {
        free(b->nodes[i]->kids);
        free(b->nodes[i]->bytes);
        free(b->nodes[i]->ranges);
        free(b->nodes[i]);
    }
    free(b->nodes);
    for (int i = 0; i < b->n_rules; i++)
        free(b->names[i]);
    free(b->names);
    free(b->bodies);
    free(b->name_hash);
    memset(b, 0, sizeof *b);
}

static gx *node_new(gbuild *b, gx_kind k) {
    if (b->oom)
        return NULL;
    if (b->n_nodes == b->cap_nodes) {
        size_t nc = b->cap_nodes ? 2 * b->cap_nodes : 64;
        gx **nn = realloc(b->nodes, nc * sizeof *nn);
        if (!nn) {
            b->oom = true;
            return NULL;
        }
        b->nodes = nn, b->cap_nodes = nc;
    }
    gx *x = calloc(1, sizeof *x);
    if (!x) {
        b->oom = true;
        return NULL;
    }
    x->kind = k;
    b->nodes[b->n_nodes++] = x;
    return x;
}

gx *gx_empty(gbuild *b) {
    return node_new(b, GX_EMPTY);
}

gx *gx_lit(gbuild *b, const void *bytes, size_t len) {
    if (!len)
        return gx_empty(b);
    gx *x = node_new(b, GX_BYTES);
    if (!x)
        return NULL;
    if (!(x->bytes = malloc(len))) {
        b->oom = true;
        return NULL;
    }
    memcpy(x->bytes, bytes, len);
    x->len = len;
    return x;
}

gx *gx_str(gbuild *b, const char *s) {
    return gx_lit(b, s, strlen(s));
}

static int cmp_u32pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

gx *gx_class(gbuild *b, const uint32_t *ranges, int n, bool negate) {
    gx *x = node_new(b, GX_CLASS);
    if (!x)
        return NULL;
    uint32_t *r = malloc(((size_t)2 * n + 4) * sizeof *r);
    if (!r) {
        b->oom = true;
        return NULL;
    }
    memcpy(r, ranges, (size_t)2 * n * sizeof *r);
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_u32pair);
    int m = 0; /* merge overlapping and adjacent */
    for (int i = 0; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (lo > hi)
            continue;
        if (hi > 0x10FFFF)
            hi = 0x10FFFF;
        if (m && lo <= r[2 * m - 1] + 1) {
            if (hi > r[2 * m - 1])
                r[2 * m - 1] = hi;
        } else
            r[2 * m] = lo, r[2 * m + 1] = hi, m++;
    }
    if (negate) {
        uint32_t *c = malloc(((size_t)2 * m + 4) * sizeof *c);
        if (!c) {
            free(r);
            b->oom = true;
            return NULL;
        }
        int k = 0;
        uint32_t from = 0;
        for (int i = 0; i < m; i++) {
            if (r[2 * i] > from)
                c[2 * k] = from, c[2 * k + 1] = r[2 * i] - 1, k++;
            from = r[2 * i + 1] + 1;
        }
        if (from <= 0x10FFFF)
            c[2 * k] = from, c[2 * k + 1] = 0x10FFFF, k++;
        free(r);
        r = c, m = k;
    }
    x->ranges = r;
    x->n = m;
    return x;
}

gx *gx_byteset(gbuild *b, const uint8_t set[32]) {
    gx *x = node_new(b, GX_BYTESET);
    if (x)
        memcpy(x->set, set, 32);
    return x;
}

gx *gx_seq(gbuild *b) {
    return node_new(b, GX_SEQ);
}
gx *gx_alt(gbuild *b) {
    return node_new(b, GX_ALT);
}

gx *gx_add(gbuild *b, gx *p, gx *kid) {
    if (!p || !kid)
        return NULL;
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 4;
        gx **nk = realloc(p->kids, (size_t)nc * sizeof *nk);
        if (!nk) {
            b->oom = true;
            return NULL;
        }
        p->kids = nk, p->cap = nc;
    }
    p->kids[p->n++] = kid;
    return p;
}

gx *gx_rep(gbuild *b, gx *kid, int min, int max) {
    if (!kid)
        return NULL;
    gx *x = node_new(b, GX_REPEAT);
    if (!x)
        return NULL;
    x->min = min, x->max = max;
    return gx_add(b, x, kid);
}

gx *gx_ref(gbuild *b, int rule) {
    if (rule < 0)
        return NULL;
    gx *x = node_new(b, GX_REF);
    if (x)
        x->rule = rule;
    return x;
}

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* the slot of name in b->name_hash: its first rule's, or an empty one */
static uint32_t name_slot(const gbuild *b, const char *name) {
    uint32_t h = name_hash(name) & (b->name_hcap - 1);
    while (b->name_hash[h] >= 0 && strcmp(b->names[b->name_hash[h]], name))
        h = (h + 1) & (b->name_hcap - 1);
    return h;
}

/* rules by name in a hash, so EBNF with many rules parses in linear time */
static bool name_index(gbuild *b, int rule) {
    if ((uint32_t)rule * 2 + 2 > b->name_hcap) {
        uint32_t nc = b->name_hcap ? 2 * b->name_hcap : 64;
        int32_t *nh = malloc(nc * sizeof *nh);
        if (!nh)
            return false;
        memset(nh, 0xff, nc * sizeof *nh);
        free(b->name_hash);
        b->name_hash = nh, b->name_hcap = nc;
        for (int i = 0; i < rule; i++) {
            uint32_t h = name_slot(b, b->names[i]);
            if (b->name_hash[h] < 0)
                b->name_hash[h] = i;
        }
    }
    uint32_t h = name_slot(b, b->names[rule]);
    if (b->name_hash[h] < 0)
        b->name_hash[h] = rule;
    return true;
}

int gb_rule(gbuild *b, const char *name) {
    if (b->oom)
        return -1;
    if (b->n_rules == b->cap_rules) {
        int nc = b->cap_rules ? 2 * b->cap_rules : 16;
        char **nn = realloc(b->names, (size_t)nc * sizeof *nn);
        if (nn)
            b->names = nn;
        gx **nb = realloc(b->bodies, (size_t)nc * sizeof *nb);
        if (nb)
            b->bodies = nb;
        if (!nn || !nb) {
            b->oom = true;
            return -1;
        }
        b->cap_rules = nc;
    }
    char *s = strdup(name);
    if (!s) {
        b->oom = true;
        return -1;
    }
    b->names[b->n_rules] = s;
    b->bodies[b->n_rules] = NULL;
    if (!name_index(b, b->n_rules)) {
        free(s);
        b->oom = true;
        return -1;
    }
    return b->n_rules++;
}

void gb_define(gbuild *b, int rule, gx *body) {
    if (rule >= 0 && rule < b->n_rules)
        b->bodies[rule] = body;
    if (!body)
        b->oom = true;
}

int gb_find(const gbuild *b, const char *name) {
    return b->name_hcap ? b->name_hash[name_slot(b, name)] : -1;
}

/* ---- lowering --------------------------------------------------------- */

typedef struct {
    gelem *el;
    int32_t n, cap;
} elvec;

typedef struct {
    ts_ctx *ctx;
    gbuild *b;
    /* rules being lowered: the builder's, then helpers */
    gx **body;
    int32_t n_rules, cap_rules;
    /* per rule, its alternatives as element runs */
    int32_t *alt_first, *alt_count;
    int32_t *alt_pos;
    int32_t n_alts, cap_alts;
    elvec all;
    uint8_t (*sets)[32];
    int32_t n_sets, cap_sets;
    int32_t *set_hash; /* open addressing over sets, -1 empty */
    uint32_t set_hcap;
    int depth;         /* lower_into's recursion */
    int32_t deep_rule; /* the rule that nested too deeply, or -1 */
    int32_t rule;      /* the rule being lowered */
    bool oom, too_big;
} lowering;

static bool grow(void **p, int32_t *cap, int32_t need, size_t elsize) {
    if (need <= *cap)
        return true;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elsize);
    if (!np)
        return false;
    *p = np, *cap = nc;
    return true;
}

static void el_push(lowering *L, elvec *v, uint8_t type, int32_t val) {
    if (L->oom)
        return;
    if (L->all.n + v->n >= MAX_ELEMENTS) {
        L->too_big = true;
        return;
    }
    if (!grow((void **)&v->el, &v->cap, v->n + 1, sizeof *v->el)) {
        L->oom = true;
        return;
    }
    v->el[v->n].type = type;
    v->el[v->n++].v = val;
}

static uint32_t set_hash(const uint8_t *s) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 32; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

static int32_t intern_set(lowering *L, const uint8_t set[32]) {
    if (L->oom)
        return 0;
    if ((uint32_t)L->n_sets * 2 >= L->set_hcap) {
        uint32_t nc = L->set_hcap ? 2 * L->set_hcap : 256;
        int32_t *nh = malloc(nc * sizeof *nh);
        if (!nh) {
            L->oom = true;
            return 0;
        }
        memset(nh, 0xff, nc * sizeof *nh);
        for (int32_t i = 0; i < L->n_sets; i++) {
            uint32_t h = set_hash(L->sets[i]) & (nc - 1);
            while (nh[h] >= 0)
                h = (h + 1) & (nc - 1);
            nh[h] = i;
        }
        free(L->set_hash);
        L->set_hash = nh, L->set_hcap = nc;
    }
    uint32_t h = set_hash(set) & (L->set_hcap - 1);
    while (L->set_hash[h] >= 0) {
        if (!memcmp(L->sets[L->set_hash[h]], set, 32))
            return L->set_hash[h];
        h = (h + 1) & (L->set_hcap - 1);
    }
    if (!grow((void **)&L->sets, &L->cap_sets, L->n_sets + 1,
              sizeof *L->sets)) {
        L->oom = true;
        return 0;
    }
    memcpy(L->sets[L->n_sets], set, 32);
    L->set_hash[h] = L->n_sets;
    return L->n_sets++;
}

static void push_byte_range(lowering *L, elvec *v, unsigned lo, unsigned hi) {
    uint8_t s[32] = {0};
    for (unsigned c = lo; c <= hi; c++)
        s[c >> 3] |= (uint8_t)(1u << (c & 7));
    el_push(L, v, G_SET, intern_set(L, s));
}

static int32_t new_helper(lowering *L, gx *body) {
    if (L->oom)
        return 0;
    if (!grow((void **)&L->body, &L->cap_rules, L->n_rules + 1,
              sizeof *L->body)) {
        L->oom = true;
        return 0;
    }
    L->body[L->n_rules] = body;
    return L->n_rules++;
}

/* UTF-8 sequences of the code points [lo, hi] (one encoded length, no
 * surrogates): split until each byte position is one range (the
 * regex-syntax crate's utf8 ranges). */
typedef struct {
    uint8_t lo[4], hi[4];
    int n;
} utf8_seq;

static int utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80)
        return o[0] = (uint8_t)c, 1;
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63)), o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

static void utf8_split(uint32_t lo, uint32_t hi, utf8_seq *out, int *n) {
    static const uint32_t bound[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= bound[k] && hi > bound[k]) {
            utf8_split(lo, bound[k], out, n);
            utf8_split(bound[k] + 1, hi, out, n);
            return;
        }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_split(lo, lo | m, out, n);
                utf8_split((lo | m) + 1, hi, out, n);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(lo, (hi & ~m) - 1, out, n);
                utf8_split(hi & ~m, hi, out, n);
                return;
            }
        }
    }
    utf8_seq *s = &out[(*n)++];
    s->n = utf8_encode(lo, s->lo);
    utf8_encode(hi, s->hi);
}

static void lower_into(lowering *L, gx *x, elvec *v);

static void lower_class(lowering *L, gx *x, elvec *v) {
    uint8_t ascii[32] = {0};
    bool any_ascii = false;
    /* at most ~24 sequences per range after splitting */
    int cap = 32 * (x->n + 1), n = 0;
    utf8_seq *seq = malloc((size_t)cap * sizeof *seq);
    if (!seq) {
        L->oom = true;
        return;
    }
    for (int i = 0; i < x->n; i++) {
        uint32_t lo = x->ranges[2 * i], hi = x->ranges[2 * i + 1];
        for (uint32_t c = lo; c <= hi && c < 0x80; c++)
            ascii[c >> 3] |= (uint8_t)(1u << (c & 7)), any_ascii = true;
        if (hi < 0x80)
            continue;
        if (lo < 0x80)
            lo = 0x80;
        /* no surrogates */
        if (lo <= 0xDFFF && hi >= 0xD800) {
            if (lo < 0xD800)
                utf8_split(lo, 0xD7FF, seq, &n);
            if (hi > 0xDFFF)
                utf8_split(0xE000, hi, seq, &n);
        } else
            utf8_split(lo, hi, seq, &n);
    }
    if (!n && any_ascii) { /* the common case: one byte set inline */
        el_push(L, v, G_SET, intern_set(L, ascii));
        free(seq);
        return;
    }
    /* a helper rule of the alternatives, as a tree of byte sets */
    gbuild *b = L->b;
    gx *alt = gx_alt(b);
    if (any_ascii)
        gx_add(b, alt, gx_byteset(b, ascii));
    for (int i = 0; i < n; i++) {
        gx *s = gx_seq(b);
        for (int k = 0; k < seq[i].n; k++) {
            uint8_t bs[32] = {0};
            for (unsigned c = seq[i].lo[k]; c <= seq[i].hi[k]; c++)
                bs[c >> 3] |= (uint8_t)(1u << (c & 7));
            gx_add(b, s, gx_byteset(b, bs));
        }
        gx_add(b, alt, s);
    }
    free(seq);
    if (!alt) {
        L->oom = true;
        return;
    }
    if (alt->n == 0) { /* an empty class never matches: a set of no byte */
        uint8_t none[32] = {0};
        el_push(L, v, G_SET, intern_set(L, none));
        return;
    }
    if (alt->n == 1) {
        lower_into(L, alt->kids[0], v);
        return;
    }
    el_push(L, v, G_REF, new_helper(L, alt));
}

/* x as one element: inline when it lowers to a single element already */
static bool single_element(const gx *x) {
    return x->kind == GX_BYTESET || x->kind == GX_REF ||
           (x->kind == GX_BYTES && x->len == 1) ||
           (x->kind == GX_CLASS && x->n > 0 && x->ranges[2 * x->n - 1] < 0x80);
}

static void lower_repeat(lowering *L, gx *x, elvec *v) {
    gx *kid = x->kids[0];
    gbuild *b = L->b;
    int min = x->min, max = x->max;
    if (min > MAX_REPEAT || max > MAX_REPEAT) {
        L->too_big = true;
        return;
    }
    gx *unit = kid;
    if (!single_element(kid) && (min > 1 || max != min)) {
        gx *r = gx_ref(b, 0);
        if (!r) {
            L->oom = true;
            return;
        }
        r->rule = new_helper(L, kid);
        unit = r;
    }
    for (int i = 0; i < min; i++)
        lower_into(L, unit, v);
    if (max == min)
        return;
    if (max < 0) { /* S ::= unit S | "" */
        gx *alt = gx_alt(b), *s = gx_seq(b), *self = gx_ref(b, 0);
        int32_t r = new_helper(L, alt);
        if (self)
            self->rule = r;
        gx_add(b, s, unit);
        gx_add(b, s, self);
        gx_add(b, alt, s);
        gx_add(b, alt, gx_empty(b));
        if (!alt)
            L->oom = true;
        el_push(L, v, G_REF, r);
        return;
    }
    /* O_k ::= unit O_{k-1} | "" , O_1 ::= unit | "" */
    int32_t prev = -1;
    for (int k = 1; k <= max - min && !L->oom; k++) {
        gx *alt = gx_alt(b), *s = gx_seq(b);
        gx_add(b, s, unit);
        if (prev >= 0) {
            gx *p = gx_ref(b, 0);
            if (p)
                p->rule = prev;
            gx_add(b, s, p);
        }
        gx_add(b, alt, s);
        gx_add(b, alt, gx_empty(b));
        if (!alt)
            L->oom = true;
        prev = new_helper(L, alt);
    }
    el_push(L, v, G_REF, prev);
}

static void lower_node(lowering *L, gx *x, elvec *v);

static void lower_into(lowering *L, gx *x, elvec *v) {
    if (L->oom || L->too_big)
        return;
    if (!x) {
        L->oom = true;
        return;
    }
    if (L->depth >= MAX_TREE_DEPTH) {
        L->too_big = true;
        if (L->deep_rule < 0)
            L->deep_rule = L->rule;
        return;
    }
    L->depth++;
    lower_node(L, x, v);
    L->depth--;
}

static void lower_node(lowering *L, gx *x, elvec *v) {
    switch (x->kind) {
    case GX_EMPTY:
        break;
    case GX_BYTES:
        for (size_t i = 0; i < x->len; i++)
            push_byte_range(L, v, x->bytes[i], x->bytes[i]);
        break;
    case GX_BYTESET:
        el_push(L, v, G_SET, intern_set(L, x->set));
        break;
    case GX_CLASS:
        lower_class(L, x, v);
        break;
    case GX_SEQ:
        for (int i = 0; i < x->n; i++)
            lower_into(L, x->kids[i], v);
        break;
    case GX_ALT:
        if (x->n == 1)
            lower_into(L, x->kids[0], v);
        else
            el_push(L, v, G_REF, new_helper(L, x));
        break;
    case GX_REPEAT:
        lower_repeat(L, x, v);
        break;
    case GX_REF:
        el_push(L, v, G_REF, x->rule);
        break;
    }
}

static void add_alt(lowering *L, int32_t rule, gx *x, elvec *tmp) {
    tmp->n = 0;
    lower_into(L, x, tmp);
    el_push(L, tmp, G_END, 0);
    if (L->oom || L->too_big)
        return;
    if (!grow((void **)&L->alt_pos, &L->cap_alts, L->n_alts + 1,
              sizeof *L->alt_pos) ||
        !grow((void **)&L->all.el, &L->all.cap, L->all.n + tmp->n,
              sizeof *L->all.el)) {
        L->oom = true;
        return;
    }
    (void)rule;
    L->alt_pos[L->n_alts++] = L->all.n;
    memcpy(L->all.el + L->all.n, tmp->el, (size_t)tmp->n * sizeof *tmp->el);
    L->all.n += tmp->n;
}

static void lowering_free(lowering *L) {
    free(L->body);
    free(L->alt_first);
    free(L->alt_count);
    free(L->alt_pos);
    free(L->all.el);
    free(L->sets);
    free(L->set_hash);
}

ts_status tsg_lower(ts_ctx *ctx, gbuild *b, ts_grammar *g) {
    if (b->oom)
        return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    for (int i = 0; i < b->n_rules; i++)
        if (!b->bodies[i])
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "grammar: rule \"%s\" is used but not defined",
                                b->names[i]);
    lowering L = {.ctx = ctx, .b = b, .deep_rule = -1};
    for (int i = 0; i < b->n_rules; i++)
        new_helper(&L, b->bodies[i]);
    /* the start: [REF 0, END] first, so position 0 is the start */
    el_push(&L, &L.all, G_REF, 0);
    el_push(&L, &L.all, G_END, 0);
    elvec tmp = {0};
    int32_t cap_first = 0, cap_count = 0;
    for (int32_t r = 0; r < L.n_rules && !L.oom && !L.too_big; r++) {
        if (!grow((void **)&L.alt_first, &cap_first, r + 1,
                  sizeof *L.alt_first) ||
            !grow((void **)&L.alt_count, &cap_count, r + 1,
                  sizeof *L.alt_count)) {
            L.oom = true;
            break;
        }
        gx *body = L.body[r];
        L.rule = r;
        L.alt_first[r] = L.n_alts;
        if (body && body->kind == GX_ALT) {
            for (int i = 0; i < body->n; i++)
                add_alt(&L, r, body->kids[i], &tmp);
        } else
            add_alt(&L, r, body, &tmp);
        L.alt_count[r] = L.n_alts - L.alt_first[r];
    }
    free(tmp.el);
    if (b->oom)
        L.oom = true;
    if (L.oom || L.too_big) {
        int32_t deep = L.deep_rule;
        lowering_free(&L);
        if (L.oom)
            return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
        if (deep >= 0)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "grammar: rule \"%s\" nests expressions "
                                "deeper than %d",
                                deep < b->n_rules ? b->names[deep] : "(helper)",
                                MAX_TREE_DEPTH);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "grammar: too large (more than %d "
                            "elements or a repetition count over %d)",
                            MAX_ELEMENTS, MAX_REPEAT);
    }
    g->el = L.all.el;
    g->n_el = L.all.n;
    g->alt_first = L.alt_first;
    g->alt_count = L.alt_count;
    g->alt_pos = L.alt_pos;
    g->n_rules = L.n_rules;
    g->sets = L.sets;
    g->n_sets = L.n_sets;
    g->start = 0;
    free(L.body);
    free(L.set_hash);
    return TS_OK;
}
