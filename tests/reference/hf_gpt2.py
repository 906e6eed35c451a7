#!/usr/bin/python3
"""hf_gpt2.py DIR — random GPT-2 models in Hugging Face's layout (Conv1D
weights (in, out), fused c_attn, learned positions, tied LM head; one with
GPT2LMHeadModel's "transformer." names, one with GPT2Model's bare names
plus the attn.bias mask buffer old checkpoints carry) and the logits and
greedy continuation of a PyTorch reference written after modeling_gpt2.py
(gelu_new). Files as hf_qwen3.py writes them."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from hf_qwen3 import write_expected, write_safetensors  # noqa: E402

CASES = {"gpt2_prefixed": (81, 48, 2, 4, 64, True), "gpt2_bare": (65, 32, 3, 2, 40, False)}


def forward(p, spec, ids):
    V, C, L, H, NP, _ = spec
    D = C // H
    B, T = ids.shape
    x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T)]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(L):
        pre = "h.%d." % i
        h = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5)
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
        a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(D) + mask, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5)
        f = F.gelu(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate="tanh")
        x = x + f @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].T


def make(root, name, spec, seed):
    V, C, L, H, NP, prefixed = spec
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, std=0.2: torch.randn(*s, generator=g) * std  # noqa: E731
    p = {"wte.weight": rnd(V, C, std=0.5), "wpe.weight": rnd(NP, C)}
    for i in range(L):
        pre = "h.%d." % i
        p[pre + "ln_1.weight"], p[pre + "ln_1.bias"] = 1 + rnd(C), rnd(C)
        p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"] = rnd(C, 3 * C), rnd(3 * C)
        p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"] = rnd(C, C), rnd(C)
        p[pre + "ln_2.weight"], p[pre + "ln_2.bias"] = 1 + rnd(C), rnd(C)
        p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"] = rnd(C, 4 * C), rnd(4 * C)
        p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"] = rnd(4 * C, C), rnd(C)
    p["ln_f.weight"], p["ln_f.bias"] = 1 + rnd(C), rnd(C)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    items = [(("transformer." + k) if prefixed else k, v) for k, v in p.items()]
    if prefixed:
        items.append(("lm_head.weight", p["wte.weight"]))
    else:
        items.append(("h.0.attn.bias", torch.tril(torch.ones(NP, NP)).view(1, 1, NP, NP)))
    write_safetensors(os.path.join(d, "model.safetensors"), items)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_embd": C, "n_layer": L, "n_head": H, "n_positions": NP, "n_ctx": NP,
           "n_inner": None, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    B, T = 2, 17
    ids = torch.randint(0, V, (B, T), generator=g)
    write_expected(root, name, lambda x: forward(p, spec, x), ids, 20)


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for i, (name, spec) in enumerate(CASES.items()):
        make(root, name, spec, 7 + i)


if __name__ == "__main__":
    main()
