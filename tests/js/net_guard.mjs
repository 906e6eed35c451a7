// net_guard.mjs TESSERA MODEL_DIR — what `tessera serve` and `tessera route`
// refuse to do for a client (issue 16, the network part), on loopback only:
//  1. KV transfer: a kv_transfer_params target on a server without
//     --kv-peers, or one outside its --kv-peers, is a 400 naming the field,
//     the same answer whether or not the port listens, and nothing connects
//     there (a local listener counts); a listed target is connected to
//     (the control that the listener would have seen one); a bad
//     --kv-peers is a named startup error;
//  2. API key: no key or a wrong one is a 401 (OpenAI error object, code
//     invalid_api_key) on /v1/chat/completions, /v1/completions,
//     /v1/models, /v1/kv_cache; the right one a 200; /health stays open;
//     through the router too, which passes its --server-api-key to the
//     server (its /v1/models answers, its KV events are read: "precise");
//  3. stalled clients: 200 connections from 127.0.0.2 that send half a
//     header do not keep a request from 127.0.0.1 from being served (the
//     per-address limit), and all are closed after --conn-timeout; a
//     /v1/kv_events stream stays open past that timeout;
//  4. the router's mid-stream error event (its server dies while
//     streaming) is JSON with error.message naming the server and
//     error.type "server_error";
//  5. the KV receiver (--kv-port) closes a connection from an address
//     outside --kv-senders at once, without a reply; one from a listed
//     address gets the protocol's reply (here: a refusal of garbage);
//     error messages quoting a non-UTF-8 path or a cut model name are
//     still OpenAI error objects.
// Only node built-ins: fetch, net, http, child_process.
import { spawn } from "node:child_process";
import net from "node:net";
import http from "node:http";
import assert from "node:assert/strict";

const [exe, modelDir] = process.argv.slice(2);
if (!exe || !modelDir) {
  console.error("usage: node net_guard.mjs TESSERA_EXE MODEL_DIR");
  process.exit(2);
}
let nextPort = 21000 + (process.pid % 500) * 2;
const port = () => nextPort++;
const url = (p) => `http://127.0.0.1:${p}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const KEY = "sk-server-0123456789", RKEY = "sk-router-abcdef";

const procs = [];
function start(name, args, env = {}) {
  const child = spawn(exe, args, { stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, TESSERA_API_KEY: "", TESSERA_SERVER_API_KEY: "", ...env } });
  const p = { name, args, child, log: "", exit: null };
  child.stdout.on("data", (d) => { p.log += d; });
  child.stderr.on("data", (d) => { p.log += d; });
  p.exited = new Promise((res) => child.on("exit", (code, sig) => { p.exit = { code, sig }; res(p.exit); }));
  procs.push(p);
  return p;
}
function serve(name, extra = [], env = {}) {
  const prt = port();
  const p = start(name, ["serve", "-m", modelDir, "--port", String(prt), "--kv-blocks", "64",
    "--max-seqs", "4", "--served-model-name", "tiny", ...extra], env);
  p.url = url(prt);
  return p;
}
function route(name, args, env = {}) {
  const prt = port();
  const p = start(name, ["route", "--listen", `127.0.0.1:${prt}`, "--seed", "1",
    "--health-interval", "200", ...args], env);
  p.url = url(prt);
  return p;
}
const logs = () => procs.map((p) => `---- ${p.name} (${p.args.join(" ")})` +
  `${p.exit ? ` exited ${JSON.stringify(p.exit)}` : ""} ----\n${p.log.slice(-3000)}`).join("\n");
process.on("exit", () => {
  for (const p of procs) if (!p.exit) try { p.child.kill("SIGKILL"); } catch { /* gone */ }
});

async function waitUp(p, ms = 10000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (p.exit) throw new Error(`${p.name} exited ${JSON.stringify(p.exit)} while starting:\n${p.log}`);
    try {
      if ((await fetch(`${p.url}/health`, { signal: AbortSignal.timeout(1000) })).ok) return;
    } catch { /* not yet */ }
    await sleep(50);
  }
  throw new Error(`${p.name} did not come up on ${p.url} in ${ms} ms:\n${p.log}`);
}

async function call(base, path, { body, key, ms = 15000 } = {}) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (key !== undefined) headers.Authorization = key;
  const r = await fetch(base + path, { method: body === undefined ? "GET" : "POST", headers,
    body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(ms) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}

function errorShape(j, what) {
  assert.ok(j && j.error && typeof j.error.message === "string" && typeof j.error.type === "string" &&
    "param" in j.error && "code" in j.error, `${what}: not an OpenAI error object: ${JSON.stringify(j)}`);
}

// a local TCP listener that counts the connections it gets (each closed at once)
async function listener() {
  const l = { count: 0 };
  l.server = net.createServer((s) => { l.count++; s.destroy(); });
  await new Promise((res) => l.server.listen(0, "127.0.0.1", res));
  l.port = l.server.address().port;
  return l;
}

const completion = (extra = {}) => ({ model: "tiny", prompt: "Guard check: the quick brown fox", max_tokens: 2,
  temperature: 0, ...extra });

// ---- 1. KV-transfer targets ----
async function part1(S1) {
  const L1 = await listener(), L2 = await listener();
  const closed = await listener();
  await new Promise((res) => closed.server.close(res)); // a port nothing listens on
  const bad = await start("bad-peers", ["serve", "-m", modelDir, "--port", "0", "--kv-peers",
    "127.0.0.1:9,nonsense"]).exited;
  assert.notEqual(bad.code, 0, "serve --kv-peers with a bad entry started");
  assert.ok(procs.at(-1).log.includes("--kv-peers") && procs.at(-1).log.includes('"nonsense"'),
    `bad --kv-peers not named: ${procs.at(-1).log}`);

  const S2 = serve("peers", ["--kv-peers", `127.0.0.1:${L2.port}`]);
  await waitUp(S2);
  // no --kv-peers: every target refused, the same answer for a listening and a closed port
  const msgs = [];
  for (const t of [`127.0.0.1:${L1.port}`, `127.0.0.1:${closed.port}`]) {
    for (const path of ["/v1/completions", "/v1/chat/completions"]) {
      const body = path === "/v1/completions" ? completion({ kv_transfer_params: { target: t } })
        : { model: "tiny", max_tokens: 2, messages: [{ role: "user", content: "hi" }], kv_transfer_params: { target: t } };
      const r = await call(S1.url, path, { body, key: `Bearer ${KEY}` });
      assert.equal(r.status, 400, `no --kv-peers, target ${t} on ${path}: ${r.status} ${r.text}`);
      errorShape(r.json, `no --kv-peers, target ${t}`);
      assert.equal(r.json.error.param, "kv_transfer_params", r.text);
      msgs.push(r.json.error.message);
    }
  }
  assert.ok(msgs.every((m) => m === msgs[0]), `the refusals differ by target: ${JSON.stringify(msgs)}`);
  // outside the allow-list (another port; the listed port under another host name)
  for (const t of [`127.0.0.1:${L1.port}`, `localhost:${L2.port}`, `127.0.0.2:${L2.port}`, `127.0.0.1:${L2.port}0`]) {
    const r = await call(S2.url, "/v1/completions", { body: completion({ kv_transfer_params: { target: t } }) });
    assert.equal(r.status, 400, `target ${t} outside --kv-peers: ${r.status} ${r.text}`);
    errorShape(r.json, `target ${t} outside --kv-peers`);
    assert.equal(r.json.error.param, "kv_transfer_params", r.text);
    assert.ok(r.json.error.message.includes("--kv-peers"), r.text);
  }
  await sleep(200);
  assert.equal(L1.count, 0, `a refused target was connected to ${L1.count} time(s)`);
  assert.equal(L2.count, 0, `a refused spelling of the listed target was connected to ${L2.count} time(s)`);
  // the control: the listed target is connected to (and the failed send reported)
  const ok = await call(S2.url, "/v1/completions", { body: completion({ kv_transfer_params: { target: `127.0.0.1:${L2.port}` } }) });
  assert.equal(ok.status, 200, `listed target: ${ok.status} ${ok.text}`);
  assert.equal(ok.json.kv_transfer_params.status, "error", ok.text);
  assert.ok(L2.count >= 1, "the listed target was not connected to: the listener cannot see connections");
  for (const l of [L1, L2]) l.server.close();
  console.log(`net_guard: 1 KV targets: refused without and outside --kv-peers, nothing connected; ` +
    `the listed one connected (${L2.count})`);
}

// ---- 2. API keys, direct and through the router ----
async function part2(S1) {
  const chat = { model: "tiny", max_tokens: 2, temperature: 0, messages: [{ role: "user", content: "hello" }] };
  const ends = [["/v1/chat/completions", chat], ["/v1/completions", completion()], ["/v1/models"], ["/v1/kv_cache"]];
  const bad = [undefined, "Bearer wrong", `Bearer ${KEY}x`, `Bearer ${KEY.slice(0, -1)}`, KEY, `Basic ${KEY}`];
  async function check(base, key, list, what) {
    for (const [path, body] of list) {
      for (const b of bad.map((k) => (k === KEY ? key : k?.replace(KEY, key)))) {
        const r = await call(base, path, { body, key: b });
        assert.equal(r.status, 401, `${what} ${path} with Authorization ${JSON.stringify(b)}: ${r.status} ${r.text}`);
        errorShape(r.json, `${what} ${path} 401`);
        assert.equal(r.json.error.code, "invalid_api_key", r.text);
      }
      const r = await call(base, path, { body, key: `Bearer ${key}` });
      assert.equal(r.status, 200, `${what} ${path} with the right key: ${r.status} ${r.text}`);
      const r2 = await call(base, path, { body, key: `bearer  ${key}` });
      assert.equal(r2.status, 200, `${what} ${path}, "bearer" in lower case: ${r2.status} ${r2.text}`);
    }
    assert.equal((await call(base, "/health")).status, 200, `${what} /health without a key`);
  }
  await check(S1.url, KEY, ends, "server");
  // a stranger's oversized body is refused for the key (not kept to be measured)
  const big = { model: "tiny", prompt: "x".repeat(17 << 20) };
  const b1 = await call(S1.url, "/v1/completions", { body: big, key: "Bearer wrong" });
  assert.equal(b1.status, 401, `17 MB without the key: ${b1.status} ${b1.text.slice(0, 300)}`);
  const b2 = await call(S1.url, "/v1/completions", { body: big, key: `Bearer ${KEY}` });
  assert.equal(b2.status, 413, `17 MB with the key: ${b2.status} ${b2.text.slice(0, 300)}`);
  // the router: its own key from the environment, the server's on the command line
  const R = route("router-keys", ["--server", S1.url, "-m", modelDir, "--server-api-key", KEY],
    { TESSERA_API_KEY: RKEY });
  await waitUp(R);
  let h = null;
  for (let i = 0; i < 80; i++) {
    h = await call(R.url, "/health");
    if (h.json?.servers?.[0]?.healthy && h.json.servers[0].mode === "precise") break;
    await sleep(100);
  }
  assert.equal(h.json.servers[0].mode, "precise",
    `the router does not read the server's KV events with --server-api-key: ${h.text}`);
  await check(R.url, RKEY, ends.slice(0, 3), "router");
  // a router without the server's key: its requests are refused by the server
  const R0 = route("router-nokey", ["--server", S1.url]);
  await waitUp(R0);
  const r0 = await call(R0.url, "/v1/completions", { body: completion() });
  assert.equal(r0.status, 401, `a router without the server's key: ${r0.status} ${r0.text}`);
  for (const p of [R, R0]) p.child.kill("SIGTERM");
  for (const p of [R, R0]) assert.equal((await p.exited).code, 0, `${p.name} on SIGTERM:\n${p.log}`);
  console.log("net_guard: 2 API keys: 401 without or with a wrong key, 200 with it, direct and through the router");
}

// ---- 3. stalled half-header clients ----
async function part3() {
  // its own server: a 2 s timeout would race fetch's pooled keep-alive
  // sockets (kept 4 s) in the other parts
  const S1 = serve("limited", ["--max-connections", "64", "--max-connections-per-client", "8",
    "--conn-timeout", "2"], { TESSERA_API_KEY: KEY });
  await waitUp(S1);
  const N = 200, socks = [];
  let closedN = 0;
  for (let i = 0; i < N; i++) {
    const s = net.connect({ host: "127.0.0.1", port: Number(S1.url.split(":")[2]), localAddress: "127.0.0.2" });
    s.on("error", () => { /* reset by the server: counted on close */ });
    s.on("close", () => { closedN++; });
    s.on("connect", () => s.write("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"));
    socks.push(s);
  }
  await Promise.all(socks.map((s) => new Promise((res) => {
    if (s.writableFinished || s.destroyed) return res();
    s.once("connect", res);
    s.once("close", res);
  })));
  // an event stream, open across the timeout
  const ac = new AbortController();
  const ev = await fetch(`${S1.url}/v1/kv_events`, { headers: { Authorization: `Bearer ${KEY}` }, signal: ac.signal });
  assert.equal(ev.status, 200);
  const reader = ev.body.getReader();
  const t0 = Date.now();
  const r = await call(S1.url, "/v1/completions", { body: completion(), key: `Bearer ${KEY}`, ms: 10000 });
  assert.equal(r.status, 200, `a request from 127.0.0.1 with ${N} stalled from 127.0.0.2: ${r.status} ${r.text}`);
  assert.equal(r.json.usage.completion_tokens, 2, r.text);
  // every stalled connection closed within a generous bound (--conn-timeout 2)
  for (let i = 0; i < 150 && closedN < N; i++) await sleep(100);
  assert.equal(closedN, N, `${N - closedN} of ${N} half-header connections still open 15 s on (--conn-timeout 2)`);
  // the stream outlived the timeout: still reading after 3 s
  let got = 0;
  while (Date.now() - t0 < 3000) {
    const { value, done } = await reader.read();
    assert.ok(!done, "/v1/kv_events closed by the idle timeout");
    got += value.length;
  }
  ac.abort();
  assert.ok(got > 0);
  const again = await call(S1.url, "/v1/models", { key: `Bearer ${KEY}` });
  assert.equal(again.status, 200);
  console.log(`net_guard: 3 ${N} stalled connections from 127.0.0.2: 127.0.0.1 served, all dropped; a stream outlives the timeout`);
}

// ---- 4. the router's mid-stream error event ----
async function part4() {
  const fake = http.createServer((req, res) => {
    if (req.url === "/health") return res.end('{"status":"ok"}');
    if (req.url === "/metrics") return res.end("tessera_requests_running 0\ntessera_kv_blocks_total 64\n");
    if (req.url === "/v1/kv_cache") { res.statusCode = 404; return res.end("{}"); }
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write('data: {"choices":[{"index":0,"text":"half"}]}\n\n');
      setTimeout(() => res.socket.destroy(), 100); // dies mid-stream
    });
  });
  await new Promise((res) => fake.listen(0, "127.0.0.1", res));
  const F = url(fake.address().port);
  const R = route("router-midstream", ["--server", F]);
  await waitUp(R);
  const r = await fetch(`${R.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(completion({ stream: true })), signal: AbortSignal.timeout(10000) });
  assert.equal(r.status, 200);
  const text = await r.text();
  const events = text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
  assert.ok(events.length >= 2, `stream: ${JSON.stringify(text)}`);
  let j;
  try { j = JSON.parse(events.at(-1)); } catch (e) { assert.fail(`the error event is not JSON: ${events.at(-1)} (${e})`); }
  errorShape(j, "mid-stream error event");
  assert.equal(j.error.type, "server_error", events.at(-1));
  assert.ok(j.error.message.includes(F) && j.error.message.includes("failed"), events.at(-1));
  assert.deepEqual(Object.keys(j.error).sort(), ["code", "message", "param", "type"], events.at(-1));
  fake.close();
  console.log("net_guard: 4 the router's mid-stream error event is an OpenAI error object");
}

// ---- 5. who may send KV blocks ----
// connects to port from localAddress, sends bytes; what came back, and
// whether the server closed first
function kvProbe(prt, localAddress, bytes) {
  return new Promise((res) => {
    const s = net.connect({ host: "127.0.0.1", port: prt, localAddress });
    let got = Buffer.alloc(0);
    const timer = setTimeout(() => { s.destroy(); res({ got, closed: false }); }, 10000);
    s.on("connect", () => s.write(bytes));
    s.on("data", (d) => { got = Buffer.concat([got, d]); });
    s.on("error", () => { /* a reset counts as closed */ });
    s.on("close", () => { clearTimeout(timer); res({ got, closed: true }); });
  });
}

async function part5() {
  const D = serve("kv-senders", ["--kv-port", "0", "--kv-senders", "127.0.0.3"]);
  await waitUp(D);
  const kv = (await call(D.url, "/health")).json.kv_transfer_port;
  assert.ok(kv > 0);
  const junk = Buffer.alloc(24, 0x41); // a header with a wrong magic
  const stranger = await kvProbe(kv, "127.0.0.1", junk);
  assert.ok(stranger.closed && stranger.got.length === 0,
    `a KV connection from 127.0.0.1 (not in --kv-senders): ${stranger.got.length} bytes back, closed ${stranger.closed}`);
  const listed = await kvProbe(kv, "127.0.0.3", junk);
  assert.ok(listed.got.length >= 24 && listed.got.readUInt32LE(0) === 0x564b5354,
    `a KV connection from 127.0.0.3 (listed) got no reply frame: ${listed.got.toString("hex").slice(0, 64)}`);
  assert.ok(listed.got.toString("latin1").includes("not a KV-transfer frame"), listed.got.toString("latin1"));
  const m = (await call(D.url, "/metrics")).text;
  assert.match(m, /tessera_kv_transfers_refused_total 2\n/, m);
  assert.ok(D.log.includes("from 127.0.0.1 refused"), D.log);
  const bad = await start("bad-senders", ["serve", "-m", modelDir, "--port", "0", "--kv-senders", "decode.local"]).exited;
  assert.notEqual(bad.code, 0);
  assert.ok(procs.at(-1).log.includes('--kv-senders: "decode.local"'), procs.at(-1).log);
  for (const [args, needle] of [[["serve", "-m", modelDir, "--conn-timeout", "0"], '--conn-timeout "0": want whole seconds in 1..3600'],
    [["route", "--server", D.url, "--max-connections-per-client", "-3"], '--max-connections-per-client "-3": want a count in 1..65536']]) {
    const p = start("bad-limit", args);
    assert.notEqual((await p.exited).code, 0, args.join(" "));
    assert.ok(p.log.includes(needle), `${args.join(" ")}: ${p.log}`);
  }
  // an error message quoting a request stays an OpenAI error object: a
  // path with a byte that is not UTF-8, a long model name cut mid-character
  const nf = await call(D.url, "/v1/%FF%FEnowhere");
  assert.equal(nf.status, 404, nf.text);
  errorShape(nf.json, "GET /v1/%FF%FEnowhere");
  const longName = "a".repeat(1001) + "\u00e9".repeat(40); // the 1,023-byte message ends mid-"é"
  const nm = await call(D.url, "/v1/completions", { body: { model: longName, prompt: "x" } });
  assert.equal(nm.status, 404, nm.text);
  errorShape(nm.json, "a 1,081-byte model name");
  assert.ok(nm.json.error.message.startsWith("The model `aaa"), nm.text);
  console.log("net_guard: 5 the KV receiver closes on a sender outside --kv-senders, answers a listed one");
}

async function main() {
  const t0 = Date.now();
  const S1 = serve("keyed", [], { TESSERA_API_KEY: KEY });
  await waitUp(S1);
  await part1(S1);
  await part2(S1);
  await part3();
  await part4();
  await part5();
  // SIGTERM: every process stops cleanly (under the sanitizers: no report)
  const live = procs.filter((p) => !p.exit);
  for (const p of live) p.child.kill("SIGTERM");
  for (const p of live) {
    const e = await Promise.race([p.exited, sleep(8000).then(() => null)]);
    assert.ok(e && e.code === 0, `${p.name} on SIGTERM: ${JSON.stringify(e)}\n${p.log.slice(-3000)}`);
  }
  console.log(`net_guard: all checks passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

const watchdog = setTimeout(() => {
  console.error("net_guard: took over 90 s\n" + logs());
  process.exit(1);
}, 90000);

main().then(() => {
  clearTimeout(watchdog);
  process.exit(0);
}).catch((e) => {
  console.error(e);
  console.error(logs());
  process.exit(1);
});
