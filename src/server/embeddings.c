/* embeddings.c — OpenAI's /v1/embeddings over the engine: each input (a
 * string or token ids) is one engine request with the server's pooling
 * (--pooling: the last token's or the mean final hidden state, L2
 * normalized by the engine), batched with the generations; the vectors
 * come back on the engine thread (srv_embed_deliver) and go out as float
 * lists or base64 (little-endian float32, as OpenAI's client decodes
 * them). The HTTP plumbing, locks and state are server.c's. */
#define _GNU_SOURCE
#include "server_internal.h"

#include "tessera_io.h"
#include "tessera_models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_INPUTS 2048 /* OpenAI's limit on one request's inputs */

typedef struct {
    int32_t *ids; /* malloc'd */
    size_t n;
} input;

/* msg follows the field's name: ": why" or "[i]: why" */
static enum MHD_Result bad(struct MHD_Connection *c, const char *param,
                           const char *msg) {
    return srv_send_error(c, 400, "invalid_request_error", param,
                          "invalid_value", "%s%s", param, msg);
}

/* an array of token ids into in; false when v is not one */
static bool ids_of(json_t *v, input *in) {
    size_t n = json_array_size(v);
    in->ids = malloc(sizeof *in->ids * (n ? n : 1));
    in->n = n;
    for (size_t i = 0; in->ids && i < n; i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) > INT32_MAX)
            return false;
        in->ids[i] = (int32_t)json_integer_value(t);
    }
    return in->ids != NULL;
}

static bool text_ids(json_t *v, input *in, char *err, size_t cap) {
    pthread_mutex_lock(&srv.tok_mu);
    ts_status s =
        ts_tokenizer_encode_text(srv.tok, json_string_value(v),
                                 json_string_length(v), true, &in->ids, &in->n);
    if (s != TS_OK) {
        snprintf(err, cap, "%s", ts_errmsg(srv.ctx));
        ts_clear_error(srv.ctx);
    }
    pthread_mutex_unlock(&srv.tok_mu);
    return s == TS_OK;
}

/* "input": a string, strings, token ids, or lists of token ids, into
 * ins (n_in of them); 0, or an error message (err) for input */
static int parse_input(json_t *v, input **ins, int *n_in, char *err,
                       size_t cap) {
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    bool one_ids =
        json_is_array(v) && n && json_is_integer(json_array_get(v, 0));
    if (one_ids)
        n = 1;
    if (!json_is_string(v) && !(json_is_array(v) && n)) {
        snprintf(err, cap,
                 ": must be a string, an array of strings, of "
                 "token ids, or of arrays of token ids");
        return -1;
    }
    if (n > MAX_INPUTS) {
        snprintf(err, cap, ": at most %d inputs (%zu given)", MAX_INPUTS, n);
        return -1;
    }
    *ins = calloc(n, sizeof **ins);
    *n_in = (int)n;
    if (!*ins) {
        snprintf(err, cap, ": out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_string(v) || one_ids ? v : json_array_get(v, i);
        input *in = &(*ins)[i];
        char why[400] = "";
        bool ok = json_is_string(e)  ? text_ids(e, in, why, sizeof why)
                  : json_is_array(e) ? ids_of(e, in)
                                     : false;
        if (!ok) {
            snprintf(err, cap, "[%zu]: %s", i,
                     *why ? why
                          : "must be a string or an array of token ids "
                            "(integers)");
            return -1;
        }
        if (!in->n) {
            snprintf(err, cap, "[%zu]: empty", i);
            return -1;
        }
    }
    return 0;
}

static void inputs_free(input *ins, int n) {
    for (int i = 0; ins && i < n; i++)
        free(ins[i].ids);
    free(ins);
}

/* the inputs into the engine and the active list, all or none: 0, or the
 * HTTP status (400: the engine refused one, 503: out of memory) with msg
 * set */
static int add_all(hreq *r, const input *ins, char *msg, size_t cap) {
    srv_eng_lock();
    /* room in the active list before the engine has any of them: a
     * vector no one waits for would never be collected */
    pthread_mutex_lock(&srv.out_mu);
    bool room = srv_active_reserve(r->n_ech);
    pthread_mutex_unlock(&srv.out_mu);
    if (!room) {
        for (int i = 0; i < r->n_ech; i++)
            r->ech[i].finished = true; /* nothing to abort at the end */
        pthread_mutex_unlock(&srv.eng_mu);
        snprintf(msg, cap, "out of memory for %d more running inputs",
                 r->n_ech);
        return 503;
    }
    ts_status st = TS_OK;
    int added = 0;
    for (; added < r->n_ech && st == TS_OK; added++) {
        ts_request q = {.prompt = ins[added].ids,
                        .n_prompt = ins[added].n,
                        .max_tokens = 1,
                        .sampling = ts_sampling_default(),
                        .pooling = srv.pooling};
        r->ech[added].req = r;
        r->ech[added].index = added;
        st = ts_engine_add(srv.eng, &q, &r->ech[added].eid);
        if (st != TS_OK) {
            snprintf(msg, cap, "input[%d]: %s", added, ts_errmsg(srv.ctx));
            ts_clear_error(srv.ctx);
            break; /* added: the ones in */
        }
    }
    if (st != TS_OK) {
        for (int i = 0; i < added; i++)
            if (ts_engine_abort(srv.eng, r->ech[i].eid) != TS_OK)
                ts_clear_error(srv.ctx);
        for (int i = 0; i < r->n_ech; i++)
            r->ech[i].finished = true; /* nothing to abort at the end */
        pthread_mutex_unlock(&srv.eng_mu);
        return 400;
    }
    pthread_mutex_lock(&srv.out_mu);
    for (int i = 0; i < r->n_ech; i++) {
        srv.active[srv.n_active++] = &r->ech[i];
        srv.prompt_tokens += ins[i].n;
    }
    pthread_mutex_unlock(&srv.out_mu);
    pthread_cond_signal(&srv.eng_cv);
    pthread_mutex_unlock(&srv.eng_mu);
    return 0;
}

static const char B64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *srv_base64(const unsigned char *b, size_t n) {
    char *o = malloc((n + 2) / 3 * 4 + 1);
    if (!o)
        return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 |
                     (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < n ? b[i + 2] : 0);
        o[w++] = B64[x >> 18 & 63];
        o[w++] = B64[x >> 12 & 63];
        o[w++] = i + 1 < n ? B64[x >> 6 & 63] : '=';
        o[w++] = i + 2 < n ? B64[x & 63] : '=';
    }
    o[w] = 0;
    return o;
}

/* v's float32 bytes, little-endian, in base64 */
static json_t *base64_floats(const float *v, int64_t d) {
    size_t n = (size_t)d * 4;
    unsigned char *b = malloc(n ? n : 1);
    char *o = NULL;
    json_t *j = NULL;
    if (b) {
        for (int64_t i = 0; i < d; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++)
                b[4 * i + k] = (unsigned char)(u >> (8 * k));
        }
        if ((o = srv_base64(b, n)))
            j = json_string(o);
    }
    free(b), free(o);
    return j ? j : json_string("");
}

/* one vector, cut to d dimensions and made unit length again (OpenAI's
 * "dimensions") */
static json_t *embedding_json(float *v, int64_t dim, int64_t d, bool b64) {
    if (d < dim) {
        double sq = 0;
        for (int64_t i = 0; i < d; i++)
            sq += (double)v[i] * v[i];
        double inv = sq > 0 ? 1 / sqrt(sq) : 0;
        for (int64_t i = 0; i < d; i++)
            v[i] = (float)(v[i] * inv);
    }
    if (b64)
        return base64_floats(v, d);
    json_t *a = json_array();
    for (int64_t i = 0; i < d; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

/* every input's vector, once all are in */
static enum MHD_Result respond(struct MHD_Connection *c, hreq *r, int64_t d,
                               bool b64) {
    pthread_mutex_lock(&srv.out_mu);
    bool done = srv_wait_finished(c, r->ech, r->n_ech);
    pthread_mutex_unlock(&srv.out_mu);
    if (!done) { /* the client left: its inputs are aborted */
        r->status = 499;
        return MHD_NO;
    }
    json_t *data = json_array();
    int64_t tokens = 0;
    for (int i = 0; i < r->n_ech; i++) {
        choice *e = &r->ech[i];
        tokens += e->prompt_tokens;
        if (!e->embedding || e->dim < d) {
            json_decref(data);
            return srv_send_error(
                c, 500, "server_error", NULL, NULL,
                "input[%d]: the engine gave no embedding (finish: %s)", i,
                e->finish_reason ? e->finish_reason : "none");
        }
        json_array_append_new(
            data, json_pack("{s:s, s:i, s:o}", "object", "embedding", "index",
                            i, "embedding",
                            embedding_json(e->embedding, e->dim, d, b64)));
    }
    return srv_send_json(c, 200,
                         json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object",
                                   "list", "data", data, "model", srv.model,
                                   "usage", "prompt_tokens", (json_int_t)tokens,
                                   "total_tokens", (json_int_t)tokens));
}

/* "encoding_format" and "dimensions"; false with the error sent */
static bool parse_format(struct MHD_Connection *c, json_t *b, bool *b64,
                         int64_t *d, enum MHD_Result *ret) {
    json_t *f = json_object_get(b, "encoding_format");
    const char *fs = json_string_value(f);
    if (f && !json_is_null(f) &&
        (!fs || (strcmp(fs, "float") && strcmp(fs, "base64")))) {
        *ret = bad(c, "encoding_format", ": must be \"float\" or \"base64\"");
        return false;
    }
    *b64 = fs && !strcmp(fs, "base64");
    int64_t hidden = ts_lm_config(srv.lm)->hidden;
    *d = hidden;
    json_t *dv = json_object_get(b, "dimensions");
    if (dv && !json_is_null(dv)) {
        if (!json_is_integer(dv) || json_integer_value(dv) < 1 ||
            json_integer_value(dv) > hidden) {
            *ret = srv_send_error(c, 400, "invalid_request_error", "dimensions",
                                  "invalid_value",
                                  "dimensions: an integer in 1..%lld (this "
                                  "model's hidden size)",
                                  (long long)hidden);
            return false;
        }
        *d = json_integer_value(dv);
    }
    json_t *m = json_object_get(b, "model");
    if (m && !json_is_null(m) &&
        (!json_is_string(m) || strcmp(json_string_value(m), srv.model))) {
        *ret = srv_send_error(
            c, 404, "invalid_request_error", "model", "model_not_found",
            "The model `%s` does not exist (this server "
            "serves `%s`)",
            json_is_string(m) ? json_string_value(m) : "?", srv.model);
        return false;
    }
    return true;
}

enum MHD_Result srv_embeddings(struct MHD_Connection *c, hreq *r) {
    json_error_t je;
    json_t *b = json_loadb(r->body.p ? r->body.p : "", r->body.n,
                           JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(b)) {
        bool parsed = b != NULL;
        json_decref(b);
        return srv_send_error(c, 400, "invalid_request_error", NULL, NULL,
                              parsed ? "the body must be a JSON object"
                                     : "the body is not valid JSON: %s",
                              je.text);
    }
    bool b64 = false;
    int64_t d = 0;
    enum MHD_Result ret;
    input *ins = NULL;
    int n_in = 0;
    char err[600];
    if (!parse_format(c, b, &b64, &d, &ret))
        goto out;
    if (parse_input(json_object_get(b, "input"), &ins, &n_in, err,
                    sizeof err)) {
        ret = bad(c, "input", err);
        goto out;
    }
    for (int i = 0; i < n_in; i++)
        if ((int64_t)ins[i].n > srv.max_positions) {
            ret = srv_send_error(c, 400, "invalid_request_error", "input",
                                 "context_length_exceeded",
                                 "input[%d]: %zu tokens; this model's "
                                 "maximum context length is %lld",
                                 i, ins[i].n, (long long)srv.max_positions);
            goto out;
        }
    r->embed = true;
    r->ech = calloc((size_t)n_in, sizeof *r->ech);
    if (!r->ech) {
        ret = srv_send_error(c, 500, "server_error", NULL, NULL,
                             "out of memory for %d inputs", n_in);
        goto out;
    }
    r->n_ech = n_in;
    static uint64_t counter;
    snprintf(
        r->id, sizeof r->id, "embd-%lx%x%llx", (long)time(NULL),
        (unsigned)getpid(),
        (unsigned long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->t_start = srv_now();
    int st = add_all(r, ins, err, sizeof err);
    if (st) {
        ret = st == 400 ? srv_send_error(c, 400, "invalid_request_error",
                                         "input", NULL, "%s", err)
                        : srv_send_error(c, st, "server_error", NULL, NULL,
                                         "%s", err);
        goto out;
    }
    ret = respond(c, r, d, b64);
out:
    inputs_free(ins, n_in);
    json_decref(b);
    return ret;
}

void srv_embed_deliver(choice *c, ts_engine_output *o) {
    c->prompt_tokens = o->prompt_tokens;
    c->cached = o->cached_tokens;
    if (o->finish == TS_FINISH_NONE)
        return; /* a generated token (an engine without pooling): wait */
    free(c->embedding);
    c->embedding = o->embedding, c->dim = o->dim;
    o->embedding = NULL;
    c->finished = true;
    c->finish_reason = c->embedding                    ? "stop"
                       : o->finish == TS_FINISH_LENGTH ? "length"
                                                       : "abort";
    srv_active_remove(c);
}

void srv_embed_free(hreq *r) {
    int64_t ids[64];
    int n = 0;
    bool more = true;
    while (more) { /* in bounded batches: no lock held across the engine's */
        more = false, n = 0;
        pthread_mutex_lock(&srv.out_mu);
        for (int i = 0; i < r->n_ech; i++)
            if (!r->ech[i].finished) {
                if (n == 64) {
                    more = true;
                    break;
                }
                ids[n++] = r->ech[i].eid;
                r->ech[i].finished = true;
                srv_active_remove(&r->ech[i]);
            }
        pthread_mutex_unlock(&srv.out_mu);
        if (n) {
            srv_eng_lock();
            for (int i = 0; i < n; i++)
                if (ts_engine_abort(srv.eng, ids[i]) != TS_OK)
                    ts_clear_error(srv.ctx);
            pthread_mutex_unlock(&srv.eng_mu);
        }
    }
    for (int i = 0; i < r->n_ech; i++)
        free(r->ech[i].embedding);
    free(r->ech);
    r->ech = NULL, r->n_ech = 0;
}
