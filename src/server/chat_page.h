/* chat_page.h — the chat page served at GET / (src/server/chat_page.html,
 * plain HTML, CSS and JavaScript with no external fetch), embedded into the
 * library at build time by cmake/embed_file.cmake. */
#ifndef TS_SERVER_CHAT_PAGE_H
#define TS_SERVER_CHAT_PAGE_H

#include <stddef.h>

/* The page's bytes (static, NUL-terminated; UTF-8, text/html) and, when len
 * is not NULL, their count without the NUL. */
const char *ts_chat_page_html(size_t *len);

#endif
