/* peak.c — the machine's measured f32 matmul rate (the MFU denominator),
 * cached per CPU model and thread count, and the model-FLOPs count. */
#include "tessera_train.h"
#include "core/core.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ')
                    v++;
                snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
    if (f)
        fclose(f);
}

static double measure(void) {
    enum { N = 2048 };
    float *a = malloc(sizeof(float) * N * N),
          *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)N * N; i++)
            a[i] = (float)(i % 13) * 0.01f, b[i] = (float)(i % 7) * 0.02f;
        for (int r = 0; r < 5; r++) {
            double t = now_s();
            ts_sgemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
            t = now_s() - t;
            double f = 2.0 * N * N * (double)N / t;
            best = f > best ? f : best;
        }
    }
    free(a), free(b), free(c);
    return best;
}

double ts_peak_flops(bool fresh, bool *cached) {
    char cpu[256], key[320], dir[4096], path[4200];
    cpu_name(cpu, sizeof cpu);
    int threads = ts_threads_count();
    snprintf(key, sizeof key, "%s / %d threads", cpu, threads);
    const char *home = getenv("XDG_CACHE_HOME");
    if (home && *home)
        snprintf(dir, sizeof dir, "%s/tessera", home);
    else
        snprintf(dir, sizeof dir, "%s/.cache/tessera",
                 getenv("HOME") ? getenv("HOME") : "/tmp");
    snprintf(path, sizeof path, "%s/peak.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        j = json_object();
    }
    double v = json_number_value(json_object_get(j, key));
    if (cached)
        *cached = !fresh && v > 0;
    if (fresh || !(v > 0)) {
        v = measure();
        json_object_set_new(j, key, json_real(v));
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash)
            *slash = 0, mkdir(parent, 0755);
        mkdir(dir, 0755);
        json_dump_file(j, path, JSON_INDENT(2)); /* a cache: best effort */
    }
    json_decref(j);
    return v;
}

double ts_train_flops_per_token(int64_t n_params_no_embed, int64_t layers,
                                int64_t heads, int64_t head_dim, int64_t seq) {
    return 6.0 * (double)n_params_no_embed + 12.0 * (double)layers *
                                                 (double)heads *
                                                 (double)head_dim * (double)seq;
}
