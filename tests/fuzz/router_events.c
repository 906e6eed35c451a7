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
    for (int k = 0; k < 3; k++)
        if (event_write((char *)data + cut[k], 1, cut[k + 1] - cut[k], &es) !=
            cut[k + 1] - cut[k])
            fuzz_fail("router_events", "the reader refused a piece");
    check_set(&be->cached, "cached");
    check_set(&be->recent, "recent");
    free(es.line.p);
    ts_block_set_free(&be->cached);
    ts_block_set_free(&be->recent);
    free(be);
    return 0;
}
