// openai_features.mjs TESSERA TINY_LM_DIR STRUCTURED_CHECK_PY — the OpenAI
// protocol's features on `tessera serve`, through the `openai` npm client
// (issue 19): structured outputs (json_schema answers for 20 seeds
// validated by python3-jsonschema, json_object, regex, choice, EBNF;
// streamed equal to whole, batched, with the prefix cache warm; a 400
// naming an unsupported schema keyword), a tool-call round trip streamed
// and whole, logprobs consistent with the prompt's (echo), echo, lists of
// prompts, logit_bias, best_of, suffix, and a 400 naming an unsupported
// field; vLLM's priority field (issue 22); stop strings with tools (nothing after a stop reaches the content
// or a call); too many tools refused before the template renders them. The tiny model is random: every schema bounds its strings and
// arrays so that answers end. Its context is raised to 2048 positions (a
// copy of the folder) so that the tools' system message fits.
import OpenAI from "openai";
import { spawn, spawnSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const [exe, tinyDir, checkPy] = process.argv.slice(2);
const dir = mkdtempSync(join(tmpdir(), "ts-openai-"));
const model = join(dir, "tiny");
cpSync(tinyDir, model, { recursive: true });
const cfg = JSON.parse(readFileSync(join(model, "config.json"), "utf8"));
cfg.max_position_embeddings = 2048;
writeFileSync(join(model, "config.json"), JSON.stringify(cfg));
const vocab = JSON.parse(readFileSync(join(model, "tokenizer.json"), "utf8")).model.vocab;
const idOf = (s) => vocab[s.replace(/ /g, "Ġ").replace(/\n/g, "Ċ")];

const port = 19000 + (process.pid % 1000);
const base = `http://127.0.0.1:${port}`;
const server = spawn(exe, ["serve", "-m", model, "--port", String(port), "--kv-blocks", "600",
  "--max-seqs", "16", "--served-model-name", "tiny"], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
server.stderr.on("data", (d) => { log += d; });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none", maxRetries: 0 });
const M = "tiny";

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${base}/health`)).ok) return;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("server did not come up: " + log);
}

async function raw(path, body) {
  const r = await fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

async function expect400(path, body, param, re) {
  const r = await raw(path, body);
  assert.equal(r.status, 400, JSON.stringify(r.json));
  assert.equal(r.json.error.param, param, JSON.stringify(r.json));
  if (re) assert.match(r.json.error.message, re);
}

const cases = []; // for structured_check.py
const SCHEMAS = [
  { type: "object", properties: { name: { type: "string", maxLength: 8 },
    ok: { type: "boolean" } }, required: ["name", "ok"], additionalProperties: false },
  { type: "object", properties: { color: { enum: ["red", "green", "blue"] },
    tags: { type: "array", items: { type: "string", maxLength: 4 }, maxItems: 3 } },
    required: ["color", "tags"], additionalProperties: false },
  { type: "array", items: { enum: [1, 2, 3, "x", null] }, minItems: 1, maxItems: 4 },
  { type: "object", properties: { a: { type: "object", properties: { b: { const: "deep" } },
    required: ["b"], additionalProperties: false },
    n: { enum: [0, 10, -5] } }, required: ["a", "n"], additionalProperties: false },
];
const rf = (schema) => ({ type: "json_schema", json_schema: { name: "t", schema, strict: true } });

async function structured() {
  // 20 seeds over the schemas, chat and completions in turn, all at once
  const runs = await Promise.all(Array.from({ length: 20 }, async (_, s) => {
    const schema = SCHEMAS[s % SCHEMAS.length];
    if (s % 2) {
      const r = await client.completions.create({ model: M, prompt: `Answer ${s}:`, max_tokens: 600,
        temperature: 1, seed: s, response_format: rf(schema) });
      return { schema, text: r.choices[0].text, fin: r.choices[0].finish_reason };
    }
    const r = await client.chat.completions.create({ model: M, max_tokens: 600, temperature: 1, seed: s,
      messages: [{ role: "user", content: `Answer ${s}` }], response_format: rf(schema) });
    return { schema, text: r.choices[0].message.content, fin: r.choices[0].finish_reason };
  }));
  runs.forEach((r, s) => {
    assert.equal(r.fin, "stop", `seed ${s}: ${JSON.stringify(r.text)}`);
    cases.push({ what: `json_schema seed ${s}`, schema: r.schema, text: r.text });
  });

  // json_object: any object
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model: M, max_tokens: 800, temperature: 0.7, seed,
      messages: [{ role: "user", content: "json" }], response_format: { type: "json_object" } });
    if (r.choices[0].finish_reason === "stop")
      cases.push({ what: `json_object ${seed}`, schema: { type: "object" }, text: r.choices[0].message.content });
  }

  // a regex, vLLM's two ways; choices; an EBNF grammar
  const regex = "[a-z]{2,6}@(example|test)\\.(com|org)";
  for (const [k, body] of [["guided_regex", { guided_regex: regex }],
    ["structured_outputs", { structured_outputs: { regex } }]]) {
    const r = await client.completions.create({ model: M, prompt: "mail:", max_tokens: 60, temperature: 1,
      seed: 5, ...body });
    assert.equal(r.choices[0].finish_reason, "stop", k);
    cases.push({ what: k, regex, text: r.choices[0].text });
  }
  const choice = ["alpha", "beta", "gamma.*", "a|b"];
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const r = await client.completions.create({ model: M, prompt: "pick", max_tokens: 20, temperature: 1,
      seed, ...(seed % 2 ? { guided_choice: choice } : { structured_outputs: { choice } }) });
    cases.push({ what: `choice ${seed}`, choice, text: r.choices[0].text });
  }
  const gram = 'root ::= ("yes" | "no") " " digit digit?\ndigit ::= [0-9]';
  for (const seed of [1, 2, 3]) {
    const r = await client.completions.create({ model: M, prompt: "q", max_tokens: 20, temperature: 1,
      seed, guided_grammar: gram });
    cases.push({ what: `guided_grammar ${seed}`, regex: "(yes|no) [0-9][0-9]?", text: r.choices[0].text });
  }

  // streamed equals whole, for the same seed
  const body = { model: M, max_tokens: 600, temperature: 1, seed: 11,
    messages: [{ role: "user", content: "stream it" }], response_format: rf(SCHEMAS[1]) };
  const whole = await client.chat.completions.create(body);
  let streamed = "";
  for await (const ch of await client.chat.completions.create({ ...body, stream: true }))
    streamed += ch.choices[0]?.delta?.content ?? "";
  assert.equal(streamed, whole.choices[0].message.content);

  // the prefix cache warm: a long shared prompt, then the same request
  const long = "a long shared prefix for the cache ".repeat(8);
  const p1 = { model: M, prompt: long, max_tokens: 600, temperature: 1, seed: 3, guided_json: SCHEMAS[0] };
  const first = await client.completions.create(p1);
  const again = await client.completions.create(p1);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0);
  assert.equal(again.choices[0].text, first.choices[0].text);
  cases.push({ what: "cache warm", schema: SCHEMAS[0], text: again.choices[0].text });

  // a list of prompts and n in one request: every choice valid
  const lst = await client.completions.create({ model: M, prompt: ["one", "two", "three"], n: 2,
    max_tokens: 600, temperature: 1, seed: 9, response_format: rf(SCHEMAS[3]) });
  assert.equal(lst.choices.length, 6);
  for (const c of lst.choices) cases.push({ what: `list ${c.index}`, schema: SCHEMAS[3], text: c.text });

  // refusals: an unsupported keyword, a bad regex, two ways at once
  await expect400("/v1/chat/completions", { model: M, messages: [{ role: "user", content: "x" }],
    response_format: rf({ type: "object", patternProperties: { "^a": { type: "string" } } }) },
  "response_format", /patternProperties/);
  await expect400("/v1/completions", { model: M, prompt: "x", guided_regex: "(ab" }, "guided_regex");
  await expect400("/v1/completions", { model: M, prompt: "x", guided_regex: "a", guided_choice: ["a"] },
    "guided_regex", /one structured-output field/);
  await expect400("/v1/completions", { model: M, prompt: "x", structured_outputs: { structural_tag: "x" } },
    "structured_outputs", /structural_tag/);
  await expect400("/v1/completions", { model: M, prompt: "x", response_format: { type: "yaml" } },
    "response_format", /yaml/);
}

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 10 },
      unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", description: "The time",
    parameters: { type: "object", properties: { zone: { enum: ["utc", "cet"] } }, required: ["zone"],
      additionalProperties: false } } },
];

async function tools() {
  const msgs = [{ role: "user", content: "What is the weather in Paris?" }];
  const body = { model: M, messages: msgs, tools: TOOLS, tool_choice: "required", max_tokens: 300,
    temperature: 1, seed: 4 };
  const r = await client.chat.completions.create(body);
  const ch = r.choices[0];
  assert.equal(ch.finish_reason, "tool_calls", JSON.stringify(ch));
  assert.equal(ch.message.content, null);
  assert.equal(ch.message.tool_calls.length, 1);
  const call = ch.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.match(call.id, /^call_/);
  const tool = TOOLS.find((t) => t.function.name === call.function.name);
  assert.ok(tool, call.function.name);
  cases.push({ what: "tool arguments", schema: tool.function.parameters, text: call.function.arguments });

  // streamed: the same call as deltas, finish_reason tool_calls
  const calls = [];
  let fin = null, content = "";
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    const d = c.choices[0]?.delta ?? {};
    content += d.content ?? "";
    for (const t of d.tool_calls ?? []) {
      if (!calls[t.index]) calls[t.index] = { name: "", arguments: "" };
      if (t.function?.name) calls[t.index].name = t.function.name;
      calls[t.index].arguments += t.function?.arguments ?? "";
    }
    fin = c.choices[0]?.finish_reason ?? fin;
  }
  assert.equal(fin, "tool_calls");
  assert.equal(content, "");
  assert.deepEqual(calls, [{ name: call.function.name, arguments: call.function.arguments }]);

  // a named function
  const named = await client.chat.completions.create({ ...body, seed: 8,
    tool_choice: { type: "function", function: { name: "get_time" } } });
  assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_time");
  cases.push({ what: "named tool", schema: TOOLS[1].function.parameters,
    text: named.choices[0].message.tool_calls[0].function.arguments });

  // the result back, then an answer, whole and streamed
  const follow = [...msgs, ch.message, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" }];
  const ans = await client.chat.completions.create({ model: M, messages: follow, tools: TOOLS,
    max_tokens: 8, temperature: 0 });
  assert.ok(ans.usage.prompt_tokens > r.usage.prompt_tokens + 10);
  assert.ok(["stop", "length", "tool_calls"].includes(ans.choices[0].finish_reason));
  let sans = "";
  for await (const c of await client.chat.completions.create({ model: M, messages: follow, tools: TOOLS,
    max_tokens: 8, temperature: 0, stream: true })) sans += c.choices[0]?.delta?.content ?? "";
  assert.equal(sans, ans.choices[0].message.content ?? "");

  // with response_format too: refused
  await expect400("/v1/chat/completions", { ...body, response_format: { type: "json_object" } },
    "tool_choice");
  await expect400("/v1/chat/completions", { ...body, tool_choice: { type: "function", function: { name: "nope" } } },
    "tool_choice");
}

// the answer whole and streamed: content, tool calls, finish reason
async function chatBoth(body) {
  const w = await raw("/v1/chat/completions", body);
  assert.equal(w.status, 200, JSON.stringify(w.json));
  const m = w.json.choices[0];
  let content = "", fin = null, calls = 0;
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    content += c.choices[0]?.delta?.content ?? "";
    calls += (c.choices[0]?.delta?.tool_calls ?? []).length;
    fin = c.choices[0]?.finish_reason ?? fin;
  }
  return { whole: { content: m.message.content ?? "", calls: m.message.tool_calls?.length ?? 0,
    fin: m.finish_reason }, streamed: { content, calls, fin } };
}

// Stop strings with tools are cut from the model's own text before the
// tool-call parser reads it (vLLM's order): a stop inside a call ends it
// there (the cut-short call stays content, no call), and nothing after a
// stop reaches the client. The output is forced with a regex.
async function toolStops() {
  const call = '<tool_call>\\n\\{"name": "get_time", "arguments": \\{"zone": "utc"\\}\\}\\n</tool_call>';
  const base = { model: M, messages: [{ role: "user", content: "time?" }], tools: TOOLS, max_tokens: 300,
    temperature: 0 };
  // the forced call alone is a call
  const plain = await chatBoth({ ...base, guided_regex: call });
  for (const a of [plain.whole, plain.streamed]) assert.deepEqual(a, { content: "", calls: 1, fin: "tool_calls" });
  for (const [stop, re, want] of [
    ["utc", call, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "'],
    ["Hi <t", "Hi " + call, ""],
    ["END", "Hi END" + call, "Hi "],
    [["zone", "get"], call, '<tool_call>\n{"name": "'],
  ]) {
    const r = await chatBoth({ ...base, guided_regex: re, stop });
    for (const a of [r.whole, r.streamed])
      assert.deepEqual(a, { content: want, calls: 0, fin: "stop" }, `stop ${JSON.stringify(stop)}`);
  }
}

async function logprobsEchoLists() {
  // greedy: each chosen token is the most likely; the top ones sum to <= 1
  const g = await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "Hi" }],
    max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 5 });
  for (const t of g.choices[0].logprobs.content) {
    assert.equal(t.token, t.top_logprobs[0].token);
    assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6);
    const mass = t.top_logprobs.reduce((a, x) => a + Math.exp(x.logprob), 0);
    assert.ok(mass <= 1 + 1e-5 && mass > 0, String(mass));
  }
  // sampled tokens' log-probabilities are those of the same text as a
  // prompt (echo): the sampler and the prompt's pass agree
  const P = "Hello world";
  const a = await client.completions.create({ model: M, prompt: P, max_tokens: 8, temperature: 1, seed: 2,
    logprobs: 2, ignore_eos: true });
  const la = a.choices[0].logprobs;
  const e = await client.completions.create({ model: M, prompt: P + a.choices[0].text, max_tokens: 1,
    temperature: 0, echo: true, logprobs: 2 });
  const le = e.choices[0].logprobs;
  assert.ok(e.choices[0].text.startsWith(P + a.choices[0].text));
  assert.equal(le.token_logprobs[0], null);
  assert.equal(le.top_logprobs[0], null);
  const k = le.tokens.length - 1 - la.tokens.length; // where a's tokens start in e's prompt
  assert.deepEqual(le.tokens.slice(k, k + la.tokens.length), la.tokens);
  for (let i = 0; i < la.tokens.length; i++)
    assert.ok(Math.abs(le.token_logprobs[k + i] - la.token_logprobs[i]) < 1e-3,
      `${i}: ${le.token_logprobs[k + i]} vs ${la.token_logprobs[i]}`);
  assert.equal(le.text_offset[0], 0);
  assert.equal(le.text_offset[k], P.length);
  // echo streamed: the prompt first
  let s = "";
  for await (const c of await client.completions.create({ model: M, prompt: P, max_tokens: 4, temperature: 0,
    echo: true, stream: true })) s += c.choices[0]?.text ?? "";
  const w = await client.completions.create({ model: M, prompt: P, max_tokens: 4, temperature: 0, echo: true });
  assert.equal(s, w.choices[0].text);
  assert.ok(s.startsWith(P) && s.length > P.length);

  // lists of prompts (strings and ids): index = prompt x n + j
  const one = async (prompt) => (await client.completions.create({ model: M, prompt, max_tokens: 6,
    temperature: 0 })).choices[0].text;
  const lst = await client.completions.create({ model: M, prompt: ["Hello", "world wide"], n: 2,
    max_tokens: 6, temperature: 0 });
  assert.deepEqual(lst.choices.map((c) => c.index), [0, 1, 2, 3]);
  const [h, ww] = [await one("Hello"), await one("world wide")];
  assert.deepEqual(lst.choices.map((c) => c.text), [h, h, ww, ww]);
  const ids = [[idOf("H"), idOf("i")], [idOf("Hello")]];
  const li = await client.completions.create({ model: M, prompt: ids, max_tokens: 6, temperature: 0 });
  assert.deepEqual(li.choices.map((c) => c.text), [await one(ids[0]), await one(ids[1])]);
  assert.equal(li.usage.prompt_tokens, 3);
  await expect400("/v1/completions", { model: M, prompt: ["a", "b"], n: 100 }, "prompt");
  await expect400("/v1/completions", { model: M, prompt: [] }, "prompt");

  // logit_bias: +100 forces a token under greedy, -100 bans one
  const q = idOf("Q");
  const forced = await client.completions.create({ model: M, prompt: P, max_tokens: 5, temperature: 0,
    logit_bias: { [q]: 100 } });
  assert.equal(forced.choices[0].text, "QQQQQ");
  const g0 = await client.completions.create({ model: M, prompt: P, max_tokens: 1, temperature: 0, logprobs: 1 });
  const t0 = g0.choices[0].logprobs.tokens[0];
  const banned = await client.completions.create({ model: M, prompt: P, max_tokens: 1, temperature: 0,
    logprobs: 1, logit_bias: { [idOf(t0)]: -100 } });
  assert.notEqual(banned.choices[0].logprobs.tokens[0], t0);
  await expect400("/v1/completions", { model: M, prompt: P, logit_bias: { 99999: 1 } }, "logit_bias");
  await expect400("/v1/completions", { model: M, prompt: P, logit_bias: { 1: 101 } }, "logit_bias");

  // best_of: the one of best_of with the highest mean log-probability
  const all = await client.completions.create({ model: M, prompt: P, n: 4, max_tokens: 6, temperature: 1.5,
    seed: 21, logprobs: 0, ignore_eos: true });
  const mean = (c) => c.logprobs.token_logprobs.reduce((x, y) => x + y, 0) / c.logprobs.token_logprobs.length;
  const best = [...all.choices].sort((x, y) => mean(y) - mean(x));
  const bo = await client.completions.create({ model: M, prompt: P, n: 2, best_of: 4, max_tokens: 6,
    temperature: 1.5, seed: 21, ignore_eos: true });
  assert.deepEqual(bo.choices.map((c) => c.text), [best[0].text, best[1].text]);
  assert.deepEqual(bo.choices.map((c) => c.index), [0, 1]);
  assert.equal(bo.usage.completion_tokens, 24);
  await expect400("/v1/completions", { model: M, prompt: P, n: 2, best_of: 1 }, "best_of");
  await expect400("/v1/completions", { model: M, prompt: P, best_of: 2, stream: true }, "best_of");

  // suffix: this tokenizer has no fill-in-the-middle tokens
  await expect400("/v1/completions", { model: M, prompt: P, suffix: "end" }, "suffix",
    /no fill-in-the-middle tokens/);
}

async function fields() {
  await expect400("/v1/completions", { model: M, prompt: "x", frobnicate: 1 }, "frobnicate",
    /unsupported field frobnicate/);
  await expect400("/v1/chat/completions", { model: M, messages: [{ role: "user", content: "x" }],
    functions: [] }, "functions", /unsupported field functions/);
  await expect400("/v1/chat/completions", { model: M, messages: [{ role: "user", content: "x" }],
    echo: true }, "echo", /unsupported field/);
  await expect400("/v1/completions", { model: M, prompt: "x", store: true }, "store");
  await expect400("/v1/chat/completions", { model: M, messages: [{ role: "user", content: "x" }],
    parallel_tool_calls: false }, "parallel_tool_calls");
  // tools are checked (at most 1024) before the template renders them: a
  // bad message after them is not reached
  const many = Array.from({ length: 1025 }, (_, i) => ({ type: "function", function: { name: `f${i}` } }));
  await expect400("/v1/chat/completions", { model: M, messages: "x", tools: many }, "tools",
    /at most 1024 tools in a request \(1025 given\)/);
  await expect400("/v1/chat/completions", { model: M, messages: "x", tools: [...TOOLS, TOOLS[0]] }, "tools",
    /tools\[0\] and tools\[2\] are both named "get_weather"/);
  // vLLM's priority: an integer (lower runs first); a float or string is
  // refused by name; a prioritized request answers as any other
  await expect400("/v1/completions", { model: M, prompt: "x", priority: 1.5 }, "priority");
  await expect400("/v1/completions", { model: M, prompt: "x", priority: "high" }, "priority");
  const pr = await Promise.all([5, -3, 0].map((priority) => raw("/v1/completions",
    { model: M, prompt: "the same words", max_tokens: 6, temperature: 0, ignore_eos: true, priority })));
  for (const r of pr) {
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices[0].text, pr[0].json.choices[0].text);
  }
  // harmless ones are accepted
  const ok = await raw("/v1/chat/completions", { model: M, messages: [{ role: "user", content: "x" }],
    max_tokens: 2, user: "u", metadata: { a: "b" }, store: false, service_tier: "auto",
    parallel_tool_calls: true });
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
}

async function main() {
  await waitUp();
  await fields();
  await logprobsEchoLists();
  await structured();
  await tools();
  await toolStops();
  const file = join(dir, "cases.json");
  writeFileSync(file, JSON.stringify(cases));
  const chk = spawnSync("/usr/bin/python3", [checkPy, file], { encoding: "utf8" });
  process.stdout.write(chk.stdout + chk.stderr);
  assert.equal(chk.status, 0, "structured_check failed");
  server.kill("SIGTERM");
  const ex = await exited;
  assert.equal(ex.code, 0, log);
  rmSync(dir, { recursive: true, force: true });
  console.log(`openai_features: all checks passed (${cases.length} structured answers validated)`);
}

main().catch((e) => {
  console.error(e);
  console.error(log.slice(-4000));
  server.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
  process.exit(1);
});
