// loadgen.mjs — a load generator for any OpenAI-compatible server on this
// machine (loopback only): streamed completions from C concurrent clients,
// bounded by a request count and a duration; reports throughput, time to
// first token and inter-token latency percentiles.
//   node bench/loadgen.mjs --url http://127.0.0.1:8000 [--model NAME]
//        [--requests 64] [--concurrency 8] [--duration 120]
//        [--prompt-words 200] [--shared-words 0] [--max-tokens 64]
//        [--chat] [--seed 1]
// --shared-words: every prompt starts with the same words (a system
// prompt), the rest differs per request.
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]?.startsWith("--") || all[i + 1] === undefined ? "1" : all[i + 1]]);
  return acc;
}, []));
const url = args.url ?? "http://127.0.0.1:8000";
const host = new URL(url).hostname;
if (!["127.0.0.1", "localhost", "::1", "[::1]"].includes(host)) {
  console.error(`loadgen: ${host} is not a loopback address; refusing`);
  process.exit(2);
}
const requests = Number(args.requests ?? 64), conc = Number(args.concurrency ?? 8);
const duration = Number(args.duration ?? 120) * 1000, maxTokens = Number(args["max-tokens"] ?? 64);
const words = Number(args["prompt-words"] ?? 200), shared = Number(args["shared-words"] ?? 0);
const chat = args.chat === "1";
let seed = Number(args.seed ?? 1);
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const vocab = "the of and to in is was for on that with as by at from his her an which or be are were this it not but had have they you one all their we can".split(" ");
const text = (n) => Array.from({ length: n }, () => vocab[Math.floor(rand() * vocab.length)]).join(" ");
const prefix = text(shared);

let model = args.model;
if (!model) model = (await (await fetch(`${url}/v1/models`)).json()).data[0].id;

const ttft = [], itl = [], e2e = [];
let tokens = 0, done = 0, failed = 0, cached = 0, promptTokens = 0, firstError = null;
const t0 = performance.now();
const queue = Array.from({ length: requests }, (_, i) => i);

async function one() {
  const body = {
    model, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true,
  };
  const prompt = (prefix ? prefix + " " : "") + text(Math.max(1, words - shared));
  if (chat) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  const start = performance.now();
  const r = await fetch(`${url}/v1/${chat ? "chat/completions" : "completions"}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!r.ok) {
    failed++;
    const msg = await r.text();
    if (!firstError) firstError = `HTTP ${r.status}: ${msg.slice(0, 300)}`;
    return;
  }
  const dec = new TextDecoder();
  let buf = "", last = 0, first = true;
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const ev = JSON.parse(line.slice(6));
      if (ev.usage) {
        tokens += ev.usage.completion_tokens;
        promptTokens += ev.usage.prompt_tokens;
        cached += ev.usage.prompt_tokens_details?.cached_tokens ?? 0;
        continue;
      }
      const c = ev.choices?.[0];
      const piece = chat ? c?.delta?.content : c?.text;
      if (!piece) continue;
      const now = performance.now();
      if (first) { ttft.push(now - start); first = false; } else itl.push(now - last);
      last = now;
    }
  }
  e2e.push(performance.now() - start);
  done++;
}

async function worker() {
  while (queue.length && performance.now() - t0 < duration) {
    queue.shift();
    try { await one(); } catch (e) {
      failed++;
      if (!firstError) firstError = `${e?.message ?? e}${e?.cause ? ` (${e.cause.message ?? e.cause})` : ""}`;
    }
  }
}
await Promise.all(Array.from({ length: conc }, worker));
const secs = (performance.now() - t0) / 1000;
const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
};
const mean = (a) => a.reduce((x, y) => x + y, 0) / (a.length || 1);
const f = (ms) => (ms / 1000).toFixed(3);
console.log(`loadgen: ${done} requests (${failed} failed) from ${conc} clients in ${secs.toFixed(1)} s`);
console.log(`  throughput: ${(tokens / secs).toFixed(1)} generated tokens/s, ${(done / secs).toFixed(2)} requests/s`);
console.log(`  TTFT s: mean ${f(mean(ttft))} p50 ${f(pct(ttft, 50))} p90 ${f(pct(ttft, 90))} p99 ${f(pct(ttft, 99))}`);
console.log(`  ITL s:  mean ${f(mean(itl))} p50 ${f(pct(itl, 50))} p90 ${f(pct(itl, 90))} p99 ${f(pct(itl, 99))}`);
if (firstError) console.log(`  first failure: ${firstError}`);
console.log(`  prefix cache: ${cached} of ${promptTokens} prompt tokens reused (${(100 * cached / (promptTokens || 1)).toFixed(1)}%)`);
