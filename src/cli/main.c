/* main.c — the `tessera` command line: one binary, sub-commands. */
#include "tessera.h"

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

static void usage(FILE *f) {
    fprintf(
        f, "usage: tessera <command> [options]\n"
           "commands:\n"
           "  run      -m DIR -p TEXT: generate text from a Hugging Face model "
           "folder\n"
           "  serve    -m DIR [--port 8000]: an OpenAI-compatible server\n"
           "  route    --server URL... [-m DIR]: one address for many "
           "servers\n"
           "  tokenize -m DIR TEXT (or --decode 1,2,3): the model's tokenizer\n"
           "  tokenizer-train --vocab N --out DIR FILES: a byte-level BPE\n"
           "  prepare-data -t TOKENIZER_DIR --out DIR FILES: token shards\n"
           "  train    --model-config F | --init-from DIR --data DIR --out "
           "DIR: train\n"
           "  plot-loss LOG.jsonl --out loss.svg: the loss curves\n"
           "  bench peak: the machine's f32 matmul rate (for MFU)\n"
           "  demo     train a tiny MLP for a few steps in eager mode\n"
           "  info     -m DIR: a Hugging Face model folder's architecture and "
           "size\n"
           "  logits   -m DIR --ids 1,2,3 --out F.npy: logits of every "
           "position\n"
           "  devices  the devices models can run on (cpu, vulkan:N)\n"
           "every command takes -t/--threads N (prepare-data: --threads "
           "only, its -t\n"
           "is the tokenizer): threads for the kernels, default the cores "
           "this process\n"
           "may run on (its affinity mask); TS_NUM_THREADS sets the same\n"
           "run, serve, logits and train take --device DEV (cpu, vulkan:0, "
           "...): the\nwhole model there (--device-map splits it)\n");
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
    if (!take_threads(&argc, argv))
        return 2;
    /* --device DEV is --device-map DEV (one device holds every part) */
    if (strcmp(argv[1], "train"))
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--"))
                break;
            if (!strcmp(argv[i], "--device"))
                argv[i] = "--device-map";
        }
    if (!strcmp(argv[1], "demo"))
        return tessera_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info"))
        return tessera_info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "run"))
        return tessera_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve"))
        return tessera_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "route"))
        return tessera_route(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenizer-train"))
        return tessera_tokenizer_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "prepare-data"))
        return tessera_prepare_data(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train"))
        return tessera_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench"))
        return tessera_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plot-loss"))
        return tessera_plot_loss(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize"))
        return tessera_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "logits"))
        return tessera_logits(argc - 1, argv + 1);
    if (!strcmp(argv[1], "devices"))
        return tessera_devices(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tessera: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
