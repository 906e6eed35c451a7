#!/bin/sh
# at_isa.sh TESSERA LEVEL CMD [ARGS...] — runs CMD with TS_CPU_ISA=LEVEL, so
# the kernels of that ISA level run; exits 77 (CTest's skip) when this
# machine lacks the level (`tessera --version` names its highest).
tessera=$1 level=$2
shift 2
max=$("$tessera" --version | sed -n "s/.*this machine's highest: \([a-z0-9_]*\).*/\1/p")
rank() {
    i=0
    for l in sse2 avx2 avx512 avx512_bf16 amx; do
        [ "$l" = "$1" ] && { echo $i; return; }
        i=$((i + 1))
    done
    echo 99
}
if [ -z "$max" ] || [ "$(rank "$level")" -gt "$(rank "$max")" ]; then
    echo "skipped: this machine runs at most ${max:-?}, not $level"
    exit 77
fi
TS_CPU_ISA=$level exec "$@"
