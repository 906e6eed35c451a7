#!/bin/sh
# bench/device/vulkan.sh — issue 18's GPU checks, as one script for the
# `device` machine (an NVIDIA GPU with a Vulkan driver; see
# /work/.library/device/README.md). Run from the repository root with the
# Release build carried (carry: build, .gl):
#   run(command="sh bench/device/vulkan.sh", carry=["build", ".gl"])
# where .gl holds the Vulkan loader's .deb (prepared once on the host:
#   echo /.gl/ >>.git/info/exclude; mkdir -p .gl /tmp/amd64/partial;
#   o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64
#      -oDir::State::Lists=/tmp/amd64'; apt-get $o update;
#   (cd .gl && apt-get $o download libvulkan1))
# It lists the devices, runs every Vulkan test on vulkan:0 (the GPU), then
# bench_vulkan on the full Qwen3-0.6B architecture and 4096^3 matmuls;
# everything it prints also lands in $OUT/vulkan.txt.
set -u
OUT=${OUT:-/tmp}
log="$OUT/vulkan.txt"
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
if [ -z "${VK_DRIVER_FILES:-}" ] &&
   [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
{
    echo "== devices"
    ./build/tessera devices
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem \
        --format=csv 2>/dev/null
    echo "== Vulkan tests on the GPU"
    for t in build/tests/test_vk_*; do
        [ -x "$t" ] || continue
        timeout 300 "$t" "$PWD" "$PWD/build/tests/hf_models" 2>&1 | tail -2
    done
    echo "== bench_vulkan --full --size 4096"
    timeout 400 ./build/bench_vulkan --full --size 4096
} 2>&1 | tee "$log"
