/* jinja.h — internal: render a parsed chat template with variables given
 * as a jansson object (chat.c builds them without a JSON round trip). */
#ifndef TS_JINJA_H
#define TS_JINJA_H

#include "tessera_tokenizer.h"

#include <jansson.h>

ts_status ts_template_render_json(ts_ctx *ctx, const ts_template *t,
                                  json_t *vars, char **out, size_t *len);

#endif
