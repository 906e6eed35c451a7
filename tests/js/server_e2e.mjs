// server_e2e.mjs TESSERA MODEL_DIR EXPECTED_TEXT_FILE — `tessera serve`
// end to end with a client we did not write: the `openai` npm package.
// Completions and chat, whole and streamed (with usage), stop strings, n,
// seeds, cached_tokens of a repeated prefix, batching invariance over
// HTTP, OpenAI error objects for bad requests, then 200 requests from 32
// concurrent clients (some aborting mid-stream, some malformed): the
// server stays up, every well-formed request completes, and no KV block
// is held by a request afterwards; SIGTERM stops it cleanly.
import OpenAI from "openai";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import assert from "node:assert/strict";

const [exe, modelDir, expectedFile, ...serverArgs] = process.argv.slice(2);
// extra server arguments (--device vulkan:0): the same checks on that
// device; exit 77 (skipped) when the machine has no Vulkan device
if (serverArgs.some((a) => a.startsWith("vulkan"))) {
  const { spawnSync } = await import("node:child_process");
  const d = spawnSync(exe, ["devices"], { encoding: "utf8" });
  if (!/^vulkan:0/m.test(d.stdout)) {
    console.log("server_e2e: skipped: no Vulkan device\n" + d.stdout);
    process.exit(77);
  }
}
const expected = readFileSync(expectedFile, "utf8");
const port = 18000 + (process.pid % 1000);
const base = `http://127.0.0.1:${port}`;

const server = spawn(exe, ["serve", "-m", modelDir, "--port", String(port),
  "--kv-blocks", "64", "--max-seqs", "8", "--served-model-name", "tiny",
  ...serverArgs],
  { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
server.stderr.on("data", (d) => { log += d; });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.ok) return;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("server did not come up: " + log);
}

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none", maxRetries: 0 });

async function raw(path, body, headers = { "Content-Type": "application/json" }) {
  const r = await fetch(base + path, { method: "POST", headers, body });
  return { status: r.status, json: await r.json() };
}

function errorShape(j) {
  assert.ok(j.error && typeof j.error.message === "string" && typeof j.error.type === "string");
  assert.ok("param" in j.error && "code" in j.error);
}

async function main() {
  await waitUp();
  const models = await client.models.list();
  assert.equal(models.data[0].id, "tiny");

  // greedy completion: the PyTorch reference's continuation
  const c = await client.completions.create({ model: "tiny", prompt: "Hello world",
    max_tokens: 12, temperature: 0 });
  assert.ok(expected.startsWith(c.choices[0].text), JSON.stringify(c.choices[0].text));
  assert.equal(c.choices[0].finish_reason, "length");
  assert.equal(c.usage.completion_tokens, 12);
  assert.equal(c.usage.prompt_tokens, 2);

  // streamed completion gives the same text
  let streamed = "";
  for await (const ch of await client.completions.create({ model: "tiny", prompt: "Hello world",
    max_tokens: 12, temperature: 0, stream: true })) streamed += ch.choices[0]?.text ?? "";
  assert.equal(streamed, c.choices[0].text);

  // chat, whole and streamed with usage
  const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello world" }];
  const whole = await client.chat.completions.create({ model: "tiny", messages: msgs,
    max_tokens: 10, temperature: 0 });
  let text = "", usage = null, roles = 0, finish = null;
  for await (const ch of await client.chat.completions.create({ model: "tiny", messages: msgs,
    max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
    if (ch.usage) usage = ch.usage;
    const d = ch.choices[0]?.delta;
    if (d?.role) roles++;
    text += d?.content ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(whole.choices[0].message.role, "assistant");
  assert.equal(roles, 1);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 10);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);

  // stop strings end the text before them
  const stop = c.choices[0].text.slice(3, 6);
  const s = await client.completions.create({ model: "tiny", prompt: "Hello world",
    max_tokens: 12, temperature: 0, stop: [stop] });
  assert.equal(s.choices[0].text, c.choices[0].text.slice(0, c.choices[0].text.indexOf(stop)));
  assert.equal(s.choices[0].finish_reason, "stop");

  // logprobs: the chosen token's and the most likely ones, as OpenAI
  const lpc = await client.completions.create({ model: "tiny", prompt: "Hello world",
    max_tokens: 8, temperature: 0, logprobs: 3 });
  const L = lpc.choices[0].logprobs;
  assert.equal(L.tokens.length, 8);
  assert.equal(L.tokens.join(""), lpc.choices[0].text);
  for (let i = 0; i < 8; i++) {
    const top = Object.values(L.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 3 && L.token_logprobs[i] <= 0);
    // greedy: the chosen token is the most likely one
    assert.ok(Math.abs(Math.max(...top) - L.token_logprobs[i]) < 1e-5);
    assert.ok(top.reduce((a, x) => a + Math.exp(x), 0) <= 1 + 1e-5);
  }
  const lpchat = await client.chat.completions.create({ model: "tiny", messages: msgs,
    max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = lpchat.choices[0].logprobs.content;
  assert.equal(content.length, 6);
  assert.ok(content.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2 &&
    Array.isArray(e.bytes)));
  let streamedLp = 0;
  for await (const ch of await client.chat.completions.create({ model: "tiny", messages: msgs,
    max_tokens: 6, temperature: 0, logprobs: true, stream: true }))
    streamedLp += ch.choices[0]?.logprobs?.content?.length ?? 0;
  assert.equal(streamedLp, 6);

  // n choices, seeded: repeatable
  const n1 = await client.completions.create({ model: "tiny", prompt: "Hello", max_tokens: 8,
    temperature: 1, seed: 42, n: 3 });
  const n2 = await client.completions.create({ model: "tiny", prompt: "Hello", max_tokens: 8,
    temperature: 1, seed: 42, n: 3 });
  assert.equal(n1.choices.length, 3);
  assert.deepEqual(n1.choices.map((x) => x.text), n2.choices.map((x) => x.text));

  // a repeated long prefix is reused: cached_tokens, same output
  const long = "The quick brown fox jumps over the lazy dog. ".repeat(3);
  const a1 = await client.completions.create({ model: "tiny", prompt: long, max_tokens: 6, temperature: 0 });
  const a2 = await client.completions.create({ model: "tiny", prompt: long, max_tokens: 6, temperature: 0 });
  assert.equal(a1.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(a2.usage));
  assert.equal(a1.choices[0].text, a2.choices[0].text);
  // the cache's blocks: as a snapshot and as the event stream
  const snap = await (await fetch(`${base}/v1/kv_cache`)).json();
  assert.equal(snap.block_size, 16);
  assert.ok(snap.blocks.length >= 1 && snap.last_event_seq >= snap.blocks.length);
  const ac0 = new AbortController();
  const evr = await fetch(`${base}/v1/kv_events?since=1`, { signal: ac0.signal });
  const reader = evr.body.getReader();
  const first = new TextDecoder().decode((await reader.read()).value).split("\n")[0];
  const ev = JSON.parse(first);
  assert.equal(ev.seq, 1);
  assert.equal(ev.type, "BlockStored");
  assert.equal(ev.token_ids.length, 16);
  ac0.abort();

  // batching invariance: 16 concurrent greedy requests = one at a time
  const prompts = Array.from({ length: 16 }, (_, i) => `Hello ${"world ".repeat(i % 5)}${i}`);
  const one = [];
  for (const p of prompts)
    one.push((await client.completions.create({ model: "tiny", prompt: p, max_tokens: 8, temperature: 0 })).choices[0].text);
  const many = await Promise.all(prompts.map((p) =>
    client.completions.create({ model: "tiny", prompt: p, max_tokens: 8, temperature: 0 })));
  assert.deepEqual(many.map((x) => x.choices[0].text), one);

  // bad requests: OpenAI's error object, the right status
  const bad = [
    [await raw("/v1/completions", "{not json"), 400],
    [await raw("/v1/completions", JSON.stringify({ prompt: "x", max_tokens: "ten" })), 400],
    [await raw("/v1/completions", JSON.stringify({ prompt: "x", max_tokens: 0 })), 400],
    [await raw("/v1/completions", JSON.stringify({ prompt: 5 })), 400],
    [await raw("/v1/completions", JSON.stringify({ prompt: "x", temperature: "hot" })), 400],
    [await raw("/v1/completions", JSON.stringify({ model: "gpt-4", prompt: "x" })), 404],
    [await raw("/v1/chat/completions", JSON.stringify({ messages: [] })), 400],
    [await raw("/v1/completions", JSON.stringify({ prompt: "x ".repeat(400), max_tokens: 4 })), 400],
    [await raw("/v1/completions", Buffer.from('{"prompt":"\xff\xfe"}', "latin1")), 400],
  ];
  for (const [r, status] of bad) {
    assert.equal(r.status, status, JSON.stringify(r.json));
    errorShape(r.json);
  }
  assert.equal(bad[7][0].json.error.code, "context_length_exceeded");
  await assert.rejects(client.completions.create({ model: "tiny", prompt: "x", max_tokens: -1 }),
    (e) => e.status === 400);

  // 200 requests from 32 clients: some abort mid-stream, some malformed
  let ok = 0, aborted = 0, rejected = 0;
  const work = Array.from({ length: 200 }, (_, i) => i);
  async function worker() {
    while (work.length) {
      const i = work.shift();
      if (i % 10 === 3) {
        const r = await raw("/v1/completions", "{\"prompt\": ");
        if (r.status === 400) rejected++;
      } else if (i % 10 === 7) {
        const ac = new AbortController();
        /* the client hangs up after the first piece (a fast engine may
         * send several tokens' text in one piece) */
        let gone = false;
        try {
          const st = await client.completions.create({ model: "tiny", prompt: `abort ${i}`,
            max_tokens: 40, temperature: 0, stream: true }, { signal: ac.signal });
          let got = 0;
          for await (const ch of st) {
            if (ch.choices[0]?.text && ++got === 1) {
              gone = true;
              ac.abort();
            }
          }
        } catch { /* the abort may surface as an error */ }
        if (gone) aborted++;
      } else {
        const r = await client.completions.create({ model: "tiny", prompt: `req ${i} ${"x".repeat(i % 30)}`,
          max_tokens: 6 + (i % 5), temperature: 0.7, seed: i });
        if (r.choices[0].finish_reason && r.usage.completion_tokens >= 1) ok++;
      }
    }
  }
  await Promise.all(Array.from({ length: 32 }, worker));
  assert.equal(ok, 160);
  assert.equal(rejected, 20);
  assert.equal(aborted, 20);
  // every block back: none held by a request
  let used = -1;
  for (let t = 0; t < 50 && used !== 0; t++) {
    const m = await (await fetch(`${base}/metrics`)).text();
    used = Number(/tessera_kv_blocks_used (\d+)/.exec(m)[1]);
    if (used) await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(used, 0);
  const m = await (await fetch(`${base}/metrics`)).text();
  assert.match(m, /tessera_time_to_first_token_seconds_count [1-9]/);
  assert.match(m, /tessera_requests_total\{status="400"\} [1-9]/);

  server.kill("SIGTERM");
  const ex = await exited;
  assert.equal(ex.code, 0, log);
  console.log(`server_e2e: all checks passed (${ok} completed, ${aborted} aborted, ${rejected} rejected)`);
}

main().catch((e) => {
  console.error(e);
  console.error(log);
  server.kill("SIGKILL");
  process.exit(1);
});
