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

/* The UTF-8 character at s (n > 0 bytes there), by the Unicode Standard's
 * table 3-7 of well-formed sequences (no overlong forms, no surrogates,
 * nothing past U+10FFFF): 1 with *len its bytes; 0 when s[0, n) is only the
 * start of one (more bytes may complete it); -1 when it is ill-formed,
 * *len the bytes of its maximal subpart, which become one U+FFFD (as
 * Hugging Face's decoders, Rust's from_utf8_lossy and Python's
 * errors="replace" do: C0 80 is two, ED A0 80 three). */
int ts_utf8_char(const unsigned char *s, size_t n, size_t *len) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t need = c < 0x80                 ? 1
                  : c >= 0xC2 && c <= 0xDF ? 2
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xF0 && c <= 0xF4 ? 4
                                           : 0;
    *len = 1;
    if (!need)
        return -1; /* a continuation byte, C0, C1, F5..FF */
    if (c == 0xE0)
        lo = 0xA0; /* overlong below U+0800 */
    else if (c == 0xED)
        hi = 0x9F; /* surrogates U+D800..DFFF */
    else if (c == 0xF0)
        lo = 0x90; /* overlong below U+10000 */
    else if (c == 0xF4)
        hi = 0x8F; /* past U+10FFFF */
    for (size_t j = 1; j < need; j++) {
        if (j == n)
            return 0;
        if (s[j] < (j == 1 ? lo : 0x80) || s[j] > (j == 1 ? hi : 0xBF)) {
            *len = j;
            return -1;
        }
    }
    *len = need;
    return 1;
}

void ts_sb_add_lossy(ts_sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l;
        int got = ts_utf8_char(u + i, n - i, &l);
        if (got > 0)
            ts_sb_add(b, s + i, l);
        else
            ts_sb_add(b, "\xEF\xBF\xBD", 3); /* U+FFFD */
        i += got ? l : n - i; /* a character cut short at the end: one */
    }
}
