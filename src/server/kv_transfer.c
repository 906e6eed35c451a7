/* kv_transfer.c — frames of the KV-transfer connection (kv_transfer.h):
 * encoding, checking, sending and serving one over TCP with timeouts. */
#define _GNU_SOURCE
#include "kv_transfer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the KV-transfer frames are written in the host's (little-endian) order"
#endif

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

const char *ts_kvx_dtype_name(uint32_t dtype) {
    return dtype == TS_KVX_DTYPE_F32    ? "f32"
           : dtype == TS_KVX_DTYPE_BF16 ? "bf16"
           : dtype == TS_KVX_DTYPE_INT8 ? "int8"
                                        : "unknown";
}

uint64_t ts_kvx_block_bytes(const ts_kvx_geometry *g) {
    uint64_t row = g->dtype == TS_KVX_DTYPE_F32    ? 4ull * g->head_dim
                   : g->dtype == TS_KVX_DTYPE_BF16 ? 2ull * g->head_dim
                   : g->dtype == TS_KVX_DTYPE_INT8
                       ? 4ull * ((g->head_dim + 3ull) / 4 + 1)
                       : 0;
    return 2ull * g->layers * g->kv_heads * g->block_size * row;
}

static void put_header(uint8_t *h, uint16_t kind, uint64_t len,
                       const void *payload) {
    uint32_t magic = TS_KVX_MAGIC;
    uint16_t ver = TS_KVX_VERSION;
    uint64_t sum = XXH3_64bits(payload, (size_t)len);
    memcpy(h, &magic, 4);
    memcpy(h + 4, &ver, 2);
    memcpy(h + 6, &kind, 2);
    memcpy(h + 8, &len, 8);
    memcpy(h + 16, &sum, 8);
}

uint8_t *ts_kvx_encode(const ts_kvx_blocks *b, size_t *len) {
    uint64_t nt = (uint64_t)b->g.n_blocks * b->g.block_size;
    uint64_t kvb = (uint64_t)b->g.n_blocks * ts_kvx_block_bytes(&b->g);
    uint64_t payload = TS_KVX_META + nt * 4 + kvb;
    uint8_t *f = malloc(TS_KVX_HEADER + payload);
    if (!f)
        return NULL;
    uint8_t *p = f + TS_KVX_HEADER;
    memcpy(p, &b->g, TS_KVX_META);
    memcpy(p + TS_KVX_META, b->tokens, nt * 4);
    memcpy(p + TS_KVX_META + nt * 4, b->kv, kvb);
    put_header(f, TS_KVX_KIND_BLOCKS, payload, p);
    *len = TS_KVX_HEADER + payload;
    return f;
}

int ts_kvx_check_header(const uint8_t *h, uint16_t kind, uint64_t max_payload,
                        uint64_t *payload_len, uint64_t *checksum, char *err,
                        size_t errcap) {
    uint32_t magic;
    uint16_t ver, k;
    memcpy(&magic, h, 4);
    memcpy(&ver, h + 4, 2);
    memcpy(&k, h + 6, 2);
    memcpy(payload_len, h + 8, 8);
    memcpy(checksum, h + 16, 8);
    if (magic != TS_KVX_MAGIC)
        return fail(err, errcap, "not a KV-transfer frame (magic %08x)", magic);
    if (ver != TS_KVX_VERSION)
        return fail(err, errcap,
                    "KV-transfer version %u (this server speaks %u)", ver,
                    TS_KVX_VERSION);
    if (k != kind)
        return fail(err, errcap, "KV-transfer frame kind %u (want %u)", k,
                    kind);
    if (*payload_len > max_payload)
        return fail(
            err, errcap, "KV-transfer payload of %llu bytes (at most %llu)",
            (unsigned long long)*payload_len, (unsigned long long)max_payload);
    return 0;
}

int ts_kvx_decode_blocks(const uint8_t *payload, uint64_t len,
                         uint64_t checksum, ts_kvx_blocks *b, char *err,
                         size_t errcap) {
    if (len < TS_KVX_META)
        return fail(err, errcap, "KV-transfer payload of %llu bytes is short",
                    (unsigned long long)len);
    if (XXH3_64bits(payload, (size_t)len) != checksum)
        return fail(err, errcap,
                    "KV-transfer checksum mismatch: the blocks arrived "
                    "corrupt");
    memcpy(&b->g, payload, TS_KVX_META);
    const ts_kvx_geometry *g = &b->g;
    if (!g->block_size || !g->layers || !g->kv_heads || !g->head_dim ||
        g->block_size > 4096 || g->head_dim > 4096 || g->kv_heads > 4096 ||
        g->layers > 4096)
        return fail(err, errcap, "KV-transfer geometry is invalid");
    if (g->dtype > TS_KVX_DTYPE_INT8)
        return fail(err, errcap,
                    "KV-transfer geometry is invalid: dtype %u (want 0 f32, "
                    "1 bf16 or 2 int8)",
                    g->dtype);
    uint64_t nt = (uint64_t)g->n_blocks * g->block_size;
    uint64_t want = TS_KVX_META + nt * 4 + g->n_blocks * ts_kvx_block_bytes(g);
    if (want != len)
        return fail(err, errcap,
                    "KV-transfer payload has %llu bytes; its geometry says "
                    "%llu",
                    (unsigned long long)len, (unsigned long long)want);
    b->tokens = (const int32_t *)(const void *)(payload + TS_KVX_META);
    b->kv = payload + TS_KVX_META + nt * 4;
    return 0;
}

/* ---- sockets ---- */

/* all n bytes, each wait bounded by timeout_ms; 0 or -1 */
static int io_all(int fd, void *buf, size_t n, bool wr, int timeout_ms) {
    uint8_t *p = buf;
    while (n) {
        struct pollfd pf = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
        int pr = poll(&pf, 1, timeout_ms);
        if (pr <= 0) {
            if (pr < 0 && errno == EINTR)
                continue;
            errno = pr == 0 ? ETIMEDOUT : errno;
            return -1;
        }
        ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = ECONNRESET;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int split_target(const char *target, char *host, size_t hcap, char *port,
                        size_t pcap) {
    const char *colon = target ? strrchr(target, ':') : NULL;
    if (!colon || colon == target || !colon[1] ||
        (size_t)(colon - target) >= hcap || strlen(colon + 1) >= pcap)
        return -1;
    memcpy(host, target, (size_t)(colon - target));
    host[colon - target] = 0;
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

int ts_kvx_send(const char *target, const uint8_t *frame, size_t len,
                int timeout_ms, uint32_t *adopted, char *err, size_t errcap) {
    char host[256], port[16];
    *adopted = 0;
    if (split_target(target, host, sizeof host, port, sizeof port))
        return fail(err, errcap, "KV-transfer target \"%s\" is not host:port",
                    target ? target : "");
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM},
                    *ai = NULL;
    int gr = getaddrinfo(host, port, &hints, &ai);
    if (gr)
        return fail(err, errcap, "KV-transfer target %s: %s", target,
                    gai_strerror(gr));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        int e = errno;
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return fail(err, errcap, "KV-transfer connect to %s: %s", target,
                    strerror(e));
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t h[TS_KVX_HEADER];
    uint64_t plen, sum;
    int rc = -1;
    if (io_all(fd, (void *)frame, len, true, timeout_ms) ||
        io_all(fd, h, sizeof h, false, timeout_ms)) {
        /* the peer may have refused early and closed: its reply first */
        fail(err, errcap, "KV-transfer to %s: %s", target, strerror(errno));
        if (io_all(fd, h, sizeof h, false, 100))
            goto out;
    }
    if (ts_kvx_check_header(h, TS_KVX_KIND_REPLY, 1 << 16, &plen, &sum, err,
                            errcap))
        goto out;
    uint8_t rep[1 << 16];
    if (plen < 8 || io_all(fd, rep, (size_t)plen, false, timeout_ms) ||
        XXH3_64bits(rep, (size_t)plen) != sum) {
        fail(err, errcap, "KV-transfer to %s: a bad reply", target);
        goto out;
    }
    int32_t status;
    memcpy(&status, rep, 4);
    memcpy(adopted, rep + 4, 4);
    if (status) {
        fail(err, errcap, "KV-transfer refused by %s: %.*s", target,
             (int)(plen - 8), (const char *)rep + 8);
        goto out;
    }
    rc = 0;
out:
    close(fd);
    return rc;
}

static void reply(int fd, int32_t status, uint32_t adopted, const char *msg,
                  int timeout_ms) {
    size_t ml = strlen(msg);
    if (ml > 4000)
        ml = 4000;
    uint8_t f[TS_KVX_HEADER + 8 + 4000];
    memcpy(f + TS_KVX_HEADER, &status, 4);
    memcpy(f + TS_KVX_HEADER + 4, &adopted, 4);
    memcpy(f + TS_KVX_HEADER + 8, msg, ml);
    put_header(f, TS_KVX_KIND_REPLY, 8 + ml, f + TS_KVX_HEADER);
    io_all(fd, f, TS_KVX_HEADER + 8 + ml, true, timeout_ms);
}

int ts_kvx_serve_connection(int fd, ts_kvx_adopt_fn adopt, void *arg,
                            uint64_t max_payload, int timeout_ms) {
    char err[512] = "";
    uint8_t h[TS_KVX_HEADER];
    uint64_t plen, sum;
    uint8_t *payload = NULL;
    uint32_t adopted = 0;
    ts_kvx_blocks b;
    if (io_all(fd, h, sizeof h, false, timeout_ms)) {
        snprintf(err, sizeof err, "KV transfer: no header (%s)",
                 strerror(errno));
        goto refuse;
    }
    if (ts_kvx_check_header(h, TS_KVX_KIND_BLOCKS, max_payload, &plen, &sum,
                            err, sizeof err))
        goto refuse;
    if (plen < TS_KVX_META) {
        snprintf(err, sizeof err, "KV transfer: a payload of %llu bytes",
                 (unsigned long long)plen);
        goto refuse;
    }
    payload = malloc((size_t)plen);
    if (!payload) {
        snprintf(err, sizeof err, "KV transfer: out of memory for %llu bytes",
                 (unsigned long long)plen);
        goto refuse;
    }
    if (io_all(fd, payload, TS_KVX_META, false, timeout_ms)) {
        snprintf(err, sizeof err, "KV transfer: truncated (%s)",
                 strerror(errno));
        goto refuse;
    }
    memcpy(&b.g, payload, TS_KVX_META);
    if (adopt(arg, &b.g, NULL, &adopted, err, sizeof err))
        goto refuse; /* a model that does not match: before the data */
    if (io_all(fd, payload + TS_KVX_META, (size_t)(plen - TS_KVX_META), false,
               timeout_ms)) {
        snprintf(err, sizeof err, "KV transfer: truncated (%s)",
                 strerror(errno));
        goto refuse;
    }
    if (ts_kvx_decode_blocks(payload, plen, sum, &b, err, sizeof err) ||
        adopt(arg, &b.g, &b, &adopted, err, sizeof err))
        goto refuse;
    free(payload);
    reply(fd, 0, adopted, "ok", timeout_ms);
    close(fd);
    return 0;
refuse:
    free(payload);
    reply(fd, 1, adopted, err, timeout_ms);
    close(fd);
    return -1;
}

int ts_kvx_listen(const char *host, int port, int *bound, char *err,
                  size_t errcap) {
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host ? host : "127.0.0.1", &a.sin_addr) != 1)
        return fail(err, errcap,
                    "KV-transfer host \"%s\" is not an IPv4 "
                    "address",
                    host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return fail(err, errcap, "KV-transfer listen on %s:%d: %s",
                    host ? host : "127.0.0.1", port, strerror(e));
    }
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    *bound = ntohs(a.sin_port);
    return fd;
}
