/* bench_spec.c — speculative decoding (issue 22): batch-1 greedy decode
 * tokens/s on models/kjv-qwen3 without speculation, with prompt lookup
 * (TS_SPEC_NGRAM) and with the draft model models/kjv-qwen3-draft
 * (TS_SPEC_DRAFT), side by side in one run, on four prompts:
 *  - copy: a paragraph of the King James text, then its first words again
 *    (a model that copies goes on copying: prompt lookup's best case);
 *  - copy, one word changed: a paragraph, then its start with one word
 *    changed (the copy would resume after the change);
 *  - copy, a passage the text repeats: Numbers 7's offering of one prince,
 *    then the next prince's, which the book words the same;
 *  - continuation: a verse's opening, continued freely.
 * (The shipped 8-layer model does not copy a paragraph it was just shown:
 * its greedy output drifts into phrases it repeats, which prompt lookup
 * also proposes from its own output.)
 * Rounds alternate the three engines on each prompt (a slow spell of the
 * machine hits all alike) and each figure is the median over the rounds;
 * the ratio is to no speculation. The acceptance rate (accepted / proposed)
 * and the tokens emitted per verification come from ts_engine_get_stats;
 * the draft model's own decode speed says what a proposal costs.
 * Every greedy output with speculation is checked against the one without
 * (exit 1 when one differs).
 *   bench_spec [-m MODEL_DIR] [--draft DIR] [--tokens N] [--rounds R]
 *              [-k K] */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_spec: %s: %s\n", what, ts_errmsg(ctx));
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *xs, int n) {
    qsort(xs, (size_t)n, sizeof *xs, cmp_double);
    return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

/* Genesis 1:1-8 */
#define GENESIS                                                                \
    "In the beginning God created the heaven and the earth. And the earth "    \
    "was without form, and void; and darkness was upon the face of the "       \
    "deep. And the Spirit of God moved upon the face of the waters. And God "  \
    "said, Let there be light: and there was light. And God saw the light, "   \
    "that it was good: and God divided the light from the darkness. And God "  \
    "called the light Day, and the darkness he called Night. And the "         \
    "evening and the morning were the first day. And God said, Let there be "  \
    "a firmament in the midst of the waters, and let it divide the waters "    \
    "from the waters. And God made the firmament, and divided the waters "     \
    "which were under the firmament from the waters which were above the "     \
    "firmament: and it was so. And God called the firmament Heaven. And the "  \
    "evening and the morning were the second day."

/* Psalm 23 */
#define PSALM                                                                  \
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in "  \
    "green pastures: he leadeth me beside the still waters. He restoreth my "  \
    "soul: he leadeth me in the paths of righteousness for his name's sake. "  \
    "Yea, though I walk through the valley of the shadow of death, I will "    \
    "fear no evil: for thou art with me; thy rod and thy staff they comfort "  \
    "me. Thou preparest a table before me in the presence of mine enemies: "   \
    "thou anointest my head with oil; my cup runneth over. Surely goodness "   \
    "and mercy shall follow me all the days of my life: and I will dwell in "  \
    "the house of the LORD for ever."

/* Numbers 7:24-29 (the offering each prince of Israel brought, told twelve
 * times over in the chapter in the same words) and the next prince's */
#define NUMBERS                                                                \
    "On the third day Eliab the son of Helon, prince of the children of "      \
    "Zebulun, did offer:\n"                                                    \
    "His offering was one silver charger, the weight whereof was an hundred "  \
    "and thirty shekels, one silver bowl of seventy shekels, after the "       \
    "shekel of the sanctuary; both of them full of fine flour mingled with "   \
    "oil for a meat offering:\n"                                               \
    "One golden spoon of ten shekels, full of incense:\n"                      \
    "One young bullock, one ram, one lamb of the first year, for a burnt "     \
    "offering:\n"                                                              \
    "One kid of the goats for a sin offering:\n"                               \
    "And for a sacrifice of peace offerings, two oxen, five rams, five he "    \
    "goats, five lambs of the first year: this was the offering of Eliab "     \
    "the son of Helon.\n"                                                      \
    "On the fourth day Elizur the son of Shedeur, prince of the children of "  \
    "Reuben, did offer:\n"

typedef struct {
    const char *name, *text;
} prompt_case;

static const prompt_case PROMPTS[] = {
    {"copy", GENESIS "\n"
                     "In the beginning God created the heaven and the earth."},
    {"copy, one word changed",
     PSALM "\n"
           "The LORD is my shepherd; I shall not want. He maketh me to lie "
           "down in green fields:"},
    {"copy, a passage the text repeats", NUMBERS "His offering was one silver"},
    {"continuation", "And it came to pass, when the king heard"},
};
#define N_PROMPTS 4

static const char *METHOD_NAMES[3] = {"none", "prompt lookup (ngram)",
                                      "draft model"};

/* One greedy request of n_new tokens alone in e: its tokens into out
 * (n_new of them), its decode tokens/s (the tokens after the first step's
 * over the time since that step: the prefill is not in it) */
static double decode_one(ts_engine *e, const int32_t *prompt, size_t n,
                         int n_new, int32_t *out) {
    ts_request r = {.prompt = prompt,
                    .n_prompt = n,
                    .max_tokens = n_new,
                    .sampling = ts_sampling_default(),
                    .ignore_eos = true};
    int64_t id;
    if (ts_engine_add(e, &r, &id) != TS_OK)
        return -1;
    int got = 0, first = 0;
    double t0 = 0;
    while (ts_engine_has_work(e)) {
        ts_engine_output o[64];
        int k = 0;
        if (ts_engine_step(e, o, 64, &k) != TS_OK)
            return -1;
        for (int i = 0; i < k; i++) {
            free(o[i].prompt_lp), free(o[i].embedding);
            if (o[i].token >= 0 && got < n_new)
                out[got++] = o[i].token;
        }
        if (got && !first)
            t0 = now(), first = got;
    }
    double dt = now() - t0;
    if (got != n_new || first >= n_new || dt <= 0)
        return -1;
    return (double)(n_new - first) / dt;
}

int main(int argc, char **argv) {
    const char *model = "models/kjv-qwen3", *draft = "models/kjv-qwen3-draft";
    int n_new = 96, rounds = 5, k_spec = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--draft") && i + 1 < argc)
            draft = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            k_spec = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_spec [-m MODEL_DIR] [--draft DIR] "
                            "[--tokens N] [--rounds R] [-k K]\n");
            return 2;
        }
    }
    if (n_new < 2 || n_new > 512 || rounds < 1 || rounds > 100 || k_spec < 1 ||
        k_spec > 16) {
        fprintf(stderr, "bench_spec: --tokens 2..512, --rounds 1..100, -k "
                        "1..16\n");
        return 2;
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    ts_lm *lm = NULL, *dlm = NULL;
    ts_tokenizer *tok = NULL;
    if (ts_lm_load(ctx, model, NULL, &lm) != TS_OK)
        return die(ctx, model);
    if (ts_lm_load(ctx, draft, NULL, &dlm) != TS_OK)
        return die(ctx, draft);
    if (ts_tokenizer_load(ctx, model, &tok) != TS_OK)
        return die(ctx, model);
    const ts_model_config *mc = ts_lm_config(lm), *dc = ts_lm_config(dlm);
    if (mc->vocab != dc->vocab) {
        fprintf(stderr,
                "bench_spec: the draft's vocabulary (%lld) is not the "
                "model's (%lld)\n",
                (long long)dc->vocab, (long long)mc->vocab);
        return 1;
    }
    printf("model %s (%lld layers, hidden %lld), draft %s (%lld layers, "
           "hidden %lld), f32 weights, %d threads; batch 1, greedy, %d "
           "tokens, %d tokens proposed a step, median of %d rounds\n",
           model, (long long)mc->layers, (long long)mc->hidden, draft,
           (long long)dc->layers, (long long)dc->hidden,
           ts_get_num_threads(ctx), n_new, k_spec, rounds);
    ts_engine *eng[3];
    for (int m = 0; m < 3; m++) {
        ts_engine_options o = ts_engine_options_default();
        o.max_seqs = 1;
        o.no_prefix_cache = true; /* every round computes its prompt */
        o.spec = (ts_spec_method)m;
        if (m) {
            o.spec_tokens = k_spec;
            o.spec_ngram_min = 1, o.spec_ngram_max = 4;
        }
        o.spec_draft = m == TS_SPEC_DRAFT ? ts_lm_decoder(dlm) : NULL;
        if (ts_engine_new(ctx, ts_lm_decoder(lm), &o, &eng[m]) != TS_OK)
            return die(ctx, "engine");
    }
    /* the draft model alone: what one of its steps costs */
    ts_engine *deng;
    ts_engine_options dopt = ts_engine_options_default();
    dopt.max_seqs = 1, dopt.no_prefix_cache = true;
    if (ts_engine_new(ctx, ts_lm_decoder(dlm), &dopt, &deng) != TS_OK)
        return die(ctx, "draft engine");
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int p = 0; p < N_PROMPTS; p++)
        if (ts_tokenizer_encode(tok, PROMPTS[p].text, strlen(PROMPTS[p].text),
                                false, &ids[p], &n_ids[p]) != TS_OK)
            return die(ctx, "tokenize");
    int32_t *ref = malloc(sizeof *ref * (size_t)n_new),
            *out = malloc(sizeof *out * (size_t)n_new);
    double *tps = malloc(sizeof *tps * (size_t)(3 * N_PROMPTS * rounds)),
           *dtps = malloc(sizeof *dtps * (size_t)rounds);
    ts_engine_stats before, after;
    int64_t prop[3][N_PROMPTS] = {{0}}, acc[3][N_PROMPTS] = {{0}},
            ver[3][N_PROMPTS] = {{0}};
    int differ = 0, checked = 0;
    char where[256] = "";
    for (int r = 0; r < rounds; r++) {
        dtps[r] = decode_one(deng, ids[N_PROMPTS - 1], n_ids[N_PROMPTS - 1],
                             n_new, out);
        if (dtps[r] < 0)
            return die(ctx, "draft alone");
        for (int p = 0; p < N_PROMPTS; p++)
            for (int m = 0; m < 3; m++) {
                ts_engine_get_stats(eng[m], &before);
                double v =
                    decode_one(eng[m], ids[p], n_ids[p], n_new, m ? out : ref);
                if (v < 0)
                    return die(ctx, METHOD_NAMES[m]);
                ts_engine_get_stats(eng[m], &after);
                tps[(m * N_PROMPTS + p) * rounds + r] = v;
                prop[m][p] += after.spec_proposed - before.spec_proposed;
                acc[m][p] += after.spec_accepted - before.spec_accepted;
                ver[m][p] +=
                    after.spec_verifications - before.spec_verifications;
                if (!m)
                    continue;
                checked++;
                int i = 0;
                while (i < n_new && out[i] == ref[i])
                    i++;
                if (i < n_new && !differ++)
                    snprintf(where, sizeof where,
                             "%s, %s, round %d: token %d is %d, %d without "
                             "speculation",
                             PROMPTS[p].name, METHOD_NAMES[m], r + 1, i, out[i],
                             ref[i]);
            }
    }
    for (int p = 0; p < N_PROMPTS; p++) {
        printf("\n%s (%zu prompt tokens):\n", PROMPTS[p].name, n_ids[p]);
        double base = median(tps + p * rounds, rounds);
        for (int m = 0; m < 3; m++) {
            double v =
                m ? median(tps + (m * N_PROMPTS + p) * rounds, rounds) : base;
            printf("  %-22s %7.1f tokens/s  %5.2fx", METHOD_NAMES[m], v,
                   v / base);
            if (m)
                printf("  acceptance %5.1f%% (%lld of %lld), %.2f tokens per "
                       "verification",
                       prop[m][p]
                           ? 100.0 * (double)acc[m][p] / (double)prop[m][p]
                           : 0.0,
                       (long long)acc[m][p], (long long)prop[m][p],
                       ver[m][p]
                           ? (double)(ver[m][p] + acc[m][p]) / (double)ver[m][p]
                           : 0.0);
            printf("\n");
        }
    }
    double alone = median(dtps, rounds),
           model_tps = median(tps + (N_PROMPTS - 1) * rounds, rounds);
    printf("\ndraft model alone, %s: %.1f tokens/s: one of its steps costs "
           "%.2f of the model's\n",
           PROMPTS[N_PROMPTS - 1].name, alone, model_tps / alone);
    /* each prompt's greedy continuation (its first 40 tokens), as a reader
     * checks */
    printf("\n");
    for (int p = 0; p < N_PROMPTS; p++) {
        if (decode_one(eng[0], ids[p], n_ids[p], n_new, ref) < 0)
            return die(ctx, "decode");
        char *text = NULL;
        size_t len = 0;
        if (ts_tokenizer_decode(tok, ref, (size_t)(n_new < 40 ? n_new : 40),
                                true, &text, &len) != TS_OK)
            return die(ctx, "detokenize");
        for (size_t i = 0; i < len; i++)
            text[i] = text[i] == '\n' ? ' ' : text[i];
        printf("%s continues: \"%s ...\"\n", PROMPTS[p].name, text);
        free(text);
    }
    if (differ)
        printf("greedy outputs with and without speculation: %d of %d "
               "DIFFER (first: %s)\n",
               differ, checked, where);
    else
        printf("greedy outputs with and without speculation: identical (%d "
               "runs of %d tokens: %d prompts x 2 methods x %d rounds)\n",
               checked, n_new, N_PROMPTS, rounds);
    for (int m = 0; m < 3; m++)
        ts_engine_free(eng[m]);
    ts_engine_free(deng);
    for (int p = 0; p < N_PROMPTS; p++)
        free(ids[p]);
    free(ref), free(out), free(tps), free(dtps);
    ts_tokenizer_free(tok);
    ts_lm_free(dlm);
    ts_lm_free(lm);
    ts_ctx_free(ctx);
    return differ ? 1 : 0;
}
