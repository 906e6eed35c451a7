#!/bin/sh
# run_fuzz.sh BUILD_FUZZ SECONDS HARNESS... — `make fuzz`: each harness's
# libFuzzer driver (BUILD_FUZZ/tests/fuzz_<h>) for SECONDS, one at a time,
# in fork mode so that a crash is counted and the run goes on. The corpus
# starts from tests/fuzz/seeds/<h> and grows in BUILD_FUZZ/fuzz-corpus/<h>;
# crashes, timeouts and OOMs land in BUILD_FUZZ/fuzz-out/<h>/; the figures
# (the last status line: runs, cov, ft, corpus, oom/timeout/crash) go to
# BUILD_FUZZ/fuzz-results.txt, one line per harness.
set -u
build=$(cd "$1" && pwd) secs=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
results=$build/fuzz-results.txt
: >"$results"
for h in "$@"; do
    corpus=$build/fuzz-corpus/$h out=$build/fuzz-out/$h
    mkdir -p "$corpus" "$out" "$build/fuzz-work/$h"
    log=$out/fuzz.log
    echo "fuzz_$h: $secs s"
    # -timeout: an input running 10 s is a hang; -malloc_limit_mb: one
    # allocation above 1 GiB is a finding (the huge-allocation kind)
    TS_FUZZ_WORK=$build/fuzz-work/$h TS_FUZZ_MODEL=$build/tiny_lm/tiny_lm \
    TS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$build/tests/fuzz_$h" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
        -ignore_ooms=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 \
        -malloc_limit_mb=1024 -max_len=65536 -artifact_prefix="$out/" \
        "$corpus" "$src/seeds/$h" >"$log" 2>&1
    last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -n 1)
    runs=$(echo "$last" | sed -n 's/^#\([0-9]*\):.*/\1/p')
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
    oct=$(echo "$last" | sed -n 's/.*oom\/timeout\/crash: \([0-9/]*\).*/\1/p')
    files=$(ls "$out" | grep -c -E '^(crash|timeout|oom|leak|slow-unit)-')
    line="fuzz_$h runs=${runs:-0} cov=${cov:-0} ft=${ft:-0} corpus=${corp:-0} oom/timeout/crash=${oct:-0/0/0} saved=$files"
    echo "$line" | tee -a "$results"
done
echo "figures in $results; inputs that failed in $build/fuzz-out/<harness>/"
