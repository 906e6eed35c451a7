#!/usr/bin/python3
"""bench_gpt2_run.py [--exe A] [--exe B] ... — GPT-2 small's shape (n_embd
768, 12 layers, 12 heads, vocab 50257, n_positions 1024; random weights,
f32, tied head) written once in Hugging Face's layout to
build/bench-gpt2/, then `tessera run` generating 128 tokens after a
512-token prompt, greedy, with each executable in turn (two rounds,
alternating, best of each), for prefill and decode tokens/s side by side.
Default: ./build/tessera alone. What issue 17's "no regression" for GPT-2
decode is measured with (the old GPT-2 code against the one decoder).
The tokenizer is make_route_model.py's (printable ASCII, one token per
character, so the prompt is 512 characters) padded with filler entries to
the model's 50257 ids."""
import json
import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
from hf_qwen3 import write_safetensors  # noqa: E402
from make_route_model import tokenizer  # noqa: E402

C, L, H, V, P = 768, 12, 12, 50257, 1024


def make(d):
    if os.path.exists(os.path.join(d, "config.json")):
        return
    os.makedirs(d, exist_ok=True)
    tok, _, _ = tokenizer()
    vocab = tok["model"]["vocab"]  # every id the model can emit decodes
    for i in range(len(vocab) + 1, V):
        vocab["~~%d" % i] = i
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    g = torch.Generator().manual_seed(17)

    def rn(*shape):
        return 0.02 * torch.randn(*shape, generator=g)
    p = [("wte.weight", rn(V, C)), ("wpe.weight", rn(P, C))]
    for i in range(L):
        pre = "h.%d." % i
        p += [(pre + "ln_1.weight", torch.ones(C)), (pre + "ln_1.bias", torch.zeros(C)),
              (pre + "attn.c_attn.weight", rn(C, 3 * C)), (pre + "attn.c_attn.bias", torch.zeros(3 * C)),
              (pre + "attn.c_proj.weight", rn(C, C)), (pre + "attn.c_proj.bias", torch.zeros(C)),
              (pre + "ln_2.weight", torch.ones(C)), (pre + "ln_2.bias", torch.zeros(C)),
              (pre + "mlp.c_fc.weight", rn(C, 4 * C)), (pre + "mlp.c_fc.bias", torch.zeros(4 * C)),
              (pre + "mlp.c_proj.weight", rn(4 * C, C)), (pre + "mlp.c_proj.bias", torch.zeros(C))]
    p += [("ln_f.weight", torch.ones(C)), ("ln_f.bias", torch.zeros(C))]
    write_safetensors(os.path.join(d, "model.safetensors"), p)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_embd": C, "n_layer": L, "n_head": H, "n_positions": P, "n_ctx": P,
           "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "torch_dtype": "float32"}  # no eos: every run generates all 128
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def run(exe, d):
    prompt = ("In the beginning was the Word, and the Word was with God. " * 10)[:512]
    r = subprocess.run([exe, "run", "-m", d, "-p", prompt, "-n", "128", "--temperature", "0"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        sys.exit("%s: %s" % (exe, r.stderr))
    pf = re.search(r"prompt: (\d+) tokens .*?\(([\d.]+) tokens/s\)", r.stderr)
    gen = re.search(r"generation: (\d+) tokens .*?\(([\d.]+) tokens/s\)", r.stderr)
    if not pf or not gen:
        sys.exit("%s: no speeds in %r" % (exe, r.stderr))
    return float(pf.group(2)), float(gen.group(2)), int(pf.group(1)), int(gen.group(1))


def main():
    exes = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--exe"]
    exes = exes or [os.path.join(ROOT, "build", "tessera")]
    d = os.path.join(ROOT, "build", "bench-gpt2")
    make(d)
    best = {e: [0.0, 0.0] for e in exes}
    for _ in range(2):
        for e in exes:
            pf, dc, n_p, n_g = run(e, d)
            best[e] = [max(best[e][0], pf), max(best[e][1], dc)]
    print("GPT-2 small shape (f32), prompt %d tokens, %d generated, greedy; best of 2" % (n_p, n_g))
    base = exes[0]
    for e in exes:
        print("%-40s prefill %8.1f tokens/s (x%.2f)  decode %7.2f tokens/s (x%.2f)"
              % (e, best[e][0], best[e][0] / best[base][0], best[e][1], best[e][1] / best[base][1]))


if __name__ == "__main__":
    main()
