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

#endif
