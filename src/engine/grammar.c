/* grammar.c — structured outputs at run time: the vocabulary's byte trie,
 * the pushdown automaton over bytes (hash-consed stacks, llama.cpp's GBNF
 * stack sets), the matcher, the token masks with their per-grammar cache
 * (xgrammar's idea: for the top TSG_CTX frames of a stack, which tokens are
 * accepted or rejected whatever lies below, computed once and shared; only
 * the rest are checked per step), and the cache of compiled grammars. The
 * front ends that make the rules are json_schema.c, grammar_regex.c and
 * grammar_ebnf.c; grammar_build.c lowers them. */
#include "grammar_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* nodes one closure may make: past it a byte is refused (a left-recursive
 * or wildly ambiguous grammar), never a hang */
#define CLOSURE_BUDGET (1 << 17)
/* leaves the start may have: each costs a mask-entry lookup per step, so a
 * grammar that opens with a huge alternation is refused when compiled */
#define MAX_START_LEAVES 8192

/* ---- vocabulary ------------------------------------------------------- */

struct ts_vocab {
    int32_t V;
    uint32_t *off; /* V + 1 offsets into blob; special tokens: empty */
    unsigned char *blob;
    /* tokens with bytes, sorted by them, and their trie in preorder */
    int32_t *sorted, n_sorted;
    int32_t n_nodes, max_len;
    uint8_t *tb;     /* the byte into each node */
    int32_t *tend;   /* one past the node's subtree */
    int32_t *tok_lo; /* sorted tokens ending here: [tok_lo, tok_hi) */
    int32_t *tok_hi; /* ... and the subtree's: [tok_lo, sub_hi) */
    int32_t *sub_hi;
};

typedef struct {
    const unsigned char *p;
    uint32_t len;
    int32_t id;
} tok_key;

static int cmp_tokens(const void *a, const void *b) {
    const tok_key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* v->sorted by the tokens' bytes (shorter first on a shared prefix) */
static bool sort_tokens(ts_vocab *v) {
    tok_key *k = malloc(((size_t)v->n_sorted + 1) * sizeof *k);
    if (!k)
        return false;
    for (int32_t i = 0; i < v->n_sorted; i++) {
        int32_t t = v->sorted[i];
        k[i] = (tok_key){v->blob + v->off[t], v->off[t + 1] - v->off[t], t};
    }
    qsort(k, (size_t)v->n_sorted, sizeof *k, cmp_tokens);
    for (int32_t i = 0; i < v->n_sorted; i++)
        v->sorted[i] = k[i].id;
    free(k);
    return true;
}

static bool vocab_trie(ts_vocab *v) {
    /* at most one node per byte, plus the root */
    size_t cap = 1;
    for (int32_t i = 0; i < v->n_sorted; i++) {
        int32_t t = v->sorted[i];
        cap += v->off[t + 1] - v->off[t];
    }
    v->tb = malloc(cap);
    v->tend = malloc(cap * sizeof(int32_t));
    v->tok_lo = malloc(cap * sizeof(int32_t));
    v->tok_hi = malloc(cap * sizeof(int32_t));
    v->sub_hi = malloc(cap * sizeof(int32_t));
    int32_t *path = malloc(((size_t)v->max_len + 2) * sizeof *path);
    if (!v->tb || !v->tend || !v->tok_lo || !v->tok_hi || !v->sub_hi || !path) {
        free(path);
        return false;
    }
    int32_t n = 1, depth = 0;
    path[0] = 0;
    v->tb[0] = 0, v->tok_lo[0] = v->tok_hi[0] = 0;
    const unsigned char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t i = 0; i < v->n_sorted; i++) {
        int32_t t = v->sorted[i];
        const unsigned char *s = v->blob + v->off[t];
        uint32_t len = v->off[t + 1] - v->off[t], l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l])
            l++;
        for (; depth > (int32_t)l; depth--) {
            v->tend[path[depth]] = n;
            v->sub_hi[path[depth]] = i;
        }
        for (; depth < (int32_t)len; depth++) {
            int32_t k = n++;
            v->tb[k] = s[depth];
            v->tok_lo[k] = v->tok_hi[k] = i;
            path[depth + 1] = k;
        }
        v->tok_hi[path[len]] = i + 1;
        prev = s, prev_len = len;
    }
    for (; depth >= 0; depth--) {
        v->tend[path[depth]] = n;
        v->sub_hi[path[depth]] = v->n_sorted;
    }
    v->n_nodes = n;
    free(path);
    return true;
}

ts_status ts_vocab_new(ts_ctx *ctx, ts_tokenizer *tok, ts_vocab **out) {
    if (!tok || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "vocab: NULL argument");
    *out = NULL;
    ts_vocab *v = calloc(1, sizeof *v);
    int32_t V = ts_tokenizer_vocab_size(tok);
    if (!v || V <= 0)
        goto oom;
    v->V = V;
    size_t total = 0;
    for (int32_t t = 0; t < V; t++) {
        bool special = false;
        int64_t n = ts_tokenizer_token_bytes(tok, t, NULL, 0, &special);
        if (n > 0 && !special)
            total += (size_t)n;
    }
    v->off = malloc(((size_t)V + 1) * sizeof *v->off);
    v->blob = malloc(total + 1);
    v->sorted = malloc((size_t)V * sizeof *v->sorted);
    if (!v->off || !v->blob || !v->sorted)
        goto oom;
    size_t k = 0;
    for (int32_t t = 0; t < V; t++) {
        bool special = false;
        v->off[t] = (uint32_t)k;
        int64_t n = ts_tokenizer_token_bytes(tok, t, NULL, 0, &special);
        if (n <= 0 || special || k + (size_t)n > total)
            continue;
        ts_tokenizer_token_bytes(tok, t, v->blob + k, (size_t)n, NULL);
        k += (size_t)n;
        v->sorted[v->n_sorted++] = t;
        if (n > v->max_len)
            v->max_len = (int32_t)n;
    }
    v->off[V] = (uint32_t)k;
    if (!sort_tokens(v) || !vocab_trie(v))
        goto oom;
    *out = v;
    return TS_OK;
oom:
    ts_vocab_free(v);
    return ts_set_error(ctx, TS_ERR_OOM, "vocab: out of memory");
}

void ts_vocab_free(ts_vocab *v) {
    if (!v)
        return;
    free(v->off);
    free(v->blob);
    free(v->sorted);
    free(v->tb);
    free(v->tend);
    free(v->tok_lo);
    free(v->tok_hi);
    free(v->sub_hi);
    free(v);
}

int32_t ts_vocab_size(const ts_vocab *v) {
    return v ? v->V : 0;
}

const unsigned char *tsg_vocab_token(const ts_vocab *v, int32_t t,
                                     size_t *len) {
    if (t < 0 || t >= v->V || v->off[t + 1] == v->off[t]) {
        *len = 0;
        return NULL;
    }
    *len = v->off[t + 1] - v->off[t];
    return v->blob + v->off[t];
}

/* ---- pushdown automaton ----------------------------------------------- */

bool tsg_pda_init(tsg_pda *p, const ts_grammar *g) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->hcap = 256;
    p->head = malloc(p->hcap * sizeof *p->head);
    if (!p->head)
        return false;
    memset(p->head, 0xff, p->hcap * sizeof *p->head);
    return true;
}

void tsg_pda_free(tsg_pda *p) {
    free(p->pos);
    free(p->cont);
    free(p->seen);
    free(p->next);
    free(p->head);
    free(p->work);
    memset(p, 0, sizeof *p);
}

void tsg_set_free(tsg_set *s) {
    free(s->ids);
    memset(s, 0, sizeof *s);
}

static uint32_t node_hash(int32_t pos, int32_t cont) {
    uint32_t h = (uint32_t)pos * 0x9E3779B1u ^ (uint32_t)cont * 0x85EBCA77u;
    return h ^ (h >> 15);
}

static bool pda_grow(tsg_pda *p) {
    int32_t nc = p->cap ? 2 * p->cap : 256;
    int32_t *np = realloc(p->pos, (size_t)nc * sizeof *np);
    if (np)
        p->pos = np;
    int32_t *nco = realloc(p->cont, (size_t)nc * sizeof *nco);
    if (nco)
        p->cont = nco;
    uint32_t *ns = realloc(p->seen, (size_t)nc * sizeof *ns);
    if (ns)
        p->seen = ns;
    int32_t *nn = realloc(p->next, (size_t)nc * sizeof *nn);
    if (nn)
        p->next = nn;
    if (!np || !nco || !ns || !nn)
        return false;
    p->cap = nc;
    if ((uint32_t)nc > p->hcap) { /* rehash in creation order: a chain
                                     keeps newer nodes first (rollback) */
        uint32_t hc = p->hcap;
        while (hc < (uint32_t)nc)
            hc *= 2;
        int32_t *nh = malloc(hc * sizeof *nh);
        if (!nh)
            return false;
        memset(nh, 0xff, hc * sizeof *nh);
        for (int32_t i = 0; i < p->n; i++) {
            uint32_t h = node_hash(p->pos[i], p->cont[i]) & (hc - 1);
            p->next[i] = nh[h];
            nh[h] = i;
        }
        free(p->head);
        p->head = nh, p->hcap = hc;
    }
    return true;
}

int32_t tsg_node(tsg_pda *p, int32_t pos, int32_t cont) {
    uint32_t h = node_hash(pos, cont) & (p->hcap - 1);
    for (int32_t i = p->head[h]; i >= 0; i = p->next[i])
        if (p->pos[i] == pos && p->cont[i] == cont)
            return i;
    if (p->n == p->cap) {
        if (!pda_grow(p)) {
            p->oom = true;
            return -1;
        }
        h = node_hash(pos, cont) & (p->hcap - 1);
    }
    int32_t i = p->n++;
    p->pos[i] = pos, p->cont[i] = cont, p->seen[i] = 0;
    p->next[i] = p->head[h];
    p->head[h] = i;
    return i;
}

void tsg_pda_rollback(tsg_pda *p, int32_t mark) {
    while (p->n > mark) {
        int32_t i = --p->n;
        uint32_t h = node_hash(p->pos[i], p->cont[i]) & (p->hcap - 1);
        p->head[h] = p->next[i]; /* i is its chain's head */
    }
}

static bool work_push(tsg_pda *p, int32_t pos, int32_t cont) {
    if (p->n_work + 2 > p->cap_work) {
        int32_t nc = p->cap_work ? 2 * p->cap_work : 256;
        int32_t *nw = realloc(p->work, (size_t)nc * sizeof *nw);
        if (!nw)
            return false;
        p->work = nw, p->cap_work = nc;
    }
    p->work[p->n_work++] = pos;
    p->work[p->n_work++] = cont;
    return true;
}

static bool set_push(tsg_set *s, int32_t id) {
    if (s->n == s->cap) {
        int32_t nc = s->cap ? 2 * s->cap : 16;
        int32_t *ni = realloc(s->ids, (size_t)nc * sizeof *ni);
        if (!ni)
            return false;
        s->ids = ni, s->cap = nc;
    }
    s->ids[s->n++] = id;
    return true;
}

/* drains the work list into out: rule references expand into their
 * alternatives, ends pop to the continuation (tail calls make none) */
static bool run_closure(tsg_pda *p, tsg_set *out) {
    const ts_grammar *g = p->g;
    int32_t start = p->n;
    while (p->n_work) {
        int32_t cont = p->work[--p->n_work], pos = p->work[--p->n_work];
        int32_t n = tsg_node(p, pos, cont);
        if (n < 0 || p->n - start > CLOSURE_BUDGET)
            goto fail;
        if (p->seen[n] == p->gen)
            continue;
        p->seen[n] = p->gen;
        const gelem *e = &g->el[pos];
        if (e->type == G_SET) {
            if (!set_push(out, n))
                goto fail;
        } else if (e->type == G_END) {
            if (cont == TSG_ROOT)
                out->accept = true;
            else if (cont == TSG_UNKNOWN)
                out->escaped = true;
            else if (!work_push(p, p->pos[cont], p->cont[cont]))
                goto fail;
        } else {
            int32_t nc = cont;
            if (g->el[pos + 1].type != G_END &&
                (nc = tsg_node(p, pos + 1, cont)) < 0)
                goto fail;
            int32_t r = e->v, a0 = g->alt_first[r], na = g->alt_count[r];
            for (int32_t a = a0; a < a0 + na; a++)
                if (!work_push(p, g->alt_pos[a], nc))
                    goto fail;
        }
    }
    return true;
fail:
    p->n_work = 0;
    out->n = 0;
    out->accept = out->escaped = false;
    return false;
}

static void next_gen(tsg_pda *p) {
    if (++p->gen == 0) { /* wrapped: forget every mark */
        memset(p->seen, 0, (size_t)p->n * sizeof *p->seen);
        p->gen = 1;
    }
}

bool tsg_closure(tsg_pda *p, int32_t pos, int32_t cont, tsg_set *out) {
    out->n = 0;
    out->accept = out->escaped = false;
    next_gen(p);
    p->n_work = 0;
    if (!work_push(p, pos, cont))
        return false;
    return run_closure(p, out);
}

bool tsg_step(tsg_pda *p, const tsg_set *in, uint8_t c, tsg_set *out,
              int *matched) {
    const ts_grammar *g = p->g;
    out->n = 0;
    out->accept = out->escaped = false;
    next_gen(p);
    p->n_work = 0;
    int m = 0;
    for (int32_t i = 0; i < in->n; i++) {
        int32_t l = in->ids[i], pos = p->pos[l];
        const uint8_t *s = g->sets[g->el[pos].v];
        if (s[c >> 3] >> (c & 7) & 1) {
            m++;
            if (!work_push(p, pos + 1, p->cont[l])) {
                *matched = 0;
                return false;
            }
        }
    }
    *matched = m;
    if (!run_closure(p, out)) {
        *matched = 0;
        return false;
    }
    return true;
}

/* ---- the mask cache --------------------------------------------------- */

/* A stack's top TSG_CTX positions; past a root, -3. */
struct mask_entry {
    int32_t key[TSG_CTX];
    uint32_t *acc_bits; /* either a bitset ... */
    int32_t *acc;       /* ... or a list of the accepted tokens */
    int32_t n_acc;
    int32_t *unc; /* tokens to check against the whole stack */
    int32_t n_unc;
    int32_t id; /* the cache's insertion order: a matcher's stamp index */
    mask_entry *next;
};

typedef struct {
    pthread_mutex_t mu;
    mask_entry **bucket;
    uint32_t nb, n;
} mask_cache;

static uint32_t key_hash(const int32_t *k) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < TSG_CTX; i++)
        h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h ^ (h >> 13);
}

static void entry_free(mask_entry *e) {
    free(e->acc_bits);
    free(e->acc);
    free(e->unc);
    free(e);
}

static mask_entry *cache_find(mask_cache *c, const int32_t *key) {
    mask_entry *e = c->bucket[key_hash(key) & (c->nb - 1)];
    while (e && memcmp(e->key, key, sizeof e->key))
        e = e->next;
    return e;
}

/* inserts e unless an equal one came first (then e is freed); returns the
 * cached one */
static mask_entry *cache_insert(mask_cache *c, mask_entry *e) {
    pthread_mutex_lock(&c->mu);
    mask_entry *old = cache_find(c, e->key);
    if (old) {
        pthread_mutex_unlock(&c->mu);
        entry_free(e);
        return old;
    }
    if (c->n + 1 > c->nb) {
        uint32_t nb = 2 * c->nb;
        mask_entry **b = calloc(nb, sizeof *b);
        if (b) {
            for (uint32_t i = 0; i < c->nb; i++)
                for (mask_entry *x = c->bucket[i], *nx; x; x = nx) {
                    nx = x->next;
                    uint32_t h = key_hash(x->key) & (nb - 1);
                    x->next = b[h];
                    b[h] = x;
                }
            free(c->bucket);
            c->bucket = b, c->nb = nb;
        }
    }
    uint32_t h = key_hash(e->key) & (c->nb - 1);
    e->next = c->bucket[h];
    c->bucket[h] = e;
    e->id = (int32_t)c->n++;
    pthread_mutex_unlock(&c->mu);
    return e;
}

static void cache_free(mask_cache *c) {
    if (!c)
        return;
    for (uint32_t i = 0; i < c->nb; i++)
        for (mask_entry *x = c->bucket[i], *nx; x; x = nx) {
            nx = x->next;
            entry_free(x);
        }
    free(c->bucket);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

typedef struct {
    int32_t *v;
    int32_t n, cap;
    bool oom;
} ivec;

static void iv_push(ivec *a, int32_t x) {
    if (a->oom)
        return;
    if (a->n == a->cap) {
        int32_t nc = a->cap ? 2 * a->cap : 64;
        int32_t *nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            a->oom = true;
            return;
        }
        a->v = nv, a->cap = nc;
    }
    a->v[a->n++] = x;
}

/* ---- matcher ---------------------------------------------------------- */

struct ts_matcher {
    ts_grammar *g;
    tsg_pda p;
    tsg_set cur, tmp[2];
    /* per mask entry (by id): the mask call that last ORed it in, so each
     * entry's accepted tokens are applied once a step */
    uint32_t *stamp;
    int32_t cap_stamp;
    uint32_t mask_gen;
    bool oom;
};

static bool grow_i32(int32_t **p, int32_t *cap, int32_t need) {
    if (need <= *cap)
        return true;
    int32_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    int32_t *np = realloc(*p, (size_t)nc * sizeof *np);
    if (!np)
        return false;
    *p = np, *cap = nc;
    return true;
}

/* The trie walk's stack sets, made into a lazy DFA: a set of leaves (its
 * sorted node ids; hash-consing makes equal stacks equal ids) is a state,
 * and each (state, byte) is stepped once, so a string's interior, where
 * every byte leads back to the same set, costs a table lookup per trie
 * node. Node ids stay valid because nothing is rolled back until the walk
 * ends. */
typedef struct {
    int32_t off, n;
    bool escaped;
    int32_t *next; /* 256, made on first use; -2 unknown, -1 dead */
} dstate;

typedef struct {
    tsg_pda *p;
    dstate *st;
    int32_t n, cap;
    int32_t *pool;
    int32_t pool_n, pool_cap;
    int32_t *hash; /* open addressing over states, -1 empty */
    uint32_t hcap;
    tsg_set out;
    bool oom;
} dfa;

static uint32_t ids_hash(const int32_t *ids, int32_t n, bool esc) {
    uint32_t h = 2166136261u ^ (uint32_t)esc;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 16777619u;
    return h ^ (h >> 16);
}

static int cmp_i32(const void *a, const void *b);

static bool dfa_rehash(dfa *d) {
    uint32_t nc = d->hcap ? 2 * d->hcap : 256;
    int32_t *nh = malloc(nc * sizeof *nh);
    if (!nh)
        return false;
    memset(nh, 0xff, nc * sizeof *nh);
    for (int32_t k = 0; k < d->n; k++) {
        uint32_t h =
            ids_hash(d->pool + d->st[k].off, d->st[k].n, d->st[k].escaped) &
            (nc - 1);
        while (nh[h] >= 0)
            h = (h + 1) & (nc - 1);
        nh[h] = k;
    }
    free(d->hash);
    d->hash = nh, d->hcap = nc;
    return true;
}

static bool grow_states(dfa *d) {
    int32_t nc = d->cap ? 2 * d->cap : 64;
    dstate *ns = realloc(d->st, (size_t)nc * sizeof *ns);
    if (!ns)
        return false;
    d->st = ns, d->cap = nc;
    return true;
}

/* the state of a set (sorted in place) */
static int32_t dfa_state(dfa *d, tsg_set *s) {
    if (s->n > 1)
        qsort(s->ids, (size_t)s->n, sizeof *s->ids, cmp_i32);
    if ((uint32_t)d->n * 2 + 2 > d->hcap && !dfa_rehash(d))
        return d->oom = true, -1;
    uint32_t h = ids_hash(s->ids, s->n, s->escaped) & (d->hcap - 1);
    for (int32_t k; (k = d->hash[h]) >= 0; h = (h + 1) & (d->hcap - 1))
        if (d->st[k].n == s->n && d->st[k].escaped == s->escaped &&
            (!s->n || !memcmp(d->pool + d->st[k].off, s->ids,
                              (size_t)s->n * sizeof *s->ids)))
            return k;
    if (!grow_i32(&d->pool, &d->pool_cap, d->pool_n + s->n + 1) ||
        (d->n == d->cap && !grow_states(d)))
        return d->oom = true, -1;
    if (s->n)
        memcpy(d->pool + d->pool_n, s->ids, (size_t)s->n * sizeof *s->ids);
    d->st[d->n] = (dstate){d->pool_n, s->n, s->escaped, NULL};
    d->pool_n += s->n;
    d->hash[h] = d->n;
    return d->n++;
}

static int32_t dfa_next(dfa *d, int32_t k, uint8_t c) {
    if (!d->st[k].next) {
        if (!(d->st[k].next = malloc(256 * sizeof(int32_t))))
            return d->oom = true, -1;
        for (int i = 0; i < 256; i++)
            d->st[k].next[i] = -2;
    }
    if (d->st[k].next[c] != -2)
        return d->st[k].next[c];
    tsg_set in = {.ids = d->pool + d->st[k].off, .n = d->st[k].n};
    int matched = 0;
    int32_t r = -1;
    if (tsg_step(d->p, &in, c, &d->out, &matched) && matched)
        r = dfa_state(d, &d->out);
    else if (d->p->oom)
        d->oom = true;
    d->st[k].next[c] = r; /* st may have moved: index again */
    return r;
}

static void dfa_free(dfa *d) {
    for (int32_t k = 0; k < d->n; k++)
        free(d->st[k].next);
    free(d->st);
    free(d->pool);
    free(d->hash);
    tsg_set_free(&d->out);
}

typedef struct {
    dfa d;
    const ts_vocab *v;
    ivec acc, unc;
} walk_state;

static void add_range(const ts_vocab *v, ivec *to, int32_t lo, int32_t hi) {
    for (int32_t i = lo; i < hi; i++)
        iv_push(to, v->sorted[i]);
}

/* The tokens under trie node i from DFA state k (E: a stack escaped into
 * the unknown context before this byte). */
static void walk(walk_state *w, int32_t i, int32_t k, bool E) {
    const ts_vocab *v = w->v;
    int32_t nx = dfa_next(&w->d, k, v->tb[i]);
    if (nx < 0) { /* no stack took the byte */
        if (E)
            add_range(v, &w->unc, v->tok_lo[i], v->sub_hi[i]);
        return;
    }
    add_range(v, &w->acc, v->tok_lo[i], v->tok_hi[i]);
    E = E || w->d.st[nx].escaped;
    if (w->d.st[nx].n == 0) {
        if (E)
            add_range(v, &w->unc, v->tok_hi[i], v->sub_hi[i]);
        return;
    }
    for (int32_t c = i + 1; c < v->tend[i] && !w->d.oom; c = v->tend[c])
        walk(w, c, nx, E);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* the entry of a stack's top frames, made from a synthetic stack whose
 * bottom is unknown (or the root, when the key reaches it) */
static mask_entry *entry_compute(ts_matcher *m, const int32_t *key) {
    const ts_vocab *v = m->g->vocab;
    int32_t mark = tsg_mark(&m->p), last = TSG_CTX - 1;
    while (last > 0 && key[last] < 0)
        last--;
    int32_t cont = last + 1 < TSG_CTX && key[last + 1] == TSG_ROOT
                       ? TSG_ROOT
                       : TSG_UNKNOWN;
    for (int32_t j = last; j >= 1 && cont >= -2; j--)
        cont = tsg_node(&m->p, key[j], cont);
    int32_t leaf = m->p.oom ? -1 : tsg_node(&m->p, key[0], cont);
    walk_state w = {.d = {.p = &m->p}, .v = v};
    tsg_set root = {0};
    int32_t k0 = -1;
    if (leaf >= 0 && set_push(&root, leaf))
        k0 = dfa_state(&w.d, &root);
    w.d.oom |= k0 < 0;
    for (int32_t c = 1; c < v->n_nodes && !w.d.oom; c = v->tend[c])
        walk(&w, c, k0, false);
    bool failed = w.d.oom;
    tsg_set_free(&root);
    dfa_free(&w.d);
    tsg_pda_rollback(&m->p, mark);
    mask_entry *e = calloc(1, sizeof *e);
    if (failed || w.acc.oom || w.unc.oom || !e) {
        free(w.acc.v);
        free(w.unc.v);
        free(e);
        return NULL;
    }
    memcpy(e->key, key, sizeof e->key);
    if (w.unc.n)
        qsort(w.unc.v, (size_t)w.unc.n, sizeof *w.unc.v, cmp_i32);
    e->unc = w.unc.v, e->n_unc = w.unc.n;
    e->n_acc = w.acc.n;
    if (w.acc.n > v->V / 32) { /* a bitset is smaller and faster to OR */
        e->acc_bits = calloc(((size_t)v->V + 31) / 32, sizeof(uint32_t));
        if (!e->acc_bits) {
            free(w.acc.v);
            entry_free(e);
            return NULL;
        }
        for (int32_t i = 0; i < w.acc.n; i++)
            e->acc_bits[w.acc.v[i] >> 5] |= 1u << (w.acc.v[i] & 31);
        free(w.acc.v);
    } else
        e->acc = w.acc.v;
    return e;
}

static void leaf_key(const tsg_pda *p, int32_t leaf, int32_t *key) {
    key[0] = p->pos[leaf];
    int32_t c = p->cont[leaf];
    for (int j = 1; j < TSG_CTX; j++) {
        if (c >= 0) {
            key[j] = p->pos[c];
            c = p->cont[c];
        } else {
            key[j] = c == TSG_ROOT ? TSG_ROOT : -3;
            c = -3;
        }
    }
}

static const mask_entry *entry_get(ts_matcher *m, int32_t leaf) {
    int32_t key[TSG_CTX];
    leaf_key(&m->p, leaf, key);
    mask_cache *c = m->g->cache;
    pthread_mutex_lock(&c->mu);
    mask_entry *e = cache_find(c, key);
    pthread_mutex_unlock(&c->mu);
    if (e)
        return e;
    e = entry_compute(m, key);
    return e ? cache_insert(c, e) : NULL;
}

static bool feed(tsg_pda *p, tsg_set *from, tsg_set tmp[2],
                 const unsigned char *b, size_t len) {
    const tsg_set *s = from;
    for (size_t i = 0; i < len; i++) {
        int matched = 0;
        tsg_set *o = &tmp[i & 1];
        tsg_step(p, s, b[i], o, &matched);
        if (!matched)
            return false;
        s = o;
    }
    return true;
}

ts_status ts_matcher_new(ts_ctx *ctx, ts_grammar *g, ts_matcher **out) {
    if (!g || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "matcher: NULL argument");
    ts_matcher *m = calloc(1, sizeof *m);
    if (!m || !tsg_pda_init(&m->p, g)) {
        free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "matcher: out of memory");
    }
    m->g = ts_grammar_ref(g);
    if (!tsg_closure(&m->p, g->start, TSG_ROOT, &m->cur)) {
        ts_matcher_free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "matcher: out of memory");
    }
    *out = m;
    return TS_OK;
}

void ts_matcher_free(ts_matcher *m) {
    if (!m)
        return;
    tsg_pda_free(&m->p);
    tsg_set_free(&m->cur);
    tsg_set_free(&m->tmp[0]);
    tsg_set_free(&m->tmp[1]);
    free(m->stamp);
    ts_grammar_unref(m->g);
    free(m);
}

bool tsg_matcher_try_bytes(ts_matcher *m, const unsigned char *b, size_t len) {
    int32_t mark = tsg_mark(&m->p);
    bool ok = len > 0 && feed(&m->p, &m->cur, m->tmp, b, len);
    tsg_pda_rollback(&m->p, mark);
    return ok;
}

bool tsg_matcher_feed(ts_matcher *m, const unsigned char *b, size_t len) {
    int32_t mark = tsg_mark(&m->p);
    if (!feed(&m->p, &m->cur, m->tmp, b, len)) {
        tsg_pda_rollback(&m->p, mark);
        return false;
    }
    if (len) {
        tsg_set t_ = m->cur;
        m->cur = m->tmp[(len - 1) & 1];
        m->tmp[(len - 1) & 1] = t_;
    }
    return true;
}

/* one token against one leaf's whole stack */
static bool leaf_accepts(ts_matcher *m, int32_t leaf, int32_t t) {
    size_t len;
    const unsigned char *b = tsg_vocab_token(m->g->vocab, t, &len);
    if (!b)
        return false;
    tsg_set one = {.ids = &leaf, .n = 1, .cap = 1};
    int32_t mark = tsg_mark(&m->p);
    bool ok = feed(&m->p, &one, m->tmp, b, len);
    tsg_pda_rollback(&m->p, mark);
    return ok;
}

/* whether e's accepted tokens are still to be ORed in this step (and marks
 * them done); true as well when the stamps cannot grow (then applied again) */
static bool first_use(ts_matcher *m, const mask_entry *e) {
    if (e->id >= m->cap_stamp) {
        int32_t nc = m->cap_stamp ? m->cap_stamp : 64;
        while (nc <= e->id)
            nc *= 2;
        uint32_t *ns = realloc(m->stamp, (size_t)nc * sizeof *ns);
        if (!ns)
            return true;
        memset(ns + m->cap_stamp, 0, (size_t)(nc - m->cap_stamp) * sizeof *ns);
        m->stamp = ns, m->cap_stamp = nc;
    }
    if (m->stamp[e->id] == m->mask_gen)
        return false;
    m->stamp[e->id] = m->mask_gen;
    return true;
}

void ts_matcher_mask(ts_matcher *m, uint32_t *bits) {
    const ts_vocab *v = m->g->vocab;
    int32_t W = (v->V + 31) / 32;
    memset(bits, 0, (size_t)W * sizeof *bits);
    if (++m->mask_gen == 0) { /* wrapped: forget every stamp */
        if (m->stamp)
            memset(m->stamp, 0, (size_t)m->cap_stamp * sizeof *m->stamp);
        m->mask_gen = 1;
    }
    for (int32_t i = 0; i < m->cur.n; i++) {
        int32_t leaf = m->cur.ids[i];
        const mask_entry *e = entry_get(m, leaf);
        if (!e) { /* out of memory: the slow way for this leaf */
            for (int32_t t = 0; t < v->V; t++)
                if (!(bits[t >> 5] >> (t & 31) & 1) && leaf_accepts(m, leaf, t))
                    bits[t >> 5] |= 1u << (t & 31);
            continue;
        }
        if (first_use(m, e)) {
            if (e->acc_bits)
                for (int32_t w = 0; w < W; w++)
                    bits[w] |= e->acc_bits[w];
            else
                for (int32_t j = 0; j < e->n_acc; j++)
                    bits[e->acc[j] >> 5] |= 1u << (e->acc[j] & 31);
        }
        for (int32_t j = 0; j < e->n_unc; j++) {
            int32_t t = e->unc[j];
            if (!(bits[t >> 5] >> (t & 31) & 1) && leaf_accepts(m, leaf, t))
                bits[t >> 5] |= 1u << (t & 31);
        }
    }
}

bool ts_matcher_accept(ts_matcher *m, int32_t t) {
    size_t len;
    const unsigned char *b = tsg_vocab_token(m->g->vocab, t, &len);
    if (!b)
        return false;
    return tsg_matcher_feed(m, b, len);
}

bool ts_matcher_can_end(const ts_matcher *m) {
    return m->cur.accept;
}

bool ts_matcher_done(const ts_matcher *m) {
    return m->cur.accept && m->cur.n == 0;
}

/* ---- compiling -------------------------------------------------------- */

/* Left recursion, in time linear in the grammar. A rule's left corners
 * are the rules it may reference before reading a byte (a reference after
 * nullable ones only). A reference in tail position pushes no frame, so a
 * cycle of those ends (x ::= y* x, y nullable, closes over the same
 * nodes); a cycle with a reference that pushes a frame grows the stack
 * forever: that is the left recursion refused. So: which rules are
 * nullable (a worklist: an alternative is once each of its references
 * is), the left-corner edges, their strongly connected components
 * (Tarjan, iterative), and a pushing edge inside a component. */
typedef struct {
    int32_t *nullable, *need, *alt_rule, *use_off, *use_alt, *queue;
    int32_t *edge_off, *edge, *index, *low, *comp, *calls, *stack, *next;
} lr_scratch;

static void lr_free(lr_scratch *w) {
    int32_t **all[] = {&w->nullable, &w->need,  &w->alt_rule, &w->use_off,
                       &w->use_alt,  &w->queue, &w->edge_off, &w->edge,
                       &w->index,    &w->low,   &w->comp,     &w->calls,
                       &w->stack,    &w->next};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(*all[i]);
}

static int32_t *lr_alloc(int32_t n) {
    return calloc((size_t)n + 1, sizeof(int32_t));
}

/* which rules are nullable; need, alt_rule, use lists and queue filled */
static bool lr_nullable(const ts_grammar *g, lr_scratch *w, int32_t A) {
    int32_t R = g->n_rules, n_uses = 0;
    /* need[a]: a's references not yet known nullable (-1: a reads a byte) */
    for (int32_t r = 0; r < R; r++)
        for (int32_t a = g->alt_first[r]; a < g->alt_first[r] + g->alt_count[r];
             a++) {
            w->alt_rule[a] = r;
            int32_t refs = 0;
            const gelem *e = &g->el[g->alt_pos[a]];
            for (; e->type != G_END && refs >= 0; e++)
                refs = e->type == G_SET ? -1 : refs + 1;
            w->need[a] = refs;
            for (e = &g->el[g->alt_pos[a]]; refs > 0 && e->type != G_END; e++)
                w->use_off[e->v + 1]++, n_uses++;
        }
    for (int32_t r = 0; r < R; r++)
        w->use_off[r + 1] += w->use_off[r];
    if (!(w->use_alt = lr_alloc(n_uses)))
        return false;
    int32_t *fill = w->next; /* free until the search */
    for (int32_t r = 0; r < R; r++)
        fill[r] = w->use_off[r];
    for (int32_t a = 0; a < A; a++)
        for (const gelem *e = &g->el[g->alt_pos[a]];
             w->need[a] > 0 && e->type != G_END; e++)
            w->use_alt[fill[e->v]++] = a;
    int32_t qn = 0;
    for (int32_t a = 0; a < A; a++)
        if (w->need[a] == 0 && !w->nullable[w->alt_rule[a]])
            w->nullable[w->alt_rule[a]] = 1, w->queue[qn++] = w->alt_rule[a];
    for (int32_t q = 0; q < qn; q++) {
        int32_t s = w->queue[q];
        for (int32_t u = w->use_off[s]; u < w->use_off[s + 1]; u++) {
            int32_t a = w->use_alt[u], r = w->alt_rule[a];
            if (--w->need[a] == 0 && !w->nullable[r])
                w->nullable[r] = 1, w->queue[qn++] = r;
        }
    }
    return true;
}

/* left-corner edges, each 2 * target + (1 when it pushes a frame) */
static bool lr_edges(const ts_grammar *g, lr_scratch *w, int32_t A) {
    int32_t R = g->n_rules, n_edges = 0, *fill = w->next;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            for (int32_t r = 0; r < R; r++)
                w->edge_off[r + 1] += w->edge_off[r];
            if (!(w->edge = lr_alloc(n_edges)))
                return false;
            for (int32_t r = 0; r < R; r++)
                fill[r] = w->edge_off[r];
        }
        for (int32_t a = 0; a < A; a++) {
            int32_t r = w->alt_rule[a];
            for (const gelem *e = &g->el[g->alt_pos[a]]; e->type == G_REF;
                 e++) {
                if (pass)
                    w->edge[fill[r]++] = 2 * e->v + (e[1].type != G_END);
                else
                    w->edge_off[r + 1]++, n_edges++;
                if (!w->nullable[e->v])
                    break;
            }
        }
    }
    return true;
}

/* Tarjan's components: comp[r] the component's root */
static void lr_components(int32_t R, lr_scratch *w) {
    int32_t counter = 0;
    for (int32_t r = 0; r < R; r++)
        w->index[r] = -1;
    for (int32_t s0 = 0; s0 < R; s0++) {
        if (w->index[s0] >= 0)
            continue;
        int32_t top = 0, sn = 0;
        w->calls[0] = s0;
        w->index[s0] = w->low[s0] = counter++;
        w->stack[sn++] = s0, w->comp[s0] = -1, w->next[s0] = w->edge_off[s0];
        while (top >= 0) {
            int32_t v = w->calls[top];
            if (w->next[v] < w->edge_off[v + 1]) {
                int32_t t = w->edge[w->next[v]++] >> 1;
                if (w->index[t] < 0) {
                    w->index[t] = w->low[t] = counter++;
                    w->stack[sn++] = t, w->comp[t] = -1;
                    w->next[t] = w->edge_off[t];
                    w->calls[++top] = t;
                } else if (w->comp[t] < 0 && w->index[t] < w->low[v])
                    w->low[v] = w->index[t]; /* t still on the stack */
                continue;
            }
            if (w->low[v] == w->index[v]) {
                int32_t x;
                do
                    x = w->stack[--sn], w->comp[x] = v;
                while (x != v);
            }
            if (--top >= 0 && w->low[v] < w->low[w->calls[top]])
                w->low[w->calls[top]] = w->low[v];
        }
    }
}

/* "r -> t -> ... -> r": a path from t back to r inside their component
 * (breadth first), for the message; the first rule of the user's on it
 * in *named (else r) */
static void lr_cycle(const gbuild *b, lr_scratch *w, int32_t R, int32_t r,
                     int32_t t, int32_t *named, char *out, size_t cap) {
    int32_t *parent = w->low, *queue = w->queue, qn = 0;
    for (int32_t k = 0; k < R; k++)
        parent[k] = -1;
    parent[t] = t, queue[qn++] = t;
    for (int32_t q = 0; q < qn && parent[r] < 0; q++) {
        int32_t v = queue[q];
        for (int32_t i = w->edge_off[v]; i < w->edge_off[v + 1]; i++) {
            int32_t u = w->edge[i] >> 1;
            if (w->comp[u] == w->comp[r] && parent[u] < 0)
                parent[u] = v, queue[qn++] = u;
        }
    }
    /* the path reversed: r, parent[r], ..., t */
    int32_t n = 0, *path = w->stack;
    for (int32_t v = r; n < R; v = parent[v]) {
        path[n++] = v;
        if (v == t)
            break;
    }
    *named = r;
    size_t o = 0;
    out[0] = 0;
    for (int32_t k = -1; k < n && o + 1 < cap; k++) {
        int32_t v = k < 0 ? r : path[n - 1 - k];
        if (*named >= b->n_rules && v < b->n_rules)
            *named = v;
        int m = snprintf(out + o, cap - o, "%s%s", k < 0 ? "" : " -> ",
                         v < b->n_rules ? b->names[v] : "(helper)");
        o += m > 0 ? (size_t)m : 0;
    }
}

static ts_status check_left_recursion(ts_ctx *ctx, const ts_grammar *g,
                                      const gbuild *b) {
    int32_t R = g->n_rules;
    int32_t A = R ? g->alt_first[R - 1] + g->alt_count[R - 1] : 0;
    lr_scratch w = {0};
    w.nullable = lr_alloc(R), w.need = lr_alloc(A), w.alt_rule = lr_alloc(A);
    w.use_off = lr_alloc(R + 1), w.queue = lr_alloc(R);
    w.edge_off = lr_alloc(R + 1), w.index = lr_alloc(R), w.low = lr_alloc(R);
    w.comp = lr_alloc(R), w.calls = lr_alloc(R), w.stack = lr_alloc(R);
    w.next = lr_alloc(R);
    if (!w.nullable || !w.need || !w.alt_rule || !w.use_off || !w.queue ||
        !w.edge_off || !w.index || !w.low || !w.comp || !w.calls || !w.stack ||
        !w.next || !lr_nullable(g, &w, A) || !lr_edges(g, &w, A)) {
        lr_free(&w);
        return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    }
    lr_components(R, &w);
    ts_status st = TS_OK;
    for (int32_t r = 0; r < R && !st; r++)
        for (int32_t i = w.edge_off[r]; i < w.edge_off[r + 1] && !st; i++) {
            int32_t t = w.edge[i] >> 1;
            if (!(w.edge[i] & 1) || w.comp[t] != w.comp[r])
                continue;
            char path[256];
            int32_t named;
            lr_cycle(b, &w, R, r, t, &named, path, sizeof path);
            st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                              "grammar: rule \"%s\" is left-recursive (it "
                              "reaches itself before reading a byte: %s)",
                              named < b->n_rules ? b->names[named] : "(helper)",
                              path);
        }
    lr_free(&w);
    return st;
}

/* The start's leaves, refused here rather than met at every request's
 * first step: more than MAX_START_LEAVES of them (each costs a mask-entry
 * lookup per step), or a closure past its budget. */
static ts_status check_start(ts_ctx *ctx, const ts_grammar *g) {
    tsg_pda p;
    tsg_set s = {0};
    if (!tsg_pda_init(&p, g))
        return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    ts_status st = TS_OK;
    if (!tsg_closure(&p, g->start, TSG_ROOT, &s))
        st = p.n > CLOSURE_BUDGET
                 ? ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "grammar: too ambiguous at the start (more "
                                "than %d stack nodes before the first byte)",
                                CLOSURE_BUDGET)
                 : ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    else if (s.n > MAX_START_LEAVES)
        st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                          "grammar: %d alternatives may begin the text, more "
                          "than the limit of %d (a huge enum, choice or "
                          "alternation: give fewer, or factor out a common "
                          "start)",
                          (int)s.n, MAX_START_LEAVES);
    tsg_set_free(&s);
    tsg_pda_free(&p);
    return st;
}

static void grammar_free(ts_grammar *g) {
    free(g->el);
    free(g->alt_first);
    free(g->alt_count);
    free(g->alt_pos);
    free(g->sets);
    cache_free(g->cache);
    free(g);
}

static ts_status front_end(ts_ctx *ctx, gbuild *b, const ts_grammar_spec *s,
                           int *root) {
    switch (s->kind) {
    case TS_GRAMMAR_JSON_OBJECT:
        return tsg_json_object(ctx, b, root);
    case TS_GRAMMAR_JSON_SCHEMA:
        return tsg_json_schema(ctx, b, s->src, root);
    case TS_GRAMMAR_REGEX: {
        gx *x = NULL;
        ts_status st = tsg_regex(ctx, b, s->src, &x, NULL, NULL);
        if (st)
            return st;
        *root = gb_rule(b, "regex");
        gb_define(b, *root, x);
        return TS_OK;
    }
    case TS_GRAMMAR_EBNF:
        return tsg_ebnf(ctx, b, s->src, root);
    }
    return ts_set_error(ctx, TS_ERR_INVALID_ARG, "grammar: unknown kind %d",
                        (int)s->kind);
}

ts_status ts_grammar_compile(ts_ctx *ctx, const ts_vocab *v,
                             const ts_grammar_spec *spec, ts_grammar **out) {
    if (!v || !spec || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "grammar: NULL argument");
    *out = NULL;
    if (spec->kind != TS_GRAMMAR_JSON_OBJECT && !spec->src)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "grammar: no source text");
    gbuild b;
    gb_init(&b);
    int start = gb_rule(&b, "(start)"), root = -1;
    ts_status st = front_end(ctx, &b, spec, &root);
    if (st) {
        gb_free(&b);
        return st;
    }
    gx *body = gx_seq(&b);
    gx_add(&b, body, gx_str(&b, spec->prefix ? spec->prefix : ""));
    gx_add(&b, body, gx_ref(&b, root));
    gx_add(&b, body, gx_str(&b, spec->suffix ? spec->suffix : ""));
    gb_define(&b, start, body);
    ts_grammar *g = calloc(1, sizeof *g);
    mask_cache *c = calloc(1, sizeof *c);
    if (!g || !c || !(c->bucket = calloc(64, sizeof *c->bucket))) {
        free(g);
        free(c);
        gb_free(&b);
        return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    }
    c->nb = 64;
    pthread_mutex_init(&c->mu, NULL);
    g->cache = c;
    g->refs = 1;
    g->vocab = v;
    st = tsg_lower(ctx, &b, g);
    if (!st) /* EBNF rules, or a schema's $ref cycle */
        st = check_left_recursion(ctx, g, &b);
    if (!st)
        st = check_start(ctx, g);
    gb_free(&b);
    if (st) {
        grammar_free(g);
        return st;
    }
    *out = g;
    return TS_OK;
}

ts_grammar *ts_grammar_ref(ts_grammar *g) {
    if (g)
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void ts_grammar_unref(ts_grammar *g) {
    if (g && __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) == 0)
        grammar_free(g);
}

void tsg_grammar_stats(const ts_grammar *g, int *rules, int *elements,
                       int *cache_entries) {
    mask_cache *c = g->cache;
    *rules = g->n_rules, *elements = g->n_el;
    pthread_mutex_lock(&c->mu);
    *cache_entries = (int)c->n;
    pthread_mutex_unlock(&c->mu);
}

/* ---- the cache of compiled grammars ----------------------------------- */

typedef struct gc_item {
    uint64_t hash;
    int kind;
    char *src, *prefix, *suffix;
    ts_grammar *g;
    uint64_t used; /* a clock for least-recently-used */
} gc_item;

struct ts_grammar_cache {
    pthread_mutex_t mu;
    const ts_vocab *v;
    gc_item *items;
    int n, cap;
    uint64_t clock;
};

static uint64_t fnv64(uint64_t h, const char *s) {
    if (!s)
        return (h ^ 0xff) * 1099511628211ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xfe) * 1099511628211ull;
}

static bool str_eq(const char *a, const char *b) {
    return a == b || (a && b && !strcmp(a, b));
}

static char *dup_or_null(const char *s, bool *oom) {
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

ts_status ts_grammar_cache_new(ts_ctx *ctx, const ts_vocab *v, int capacity,
                               ts_grammar_cache **out) {
    if (!v || !out || capacity <= 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "grammar cache: NULL vocabulary or capacity %d",
                            capacity);
    ts_grammar_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->items = calloc((size_t)capacity, sizeof *c->items))) {
        free(c);
        return ts_set_error(ctx, TS_ERR_OOM, "grammar cache: out of memory");
    }
    c->cap = capacity;
    c->v = v;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return TS_OK;
}

static void item_clear(gc_item *it) {
    free(it->src);
    free(it->prefix);
    free(it->suffix);
    ts_grammar_unref(it->g);
    memset(it, 0, sizeof *it);
}

void ts_grammar_cache_free(ts_grammar_cache *c) {
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        item_clear(&c->items[i]);
    free(c->items);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int cache_lookup(ts_grammar_cache *c, uint64_t h,
                        const ts_grammar_spec *s) {
    for (int i = 0; i < c->n; i++) {
        gc_item *it = &c->items[i];
        if (it->hash == h && it->kind == (int)s->kind &&
            str_eq(it->src,
                   s->kind == TS_GRAMMAR_JSON_OBJECT ? NULL : s->src) &&
            str_eq(it->prefix, s->prefix) && str_eq(it->suffix, s->suffix))
            return i;
    }
    return -1;
}

ts_status ts_grammar_cache_get(ts_grammar_cache *c, ts_ctx *ctx,
                               const ts_grammar_spec *spec, ts_grammar **out,
                               bool *hit) {
    if (!c || !spec || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "grammar cache: NULL argument");
    const char *src = spec->kind == TS_GRAMMAR_JSON_OBJECT ? NULL : spec->src;
    uint64_t h =
        fnv64(fnv64(fnv64(fnv64(1469598103934665603ull,
                                (const char[]){(char)('0' + spec->kind), 0}),
                          src),
                    spec->prefix),
              spec->suffix);
    pthread_mutex_lock(&c->mu);
    int i = cache_lookup(c, h, spec);
    if (i >= 0) {
        c->items[i].used = ++c->clock;
        *out = ts_grammar_ref(c->items[i].g);
        pthread_mutex_unlock(&c->mu);
        if (hit)
            *hit = true;
        return TS_OK;
    }
    pthread_mutex_unlock(&c->mu);
    if (hit)
        *hit = false;
    /* compiled outside the lock: two threads may both compile one spec;
     * the second to finish takes the cached first (its mask entries are
     * shared) and drops its own */
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_compile(ctx, c->v, spec, &g);
    if (st)
        return st;
    bool oom = false;
    gc_item it = {.hash = h,
                  .kind = (int)spec->kind,
                  .src = dup_or_null(src, &oom),
                  .prefix = dup_or_null(spec->prefix, &oom),
                  .suffix = dup_or_null(spec->suffix, &oom),
                  .g = g};
    pthread_mutex_lock(&c->mu);
    int raced = oom ? -1 : cache_lookup(c, h, spec);
    if (oom || raced >= 0) {
        if (raced >= 0) {
            c->items[raced].used = ++c->clock;
            ts_grammar *first = ts_grammar_ref(c->items[raced].g);
            ts_grammar_unref(g);
            g = first;
        }
        pthread_mutex_unlock(&c->mu);
        it.g = NULL;
        item_clear(&it);
        *out = g;
        return TS_OK;
    }
    int slot = c->n;
    if (c->n == c->cap) { /* drop the least recently used */
        slot = 0;
        for (int k = 1; k < c->n; k++)
            if (c->items[k].used < c->items[slot].used)
                slot = k;
        item_clear(&c->items[slot]);
    } else
        c->n++;
    it.used = ++c->clock;
    c->items[slot] = it;
    *out = ts_grammar_ref(g);
    pthread_mutex_unlock(&c->mu);
    return TS_OK;
}
