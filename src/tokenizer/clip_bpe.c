/* clip_bpe.c — CLIP's tokenizer from the files a Stable Diffusion
 * pipeline's tokenizer/ folder holds (vocab.json, merges.txt,
 * tokenizer_config.json, special_tokens_map.json), written as the
 * tokenizer.json that transformers' CLIPConverter makes of them, so that
 * bpe.c loads both forms the same way: NFC, whitespace runs to one space
 * and Lowercase; the Split of CLIP's regex (matches kept) then ByteLevel;
 * BPE with `</w>` ending each word; <|startoftext|> text <|endoftext|>
 * (RobertaProcessing). Also the special tokens a folder's configs name.
 * Owns no tokenizer state. */
#include "clip_bpe.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* CLIPTokenizer reads merges.txt's lines 1 .. 49152 - 256 - 2 (line 0 is
 * "#version"): a longer file's rest is not used */
#define CLIP_MAX_MERGES (49152 - 256 - 2)

#define CLIP_PATTERN                                                           \
    "'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+"

static bool file_exists(const char *dir, const char *name) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool ts_clip_folder(const char *dir) {
    return !file_exists(dir, "tokenizer.json") &&
           file_exists(dir, "vocab.json") && file_exists(dir, "merges.txt");
}

/* dir/name as a JSON object; *obj NULL when the file is absent */
static ts_status load_object(ts_ctx *ctx, const char *dir, const char *name,
                             json_t **obj) {
    *obj = NULL;
    if (!file_exists(dir, name))
        return TS_OK;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    /* configs hold model_max_length as 1e30 written out: as a double */
    json_t *j = json_load_file(
        p, strcmp(name, "vocab.json") ? JSON_DECODE_INT_AS_REAL : 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return ts_set_error(ctx, TS_ERR_IO, "%s: line %d: %s", p,
                            j ? 1 : je.line, j ? "not a JSON object" : je.text);
    }
    *obj = j;
    return TS_OK;
}

/* a token as configs write it: "..." or {"content": "...", ...} */
static const char *token_string(json_t *v) {
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

ts_status ts_tokenizer_config_token(ts_ctx *ctx, const char *dir,
                                    const char *key, char *out, size_t cap) {
    out[0] = 0;
    const char *files[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (int k = 0; k < 2 && !out[0]; k++) {
        json_t *j;
        ts_status s = load_object(ctx, dir, files[k], &j);
        if (s)
            return s;
        const char *v = j ? token_string(json_object_get(j, key)) : NULL;
        if (v && strlen(v) >= cap) {
            json_decref(j);
            return ts_set_error(ctx, TS_ERR_IO,
                                "%s/%s: %s is longer than %zu bytes", dir,
                                files[k], key, cap - 1);
        }
        if (v)
            snprintf(out, cap, "%s", v);
        json_decref(j);
    }
    return TS_OK;
}

/* the whole of dir/name, NUL-terminated (malloc'd) */
static char *read_text(ts_ctx *ctx, const char *dir, const char *name,
                       size_t *len) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 &&
        !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len = (size_t)n;
        fclose(f);
        return buf;
    }
    free(buf);
    if (f)
        fclose(f);
    ts_set_error(ctx, TS_ERR_IO, "%s: cannot read", p);
    return NULL;
}

/* merges.txt: after the first line, "a b" per line (whitespace-split, as
 * Python's str.split()), at most CLIP_MAX_MERGES -> [[a, b], ...] */
static ts_status parse_merges(ts_ctx *ctx, const char *dir, json_t *out,
                              bool *has_eow) {
    size_t n;
    char *text = read_text(ctx, dir, "merges.txt", &n);
    if (!text)
        return ts_ctx_status(ctx);
    ts_status s = TS_OK;
    char *line = text, *save = NULL;
    /* text.strip().split("\n"): leading blank lines do not count */
    while (*line == '\n' || *line == '\r' || *line == ' ' || *line == '\t')
        line++;
    int lineno = 0, count = 0;
    for (char *l = strtok_r(line, "\n", &save); l && count < CLIP_MAX_MERGES;
         l = strtok_r(NULL, "\n", &save)) {
        if (lineno++ == 0)
            continue; /* "#version: 0.2" */
        char *parts[3] = {0};
        int np = 0;
        char *ws = NULL;
        for (char *w = strtok_r(l, " \t\r", &ws); w && np < 3;
             w = strtok_r(NULL, " \t\r", &ws))
            parts[np++] = w;
        if (np != 2) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s/merges.txt: line %d is not two tokens "
                             "separated by a space",
                             dir, lineno);
            break;
        }
        size_t lb = strlen(parts[1]);
        if (lb >= 4 && !strcmp(parts[1] + lb - 4, "</w>"))
            *has_eow = true;
        if (json_array_append_new(out, json_pack("[ss]", parts[0], parts[1]))) {
            s = ts_set_error(ctx, TS_ERR_OOM, "%s/merges.txt: out of memory",
                             dir);
            break;
        }
        count++;
    }
    free(text);
    return s;
}

ts_status ts_clip_tokenizer_json(ts_ctx *ctx, const char *dir, char **text,
                                 size_t *len) {
    *text = NULL, *len = 0;
    json_t *config = NULL, *vocab = NULL, *root = NULL;
    json_t *merges = json_array();
    ts_status s = merges
                      ? load_object(ctx, dir, "tokenizer_config.json", &config)
                      : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    const char *cls =
        config ? json_string_value(json_object_get(config, "tokenizer_class"))
               : NULL;
    if (!s && cls && strcmp(cls, "CLIPTokenizer") &&
        strcmp(cls, "CLIPTokenizerFast"))
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: tokenizer_class \"%s\" from vocab.json + "
                         "merges.txt is not supported (CLIPTokenizer; other "
                         "tokenizers need their tokenizer.json)",
                         dir, cls);
    if (!s)
        s = load_object(ctx, dir, "vocab.json", &vocab);
    bool has_eow = false;
    if (!s)
        s = parse_merges(ctx, dir, merges, &has_eow);
    if (!s && !cls && !has_eow)
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: vocab.json + merges.txt without a "
                         "tokenizer_class and without CLIP's `</w>` merges: "
                         "only CLIP's tokenizer is built from these files "
                         "(others need their tokenizer.json)",
                         dir);
    /* the special tokens, CLIPTokenizer's defaults unless the configs
     * name others (the pad token also as tokenizer.json's padding); each one an
     * added special token, as transformers adds them (SD 2.x's pad "!" too: a
     * "!" in the text becomes it) */
    const char *keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    const char *defaults[] = {"<|startoftext|>", "<|endoftext|>",
                              "<|endoftext|>", "<|endoftext|>"};
    char tok[4][256];
    json_int_t ids[4];
    for (int k = 0; k < 4 && !s; k++) {
        s = ts_tokenizer_config_token(ctx, dir, keys[k], tok[k], sizeof tok[k]);
        if (!s && !tok[k][0])
            snprintf(tok[k], sizeof tok[k], "%s", defaults[k]);
        json_t *id = s ? NULL : json_object_get(vocab, tok[k]);
        if (!s && !json_is_integer(id))
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s/vocab.json: the %s \"%s\" is not in the "
                             "vocabulary",
                             dir, keys[k], tok[k]);
        ids[k] = json_integer_value(id);
    }
    json_t *added = s ? NULL : json_array();
    for (int k = 0; k < 4 && added; k++) {
        bool dup = false; /* in id order, each once */
        for (int j = 0; j < k; j++)
            dup = dup || ids[j] == ids[k];
        if (dup)
            continue;
        size_t at = json_array_size(added);
        for (size_t i = 0; i < json_array_size(added); i++)
            if (json_integer_value(
                    json_object_get(json_array_get(added, i), "id")) > ids[k] &&
                at == json_array_size(added))
                at = i;
        json_array_insert_new(added, at,
                              json_pack("{sI ss sb sb sb sb sb}", "id", ids[k],
                                        "content", tok[k], "single_word", 0,
                                        "lstrip", 0, "rstrip", 0, "normalized",
                                        0, "special", 1));
    }
    if (!s) {
        root = json_pack(
            "{s:s s:n s:{s:s s:s s:I s:I s:s} s:o"
            " s:{s:s s:[{s:s} {s:s s:{s:s} s:s} {s:s}]}"
            " s:{s:s s:[{s:s s:{s:s} s:s s:b} {s:s s:b s:b s:b}]}"
            " s:{s:s s:[sI] s:[sI] s:b s:b}"
            " s:{s:s s:b s:b s:b}"
            " s:{s:s s:n s:s s:s s:s s:b s:b s:O s:O}}",
            "version", "1.0", "truncation", "padding", "strategy",
            "BatchLongest", "direction", "Right", "pad_id", ids[3],
            "pad_type_id", (json_int_t)0, "pad_token", tok[3], "added_tokens",
            added, "normalizer", "type", "Sequence", "normalizers", "type",
            "NFC", "type", "Replace", "pattern", "Regex", "\\s+", "content",
            " ", "type", "Lowercase", "pre_tokenizer", "type", "Sequence",
            "pretokenizers", "type", "Split", "pattern", "Regex", CLIP_PATTERN,
            "behavior", "Removed", "invert", 1, "type", "ByteLevel",
            "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1,
            "post_processor", "type", "RobertaProcessing", "sep", tok[1],
            ids[1], "cls", tok[0], ids[0], "trim_offsets", 0,
            "add_prefix_space", 0, "decoder", "type", "ByteLevel",
            "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model",
            "type", "BPE", "dropout", "unk_token", tok[2],
            "continuing_subword_prefix", "", "end_of_word_suffix", "</w>",
            "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges",
            merges);
        added = NULL; /* stolen by "o" */
        if (!root)
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    }
    if (!s) {
        *text = json_dumps(root, JSON_COMPACT);
        if (!*text)
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
        else
            *len = strlen(*text);
    }
    json_decref(added);
    json_decref(root), json_decref(config), json_decref(vocab);
    json_decref(merges);
    return s;
}
