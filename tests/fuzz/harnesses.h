/* harnesses.h — one entry point per parser that reads a file or a request,
 * shared by the in-suite mutation test (tests/test_fuzz_inputs.c) and the
 * libFuzzer drivers (tests/fuzz/driver.c, `make fuzz`; docs/FUZZING.md).
 *
 * Each fuzz_<parser>(data, size) feeds the bytes to the parser as the
 * runtime would (a file in a scratch folder, a request over loopback),
 * uses whatever loaded, frees it, and returns 0. A broken contract that no
 * sanitizer sees (an error without a message, a tensor larger than its
 * file, a 5xx or no answer to a request) is reported on stderr and
 * abort()s, so that both drivers record it as a crash. */
#ifndef TS_FUZZ_HARNESSES_H
#define TS_FUZZ_HARNESSES_H

#include <stddef.h>
#include <stdint.h>

/* work_dir: a scratch folder the harnesses write their files under (made
 * if missing). model_dir: a small model folder (the tiny_lm fixture of
 * tests/reference/hf_tiny_lm.py) that config, openai_prompt and http_body
 * need; NULL makes those harnesses do nothing. Call once per process
 * before any harness. */
void fuzz_setup(const char *work_dir, const char *model_dir);
/* stops the in-process server (if http_body started one) and frees what
 * the harnesses keep between inputs; a process that ends without it only
 * leaves those to the OS */
void fuzz_teardown(void);

int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_gguf(const uint8_t *data, size_t size);
int fuzz_config(const uint8_t *data, size_t size);
int fuzz_tokenizer(const uint8_t *data, size_t size);
int fuzz_tokenizer_config(const uint8_t *data, size_t size);
int fuzz_chat_template(const uint8_t *data, size_t size);
int fuzz_token_shard(const uint8_t *data, size_t size);
int fuzz_router_events(const uint8_t *data, size_t size);
int fuzz_openai_prompt(const uint8_t *data, size_t size);
int fuzz_http_body(const uint8_t *data, size_t size);

typedef struct {
    const char *name; /* also the file prefix in tests/fuzz/{seeds,pending,
                         regressions} */
    int (*fn)(const uint8_t *data, size_t size);
    int needs_model; /* does nothing without model_dir */
} fuzz_harness;

extern const fuzz_harness fuzz_harnesses[];
extern const int fuzz_n_harnesses;
const fuzz_harness *fuzz_find(const char *name);

/* for the harnesses' own checks: prints "fuzz <what>: <why>" and aborts */
void fuzz_fail(const char *what, const char *fmt, ...);

#endif
