/* router_events.c — fuzz_router_events (harnesses.h): the /v1/kv_events
 * stream a server publishes (JSON lines of BlockStored / BlockRemoved),
 * fed to the router's own stream reader, event_write, in three pieces as
 * libcurl would hand them over. The reader is static in router.c, so this
 * file includes router.c whole (its public functions then come from here
 * and router.o is not linked into the test). Afterwards the server's block
 * set must still be a consistent table: n its occupied slots, each key
 * found again. */
#include "router/router.c"

#include "harnesses.h"

static void check_set(const ts_block_set *s, const char *which) {
    size_t used = 0;
    for (size_t i = 0; i < s->cap; i++)
        if (s->keys[i]) {
            used++;
            if (!ts_block_set_get(s, s->keys[i]))
                fuzz_fail("router_events",
                          "%s: key %016llx stored at %zu "
                          "is not found",
                          which, (unsigned long long)s->keys[i], i);
        }
    if (used != s->n || (s->cap && s->n > s->cap))
        fuzz_fail("router_events", "%s: n %zu, %zu slots used of %zu", which,
                  s->n, used, s->cap);
}

int fuzz_router_events(const uint8_t *data, size_t size) {
    backend *be = calloc(1, sizeof *be);
    if (!be)
        return 0;
    ts_block_set_init(&be->cached);
    ts_block_set_init(&be->recent);
    /* a routed block the stream may evict */
    ts_block_set_put(&be->recent, 0x1234, 1);
    event_stream es = {be, {0}};
    size_t cut[4] = {0, size / 3, 2 * size / 3, size};
    /* the longest run without a newline: the reader drops the stream
     * rather than hold a line past EVENT_LINE_MAX */
    size_t run = 0, longest = 0;
    for (size_t i = 0; i < size; i++) {
        run = data[i] == '\n' ? 0 : run + 1;
        longest = run > longest ? run : longest;
    }
    for (int k = 0; k < 3; k++) {
        size_t got =
            event_write((char *)data + cut[k], 1, cut[k + 1] - cut[k], &es);
        if (es.line.n > EVENT_LINE_MAX)
            fuzz_fail("router_events", "a line of %zu bytes held", es.line.n);
        if (got != cut[k + 1] - cut[k]) {
            if (longest <= EVENT_LINE_MAX)
                fuzz_fail("router_events", "the reader refused a piece");
            break;
        }
    }
    /* every stored hash was written in the stream as a JSON string of 1 to
     * 16 hex digits (not " 12", not 17 digits, not "zz" as 0) */
    for (size_t i = 0; i < be->cached.cap; i++) {
        unsigned long long k = be->cached.keys[i];
        if (!k)
            continue;
        bool seen = false;
        /* the set keeps hash 0 as 1 (0 marks an empty slot) */
        for (int zero = 0; zero < (k == 1 ? 2 : 1); zero++)
            for (int w = 1; w <= 16 && !seen; w++)
                for (int upper = 0; upper < 2 && !seen; upper++) {
                    char hx[24];
                    snprintf(hx, sizeof hx, upper ? "\"%0*llX\"" : "\"%0*llx\"",
                             w, zero ? 0ull : k);
                    seen = memmem(data, size, hx, strlen(hx)) != NULL;
                }
        if (!seen)
            fuzz_fail("router_events", "block %llx stored, not in the stream",
                      k);
    }
    check_set(&be->cached, "cached");
    check_set(&be->recent, "recent");
    free(es.line.p);
    ts_block_set_free(&be->cached);
    ts_block_set_free(&be->recent);
    free(be);
    return 0;
}
