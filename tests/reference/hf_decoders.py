#!/usr/bin/python3
"""hf_decoders.py DIR — Qwen2 and Llama models in Hugging Face's layout
with the logits and greedy continuations of a PyTorch reference written
after modeling_qwen2.py / modeling_llama.py (q/k/v biases in Qwen2; no
qk-norm in either; Llama 3.1's rope_scaling "llama3" in one case). Files as
hf_qwen3.py writes them: DIR/<case>/, <case>.ids, .logits, .greedy."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from hf_qwen3 import write_expected, write_safetensors  # noqa: E402

CASES = {
    # name: model_type, V, C, L, H, KV, D, F, theta, tie, llama3 scaling
    "qwen2_tied": ("qwen2", 90, 48, 2, 4, 2, 12, 80, 1e6, True, None),
    "llama_gqa4": ("llama", 70, 64, 2, 8, 2, 8, 96, 5e5, False, None),
    "llama3_scaled": ("llama", 70, 64, 2, 4, 4, 16, 96, 5e5, True,
                      {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


def inv_freq(D, theta, scaling):
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    if not scaling:
        return inv
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    wl = 2 * math.pi / inv
    out = torch.where(wl > low_wl, inv / factor, inv)
    smooth = (old / wl - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    mid = ~(wl < high_wl) & ~(wl > low_wl)
    return torch.where(mid, smoothed, out)


def rms(x, w, eps=1e-6):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(p, spec, ids):
    mt, V, C, L, H, KV, D, Fi, theta, tie, sc = spec
    B, T = ids.shape
    f = inv_freq(D, theta, sc)
    pos = torch.arange(T).float()
    emb = torch.cat([torch.outer(pos, f)] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), float("-inf")).triu(1)
    x = p["model.embed_tokens.weight"][ids]
    for i in range(L):
        pre = "model.layers.%d." % i
        h = rms(x, p[pre + "input_layernorm.weight"])

        def proj(name, n):
            y = h @ p[pre + "self_attn.%s.weight" % name].T
            b = p.get(pre + "self_attn.%s.bias" % name)
            if b is not None:
                y = y + b
            return y.view(B, T, n, D).transpose(1, 2)
        q, k, v = proj("q_proj", H), proj("k_proj", KV), proj("v_proj", KV)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        a = torch.softmax((q @ k.transpose(2, 3)) / math.sqrt(D) + mask, dim=-1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, H * D) @ p[pre + "self_attn.o_proj.weight"].T
        h = rms(x, p[pre + "post_attention_layernorm.weight"])
        g = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
        x = x + g @ p[pre + "mlp.down_proj.weight"].T
    x = rms(x, p["model.norm.weight"])
    return x @ (p["model.embed_tokens.weight"] if tie else p["lm_head.weight"]).T


def make(root, name, spec, seed):
    mt, V, C, L, H, KV, D, Fi, theta, tie, sc = spec
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, std=0.1: torch.randn(*s, generator=g) * std  # noqa: E731
    p = {"model.embed_tokens.weight": rnd(V, C, std=0.5)}
    for i in range(L):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = 1 + rnd(C)
        p[pre + "self_attn.q_proj.weight"] = rnd(H * D, C)
        if mt == "qwen2":
            p[pre + "self_attn.q_proj.bias"] = rnd(H * D)
        p[pre + "self_attn.k_proj.weight"] = rnd(KV * D, C)
        if mt == "qwen2":
            p[pre + "self_attn.k_proj.bias"] = rnd(KV * D)
        p[pre + "self_attn.v_proj.weight"] = rnd(KV * D, C)
        if mt == "qwen2":
            p[pre + "self_attn.v_proj.bias"] = rnd(KV * D)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, H * D)
        p[pre + "post_attention_layernorm.weight"] = 1 + rnd(C)
        p[pre + "mlp.gate_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.up_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.down_proj.weight"] = rnd(C, Fi)
    p["model.norm.weight"] = 1 + rnd(C)
    if not tie:
        p["lm_head.weight"] = rnd(V, C, std=0.5)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    arch = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[mt]
    cfg = {"architectures": [arch], "model_type": mt, "vocab_size": V, "hidden_size": C,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
           "intermediate_size": Fi, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
           "rope_theta": theta, "tie_word_embeddings": tie, "torch_dtype": "float32",
           "hidden_act": "silu", "rope_scaling": sc}
    if mt == "llama":
        cfg["head_dim"] = D
        cfg["attention_bias"] = False
    else:
        assert C // H == D  # Qwen2 has no head_dim field
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), list(p.items()))
    B, T = 2, 24  # past the 16 original positions of the scaled case
    ids = torch.randint(0, V, (B, T), generator=g)
    write_expected(root, name, lambda x: forward(p, spec, x), ids, 32)


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for i, (name, spec) in enumerate(CASES.items()):
        make(root, name, spec, 99 + i)


if __name__ == "__main__":
    main()
