/* driver.c — the libFuzzer driver of one harness (harnesses.h), built once
 * per harness with -DFUZZ_HARNESS=fuzz_<name> by `make fuzz` (a clang
 * build with -DTS_FUZZ=ON; docs/FUZZING.md). Environment: TS_FUZZ_WORK, a
 * scratch folder (default /tmp/ts_fuzz.<pid>); TS_FUZZ_MODEL, the tiny
 * model folder that config, openai_prompt and http_body need. */
#include "harnesses.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef FUZZ_HARNESS
#error "build with -DFUZZ_HARNESS=fuzz_<name>"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char work[256];
    const char *w = getenv("TS_FUZZ_WORK");
    if (w && *w)
        snprintf(work, sizeof work, "%s", w);
    else
        snprintf(work, sizeof work, "/tmp/ts_fuzz.%d", (int)getpid());
    const char *model = getenv("TS_FUZZ_MODEL");
    fuzz_setup(work, model && *model ? model : NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return FUZZ_HARNESS(data, size);
}
