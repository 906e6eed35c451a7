/* auth.c — API-key, KV-peer and CORS-origin checks (auth.h); no I/O, no
 * state. */
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool ts_ct_equal(const char *a, size_t alen, const char *b, size_t blen) {
    /* every byte of b is read whatever a holds; a is read modulo its
     * length so a short guess takes as long as a right one */
    volatile uint8_t diff = (uint8_t)(alen != blen);
    for (size_t i = 0; i < blen; i++) {
        uint8_t x = alen ? (uint8_t)a[i % alen] : 0;
        diff |= (uint8_t)(x ^ (uint8_t)b[i]);
    }
    return diff == 0;
}

bool ts_bearer_ok(const char *header, const char *key) {
    if (!header || !key)
        return false;
    if (strncasecmp(header, "Bearer ", 7))
        return false;
    const char *v = header + 7;
    while (*v == ' ')
        v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return ts_ct_equal(v, n, key, strlen(key));
}

/* "HOST:PORT" into host and *port; false when it is not one */
static bool split(const char *s, size_t len, char *host, size_t hcap,
                  int *port) {
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (!colon || colon == s || (size_t)(colon - s) >= hcap)
        return false;
    size_t pl = len - (size_t)(colon - s) - 1;
    char digits[8];
    if (!pl || pl >= sizeof digits)
        return false;
    memcpy(digits, colon + 1, pl);
    digits[pl] = 0;
    char *end;
    errno = 0;
    long v = strtol(digits, &end, 10);
    if (errno || *end || v < 1 || v > 65535 || digits[0] < '0' ||
        digits[0] > '9')
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    for (char *h = host; *h; h++)
        if (*h == ' ' || *h == ',' || *h == '/')
            return false;
    *port = (int)v;
    return true;
}

int ts_kv_peers_parse(const char *list, ts_kv_peers *p, char *err,
                      size_t errcap) {
    memset(p, 0, sizeof *p);
    const char *s = list ? list : "";
    while (*s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (p->n == TS_MAX_KV_PEERS) {
            snprintf(err, errcap, "--kv-peers: at most %d entries",
                     TS_MAX_KV_PEERS);
            return -1;
        }
        if (!split(s, len, p->host[p->n], sizeof p->host[0], &p->port[p->n])) {
            snprintf(err, errcap,
                     "--kv-peers: \"%.*s\" is not HOST:PORT (a port in "
                     "1..65535)",
                     (int)(len > 200 ? 200 : len), s);
            return -1;
        }
        p->n++;
        s += len + (end ? 1 : 0);
        if (end && !*s) {
            snprintf(err, errcap, "--kv-peers: an empty entry at the end");
            return -1;
        }
    }
    if (!p->n) {
        snprintf(err, errcap, "--kv-peers: no HOST:PORT given");
        return -1;
    }
    return 0;
}

bool ts_kv_peers_allow(const ts_kv_peers *p, const char *target) {
    char host[128];
    int port;
    if (!p || !target ||
        !split(target, strlen(target), host, sizeof host, &port))
        return false;
    for (int i = 0; i < p->n; i++)
        if (p->port[i] == port && !strcasecmp(p->host[i], host))
            return true;
    return false;
}

int ts_kv_senders_parse(const char *list, ts_kv_senders *s, char *err,
                        size_t errcap) {
    memset(s, 0, sizeof *s);
    const char *p = list ? list : "";
    if (!strcmp(p, "any")) {
        s->any = true;
        return 0;
    }
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char a[64];
        struct in_addr ia;
        if (s->n == TS_MAX_KV_PEERS) {
            snprintf(err, errcap, "--kv-senders: at most %d addresses",
                     TS_MAX_KV_PEERS);
            return -1;
        }
        bool ok = len < sizeof a;
        if (ok) {
            memcpy(a, p, len);
            a[len] = 0;
            ok = inet_pton(AF_INET, a, &ia) == 1;
        }
        if (!ok) {
            snprintf(err, errcap,
                     "--kv-senders: \"%.*s\" is not an IPv4 address (or "
                     "give \"any\")",
                     (int)(len > 200 ? 200 : len), p);
            return -1;
        }
        s->addr[s->n++] = ia.s_addr;
        p += len + (end ? 1 : 0);
        if (end && !*p) {
            snprintf(err, errcap, "--kv-senders: an empty entry at the end");
            return -1;
        }
    }
    if (!s->n) {
        snprintf(err, errcap, "--kv-senders: no address given");
        return -1;
    }
    return 0;
}

bool ts_kv_senders_allow(const ts_kv_senders *s, const struct sockaddr *peer) {
    if (!peer || peer->sa_family != AF_INET)
        return false;
    uint32_t a =
        ((const struct sockaddr_in *)(const void *)peer)->sin_addr.s_addr;
    if (!s)
        return (ntohl(a) >> 24) == 127;
    if (s->any)
        return true;
    for (int i = 0; i < s->n; i++)
        if (s->addr[i] == a)
            return true;
    return false;
}

int ts_origins_parse(const char *list, ts_origins *o, char *err,
                     size_t errcap) {
    memset(o, 0, sizeof *o);
    const char *p = list ? list : "";
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *e = p;
        size_t el = len;
        while (el && (*e == ' ' || *e == '\t'))
            e++, el--;
        while (el && (e[el - 1] == ' ' || e[el - 1] == '\t'))
            el--;
        if (el == 1 && *e == '*')
            o->any = true;
        else {
            /* scheme://host[:port], nothing after: what a browser sends */
            const char *sep = el > 3 ? strstr(e, "://") : NULL;
            bool ok = sep && sep > e && (size_t)(sep - e) + 3 < el &&
                      el < sizeof o->origin[0];
            for (size_t i = 0; ok && i < el; i++)
                ok = e[i] > ' ' && e[i] < 0x7f && e[i] != ',' &&
                     (e + i < sep + 3 || e[i] != '/');
            if (!ok) {
                snprintf(err, errcap,
                         "--allowed-origins: \"%.*s\" is not an origin "
                         "(scheme://host[:port], or \"*\")",
                         (int)(len > 200 ? 200 : len), p);
                return -1;
            }
            if (o->n == TS_MAX_ORIGINS) {
                snprintf(err, errcap, "--allowed-origins: at most %d entries",
                         TS_MAX_ORIGINS);
                return -1;
            }
            memcpy(o->origin[o->n], e, el);
            o->origin[o->n++][el] = 0;
        }
        p += len + (end ? 1 : 0);
        if (end && !*p) {
            snprintf(err, errcap,
                     "--allowed-origins: an empty entry at the "
                     "end");
            return -1;
        }
    }
    if (!o->n && !o->any) {
        snprintf(err, errcap, "--allowed-origins: no origin given");
        return -1;
    }
    return 0;
}

const char *ts_origins_allow(const ts_origins *o, const char *origin) {
    if (!o || !origin || !*origin)
        return NULL;
    if (o->any)
        return "*";
    for (int i = 0; i < o->n; i++)
        if (!strcasecmp(o->origin[i], origin))
            return origin;
    return NULL;
}
