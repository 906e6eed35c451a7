/* strbuf.h — a growing, NUL-terminated byte string for code that builds
 * text (chat templates, HTTP responses). Out of memory sets oom and drops
 * the bytes: callers that must know check it once at the end. */
#ifndef TS_STRBUF_H
#define TS_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p; /* NULL until the first byte */
    size_t n, cap;
    bool oom;
} ts_sbuf;

void ts_sb_add(ts_sbuf *b, const char *s, size_t n);
void ts_sb_puts(ts_sbuf *b, const char *s);
void ts_sb_printf(ts_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The UTF-8 character at s (n > 0 bytes there), by the Unicode Standard's
 * table 3-7 of well-formed sequences: 1 with *len its bytes; 0 when s[0, n)
 * is only the start of one; -1 when it is ill-formed, *len the bytes of its
 * maximal subpart (one U+FFFD, as Python's errors="replace"). */
int ts_utf8_char(const unsigned char *s, size_t n, size_t *len);
/* s[0, n) with each ill-formed part (and a character cut short at the end)
 * as U+FFFD */
void ts_sb_add_lossy(ts_sbuf *b, const char *s, size_t n);

#endif
