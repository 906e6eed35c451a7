/* main.c — the `tessera` command line: one binary, sub-commands; the
 * command list, --version, the unknown command's suggestion and
 * -t/--threads (every command's, taken here). */
#include "tessera.h"

#include "cli/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tessera_demo(int argc, char **argv);
int tessera_info(int argc, char **argv);
int tessera_logits(int argc, char **argv);
int tessera_run(int argc, char **argv);
int tessera_tokenize(int argc, char **argv);
int tessera_serve(int argc, char **argv);
int tessera_route(int argc, char **argv);
int tessera_tokenizer_train(int argc, char **argv);
int tessera_prepare_data(int argc, char **argv);
int tessera_train(int argc, char **argv);
int tessera_bench(int argc, char **argv);
int tessera_plot_loss(int argc, char **argv);
int tessera_devices(int argc, char **argv);
int tessera_quantize(int argc, char **argv);
int tessera_diffuse(int argc, char **argv);
int tessera_convert(int argc, char **argv);
int tessera_chat(int argc, char **argv);

#ifndef TS_VERSION
#define TS_VERSION "0.23.0" /* the project's version (issue 23) */
#endif
#ifndef TS_GIT_COMMIT
#define TS_GIT_COMMIT "unknown" /* set by CMake at configure time */
#endif

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command COMMANDS[] = {
    {"run", tessera_run, "-m DIR -p TEXT: generate text from a model folder"},
    {"chat", tessera_chat, "-m DIR: an interactive chat in the terminal"},
    {"serve", tessera_serve, "DIR [--port 8000]: an OpenAI-compatible server"},
    {"route", tessera_route, "--server URL...: one address for many servers"},
    {"tokenize", tessera_tokenize,
     "-m DIR TEXT (or --decode IDS): the model's tokenizer"},
    {"tokenizer-train", tessera_tokenizer_train,
     "--vocab N --out DIR FILES: a byte-level BPE"},
    {"prepare-data", tessera_prepare_data,
     "-t TOKENIZER_DIR --out DIR FILES: token shards"},
    {"train", tessera_train,
     "--model-config F | --init-from DIR --data DIR --out DIR"},
    {"plot-loss", tessera_plot_loss, "LOG.jsonl --out loss.svg: loss curves"},
    {"bench", tessera_bench, "peak: the machine's f32 matmul rate (for MFU)"},
    {"demo", tessera_demo, "train a tiny MLP for a few eager steps"},
    {"info", tessera_info, "-m DIR: a model folder's architecture and size"},
    {"logits", tessera_logits,
     "-m DIR --ids 1,2,3 --out F.npy: every position's logits"},
    {"devices", tessera_devices, "the devices models can run on"},
    {"quantize", tessera_quantize,
     "IN OUT.gguf --type q4_k_m: a quantized GGUF of a model"},
    {"convert", tessera_convert,
     "HF_DIR OUT.gguf [--type bf16]: a model folder as one GGUF"},
    {"diffuse", tessera_diffuse,
     "-m DIR --prompt TEXT | --class LABEL: an image from a pipeline"},

};
#define N_COMMANDS (sizeof COMMANDS / sizeof *COMMANDS)

static void usage(FILE *f) {
    fprintf(f, "usage: tessera <command> [options]   (tessera <command> "
               "--help: its options)\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-16s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "every command takes --threads N (and -t N, but for "
               "prepare-data, whose -t is\nits tokenizer)\n"
               "tessera --version (-V): the version, commit, backends and "
               "CPU paths\n");
}

/* the version, the commit, the backends compiled in, and the CPU paths:
 * what the build was compiled for and what this machine has */
static int version(void) {
    printf("tessera %s (commit %s)\n", TS_VERSION, TS_GIT_COMMIT);
    printf("backends: cpu");
#ifdef TS_HAVE_VULKAN
    printf(", vulkan");
#endif
    char feats[512];
    ts_cpu_features(feats, sizeof feats);
    printf("\ncpu paths built: sse2 avx2 avx512 avx512_bf16 (chosen at run "
           "time)\ncpu path in use: %s (this machine's highest: %s%s)\n"
           "cpu of this machine: %s\n",
           ts_cpu_isa(), ts_cpu_isa_max(),
           getenv("TS_CPU_ISA") && *getenv("TS_CPU_ISA") ? "; TS_CPU_ISA set"
                                                         : "",
           feats);
    return 0;
}

/* Takes -t/--threads N out of argv (argc updated) into TS_NUM_THREADS,
 * which every context reads. prepare-data's -t names its tokenizer. */
static bool take_threads(int *argc, char **argv) {
    bool short_ok = strcmp(argv[1], "prepare-data") != 0;
    int out = 2;
    for (int i = 2; i < *argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--"))
            short_ok = false; /* the rest is not ours */
        if (!strncmp(a, "--threads=", 10)) {
            v = a + 10;
        } else if (!strcmp(a, "--threads") || (short_ok && !strcmp(a, "-t"))) {
            if (i + 1 >= *argc) {
                fprintf(stderr,
                        "tessera: %s needs a value: the number of threads "
                        "(1 to 1024)\n",
                        a);
                return false;
            }
            v = argv[++i];
        } else {
            argv[out++] = argv[i];
            continue;
        }
        char *end;
        long n = strtol(v, &end, 10);
        if (!*v || *end || n < 1 || n > 1024) {
            fprintf(stderr,
                    "tessera: --threads \"%s\": want a whole number of "
                    "threads from 1 to 1024\n",
                    v);
            return false;
        }
        setenv("TS_NUM_THREADS", v, 1);
    }
    argv[out] = NULL;
    *argc = out;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") ||
        !strcmp(argv[1], "version"))
        return version();
    const command *cmd = NULL;
    const char *names[N_COMMANDS];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        names[i] = COMMANDS[i].name;
        if (!strcmp(argv[1], names[i]))
            cmd = &COMMANDS[i];
    }
    if (!cmd) {
        const char *near = cli_closest(argv[1], names, N_COMMANDS);
        if (near)
            fprintf(stderr,
                    "tessera: unknown command \"%s\"; did you mean \"%s\"?\n",
                    argv[1], near);
        else
            fprintf(stderr, "tessera: unknown command \"%s\"\n", argv[1]);
        usage(stderr);
        return 2;
    }
    if (!take_threads(&argc, argv))
        return 2;
    return cmd->run(argc - 1, argv + 1);
}
