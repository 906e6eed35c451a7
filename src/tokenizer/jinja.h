/* jinja.h — internal: render a parsed chat template with variables given
 * as a jansson object (chat.c builds them without a JSON round trip). */
#ifndef TS_JINJA_H
#define TS_JINJA_H

#include "tessera_tokenizer.h"

#include <jansson.h>

ts_status ts_template_render_json(ts_ctx *ctx, const ts_template *t,
                                  json_t *vars, char **out, size_t *len);

/* Tests only: from now on, the nth allocation (1: the next) that jinja.c
 * makes, or that jansson makes while this is armed, fails, and with
 * and_after every one after it too (memory stays exhausted); 0 disarms.
 * Returns how many allocations were counted since the previous call (arm
 * with LONG_MAX to count a parse or render). Not thread-safe. */
long ts_jinja_fail_alloc(long n, bool and_after);

#endif
