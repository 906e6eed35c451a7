/* images.c — `tessera serve DIR` when DIR is a Diffusers pipeline: OpenAI's
 * images API (POST /v1/images/generations: prompt, n, size,
 * response_format b64_json; for a class-conditional model the prompt
 * names the class) with /health, /v1/models and /metrics. The text
 * endpoints answer that this model draws images. One generation runs at
 * a time (the pipeline is not shared between threads); other requests —
 * health, bad requests, the metrics — are answered while it runs. */
#include "server_internal.h"

#include "tessera_diffusion.h"
#include "tessera_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IMG_MAX_BODY (1 << 20)

static struct {
    ts_ctx *ctx;
    ts_pipeline *pipe;
    pthread_mutex_t mu; /* the pipeline and its context */
    char model[256];
    const char *api_key;
    int default_steps;
    uint64_t images, requests, failed;
    double seconds;
} img;

typedef struct {
    ts_sbuf body;
    bool too_big, unauthorized;
} ireq;

bool srv_is_pipeline(const char *model_dir) {
    char p[2048];
    struct stat sb;
    snprintf(p, sizeof p, "%s/model_index.json", model_dir);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void on_signal(int sig) {
    srv_signal = sig;
}

static enum MHD_Result health(struct MHD_Connection *c) {
    return srv_send_text(c, 200, "application/json", "{\"status\":\"ok\"}");
}

static enum MHD_Result models(struct MHD_Connection *c) {
    return srv_send_json(c, 200,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object",
                                   "list", "data", "id", img.model, "object",
                                   "model", "created", (json_int_t)0,
                                   "owned_by", "tessera"));
}

static enum MHD_Result metrics(struct MHD_Connection *c) {
    char buf[1024];
    pthread_mutex_lock(&img.mu);
    snprintf(buf, sizeof buf,
             "# HELP tessera:image_requests_total Image generation requests.\n"
             "# TYPE tessera:image_requests_total counter\n"
             "tessera:image_requests_total %llu\n"
             "# HELP tessera:image_requests_failed_total Requests that "
             "failed.\n"
             "# TYPE tessera:image_requests_failed_total counter\n"
             "tessera:image_requests_failed_total %llu\n"
             "# HELP tessera:images_generated_total Images drawn.\n"
             "# TYPE tessera:images_generated_total counter\n"
             "tessera:images_generated_total %llu\n"
             "# HELP tessera:image_generation_seconds_total Time spent "
             "drawing.\n"
             "# TYPE tessera:image_generation_seconds_total counter\n"
             "tessera:image_generation_seconds_total %.3f\n",
             (unsigned long long)img.requests, (unsigned long long)img.failed,
             (unsigned long long)img.images, img.seconds);
    pthread_mutex_unlock(&img.mu);
    return srv_send_text(c, 200, "text/plain; version=0.0.4", buf);
}

static enum MHD_Result bad(struct MHD_Connection *c, const char *param,
                           const char *msg) {
    return srv_send_error(c, 400, "invalid_request_error", param, NULL, "%s",
                          msg);
}

/* one image (C, H, W) in [0, 1] as a base64 PNG */
static json_t *png_b64(ts_ctx *ctx, ts_tensor *one) {
    unsigned char *png = NULL;
    size_t n = 0;
    if (ts_png_encode(ctx, one, &png, &n))
        return NULL;
    char *b = srv_base64(png, n);
    free(png);
    json_t *j = b ? json_pack("{s:s}", "b64_json", b) : NULL;
    free(b);
    return j;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* POST /v1/images/generations */
static enum MHD_Result generations(struct MHD_Connection *c, ireq *r) {
    json_error_t je;
    json_t *b = json_loadb(r->body.p ? r->body.p : "", r->body.n, 0, &je);
    if (!b || !json_is_object(b)) {
        char msg[300];
        snprintf(msg, sizeof msg, "the body is not a JSON object (%s)",
                 b ? "another JSON value" : je.text);
        json_decref(b);
        return bad(c, NULL, msg);
    }
    enum MHD_Result ret;
    char msg[512];
    const char *prompt = json_string_value(json_object_get(b, "prompt"));
    json_t *jn = json_object_get(b, "n"), *js = json_object_get(b, "size");
    json_t *jf = json_object_get(b, "response_format");
    json_t *jseed = json_object_get(b, "seed");
    json_t *jsteps = json_object_get(b, "num_inference_steps");
    json_t *jg = json_object_get(b, "guidance_scale");
    json_t *jneg = json_object_get(b, "negative_prompt");
    ts_diffusion_request q = {.guidance = 7.5, .class_id = -1};
    if (!prompt || !*prompt) {
        ret = bad(c, "prompt", "prompt: a non-empty string is required");
        goto out;
    }
    if (jn && !json_is_null(jn) &&
        (!json_is_integer(jn) || json_integer_value(jn) < 1 ||
         json_integer_value(jn) > 10)) {
        ret = bad(c, "n", "n: an integer from 1 to 10");
        goto out;
    }
    q.num_images = jn && json_is_integer(jn) ? (int)json_integer_value(jn) : 1;
    if (jf && !json_is_null(jf)) {
        const char *f = json_string_value(jf);
        if (!f || strcmp(f, "b64_json")) {
            ret = bad(c, "response_format",
                      "response_format: only \"b64_json\" is served (this "
                      "server keeps no files to link to)");
            goto out;
        }
    }
    if (js && !json_is_null(js)) {
        const char *s = json_string_value(js);
        char x;
        if (!s || sscanf(s, "%d%c%d", &q.width, &x, &q.height) != 3 ||
            x != 'x' || q.width < 1 || q.height < 1) {
            ret = bad(c, "size", "size: \"WIDTHxHEIGHT\", e.g. \"512x512\"");
            goto out;
        }
    }
    if (jseed && !json_is_null(jseed)) {
        if (!json_is_integer(jseed) || json_integer_value(jseed) < 0) {
            ret = bad(c, "seed", "seed: a non-negative integer");
            goto out;
        }
        q.seed = (uint64_t)json_integer_value(jseed);
    } else {
        q.seed = (uint64_t)time(NULL);
    }
    q.steps = img.default_steps;
    if (jsteps && !json_is_null(jsteps)) {
        if (!json_is_integer(jsteps) || json_integer_value(jsteps) < 1 ||
            json_integer_value(jsteps) > 200) {
            ret = bad(c, "num_inference_steps",
                      "num_inference_steps: an integer from 1 to 200");
            goto out;
        }
        q.steps = (int)json_integer_value(jsteps);
    }
    if (jg && !json_is_null(jg)) {
        if (!json_is_number(jg) || json_number_value(jg) < 0 ||
            json_number_value(jg) > 100) {
            ret = bad(c, "guidance_scale", "guidance_scale: 0 to 100");
            goto out;
        }
        q.guidance = json_number_value(jg);
    }
    if (jneg && !json_is_null(jneg) && !json_is_string(jneg)) {
        ret = bad(c, "negative_prompt", "negative_prompt: a string");
        goto out;
    }
    q.negative_prompt = json_string_value(jneg);
    pthread_mutex_lock(&img.mu);
    img.requests++;
    ts_clear_error(img.ctx);
    ts_tensor *out = NULL;
    double t0 = now_s();
    bool ok = true;
    if (ts_pipeline_is_class_conditional(img.pipe)) {
        q.class_id = ts_pipeline_class_id(img.pipe, prompt);
        ok = q.class_id >= 0;
    } else {
        q.prompt = prompt;
    }
    ok = ok && ts_pipeline_generate(img.pipe, &q, &out) == TS_OK;
    json_t *data = ok ? json_array() : NULL;
    for (int64_t k = 0; ok && k < ts_tensor_dim(out, 0); k++) {
        ts_tensor *v = ts_slice(out, 0, k, k + 1, 1);
        ts_tensor *one = v ? ts_squeeze(v, 0) : NULL;
        json_t *e = one ? png_b64(img.ctx, one) : NULL;
        ts_release(v), ts_release(one);
        ok = e && json_array_append_new(data, e) == 0;
    }
    if (!ok) {
        snprintf(msg, sizeof msg, "%s", ts_errmsg(img.ctx));
        img.failed++;
    } else {
        img.images += (uint64_t)ts_tensor_dim(out, 0);
        img.seconds += now_s() - t0;
    }
    ts_status st = ts_ctx_status(img.ctx);
    ts_release(out);
    ts_clear_error(img.ctx);
    pthread_mutex_unlock(&img.mu);
    if (!ok) {
        json_decref(data);
        /* the request's own values at fault are 400s (a size the model
         * cannot draw names "size"); the rest 500 */
        int code =
            st == TS_ERR_INVALID_ARG || st == TS_ERR_SHAPE || st == TS_ERR_RANGE
                ? 400
                : 500;
        ret = srv_send_error(
            c, code, code == 400 ? "invalid_request_error" : "server_error",
            NULL, NULL, "%s", msg);
        goto out;
    }
    ret = srv_send_json(c, 200,
                        json_pack("{s:I, s:o}", "created",
                                  (json_int_t)time(NULL), "data", data));
out:
    json_decref(b);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)cls, (void)version;
    ireq *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r)))
            return MHD_NO;
        r->unauthorized =
            img.api_key && strcmp(method, "OPTIONS") &&
            strcmp(url, "/health") && strcmp(url, "/metrics") &&
            !ts_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                      "Authorization"),
                          img.api_key);
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size) {
        if (r->unauthorized)
            ;
        else if (r->body.n + *upload_size > IMG_MAX_BODY)
            r->too_big = true;
        else
            ts_sb_add(&r->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->unauthorized)
        return srv_send_error(c, 401, "invalid_request_error", NULL,
                              "invalid_api_key",
                              "a missing or wrong API key: send "
                              "\"Authorization: Bearer KEY\"");
    if (r->too_big)
        return srv_send_error(c, 413, "invalid_request_error", NULL, NULL,
                              "the body is larger than %d bytes", IMG_MAX_BODY);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get)
        return health(c);
    if (!strcmp(url, "/metrics") && get)
        return metrics(c);
    if (!strcmp(url, "/v1/models") && get)
        return models(c);
    if (!strcmp(url, "/v1/images/generations")) {
        if (!post)
            return srv_send_error(c, 405, "invalid_request_error", NULL, NULL,
                                  "%s is not allowed on %s (use POST)", method,
                                  url);
        return generations(c, r);
    }
    if (!strncmp(url, "/v1/", 4))
        return srv_send_error(c, 404, "invalid_request_error", NULL, NULL,
                              "%s is a diffusion pipeline: it serves POST "
                              "/v1/images/generations, not %s",
                              img.model, url);
    return srv_send_error(c, 404, "invalid_request_error", NULL, NULL,
                          "no endpoint %s %s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    ireq *r = *con_cls;
    if (r)
        free(r->body.p), free(r);
    *con_cls = NULL;
}

int srv_images_run(const ts_server_options *o) {
    memset(&img, 0, sizeof img);
    pthread_mutex_init(&img.mu, NULL);
    img.api_key = o->api_key && *o->api_key ? o->api_key : NULL;
    img.default_steps = 25;
    const char *base = strrchr(o->model_dir, '/');
    snprintf(img.model, sizeof img.model, "%s",
             o->model_name     ? o->model_name
             : base && base[1] ? base + 1
                               : o->model_dir);
    if (ts_ctx_new(&img.ctx, NULL) != TS_OK) {
        fprintf(stderr, "tessera serve: cannot create a context\n");
        return 1;
    }
    ts_set_grad_enabled(img.ctx, false);
    ts_pipeline_opts po = {.dtype = o->weight_dtype,
                           .device_map = o->device_map};
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    if (ts_pipeline_load(img.ctx, o->model_dir, &po, &img.pipe)) {
        fprintf(stderr, "tessera serve: %s\n", ts_errmsg(img.ctx));
        goto done;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) !=
        1) {
        fprintf(stderr, "tessera serve: bad --host \"%s\"\n", o->host);
        goto done;
    }
    errno = 0;
    d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
            MHD_USE_POLL | MHD_USE_ITC,
        (uint16_t)o->port, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(o->conn_timeout_s > 0 ? o->conn_timeout_s : 600),
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "tessera serve: cannot listen on %s:%d (%s)\n",
                o->host ? o->host : "127.0.0.1", o->port, strerror(errno));
        goto done;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    char desc[1024];
    ts_pipeline_describe(img.pipe, desc, sizeof desc);
    fprintf(stderr,
            "tessera serve: %s (a diffusion pipeline) on http://%s:%d: POST "
            "/v1/images/generations\n%s",
            img.model, o->host ? o->host : "127.0.0.1", port, desc);
    if (o->on_listen)
        o->on_listen(port, o->on_listen_arg);
    if (!o->no_signal_handlers) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
    }
    signal(SIGPIPE, SIG_IGN);
    while (!srv_signal)
        usleep(100000);
    MHD_quiesce_daemon(d);
    fprintf(stderr, "tessera serve: stopped\n");
    rc = 0;
done:
    if (d)
        MHD_stop_daemon(d);
    ts_pipeline_free(img.pipe);
    ts_ctx_free(img.ctx);
    pthread_mutex_destroy(&img.mu);
    return rc;
}
