/* chat_builtin.h — internal: the chat templates built into the library
 * (--chat-template NAME), for model folders that carry none. */
#ifndef TS_CHAT_BUILTIN_H
#define TS_CHAT_BUILTIN_H

typedef struct {
    const char *name;
    const char *source; /* Jinja, rendered as any model's template */
    const char *eos;    /* the end token the template needs, or NULL:
                           the folder's eos_token stays */
} ts_chat_builtin;

/* NULL when name is none of ts_chat_builtin_names() */
const ts_chat_builtin *ts_chat_builtin_find(const char *name);

#endif
