/* peak.c — the MFU denominator and the model-FLOPs count.
 *
 * The hardware peak is computed, not measured: cores in use x clock x
 * f32 FLOPs per cycle of the ISA our matmuls run (our own kernels'
 * AVX2+FMA, or AVX-512 where OpenBLAS picked a core that uses it). The
 * clock is measured at start from a dependent chain of integer adds (one
 * cycle each on every x86 and Arm core), the fastest of many short trials
 * so that a preempted trial cannot lower it. The sgemm rate is measured in
 * the same call and shown beside it as "achievable"; nothing is cached. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "core/core.h"
#include "tessera_train.h"

#include <cblas.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static void cpu_brand(char *out, size_t cap) {
    unsigned r[12] = {0}, max = __get_cpuid_max(0x80000000u, NULL);
    if (max < 0x80000004u) {
        snprintf(out, cap, "unknown x86");
        return;
    }
    for (unsigned k = 0; k < 3; k++)
        __get_cpuid(0x80000002u + k, &r[4 * k], &r[4 * k + 1], &r[4 * k + 2],
                    &r[4 * k + 3]);
    char b[49];
    memcpy(b, r, 48);
    b[48] = 0;
    const char *s = b;
    while (*s == ' ')
        s++;
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ')
        n--;
    snprintf(out, cap, "%.*s", (int)n, s);
}

/* the ISA of the matmuls: the best our kernels or OpenBLAS's core use */
static void cpu_isa(char *isa, size_t cap, char *note, size_t ncap,
                    double *flops) {
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *core = openblas_get_corename();
    bool blas512 =
        core && (strstr(core, "SkylakeX") || strstr(core, "Cooperlake") ||
                 strstr(core, "SapphireRapids") || strstr(core, "skylakex") ||
                 strstr(core, "cooperlake") || strstr(core, "sapphirerapids"));
    note[0] = 0;
    if (avx512 && blas512) { /* 2 FMA pipes x 16 lanes x 2 */
        snprintf(isa, cap, "AVX-512 (OpenBLAS %s)", core);
        *flops = 64;
    } else if (avx2) { /* 2 FMA pipes x 8 lanes x 2 */
        snprintf(isa, cap, "AVX2+FMA");
        *flops = 32;
        if (avx512)
            snprintf(note, ncap,
                     "the CPU has AVX-512, unused by our kernels and "
                     "OpenBLAS's %s core",
                     core ? core : "?");
    } else { /* SSE: one add and one mul pipe x 4 lanes */
        snprintf(isa, cap, "SSE");
        *flops = 8;
    }
}
#else
static void cpu_brand(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5)) {
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

static void cpu_isa(char *isa, size_t cap, char *note, size_t ncap,
                    double *flops) {
    /* an upper bound for today's Arm server cores: 4 FMA pipes x 4 lanes */
    snprintf(isa, cap, "NEON (assumed 4 FMA pipes)");
    note[0] = 0;
    (void)ncap;
    *flops = 32;
}
#endif

/* cycles per second: the fastest of many trials of a chain of dependent
 * adds (1-cycle latency); the asm barrier keeps each add in the chain */
static double measure_clock(void) {
    /* trials of ~40 us for 150 ms at least: a core that idled runs at a
     * low clock for tens of milliseconds before it ramps up (4 ms of
     * trials measured 2.5 GHz one run and 3.7 GHz the next) */
    enum { UNROLL = 64, ITERS = 2000, TRIALS = 40 };
    double best = 0, start = now_s();
    unsigned long x = 0, one = 1;
    __asm__ volatile("" : "+r"(one)); /* opaque: no add-immediate folding */
    for (int t = 0; t < TRIALS || now_s() - start < 0.15; t++) {
        double t0 = now_s();
        for (int i = 0; i < ITERS; i++)
            for (int k = 0; k < UNROLL; k++) {
                x += one;
                __asm__ volatile("" : "+r"(x));
            }
        double dt = now_s() - t0;
        double hz = dt > 0 ? (double)UNROLL * ITERS / dt : 0;
        best = hz > best ? hz : best;
    }
    return best;
}

static double measure_sgemm(void) {
    enum { N = 1024 };
    float *a = malloc(sizeof(float) * N * N),
          *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)N * N; i++)
            a[i] = (float)(i % 13) * 0.01f, b[i] = (float)(i % 7) * 0.02f;
        for (int r = 0; r < 4; r++) {
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

ts_status ts_peak_measure(ts_ctx *ctx, bool sgemm, ts_peak_info *out) {
    if (!ctx || !out)
        return TS_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    cpu_brand(out->cpu, sizeof out->cpu);
    cpu_isa(out->isa, sizeof out->isa, out->isa_note, sizeof out->isa_note,
            &out->flops_per_cycle);
    int threads = ts_get_num_threads(ctx), cpus = threads;
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) > 0)
        cpus = CPU_COUNT(&set);
    out->cores = threads < cpus ? threads : cpus;
    if (out->cores < 1)
        out->cores = 1;
    /* the chain again after an sgemm on every thread, the faster of the
     * two: a core that idled ran the chain at 2.7 GHz for 150 ms here, and
     * at 3.7 GHz once the sgemm had ramped it up; the peak must bound
     * what the sgemm achieves */
    out->clock_hz = measure_clock();
    double achieved = measure_sgemm(), again = measure_clock();
    out->clock_hz = again > out->clock_hz ? again : out->clock_hz;
    if (sgemm)
        out->sgemm = achieved;
    /* a chain measured on a busy machine (another process on the core, a
     * clock still ramping) can read low; the sgemm's rate proves the clock
     * was at least what it needs */
    double proven = achieved / (out->cores * out->flops_per_cycle);
    out->clock_hz = proven > out->clock_hz ? proven : out->clock_hz;
    out->hardware = out->cores * out->clock_hz * out->flops_per_cycle;
    if (!(out->hardware > 0))
        return ts_set_error(ctx, TS_ERR_STATE,
                            "peak: the clock could not be measured");
    return TS_OK;
}

double ts_peak_flops(bool fresh, bool *cached) {
    (void)fresh;
    if (cached)
        *cached = false;
    return measure_sgemm();
}

double ts_train_flops_per_token(int64_t n_params_no_embed, int64_t layers,
                                int64_t heads, int64_t head_dim, int64_t seq) {
    return 6.0 * (double)n_params_no_embed + 12.0 * (double)layers *
                                                 (double)heads *
                                                 (double)head_dim * (double)seq;
}
