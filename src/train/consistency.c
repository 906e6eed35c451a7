/* consistency.c — the model, the tokenizer and the data agree before
 * `tessera train` builds anything (consistency.h); it reads config.json,
 * tokenizer.json and meta.json, and writes nothing. */
#define _GNU_SOURCE
#include "train/consistency.h"

#include "tessera_tokenizer.h"

#include "core/core.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static bool has_tokenizer(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return access(p, R_OK) == 0;
}

/* pad_token_id of a config.json (an integer, or -1) */
static int64_t config_pad_id(const char *path) {
    json_t *j = json_load_file(path, 0, NULL);
    json_t *v = json_object_get(j, "pad_token_id");
    int64_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(j);
    return id;
}

ts_status ts_train_check_consistency(ts_ctx *ctx, const ts_train_options *o,
                                     const char *cfg, const ts_model_config *mc,
                                     bool speak, char *tok_dir,
                                     size_t tok_cap) {
    bool gpt2 = mc->arch == TS_ARCH_GPT2;
    if (mc->max_positions > 0 && o->seq > mc->max_positions)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "train: --seq %lld is longer than the model's "
                            "%lld positions (%s in %s)",
                            (long long)o->seq, (long long)mc->max_positions,
                            gpt2 ? "n_positions" : "max_position_embeddings",
                            cfg);
    struct {
        const char *name;
        int64_t id;
    } special[3] = {{"bos_token_id", mc->bos_token_id},
                    {"eos_token_id", mc->eos_token_id},
                    {"pad_token_id", config_pad_id(cfg)}};
    for (int i = 0; i < 3; i++)
        if (special[i].id >= mc->vocab)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "train: %s %lld in %s is outside the model's "
                                "vocabulary (vocab_size %lld: ids 0..%lld)",
                                special[i].name, (long long)special[i].id, cfg,
                                (long long)mc->vocab, (long long)mc->vocab - 1);
    /* the tokenizer */
    if (o->tokenizer_dir)
        snprintf(tok_dir, tok_cap, "%s", o->tokenizer_dir);
    else if (has_tokenizer(o->data_dir))
        snprintf(tok_dir, tok_cap, "%s", o->data_dir);
    else if (o->init_from && has_tokenizer(o->init_from))
        snprintf(tok_dir, tok_cap, "%s", o->init_from);
    char hash[TS_TOKENIZER_HASH_LEN] = "", tok_file[4200] = "";
    if (tok_dir[0]) {
        ts_tokenizer *tok = NULL;
        ts_status st = ts_tokenizer_file_hash(ctx, tok_dir, hash, tok_file,
                                              sizeof tok_file);
        if (st == TS_OK)
            st = ts_tokenizer_load(ctx, tok_dir, &tok);
        if (st != TS_OK)
            return st;
        int64_t tv = ts_tokenizer_vocab_size(tok);
        ts_tokenizer_free(tok);
        if (mc->vocab < tv)
            return ts_set_error(
                ctx, TS_ERR_INVALID_ARG,
                "train: the model's vocab_size %lld (%s) is smaller than the "
                "tokenizer's %lld ids (%s: ids 0..%lld); the model needs "
                "vocab_size >= %lld",
                (long long)mc->vocab, cfg, (long long)tv, tok_file,
                (long long)tv - 1, (long long)tv);
        for (int i = 0; i < 3; i++)
            if (special[i].id >= tv)
                return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                    "train: %s %lld in %s is not an id of the "
                                    "tokenizer (%s has ids 0..%lld)",
                                    special[i].name, (long long)special[i].id,
                                    cfg, tok_file, (long long)tv - 1);
        int64_t slack = tv / 10 > 128 ? tv / 10 : 128;
        if (speak && mc->vocab > tv + slack)
            fprintf(stderr,
                    "train: note: the model's vocab_size %lld (%s) is much "
                    "larger than the tokenizer's %lld ids (%s); %lld "
                    "embedding rows will never see a token\n",
                    (long long)mc->vocab, cfg, (long long)tv, tok_file,
                    (long long)(mc->vocab - tv));
    }
    /* the data: its vocabulary and the tokenizer it was made with */
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/meta.json", o->data_dir);
    json_t *meta = json_load_file(mp, 0, NULL);
    json_int_t dv = json_integer_value(json_object_get(meta, "vocab_size"));
    const char *dh = json_string_value(json_object_get(meta, "tokenizer_hash"));
    const char *dsrc = json_string_value(json_object_get(meta, "tokenizer"));
    ts_status st = TS_OK;
    if (dv > mc->vocab)
        st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                          "train: %s was tokenized with a vocabulary of %lld "
                          "tokens (%s), the model has %lld (vocab_size in %s)",
                          o->data_dir, (long long)dv, mp, (long long)mc->vocab,
                          cfg);
    else if (dh && hash[0] && strcmp(dh, hash))
        st = ts_set_error(
            ctx, TS_ERR_INVALID_ARG,
            "train: the shards in %s were made with the tokenizer %s (%s's "
            "tokenizer_hash, from %s), not with the one given, %s (%s); run "
            "tessera prepare-data again with this tokenizer, or give "
            "--tokenizer the shards' own",
            o->data_dir, dh, mp, dsrc ? dsrc : "?", hash, tok_file);
    else if (meta && !dh && speak)
        fprintf(stderr,
                "train: warning: %s records no tokenizer_hash (made by an "
                "older tessera prepare-data): the shards cannot be checked "
                "against %s\n",
                mp, hash[0] ? tok_file : "a tokenizer");
    json_decref(meta);
    /* --init-from: its tokenizer is the one a checkpoint will carry */
    if (st == TS_OK && o->init_from && has_tokenizer(o->init_from) &&
        strcmp(tok_dir, o->init_from)) {
        char ih[TS_TOKENIZER_HASH_LEN], ifile[4200];
        st = ts_tokenizer_file_hash(ctx, o->init_from, ih, ifile, sizeof ifile);
        if (st == TS_OK && strcmp(ih, hash))
            st = ts_set_error(
                ctx, TS_ERR_INVALID_ARG,
                "train: --init-from %s has another tokenizer (%s, %s) than "
                "the run's (%s, %s): its config.json and embeddings belong "
                "to its own; prepare the data with it, or give --tokenizer "
                "%s",
                o->init_from, ih, ifile, hash[0] ? hash : "none",
                tok_file[0] ? tok_file : "no tokenizer", o->init_from);
    }
    return st;
}
