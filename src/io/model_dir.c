/* model_dir.c — what a model path must be: a Hugging Face folder with
 * config.json, model.safetensors (or shards with
 * model.safetensors.index.json) and tokenizer.json. Turns the commonest
 * mistakes (a file given for its folder, a GGUF file, a folder missing
 * files, a path that does not exist) into errors that say what to give
 * instead. Reads names and the first bytes of a file; owns nothing after
 * it returns. */
#include "tessera_gguf.h"
#include "tessera_io.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define WHAT_A_MODEL_IS                                                        \
    "a model is a Hugging Face folder (config.json, *.safetensors, "           \
    "tokenizer.json)"
#define MAX_LISTED 10

static bool is_file_in(const char *dir, const char *name) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

bool ts_file_is_gguf(const char *path) {
    FILE *f = path ? fopen(path, "rb") : NULL;
    char magic[4] = {0};
    bool gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f)
        fclose(f);
    return gguf;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "a, b, c and 4 more" of the folder's entries (sorted), into buf; the
 * hints that some of them call for into hint */
static void list_folder(const char *dir, char *buf, size_t n, char *hint,
                        size_t nh) {
    buf[0] = hint[0] = 0;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(buf, n, "(cannot list it: %s)", strerror(errno));
        return;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    bool gguf = false, bin = false, shards = false;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        gguf |= ends_with(e->d_name, ".gguf");
        bin |= ends_with(e->d_name, ".bin") || ends_with(e->d_name, ".pt") ||
               ends_with(e->d_name, ".pth");
        shards |= ends_with(e->d_name, ".safetensors");
        if (count == cap) {
            size_t c2 = cap ? 2 * cap : 16;
            char **p = realloc(names, sizeof *p * c2);
            if (!p)
                break;
            names = p, cap = c2;
        }
        if (!(names[count] = strdup(e->d_name)))
            break;
        count++;
    }
    closedir(d);
    qsort(names, count, sizeof *names, by_name);
    size_t at = 0;
    if (!count)
        snprintf(buf, n, "nothing");
    for (size_t i = 0; i < count && at < n; i++) {
        if (i == MAX_LISTED) {
            at += (size_t)snprintf(buf + at, n - at, " and %zu more",
                                   count - MAX_LISTED);
            break;
        }
        at +=
            (size_t)snprintf(buf + at, n - at, "%s%s", i ? ", " : "", names[i]);
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    size_t h = 0;
    if (gguf)
        h += (size_t)snprintf(hint + h, nh - h,
                              "; a GGUF file is a model by itself: give "
                              "the .gguf file (-m FILE.gguf)");
    if (bin && h < nh)
        h += (size_t)snprintf(hint + h, nh - h,
                              "; PyTorch .bin/.pt weights are not read: save "
                              "them as safetensors");
    if (shards && !is_file_in(dir, "model.safetensors") &&
        !is_file_in(dir, "model.safetensors.index.json") && h < nh)
        snprintf(hint + h, nh - h,
                 "; *.safetensors shards need their "
                 "model.safetensors.index.json");
}

ts_status ts_model_dir_check(ts_ctx *ctx, const char *path, unsigned need) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "model folder: NULL path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ts_set_error(ctx, TS_ERR_IO, "%s: no such folder (%s); %s", path,
                            strerror(errno), WHAT_A_MODEL_IS);
    if (!S_ISDIR(sb.st_mode)) {
        if (ts_file_is_gguf(path)) { /* config, weights, tokenizer in one */
            ts_gguf *g = NULL;
            ts_status s = ts_gguf_open(ctx, path, &g);
            ts_gguf_close(g);
            return s;
        }
        char copy[4096], real[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", path);
        const char *parent = dirname(copy);
        if (realpath(parent, real))
            parent = real;
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: got a file; %s; did you mean its folder %s?",
                            path, WHAT_A_MODEL_IS, parent);
    }
    char missing[256] = "", looked[256] = "";
    size_t m = 0, l = 0;
#define NEED(flag, present, name)                                              \
    if (need & (flag)) {                                                       \
        l += (size_t)snprintf(looked + l, sizeof looked - l, "%s%s",           \
                              l ? ", " : "", name);                            \
        if (!(present))                                                        \
            m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%s",     \
                                  m ? ", " : "", name);                        \
    }
    NEED(TS_MODEL_CONFIG, is_file_in(path, "config.json"), "config.json");
    NEED(TS_MODEL_WEIGHTS,
         is_file_in(path, "model.safetensors") ||
             is_file_in(path, "model.safetensors.index.json"),
         "model.safetensors | model.safetensors.index.json");
    NEED(TS_MODEL_TOKENIZER, is_file_in(path, "tokenizer.json"),
         "tokenizer.json");
#undef NEED
    if (!m)
        return TS_OK;
    char held[1024], hint[512];
    list_folder(path, held, sizeof held, hint, sizeof hint);
    return ts_set_error(ctx, TS_ERR_IO,
                        "%s: not a model folder: no %s (looked for %s; the "
                        "folder holds %s)%s",
                        path, missing, looked, held, hint);
}

char *ts_model_file_text(ts_ctx *ctx, const char *model, const char *file) {
    if (!ctx || !model || !file)
        return NULL;
    char *text = NULL;
    if (ts_file_is_gguf(model)) {
        if (ts_gguf_hf_file_text(ctx, model, file, &text) != TS_OK)
            ts_clear_error(ctx);
        return text;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", model, file);
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    text = malloc(cap);
    for (size_t got; text && (got = fread(text + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *t = realloc(text, cap *= 2);
            if (!t)
                free(text);
            text = t;
        }
    }
    fclose(f);
    if (text)
        text[n] = 0;
    return text;
}
