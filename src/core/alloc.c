/* alloc.c — the caching host allocator. Blocks are 64-byte aligned and
 * rounded up to a size class (powers of two split in four steps), so a
 * training step that frees and re-allocates the same intermediates is
 * served from the free lists instead of malloc. Under AddressSanitizer the
 * cached blocks are poisoned, so a use after free is still reported. */
#include "core/core.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Class c covers sizes up to class_bytes(c): 256 B, then four steps per
 * power of two (256, 320, 384, 448, 512, 640, ...). */
static size_t class_bytes(int c) {
    int pow2 = c / 4, step = c % 4;
    size_t base = (size_t)256 << pow2;
    return base + (base / 4) * (size_t)step;
}

static int size_class(size_t bytes) {
    for (int c = 0; c < TS_ALLOC_CLASSES; c++)
        if (class_bytes(c) >= bytes)
            return c;
    return -1;
}

void *ts_alloc_bytes(ts_ctx *ctx, size_t bytes) {
    ts_allocator *a = &ctx->alloc;
    if (bytes == 0)
        bytes = 1;
    int c = size_class(bytes);
    size_t rounded = c >= 0 ? class_bytes(c) : (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (c >= 0 && a->free_lists[c]) {
        ts_free_block *b = a->free_lists[c];
        UNPOISON(b, rounded);
        a->free_lists[c] = b->next;
        a->stats.bytes_cached -= rounded;
        a->stats.cache_hits++;
        p = b;
    } else {
        p = aligned_alloc(64, rounded);
        if (!p && a->stats.bytes_cached) { /* retry after dropping the cache */
            ts_alloc_empty_cache(ctx);
            p = aligned_alloc(64, rounded);
        }
        if (!p)
            return NULL;
        a->stats.system_allocs++;
    }
    a->stats.bytes_in_use += rounded;
    if (a->stats.bytes_in_use > a->stats.peak_bytes_in_use)
        a->stats.peak_bytes_in_use = a->stats.bytes_in_use;
    return p;
}

void ts_free_bytes(ts_ctx *ctx, void *p, size_t bytes) {
    if (!p)
        return;
    ts_allocator *a = &ctx->alloc;
    if (bytes == 0)
        bytes = 1;
    int c = size_class(bytes);
    size_t rounded = c >= 0 ? class_bytes(c) : (bytes + 63) & ~(size_t)63;
    a->stats.bytes_in_use -= rounded;
    if (c < 0 || a->no_cache) {
        free(p);
        return;
    }
    ts_free_block *b = p;
    b->next = a->free_lists[c];
    b->bytes = rounded;
    a->free_lists[c] = b;
    a->stats.bytes_cached += rounded;
    /* poison all but the list link so stale reads trap under ASan */
    POISON((char *)p + sizeof *b, rounded - sizeof *b);
}

void ts_alloc_empty_cache(ts_ctx *ctx) {
    if (!ctx)
        return;
    ts_allocator *a = &ctx->alloc;
    for (int c = 0; c < TS_ALLOC_CLASSES; c++) {
        ts_free_block *b = a->free_lists[c];
        while (b) {
            ts_free_block *next = b->next;
            UNPOISON(b, b->bytes);
            free(b);
            b = next;
        }
        a->free_lists[c] = NULL;
    }
    a->stats.bytes_cached = 0;
}

void ts_allocator_destroy(ts_allocator *a) {
    ts_ctx *ctx = (ts_ctx *)((char *)a - offsetof(ts_ctx, alloc));
    ts_alloc_empty_cache(ctx);
}

void ts_alloc_get_stats(const ts_ctx *ctx, ts_alloc_stats *out) {
    if (!ctx || !out)
        return;
    *out = ctx->alloc.stats;
}

void ts_alloc_reset_peak(ts_ctx *ctx) {
    if (ctx)
        ctx->alloc.stats.peak_bytes_in_use = ctx->alloc.stats.bytes_in_use;
}
