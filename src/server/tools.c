/* tools.c — OpenAI tool calling (tools.h): a chat body's tools and
 * tool_choice checked against the model's tool-call syntax, the grammar
 * a required or named choice imposes, and the parser of the model's
 * output into content and tool_calls. Hermes calls stream as each one
 * closes (its whole arguments in one delta); Llama 3 calls, which are the
 * whole output, come at the end. The template's side is prompt.c's. */
#include "tools.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum tool_choice { CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED };
enum syntax { SYNTAX_HERMES, SYNTAX_LLAMA3 };

struct ts_tool_request {
    json_t *tools; /* the body's tools, checked */
    enum tool_choice choice;
    enum syntax syntax;
    char *schema; /* ts_tools_grammar's src: NULL for auto */
};

static int bad(ts_prompt_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(ts_prompt_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->status = 400;
    e->param = param;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* OpenAI's rule for function names: 1 to 64 of [A-Za-z0-9_-] (and '.',
 * which some clients use for namespaces) */
static bool good_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_-.", s[i]))
            return false;
    return n >= 1 && n <= 64;
}

/* A function's parameters: a JSON Schema object whose "type", if any, is
 * a string or a list of strings */
static bool good_schema(json_t *p) {
    if (!json_is_object(p))
        return false;
    json_t *type = json_object_get(p, "type"), *t;
    size_t i;
    if (!type || json_is_string(type))
        return true;
    if (!json_is_array(type))
        return false;
    json_array_foreach(type, i, t) if (!json_is_string(t)) return false;
    return true;
}

static const char *tool_name(json_t *tool) {
    return json_string_value(
        json_object_get(json_object_get(tool, "function"), "name"));
}

/* a tool's index and name, sorted by name then index to find two that
 * share a name in O(n log n) */
typedef struct {
    const char *name;
    size_t index;
} named_tool;

static int by_name(const void *a, const void *b) {
    const named_tool *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->index < y->index ? -1 : x->index > y->index;
}

/* 0, or -1 with e naming the first tools[i] whose name an earlier
 * tools[k] has (the smallest such i, and its first k) */
static int check_unique(json_t *tools, ts_prompt_error *e) {
    size_t n = json_array_size(tools);
    named_tool *v = malloc(sizeof *v * (n ? n : 1));
    if (!v)
        return bad(e, "tools", "out of memory");
    for (size_t i = 0; i < n; i++)
        v[i] = (named_tool){tool_name(json_array_get(tools, i)), i};
    qsort(v, n, sizeof *v, by_name);
    size_t first = 0, k = 0, i = n; /* i: the smallest repeat's index */
    for (size_t j = 1; j < n; j++) {
        if (strcmp(v[j].name, v[j - 1].name))
            first = j;
        else if (j == first + 1 && v[j].index < i)
            k = v[first].index, i = v[j].index;
    }
    const char *name = i < n ? tool_name(json_array_get(tools, i)) : NULL;
    free(v);
    if (name)
        return bad(e, "tools",
                   "tools[%zu] and tools[%zu] are both named \"%s\"", k, i,
                   name);
    return 0;
}

/* 0, or -1 with e naming tools[i] */
static int check_tools(json_t *tools, ts_prompt_error *e) {
    size_t i;
    json_t *t;
    if (json_array_size(tools) > TS_TOOLS_MAX)
        return bad(e, "tools", "at most %d tools in a request (%zu given)",
                   TS_TOOLS_MAX, json_array_size(tools));
    json_array_foreach(tools, i, t) {
        json_t *type = json_object_get(t, "type");
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_object(fn) ||
            (type && (!json_is_string(type) ||
                      strcmp(json_string_value(type), "function"))))
            return bad(e, "tools",
                       "tools[%zu] must be {\"type\": \"function\", "
                       "\"function\": {\"name\", \"parameters\", ...}}",
                       i);
        const char *name = tool_name(t);
        if (!good_name(name))
            return bad(e, "tools",
                       "tools[%zu].function.name must be 1 to 64 letters, "
                       "digits, '_', '-' or '.'",
                       i);
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !good_schema(params))
            return bad(e, "tools",
                       "tools[%zu].function.parameters (function \"%s\") "
                       "must be a JSON Schema object whose \"type\" is a "
                       "string or a list of strings",
                       i, name);
    }
    return check_unique(tools, e);
}

/* tool_choice: 1 (none), 0 with *choice and *named, or -1 */
static int read_choice(json_t *tc, json_t *tools, enum tool_choice *choice,
                       const char **named, ts_prompt_error *e) {
    *choice = CHOICE_AUTO, *named = NULL;
    const char *s = json_string_value(tc);
    if (!tc || json_is_null(tc) || (s && !strcmp(s, "auto")))
        return 0;
    if (s && !strcmp(s, "none"))
        return 1;
    if (s && !strcmp(s, "required")) {
        *choice = CHOICE_REQUIRED;
        return 0;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    *named = json_string_value(
        json_object_get(json_object_get(tc, "function"), "name"));
    if (!json_is_object(tc) || !type || strcmp(type, "function") || !*named)
        return bad(e, "tool_choice",
                   "must be \"auto\", \"none\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) if (!strcmp(tool_name(t), *named)) {
        *choice = CHOICE_NAMED;
        return 0;
    }
    return bad(e, "tool_choice",
               "names function \"%.100s\", which is not in "
               "tools",
               *named);
}

/* {"type":"object","properties":{"name":{"const":N},KEY:PARAMS},
 *  "required":["name",KEY]} for one tool */
static json_t *call_schema(json_t *tool, const char *key) {
    json_t *fn = json_object_get(tool, "function");
    json_t *params = json_object_get(fn, "parameters");
    json_t *p = json_is_object(params)
                    ? json_incref(params)
                    : json_pack("{s:s,s:{}}", "type", "object", "properties");
    return json_pack("{s:s,s:{s:{s:s},s:o},s:[s,s]}", "type", "object",
                     "properties", "name", "const", tool_name(tool), key, p,
                     "required", "name", key);
}

/* the JSON Schema of a call to any of the tools (anyOf), or to named */
static char *choice_schema(const ts_tool_request *t, const char *named) {
    const char *key = t->syntax == SYNTAX_LLAMA3 ? "parameters" : "arguments";
    json_t *any = json_array(), *tool, *root = NULL;
    size_t i;
    json_array_foreach(t->tools, i, tool) {
        if (!named || !strcmp(tool_name(tool), named))
            json_array_append_new(any, call_schema(tool, key));
    }
    if (json_array_size(any) == 1)
        root = json_incref(json_array_get(any, 0));
    else
        root = json_pack("{s:O}", "anyOf", any);
    json_decref(any);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

int ts_tools_parse(json_t *body, const ts_chat *chat, ts_tool_request **out,
                   ts_prompt_error *err) {
    *out = NULL;
    json_t *tools = json_object_get(body, "tools");
    json_t *tc = json_object_get(body, "tool_choice");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return bad(err, "tools", "must be an array of tools");
    if (!json_array_size(tools)) {
        const char *s = json_string_value(tc);
        if (tc && !json_is_null(tc) &&
            !(s && (!strcmp(s, "none") || !strcmp(s, "auto"))))
            return bad(err, "tool_choice", "needs tools");
        return 0;
    }
    if (check_tools(tools, err))
        return -1;
    enum tool_choice choice;
    const char *named;
    int r = read_choice(tc, tools, &choice, &named, err);
    if (r)
        return r > 0 ? 0 : -1;
    /* a template without `tools` gets them in Hermes' words (prompt.c's
     * fallback), whatever its own syntax looks like; one that takes them
     * is answered in its own syntax */
    bool takes = chat && ts_chat_takes_tools(chat);
    const char *syn = takes ? ts_chat_tool_syntax(chat) : "hermes";
    if (!*syn)
        return bad(err, "tools",
                   "this model's chat template takes tools but its "
                   "tool-call syntax is not one we parse (hermes, llama3)");
    ts_tool_request *t = calloc(1, sizeof *t);
    if (!t)
        return bad(err, "tools", "out of memory");
    t->tools = json_incref(tools);
    t->choice = choice;
    t->syntax = !strcmp(syn, "llama3") ? SYNTAX_LLAMA3 : SYNTAX_HERMES;
    if (choice != CHOICE_AUTO && !(t->schema = choice_schema(t, named))) {
        ts_tools_free(t);
        return bad(err, "tools", "out of memory");
    }
    *out = t;
    return 0;
}

void ts_tools_free(ts_tool_request *t) {
    if (!t)
        return;
    json_decref(t->tools);
    free(t->schema);
    free(t);
}

bool ts_tools_grammar(const ts_tool_request *t, ts_grammar_spec *spec) {
    if (!t || t->choice == CHOICE_AUTO)
        return false;
    bool hermes = t->syntax == SYNTAX_HERMES;
    *spec = (ts_grammar_spec){.kind = TS_GRAMMAR_JSON_SCHEMA,
                              .src = t->schema,
                              .prefix = hermes ? "<tool_call>\n" : NULL,
                              .suffix = hermes ? "\n</tool_call>" : NULL};
    return true;
}

/* ---- the output parser ------------------------------------------------ */

#define CALL_OPEN  "<tool_call>"
#define CALL_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

struct ts_tool_parser {
    enum syntax syntax;
    ts_sbuf pending; /* text not yet content nor a call */
    bool in_call;    /* hermes: inside <tool_call> */
    bool after_call; /* hermes: a </tool_call> came (spaces after it go) */
    bool decided;    /* llama3: whether the output is a call is known */
    bool calls_only; /* llama3: the output is held for calls */
    json_t *calls;   /* message.tool_calls so far */
};

ts_tool_parser *ts_tool_parser_new(const ts_tool_request *t) {
    ts_tool_parser *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->syntax = t ? t->syntax : SYNTAX_HERMES;
    p->calls = json_array();
    if (!p->calls) {
        free(p);
        return NULL;
    }
    return p;
}

void ts_tool_parser_free(ts_tool_parser *p) {
    if (!p)
        return;
    free(p->pending.p);
    json_decref(p->calls);
    free(p);
}

json_t *ts_tool_parser_calls(const ts_tool_parser *p) {
    return p && json_array_size(p->calls) ? json_deep_copy(p->calls) : NULL;
}

/* "call_" + 24 letters and digits from a process-wide counter
 * (splitmix64): unique in a process, deterministic in tests */
static void new_call_id(char id[30]) {
    static unsigned long long counter;
    unsigned long long x = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) *
                           0x9E3779B97F4A7C15ull;
    static const char alnum[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(id, "call_", 5);
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) { /* a fresh 64-bit draw for every 8 characters */
            x += 0x9E3779B97F4A7C15ull;
            x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
            x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
            x ^= x >> 31;
        }
        id[5 + i] = alnum[(x >> (8 * (i % 8))) % 62];
    }
    id[29] = 0;
}

/* {"name", key: {...}} (arguments also as a string holding an object)
 * -> the call's name and arguments as OpenAI's string; false when obj is
 * not a call */
static bool call_parts(json_t *obj, const char *key, const char **name,
                       char **args) {
    *name = json_string_value(json_object_get(obj, "name"));
    json_t *a = json_object_get(obj, key);
    if (!a && !strcmp(key, "parameters")) /* some Llama fine-tunes */
        a = json_object_get(obj, "arguments");
    json_t *parsed = NULL;
    if (json_is_string(a))
        a = parsed = json_loads(json_string_value(a), 0, NULL);
    *args = json_is_object(a) ? json_dumps(a, 0) : NULL;
    json_decref(parsed);
    if (*args && *name && **name)
        return true;
    free(*args), *args = NULL;
    return false;
}

/* Appends the call and its stream delta; false when obj is not a call */
static bool add_call(ts_tool_parser *p, json_t *obj, const char *key,
                     json_t **deltas) {
    const char *name;
    char *args;
    if (!call_parts(obj, key, &name, &args))
        return false;
    char id[30];
    new_call_id(id);
    size_t index = json_array_size(p->calls);
    json_array_append_new(p->calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id,
                                              "type", "function", "function",
                                              "name", name, "arguments", args));
    if (!*deltas)
        *deltas = json_array();
    json_array_append_new(*deltas, json_pack("{s:I,s:s,s:s,s:{s:s,s:s}}",
                                             "index", (json_int_t)index, "id",
                                             id, "type", "function", "function",
                                             "name", name, "arguments", args));
    free(args);
    return true;
}

/* Drops the first n bytes of b */
static void sb_consume(ts_sbuf *b, size_t n) {
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    b->p[b->n] = 0;
}

/* The length of the longest tail of s[0, n) that begins tag */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

/* One hermes step over pending; false when it needs more text */
static bool hermes_step(ts_tool_parser *p, bool final, ts_sbuf *content,
                        json_t **deltas) {
    ts_sbuf *b = &p->pending;
    if (!b->n)
        return false;
    if (!p->in_call) {
        size_t skip = 0; /* whitespace between calls is no content */
        while (p->after_call && skip < b->n &&
               isspace((unsigned char)b->p[skip]))
            skip++;
        char *open = strstr(b->p + skip, CALL_OPEN);
        size_t upto =
            open ? (size_t)(open - b->p)
                 : b->n - (final ? 0 : partial_tag(b->p, b->n, CALL_OPEN));
        if (!open && !final && skip == b->n)
            return false; /* only whitespace after a call: wait */
        if (upto > skip)
            ts_sb_add(content, b->p + skip, upto - skip);
        sb_consume(b, open ? upto + strlen(CALL_OPEN) : upto);
        p->in_call = open != NULL;
        return open != NULL;
    }
    char *close = strstr(b->p, CALL_CLOSE);
    if (!close) {
        if (final) { /* cut short: the text stays content */
            ts_sb_puts(content, CALL_OPEN);
            ts_sb_add(content, b->p, b->n);
            sb_consume(b, b->n);
        }
        return false;
    }
    size_t body = (size_t)(close - b->p);
    json_t *obj = json_loadb(b->p, body, 0, NULL);
    if (!add_call(p, obj, "arguments", deltas)) {
        ts_sb_puts(content, CALL_OPEN);
        ts_sb_add(content, b->p, body + strlen(CALL_CLOSE));
    }
    json_decref(obj);
    sb_consume(b, body + strlen(CALL_CLOSE));
    p->in_call = false, p->after_call = true;
    return true;
}

/* llama3: the whole text as calls ({...} joined by ';', after an optional
 * <|python_tag|>); false (nothing added) when it is not */
static bool llama3_calls(ts_tool_parser *p, const char *s, size_t n,
                         json_t **deltas) {
    json_t *objs = json_array();
    size_t at = 0;
    while (at < n && isspace((unsigned char)s[at]))
        at++;
    if (n - at >= strlen(PYTHON_TAG) &&
        !memcmp(s + at, PYTHON_TAG, strlen(PYTHON_TAG)))
        at += strlen(PYTHON_TAG);
    bool ok = true;
    while (ok) {
        json_error_t je;
        json_t *o = json_loadb(s + at, n - at, JSON_DISABLE_EOF_CHECK, &je);
        ok = json_is_object(o) && !json_array_append_new(objs, o);
        if (!ok) {
            json_decref(o);
            break;
        }
        at += je.position; /* the bytes the object took */
        while (at < n && isspace((unsigned char)s[at]))
            at++;
        if (at == n)
            break;
        ok = s[at++] == ';';
    }
    size_t i;
    json_t *o;
    const char *name;
    char *args;
    json_array_foreach(objs, i, o) {
        ok = ok && call_parts(o, "parameters", &name, &args);
        if (ok)
            free(args);
    }
    if (ok) /* every object is a call: only now are any added */
        json_array_foreach(objs, i, o) add_call(p, o, "parameters", deltas);
    json_decref(objs);
    return ok;
}

/* llama3: text that starts (after spaces) with '{' or <|python_tag|> is
 * held to the end; anything else is content as it comes */
static void llama3_feed(ts_tool_parser *p, bool final, ts_sbuf *content,
                        json_t **deltas) {
    ts_sbuf *b = &p->pending;
    if (!p->decided) {
        size_t at = 0;
        while (at < b->n && isspace((unsigned char)b->p[at]))
            at++;
        size_t rest = b->n - at;
        bool tag_so_far =
            rest < strlen(PYTHON_TAG) && !memcmp(b->p + at, PYTHON_TAG, rest);
        if (!final && (rest == 0 || (tag_so_far && rest > 0)))
            return;
        p->decided = true;
        p->calls_only =
            rest > 0 && (b->p[at] == '{' ||
                         !strncmp(b->p + at, PYTHON_TAG, strlen(PYTHON_TAG)));
    }
    if (p->calls_only && !final)
        return;
    if (!(p->calls_only && b->n && llama3_calls(p, b->p, b->n, deltas)))
        ts_sb_add(content, b->p ? b->p : "", b->n);
    sb_consume(b, b->n);
}

void ts_tool_parser_feed(ts_tool_parser *p, const char *text, size_t n,
                         bool final, ts_sbuf *content, json_t **deltas) {
    *deltas = NULL;
    ts_sb_add(&p->pending, text ? text : "", n); /* allocates, even n 0 */
    if (p->syntax == SYNTAX_LLAMA3) {
        if (p->pending.p)
            llama3_feed(p, final, content, deltas);
        return;
    }
    while (p->pending.p && hermes_step(p, final, content, deltas))
        ;
}
