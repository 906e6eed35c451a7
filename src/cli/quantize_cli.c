/* quantize_cli.c — `tessera quantize IN OUT.gguf --type q4_k_m` and
 * `tessera convert HF_DIR OUT.gguf [--type f16]`: a model written as a GGUF
 * file of another type (ts_model_quantize), with a line per tensor. */
#include "opts.h"
#include "tessera_models.h"

#include <stdio.h>
#include <string.h>

static const cli_opt QUANT_OPTS[] = {
    {1, "--type", CLI_STR, "TYPE", .def = "q4_k_m (quantize), bf16 (convert)",
     .help = "the file type: f32, f16, bf16, q8_0, q4_0, q4_k_s, q4_k_m, "
             "q5_k_s, q5_k_m, q6_k"},
    {2, "-q, --quiet", CLI_FLAG, .help = "no line per tensor"},
    {0},
};

static const cli_cmd QUANTIZE_CMD = {
    .name = "quantize",
    .usage = "quantize IN OUT.gguf [--type q4_k_m]",
    .about = "Writes the model IN (a Hugging Face folder or a GGUF file) as a "
             "GGUF file of another type, choosing each tensor's format as "
             "llama.cpp's llama-quantize does without an importance matrix "
             "(norms stay f32; the LM head Q6_K under 4- and 5-bit types; "
             "_m types give some value projections and ffn_down Q6_K), with "
             "the tokenizer, chat template and hyperparameters, so llama.cpp "
             "and `tessera run -m OUT.gguf` load it as it is.",
    .opts = QUANT_OPTS,
    .positional = "  IN                          the model: a folder or a "
                  ".gguf file\n  OUT.gguf                    the file to "
                  "write (atomically)\n",
    .short_threads = true,
};

static const cli_cmd CONVERT_CMD = {
    .name = "convert",
    .usage = "convert HF_DIR OUT.gguf [--type bf16]",
    .about = "Writes a Hugging Face model folder as one GGUF file (llama.cpp's "
             "format): --type f32, f16 or bf16 keeps every matrix in that "
             "dtype; a quantized type quantizes as `tessera quantize` does.",
    .opts = QUANT_OPTS,
    .positional = "  HF_DIR                      the model folder\n  OUT.gguf "
                  "                   the file to write (atomically)\n",
    .short_threads = true,
};

typedef struct {
    bool quiet;
} progress_state;

static void progress(void *user, int i, int n, const char *name, ts_dtype to) {
    const progress_state *p = user;
    if (!p->quiet)
        fprintf(stderr, "[%4d/%4d] %-40s %s\n", i + 1, n, name,
                ts_dtype_name(to));
}

static void left_out(void *user, const char *tensor) {
    (void)user;
    fprintf(stderr, "tessera: warning: %s has no GGUF name; left out\n",
            tensor);
}

static int run(const cli_cmd *cmd, const char *def_type, int argc,
               char **argv) {
    const char *in = NULL, *out = NULL, *type = def_type;
    progress_state ps = {false};
    cli_parser p;
    cli_val v;
    cli_begin(&p, cmd, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(cmd, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == 1)
            type = v.s;
        else if (id == 2)
            ps.quiet = true;
        else if (!in)
            in = v.s;
        else if (!out)
            out = v.s;
        else
            return cli_fail(cmd, "one input and one output only (got %s too)",
                            v.s);
    }
    if (!in || !out)
        return cli_fail(cmd, "give the model and the file to write");
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_quantize_options o = {.type = type,
                             .progress = progress,
                             .progress_user = &ps,
                             .warn = left_out};
    ts_status s = ts_model_quantize(ctx, in, out, &o);
    if (s != TS_OK) {
        fprintf(stderr, "tessera %s: %s\n", cmd->name, ts_errmsg(ctx));
        ts_ctx_free(ctx);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s)\n", out, type);
    ts_ctx_free(ctx);
    return 0;
}

int tessera_quantize(int argc, char **argv) {
    return run(&QUANTIZE_CMD, "q4_k_m", argc, argv);
}

int tessera_convert(int argc, char **argv) {
    return run(&CONVERT_CMD, "bf16", argc, argv);
}
