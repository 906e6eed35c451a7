/* cpu_isa.c — what the CPU can run: cpuid leaves 1 and 7 (subleaves 0 and 1),
 * the OS's saved state from xgetbv (ymm, zmm, AMX tiles), and AMX's tile
 * data requested from Linux with arch_prctl; the active level, lowered by
 * TS_CPU_ISA for tests and comparisons. Owns no kernels. */
#include "core/cpu_isa.h"
#include "tessera.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const isa_names[CPU_ISA_COUNT] = {"sse2", "avx2", "avx512",
                                                     "avx512_bf16", "amx"};

static cpu_features feats;
static cpu_isa detected, active;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux hands out AMX's tile data (8 KiB of state per thread) only on
 * request: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA. */
static bool amx_request(void) {
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                   18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return false;
#endif
}

static void detect(void) {
    unsigned a, b, c, d;
    cpu_features *f = &feats;
    f->sse2 = true; /* x86-64 */
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        bool osxsave = c & (1u << 27);
        f->avx = c & (1u << 28);
        f->fma = c & (1u << 12);
        f->f16c = c & (1u << 29);
        if (osxsave) {
            uint64_t xcr0 = xgetbv0();
            f->os_ymm = (xcr0 & 0x6) == 0x6;
            f->os_zmm = f->os_ymm && (xcr0 & 0xe0) == 0xe0;
            f->os_amx = (xcr0 & 0x60000) == 0x60000;
        }
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->avx2 = b & (1u << 5);
        f->bmi2 = b & (1u << 8);
        f->avx512f = b & (1u << 16);
        f->avx512dq = b & (1u << 17);
        f->avx512bw = b & (1u << 30);
        f->avx512vl = b & (1u << 31);
        f->avx512vnni = c & (1u << 11);
        f->amx_bf16 = d & (1u << 22);
        f->amx_tile = d & (1u << 24);
        f->amx_int8 = d & (1u << 25);
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
            f->avx_vnni = a1 & (1u << 4);
            f->avx512bf16 = a1 & (1u << 5);
        }
    }
    if (f->os_amx && f->amx_tile)
        f->os_amx = amx_request();
    detected = CPU_ISA_SSE2;
    if (f->avx && f->avx2 && f->fma && f->f16c && f->os_ymm) {
        detected = CPU_ISA_AVX2;
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq &&
            f->os_zmm) {
            detected = CPU_ISA_AVX512;
            if (f->avx512vnni && f->avx512bf16) {
                detected = CPU_ISA_AVX512_BF16;
                if (f->amx_tile && f->amx_bf16 && f->amx_int8 && f->os_amx)
                    detected = CPU_ISA_AMX;
            }
        }
    }
    active = detected;
    const char *env = getenv("TS_CPU_ISA");
    cpu_isa want = env && *env ? cpu_isa_from_name(env) : CPU_ISA_COUNT;
    if (want < CPU_ISA_COUNT && want <= detected)
        active = want; /* otherwise refused by cpu_isa_init */
}

const cpu_features *cpu_features_get(void) {
    pthread_once(&once, detect);
    return &feats;
}

cpu_isa cpu_isa_detected(void) {
    pthread_once(&once, detect);
    return detected;
}

cpu_isa cpu_isa_active(void) {
    pthread_once(&once, detect);
    return active;
}

bool cpu_isa_init(char *err, size_t cap) {
    pthread_once(&once, detect);
    const char *env = getenv("TS_CPU_ISA");
    if (!env || !*env)
        return true;
    cpu_isa want = cpu_isa_from_name(env);
    if (want == CPU_ISA_COUNT) {
        snprintf(err, cap,
                 "TS_CPU_ISA=%s: unknown level (one of sse2, avx2, avx512, "
                 "avx512_bf16, amx)",
                 env);
        return false;
    }
    if (want > detected) {
        snprintf(err, cap,
                 "TS_CPU_ISA=%s: this machine runs at most %s (it has: ", env,
                 isa_names[detected]);
        size_t n = strlen(err);
        cpu_features_str(err + n, cap > n ? cap - n : 0);
        n = strlen(err);
        snprintf(err + n, cap > n ? cap - n : 0, ")");
        return false;
    }
    return true;
}

const char *cpu_isa_name(cpu_isa isa) {
    return (unsigned)isa < CPU_ISA_COUNT ? isa_names[isa] : "invalid";
}

cpu_isa cpu_isa_from_name(const char *name) {
    for (int i = 0; name && i < CPU_ISA_COUNT; i++)
        if (!strcasecmp(name, isa_names[i]))
            return (cpu_isa)i;
    if (name &&
        (!strcasecmp(name, "avx512bf16") || !strcasecmp(name, "avx512-bf16")))
        return CPU_ISA_AVX512_BF16;
    return CPU_ISA_COUNT;
}

void cpu_features_str(char *buf, size_t cap) {
    const cpu_features *f = cpu_features_get();
    const struct {
        bool on;
        const char *name;
    } list[] = {{f->sse2, "sse2"},
                {f->avx && f->os_ymm, "avx"},
                {f->avx2 && f->os_ymm, "avx2"},
                {f->fma, "fma"},
                {f->f16c, "f16c"},
                {f->bmi2, "bmi2"},
                {f->avx_vnni, "avx_vnni"},
                {f->avx512f && f->os_zmm, "avx512f"},
                {f->avx512bw && f->os_zmm, "avx512bw"},
                {f->avx512vl && f->os_zmm, "avx512vl"},
                {f->avx512dq && f->os_zmm, "avx512dq"},
                {f->avx512vnni && f->os_zmm, "avx512_vnni"},
                {f->avx512bf16 && f->os_zmm, "avx512_bf16"},
                {f->amx_tile && f->os_amx, "amx_tile"},
                {f->amx_bf16 && f->os_amx, "amx_bf16"},
                {f->amx_int8 && f->os_amx, "amx_int8"}};
    size_t n = 0;
    if (cap)
        buf[0] = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
        if (list[i].on && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " " : "",
                                  list[i].name);
}

const char *ts_cpu_isa(void) {
    return cpu_isa_name(cpu_isa_active());
}

const char *ts_cpu_isa_max(void) {
    return cpu_isa_name(cpu_isa_detected());
}

void ts_cpu_features(char *buf, size_t cap) {
    if (buf && cap)
        cpu_features_str(buf, cap);
}
