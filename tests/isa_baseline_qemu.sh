#!/bin/sh
# isa_baseline_qemu.sh TESSERA TESTS_DIR TINY_LM_ROOT — the build on a CPU
# without AVX: QEMU's user-mode emulator with a Westmere CPU (SSE4.2, no
# AVX) runs `tessera --version` (which must pick the sse2 level), the ISA
# and kernel tests, and `tessera run` on the tiny model, whose greedy text
# must be the PyTorch reference's. A single AVX instruction outside the
# kernels chosen at run time would stop it with SIGILL.
set -e
tessera=$1 tests=$2 root=$3
command -v qemu-x86_64 >/dev/null || {
    echo "qemu-x86_64 not found (Debian package qemu-user; make deps)"
    exit 1
}
# OPENBLAS_CORETYPE (set on some machines) would force OpenBLAS's AVX2
# kernels; without it OpenBLAS picks its own by cpuid, as ours do.
emu() { env -u OPENBLAS_CORETYPE -u TS_CPU_ISA qemu-x86_64 -cpu Westmere "$@"; }
v=$(emu "$tessera" --version)
echo "$v"
echo "$v" | grep -q "cpu path in use: sse2 (this machine's highest: sse2)"
emu "$tests/test_isa"
emu "$tests/test_kernels"
out=$(emu "$tessera" run -m "$root/tiny_lm" -p "Hello world" -n 24 \
    --temperature 0 2>/dev/null)
want=$(cat "$root/tiny_lm.expected")
if [ "$out" != "$want" ]; then
    echo "tessera run under the emulated CPU: \"$out\", want \"$want\""
    exit 1
fi
echo "isa_baseline_qemu: sse2 level ran everything under an AVX-less CPU"
