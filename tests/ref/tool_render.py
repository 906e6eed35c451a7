#!/usr/bin/python3
"""Reference for tests/test_tools.c: renders OpenAI chat bodies (messages
with tool calls and role "tool" messages, tools) through chat templates
with Python's jinja2 set up as transformers' apply_chat_template sets it up
(tests/ref/chat_cases.py's environment), after the message preparation
vLLM's chat endpoint does: null content as "", text parts joined, tool-call
arguments given as JSON strings loaded to objects. For a template that does
not read `tools` ("takes_tools": false) the tools go into a Hermes system
message and calls and results into <tool_call> / <tool_response> blocks
(docs/CHAT_TEMPLATES.md), written here independently of prompt.c.
argv: IN_JSON OUT_JSON. IN is a list of {"template", "body", "takes_tools",
"bos_token"?, "eos_token"?}; OUT the list of rendered strings."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_cases import make_env  # noqa: E402

HERMES_HEAD = ("# Tools\n\nYou may call one or more functions to assist with "
               "the user query.\n\nYou are provided with function signatures "
               "within <tools></tools> XML tags:\n<tools>")
HERMES_TAIL = ("\n</tools>\n\nFor each function call, return a json object "
               "with function name and arguments within <tool_call>"
               "</tool_call> XML tags:\n<tool_call>\n{\"name\": "
               "<function-name>, \"arguments\": <args-json-object>}\n"
               "</tool_call>")


def prepare(messages):
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        c = m.get("content")
        if c is None:
            m["content"] = ""
        elif isinstance(c, list):
            m["content"] = "".join(p["text"] for p in c)
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
            fn.setdefault("arguments", {})
        out.append(m)
    return out


def call_text(fn):
    return ('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
            % (fn["name"], json.dumps(fn["arguments"], ensure_ascii=False)))


def hermes_fallback(messages, tools):
    out = []
    if tools:
        desc = HERMES_HEAD + "".join(
            "\n" + json.dumps(t, ensure_ascii=False) for t in tools
        ) + HERMES_TAIL
        if messages[0]["role"] == "system":
            desc = messages[0]["content"] + "\n\n" + desc
            messages = messages[1:]
        out.append({"role": "system", "content": desc})
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            parts = []
            while i < len(messages) and messages[i]["role"] == "tool":
                parts.append("<tool_response>\n%s\n</tool_response>"
                             % messages[i]["content"])
                i += 1
            out.append({"role": "user", "content": "\n".join(parts)})
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            texts = [m["content"]] if m["content"] else []
            texts += [call_text(c["function"]) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(texts)})
        else:
            out.append(m)
        i += 1
    return out


def render(env, case):
    body = case["body"]
    tools = body.get("tools") or None
    messages = prepare(body["messages"])
    if not case["takes_tools"]:
        messages, tools = hermes_fallback(messages, tools), None
    variables = {"messages": messages, "tools": tools,
                 "add_generation_prompt": True}
    for key in ("bos_token", "eos_token"):
        if key in case:
            variables[key] = case[key]
    return env.from_string(case["template"]).render(**variables)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = make_env()
    out = [render(env, c) for c in cases]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
