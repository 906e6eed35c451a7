/* main.c — the `tessera` command line: one binary, sub-commands. */
#include "tessera.h"

#include <stdio.h>
#include <string.h>

int tessera_demo(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera <command> [options]\n"
            "commands:\n"
            "  demo     train a tiny MLP for a few steps in eager mode\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "demo")) return tessera_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tessera: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
