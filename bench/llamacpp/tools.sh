#!/bin/bash
# tools.sh — writes and builds our two C programs against the llama.cpp
# that build.sh built (static ggml and libllama under build-llamacpp/build);
# they land in build-llamacpp/build/bin beside llama.cpp's own tools:
#   ts-quant-oracle  float rows -> ggml's quantized block bytes (the oracle
#                    for Tessera's quantizers; see README.md)
#   ts-llama-logits  a GGUF model's logits for token ids or a prompt, f32
#                    (B, T, V) as tests/reference's .logits files
# The sources live here (not as .c files in the repository) because they
# build only against build-llamacpp; build.sh runs this script.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LLAMACPP_DIR:-$ROOT/build-llamacpp}
[ -f "$B/build/CMakeCache.txt" ] || { echo "tools.sh: run build.sh first" >&2; exit 1; }

# the static libraries, wherever this llama.cpp version puts them
lib() {
    local f
    f=$(find "$B/build" -name "lib$1.a" -print -quit)
    [ -n "$f" ] || { echo "tools.sh: lib$1.a not found under $B/build" >&2; exit 1; }
    echo "$f"
}
LLAMA=$(lib llama)
GGML=$(lib ggml)
GGML_CPU=$(lib ggml-cpu)
GGML_BASE=$(lib ggml-base)
INC=(-I"$B/src/include" -I"$B/src/ggml/include")
mkdir -p "$B/tools" "$B/build/bin"

cat >"$B/tools/quant_oracle.c" <<'EOF'
/* quant_oracle.c — ts-quant-oracle: quantizes float rows with ggml's own
 * quantizers (ggml_quantize_chunk, the call llama-quantize makes; without an
 * importance matrix it runs quantize_row_<type>_ref for the q and k types)
 * and writes the block bytes of each row: the oracle that Tessera's
 * quantizers are held against byte for byte. Built by bench/llamacpp/tools.sh
 * against build-llamacpp's static ggml; it is never part of Tessera.
 *
 *   ts-quant-oracle TYPE IN OUT [--cols N] [--in f32|f16|bf16]
 *                   [--imatrix FILE] [--dequant FILE] [--ref]
 *
 * TYPE   a ggml type name (q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K,
 *        q5_K, q6_K, iq4_nl, ...), case-insensitive
 * IN     rows (R, C): a .npy (C order, 1-D or 2-D; <f4, <f2, or <u2/<i2
 *        holding bf16 bits), or a raw little-endian file that needs --cols
 *        (element type from --in, f32 unless told)
 * OUT    R * ggml_row_size(TYPE, C) bytes, row after row
 * --imatrix FILE  C f32 importance weights, as llama-quantize --imatrix
 *        would pass them for this tensor (required by the iq2/iq1 types)
 * --dequant FILE  the rows dequantized again (ggml's to_float), f32 (R, C)
 * --ref  writes quantize_row_<type>_ref's bytes (the type's from_float_ref,
 *        row by row) instead of ggml_quantize_chunk's
 *
 * Without an imatrix it also quantizes each row with from_float_ref and
 * says whether those bytes are ggml_quantize_chunk's: they are for q4_0,
 * q4_1, q5_0, q5_1, q8_0 and q2_K..q6_K, not for i-quants whose _ref tries
 * fewer scales (iq4_nl). Exit status 3 when --ref's bytes are not the ones
 * llama-quantize would write; 1 on bad input, 2 on bad arguments. */
#include "ggml.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum elem { ELEM_F32, ELEM_F16, ELEM_BF16 };

static size_t elem_size(enum elem e) {
    return e == ELEM_F32 ? 4 : 2;
}

static int read_file(const char *path, uint8_t **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 20;
            uint8_t *grown = realloc(buf, cap);
            if (!grown) {
                fprintf(stderr, "%s: out of memory\n", path);
                free(buf), fclose(f);
                return -1;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: read error\n", path);
        free(buf);
        return -1;
    }
    *data = buf, *size = n;
    return 0;
}

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t put = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || put != size) {
        fprintf(stderr, "%s: write error\n", path);
        return -1;
    }
    return 0;
}

/* the value of 'key' in a .npy header dict, e.g. "'descr': '<f4'" -> "'<f4'" */
static const char *npy_field(const char *hdr, const char *key) {
    const char *p = strstr(hdr, key);
    if (!p)
        return NULL;
    p = strchr(p + strlen(key), ':');
    if (!p)
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

/* parses a .npy header; sets rows, cols, element type and the data offset */
static int npy_parse(const char *path, const uint8_t *d, size_t n,
                     int64_t *rows, int64_t *cols, enum elem *e, size_t *off) {
    if (n < 10 || memcmp(d, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "%s: not a .npy file (no \\x93NUMPY magic)\n", path);
        return -1;
    }
    size_t hlen, hstart;
    if (d[6] == 1)
        hlen = d[8] | (size_t)d[9] << 8, hstart = 10;
    else if ((d[6] == 2 || d[6] == 3) && n >= 12)
        hlen = d[8] | (size_t)d[9] << 8 | (size_t)d[10] << 16 |
               (size_t)d[11] << 24,
        hstart = 12;
    else {
        fprintf(stderr, "%s: .npy version %d not known\n", path, d[6]);
        return -1;
    }
    if (hstart + hlen > n) {
        fprintf(stderr, "%s: .npy header runs past the end of the file\n",
                path);
        return -1;
    }
    char *hdr = malloc(hlen + 1);
    if (!hdr)
        return -1;
    memcpy(hdr, d + hstart, hlen);
    hdr[hlen] = 0;
    int rc = -1;
    const char *descr = npy_field(hdr, "'descr'");
    const char *fortran = npy_field(hdr, "'fortran_order'");
    const char *shape = npy_field(hdr, "'shape'");
    if (!descr || !fortran || !shape) {
        fprintf(stderr, "%s: .npy header lacks descr, fortran_order or shape\n",
                path);
    } else if (strncmp(fortran, "False", 5) != 0) {
        fprintf(stderr, "%s: Fortran-order arrays are not read; save C order\n",
                path);
    } else {
        if (strncmp(descr, "'<f4'", 5) == 0)
            *e = ELEM_F32;
        else if (strncmp(descr, "'<f2'", 5) == 0)
            *e = ELEM_F16;
        else if (strncmp(descr, "'<u2'", 5) == 0 ||
                 strncmp(descr, "'<i2'", 5) == 0)
            *e = ELEM_BF16;
        else {
            fprintf(stderr,
                    "%s: dtype %.8s not read (<f4, <f2, or <u2 as bf16 bits)\n",
                    path, descr);
            goto done;
        }
        long long dims[2] = {0, 0};
        int nd = 0;
        const char *p = shape + 1;
        while (*p && *p != ')' && nd < 3) {
            while (*p == ' ' || *p == ',')
                p++;
            if (*p == ')')
                break;
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p)
                break;
            if (nd < 2)
                dims[nd] = v;
            nd++, p = end;
        }
        if (nd < 1 || nd > 2) {
            fprintf(stderr, "%s: shape %.40s: 1-D or 2-D arrays only\n", path,
                    shape);
            goto done;
        }
        *rows = nd == 2 ? dims[0] : 1;
        *cols = nd == 2 ? dims[1] : dims[0];
        *off = hstart + hlen;
        if (*rows < 1 || *cols < 1 ||
            (size_t)(*rows * *cols) * elem_size(*e) != n - *off) {
            fprintf(stderr, "%s: shape and file size disagree\n", path);
            goto done;
        }
        rc = 0;
    }
done:
    free(hdr);
    return rc;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void to_f32(const uint8_t *src, enum elem e, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (e == ELEM_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            dst[i] = e == ELEM_F16 ? ggml_fp16_to_fp32(h) : bf16_to_f32(h);
        }
    }
}

static int type_from_name(const char *name, enum ggml_type *out) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const struct ggml_type_traits *tr = ggml_get_type_traits(t);
        if (tr->blck_size == 0 || !tr->type_name)
            continue;
        if (strcasecmp(tr->type_name, name) == 0) {
            *out = (enum ggml_type)t;
            return 0;
        }
    }
    return -1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: ts-quant-oracle TYPE IN OUT [--cols N] [--in f32|f16|bf16]"
            " [--imatrix FILE] [--dequant FILE] [--ref]\n");
}

int main(int argc, char **argv) {
    const char *pos[3] = {0}, *imatrix_path = NULL, *dequant_path = NULL;
    int npos = 0, want_ref = 0;
    int64_t raw_cols = 0;
    enum elem raw_elem = ELEM_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--cols") || !strcmp(a, "--in") ||
             !strcmp(a, "--imatrix") || !strcmp(a, "--dequant")) &&
            i + 1 >= argc) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--cols")) {
            raw_cols = strtoll(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--in")) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32"))
                raw_elem = ELEM_F32;
            else if (!strcmp(v, "f16"))
                raw_elem = ELEM_F16;
            else if (!strcmp(v, "bf16"))
                raw_elem = ELEM_BF16;
            else {
                fprintf(stderr, "--in %s: f32, f16 or bf16\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--imatrix")) {
            imatrix_path = argv[++i];
        } else if (!strcmp(a, "--dequant")) {
            dequant_path = argv[++i];
        } else if (!strcmp(a, "--ref")) {
            want_ref = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "unknown option %s\n", a);
            usage();
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            usage();
            return 2;
        }
    }
    if (npos != 3) {
        usage();
        return 2;
    }
    enum ggml_type type;
    if (type_from_name(pos[0], &type) != 0) {
        fprintf(stderr, "TYPE %s: not a ggml type name\n", pos[0]);
        return 2;
    }
    const struct ggml_type_traits *tr = ggml_get_type_traits(type);

    uint8_t *in = NULL;
    size_t in_size = 0, off = 0;
    if (read_file(pos[1], &in, &in_size) != 0)
        return 1;
    int64_t rows, cols;
    enum elem e = raw_elem;
    size_t plen = strlen(pos[1]);
    if (plen > 4 && strcmp(pos[1] + plen - 4, ".npy") == 0) {
        if (npy_parse(pos[1], in, in_size, &rows, &cols, &e, &off) != 0)
            return 1;
    } else {
        if (raw_cols < 1) {
            fprintf(stderr, "%s: a raw file needs --cols N\n", pos[1]);
            return 2;
        }
        size_t row_bytes = (size_t)raw_cols * elem_size(e);
        if (in_size == 0 || in_size % row_bytes != 0) {
            fprintf(stderr,
                    "%s: %zu bytes is not a whole number of %lld-"
                    "element rows\n",
                    pos[1], in_size, (long long)raw_cols);
            return 1;
        }
        cols = raw_cols, rows = (int64_t)(in_size / row_bytes);
    }
    if (cols % tr->blck_size != 0) {
        fprintf(stderr,
                "%s: %lld columns is not a multiple of %s's block "
                "of %lld\n",
                pos[1], (long long)cols, tr->type_name,
                (long long)tr->blck_size);
        return 1;
    }
    size_t n = (size_t)rows * (size_t)cols;
    float *x = malloc(n * sizeof(float));
    float *imatrix = NULL;
    size_t row_size = ggml_row_size(type, cols);
    uint8_t *q = malloc(row_size * (size_t)rows);
    uint8_t *q_ref = malloc(row_size * (size_t)rows);
    if (!x || !q || !q_ref) {
        fprintf(stderr, "out of memory for %lld x %lld\n", (long long)rows,
                (long long)cols);
        return 1;
    }
    to_f32(in + off, e, x, n);
    free(in);

    if (imatrix_path) {
        uint8_t *w;
        size_t w_size;
        if (read_file(imatrix_path, &w, &w_size) != 0)
            return 1;
        if (w_size != (size_t)cols * 4) {
            fprintf(stderr, "%s: %zu bytes, %lld f32 expected\n", imatrix_path,
                    w_size, (long long)cols);
            return 1;
        }
        imatrix = (float *)w;
    } else if (ggml_quantize_requires_imatrix(type)) {
        fprintf(stderr, "%s needs --imatrix\n", tr->type_name);
        return 2;
    }

    size_t wrote = ggml_quantize_chunk(type, x, q, 0, rows, cols, imatrix);
    if (wrote != row_size * (size_t)rows) {
        fprintf(stderr, "ggml_quantize_chunk wrote %zu bytes, %zu expected\n",
                wrote, row_size * (size_t)rows);
        return 1;
    }
    if (!ggml_validate_row_data(type, q, wrote)) {
        fprintf(stderr, "ggml_validate_row_data refuses the %s bytes\n",
                tr->type_name);
        return 1;
    }
    if (want_ref && (imatrix || !tr->from_float_ref)) {
        fprintf(stderr, "--ref: %s\n",
                imatrix ? "the _ref functions take no imatrix"
                        : "this type has no from_float_ref");
        return 2;
    }
    const char *ref_check = "not compared with quantize_row_<type>_ref "
                            "(imatrix given or no _ref function)";
    int64_t first_diff = -1;
    if (!imatrix && tr->from_float_ref) {
        for (int64_t r = 0; r < rows; r++) {
            tr->from_float_ref(x + r * cols, q_ref + r * row_size, cols);
            if (first_diff < 0 &&
                memcmp(q_ref + r * row_size, q + r * row_size, row_size))
                first_diff = r;
        }
        ref_check = first_diff < 0
                        ? "equal to quantize_row_<type>_ref row by row"
                        : "quantize_row_<type>_ref gives other bytes";
        if (first_diff >= 0)
            fprintf(stderr,
                    "row %lld: ggml_quantize_chunk (what llama-quantize "
                    "writes) and %s's quantize_row_<type>_ref differ\n",
                    (long long)first_diff, tr->type_name);
    }
    const uint8_t *result = want_ref ? q_ref : q;
    if (write_file(pos[2], result, wrote) != 0)
        return 1;
    if (dequant_path) {
        if (!tr->to_float) {
            fprintf(stderr, "%s has no to_float\n", tr->type_name);
            return 1;
        }
        for (int64_t r = 0; r < rows; r++)
            tr->to_float(result + r * row_size, x + r * cols, cols);
        if (write_file(dequant_path, x, n * sizeof(float)) != 0)
            return 1;
    }
    fprintf(stderr,
            "%s: %lld rows x %lld cols -> %s by %s, %zu bytes/row, "
            "%zu bytes; %s\n",
            pos[1], (long long)rows, (long long)cols, tr->type_name,
            want_ref ? "quantize_row_<type>_ref" : "ggml_quantize_chunk",
            row_size, wrote, ref_check);
    free(x), free(q), free(q_ref), free(imatrix);
    return want_ref && first_diff >= 0 ? 3 : 0;
}
EOF

cat >"$B/tools/llama_logits.c" <<'EOF'
/* llama_logits.c — ts-llama-logits: runs one forward pass of a GGUF model
 * through libllama and writes the logits of every position, so that
 * Tessera's forward can be compared with llama.cpp's on the same file.
 * Built by bench/llamacpp/tools.sh against build-llamacpp's static
 * libllama; it is never part of Tessera.
 *
 *   ts-llama-logits --system-info
 *   ts-llama-logits -m MODEL.gguf (-p TEXT | --ids 1,2,3 | --ids-file F)
 *                   [-o OUT.logits] [--ids-out F] [-t THREADS] [-v]
 *
 * -p TEXT       tokenized by the model's vocabulary (special tokens parsed,
 *               BOS added when the vocabulary says so)
 * --ids LIST    token ids, comma-separated: one sequence
 * --ids-file F  the .ids format of tests/reference: i64 B, i64 T,
 *               then B*T i64 ids, little-endian; B sequences, each decoded
 *               alone from an empty KV cache
 * -o OUT        f32 (B, T, V), little-endian, the layout of the .logits
 *               files of tests/reference (B = 1 for -p and --ids)
 * --ids-out F   the ids used, in the --ids-file format
 * Prints the top 5 tokens of each sequence's last position. */
#include "llama.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose;

/* warnings and errors only, unless -v; a continuation (the loader's
 * progress dots) goes with the level of the line it continues */
static void log_quiet(enum ggml_log_level level, const char *text, void *user) {
    static enum ggml_log_level last = GGML_LOG_LEVEL_INFO;
    (void)user;
    if (level != GGML_LOG_LEVEL_CONT)
        last = level;
    if (verbose || last == GGML_LOG_LEVEL_WARN || last == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* reads the .ids format of tests/reference: i64 B, i64 T, B*T i64 */
static int read_ids_file(const char *path, int64_t *B, int64_t *T,
                         llama_token **ids) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    int64_t bt[2];
    if (fread(bt, 8, 2, f) != 2 || bt[0] < 1 || bt[1] < 1 ||
        bt[0] * bt[1] > (1 << 24)) {
        fprintf(stderr, "%s: no valid (B, T) header\n", path);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)(bt[0] * bt[1]);
    llama_token *out = malloc(n * sizeof(llama_token));
    for (size_t i = 0; out && i < n; i++) {
        int64_t v;
        if (fread(&v, 8, 1, f) != 1 || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "%s: id %zu missing or out of range\n", path, i);
            free(out), fclose(f);
            return -1;
        }
        out[i] = (llama_token)v;
    }
    fclose(f);
    if (!out)
        return -1;
    *B = bt[0], *T = bt[1], *ids = out;
    return 0;
}

static int parse_ids(const char *list, int64_t *T, llama_token **ids) {
    size_t cap = 16, n = 0;
    llama_token *out = malloc(cap * sizeof(llama_token));
    const char *p = list;
    while (out && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "--ids %s: not a list of token ids\n", list);
            free(out);
            return -1;
        }
        if (n == cap) {
            llama_token *grown = realloc(out, 2 * cap * sizeof(llama_token));
            if (!grown)
                break;
            out = grown, cap *= 2;
        }
        out[n++] = (llama_token)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "--ids %s: unexpected '%c'\n", list, *end);
            free(out);
            return -1;
        }
    }
    if (!out || n == 0) {
        free(out);
        return -1;
    }
    *T = (int64_t)n, *ids = out;
    return 0;
}

static void print_top5(const struct llama_vocab *vocab, const float *logits,
                       int32_t V, int64_t b) {
    int best[5] = {-1, -1, -1, -1, -1};
    for (int32_t v = 0; v < V; v++) {
        for (int k = 0; k < 5; k++) {
            if (best[k] < 0 || logits[v] > logits[best[k]]) {
                memmove(&best[k + 1], &best[k], (size_t)(4 - k) * sizeof(int));
                best[k] = v;
                break;
            }
        }
    }
    fprintf(stderr, "sequence %lld, last position, top 5:", (long long)b);
    for (int k = 0; k < 5; k++) {
        char piece[64];
        int32_t len = llama_token_to_piece(vocab, best[k], piece,
                                           sizeof piece - 1, 0, true);
        piece[len > 0 ? len : 0] = 0;
        fprintf(stderr, " %d %.4f '%s'%s", best[k], logits[best[k]], piece,
                k < 4 ? "," : "\n");
    }
}

static void usage(void) {
    fprintf(stderr,
            "usage: ts-llama-logits --system-info\n"
            "       ts-llama-logits -m MODEL.gguf (-p TEXT | --ids 1,2,3 | "
            "--ids-file F) [-o OUT.logits] [--ids-out F] [-t THREADS] "
            "[-v]\n");
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *ids_list = NULL;
    const char *ids_file = NULL, *out_path = NULL, *ids_out = NULL;
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--system-info")) {
            llama_log_set(log_quiet, NULL);
            llama_backend_init();
            printf("%s\n", llama_print_system_info());
            llama_backend_free();
            return 0;
        } else if (!strcmp(a, "-v")) {
            verbose = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!has_value) {
            fprintf(stderr, "%s: unknown, or missing its value\n", a);
            usage();
            return 2;
        } else if (!strcmp(a, "-m")) {
            model_path = argv[++i];
        } else if (!strcmp(a, "-p")) {
            prompt = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_list = argv[++i];
        } else if (!strcmp(a, "--ids-file")) {
            ids_file = argv[++i];
        } else if (!strcmp(a, "-o")) {
            out_path = argv[++i];
        } else if (!strcmp(a, "--ids-out")) {
            ids_out = argv[++i];
        } else if (!strcmp(a, "-t")) {
            threads = atoi(argv[++i]);
        } else {
            fprintf(stderr, "unknown option %s\n", a);
            usage();
            return 2;
        }
    }
    if (!model_path || (!!prompt + !!ids_list + !!ids_file) != 1 ||
        threads < 1) {
        usage();
        return 2;
    }

    int64_t B = 1, T = 0;
    llama_token *ids = NULL;
    if (ids_file && read_ids_file(ids_file, &B, &T, &ids) != 0)
        return 1;
    if (ids_list && parse_ids(ids_list, &T, &ids) != 0)
        return 1;

    llama_log_set(log_quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "%s: llama.cpp cannot load this model\n", model_path);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int32_t V = llama_vocab_n_tokens(vocab);

    if (prompt) {
        int32_t len = (int32_t)strlen(prompt);
        int32_t n = -llama_tokenize(vocab, prompt, len, NULL, 0,
                                    llama_vocab_get_add_bos(vocab), true);
        ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(llama_token));
        if (n < 1 || !ids ||
            llama_tokenize(vocab, prompt, len, ids, n,
                           llama_vocab_get_add_bos(vocab), true) != n) {
            fprintf(stderr, "-p: the prompt gives no tokens\n");
            return 1;
        }
        T = n;
    }
    for (int64_t i = 0; i < B * T; i++) {
        if (ids[i] >= V) {
            fprintf(stderr, "token id %d at %lld: the vocabulary has %d\n",
                    ids[i], (long long)i, V);
            return 1;
        }
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(T < 256 ? 256 : T);
    cp.n_batch = cp.n_ubatch = (uint32_t)T;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "%s: cannot make a context of %lld tokens\n",
                model_path, (long long)T);
        return 1;
    }

    FILE *out = out_path ? fopen(out_path, "wb") : NULL;
    if (out_path && !out) {
        perror(out_path);
        return 1;
    }
    struct llama_batch batch = llama_batch_init((int32_t)T, 0, 1);
    int rc = 0;
    for (int64_t b = 0; b < B && rc == 0; b++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = (int32_t)T;
        for (int32_t t = 0; t < (int32_t)T; t++) {
            batch.token[t] = ids[b * T + t];
            batch.pos[t] = t;
            batch.n_seq_id[t] = 1;
            batch.seq_id[t][0] = 0;
            batch.logits[t] = 1;
        }
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed on sequence %lld\n",
                    (long long)b);
            rc = 1;
            break;
        }
        for (int32_t t = 0; t < (int32_t)T; t++) {
            const float *row = llama_get_logits_ith(ctx, t);
            if (!row) {
                fprintf(stderr, "no logits at sequence %lld position %d\n",
                        (long long)b, t);
                rc = 1;
                break;
            }
            if (out &&
                fwrite(row, sizeof(float), (size_t)V, out) != (size_t)V) {
                fprintf(stderr, "%s: write error\n", out_path);
                rc = 1;
                break;
            }
            if (t == (int32_t)T - 1)
                print_top5(vocab, row, V, b);
        }
    }
    if (out && fclose(out) != 0) {
        fprintf(stderr, "%s: write error\n", out_path);
        rc = 1;
    }
    if (rc == 0 && ids_out) {
        FILE *f = fopen(ids_out, "wb");
        int64_t bt[2] = {B, T};
        int ok = f && fwrite(bt, 8, 2, f) == 2;
        for (int64_t i = 0; ok && i < B * T; i++) {
            int64_t v = ids[i];
            ok = fwrite(&v, 8, 1, f) == 1;
        }
        if (!f || fclose(f) != 0 || !ok) {
            fprintf(stderr, "%s: write error\n", ids_out);
            rc = 1;
        }
    }
    if (rc == 0)
        fprintf(stderr, "%lld x %lld tokens, vocabulary %d%s%s\n", (long long)B,
                (long long)T, V, out_path ? " -> " : "",
                out_path ? out_path : "");
    llama_batch_free(batch);
    free(ids);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
EOF

CFLAGS=(-std=c11 -O2 -Wall -Wextra -Werror)
# the oracle needs only ggml-base (ggml.c, ggml-quants.c: the code that
# llama-quantize runs to quantize; ggml-base has C++ and OpenMP parts, hence
# c++ -fopenmp to link)
cc "${CFLAGS[@]}" "${INC[@]}" -c "$B/tools/quant_oracle.c" -o "$B/tools/quant_oracle.o"
c++ "$B/tools/quant_oracle.o" "$GGML_BASE" -fopenmp -lm -lpthread \
    -o "$B/build/bin/ts-quant-oracle"
cc "${CFLAGS[@]}" "${INC[@]}" -c "$B/tools/llama_logits.c" -o "$B/tools/llama_logits.o"
c++ "$B/tools/llama_logits.o" "$LLAMA" "$GGML" "$GGML_CPU" "$GGML_BASE" \
    -fopenmp -lm -lpthread -o "$B/build/bin/ts-llama-logits"
echo "tools.sh: built $B/build/bin/ts-quant-oracle and $B/build/bin/ts-llama-logits"
