/* harnesses.c — the fuzz entry points of harnesses.h: each parser fed the
 * bytes the way the runtime meets them (a file in a model folder, a shard
 * in a data folder, a request over loopback), and everything that loads
 * used once (tensors read, text encoded and decoded, a template rendered,
 * a batch drawn). Owns only the scratch folder and the in-process server;
 * the parsers are the library's. fuzz_router_events is in router_events.c
 * (it needs router.c's static stream reader). */
#define _GNU_SOURCE
#include "harnesses.h"

#include "server/prompt.h"
#include "tessera.h"
#include "tessera_gguf.h"
#include "tessera_io.h"
#include "tessera_models.h"
#include "tessera_server.h"
#include "tessera_tokenizer.h"
#include "tessera_train.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_work[900];  /* scratch folder */
static char g_model[900]; /* the tiny model folder, "" when none */
static ts_ctx *g_ctx;

void fuzz_fail(const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz %s: ", what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void make_dir(const char *path) {
    if (mkdir(path, 0755) && errno != EEXIST)
        fuzz_fail("setup", "cannot make %s: %s", path, strerror(errno));
}

void fuzz_setup(const char *work_dir, const char *model_dir) {
    snprintf(g_work, sizeof g_work, "%s", work_dir);
    make_dir(g_work);
    /* absolute: cfg/ links to its weights */
    char *abs = model_dir ? realpath(model_dir, NULL) : NULL;
    if (model_dir && !abs)
        fuzz_fail("setup", "no model folder %s: %s", model_dir,
                  strerror(errno));
    snprintf(g_model, sizeof g_model, "%s", abs ? abs : "");
    free(abs);
    if (!g_ctx && ts_ctx_new(&g_ctx, NULL) != TS_OK)
        fuzz_fail("setup", "no context");
    ts_set_grad_enabled(g_ctx, false);
    static const char *dirs[] = {"cfg", "tok", "chat", "shards"};
    char p[1000];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", g_work, dirs[i]);
        make_dir(p);
    }
    if (*g_model) { /* cfg/: the tiny model's weights under a fuzzed config */
        char src[1000];
        snprintf(src, sizeof src, "%s/model.safetensors", g_model);
        snprintf(p, sizeof p, "%s/cfg/model.safetensors", g_work);
        unlink(p);
        if (symlink(src, p))
            fuzz_fail("setup", "cannot link %s: %s", p, strerror(errno));
    }
}

/* writes data to g_work/name; the path in a static buffer */
static const char *put_file(const char *name, const uint8_t *data,
                            size_t size) {
    static char path[1000];
    snprintf(path, sizeof path, "%s/%s", g_work, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f))
        fuzz_fail("setup", "cannot write %s", path);
    return path;
}

/* the one error contract every parser shares: TS_OK, or a message */
static void check_status(const char *what, ts_status s) {
    if (s != TS_OK && !ts_errmsg(g_ctx)[0])
        fuzz_fail(what, "status %s without a message", ts_status_name(s));
    ts_clear_error(g_ctx);
}

/* ---- safetensors: every tensor of a file that opens is read whole ---- */

int fuzz_safetensors(const uint8_t *data, size_t size) {
    const char *path = put_file("fuzz.safetensors", data, size);
    ts_safetensors *st = NULL;
    ts_status s = ts_safetensors_open(g_ctx, path, &st);
    check_status("safetensors", s);
    if (!st)
        return 0;
    (void)ts_safetensors_metadata(st, "format");
    for (int k = 0; k < ts_safetensors_count(st); k++) {
        const char *name = ts_safetensors_name(st, k);
        ts_tensor *t = ts_safetensors_get(st, name);
        if (!t)
            fuzz_fail("safetensors", "tensor %d (%s) listed but not got", k,
                      name ? name : "(null)");
        int64_t numel = ts_tensor_numel(t);
        size_t bytes = (size_t)numel * ts_dtype_size(ts_tensor_dtype(t));
        if (numel < 0 || bytes > size)
            fuzz_fail("safetensors",
                      "tensor %s of %lld elements (%zu bytes) "
                      "in a file of %zu bytes",
                      name, (long long)numel, bytes, size);
        float *tmp = malloc(sizeof(float) * ((size_t)numel + 1));
        if (tmp) /* touch every byte: the bounds were checked */
            check_status("safetensors", ts_tensor_read(t, tmp, TS_F32));
        free(tmp);
        ts_release(t);
    }
    ts_safetensors_close(st);
    return 0;
}

static const char *const TEXTS[3];

/* ---- GGUF: every key read by its type, every array element (the first
 * 4096 and the last), every tensor got and its bytes touched ---- */

static void gguf_read_kv(ts_gguf *g, int64_t i, size_t size) {
    const char *k = ts_gguf_kv_key(g, i);
    ts_gguf_type t = ts_gguf_kv_type(g, i);
    uint64_t u, n = 0;
    int64_t s;
    double f;
    bool b;
    const char *str;
    size_t len;
    (void)ts_gguf_get_u64(g, k, &u), (void)ts_gguf_get_i64(g, k, &s);
    (void)ts_gguf_get_u32(g, k, NULL), (void)ts_gguf_get_f64(g, k, &f);
    (void)ts_gguf_get_bool(g, k, &b);
    if (t == TS_GGUF_STRING) {
        check_status("gguf", ts_gguf_get_string(g, k, &str, &len));
        if (strlen(str) > len)
            fuzz_fail("gguf", "string of key %s longer than its length", k);
    }
    ts_gguf_type et;
    if (ts_gguf_get_array(g, k, &et, &n) != TS_OK) {
        ts_clear_error(g_ctx);
        return;
    }
    if (n > size) /* an element takes a byte at least */
        fuzz_fail("gguf", "array %s of %llu elements in a smaller file", k,
                  (unsigned long long)n);
    for (uint64_t e = 0; e < n; e = e == 4095 && n > 4097 ? n - 1 : e + 1) {
        if (et == TS_GGUF_STRING)
            check_status("gguf", ts_gguf_array_string(g, k, e, &str, &len));
        else {
            (void)ts_gguf_array_int(g, k, e, &s);
            (void)ts_gguf_array_f64(g, k, e, &f);
        }
    }
    ts_clear_error(g_ctx);
}

/* the Hugging Face view: the config and tokenizer texts loaded as a
 * folder's would be, every tensor under its Hugging Face name got */
static void gguf_as_hf(ts_gguf *g, const char *path) {
    char *j = NULL;
    ts_status s = ts_gguf_hf_config_json(g_ctx, g, &j);
    check_status("gguf", s);
    ts_model_config c;
    if (j)
        check_status("gguf", ts_config_from_json_text(g_ctx, j, path, &c));
    free(j), j = NULL;
    s = ts_gguf_hf_tokenizer_json(g_ctx, g, &j);
    check_status("gguf", s);
    ts_tokenizer *tok = NULL;
    if (j)
        check_status("gguf",
                     ts_tokenizer_load_text(g_ctx, j, strlen(j), path, &tok));
    if (tok) {
        int32_t *ids = NULL;
        size_t n = 0;
        check_status("gguf",
                     ts_tokenizer_encode_text(tok, TEXTS[0], strlen(TEXTS[0]),
                                              true, &ids, &n));
        free(ids);
        ts_tokenizer_free(tok);
    }
    free(j), j = NULL;
    check_status("gguf", ts_gguf_hf_tokenizer_config_json(g_ctx, g, &j));
    free(j), j = NULL;
    check_status("gguf", ts_gguf_hf_generation_config_json(g_ctx, g, &j));
    free(j);
    ts_safetensors *st = NULL;
    check_status("gguf", ts_gguf_open_as_safetensors(g_ctx, path, &st));
    for (int k = 0; st && k < ts_safetensors_count(st); k++) {
        const char *name = ts_safetensors_name(st, k);
        ts_tensor *t = ts_safetensors_get(st, name);
        if (!t)
            fuzz_fail("gguf", "view tensor %s listed but not got", name);
        check_status("gguf", ts_safetensors_check_finite(st, name));
        const unsigned char *p = ts_tensor_data(t);
        int64_t nb = ts_dtype_nbytes(ts_tensor_dtype(t), ts_tensor_numel(t));
        unsigned sum = 0;
        for (int64_t b = 0; p && b < nb; b++)
            sum += p[b];
        (void)sum;
        ts_release(t);
    }
    ts_safetensors_close(st);
}

int fuzz_gguf(const uint8_t *data, size_t size) {
    const char *path = put_file("fuzz.gguf", data, size);
    ts_gguf *g = NULL;
    check_status("gguf", ts_gguf_open(g_ctx, path, &g));
    if (!g)
        return 0;
    for (int64_t i = 0; i < ts_gguf_kv_count(g); i++)
        gguf_read_kv(g, i, size);
    for (int64_t i = 0; i < ts_gguf_tensor_count(g); i++) {
        const char *name = ts_gguf_tensor_name(g, i);
        uint64_t nb = ts_gguf_tensor_nbytes(g, i);
        if (ts_gguf_tensor_file_offset(g, i) + nb > size)
            fuzz_fail("gguf",
                      "tensor %s of %llu bytes past the %zu-byte "
                      "file",
                      name, (unsigned long long)nb, size);
        ts_tensor *t = ts_gguf_tensor(g, name);
        check_status("gguf", t ? TS_OK : ts_ctx_status(g_ctx));
        if (!t)
            continue;
        ts_dtype dt = ts_tensor_dtype(t);
        if ((uint64_t)ts_dtype_nbytes(dt, ts_tensor_numel(t)) != nb)
            fuzz_fail("gguf", "tensor %s: %lld %s elements in %llu bytes", name,
                      (long long)ts_tensor_numel(t), ts_dtype_name(dt),
                      (unsigned long long)nb);
        const unsigned char *p = ts_tensor_data(t);
        unsigned sum = 0; /* every byte touched: the bounds were checked */
        for (uint64_t k = 0; p && k < nb; k++)
            sum += p[k];
        (void)sum;
        if (!ts_dtype_is_quantized(dt)) {
            float *tmp =
                malloc(sizeof(float) * ((size_t)ts_tensor_numel(t) + 1));
            if (tmp)
                check_status("gguf", ts_tensor_read(t, tmp, TS_F32));
            free(tmp);
        }
        ts_release(t);
    }
    gguf_as_hf(g, path);
    ts_gguf_close(g);
    return 0;
}

/* ---- config.json: parsed, then the tiny model's weights loaded under it
 * (a config that disagrees with the weights is an error, not a crash) ---- */

int fuzz_config(const uint8_t *data, size_t size) {
    if (!*g_model)
        return 0;
    const char *path = put_file("cfg/config.json", data, size);
    ts_model_config c;
    ts_status s = ts_config_load(g_ctx, path, &c);
    check_status("config", s);
    if (s != TS_OK)
        return 0;
    char dir[1000];
    snprintf(dir, sizeof dir, "%s/cfg", g_work);
    ts_load_options lo = {.weight_dtype = TS_F32};
    ts_lm *lm = NULL;
    check_status("config", ts_lm_load(g_ctx, dir, &lo, &lm));
    ts_lm_free(lm);
    return 0;
}

/* ---- tokenizer.json: loaded, then a few texts encoded and decoded ---- */

static const char *const TEXTS[3] = {
    "Hello, world! 123",
    "<|endoftext|> caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87\n\n  x\t's",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>",
};

int fuzz_tokenizer(const uint8_t *data, size_t size) {
    const char *path = put_file("tok/tokenizer.json", data, size);
    ts_tokenizer *tok = NULL;
    check_status("tokenizer", ts_tokenizer_load(g_ctx, path, &tok));
    if (!tok)
        return 0;
    int32_t V = ts_tokenizer_vocab_size(tok);
    (void)ts_tokenizer_token_id(tok, "Hello");
    for (size_t t = 0; t < sizeof TEXTS / sizeof *TEXTS; t++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ts_status s = ts_tokenizer_encode(tok, TEXTS[t], strlen(TEXTS[t]),
                                          t == 0, &ids, &n);
        check_status("tokenizer", s);
        if (s != TS_OK)
            continue;
        char *back = NULL;
        size_t bl = 0;
        s = ts_tokenizer_decode(tok, ids, n, t == 1, &back, &bl);
        check_status("tokenizer", s);
        free(back), free(ids);
    }
    /* every id the vocabulary claims, and the ones just past it */
    int32_t some[8] = {0, 1, V - 1, V, V + 1, -1, V / 2, 2};
    char *back = NULL;
    size_t bl = 0;
    check_status("tokenizer",
                 ts_tokenizer_decode(tok, some, 8, false, &back, &bl));
    free(back);
    ts_tokenizer_free(tok);
    return 0;
}

/* ---- tokenizer_config.json and chat templates ---- */

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi <b>1+1</b>?\"},"
    " {\"role\": \"assistant\", \"content\": \"2\", \"reasoning_content\":"
    " \"easy\", \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 1}}}]},"
    " {\"role\": \"tool\", \"content\": \"2\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\":"
    " \"again\"}]}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\","
    " \"eos_token\": \"</s>\", \"enable_thinking\": false,"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\","
    " \"description\": \"adds\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]}";

int fuzz_tokenizer_config(const uint8_t *data, size_t size) {
    put_file("chat/tokenizer_config.json", data, size);
    char dir[1000];
    snprintf(dir, sizeof dir, "%s/chat", g_work);
    ts_chat *chat = NULL;
    check_status("tokenizer_config", ts_chat_load(g_ctx, dir, &chat));
    if (!chat)
        return 0;
    (void)ts_chat_bos_token(chat), (void)ts_chat_eos_token(chat);
    json_t *vars = json_loads(VARS, 0, NULL);
    char *msgs = json_dumps(json_object_get(vars, "messages"), 0);
    char *out = NULL;
    size_t len = 0;
    ts_status s = ts_chat_apply(chat, msgs, true, "{\"enable_thinking\": true}",
                                &out, &len);
    check_status("tokenizer_config", s);
    free(out), free(msgs);
    json_decref(vars);
    ts_chat_free(chat);
    return 0;
}

int fuzz_chat_template(const uint8_t *data, size_t size) {
    ts_template *t = NULL;
    check_status("chat_template",
                 ts_template_parse(g_ctx, (const char *)data, size, &t));
    if (!t)
        return 0;
    char *out = NULL;
    size_t len = 0;
    check_status("chat_template",
                 ts_template_render(g_ctx, t, VARS, &out, &len));
    free(out);
    ts_template_free(t);
    return 0;
}

/* ---- token shards: opened and read whole, then a loader over the folder
 * draws a few batches ---- */

int fuzz_token_shard(const uint8_t *data, size_t size) {
    const char *path = put_file("shards/train_000.bin", data, size);
    ts_shard *sh = NULL;
    check_status("token_shard", ts_shard_open(g_ctx, path, &sh));
    if (sh) {
        uint64_t n = ts_shard_count(sh);
        if (n > size)
            fuzz_fail("token_shard", "%llu tokens in a file of %zu bytes",
                      (unsigned long long)n, size);
        int64_t sum = 0;
        for (uint64_t i = 0; i < n; i++)
            sum += ts_shard_token(sh, i);
        (void)sum;
        ts_shard_close(sh);
    }
    char dir[1000];
    snprintf(dir, sizeof dir, "%s/shards", g_work);
    ts_loader *l = NULL;
    check_status("token_shard",
                 ts_loader_open(g_ctx, dir, "train", 4, 7, true, &l));
    if (!l)
        return 0;
    int64_t ids[2 * 4], targets[2 * 4];
    for (int b = 0; b < 3; b++)
        check_status("token_shard", ts_loader_next(l, 2, 0, 1, ids, targets));
    ts_loader_seek(l, 1);
    check_status("token_shard", ts_loader_next(l, 2, 1, 2, ids, targets));
    ts_loader_free(l);
    return 0;
}

/* ---- OpenAI request bodies, straight to ts_openai_prompt (the part both
 * the server and the router run) with the tiny model's tokenizer and chat
 * template ---- */

static ts_tokenizer *g_tok;
static ts_chat *g_chat;

static bool load_tiny_tokenizer(void) {
    if (g_tok)
        return true;
    if (!*g_model)
        return false;
    if (ts_tokenizer_load(g_ctx, g_model, &g_tok) != TS_OK)
        fuzz_fail("setup", "%s", ts_errmsg(g_ctx));
    if (ts_chat_load(g_ctx, g_model, &g_chat) != TS_OK)
        fuzz_fail("setup", "%s", ts_errmsg(g_ctx));
    return true;
}

int fuzz_openai_prompt(const uint8_t *data, size_t size) {
    if (!load_tiny_tokenizer())
        return 0;
    json_t *body = json_loadb((const char *)data, size, 0, NULL);
    if (!json_is_object(body)) { /* the server answers 400 before this */
        json_decref(body);
        return 0;
    }
    bool chat = json_object_get(body, "messages") != NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    ts_prompt_error pe = {0};
    int rc =
        ts_openai_prompt(g_tok, g_chat, g_ctx, NULL, body, chat, &ids, &n, &pe);
    if (rc && (pe.status < 400 || pe.status > 499 || !pe.msg[0]))
        fuzz_fail("openai_prompt", "refused with status %d, message \"%s\"",
                  pe.status, pe.msg);
    if (!rc)
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= ts_tokenizer_vocab_size(g_tok))
                fuzz_fail("openai_prompt",
                          "id %d at %zu outside the "
                          "vocabulary",
                          ids[i], i);
    free(ids);
    json_decref(body);
    return 0;
}

/* ---- HTTP bodies through an in-process `tessera serve` on a loopback
 * port: any body gets a 2xx or a 4xx, never a 5xx, a dropped connection or
 * a hang (60 s) ---- */

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port; /* 0 until listening, -1 when the server failed */
    bool started;
    ts_server_options o;
    CURL *curl;
} H = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void on_listen(int port, void *arg) {
    (void)arg;
    pthread_mutex_lock(&H.mu);
    H.port = port;
    pthread_cond_broadcast(&H.cv);
    pthread_mutex_unlock(&H.mu);
}

static void *server_thread(void *arg) {
    (void)arg;
    int rc = ts_server_run(&H.o);
    pthread_mutex_lock(&H.mu);
    if (!H.port)
        H.port = -1;
    pthread_cond_broadcast(&H.cv);
    pthread_mutex_unlock(&H.mu);
    return (void *)(intptr_t)rc;
}

static size_t discard(char *p, size_t sz, size_t n, void *u) {
    (void)p, (void)u;
    return sz * n;
}

static bool start_server(void) {
    if (H.started)
        return H.port > 0;
    if (!*g_model)
        return false;
    H.started = true;
    H.o = (ts_server_options){.model_dir = g_model,
                              .model_name = "tiny",
                              .host = "127.0.0.1",
                              .port = 0,
                              .weight_dtype = TS_F32,
                              .engine = ts_engine_options_default(),
                              .kv_port = -1,
                              .on_listen = on_listen};
    H.o.engine.n_blocks = 64;
    if (pthread_create(&H.thread, NULL, server_thread, NULL))
        fuzz_fail("http_body", "cannot start the server thread");
    pthread_mutex_lock(&H.mu);
    while (!H.port)
        pthread_cond_wait(&H.cv, &H.mu);
    pthread_mutex_unlock(&H.mu);
    if (H.port < 0)
        fuzz_fail("http_body", "the server did not start on %s", g_model);
    /* on_listen runs just before the server installs its SIGTERM handler,
     * which fuzz_teardown raises */
    usleep(300000);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    H.curl = curl_easy_init();
    return H.curl != NULL;
}

int fuzz_http_body(const uint8_t *data, size_t size) {
    if (!start_server())
        return 0;
    /* a body that names messages goes where messages are read */
    bool chat = memmem(data, size, "\"messages\"", 10) != NULL;
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/%s", H.port,
             chat ? "chat/completions" : "completions");
    CURL *c = H.curl;
    curl_easy_reset(c);
    struct curl_slist *hdr =
        curl_slist_append(NULL, "Content-Type: application/json");
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)data);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)size);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hdr);
    if (cc != CURLE_OK || code < 200 || code >= 500)
        fuzz_fail("http_body", "POST %s: %s (HTTP %ld)", url,
                  cc != CURLE_OK ? err : "answered", code);
    return 0;
}

void fuzz_teardown(void) {
    if (H.started && H.port > 0) {
        raise(SIGTERM); /* the server's handler: drain and return */
        pthread_join(H.thread, NULL);
        curl_easy_cleanup(H.curl);
        curl_global_cleanup();
    }
    memset(&H.o, 0, sizeof H.o);
    H.started = false, H.port = 0, H.curl = NULL;
    ts_chat_free(g_chat), ts_tokenizer_free(g_tok);
    g_chat = NULL, g_tok = NULL;
    ts_ctx_free(g_ctx);
    g_ctx = NULL;
}

const fuzz_harness fuzz_harnesses[] = {
    {"safetensors", fuzz_safetensors, 0},
    {"gguf", fuzz_gguf, 0},
    {"config", fuzz_config, 1},
    {"tokenizer", fuzz_tokenizer, 0},
    {"tokenizer_config", fuzz_tokenizer_config, 0},
    {"chat_template", fuzz_chat_template, 0},
    {"token_shard", fuzz_token_shard, 0},
    {"router_events", fuzz_router_events, 0},
    {"openai_prompt", fuzz_openai_prompt, 1},
    {"http_body", fuzz_http_body, 1},
};
const int fuzz_n_harnesses = sizeof fuzz_harnesses / sizeof *fuzz_harnesses;

const fuzz_harness *fuzz_find(const char *name) {
    for (int i = 0; i < fuzz_n_harnesses; i++)
        if (!strcmp(fuzz_harnesses[i].name, name))
            return &fuzz_harnesses[i];
    return NULL;
}
