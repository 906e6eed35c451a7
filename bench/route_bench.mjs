// route_bench.mjs — what `tessera route` buys, measured on this machine
// (loopback only; node builtins only).
//
// Part "route": for each policy, cold: N `tessera serve` of one model behind
// `tessera route --policy P`; T tenants, each with its own long system prompt,
// ask short questions (chat, streamed, temperature 0) from C concurrent
// clients in a seeded interleaved order. Reports per policy: TTFT mean/p90,
// output tokens/s, prefix-cache hit rate (sum usage cached_tokens / sum
// prompt_tokens), errors, where requests went; then the ratios against
// cache-aware and the targets (cache-aware mean TTFT <= 0.5x round-robin's,
// hit rate >= 80%).
//
// Part "pd": (a) 1 prefill + 1 decode server (--kv-port BASE+3, the
// prefill server's --kv-peers) behind
// `tessera route --prefill --decode` against (b) 2 plain servers behind
// `tessera route --policy load`. Workload: S streams of long generations
// (short prompts, max_tokens 128, back to back) while distinct long prompts
// (max_tokens 4) arrive every P seconds; reports the inter-chunk latency of
// the long generations (p50/p90/p99/max) and the long prompts' TTFT.
//
//   node bench/route_bench.mjs [--part route,pd] [--exe build/tessera]
//        [--model DIR] (default build/route_model, made by
//                       bench/make_route_model.py when missing)
//        [--requests 96] [--concurrency 8] [--policies cache-aware,round-robin,random]
//        [--base-port 18200] [--servers 4] [--tenants 8] [--system-tokens 2000]
//        [--kv-blocks 420] [--max-seqs 8] [--time-limit 240] [--seed 1]
//        [--threads N] (TS_NUM_THREADS per server; default cores / servers)
//        [--pd-duration 60] [--pd-streams 4] [--pd-interval 1.5]
//        [--pd-prompt-tokens 2500] [--pd-kv-blocks 1024] [--pd-gen-tokens 128]
//        [--pd-min-blocks N] (passed to the router; its default when absent)
//        [--retry-503 N] (a client re-sends a request answered 503 up to N times,
//                         100 ms apart; TTFT counts from the first try; 0)
//        [--keep-logs] (keep the servers' and routers' logs; printed path)
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "..");
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]?.startsWith("--") || all[i + 1] === undefined ? "1" : all[i + 1]]);
  return acc;
}, []));
const known = new Set(["part", "exe", "model", "requests", "concurrency", "policies", "base-port", "servers",
  "tenants", "system-tokens", "kv-blocks", "max-seqs", "time-limit", "seed", "threads", "pd-duration",
  "pd-streams", "pd-interval", "pd-prompt-tokens", "pd-kv-blocks", "pd-gen-tokens", "keep-logs", "retry-503", "pd-min-blocks", "help"]);
for (const k of Object.keys(args)) {
  if (!known.has(k)) { console.error(`route_bench: unknown option --${k}`); process.exit(2); }
}
if (args.help) {
  console.log(fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n").filter((l) => l.startsWith("//")).map((l) => l.slice(3)).join("\n"));
  process.exit(0);
}
const exe = path.resolve(args.exe ?? path.join(ROOT, "build", "tessera"));
let modelDir = path.resolve(args.model ?? path.join(ROOT, "build", "route_model"));
const parts = (args.part ?? "route,pd").split(",");
const requests = Number(args.requests ?? 96), conc = Number(args.concurrency ?? 8);
const policies = (args.policies ?? "cache-aware,round-robin,random").split(",");
const basePort = Number(args["base-port"] ?? 18200);
const nServers = Number(args.servers ?? 4), nTenants = Number(args.tenants ?? 8);
const sysTokens = Number(args["system-tokens"] ?? 2000);
const kvBlocks = Number(args["kv-blocks"] ?? 420), maxSeqs = Number(args["max-seqs"] ?? 8);
const timeLimit = Number(args["time-limit"] ?? 240) * 1000;
const seed0 = Number(args.seed ?? 1);
const retry503 = Number(args["retry-503"] ?? 0);
const threads = Number(args.threads ?? Math.max(1, Math.floor(os.availableParallelism() / nServers)));
const pdDuration = Number(args["pd-duration"] ?? 60) * 1000, pdStreams = Number(args["pd-streams"] ?? 4);
const pdInterval = Number(args["pd-interval"] ?? 1.5) * 1000, pdPromptTokens = Number(args["pd-prompt-tokens"] ?? 2500);
const pdKvBlocks = Number(args["pd-kv-blocks"] ?? 1024), pdGenTokens = Number(args["pd-gen-tokens"] ?? 128);
const HOST = "127.0.0.1"; // loopback only: every address below is built from this
const logDir = fs.mkdtempSync(path.join(os.tmpdir(), "route_bench-"));

if (!fs.existsSync(exe)) { console.error(`route_bench: no ${exe}`); process.exit(2); }
if (!fs.existsSync(path.join(modelDir, "config.json"))) {
  if (args.model) { console.error(`route_bench: ${modelDir} has no config.json`); process.exit(2); }
  console.log(`route_bench: making ${modelDir} (bench/make_route_model.py)`);
  const r = spawnSync("/usr/bin/python3", [path.join(HERE, "make_route_model.py"), modelDir], { stdio: "inherit" });
  if (r.status !== 0) process.exit(2);
}

// ---- helpers ----
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
};
const mean = (a) => (a.length ? a.reduce((x, y) => x + y, 0) / a.length : NaN);
const ms = (v) => (Number.isFinite(v) ? `${v.toFixed(0)} ms` : "-");
function rng(seed) {
  let s = (seed >>> 0) || 1;
  return () => { // xorshift32: deterministic, independent streams per seed
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}
const WORDS = ("the of and to in is was for on that with as by at from his her an which or be are were this it not " +
  "but had have they you one all their we can policy ledger river copper signal orbit harbor meadow lantern " +
  "engine quartz summit velvet anchor canyon falcon garnet island jasmine kernel lumber marble nectar oyster " +
  "pepper quiver saddle timber umber violet walnut yonder zephyr account billing refund shipping warranty " +
  "invoice customer support escalate verify password network latency storage backup restore").split(" ");
// the tokenizer is about one token per character; a little more text than tokens
const text = (rand, nTok) => {
  let t = "";
  while (t.length < nTok * 1.03) t += (t ? " " : "") + WORDS[Math.floor(rand() * WORDS.length)];
  return t;
};
const code = (rand) => Array.from({ length: 8 }, () => "abcdefghijklmnopqrstuvwxyz"[Math.floor(rand() * 26)]).join("");

const procs = new Set();
function start(name, argv, env = {}) {
  const log = fs.openSync(path.join(logDir, `${name}.log`), "w");
  const p = spawn(exe, argv, { stdio: ["ignore", log, log], env: { ...process.env, ...env } });
  fs.closeSync(log);
  p.name = name;
  p.exited = new Promise((r) => p.on("exit", (code, sig) => { procs.delete(p); r({ code, sig }); }));
  procs.add(p);
  return p;
}
async function stop(list) {
  for (const p of list) if (p.exitCode === null && p.signalCode === null) p.kill("SIGTERM");
  for (const p of list) {
    const r = await Promise.race([p.exited, sleep(15000).then(() => null)]);
    if (!r) { console.log(`  ${p.name} did not stop in 15 s after SIGTERM; SIGKILL`); p.kill("SIGKILL"); await p.exited; }
  }
}
const cleanup = () => { for (const p of procs) try { p.kill("SIGKILL"); } catch { } };
process.on("exit", cleanup);
for (const s of ["SIGINT", "SIGTERM"]) process.on(s, () => { cleanup(); process.exit(130); });

async function waitHealthy(url, proc, want, limit = 60000) {
  const t0 = performance.now();
  let last = "";
  while (performance.now() - t0 < limit) {
    if (proc.exitCode !== null || proc.signalCode !== null)
      throw new Error(`${proc.name} exited (${proc.exitCode ?? proc.signalCode}); see ${logDir}/${proc.name}.log`);
    try {
      const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) });
      last = await r.text();
      if (r.ok && want(JSON.parse(last))) return JSON.parse(last);
    } catch (e) { last = String(e); }
    await sleep(200);
  }
  throw new Error(`${url}/health not ready after ${limit / 1000} s: ${last.slice(0, 300)}`);
}
const allHealthy = (n) => (h) => h.status === "ok" && (!h.servers || (h.servers.length === n && h.servers.every((s) => s.healthy)));

function startServer(name, port, blocks, extra = []) {
  return start(name, ["serve", "-m", modelDir, "--host", HOST, "--port", String(port), "--kv-blocks", String(blocks),
    "--max-seqs", String(maxSeqs), "--served-model-name", "bench", ...extra], { TS_NUM_THREADS: String(threads) });
}

// One streamed chat completion. Returns { ok, status, ttft, chunks: [t...],
// usage, server, error }; never throws.
async function chat(url, messages, maxTokens, signal, extra = {}) {
  const body = { model: "bench", messages, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true }, ...extra };
  const res = { ok: false, status: 0, ttft: NaN, chunks: [], usage: null, server: null, error: null, start: performance.now() };
  try {
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
    });
    res.status = r.status;
    res.server = r.headers.get("x-tessera-server");
    res.prefill = r.headers.get("x-tessera-prefill");
    if (!r.ok) { res.error = `HTTP ${r.status}: ${(await r.text()).slice(0, 300)}`; return res; }
    const dec = new TextDecoder();
    let buf = "", finished = false;
    for await (const part of r.body) {
      buf += dec.decode(part, { stream: true });
      let k;
      while ((k = buf.indexOf("\n\n")) >= 0) {
        const ev0 = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev0.startsWith("data: ")) continue; // keep-alive comments
        if (ev0 === "data: [DONE]") { finished = true; continue; }
        const ev = JSON.parse(ev0.slice(6));
        if (ev.error) { res.error = `SSE error: ${JSON.stringify(ev.error).slice(0, 300)}`; continue; }
        if (ev.usage) { res.usage = ev.usage; continue; }
        const c = ev.choices?.[0];
        const now = performance.now();
        if (c?.delta?.content) {
          if (!res.chunks.length) res.ttft = now - res.start;
          res.chunks.push(now);
        } else if (c?.finish_reason && Number.isNaN(res.ttft)) res.ttft = now - res.start; // nothing generated
      }
    }
    if (!finished && !res.error) res.error = "stream ended without [DONE]";
    res.ok = !res.error && !!res.usage;
    if (!res.error && !res.usage) res.error = "no usage in stream";
  } catch (e) {
    res.error = signal?.aborted ? "aborted (time limit)" : `${e.name}: ${e.message}${e.cause ? ` (${e.cause.code ?? e.cause.message})` : ""}`;
    res.aborted = !!signal?.aborted;
  }
  return res;
}

// how often the router took a server out of rotation (its log, after it stopped)
const flaps = (name) => {
  try { return (fs.readFileSync(path.join(logDir, `${name}.log`), "utf8").match(/is out of rotation/g) ?? []).length; } catch { return NaN; }
};

async function scrape(url) {
  try { return await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(3000) })).text(); } catch { return ""; }
}
const metric = (txt, name) => {
  const m = txt.match(new RegExp(`^${name.replace(/[{}"=|]/g, "\\$&")} ([0-9.eE+-]+)$`, "m"));
  return m ? Number(m[1]) : NaN;
};

// ---- part 1: policies ----
async function runPolicy(policy, pi) {
  const base = basePort + pi * 10;
  const urls = Array.from({ length: nServers }, (_, i) => `http://${HOST}:${base + i}`);
  const rport = base + nServers;
  const rurl = `http://${HOST}:${rport}`;
  const servers = urls.map((u, i) => startServer(`${policy}-s${i}`, base + i, kvBlocks));
  const all = [...servers];
  try {
    await Promise.all(servers.map((p, i) => waitHealthy(urls[i], p, (h) => h.status === "ok")));
    const router = start(`${policy}-router`, ["route", "--listen", `${HOST}:${rport}`, ...urls.flatMap((u) => ["--server", u]),
      "--policy", policy, "-m", modelDir, "--seed", "1"]);
    all.push(router);
    await waitHealthy(rurl, router, allHealthy(nServers));
    // warm the client and the servers with prompts shorter than a block (no shared prefix)
    await Promise.all(urls.map((u, i) => chat(u, [{ role: "user", content: `warm ${i}` }], 2)));

    // workload: the same for every policy (seeded)
    const rand = rng(seed0 * 7919 + 17);
    const tenants = Array.from({ length: nTenants }, (_, t) => {
      const tr = rng(seed0 * 1000 + t + 1);
      return `[${code(tr)}] You are the assistant of tenant ${t}. ` + text(tr, sysTokens - 40);
    });
    const order = Array.from({ length: requests }, (_, i) => i % nTenants);
    for (let i = order.length - 1; i > 0; i--) { const j = Math.floor(rand() * (i + 1)); [order[i], order[j]] = [order[j], order[i]]; }
    const qs = order.map((t, i) => ({ t, q: `Q${i}: ${text(rand, 14)}?` }));

    const results = [];
    const ctl = new AbortController();
    const t0 = performance.now();
    const timer = setTimeout(() => ctl.abort(), timeLimit);
    let next = 0, retried = 0;
    async function worker() {
      while (next < qs.length && !ctl.signal.aborted) {
        const { t, q } = qs[next++];
        const t1 = performance.now();
        let r, tries = 0;
        for (;;) { // --retry-503: the client waits out "no healthy server" answers
          r = await chat(rurl, [{ role: "system", content: tenants[t] }, { role: "user", content: q }], 16, ctl.signal);
          if (r.status !== 503 || tries >= retry503 || ctl.signal.aborted) break;
          tries++, retried++;
          await sleep(100);
        }
        if (r.ok) r.ttft += r.start - t1; // from the first try
        r.tenant = t;
        r.end = performance.now();
        results.push(r);
      }
    }
    await Promise.all(Array.from({ length: conc }, worker));
    clearTimeout(timer);
    const secs = (performance.now() - t0) / 1000;
    const m = await scrape(rurl);
    const ok = results.filter((r) => r.ok), bad = results.filter((r) => !r.ok && !r.aborted);
    const ttft = ok.map((r) => r.ttft);
    const sum = (f) => ok.reduce((a, r) => a + f(r), 0);
    const perServer = {}, tenantsAt = {};
    for (const r of ok) {
      const s = r.server ?? "?";
      perServer[s] = (perServer[s] ?? 0) + 1;
      (tenantsAt[s] ??= new Set()).add(r.tenant);
    }
    return {
      policy, done: ok.length, retried, errors: bad.length, aborted: results.filter((r) => r.aborted).length,
      notStarted: qs.length - results.length, secs, timedOut: ctl.signal.aborted,
      ttftMean: mean(ttft), ttftP50: pct(ttft, 50), ttftP90: pct(ttft, 90),
      tokS: sum((r) => r.usage.completion_tokens) / secs,
      prompt: sum((r) => r.usage.prompt_tokens), cached: sum((r) => r.usage.prompt_tokens_details?.cached_tokens ?? 0),
      firstError: bad[0]?.error,
      spread: urls.map((u) => `${perServer[u] ?? 0}/${tenantsAt[u]?.size ?? 0}`).join(" "),
      unknownServer: perServer["?"] ?? 0,
      predicted: metric(m, "tessera_router_predicted_hit_tokens_total"),
      routerPrompt: metric(m, "tessera_router_prompt_tokens_total"),
      reasons: ["prefix", "load", "round_robin", "random", "only", "retry"].map((k) => [k, metric(m, `tessera_router_decisions_total{reason="${k}"}`)])
        .filter(([, v]) => v > 0).map(([k, v]) => `${k}=${v}`).join(","),
      upstreamErrors: metric(m, "tessera_router_upstream_errors_total"),
      retries: metric(m, "tessera_router_retries_total"),
    };
  } finally {
    await stop(all);
  }
}

function table(rows, cols) {
  const w0 = Math.max(...rows.map((r) => r[0].length));
  const ws = cols.map((_, j) => Math.max(cols[j].length, ...rows.map((r) => String(r[j + 1]).length)));
  const line = (a, b) => `  ${a.padEnd(w0)}  ${b.map((x, j) => String(x).padStart(ws[j])).join("  ")}`;
  console.log(line("", cols));
  for (const r of rows) console.log(line(r[0], r.slice(1)));
}

async function partRoute() {
  console.log(`\n== routing policies: ${nServers} servers x ${kvBlocks} KV blocks (max-seqs ${maxSeqs}, ${threads} thread(s) each), ` +
    `${nTenants} tenants x ~${sysTokens}-token system prompts, ${requests} requests from ${conc} clients, ` +
    `max_tokens 16, limit ${timeLimit / 1000} s per policy`);
  const res = [];
  for (const [i, p] of policies.entries()) {
    process.stdout.write(`  ${p}: `);
    try {
      const r = await runPolicy(p, i);
      r.flaps = flaps(`${p}-router`);
      res.push(r);
      console.log(`${r.done} done, ${r.errors} errors in ${r.secs.toFixed(1)} s${r.timedOut ? " (time limit)" : ""}`);
    } catch (e) {
      console.log(`failed: ${e.message}`);
      res.push({ policy: p, failed: e.message });
    }
  }
  const ok = res.filter((r) => !r.failed);
  if (!ok.length) return;
  const f = (r, k) => r[k];
  table([
    ["requests done", ...ok.map((r) => `${r.done}/${requests}`)],
    ["errors", ...ok.map((r) => r.errors)],
    ["aborted/not started", ...ok.map((r) => `${r.aborted}/${r.notStarted}`)],
    ["wall time", ...ok.map((r) => `${r.secs.toFixed(1)} s`)],
    ["TTFT mean", ...ok.map((r) => ms(f(r, "ttftMean")))],
    ["TTFT p50", ...ok.map((r) => ms(f(r, "ttftP50")))],
    ["TTFT p90", ...ok.map((r) => ms(f(r, "ttftP90")))],
    ["output tokens/s", ...ok.map((r) => r.tokS.toFixed(1))],
    ["prefix-cache hit rate", ...ok.map((r) => `${(100 * r.cached / (r.prompt || 1)).toFixed(1)}%`)],
    ["router predicted hits", ...ok.map((r) => `${(100 * r.predicted / (r.routerPrompt || 1)).toFixed(1)}%`)],
    ["per server: requests/tenants", ...ok.map((r) => r.spread)],
    ["router decisions", ...ok.map((r) => r.reasons || "-")],
    ["client retries after 503", ...ok.map((r) => r.retried)],
    ["router retries/upstream errs", ...ok.map((r) => `${r.retries}/${r.upstreamErrors}`)],
    ["servers taken out of rotation", ...ok.map((r) => r.flaps)],
  ], ok.map((r) => r.policy));
  for (const r of ok) if (r.firstError) console.log(`  ${r.policy}: first error: ${r.firstError}`);
  for (const r of ok) if (r.unknownServer) console.log(`  ${r.policy}: ${r.unknownServer} responses without x-tessera-server`);
  const ca = ok.find((r) => r.policy === "cache-aware");
  if (!ca) return;
  for (const o of ok.filter((r) => r !== ca))
    console.log(`  cache-aware / ${o.policy}: mean TTFT ${(ca.ttftMean / o.ttftMean).toFixed(2)}x, p90 TTFT ${(ca.ttftP90 / o.ttftP90).toFixed(2)}x, ` +
      `tokens/s ${(ca.tokS / o.tokS).toFixed(2)}x`);
  const rr = ok.find((r) => r.policy === "round-robin");
  const hit = ca.cached / (ca.prompt || 1);
  console.log("  targets:");
  if (rr) console.log(`    cache-aware mean TTFT <= 0.5x round-robin: ${(ca.ttftMean / rr.ttftMean).toFixed(2)}x  ${ca.ttftMean <= 0.5 * rr.ttftMean ? "MET" : "NOT MET"}`);
  console.log(`    cache-aware prefix-cache hit rate >= 80%: ${(100 * hit).toFixed(1)}%  ${hit >= 0.8 ? "MET" : "NOT MET"}`);
}

// ---- part 2: prefill/decode disaggregation ----
async function runPd(kind, base) {
  const urls = [`http://${HOST}:${base}`, `http://${HOST}:${base + 1}`];
  const rport = base + 2, rurl = `http://${HOST}:${rport}`;
  const servers = kind === "pd"
    ? [startServer("pd-prefill", base, pdKvBlocks, ["--kv-peers", `${HOST}:${base + 3}`]),
      startServer("pd-decode", base + 1, pdKvBlocks, ["--kv-port", String(base + 3)])]
    : [startServer("load-s0", base, pdKvBlocks), startServer("load-s1", base + 1, pdKvBlocks)];
  const all = [...servers];
  try {
    await Promise.all(servers.map((p, i) => waitHealthy(urls[i], p, (h) => h.status === "ok")));
    const rargs = kind === "pd"
      ? ["--prefill", urls[0], "--decode", urls[1], ...(args["pd-min-blocks"] ? ["--pd-min-blocks", args["pd-min-blocks"]] : [])]
      : ["--server", urls[0], "--server", urls[1], "--policy", "load"];
    const router = start(`${kind}-router`, ["route", "--listen", `${HOST}:${rport}`, ...rargs, "-m", modelDir, "--seed", "1"]);
    all.push(router);
    await waitHealthy(rurl, router, allHealthy(2));
    await Promise.all(urls.map((u, i) => chat(u, [{ role: "user", content: `warm ${i}` }], 2)));

    const ctl = new AbortController();
    const t0 = performance.now();
    const until = t0 + pdDuration;
    const gens = [], longs = [];
    const rand = rng(seed0 * 31 + 5);
    let gi = 0;
    async function genStream(s) {
      while (performance.now() < until) {
        const r = await chat(rurl, [{ role: "user", content: `G${s}.${gi++}: ${text(rand, 12)}` }], pdGenTokens, ctl.signal, { ignore_eos: true });
        if (!r.aborted) gens.push(r);
        if (!r.ok) await sleep(100); // no hot loop on 503s
      }
    }
    async function longPrompts() {
      const inflight = [];
      for (let i = 0; performance.now() < until; i++) {
        const lr = rng(seed0 * 5000 + i + 1);
        const p = chat(rurl, [{ role: "user", content: `[${code(lr)}] ${text(lr, pdPromptTokens)}` }], 4, ctl.signal)
          .then((r) => { if (!r.aborted) longs.push(r); });
        inflight.push(p);
        const wake = t0 + (i + 1) * pdInterval;
        if (wake >= until) break;
        await sleep(wake - performance.now());
      }
      await Promise.all(inflight);
    }
    // requests still running 30 s after the end are cut off
    const hard = setTimeout(() => ctl.abort(), pdDuration + 30000);
    await Promise.all([...Array.from({ length: pdStreams }, (_, s) => genStream(s)), longPrompts()]);
    clearTimeout(hard);
    const secs = (performance.now() - t0) / 1000;
    const m = await scrape(rurl);
    const gaps = [];
    let chunks = 0, toks = 0;
    for (const r of gens.filter((r) => r.ok)) {
      for (let i = 1; i < r.chunks.length; i++) gaps.push(r.chunks[i] - r.chunks[i - 1]);
      chunks += r.chunks.length;
      toks += r.usage.completion_tokens;
    }
    const lok = longs.filter((r) => r.ok), lttft = lok.map((r) => r.ttft);
    const bad = [...gens, ...longs].filter((r) => !r.ok);
    const genErrors = gens.filter((r) => !r.ok).length, longErrors = longs.filter((r) => !r.ok).length;
    return {
      kind, secs, gens: gens.filter((r) => r.ok).length, longs: lok.length, longsSent: longs.length,
      errors: bad.length, genErrors, longErrors, firstError: bad[0]?.error,
      itl50: pct(gaps, 50), itl90: pct(gaps, 90), itl99: pct(gaps, 99), itlMax: gaps.length ? Math.max(...gaps) : NaN,
      tokPerChunk: toks / (chunks || 1), genTokS: toks / secs,
      lttftMean: mean(lttft), lttft50: pct(lttft, 50), lttft90: pct(lttft, 90), lttftMax: lttft.length ? Math.max(...lttft) : NaN,
      longCached: lok.reduce((a, r) => a + (r.usage.prompt_tokens_details?.cached_tokens ?? 0), 0),
      longPrompt: lok.reduce((a, r) => a + r.usage.prompt_tokens, 0),
      longWhere: [...new Set(lok.map((r) => `${r.prefill ? r.prefill.split(":").pop() + "->" : ""}${(r.server ?? "?").split(":").pop()}`))].join(" "),
      kvx: ["ok", "failed", "skipped"].map((k) => `${k}=${metric(m, `tessera_router_kv_transfers_total{status="${k}"}`)}`).join(","),
    };
  } finally {
    await stop(all);
  }
}

async function partPd() {
  console.log(`\n== prefill/decode disaggregation: ${pdStreams} long-generation streams (max_tokens ${pdGenTokens}) + ` +
    `a ~${pdPromptTokens}-token prompt (max_tokens 4) every ${pdInterval / 1000} s, ${pdDuration / 1000} s per config, ` +
    `${pdKvBlocks} KV blocks, ${threads} thread(s) per server` +
    (args["pd-min-blocks"] ? `, --pd-min-blocks ${args["pd-min-blocks"]}` : ""));
  const base = basePort + 100;
  const res = [];
  for (const [i, kind] of ["pd", "load"].entries()) {
    process.stdout.write(`  ${kind === "pd" ? "1 prefill + 1 decode" : "2 servers, policy load"}: `);
    try {
      const r = await runPd(kind, base + i * 10);
      r.flaps = flaps(`${kind}-router`);
      res.push(r);
      console.log(`${r.gens} generations, ${r.longs} long prompts, ${r.errors} errors in ${r.secs.toFixed(1)} s`);
    } catch (e) {
      console.log(`failed: ${e.message}`);
    }
  }
  if (!res.length) return;
  table([
    ["long generations done", ...res.map((r) => r.gens)],
    ["generated tokens/s", ...res.map((r) => r.genTokS.toFixed(1))],
    ["tokens per chunk", ...res.map((r) => r.tokPerChunk.toFixed(2))],
    ["inter-chunk p50", ...res.map((r) => ms(r.itl50))],
    ["inter-chunk p90", ...res.map((r) => ms(r.itl90))],
    ["inter-chunk p99", ...res.map((r) => ms(r.itl99))],
    ["inter-chunk max", ...res.map((r) => ms(r.itlMax))],
    ["long prompts done/sent", ...res.map((r) => `${r.longs}/${r.longsSent}`)],
    ["long-prompt TTFT mean", ...res.map((r) => ms(r.lttftMean))],
    ["long-prompt TTFT p50", ...res.map((r) => ms(r.lttft50))],
    ["long-prompt TTFT p90", ...res.map((r) => ms(r.lttft90))],
    ["long-prompt TTFT max", ...res.map((r) => ms(r.lttftMax))],
    ["long-prompt cached at decode", ...res.map((r) => `${(100 * r.longCached / (r.longPrompt || 1)).toFixed(1)}%`)],
    ["long prompts ran on (ports)", ...res.map((r) => r.longWhere || "-")],
    ["KV transfers", ...res.map((r) => r.kvx)],
    ["errors: generations/long prompts", ...res.map((r) => `${r.genErrors}/${r.longErrors}`)],
    ["servers taken out of rotation", ...res.map((r) => r.flaps)],
  ], res.map((r) => (r.kind === "pd" ? "prefill+decode" : "2x load")));
  for (const r of res) if (r.firstError) console.log(`  ${r.kind}: first error: ${r.firstError}`);
}

console.log(`route_bench: ${exe}, model ${modelDir}, logs in ${logDir}`);
try {
  if (parts.includes("route")) await partRoute();
  if (parts.includes("pd")) await partPd();
} finally {
  await stop([...procs]);
  if (!args["keep-logs"]) fs.rmSync(logDir, { recursive: true, force: true });
}
