#!/usr/bin/python3
"""render.py RESULTS.jsonl OUT.md [--source DIR] [--build TEXT] — the
compatibility table (docs/COMPATIBILITY.md) from test_compat's results:
family x check, pass/fail with the measured error, the machine and commit
that produced it, and what each check means. Run by CTest after
test_compat, so `make test` refreshes it."""
import argparse
import json
import os
import platform
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

CASES = {
    "gpt2": "GPT-2: learned positions, LayerNorm, fused Conv1D c_attn (in, out), gelu_new, tied head",
    "llama": "Llama: GQA 4:2, head_dim 16, rope_theta 5e5, untied",
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--build", default="")
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
    commit = sh("git", "-C", a.source, "rev-parse", "--short", "HEAD") or "unknown"
    if sh("git", "-C", a.source, "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    n_pass = sum(r["pass"] for r in rows)
    out = ["# Compatibility matrix", "",
           "Every causal-LM family through the one decoder, against a plain-PyTorch reference "
           "written from Hugging Face Transformers' modeling code (tests/compat/ref_models.py) "
           "on tiny random models in Hugging Face's exact layout (tests/compat/make_models.py). "
           "Written by tests/compat/render.py from test_compat's results; `make test` refreshes "
           "it.", "",
           "Produced on %s, commit %s%s. %d of %d checks pass." %
           (machine(), commit, (", build: " + a.build) if a.build else "", n_pass, len(rows)),
           ""]
    extra = sorted({r["check"] for r in rows} - {c for c, _ in CHECKS})
    checks = [c for c, _ in CHECKS] + extra
    out.append("| case | model_type | " + " | ".join(checks) + " |")
    out.append("|---|---|" + "---|" * len(checks))
    for c in cases:
        fam = next(r["family"] for r in rows if r["case"] == c)
        cells = [fmt(by[(c, k)]) if (c, k) in by else "not run" for k in checks]
        out.append("| %s | %s | %s |" % (c, fam, " | ".join(cells)))
    out += ["", "## The checks", ""]
    out += ["- **%s**: %s." % (c, d) for c, d in CHECKS]
    out += ["", "## The cases", ""]
    out += ["- **%s**: %s." % (c, CASES.get(c, "")) for c in cases]
    fails = [r for r in rows if not r["pass"]]
    if fails:
        out += ["", "## Failures", ""]
        out += ["- %s / %s: %s" % (r["case"], r["check"], r["note"].replace("|", "\\|"))
                for r in fails]
    notes = [r for r in rows if r["pass"] and r["note"] and r["check"] == "logits_bf16"]
    if notes:
        out += ["", "## bf16 detail", ""]
        out += ["- %s: %s" % (r["case"], r["note"]) for r in notes]
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("render.py: %d of %d checks pass -> %s" % (n_pass, len(rows), a.out))


if __name__ == "__main__":
    main()
