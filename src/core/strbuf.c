/* strbuf.c — see strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ts_sb_add(ts_sbuf *b, const char *s, size_t n) {
    if (b->oom || n > ((size_t)1 << 40))
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ts_sb_puts(ts_sbuf *b, const char *s) {
    ts_sb_add(b, s, strlen(s));
}

void ts_sb_printf(ts_sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        ts_sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1); /* longer than the stack buffer */
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ts_sb_add(b, big, (size_t)n);
    free(big);
}
