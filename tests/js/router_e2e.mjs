// router_e2e.mjs TESSERA MODEL_DIR — `tessera route` end to end
// (docs/ROUTER.md) in front of real `tessera serve` processes, with the
// `openai` npm client and plain fetch() (for the x-tessera-* headers):
//  1. cache-aware routing over 3 servers (one --no-kv-events: approximate
//     mode): repeats of a prompt stay where its prefix is cached;
//  2. outputs through the router equal a server's own (greedy);
//  6. bad input through the router: OpenAI error objects, 404;
//  3. failover: a killed server's prefix is served elsewhere, the server
//     comes back when restarted; with every server gone, a quick 503;
//  4. prefill/decode disaggregation: the decode server adopts the prefill
//     server's KV blocks, the text equals a plain server's;
//  5. a corrupted KV transfer is refused and recomputed: same text;
//  7. a JSON config file; bad options and configs are named errors;
// then SIGTERM stops every router (exit 0 within 5 s) and server.
import OpenAI from "openai";
import { spawn } from "node:child_process";
import assert from "node:assert/strict";

const [exe, modelDir] = process.argv.slice(2);
if (!exe || !modelDir) {
  console.error("usage: node router_e2e.mjs TESSERA_EXE MODEL_DIR");
  process.exit(2);
}
let nextPort = 19000 + (process.pid % 500);
const port = () => nextPort++;
const url = (p) => `http://127.0.0.1:${p}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- processes: every child is killed when this script exits ----

const procs = [];

function start(name, args, env = {}) {
  const child = spawn(exe, args, { stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env } });
  const p = { name, args, child, log: "", exit: null };
  child.stdout.on("data", (d) => { p.log += d; });
  child.stderr.on("data", (d) => { p.log += d; });
  p.exited = new Promise((res) => child.on("exit", (code, sig) => {
    p.exit = { code, sig };
    res(p.exit);
  }));
  procs.push(p);
  return p;
}

function serve(name, prt, extra = [], env = {}) {
  const p = start(name, ["serve", "-m", modelDir, "--port", String(prt), "--kv-blocks", "64",
    "--max-seqs", "8", "--served-model-name", "tiny", ...extra], env);
  p.url = url(prt);
  p.port = prt;
  p.extra = extra;
  p.env = env;
  return p;
}

function route(name, prt, args) {
  const p = start(name, ["route", "--listen", `127.0.0.1:${prt}`, ...args, "-m", modelDir,
    "--seed", "1", "--health-interval", "200"]);
  p.url = url(prt);
  return p;
}

function logs(list = procs) {
  return list.map((p) => `---- ${p.name} (${p.args.join(" ")})` +
    `${p.exit ? ` exited ${JSON.stringify(p.exit)}` : ""} ----\n${p.log.slice(-4000)}`).join("\n");
}

process.on("exit", () => {
  for (const p of procs) if (!p.exit) try { p.child.kill("SIGKILL"); } catch { /* gone */ }
});

async function waitUp(p, ms = 10000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (p.exit) throw new Error(`${p.name} exited ${JSON.stringify(p.exit)} while starting:\n${p.log}`);
    try {
      const r = await fetch(`${p.url}/health`, { signal: AbortSignal.timeout(1000) });
      if (r.ok) return;
    } catch { /* not yet */ }
    await sleep(50);
  }
  throw new Error(`${p.name} did not come up on ${p.url} in ${ms} ms:\n${p.log}`);
}

// ---- HTTP helpers ----

async function post(base, path, body, ms = 15000) {
  const r = await fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body), signal: AbortSignal.timeout(ms) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json,
    server: r.headers.get("x-tessera-server"), prefill: r.headers.get("x-tessera-prefill") };
}

async function get(base, path, ms = 3000) {
  const r = await fetch(base + path, { signal: AbortSignal.timeout(ms) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* Prometheus text */ }
  return { status: r.status, text, json };
}

// a sample of Prometheus text: name{labels} value; NaN when absent
function metric(text, name, labels = "") {
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    if (line.slice(0, sp) === name + labels) return Number(line.slice(sp + 1));
  }
  return NaN;
}

async function metrics(p) { return (await get(p.url, "/metrics")).text; }

// polls f() until it returns a truthy value; the last value otherwise
async function poll(f, ms, every = 100) {
  const t0 = Date.now();
  let v;
  for (;;) {
    v = await f();
    if (v || Date.now() - t0 >= ms) return v;
    await sleep(every);
  }
}

function errorShape(j, what) {
  assert.ok(j && j.error && typeof j.error.message === "string" && typeof j.error.type === "string" &&
    "param" in j.error && "code" in j.error, `${what}: not an OpenAI error object: ${JSON.stringify(j)}`);
}

function ok200(r, what) {
  assert.equal(r.status, 200, `${what}: status ${r.status}: ${r.text}`);
}

// the router's /health once every server is checked (and, where given, in this mode)
async function waitRouter(router, modes, ms = 8000) {
  let last = null;
  const good = await poll(async () => {
    try {
      const r = await get(router.url, "/health", 1000);
      last = r;
      if (r.status !== 200 || !r.json) return false;
      return r.json.servers.length === Object.keys(modes).length &&
        r.json.servers.every((s) => s.healthy && (modes[s.url] === undefined || s.mode === modes[s.url]));
    } catch { return false; }
  }, ms);
  assert.ok(good, `${router.name}: servers not all healthy in the expected modes ${JSON.stringify(modes)} ` +
    `after ${ms} ms; /health: ${last && last.text}`);
  return last.json;
}

const text = (r) => r.json.choices[0].text;

// prompts: distinct first 40 characters, the same long tail
const tail = " and then the quick brown fox jumps over the lazy dog while the cat watches quietly.";
const heads = ["Alpha: a question about red apples here:", "Bravo! some notes on green pears, listed",
  "Charlie went to the market on a Tuesday,", "Delta 4: numbers 1 2 3 4 5 6 7 8 9 10 11"];
const prompts = heads.map((h) => (h.padEnd(40, ".") + tail).slice(0, 124));

let S1 = [], R1 = null, home = {};

// ---- 1. cache-aware routing ----
async function part1() {
  S1 = [serve("s1a", port()), serve("s1b", port()), serve("s1c", port(), ["--no-kv-events"])];
  await Promise.all(S1.map((s) => waitUp(s)));
  R1 = route("router1", port(), [...S1.flatMap((s) => ["--server", s.url]), "--policy", "cache-aware"]);
  await waitUp(R1);
  const modes = { [S1[0].url]: "precise", [S1[1].url]: "precise", [S1[2].url]: "approximate" };
  await waitRouter(R1, modes);

  async function send(p, rep) {
    const r = await post(R1.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 4, temperature: 0 });
    const what = `prompt ${JSON.stringify(p.slice(0, 20))} request ${rep + 1}`;
    ok200(r, what);
    assert.ok(S1.some((s) => s.url === r.server), `${what}: x-tessera-server ${r.server}`);
    assert.ok(r.json.usage.prompt_tokens >= 113, `${what}: ${JSON.stringify(r.json.usage)}`);
    if (rep === 0) home[p] = r.server;
    else {
      assert.equal(r.server, home[p], `${what}: routed to ${r.server}, the prefix is cached on ${home[p]}`);
      assert.ok(r.json.usage.prompt_tokens_details.cached_tokens >= 96,
        `${what} on ${r.server}: cached_tokens ${JSON.stringify(r.json.usage)}`);
    }
  }
  for (const p of prompts)
    for (let rep = 0; rep < 3; rep++) await send(p, rep);
  // the approximate server must hold one prompt: more prompts until one lands there
  const approx = S1[2].url;
  for (let i = 0; i < 12 && !prompts.some((p) => home[p] === approx); i++) {
    const p = (`Extra ${i}: `.padEnd(40, "~") + tail).slice(0, 124);
    prompts.push(p);
    for (let rep = 0; rep < 3; rep++) await send(p, rep);
  }
  assert.ok(prompts.some((p) => home[p] === approx), `no prompt was routed to ${approx} (approximate mode)`);
  let m = await metrics(R1);
  const prefix = metric(m, "tessera_router_decisions_total", '{reason="prefix"}');
  assert.ok(prefix >= 2 * prompts.length, `decisions_total{reason="prefix"} = ${prefix}, want >= ${2 * prompts.length}:\n${m}`);
  // past the router's few seconds of "recently routed" credit: the prefix is
  // still known, from the KV events (precise) or the requests sent (approximate)
  await sleep(5600);
  for (const p of prompts) await send(p, 3);
  m = await metrics(R1);
  const prefix2 = metric(m, "tessera_router_decisions_total", '{reason="prefix"}');
  assert.ok(prefix2 >= prefix + prompts.length, `decisions_total{reason="prefix"} = ${prefix2} after ` +
    `${prompts.length} more repeats, want >= ${prefix + prompts.length}:\n${m}`);
  const h = await waitRouter(R1, modes, 2000);
  assert.equal(h.status, "ok");
  console.log(`router_e2e: 1 cache-aware routing ok (homes: ${prompts.map((p) => home[p].split(":")[2]).join(", ")}, ` +
    `${approx.split(":")[2]} approximate; ${prefix2} prefix decisions)`);
}

// ---- 2. through the router = direct (greedy) ----
async function part2() {
  const viaR = new OpenAI({ baseURL: `${R1.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 15000 });
  const direct = new OpenAI({ baseURL: `${S1[0].url}/v1`, apiKey: "none", maxRetries: 0, timeout: 15000 });
  const prompt = "Routing check: a greedy continuation of this sentence";
  const q = { model: "tiny", prompt, max_tokens: 12, temperature: 0 };
  const d = await direct.completions.create(q);
  const w = await viaR.completions.create(q);
  assert.equal(w.choices[0].text, d.choices[0].text, "completion through the router != direct");
  assert.equal(w.usage.completion_tokens, 12);
  let streamed = "", chunks = 0;
  for await (const ch of await viaR.completions.create({ ...q, stream: true })) {
    streamed += ch.choices[0]?.text ?? "";
    chunks++;
  }
  assert.equal(streamed, d.choices[0].text, "streamed completion through the router != direct");
  assert.ok(chunks >= 2, `streamed through the router in ${chunks} chunk(s)`);
  const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello through the router" }];
  const cq = { model: "tiny", messages: msgs, max_tokens: 10, temperature: 0 };
  const cd = await direct.chat.completions.create(cq);
  const cw = await viaR.chat.completions.create(cq);
  assert.equal(cw.choices[0].message.content, cd.choices[0].message.content, "chat through the router != direct");
  let cs = "";
  for await (const ch of await viaR.chat.completions.create({ ...cq, stream: true }))
    cs += ch.choices[0]?.delta?.content ?? "";
  assert.equal(cs, cd.choices[0].message.content, "streamed chat through the router != direct");
  const models = await viaR.models.list();
  assert.equal(models.data[0].id, "tiny");
  console.log("router_e2e: 2 router output == direct output (completions whole/streamed, chat whole/streamed) ok");
}

// ---- 6. bad input through the router ----
async function part6() {
  const bad = await post(R1.url, "/v1/completions", "{not json");
  assert.equal(bad.status, 400, `invalid JSON: ${bad.status} ${bad.text}`);
  errorShape(bad.json, "invalid JSON");
  const bad2 = await post(R1.url, "/v1/completions", { model: "tiny", prompt: "x", max_tokens: "ten" });
  assert.equal(bad2.status, 400, `max_tokens "ten": ${bad2.status} ${bad2.text}`);
  errorShape(bad2.json, "max_tokens \"ten\"");
  const nf = await post(R1.url, "/v1/nowhere", { prompt: "x" });
  assert.equal(nf.status, 404, `POST /v1/nowhere: ${nf.status} ${nf.text}`);
  errorShape(nf.json, "POST /v1/nowhere");
  const nf2 = await get(R1.url, "/nowhere");
  assert.equal(nf2.status, 404, `GET /nowhere: ${nf2.status} ${nf2.text}`);
  errorShape(nf2.json, "GET /nowhere");
  // the router is still fine
  ok200(await post(R1.url, "/v1/completions", { model: "tiny", prompt: "still up", max_tokens: 2 }), "after bad input");
  console.log("router_e2e: 6 bad input through the router (400 invalid JSON, 404 unknown path) ok");
}

// ---- 3. failover ----
async function part3() {
  const p = prompts[0];
  const victim = S1.find((s) => s.url === home[p]);
  victim.child.kill("SIGKILL");
  await victim.exited;
  const t0 = Date.now();
  const r = await post(R1.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 4, temperature: 0 }, 5000);
  ok200(r, `prompt 0 after killing ${victim.url}`);
  assert.ok(r.server && r.server !== victim.url, `served by ${r.server} after killing ${victim.url}`);
  assert.ok(Date.now() - t0 < 5000);
  // and again: the dead server is not picked
  for (let i = 0; i < 3; i++) {
    const r2 = await post(R1.url, "/v1/completions", { model: "tiny", prompt: prompts[i], max_tokens: 2 }, 5000);
    ok200(r2, `prompt ${i} with ${victim.url} dead`);
    assert.notEqual(r2.server, victim.url);
  }
  const down = await poll(async () => {
    const h = await get(R1.url, "/health");
    const s = h.json.servers.find((x) => x.url === victim.url);
    return s && !s.healthy ? h : null;
  }, 3000);
  assert.ok(down, `/health still lists ${victim.url} as healthy 3 s after SIGKILL`);
  assert.equal(down.status, 200);
  let m = await metrics(R1);
  assert.equal(metric(m, "tessera_router_server_healthy", `{server="${victim.url}"}`), 0, m);
  for (const s of S1.filter((x) => x !== victim))
    assert.equal(metric(m, "tessera_router_server_healthy", `{server="${s.url}"}`), 1, m);
  // back on the same port
  const again = serve(victim.name + "-restarted", victim.port, victim.extra);
  await waitUp(again);
  S1[S1.indexOf(victim)] = again;
  const back = await poll(async () => {
    const h = await get(R1.url, "/health");
    return h.json.servers.find((x) => x.url === again.url)?.healthy;
  }, 5000);
  assert.ok(back, `${again.url} restarted but /health does not list it healthy within 5 s`);
  m = await metrics(R1);
  assert.equal(metric(m, "tessera_router_server_healthy", `{server="${again.url}"}`), 1, m);
  ok200(await post(R1.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 2 }, 5000), "after restart");

  // every server gone: a quick error, then 503 once the router knows
  for (const s of S1) s.child.kill("SIGKILL");
  await Promise.all(S1.map((s) => s.exited));
  let t = Date.now();
  const e1 = await post(R1.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 2 }, 5000);
  assert.equal(e1.status, 503, `all servers dead, right away: ${e1.status} ${e1.text}`);
  errorShape(e1.json, "all servers dead, right away");
  assert.ok(Date.now() - t < 4000, `all servers dead: the answer took ${Date.now() - t} ms`);
  const gone = await poll(async () => (await get(R1.url, "/health")).status === 503, 3000);
  assert.ok(gone, `router /health is not 503 3 s after every server died: ${(await get(R1.url, "/health")).text}`);
  t = Date.now();
  const e2 = await post(R1.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 2 }, 5000);
  assert.equal(e2.status, 503, `no healthy server: ${e2.status} ${e2.text}`);
  errorShape(e2.json, "no healthy server");
  const e3 = await post(R1.url, "/v1/chat/completions",
    { model: "tiny", messages: [{ role: "user", content: "hi" }], stream: true }, 5000);
  assert.equal(e3.status, 503, `no healthy server, streamed chat: ${e3.status} ${e3.text}`);
  errorShape(e3.json, "no healthy server, streamed chat");
  assert.ok(Date.now() - t < 3000, `503s took ${Date.now() - t} ms`);
  m = await metrics(R1);
  const retries = metric(m, "tessera_router_retries_total");
  assert.ok(retries >= 0, `no tessera_router_retries_total:\n${m}`);
  console.log(`router_e2e: 3 failover ok (killed ${victim.url}, prompt 0 went to ${r.server}; ` +
    `restart healthy again; all dead: ${e1.status} then 503; ${retries} retries)`);
}

// ---- 4. prefill/decode disaggregation ----
let Ref = null, refText = {};
const pdPrompts = ["Disaggregated one: ", "Second disaggregated prompt, ", "3rd: prefill here, decode there; "]
  .map((h) => (h + "the quick brown fox jumps over the lazy dog. ".repeat(4)).slice(0, 150));

// a decode server (--kv-port 0), then a prefill server that may send it KV
// (--kv-peers: its KV address, as the router writes it)
async function pdPair(pname, dname, penv = {}) {
  const D = serve(dname, port(), ["--kv-port", "0"]);
  await waitUp(D);
  const kv = (await get(D.url, "/health")).json.kv_transfer_port;
  assert.ok(kv > 0, `${dname}: no kv_transfer_port in /health`);
  const P = serve(pname, port(), ["--kv-peers", `127.0.0.1:${kv}`], penv);
  return [P, D];
}

async function part4() {
  const [P, D] = await pdPair("prefill", "decode");
  Ref = serve("reference", port());
  await Promise.all([P, D, Ref].map((s) => waitUp(s)));
  const R = route("router-pd", port(), ["--prefill", P.url, "--decode", D.url]);
  await waitUp(R);
  await waitRouter(R, { [P.url]: undefined, [D.url]: undefined });
  // the router needs the decode server's KV port (from its /health)
  const dh = await get(D.url, "/health");
  assert.ok(dh.json.kv_transfer_port > 0 && dh.json.block_size === 16, `decode /health: ${dh.text}`);
  const viaR = new OpenAI({ baseURL: `${R.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 15000 });
  for (const [i, p] of pdPrompts.entries()) {
    const q = { model: "tiny", prompt: p, max_tokens: 8, temperature: 0 };
    const ref = await post(Ref.url, "/v1/completions", q);
    ok200(ref, `reference, prompt ${i}`);
    refText[p] = text(ref);
    // whole and streamed; prompt 1 streamed first, so a stream is what gets prefilled
    const streamed = async () => {
      let s = "", usage = null;
      for await (const ch of await viaR.completions.create({ ...q, stream: true,
        stream_options: { include_usage: true } })) {
        s += ch.choices[0]?.text ?? "";
        if (ch.usage) usage = ch.usage;
      }
      assert.equal(s, refText[p], `prompt ${i}: streamed through the router ${JSON.stringify(s)} != ` +
        `reference ${JSON.stringify(refText[p])}`);
      return usage;
    };
    const first = i === 1 ? await streamed() : null;
    const w = await post(R.url, "/v1/completions", q);
    ok200(w, `disaggregated, prompt ${i}`);
    assert.equal(w.server, D.url, `prompt ${i}: x-tessera-server ${w.server}`);
    assert.equal(text(w), refText[p], `prompt ${i}: disaggregated ${JSON.stringify(text(w))} != ` +
      `reference ${JSON.stringify(refText[p])}`);
    assert.ok(w.json.usage.prompt_tokens >= 145, JSON.stringify(w.json.usage));
    assert.ok(w.json.usage.prompt_tokens_details.cached_tokens >= 128,
      `prompt ${i}: the prefilled blocks were not used: ${JSON.stringify(w.json.usage)}`);
    if (first) {
      assert.ok(first.prompt_tokens_details?.cached_tokens >= 128,
        `prompt ${i}, streamed the first time: the prefilled blocks were not used: ${JSON.stringify(first)}`);
    } else {
      assert.equal(w.prefill, P.url, `prompt ${i}, the first time: x-tessera-prefill ${w.prefill} (no prefill?)`);
      await streamed();
    }
  }
  const chat = { model: "tiny", max_tokens: 8, temperature: 0,
    messages: [{ role: "user", content: "Chat through prefill and decode: " + "lorem ipsum dolor ".repeat(7) }] };
  const cref = await post(Ref.url, "/v1/chat/completions", chat);
  const cw = await viaR.chat.completions.create(chat);
  assert.equal(cw.choices[0].message.content, cref.json.choices[0].message.content, "disaggregated chat != reference");
  const dm = await metrics(D), pm = await metrics(P), rm = await metrics(R);
  assert.ok(metric(dm, "tessera_kv_transfers_received_total") >= 1, `decode:\n${dm}`);
  assert.ok(metric(dm, "tessera_kv_blocks_adopted_total") >= 1, `decode:\n${dm}`);
  assert.ok(metric(pm, "tessera_kv_transfers_sent_total") >= 1, `prefill:\n${pm}`);
  assert.ok(metric(rm, "tessera_router_kv_transfers_total", '{status="ok"}') >= 3, `router:\n${rm}`);
  assert.equal(metric(rm, "tessera_router_kv_transfers_total", '{status="failed"}'), 0, `router:\n${rm}`);
  console.log(`router_e2e: 4 disaggregation ok (${metric(dm, "tessera_kv_blocks_adopted_total")} blocks adopted, ` +
    `${metric(rm, "tessera_router_kv_transfers_total", '{status="ok"}')} transfers)`);
}

// ---- 5. a corrupted transfer: refused, recomputed, the same text ----
async function part5() {
  const [P, D] = await pdPair("prefill-corrupt", "decode-fresh", { TESSERA_FAULT_KV_CORRUPT: "1" });
  await Promise.all([P, D].map((s) => waitUp(s)));
  const R = route("router-corrupt", port(), ["--prefill", P.url, "--decode", D.url]);
  await waitUp(R);
  await waitRouter(R, { [P.url]: undefined, [D.url]: undefined });
  const p = pdPrompts[0];
  const w = await post(R.url, "/v1/completions", { model: "tiny", prompt: p, max_tokens: 8, temperature: 0 });
  ok200(w, "corrupt transfer");
  assert.equal(w.server, D.url);
  assert.equal(text(w), refText[p], `after a corrupt transfer ${JSON.stringify(text(w))} != reference ` +
    `${JSON.stringify(refText[p])}`);
  assert.equal(w.json.usage.prompt_tokens_details.cached_tokens, 0,
    `corrupt blocks were used? ${JSON.stringify(w.json.usage)}`);
  let dm = "";
  await poll(async () => metric(dm = await metrics(D), "tessera_kv_transfers_refused_total") >= 1, 2000);
  assert.ok(metric(dm, "tessera_kv_transfers_refused_total") >= 1, `decode:\n${dm}`);
  assert.equal(metric(dm, "tessera_kv_blocks_adopted_total"), 0, `decode:\n${dm}`);
  assert.equal(metric(dm, "tessera_kv_transfers_received_total"), 0, `decode:\n${dm}`);
  const pm = await metrics(P), rm = await metrics(R);
  assert.ok(metric(pm, "tessera_kv_transfers_send_failed_total") >= 1, `prefill:\n${pm}`);
  assert.ok(metric(rm, "tessera_router_kv_transfers_total", '{status="failed"}') >= 1, `router:\n${rm}`);
  console.log("router_e2e: 5 corrupt KV transfer refused, recomputed, same text ok");
}

// ---- 7. the JSON config file; bad options and configs are clear errors ----
async function part7() {
  const { writeFileSync, mkdtempSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const dir = mkdtempSync(`${tmpdir()}/router_e2e_`);
  const A = serve("cfg-server", port());
  await waitUp(A);
  const rp = port();
  const good = `${dir}/route.json`;
  writeFileSync(good, JSON.stringify({ listen: `127.0.0.1:${rp}`, servers: [A.url],
    model: modelDir, policy: "round-robin", weights: { prefix: 3, queue: 1, kv: 0 },
    seed: 5, health_interval_ms: 200 }));
  const R = start("cfg-router", ["route", "--config", good]);
  R.url = url(rp);
  await waitUp(R);
  const h = JSON.parse((await get(R.url, "/health")).text);
  assert.equal(h.policy, "round-robin", JSON.stringify(h));
  assert.deepEqual(h.servers.map((s) => s.url), [A.url]);
  const r = await post(R.url, "/v1/completions", { prompt: "Hello world", max_tokens: 3,
    temperature: 0 });
  assert.equal(r.status, 200, r.text);
  async function refused(args, needle) {
    const p = start("bad-router", ["route", ...args]);
    const e = await Promise.race([p.exited, sleep(5000).then(() => null)]);
    assert.ok(e && e.code !== 0, `route ${args.join(" ")} did not fail: ${JSON.stringify(e)}`);
    assert.ok(p.log.includes(needle), `route ${args.join(" ")}: "${needle}" not in ${p.log}`);
  }
  const bad = (name, obj) => { writeFileSync(`${dir}/${name}`, obj); return `${dir}/${name}`; };
  await refused(["--config", bad("typo.json", '{"servers": ["http://127.0.0.1:1"], "polcy": "load"}')],
    'unknown key "polcy"');
  await refused(["--config", bad("broken.json", '{"servers": [')], "broken.json");
  await refused(["--config", bad("weights.json", '{"servers": ["http://127.0.0.1:1"], "weights": {"prefix": -1}}')],
    'bad value for "weights"');
  await refused(["--server", "127.0.0.1:1"], "not an http://HOST:PORT");
  await refused(["--server", A.url, "--policy", "fastest"], 'bad or incomplete option "--policy"');
  await refused(["--server", A.url, "--weights", "speed=2"], '"speed=2"');
  await refused(["--listen", "127.0.0.1:0"], "no servers");
  console.log("router_e2e: 7. the JSON config works; bad options and configs are named");
}

// ---- shutdown ----
async function stopAll() {
  const live = procs.filter((p) => !p.exit);
  for (const p of live) p.child.kill("SIGTERM");
  const res = await Promise.all(live.map((p) =>
    Promise.race([p.exited, sleep(5000).then(() => null)]).then((e) => [p, e])));
  for (const [p, e] of res) {
    assert.ok(e, `${p.name} did not exit within 5 s of SIGTERM:\n${logs([p])}`);
    assert.equal(e.code, 0, `${p.name} exited ${JSON.stringify(e)} on SIGTERM:\n${logs([p])}`);
  }
  console.log(`router_e2e: SIGTERM stopped ${res.length} processes cleanly`);
}

async function main() {
  const t0 = Date.now();
  await part1();
  await part2();
  await part6();
  await part3();
  await part4();
  await part5();
  await part7();
  await stopAll();
  console.log(`router_e2e: all checks passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

const watchdog = setTimeout(() => {
  console.error("router_e2e: took over 120 s\n" + logs());
  process.exit(1);
}, 120000);

main().then(() => {
  clearTimeout(watchdog);
  process.exit(0); /* not waiting for fetch's idle keep-alive sockets */
}).catch((e) => {
  console.error(e);
  console.error(logs());
  process.exit(1);
});
