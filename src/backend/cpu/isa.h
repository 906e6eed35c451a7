/* isa.h — the CPU kernels' view of the ISA levels (core/cpu_isa.h: the
 * levels, the machine's features, the level chosen at run time). */
#ifndef TS_BACKEND_CPU_ISA_H
#define TS_BACKEND_CPU_ISA_H
#include "core/cpu_isa.h"
#endif
