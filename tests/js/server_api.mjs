// server_api.mjs TESSERA MODEL_DIR PROMPT_IDS_FILE — the server's API
// beyond completions (issue 19), with Node's own fetch (no packages):
// the API key (flag and TESSERA_API_KEY; 401 with OpenAI's error object;
// /health, /metrics and /version open), CORS (preflight, allowed origin or
// not), /tokenize and /detokenize (the reference tokenization of "Hello
// world", round trips, counts equal to the completions' usage, 400s naming
// the field), /version, /v1/embeddings (alone = in a batch beside a running
// generation, unit norm, base64 = the floats, dimensions, mean pooling),
// /metrics (every sample with HELP and TYPE, vLLM's names and labels), the
// log line per request (and none with --no-log-requests), --max-model-len;
// a list of prompts counted whole in the metrics; a client of a whole
// response that hangs up frees its engine slots (completions, embeddings);
// an empty --api-key refused.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import net from "node:net";
import { once } from "node:events";
import assert from "node:assert/strict";

const [exe, modelDir, promptIdsFile] = process.argv.slice(2);
const promptIds = JSON.parse(readFileSync(promptIdsFile, "utf8"));
let nextPort = 19000 + (process.pid % 500) * 2;
const running = [];

// a server with args (and env); resolves once /health answers
async function start(args, env = {}) {
  const port = nextPort++;
  const p = spawn(exe, ["serve", "-m", modelDir, "--port", String(port), "--kv-blocks", "64",
    "--max-seqs", "8", "--served-model-name", "tiny", ...args],
  { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
  const s = { p, base: `http://127.0.0.1:${port}`, log: "" };
  p.stderr.on("data", (d) => { s.log += d; });
  s.exited = new Promise((res) => p.on("exit", (code) => res(code)));
  running.push(s);
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${s.base}/health`)).ok) return s;
    } catch { /* not yet */ }
    if (p.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("server did not come up: " + s.log);
}

async function stop(s) {
  s.p.kill("SIGTERM");
  assert.equal(await s.exited, 0, s.log);
}

function call(s, path, body, headers = {}, method = body === undefined ? "GET" : "POST") {
  return fetch(s.base + path, { method, headers: { "Content-Type": "application/json", ...headers },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body) });
}

async function json(r, status = 200) {
  const j = await r.json();
  assert.equal(r.status, status, JSON.stringify(j));
  return j;
}

function errorShape(j, param) {
  assert.ok(j.error && typeof j.error.message === "string" && typeof j.error.type === "string",
    JSON.stringify(j));
  assert.ok("param" in j.error && "code" in j.error);
  if (param !== undefined) assert.equal(j.error.param, param, JSON.stringify(j));
}

const KEY = { Authorization: "Bearer sek-123" };

async function apiKey(s) {
  // no key, a wrong one, the scheme alone: 401 with OpenAI's error object
  for (const h of [{}, { Authorization: "Bearer wrong" }, { Authorization: "Bearer" }]) {
    for (const [path, body] of [["/v1/models"], ["/v1/completions", { prompt: "x" }],
      ["/tokenize", { prompt: "x" }], ["/detokenize", { tokens: [1] }],
      ["/v1/embeddings", { input: "x" }]]) {
      const j = await json(await call(s, path, body, h), 401);
      errorShape(j);
      assert.equal(j.error.code, "invalid_api_key");
    }
  }
  assert.equal((await json(await call(s, "/v1/models", undefined, KEY))).data[0].id, "tiny");
  // open without a key
  for (const path of ["/health", "/metrics", "/version"])
    assert.equal((await call(s, path)).status, 200, path);
  // the chat page: open too (it asks for the key), HTML in UTF-8
  const page = await call(s, "/");
  assert.equal(page.status, 200);
  assert.equal(page.headers.get("content-type"), "text/html; charset=utf-8");
  assert.match(await page.text(), /<html[\s>]/i);
  assert.equal((await call(s, "/", "{}")).status, 405);
}

async function cors(s) {
  const ok = "http://ok.example";
  // a preflight needs no key; it names what was asked for
  const pre = await call(s, "/v1/chat/completions", undefined, { Origin: ok,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type,x-stainless-lang" }, "OPTIONS");
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), ok);
  assert.match(pre.headers.get("access-control-allow-methods"), /POST/);
  assert.match(pre.headers.get("access-control-allow-methods"), /OPTIONS/);
  const allowH = pre.headers.get("access-control-allow-headers").toLowerCase();
  for (const h of ["authorization", "content-type", "x-stainless-lang"]) assert.ok(allowH.includes(h), allowH);
  assert.ok(Number(pre.headers.get("access-control-max-age")) > 0);
  // an origin not listed: no CORS headers, on the preflight and the answer
  const other = await call(s, "/v1/models", undefined, { Origin: "http://evil.example" }, "OPTIONS");
  assert.equal(other.status, 204);
  assert.equal(other.headers.get("access-control-allow-origin"), null);
  assert.equal(other.headers.get("access-control-allow-methods"), null);
  const r1 = await call(s, "/v1/models", undefined, { ...KEY, Origin: ok });
  assert.equal(r1.headers.get("access-control-allow-origin"), ok);
  assert.match(r1.headers.get("vary"), /Origin/);
  const r2 = await call(s, "/v1/models", undefined, { ...KEY, Origin: "http://evil.example" });
  assert.equal(r2.headers.get("access-control-allow-origin"), null);
  // errors carry them too (a browser must be able to read a 401)
  const r3 = await call(s, "/v1/models", undefined, { Origin: ok });
  assert.equal(r3.status, 401);
  assert.equal(r3.headers.get("access-control-allow-origin"), ok);
}

async function tokenize(s, h = {}) {
  // the reference tokenization (the Python BPE of tests/reference/hf_tiny_lm.py)
  const t = await json(await call(s, "/tokenize", { model: "tiny", prompt: "Hello world",
    return_token_strs: true }, h));
  assert.deepEqual(t.tokens, promptIds);
  assert.equal(t.count, promptIds.length);
  assert.equal(t.max_model_len, 256);
  assert.equal(t.token_strs.join(""), "Hello world");
  // round trips; counts equal what a completion is charged
  for (const text of ["Hello world", "The quick brown fox, 42 times.", "a{b}[c] ~!@#$%^&*() end",
    "  spaces and\nlines  "]) {
    const tk = await json(await call(s, "/tokenize", { prompt: text }, h));
    assert.ok(tk.count > 0 && tk.tokens.every(Number.isInteger));
    const dt = await json(await call(s, "/detokenize", { tokens: tk.tokens }, h));
    assert.equal(dt.prompt, text);
    const c = await json(await call(s, "/v1/completions", { prompt: text, max_tokens: 1 }, h));
    assert.equal(c.usage.prompt_tokens, tk.count, text);
  }
  // messages: as a chat request would be charged; without the generation
  // prompt, a prefix of it
  const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello" }];
  const m1 = await json(await call(s, "/tokenize", { messages }, h));
  const m0 = await json(await call(s, "/tokenize", { messages, add_generation_prompt: false }, h));
  const chat = await json(await call(s, "/v1/chat/completions", { messages, max_tokens: 1 }, h));
  assert.equal(m1.count, chat.usage.prompt_tokens);
  assert.ok(m0.count < m1.count);
  assert.deepEqual(m1.tokens.slice(0, m0.count), m0.tokens);
  const rendered = (await json(await call(s, "/detokenize", { tokens: m1.tokens }, h))).prompt;
  assert.ok(rendered.includes("Be brief.") && rendered.includes("Hello"), rendered);
  // bad input: 400 naming the field
  for (const [path, body, param] of [
    ["/tokenize", { prompt: 5 }, "prompt"],
    ["/tokenize", {}, "prompt"],
    ["/tokenize", { prompt: "x", add_special_tokens: "yes" }, "add_special_tokens"],
    ["/tokenize", { messages: "hi" }, "messages"],
    ["/tokenize", { prompt: "x", messages: [] }, "prompt"],
    ["/detokenize", { tokens: "abc" }, "tokens"],
    ["/detokenize", { tokens: [1, -1] }, "tokens"],
    ["/detokenize", { tokens: [1, 1e9] }, "tokens"],
    ["/detokenize", { tokens: [1.5] }, "tokens"],
  ])
    errorShape(await json(await call(s, path, body, h), 400), param);
  errorShape(await json(await call(s, "/tokenize", "{not json", h), 400));
  errorShape(await json(await call(s, "/tokenize", { model: "gpt-4", prompt: "x" }, h), 404), "model");
  assert.equal((await call(s, "/tokenize", undefined, h)).status, 405);
}

const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));

function close(a, b, tol, what) {
  assert.equal(a.length, b.length, what);
  for (let i = 0; i < a.length; i++)
    assert.ok(Math.abs(a[i] - b[i]) <= tol, `${what}: [${i}] ${a[i]} vs ${b[i]}`);
}

async function embeddings(s, h = {}) {
  const texts = ["Hello world", "The quick brown fox", "Some other words", "x"];
  const alone = [];
  for (const t of texts) {
    const e = await json(await call(s, "/v1/embeddings", { model: "tiny", input: t }, h));
    assert.equal(e.object, "list");
    assert.equal(e.model, "tiny");
    assert.equal(e.data.length, 1);
    assert.equal(e.data[0].object, "embedding");
    assert.equal(e.data[0].index, 0);
    const tk = await json(await call(s, "/tokenize", { prompt: t }, h));
    assert.equal(e.usage.prompt_tokens, tk.count);
    assert.equal(e.usage.total_tokens, tk.count);
    alone.push(e.data[0].embedding);
  }
  const dim = alone[0].length;
  assert.equal(dim, JSON.parse(readFileSync(`${modelDir}/config.json`, "utf8")).hidden_size);
  for (const v of alone) assert.ok(Math.abs(norm(v) - 1) < 1e-5, String(norm(v)));
  assert.ok(alone[0].some((x, i) => Math.abs(x - alone[1][i]) > 1e-3), "different texts differ");
  // the same texts in one batch, beside a generation streaming meanwhile
  const gen = call(s, "/v1/completions", { prompt: "Hello", max_tokens: 64, temperature: 0,
    ignore_eos: true, stream: true }, h).then((r) => r.text());
  const batch = await json(await call(s, "/v1/embeddings", { input: texts }, h));
  assert.deepEqual(batch.data.map((d) => d.index), [0, 1, 2, 3]);
  batch.data.forEach((d, i) => close(d.embedding, alone[i], 1e-5, `batched input ${i}`));
  assert.match(await gen, /\[DONE\]/);
  // token ids, one list or several, are the same inputs
  const ids = (await json(await call(s, "/tokenize", { prompt: texts[0] }, h))).tokens;
  const byIds = await json(await call(s, "/v1/embeddings", { input: ids }, h));
  close(byIds.data[0].embedding, alone[0], 1e-5, "token ids");
  const byIdLists = await json(await call(s, "/v1/embeddings", { input: [ids, ids] }, h));
  assert.equal(byIdLists.data.length, 2);
  close(byIdLists.data[1].embedding, alone[0], 1e-5, "lists of token ids");
  // base64: little-endian float32 of the same vector
  const b = await json(await call(s, "/v1/embeddings", { input: texts[0], encoding_format: "base64" }, h));
  const buf = Buffer.from(b.data[0].embedding, "base64");
  assert.equal(buf.length, 4 * dim);
  const f = Array.from({ length: dim }, (_, i) => buf.readFloatLE(4 * i));
  close(f, alone[0].map((x) => Math.fround(x)), 0, "base64");
  // dimensions: cut and made unit length again
  const d = await json(await call(s, "/v1/embeddings", { input: texts[0], dimensions: 8 }, h));
  const cut = alone[0].slice(0, 8), n8 = norm(cut);
  close(d.data[0].embedding, cut.map((x) => x / n8), 1e-6, "dimensions");
  // bad input: 400 naming the field
  for (const [body, param] of [
    [{}, "input"], [{ input: "" }, "input"], [{ input: [] }, "input"], [{ input: [1, "a"] }, "input"],
    [{ input: 5 }, "input"], [{ input: [[1], "a", 3] }, "input"],
    [{ input: "x", encoding_format: "int8" }, "encoding_format"],
    [{ input: "x", dimensions: 0 }, "dimensions"], [{ input: "x", dimensions: dim + 1 }, "dimensions"],
    [{ input: "x ".repeat(400) }, "input"], [{ input: [100000] }, "input"],
  ])
    errorShape(await json(await call(s, "/v1/embeddings", body, h), 400), param);
  errorShape(await json(await call(s, "/v1/embeddings", { model: "m", input: "x" }, h), 404), "model");
  return alone;
}

// every sample's family has HELP and TYPE; returns {name: [{labels, value}]}
function parseMetrics(text) {
  const help = new Set(), type = new Map(), samples = new Map();
  for (const line of text.split("\n")) {
    if (!line) continue;
    let m;
    if ((m = /^# HELP (\S+) .+$/.exec(line))) { help.add(m[1]); continue; }
    if ((m = /^# TYPE (\S+) (counter|gauge|histogram)$/.exec(line))) { type.set(m[1], m[2]); continue; }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `not a sample: ${line}`);
    const labels = {};
    for (const l of (m[2] ?? "").split(",").filter(Boolean)) {
      const kv = /^([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"$/.exec(l);
      assert.ok(kv, `bad label in ${line}`);
      labels[kv[1]] = kv[2];
    }
    const value = Number(m[3]);
    assert.ok(!Number.isNaN(value), line);
    let fam = m[1];
    if (!type.has(fam)) fam = fam.replace(/_(bucket|sum|count)$/, "");
    assert.ok(type.has(fam), `no TYPE for ${m[1]}`);
    assert.ok(help.has(fam), `no HELP for ${m[1]}`);
    if (type.get(fam) === "histogram") assert.notEqual(fam, m[1], `histogram sample ${m[1]}`);
    if (!samples.has(m[1])) samples.set(m[1], []);
    samples.get(m[1]).push({ labels, value });
  }
  return { samples, type };
}

async function metrics(s) {
  const { samples, type } = parseMetrics(await (await call(s, "/metrics")).text());
  // the router's and the older tests' names stay
  for (const n of ["tessera_requests_running", "tessera_requests_waiting", "tessera_kv_blocks_used",
    "tessera_kv_blocks_total", "tessera_kv_blocks_cached", "tessera_prompt_tokens_total",
    "tessera_generation_tokens_total", "tessera_prefix_cache_hit_rate",
    "tessera_time_to_first_token_seconds_count", "tessera_kv_transfers_sent_total"])
    assert.ok(samples.has(n), n);
  const want = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter", "vllm:num_preemptions_total": "counter",
    "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
  };
  for (const [n, t] of Object.entries(want)) {
    assert.equal(type.get(n), t, n);
    const ss = samples.get(t === "histogram" ? `${n}_count` : n);
    assert.ok(ss && ss.every((x) => x.labels.model_name === "tiny"), n);
  }
  const one = (n) => samples.get(n)[0].value;
  const reasons = samples.get("vllm:request_success_total");
  assert.deepEqual(reasons.map((x) => x.labels.finished_reason).sort(), ["abort", "length", "stop"]);
  assert.ok(reasons.find((x) => x.labels.finished_reason === "length").value >= 1);
  // histograms: cumulative buckets ending in +Inf = _count
  for (const n of Object.keys(want).filter((k) => want[k] === "histogram")) {
    const b = samples.get(`${n}_bucket`);
    for (let i = 1; i < b.length; i++) assert.ok(b[i].value >= b[i - 1].value, n);
    assert.equal(b.at(-1).labels.le, "+Inf");
    assert.equal(b.at(-1).value, one(`${n}_count`), n);
  }
  assert.ok(one("vllm:e2e_request_latency_seconds_count") >= 1);
  assert.ok(one("vllm:time_to_first_token_seconds_count") >= 1);
  assert.equal(one("vllm:prompt_tokens_total"), one("tessera_prompt_tokens_total"));
  assert.equal(one("vllm:generation_tokens_total"), one("tessera_generation_tokens_total"));
  assert.ok(one("vllm:generation_tokens_total") > 0);
  const u = one("vllm:kv_cache_usage_perc");
  assert.ok(u >= 0 && u <= 1);
}

const sample = async (s, name) => {
  const { samples } = parseMetrics(await (await call(s, "/metrics")).text());
  return samples.get(name)[0].value;
};

// a list of prompts: every prompt's tokens in the request's prompt-token
// histogram and its log line (once only the first prompt's were)
async function promptList(s, h = {}) {
  const before = await sample(s, "vllm:request_prompt_tokens_sum");
  const r = await json(await call(s, "/v1/completions", { prompt: ["Hello world", "The quick brown fox"],
    n: 2, max_tokens: 2, temperature: 0 }, h));
  const counts = await Promise.all(["Hello world", "The quick brown fox"].map(async (p) =>
    (await json(await call(s, "/tokenize", { prompt: p }, h))).count));
  assert.equal(r.usage.prompt_tokens, counts[0] + counts[1]);
  assert.equal(await sample(s, "vllm:request_prompt_tokens_sum") - before, r.usage.prompt_tokens);
  return r;
}

// the engine's running + waiting requests
const inEngine = async (s) => await sample(s, "tessera_requests_running") +
  await sample(s, "tessera_requests_waiting");

// a POST on a raw socket, its answer never read; the socket
async function postRaw(s, path, body) {
  const sock = net.connect(Number(new URL(s.base).port), "127.0.0.1");
  await once(sock, "connect");
  const data = JSON.stringify(body);
  sock.on("error", () => {});
  sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(data)}\r\n\r\n${data}`);
  return sock;
}

// A client of a whole (non-streamed) response that hangs up: its engine
// requests are aborted within moments, not computed to the end (their
// slots and KV blocks free; with one slot the next request is served at
// once).
async function hangUp(s, path, body, fullTokens) {
  const gen0 = await sample(s, "vllm:generation_tokens_total");
  const sock = await postRaw(s, path, body);
  for (let i = 0; i < 500 && (await inEngine(s)) === 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(await inEngine(s) > 0, `${path}: never reached the engine`);
  sock.destroy();
  const t0 = Date.now();
  while ((await inEngine(s)) > 0 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await inEngine(s), 0, `${path}: still computing 5 s after its client left`);
  if (fullTokens) {
    const made = await sample(s, "vllm:generation_tokens_total") - gen0;
    assert.ok(made < fullTokens / 2, `${path}: ${made} of ${fullTokens} tokens made for a client gone`);
  }
  const t1 = Date.now();
  const next = await json(await call(s, "/v1/completions", { prompt: "Hello", max_tokens: 2 }));
  assert.equal(next.usage.completion_tokens, 2);
  assert.ok(Date.now() - t1 < 2000, `the next request waited ${Date.now() - t1} ms`);
}

async function main() {
  // 1. the key from the flag, CORS, the log
  const a = await start(["--api-key", "sek-123", "--allowed-origins", "http://ok.example, http://b.example:8080"]);
  await apiKey(a);
  await cors(a);
  const v = await json(await call(a, "/version"));
  assert.match(v.version, /^\d+\.\d+\.\d+/);
  await tokenize(a, KEY);
  const c = await json(await call(a, "/v1/completions", { prompt: "Hello world", max_tokens: 5,
    temperature: 0 }, KEY));
  await embeddings(a, KEY);
  await metrics(a);
  const pl = await promptList(a, KEY);
  await stop(a);
  assert.match(a.log, new RegExp(`^tessera serve: req ${pl.id} POST /v1/completions 200 ` +
    `prompt=${pl.usage.prompt_tokens} completion=8 `, "m"));
  // one line per request: id, method, path, status, tokens, times, finish
  const line = a.log.split("\n").find((l) => l.includes(c.id));
  assert.match(line, new RegExp(`^tessera serve: req ${c.id} POST /v1/completions 200 prompt=2 ` +
    "completion=5 cached=\\d+ ttft=\\d+\\.\\d+s total=\\d+\\.\\d+s finish=length$"), line);
  assert.match(a.log, /^tessera serve: req \S+ GET \/v1\/models 401$/m);
  assert.match(a.log, /^tessera serve: req embd-\S+ POST \/v1\/embeddings 200 prompt=\d+ completion=0 cached=0 total=/m);
  assert.match(a.log, /^tessera serve: req \S+ POST \/tokenize 400$/m);

  // 2. the key from TESSERA_API_KEY, mean pooling, no request log
  const b = await start(["--pooling", "mean", "--no-log-requests", "--max-model-len", "32"],
    { TESSERA_API_KEY: "env-key" });
  assert.equal((await call(b, "/v1/models")).status, 401);
  const envKey = { Authorization: "Bearer env-key" };
  assert.equal((await json(await call(b, "/v1/models", undefined, envKey))).data[0].max_model_len, 32);
  assert.equal((await json(await call(b, "/tokenize", { prompt: "x" }, envKey))).max_model_len, 32);
  const long = await json(await call(b, "/v1/completions", { prompt: "x ".repeat(40) }, envKey), 400);
  assert.equal(long.error.code, "context_length_exceeded");
  const mean = await json(await call(b, "/v1/embeddings", { input: ["Hello world", "x"] }, envKey));
  assert.ok(Math.abs(norm(mean.data[0].embedding) - 1) < 1e-5);
  // one token: its mean is its last; more: they differ from the last token's
  const lastA = await start([]);
  const last = await json(await call(lastA, "/v1/embeddings", { input: ["Hello world", "x"] }));
  close(mean.data[1].embedding, last.data[1].embedding, 1e-5, "one token: mean = last");
  assert.ok(mean.data[0].embedding.some((x, i) => Math.abs(x - last.data[0].embedding[i]) > 1e-3));
  await stop(lastA);
  await stop(b);
  assert.ok(!/tessera serve: req /.test(b.log), b.log);

  // 3. clients that hang up on a whole response, one engine slot: 128
  // choices of 250 tokens; 2048 inputs of 240 tokens (distinct: no cache)
  const one = await start(["--max-seqs", "1", "--kv-blocks", "256"]);
  await hangUp(one, "/v1/completions", { prompt: "Hello", n: 128, max_tokens: 250, ignore_eos: true },
    128 * 250);
  await hangUp(one, "/v1/embeddings",
    { input: Array.from({ length: 2048 }, (_, i) => `${i} ` + "x ".repeat(119)) });
  await stop(one);
  assert.match(one.log, /^tessera serve: req cmpl-\S+ POST \/v1\/completions 499$/m);
  assert.match(one.log, /^tessera serve: req embd-\S+ POST \/v1\/embeddings 499$/m);

  // 4. an empty --api-key is refused (it would turn TESSERA_API_KEY off)
  const empty = spawn(exe, ["serve", "-m", modelDir, "--port", String(nextPort++), "--api-key", ""],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, TESSERA_API_KEY: "env-key" } });
  let emptyLog = "";
  empty.stderr.on("data", (d) => { emptyLog += d; });
  assert.equal(await new Promise((res) => empty.on("exit", res)), 2);
  assert.match(emptyLog, /--api-key "": want KEY \(not empty\)/);

  // 5. a max model length beyond the model's: a startup error naming both
  const bad = spawn(exe, ["serve", "-m", modelDir, "--port", String(nextPort++), "--max-model-len", "1000"],
    { stdio: ["ignore", "ignore", "pipe"] });
  let badLog = "";
  bad.stderr.on("data", (d) => { badLog += d; });
  const code = await new Promise((res) => bad.on("exit", res));
  assert.equal(code, 1);
  assert.match(badLog, /max-model-len 1000.*256/);
  console.log("server_api: all checks passed");
}

main().catch((e) => {
  console.error(e);
  for (const s of running) {
    console.error(s.log);
    s.p.kill("SIGKILL");
  }
  process.exit(1);
});
