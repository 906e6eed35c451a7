#!/bin/sh
# absent.sh TESSERA MODEL_DIR — with no Vulkan driver (the loader pointed at
# none), `tessera devices` says why and still lists the CPU, and a run
# asked for vulkan:0 fails with that reason (exit 1, no crash); the same
# run on the CPU works.
set -u
exe=$1 model=$2
export VK_ICD_FILENAMES=/nonexistent.json VK_DRIVER_FILES=/nonexistent.json
out=$("$exe" devices) || { echo "devices failed"; exit 1; }
echo "$out"
echo "$out" | grep -q '^cpu:0' || { echo "no cpu:0 listed"; exit 1; }
echo "$out" | grep -q '^vulkan  *none: \(no Vulkan driver\|this build has no vulkan\)' ||
    { echo "no reason for the missing Vulkan"; exit 1; }
err=$("$exe" run -m "$model" -p hi -n 2 --device vulkan:0 2>&1)
rc=$?
echo "$err"
[ $rc -eq 1 ] || { echo "run --device vulkan:0 exited $rc, want 1"; exit 1; }
echo "$err" | grep -q 'no Vulkan driver\|no vulkan backend' || { echo "no reason given"; exit 1; }
"$exe" run -m "$model" -p hi -n 2 >/dev/null || { echo "cpu run failed"; exit 1; }
echo "absent.sh: ok"
