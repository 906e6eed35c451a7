/* metrics.c — what the server tells about itself: /metrics in
 * Prometheus' text format (every family with HELP and TYPE), its own
 * tessera_* names (the router and the tests read them), vLLM's vllm:*
 * names with the model_name label (so vLLM's Grafana dashboards work)
 * and, with speculative decoding on, tessera:spec_decode_* (vLLM's
 * spec_decode names, same label), and a request's end: its latency, size and
 * finish-reason metrics and its one log line on stderr. The counters live in
 * srv (server_internal.h, out_mu); the engine's figures in srv.est. */
#define _GNU_SOURCE
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Prometheus text ---- */

static void family(ts_sbuf *b, const char *name, const char *type,
                   const char *help) {
    ts_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* lab: "" or the labels without braces (model_name="x") */
static void sample_u(ts_sbuf *b, const char *name, const char *lab,
                     unsigned long long v) {
    ts_sb_printf(b, "%s%s%s%s %llu\n", name, *lab ? "{" : "", lab,
                 *lab ? "}" : "", v);
}

static void sample_f(ts_sbuf *b, const char *name, const char *lab, double v) {
    ts_sb_printf(b, "%s%s%s%s %.6f\n", name, *lab ? "{" : "", lab,
                 *lab ? "}" : "", v);
}

static void one_u(ts_sbuf *b, const char *name, const char *type,
                  const char *help, const char *lab, unsigned long long v) {
    family(b, name, type, help);
    sample_u(b, name, lab, v);
}

static void one_f(ts_sbuf *b, const char *name, const char *type,
                  const char *help, const char *lab, double v) {
    family(b, name, type, help);
    sample_f(b, name, lab, v);
}

/* a histogram of nb bounds (h: nb + 1 counts, the last above them all) */
static void histogram(ts_sbuf *b, const char *name, const char *help,
                      const char *lab, const uint64_t *h, const double *bounds,
                      int nb, double sum) {
    family(b, name, "histogram", help);
    const char *sep = *lab ? "," : "";
    uint64_t cum = 0;
    for (int i = 0; i <= nb; i++) {
        cum += h[i];
        char le[32];
        if (i < nb)
            snprintf(le, sizeof le, "%g", bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        ts_sb_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, lab, sep, le,
                     (unsigned long long)cum);
    }
    ts_sb_printf(b, "%s_sum%s%s%s %.6f\n", name, *lab ? "{" : "", lab,
                 *lab ? "}" : "", sum);
    ts_sb_printf(b, "%s_count%s%s%s %llu\n", name, *lab ? "{" : "", lab,
                 *lab ? "}" : "", (unsigned long long)cum);
}

/* model_name="NAME" with Prometheus' escapes (\\, \", \n) */
static void model_label(char *out, size_t cap) {
    size_t k = snprintf(out, cap, "model_name=\"");
    for (const char *s = srv.model; *s && k + 4 < cap; s++) {
        if (*s == '\\' || *s == '"')
            out[k++] = '\\', out[k++] = *s;
        else if (*s == '\n')
            out[k++] = '\\', out[k++] = 'n';
        else
            out[k++] = *s;
    }
    snprintf(out + k, cap - k, "\"");
}

static void tessera_metrics(ts_sbuf *b) {
    static const int codes[7] = {200, 400, 401, 404, 405, 413, 500};
    const ts_engine_stats *e = &srv.est;
    family(b, "tessera_requests_total", "counter",
           "HTTP responses by status (500: any other)");
    for (int i = 0; i < 7; i++)
        ts_sb_printf(b, "tessera_requests_total{status=\"%d\"} %llu\n",
                     codes[i], (unsigned long long)srv.status_count[i]);
    one_u(b, "tessera_prompt_tokens_total", "counter",
          "prompt tokens of the requests admitted", "", srv.prompt_tokens);
    one_u(b, "tessera_generation_tokens_total", "counter", "tokens generated",
          "", srv.generated_tokens);
    one_u(b, "tessera_requests_running", "gauge",
          "engine requests being computed", "", (unsigned long long)e->running);
    one_u(b, "tessera_requests_waiting", "gauge",
          "engine requests waiting for KV blocks or a batch slot", "",
          (unsigned long long)e->waiting);
    one_u(b, "tessera_kv_blocks_used", "gauge", "KV blocks held by requests",
          "", (unsigned long long)e->blocks_in_sequences);
    one_u(b, "tessera_kv_blocks_total", "gauge", "KV blocks in the pool", "",
          (unsigned long long)e->blocks_total);
    one_u(b, "tessera_kv_blocks_cached", "gauge",
          "KV blocks in the prefix cache", "",
          (unsigned long long)e->cached_blocks);
    one_f(b, "tessera_prefix_cache_hit_rate", "gauge",
          "prompt tokens found in the prefix cache / looked up", "",
          e->prompt_tokens
              ? (double)e->prefix_hit_tokens / (double)e->prompt_tokens
              : 0.0);
    one_u(b, "tessera_prefix_cache_queries_total", "counter",
          "prompt tokens looked up in the prefix cache", "",
          (unsigned long long)e->prompt_tokens);
    one_u(b, "tessera_prefix_cache_hits_total", "counter",
          "prompt tokens found in the prefix cache", "",
          (unsigned long long)e->prefix_hit_tokens);
    one_u(b, "tessera_kv_transfers_sent_total", "counter",
          "prefills whose KV blocks were sent to a decode server", "",
          srv.kvx_sent);
    one_u(b, "tessera_kv_transfers_send_failed_total", "counter",
          "prefills whose KV blocks could not be sent", "",
          srv.kvx_send_failed);
    one_u(b, "tessera_kv_transfers_received_total", "counter",
          "KV transfers taken from prefill servers", "", srv.kvx_received);
    one_u(b, "tessera_kv_transfers_refused_total", "counter",
          "KV connections refused (sender, size, geometry or busy)", "",
          srv.kvx_refused);
    one_u(b, "tessera_kv_blocks_sent_total", "counter", "KV blocks sent", "",
          srv.kvx_blocks_sent);
    one_u(b, "tessera_kv_blocks_adopted_total", "counter",
          "KV blocks received and adopted into the prefix cache", "",
          srv.kvx_blocks_adopted);
    histogram(b, "tessera_time_to_first_token_seconds",
              "seconds from a request's arrival to its first token", "",
              srv.ttft_hist, TTFT_B, N_TTFT, srv.ttft_sum);
    histogram(b, "tessera_inter_token_latency_seconds",
              "seconds between a request's consecutive tokens", "",
              srv.itl_hist, ITL_B, N_ITL, srv.itl_sum);
}

static void vllm_metrics(ts_sbuf *b, const char *m) {
    const ts_engine_stats *e = &srv.est;
    double usage = e->blocks_total ? (double)e->blocks_in_sequences /
                                         (double)e->blocks_total
                                   : 0.0;
    one_u(b, "vllm:num_requests_running", "gauge",
          "Number of requests in model execution batches.", m,
          (unsigned long long)e->running);
    one_u(b, "vllm:num_requests_waiting", "gauge",
          "Number of requests waiting to be processed.", m,
          (unsigned long long)e->waiting);
    one_f(b, "vllm:kv_cache_usage_perc", "gauge",
          "KV-cache usage. 1 means 100 percent usage.", m, usage);
    one_f(b, "vllm:gpu_cache_usage_perc", "gauge",
          "GPU KV-cache usage. 1 means 100 percent usage (the same as "
          "vllm:kv_cache_usage_perc).",
          m, usage);
    one_u(b, "vllm:num_preemptions_total", "counter",
          "Cumulative number of preemptions from the engine.", m,
          (unsigned long long)e->preemptions);
    one_u(b, "vllm:prompt_tokens_total", "counter",
          "Number of prefill tokens processed.", m, srv.prompt_tokens);
    one_u(b, "vllm:generation_tokens_total", "counter",
          "Number of generation tokens processed.", m, srv.generated_tokens);
    one_u(b, "vllm:prefix_cache_queries_total", "counter",
          "Prefix cache queries, in terms of number of queried tokens.", m,
          (unsigned long long)e->prompt_tokens);
    one_u(b, "vllm:prefix_cache_hits_total", "counter",
          "Prefix cache hits, in terms of number of cached tokens.", m,
          (unsigned long long)e->prefix_hit_tokens);
    static const char *reasons[3] = {"stop", "length", "abort"};
    family(b, "vllm:request_success_total", "counter",
           "Count of successfully processed requests.");
    for (int i = 0; i < 3; i++)
        ts_sb_printf(b,
                     "vllm:request_success_total{%s,finished_reason=\"%s\"} "
                     "%llu\n",
                     m, reasons[i], (unsigned long long)srv.finished[i]);
    histogram(b, "vllm:time_to_first_token_seconds",
              "Histogram of time to first token in seconds.", m, srv.ttft_hist,
              TTFT_B, N_TTFT, srv.ttft_sum);
    histogram(b, "vllm:inter_token_latency_seconds",
              "Histogram of inter-token latency in seconds.", m, srv.itl_hist,
              ITL_B, N_ITL, srv.itl_sum);
    histogram(b, "vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds (the same "
              "observations as vllm:inter_token_latency_seconds).",
              m, srv.itl_hist, ITL_B, N_ITL, srv.itl_sum);
    histogram(b, "vllm:e2e_request_latency_seconds",
              "Histogram of e2e request latency in seconds.", m, srv.e2e_hist,
              E2E_B, N_E2E, srv.e2e_sum);
    histogram(b, "vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", m,
              srv.queue_hist, E2E_B, N_E2E, srv.queue_sum);
    histogram(b, "vllm:request_prompt_tokens",
              "Number of prefill tokens processed.", m, srv.ptok_hist, NTOK_B,
              N_NTOK, srv.ptok_sum);
    histogram(b, "vllm:request_generation_tokens",
              "Number of generation tokens processed.", m, srv.gtok_hist,
              NTOK_B, N_NTOK, srv.gtok_sum);
}

/* speculative decoding, when it is on, in the colon form of vLLM's
 * spec_decode metrics: proposed and accepted tokens, the tokens the
 * verifications emitted (each one 1 + its accepted tokens), and the two
 * ratios (the mean accepted length is the step's speed-up bound) */
static void spec_metrics(ts_sbuf *b, const char *m) {
    const ts_engine_stats *e = &srv.est;
    if (srv.spec == TS_SPEC_NONE)
        return;
    int64_t emitted = e->spec_verifications + e->spec_accepted;
    one_f(b, "tessera:spec_decode_acceptance_rate", "gauge",
          "Speculative decoding: accepted / proposed tokens.", m,
          e->spec_proposed ? (double)e->spec_accepted / (double)e->spec_proposed
                           : 0.0);
    one_f(b, "tessera:spec_decode_mean_accepted_length", "gauge",
          "Speculative decoding: tokens emitted per verification (1 + the "
          "accepted ones; the bound on its speed-up).",
          m,
          e->spec_verifications
              ? (double)emitted / (double)e->spec_verifications
              : 0.0);
    one_u(b, "tessera:spec_decode_num_draft_tokens_total", "counter",
          "Speculative decoding: tokens proposed.", m,
          (unsigned long long)e->spec_proposed);
    one_u(b, "tessera:spec_decode_num_accepted_tokens_total", "counter",
          "Speculative decoding: proposed tokens accepted.", m,
          (unsigned long long)e->spec_accepted);
    one_u(b, "tessera:spec_decode_num_emitted_tokens_total", "counter",
          "Speculative decoding: tokens emitted by verifications (accepted "
          "ones and the model's own token after them).",
          m, (unsigned long long)emitted);
}

enum MHD_Result srv_metrics(struct MHD_Connection *c) {
    ts_sbuf b = {0};
    /* the engine's figures as of its last step; fresher when the engine is
     * idle (a scrape never waits for a step: a router's health check must
     * not time out on a busy server) */
    ts_engine_stats fresh;
    bool got = pthread_mutex_trylock(&srv.eng_mu) == 0;
    if (got) {
        ts_engine_get_stats(srv.eng, &fresh);
        pthread_mutex_unlock(&srv.eng_mu);
    }
    char m[600];
    model_label(m, sizeof m);
    pthread_mutex_lock(&srv.out_mu);
    if (got)
        srv.est = fresh;
    tessera_metrics(&b);
    vllm_metrics(&b, m);
    spec_metrics(&b, m);
    pthread_mutex_unlock(&srv.out_mu);
    enum MHD_Result ret = srv_send_text(
        c, b.oom ? 500 : 200, "text/plain; version=0.0.4; charset=utf-8",
        b.p && !b.oom ? b.p : "out of memory\n");
    free(b.p);
    return ret;
}

/* ---- a request's end ---- */

/* a choice's finish reason as vLLM counts it: 0 stop, 1 length, 2 abort */
static int reason_index(const choice *c) {
    if (!c->finish_reason || !strcmp(c->finish_reason, "abort"))
        return 2;
    return strcmp(c->finish_reason, "length") ? 0 : 1;
}

/* what one request came to, read under out_mu (the engine thread may
 * still be delivering to a choice whose client left) */
typedef struct {
    int64_t prompt, completion, cached;
    double t_first, queue_s;
    char finish[64];
} request_sums;

/* out_mu held */
static void sum_request(const hreq *r, const choice *ch, int n,
                        request_sums *s) {
    memset(s, 0, sizeof *s);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        s->completion += ch[i].n_tokens;
        /* the choices of one prompt share it (per_prompt: best_of or n
         * of them); a list of prompts counts each */
        if (r->embed || i % (r->per_prompt > 0 ? r->per_prompt : n) == 0)
            s->prompt += ch[i].prompt_tokens, s->cached += ch[i].cached;
        if (i < 4)
            k += (size_t)snprintf(
                s->finish + k, sizeof s->finish - k, "%s%s", i ? "," : "",
                ch[i].finish_reason ? ch[i].finish_reason : "abort");
        else if (i == 4)
            snprintf(s->finish + k, sizeof s->finish - k, ",...");
        if (k >= sizeof s->finish)
            k = sizeof s->finish - 1;
    }
    s->t_first = r->t_first, s->queue_s = r->queue_s;
}

void srv_request_end(hreq *r) {
    double now = srv_now();
    bool gen = r->kind == REQ_COMPLETION || r->kind == REQ_CHAT;
    const choice *ch = r->embed ? r->ech : r->ch;
    int n = r->embed ? r->n_ech : r->n;
    bool served = (gen || r->embed) && r->status == 200 && n > 0;
    request_sums s = {0};
    if (served) {
        pthread_mutex_lock(&srv.out_mu);
        sum_request(r, ch, n, &s);
        for (int i = 0; i < n; i++)
            srv.finished[reason_index(&ch[i])]++;
        srv_observe(srv.e2e_hist, E2E_B, N_E2E, &srv.e2e_sum, now - r->t_start);
        if (s.t_first > 0)
            srv_observe(srv.queue_hist, E2E_B, N_E2E, &srv.queue_sum,
                        s.queue_s);
        srv_observe(srv.ptok_hist, NTOK_B, N_NTOK, &srv.ptok_sum,
                    (double)s.prompt);
        srv_observe(srv.gtok_hist, NTOK_B, N_NTOK, &srv.gtok_sum,
                    (double)s.completion);
        pthread_mutex_unlock(&srv.out_mu);
    }
    if (srv.no_log_requests || !r->method[0])
        return;
    /* probes would drown the log */
    if (!strcmp(r->path, "/health") || !strcmp(r->path, "/metrics"))
        return;
    ts_sbuf b = {0};
    static uint64_t counter;
    if (r->id[0])
        ts_sb_printf(&b, "tessera serve: req %s", r->id);
    else
        ts_sb_printf(&b, "tessera serve: req req-%llu",
                     (unsigned long long)__atomic_add_fetch(&counter, 1,
                                                            __ATOMIC_RELAXED));
    ts_sb_printf(&b, " %s %s %d", r->method, r->path, r->status);
    if (served) {
        ts_sb_printf(&b, " prompt=%lld completion=%lld cached=%lld",
                     (long long)s.prompt, (long long)s.completion,
                     (long long)s.cached);
        if (gen && s.t_first > 0)
            ts_sb_printf(&b, " ttft=%.3fs", s.t_first - r->t_start);
        ts_sb_printf(&b, " total=%.3fs finish=%s", now - r->t_start, s.finish);
    }
    ts_sb_add(&b, "\n", 1);
    if (b.p && !b.oom)
        fputs(b.p, stderr); /* one write: lines of two requests do not mix */
    free(b.p);
}
