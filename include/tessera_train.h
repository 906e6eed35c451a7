/* tessera_train.h — the training half (src/train): token shards and the
 * loader that feeds each rank its slice, and the training loop behind
 * `tessera train` (AdamW, warmup + cosine, clipping, accumulation, mixed
 * precision, checkpoints in Hugging Face's layout, MFU). */
#ifndef TESSERA_TRAIN_H
#define TESSERA_TRAIN_H

#include "tessera.h"
#include "tessera_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- token shards ---------------------------------------------------------
 * A shard is a 32-byte header then the token ids, little-endian:
 *   u32 magic "TSTK" | u32 version (1) | u32 bytes per token (2 or 4) |
 *   u32 reserved (0) | u64 token count | u64 reserved (0)
 * A data folder holds train_NNN.bin and val_NNN.bin shards, meta.json
 * (vocabulary, counts, the tokenizer) and the tokenizer's files. */
#define TS_SHARD_MAGIC   0x4B545354u /* "TSTK" */
#define TS_SHARD_VERSION 1
#define TS_SHARD_HEADER  32

/* Writes n ids to path (atomically: temporary file, fsync, rename) with 2
 * bytes per token when every id < 65536, else 4. */
ts_status ts_shard_write(ts_ctx *ctx, const char *path, const int32_t *ids,
                         size_t n);

typedef struct ts_shard ts_shard;
/* Maps a shard, checking its header and its size. */
ts_status ts_shard_open(ts_ctx *ctx, const char *path, ts_shard **out);
void ts_shard_close(ts_shard *s);
uint64_t ts_shard_count(const ts_shard *s);
int32_t ts_shard_token(const ts_shard *s, uint64_t i);

/* ---- the loader -------------------------------------------------------------
 * The shards of one split (prefix "train" or "val") seen as one stream of
 * tokens, cut into windows of seq + 1 tokens (inputs and their next
 * tokens) at multiples of seq. Each epoch visits every window once in an
 * order shuffled from (seed, epoch); the global batch of step s is the
 * next `batch` windows, and rank r of `world` takes its contiguous
 * batch / world of them. The state is one number (windows consumed), so a
 * resumed run continues exactly where a checkpoint left off. */
typedef struct ts_loader ts_loader;
ts_status ts_loader_open(ts_ctx *ctx, const char *dir, const char *split,
                         int64_t seq, uint64_t seed, bool shuffle,
                         ts_loader **out);
void ts_loader_free(ts_loader *l);
int64_t ts_loader_windows(const ts_loader *l); /* per epoch */
int64_t ts_loader_tokens(const ts_loader *l);
/* The next global batch's rows for this rank: ids and targets, each
 * (batch / world) x seq, int64. */
ts_status ts_loader_next(ts_loader *l, int64_t batch, int rank, int world,
                         int64_t *ids, int64_t *targets);
uint64_t ts_loader_position(const ts_loader *l); /* windows consumed */
void ts_loader_seek(ts_loader *l, uint64_t position);

/* ---- the tokenizer's fingerprint ----------------------------------------
 * "xxh3-128:" and 32 hex digits of tokenizer.json's bytes. prepare-data
 * records it in meta.json ("tokenizer_hash"); train refuses shards whose
 * hash is not the tokenizer's it was given. path: a tokenizer.json or a
 * folder holding one; file (if not NULL) receives the file's path. */
#define TS_TOKENIZER_HASH_LEN 48
ts_status ts_tokenizer_file_hash(ts_ctx *ctx, const char *path,
                                 char out[TS_TOKENIZER_HASH_LEN], char *file,
                                 size_t file_cap);

/* ---- preparing data ------------------------------------------------------ */

typedef struct {
    const char *tokenizer_dir; /* tokenizer.json (+ tokenizer_config.json) */
    const char *out_dir;
    double val_fraction;  /* the last fraction of each file's tokens: 0.05 */
    int64_t shard_tokens; /* tokens per shard at most: 1 << 26 */
    bool quiet;           /* no progress on stderr */
    /* optional: the model's config.json, checked against the tokenizer
     * first (its vocab_size holds every id, its bos/eos/pad ids are ids
     * of the tokenizer) */
    const char *model_config;
} ts_prepare_options;

typedef struct {
    int64_t bytes, train_tokens, val_tokens;
    int train_shards, val_shards;
} ts_prepare_result;

/* Tokenizes the files (each a document, ended by the tokenizer's
 * end-of-text token when it has one) into out_dir/train_NNN.bin and
 * val_NNN.bin (removing shards of an earlier run past the new count),
 * copies the tokenizer files there and writes meta.json (vocabulary,
 * counts, the tokenizer's hash and path). First the tokenizer is checked:
 * the special tokens tokenizer_config.json names (bos, eos, pad, unk)
 * must be in its vocabulary. */
ts_status ts_prepare_data(ts_ctx *ctx, const char *const *files, int n_files,
                          const ts_prepare_options *o, ts_prepare_result *res);

/* ---- the machine's peak ------------------------------------------------ */

/* The MFU denominator, from the hardware: cores in use (the context's
 * threads, at most the CPUs this process may run on) x the clock
 * (measured now: a chain of dependent adds, the fastest of ~40 us trials
 * over 150 ms, before and after a 1024^3 sgemm that ramps the cores up) x f32
 * FLOPs per cycle of the ISA our matmuls run (AVX2+FMA: 2 FMA pipes x 8 lanes x
 * 2 = 32; AVX-512 where OpenBLAS uses it: 64). A rate above it is impossible,
 * so MFU against it stays <= 100%. With sgemm, a 1024^3 OpenBLAS sgemm is timed
 * too (best of 4): what this machine achieves now, shown beside it, never the
 * denominator. */
typedef struct {
    char cpu[64];           /* cpuid's brand string */
    char isa[64];           /* e.g. "AVX2+FMA" */
    char isa_note[128];     /* e.g. that the CPU has AVX-512, unused */
    int cores;              /* in use */
    double clock_hz;        /* measured (at least what the sgemm needs) */
    double flops_per_cycle; /* f32, per core */
    double hardware;        /* FLOP/s: cores x clock x flops_per_cycle */
    double sgemm;           /* FLOP/s achieved now (0 unless asked) */
} ts_peak_info;
ts_status ts_peak_measure(ts_ctx *ctx, bool sgemm, ts_peak_info *out);

/* The f32 sgemm rate measured now (1024^3, best of 4), for the
 * benchmarks; nothing is cached any more (*cached is set false, fresh
 * ignored). */
double ts_peak_flops(bool fresh, bool *cached);

/* Model FLOPs per token of a training step (forward + backward), PaLM's
 * appendix B: 6 N + 12 L H Q T, N the parameters without the embeddings. */
double ts_train_flops_per_token(int64_t n_params_no_embed, int64_t layers,
                                int64_t heads, int64_t head_dim, int64_t seq);

/* ---- the training loop ----------------------------------------------------
 */

/* One step's figures, what each log line holds. */
typedef struct ts_train_step_info {
    int64_t step, steps; /* 1-based, of steps */
    double loss, lr, grad_norm;
    double tokens_per_s; /* this step's (all ranks) */
    double mfu;          /* tokens_per_s against the peak */
    double step_s;       /* this step's seconds */
    double val_loss;     /* NaN unless evaluated after this step */
} ts_train_step_info;
typedef struct {
    const char *model_config; /* a Hugging Face config.json: a new model */
    const char *init_from;    /* or a model folder to start from */
    const char *data_dir;     /* prepare-data's output */
    const char *out_dir;      /* checkpoints and the log */
    /* the tokenizer checkpoints carry (tokenizer.json and
     * tokenizer_config.json): NULL for the data folder's (prepare-data
     * copies it there). The model's vocabulary and special ids are
     * checked against it, and the shards' recorded tokenizer hash too. */
    const char *tokenizer_dir;
    int64_t batch, seq, grad_accum, steps;
    double lr, min_lr; /* peak and final learning rates */
    int64_t warmup;
    bool constant_lr; /* --schedule constant (else cosine) */
    double weight_decay, clip, beta1, beta2;
    int64_t eval_every, eval_batches, save_every, log_every;
    /* checkpoints kept: the newest keep_last (default 3) plus the one of
     * the best validation loss, even when older; 0 keeps every one */
    int64_t keep_last;
    uint64_t seed;
    /* where the model, its gradients and AdamW's state live: NULL or "cpu"
     * for the host, "vulkan:0" ... (a single process: distributed runs
     * keep their parameters on the host) */
    const char *device;
    bool eager;                  /* else compiled */
    bool checkpoint_activations; /* recompute each layer in backward */
    bool bf16;   /* --dtype bf16: bf16 compute copies of the matrices, f32
                    master weights and optimizer (ts_decoder_set_compute_dtype) */
    bool resume; /* from out_dir's latest checkpoint */
    bool quiet;  /* no progress bar or lines on stderr */
    double peak; /* FLOP/s of one rank for MFU; 0: ts_peak_measure's
                    hardware peak */
    /* distributed: the run's ranks (NULL: this process alone). Each rank
     * takes batch / world rows of every micro-batch. shard: 0 data
     * parallel (gradients all-reduced in buckets, each started as soon
     * as the backward has finished its gradients), 1 grad-opt (ZeRO-2:
     * gradients reduce-scattered to the rank that owns each parameter,
     * which alone keeps its AdamW state and updates it; parameters are
     * all-gathered after the update), 2 full (ZeRO-3 / FSDP: the layers'
     * parameters sharded at rest too, gathered per layer before its
     * forward and its recompute in backward and released after, gradients
     * reduce-scattered as each layer's backward ends; layers checkpointed,
     * eager steps, --grad-accum 1) */
    ts_dist *dist;
    int shard;
    /* data parallel: reduce each bucket of gradients while the backward
     * of the last micro-batch goes on (else all of them after it) */
    bool no_overlap;
    double bucket_mb; /* data parallel: MiB of f32 gradients per all-reduce
                         (torch DDP's bucket_cap_mb; 16) */
    /* after every step (every rank): its figures; returning true ends the
     * run there, its last checkpoint written as at the end. NULL: none */
    bool (*on_step)(void *arg, const struct ts_train_step_info *info);
    void *on_step_arg;
} ts_train_options;

ts_train_options ts_train_default_options(void);

typedef struct {
    int64_t steps_done;
    double first_loss, last_loss, last_val_loss;
    /* tokens/s and MFU over the steps after warm-up: steps timed_from ..
     * timed_from + timed_steps - 1 (every step of the run but its first,
     * which records and compiles; the only one in a run of one step),
     * each step timed alone (without evals, saves and logging): their
     * tokens / their summed seconds */
    double tokens_per_s, mfu, seconds;
    int64_t timed_from, timed_steps;
    double peak;       /* FLOP/s, the MFU denominator (all ranks) */
    double peak_sgemm; /* FLOP/s an sgemm achieved at start (0 if given) */
    double comm_share; /* of the step time, in collectives (last window) */
    int64_t n_params;
} ts_train_result;

/* Trains as the options say; checkpoints in out_dir/step_NNNNNN (Hugging
 * Face layout plus optimizer.safetensors and trainer_state.json, written
 * to a temporary folder and renamed), out_dir/latest naming the newest;
 * a JSON-lines log in out_dir/log.jsonl. */
ts_status ts_train_run(ts_ctx *ctx, const ts_train_options *o,
                       ts_train_result *res);

/* ---- glyph images (src/train/glyphs.c) ------------------------------------
 * A data set for small image models: the 62 classes 0-9, A-Z, a-z (class
 * k is ts_glyphs_char(k)) rendered with FreeType as 32 x 32 grayscale
 * images in [-1, 1] (background -1, ink +1), from every .ttf/.otf font
 * under a folder (default /usr/share/fonts) that has all 62 glyphs, in
 * sorted path order so a seed gives the same set everywhere the same
 * fonts are installed. A glyph keeps its place on the baseline (a 'p'
 * descends, an 'o' is smaller than an 'O'): the em is 26 px x scale,
 * the baseline 16 + 6.5 px x scale below the top, the ink box centred
 * horizontally; dx, dy shift it by pixels (fractions allowed). */
#define TS_GLYPHS_CLASSES 62
#define TS_GLYPHS_SIZE    32
typedef struct ts_glyphs ts_glyphs;
ts_status ts_glyphs_open(ts_ctx *ctx, const char *font_dir_or_null,
                         ts_glyphs **out);
void ts_glyphs_close(ts_glyphs *g); /* NULL is fine */
int ts_glyphs_num_fonts(const ts_glyphs *g);
const char *ts_glyphs_font_path(const ts_glyphs *g, int font);
/* One image, 32 x 32 floats row-major, into out. */
ts_status ts_glyphs_render(ts_glyphs *g, int cls, int font, double dx,
                           double dy, double scale, float *out);
/* n samples from seed: class and font uniform, shifts uniform in
 * [-2, 2] px, scale uniform in [0.85, 1.15]; images n x 32 x 32 and
 * labels n. Sample i depends only on (seed, i). */
ts_status ts_glyphs_batch(ts_glyphs *g, uint64_t seed, int n, float *images,
                          int64_t *labels);
int ts_glyphs_class_of(char c); /* -1 when c is not one of the 62 */
char ts_glyphs_char(int cls);   /* 0 when out of range */

/* ---- training a DiT on glyphs (src/train/train_dit.c) ----------------------
 * `tessera train --dit`: a class-conditional DiTTransformer2DModel trained
 * in pixel space (1 channel, 32 x 32) on the glyph data set with the noise
 * prediction loss, mean((eps_pred - eps)^2), on DDPM's schedule (linear
 * betas 1e-4 .. 0.02 over 1000 steps: x_t = sqrt(abar_t) x_0 +
 * sqrt(1 - abar_t) eps, t uniform), the class replaced by the null class
 * num_classes for 10% of the samples (classifier-free guidance), AdamW
 * with warm-up and cosine decay, clipping, an EMA of the weights (what is
 * saved when ema > 0), eager or compiled, data parallel over the ranks of
 * dist (gradients averaged with all-reduce). Saves a Diffusers DiTPipeline
 * folder: out_dir/model_index.json (id2label the 62 characters, no vae),
 * transformer/ and scheduler/scheduler_config.json (DDIMScheduler of the
 * training schedule), and out_dir/log.jsonl. */
typedef struct {
    /* the model: sample_size, in_channels 1 and num_classes 62 are the
     * data's; the rest as given (see ts_dit_default_train_options) */
    int64_t patch_size, num_layers, num_attention_heads, attention_head_dim;
    const char *out_dir;
    const char *font_dir; /* NULL: /usr/share/fonts */
    int64_t steps, batch, warmup, log_every, save_every;
    double lr, min_lr, weight_decay, clip, beta1, beta2;
    double ema; /* EMA decay, warmed up (0: none, the raw weights saved) */
    double class_dropout; /* 0.1 */
    /* the DDPM schedule's betas: false linear (1e-4 .. 0.02, DDPM's),
     * true squaredcos_cap_v2 (improved DDPM's cosine, which leaves 32x32
     * images less destroyed at most timesteps) */
    bool cosine;
    /* min-SNR-gamma loss weights (Hang et al. 2023): each image's noise
     * error times min(SNR_t, gamma) / SNR_t; 0: unweighted */
    double snr_gamma;
    double class_init_std; /* the class tables' init std (0: DiT's 0.02) */
    uint64_t seed;
    bool eager; /* else compiled */
    bool bf16;  /* bf16 compute copies, f32 masters */
    bool quiet;
    double peak;   /* FLOP/s of one rank for MFU; 0: measured */
    ts_dist *dist; /* NULL: one process */
} ts_dit_train_options;
ts_dit_train_options ts_dit_default_train_options(void);

typedef struct {
    int64_t steps_done, n_params;
    double first_loss, last_loss;
    /* patches (tokens) per second and MFU over the steps after the first
     * (which records and compiles), each step timed alone */
    double tokens_per_s, mfu, peak, seconds;
    double flops_per_image; /* forward + backward */
} ts_dit_train_result;
ts_status ts_dit_train_run(ts_ctx *ctx, const ts_dit_train_options *o,
                           ts_dit_train_result *res);

#ifdef __cplusplus
}
#endif
#endif
