// trained_tokenizer.mjs TESSERA WORK_DIR — a tokenizer trained by
// `tessera tokenizer-train` (byte-level BPE, vocabulary 1000) on the GPL-3
// text every Debian system has is read by a tokenizer we did not write,
// the JavaScript one of @lenml/tokenizers (transformers.js), and both
// encode the same strings to the same ids: every line of the text, the
// whole text, paragraphs, unicode, whitespace runs, numbers, contractions,
// emoji, the end-of-text token. Ours come from `tessera tokenize`. The
// JavaScript side decodes its ids back to the string; ours decodes too.
// Bad options exit 2; an unreadable input names the file.
import { TokenizerLoader } from "@lenml/tokenizers";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, existsSync } from "node:fs";
import assert from "node:assert/strict";

const [exe, workArg] = process.argv.slice(2);
const work = `${workArg}/trained_tokenizer`;
const corpus = "/usr/share/common-licenses/GPL-3";
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });

const run = (...args) => spawnSync(exe, args, { encoding: "utf8", maxBuffer: 1 << 26 });

// training: the vocabulary asked, reported on stderr
const dir = `${work}/tok`;
let r = run("tokenizer-train", "--vocab", "1000", "--out", dir, corpus);
assert.equal(r.status, 0, r.stderr);
assert.match(r.stderr, /vocabulary 1000 -> /);
const tokenizerJSON = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
const tokenizerConfig = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
assert.equal(Object.keys(tokenizerJSON.model.vocab).length, 1000);
assert.equal(tokenizerJSON.added_tokens[0].content, "<|endoftext|>");
assert.equal(tokenizerJSON.added_tokens[0].id, 999);
assert.equal(tokenizerConfig.eos_token, "<|endoftext|>");
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });

// the same input, the same tokenizer.json: the same tokenizer.json bytes
r = run("tokenizer-train", "--vocab", "1000", "--out", `${work}/tok2`, corpus);
assert.equal(r.status, 0, r.stderr);
assert.equal(readFileSync(`${work}/tok2/tokenizer.json`, "utf8"),
  readFileSync(`${dir}/tokenizer.json`, "utf8"));

const text = readFileSync(corpus, "utf8");
const lines = text.split("\n").filter((l) => l.length > 0);
const paragraphs = text.split("\n\n").slice(0, 40);
const varied = [
  "Hello world",
  " leading space, trailing space ",
  "don't can't won't it's we'll they're I'm you've he'd DON'T It'S",
  "numbers: 0 7 42 123 1234 12345 3.14159 -17 1,000,000 2024-12-03 0x1F",
  "tabs\tand\t\ttabs, newlines\n\n\nand  double  spaces    four",
  "   \n  \t \r\n trailing whitespace   \n",
  "café naïve Zürich résumé façade Ωmega über",
  "日本語のテキスト, 中文文本, 한국어 텍스트",
  "Αθήνα Москва القاهرة עברית हिन्दी ไทย",
  "emoji 🙂😀👍🏽🇫🇷 family 👨‍👩‍👧 flags 🏳️‍🌈 keycap 1️⃣",
  "math ∑∫√∞ ≤ ≥ ≠ ± × ÷ ½ ¾ → ← ↔",
  "quotes “curly” ‘single’ «guillemets» — dashes – …",
  "code: for (int i = 0; i < n; i++) { x[i] += y[i] * 2; }",
  "URL https://www.gnu.org/licenses/gpl-3.0.html?x=1&y=2#frag",
  "MiXeD CaSe WORDS and ALLCAPS GNU GPL",
  "a", " ", "\n", "  ", "'", "'s", "''", "0",
  "the end of a text<|endoftext|>and the next one",
  "<|endoftext|>",
  "THE PROGRAM IS PROVIDED \"AS IS\" WITHOUT WARRANTY OF ANY KIND",
];
const strings = [...varied, ...lines.slice(0, 60), ...paragraphs.slice(0, 12), text];

function ours(s) {
  const o = run("tokenize", "-m", dir, s);
  assert.equal(o.status, 0, `${JSON.stringify(s.slice(0, 80))}: ${o.signal} ${o.error} ${o.stderr}`);
  return JSON.parse(o.stdout);
}

let compared = 0;
for (const s of strings) {
  const js = Array.from(tok.encode(s, { add_special_tokens: false }));
  const c = ours(s);
  assert.deepEqual(c, js, `ids differ for ${JSON.stringify(s.slice(0, 120))}`);
  assert.equal(tok.decode(js, { skip_special_tokens: false }), s);
  compared++;
}
// the whole text in far fewer tokens than bytes: merges were learned
const whole = ours(text);
assert.ok(whole.length * 3 < Buffer.byteLength(text), `${whole.length} tokens`);
assert.ok(whole.every((id) => id >= 0 && id < 1000));

// our decoder gives the strings back too (tokenize --decode prints a newline)
for (const s of [varied[6], varied[9], lines[3], "don't 12345"]) {
  const d = run("tokenize", "-m", dir, "--decode", ours(s).join(","));
  assert.equal(d.status, 0, d.stderr);
  assert.equal(d.stdout, s + "\n");
}

// bad options and inputs
r = run("tokenizer-train", "--vocab", "100", "--out", `${work}/bad`, corpus);
assert.equal(r.status, 2, r.stderr);
assert.match(r.stderr, /bad or incomplete option "--vocab"/);
r = run("tokenizer-train", "--vocab", "1000", corpus);
assert.equal(r.status, 2, r.stderr);
r = run("tokenizer-train", "--vocab", "1000", "--out", `${work}/bad`, `${work}/absent.txt`);
assert.equal(r.status, 1);
assert.match(r.stderr, /absent\.txt/);
assert.ok(!existsSync(`${work}/bad/tokenizer.json`));

rmSync(work, { recursive: true, force: true });
console.log(`trained_tokenizer: ${compared} strings encode alike in C and JavaScript`);
