/* cpu_isa.h — the x86 instruction-set levels the CPU kernels are built for, the
 * machine's features as cpuid/xgetbv report them, and the level chosen at
 * run time (the highest the machine and its OS support, or TS_CPU_ISA).
 * Kernels compiled for a level above the baseline are only ever called
 * when cpu_isa_active() (or a test's explicit level) is at least theirs. */
#ifndef TS_CPU_ISA_H
#define TS_CPU_ISA_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    CPU_ISA_SSE2 = 0,    /* baseline x86-64 */
    CPU_ISA_AVX2,        /* + AVX2, FMA, F16C */
    CPU_ISA_AVX512,      /* + AVX-512 F, BW, VL, DQ (OS saves zmm state) */
    CPU_ISA_AVX512_BF16, /* + AVX512_VNNI and AVX512_BF16 */
    CPU_ISA_AMX,         /* + AMX tiles, BF16 and INT8 (granted by the OS) */
    CPU_ISA_COUNT
} cpu_isa;

typedef struct {
    bool sse2, avx, avx2, fma, f16c, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool avx_vnni; /* the VEX form of VNNI (Alder Lake and later) */
    bool amx_tile, amx_bf16, amx_int8;
    bool os_ymm, os_zmm, os_amx; /* XCR0 has the state; AMX granted */
} cpu_features;

/* cpuid/xgetbv, read once (thread-safe). */
const cpu_features *cpu_features_get(void);
/* The highest level the machine and its OS run. */
cpu_isa cpu_isa_detected(void);
/* The level the kernels use: cpu_isa_detected(), or TS_CPU_ISA's when set
 * (read once; a level above the machine's is refused by cpu_isa_init). */
cpu_isa cpu_isa_active(void);
/* Reads TS_CPU_ISA; false with a message in err when it names an unknown
 * level or one the machine lacks. Called at context creation. */
bool cpu_isa_init(char *err, size_t cap);
/* "sse2", "avx2", "avx512", "avx512_bf16", "amx"; and back (CPU_ISA_COUNT
 * when unknown). */
const char *cpu_isa_name(cpu_isa isa);
cpu_isa cpu_isa_from_name(const char *name);
/* The machine's features as a space-separated list ("avx2 fma f16c ..."). */
void cpu_features_str(char *buf, size_t cap);

#endif
