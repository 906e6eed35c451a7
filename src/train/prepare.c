/* prepare.c — text files to token shards with a train/validation split
 * (`tessera prepare-data`, tessera_train.h). */
#include "tessera_train.h"

#include "tessera_io.h"
#include "tessera_tokenizer.h"

#include "core/core.h"
#include "core/strbuf.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int32_t *p;
    size_t n, cap;
} ids_buf;

static bool push(ids_buf *b, const int32_t *ids, size_t n) {
    if (!n) /* memcpy to a NULL buffer is undefined even for 0 bytes */
        return true;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n)
            cap *= 2;
        int32_t *p = realloc(b->p, sizeof *p * cap);
        if (!p)
            return false;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, ids, sizeof *ids * n);
    b->n += n;
    return true;
}

/* b's tokens as shards prefix_NNN.bin of at most per tokens each */
static ts_status write_shards(ts_ctx *ctx, const char *dir, const char *prefix,
                              const ids_buf *b, int64_t per, int *count) {
    *count = 0;
    for (size_t at = 0; at < b->n || (!at && !b->n); at += (size_t)per) {
        if (!b->n)
            break;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, prefix, *count);
        size_t n = b->n - at < (size_t)per ? b->n - at : (size_t)per;
        ts_status st = ts_shard_write(ctx, path, b->p + at, n);
        if (st != TS_OK)
            return st;
        (*count)++;
    }
    return TS_OK;
}

/* whether a chunk that ends here, before a line starting with next, is
 * encoded as the whole text would be: after "x\n" and before "y" with x
 * and y printable ASCII, every pre-tokenizer (GPT-2's, Llama 3's, Qwen's)
 * splits anyway. Not after " \n", "\r\n" or "\n\n", where whitespace
 * runs join differently at the end of a text, nor inside a line, which
 * could cut a UTF-8 character. */
static bool cut_here(const ts_sbuf *chunk, char next) {
    return chunk->n >= 2 && chunk->p[chunk->n - 1] == '\n' && next > ' ' &&
           next < 0x7f && chunk->p[chunk->n - 2] > ' ' &&
           chunk->p[chunk->n - 2] < 0x7f;
}

/* shards prefix_NNN.bin of an earlier run with NNN >= count: the loader
 * reads every one, so they must go */
static void remove_stale_shards(const char *dir, const char *prefix,
                                int count) {
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t pl = strlen(prefix);
    while (d && (e = readdir(d))) {
        const char *nm = e->d_name;
        char *end;
        if (strncmp(nm, prefix, pl) || nm[pl] != '_' || nm[pl + 1] < '0' ||
            nm[pl + 1] > '9')
            continue;
        long k = strtol(nm + pl + 1, &end, 10);
        if (strcmp(end, ".bin") || k < count)
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, nm);
        unlink(p);
    }
    if (d)
        closedir(d);
}

/* the special tokens tokenizer_config.json names must be in the
 * tokenizer's vocabulary */
static ts_status check_special_tokens(ts_ctx *ctx, const char *dir,
                                      const ts_tokenizer *tok) {
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    json_t *c = json_load_file(p, 0, NULL);
    if (!c)
        return TS_OK; /* optional */
    static const char *const keys[] = {"bos_token", "eos_token", "pad_token",
                                       "unk_token"};
    ts_status st = TS_OK;
    for (int i = 0; i < 4 && st == TS_OK; i++) {
        json_t *v = json_object_get(c, keys[i]);
        if (json_is_object(v)) /* {"content": "<|endoftext|>", ...} */
            v = json_object_get(v, "content");
        const char *t = json_string_value(v);
        if (t && ts_tokenizer_token_id(tok, t) < 0)
            st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                              "prepare-data: %s names %s \"%s\", which is not "
                              "in the tokenizer's vocabulary of %d ids "
                              "(%s/tokenizer.json)",
                              p, keys[i], t, ts_tokenizer_vocab_size(tok), dir);
    }
    json_decref(c);
    return st;
}

/* --model-config: the model that will train on these shards must hold
 * every id of the tokenizer, and its special ids must be the tokenizer's */
static ts_status check_model(ts_ctx *ctx, const char *cfg, const char *tdir,
                             const ts_tokenizer *tok) {
    ts_model_config mc;
    ts_status st = ts_config_load(ctx, cfg, &mc);
    if (st != TS_OK)
        return st;
    int64_t tv = ts_tokenizer_vocab_size(tok);
    if (mc.vocab < tv)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "prepare-data: the model's vocab_size %lld (%s) "
                            "is smaller than the tokenizer's %lld ids (%s: "
                            "ids 0..%lld)",
                            (long long)mc.vocab, cfg, (long long)tv, tdir,
                            (long long)tv - 1);
    json_t *j = json_load_file(cfg, 0, NULL);
    json_t *pad = json_object_get(j, "pad_token_id");
    int64_t pad_id = json_is_integer(pad) ? json_integer_value(pad) : -1;
    json_decref(j);
    struct {
        const char *name;
        int64_t id;
    } sp[3] = {{"bos_token_id", mc.bos_token_id},
               {"eos_token_id", mc.eos_token_id},
               {"pad_token_id", pad_id}};
    for (int i = 0; i < 3; i++)
        if (sp[i].id >= tv)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "prepare-data: %s %lld in %s is not an id of "
                                "the tokenizer (%s has ids 0..%lld)",
                                sp[i].name, (long long)sp[i].id, cfg, tdir,
                                (long long)tv - 1);
    return TS_OK;
}

ts_status ts_prepare_data(ts_ctx *ctx, const char *const *files, int n_files,
                          const ts_prepare_options *o, ts_prepare_result *res) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!files || n_files < 1 || !o || !o->tokenizer_dir || !o->out_dir)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "prepare-data: a tokenizer, an output folder and "
                            "input files are needed");
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "prepare-data: val fraction %g (want 0 <= f < 1)",
                            o->val_fraction);
    if (o->shard_tokens < 1024)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "prepare-data: shard size %lld tokens (want >= "
                            "1024)",
                            (long long)o->shard_tokens);
    ts_tokenizer *tok = NULL;
    ts_status st = ts_tokenizer_load(ctx, o->tokenizer_dir, &tok);
    if (st != TS_OK)
        return st;
    char hash[TS_TOKENIZER_HASH_LEN], tok_file[4200];
    st = check_special_tokens(ctx, o->tokenizer_dir, tok);
    if (st == TS_OK && o->model_config)
        st = check_model(ctx, o->model_config, o->tokenizer_dir, tok);
    if (st == TS_OK)
        st = ts_tokenizer_file_hash(ctx, o->tokenizer_dir, hash, tok_file,
                                    sizeof tok_file);
    if (st != TS_OK) {
        ts_tokenizer_free(tok);
        return st;
    }
    if (mkdir(o->out_dir, 0755) && errno != EEXIST) {
        ts_tokenizer_free(tok);
        return ts_set_error(ctx, TS_ERR_IO, "cannot create %s: %s", o->out_dir,
                            strerror(errno));
    }
    int32_t eot = ts_tokenizer_token_id(tok, "<|endoftext|>");
    ids_buf train = {0}, val = {0};
    ts_prepare_result r = {0};
    int64_t total = 0;
    for (int f = 0; f < n_files; f++) {
        struct stat sb;
        if (!stat(files[f], &sb))
            total += (int64_t)sb.st_size;
    }
    for (int f = 0; f < n_files && st == TS_OK; f++) {
        FILE *fp = fopen(files[f], "rb");
        if (!fp) {
            st =
                ts_set_error(ctx, TS_ERR_IO, "prepare-data: cannot open %s: %s",
                             files[f], strerror(errno));
            break;
        }
        ids_buf doc = {0};
        ts_sbuf chunk = {0};
        char *line = NULL;
        size_t line_cap = 0;
        ssize_t k = 0;
        bool eof = false, carry = false;
        while (st == TS_OK && !eof) {
            /* about 1 MiB of whole lines at a time, for progress */
            eof = true;
            if (carry)
                ts_sb_add(&chunk, line, (size_t)k), carry = false;
            while ((k = getline(&line, &line_cap, fp)) > 0) {
                if (chunk.n >= (1 << 20) && cut_here(&chunk, line[0])) {
                    carry = true, eof = false; /* line opens the next */
                    break;
                }
                ts_sb_add(&chunk, line, (size_t)k);
            }
            if (ferror(fp)) { /* e.g. a folder */
                st = ts_set_error(ctx, TS_ERR_IO,
                                  "prepare-data: cannot read %s: %s", files[f],
                                  strerror(errno));
                break;
            }
            if (!chunk.n)
                break;
            int32_t *ids = NULL;
            size_t n = 0;
            st = ts_tokenizer_encode(tok, chunk.p, chunk.n, false, &ids, &n);
            if (st == TS_OK && !push(&doc, ids, n))
                st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
            free(ids);
            r.bytes += (int64_t)chunk.n;
            chunk.n = 0;
            if (!o->quiet && total > 0)
                fprintf(stderr,
                        "\rprepare-data: %5.1f%% of %.1f MB, %zu tokens",
                        100.0 * (double)r.bytes / (double)total, total / 1e6,
                        train.n + val.n + doc.n);
        }
        fclose(fp);
        free(chunk.p), free(line);
        if (st == TS_OK && eot >= 0 && !push(&doc, &eot, 1))
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
        size_t n_val = (size_t)((double)doc.n * o->val_fraction);
        if (st == TS_OK && (!push(&train, doc.p, doc.n - n_val) ||
                            !push(&val, doc.p + doc.n - n_val, n_val)))
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
        free(doc.p);
    }
    if (!o->quiet && total > 0)
        fputc('\n', stderr);
    if (st == TS_OK)
        st = write_shards(ctx, o->out_dir, "train", &train, o->shard_tokens,
                          &r.train_shards);
    if (st == TS_OK)
        st = write_shards(ctx, o->out_dir, "val", &val, o->shard_tokens,
                          &r.val_shards);
    if (st == TS_OK) {
        remove_stale_shards(o->out_dir, "train", r.train_shards);
        remove_stale_shards(o->out_dir, "val", r.val_shards);
    }
    static const char *const tf[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && st == TS_OK; i++) {
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/%s", o->tokenizer_dir, tf[i]);
        snprintf(to, sizeof to, "%s/%s", o->out_dir, tf[i]);
        struct stat a, b;
        if (!stat(from, &a) && !stat(to, &b) && a.st_ino == b.st_ino)
            continue;                /* the same file */
        if (access(from, R_OK) == 0) /* tokenizer_config.json may lack */
            st = ts_copy_file(ctx, from, to);
    }
    r.train_tokens = (int64_t)train.n, r.val_tokens = (int64_t)val.n;
    if (st == TS_OK) {
        json_t *m = json_pack(
            "{s:i, s:I, s:I, s:I, s:i, s:i, s:I, s:f}", "vocab_size",
            ts_tokenizer_vocab_size(tok), "train_tokens", (json_int_t)train.n,
            "val_tokens", (json_int_t)val.n, "bytes", (json_int_t)r.bytes,
            "train_shards", r.train_shards, "val_shards", r.val_shards,
            "eot_token_id", (json_int_t)eot, "val_fraction", o->val_fraction);
        json_object_set_new(m, "tokenizer_hash", json_string(hash));
        json_object_set_new(m, "tokenizer", json_string(tok_file));
        char p[4200];
        snprintf(p, sizeof p, "%s/meta.json", o->out_dir);
        if (json_dump_file(m, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
            st = ts_set_error(ctx, TS_ERR_IO, "cannot write %s", p);
        json_decref(m);
    }
    if (res)
        *res = r;
    free(train.p), free(val.p);
    ts_tokenizer_free(tok);
    return st;
}
