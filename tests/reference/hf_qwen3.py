#!/usr/bin/python3
"""hf_qwen3.py DIR — writes small random Qwen3 models in Hugging Face's exact
layout (config.json as transformers writes it, model.safetensors or shards
with an index, the state_dict names) and, for each, the logits that the
PyTorch reference (tests/ref/nn_ref.py's qwen3_forward, written after
modeling_qwen3.py) gives for a batch of token ids:
  DIR/<case>/           the model folder
  DIR/<case>.ids        i64 (B, T), raw little-endian, B and T first (i64)
  DIR/<case>.logits     f32 (B, T, V), raw little-endian
  DIR/<case>.greedy     i64 [32]: greedy continuation of ids[0, :5]
Cases: GQA ratios 1, 2 and 4; tied and untied embeddings; head_dim unlike
hidden/heads; rope_theta 1e4 and 1e6; f32 and bf16 weights; one sharded."""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ref"))
from nn_ref import qwen3_forward  # noqa: E402

CASES = {
    # name: (V, C, L, H, KV, D, F, theta, tie, dtype, shards)
    "gqa2_untied": (97, 48, 2, 4, 2, 16, 80, 1e6, False, "float32", 1),
    "mha_tied": (64, 32, 2, 4, 4, 8, 64, 1e4, True, "float32", 1),
    "gqa4_sharded": (80, 64, 3, 8, 2, 8, 96, 1e6, False, "float32", 2),
    "bf16_tied": (97, 48, 2, 4, 2, 16, 80, 1e6, True, "bfloat16", 1),
}


def write_safetensors(path, tensors):
    """tensors: list of (name, torch tensor), written as safetensors does."""
    hdr, blobs, off = {}, [], 0
    for name, t in tensors:
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().tobytes()
            dt = "BF16"
        else:
            data = t.numpy().astype(np.float32).tobytes()
            dt = "F32"
        hdr[name] = {"dtype": dt, "shape": list(t.shape),
                     "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_expected(root, name, forward, ids, n_greedy):
    """The files a C test reads: DIR/<name>.ids (B, T first), .logits of
    forward(ids), and .greedy, n_greedy tokens after ids[0, :5] (argmax of
    a full recompute each step)."""
    B, T = ids.shape
    with torch.no_grad():
        logits = forward(ids).float()
        seq, new = ids[0:1, :5], []
        for _ in range(n_greedy):
            nxt = int(forward(seq)[0, -1].argmax())
            new.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    with open(os.path.join(root, name + ".ids"), "wb") as f:
        f.write(struct.pack("<qq", B, T) + ids.numpy().astype(np.int64).tobytes())
    logits.numpy().astype(np.float32).tofile(os.path.join(root, name + ".logits"))
    np.array(new, dtype=np.int64).tofile(os.path.join(root, name + ".greedy"))


def make(root, name, spec, seed):
    V, C, L, H, KV, D, Fi, theta, tie, dtype, shards = spec
    g = torch.Generator().manual_seed(seed)
    p = {}

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=g) * std

    p["model.embed_tokens.weight"] = rnd(V, C, std=0.5)
    for i in range(L):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = 1 + rnd(C)
        p[pre + "self_attn.q_proj.weight"] = rnd(H * D, C)
        p[pre + "self_attn.k_proj.weight"] = rnd(KV * D, C)
        p[pre + "self_attn.v_proj.weight"] = rnd(KV * D, C)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, H * D)
        p[pre + "self_attn.q_norm.weight"] = 1 + rnd(D)
        p[pre + "self_attn.k_norm.weight"] = 1 + rnd(D)
        p[pre + "post_attention_layernorm.weight"] = 1 + rnd(C)
        p[pre + "mlp.gate_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.up_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.down_proj.weight"] = rnd(C, Fi)
    p["model.norm.weight"] = 1 + rnd(C)
    if not tie:
        p["lm_head.weight"] = rnd(V, C, std=0.5)
    if dtype == "bfloat16":  # stored in bf16; the reference sees the same values
        p = {k: v.to(torch.bfloat16) for k, v in p.items()}
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "head_dim": D, "hidden_act": "silu", "hidden_size": C,
        "initializer_range": 0.02, "intermediate_size": Fi,
        "max_position_embeddings": 512, "max_window_layers": L,
        "model_type": "qwen3", "num_attention_heads": H,
        "num_hidden_layers": L, "num_key_value_heads": KV,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": theta,
        "sliding_window": None, "tie_word_embeddings": tie,
        "torch_dtype": dtype, "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": V,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    items = list(p.items())
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), items)
    else:
        half = len(items) // 2
        parts = [items[:half], items[half:]]
        wm = {}
        for s, part in enumerate(parts):
            fn = "model-%05d-of-%05d.safetensors" % (s + 1, len(parts))
            write_safetensors(os.path.join(d, fn), part)
            for k, _ in part:
                wm[k] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f, indent=2)
    # the reference, in f32 from the stored values
    pf = {k: v.float() for k, v in p.items()}
    B, T = 2, 11
    ids = torch.randint(0, V, (B, T), generator=g)
    cfgv = [V, C, L, H, KV, D, Fi, 1e-6, theta, 1.0 if tie else 0.0, 512]
    write_expected(root, name, lambda x: qwen3_forward(pf, cfgv, x, 0), ids, 32)


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for i, (name, spec) in enumerate(CASES.items()):
        make(root, name, spec, 1234 + i)
    # broken variants of one model, each wrong in one way
    src = os.path.join(root, "gqa2_untied")
    for bad in ("missing_tensor", "wrong_shape", "no_field", "unknown_type"):
        d = os.path.join(root, "bad_" + bad)
        os.makedirs(d, exist_ok=True)
        cfg = json.load(open(os.path.join(src, "config.json")))
        if bad == "no_field":
            del cfg["hidden_size"]
        if bad == "unknown_type":
            cfg["model_type"] = "mamba"
        if bad == "wrong_shape":
            cfg["intermediate_size"] = 81
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        data = open(os.path.join(src, "model.safetensors"), "rb").read()
        if bad == "missing_tensor":  # rewrite without model.norm.weight
            (n,) = struct.unpack("<Q", data[:8])
            hdr = json.loads(data[8:8 + n])
            body = data[8 + n:]
            keep = [(k, v) for k, v in hdr.items() if k not in ("__metadata__", "model.norm.weight")]
            out, blobs, off = {}, [], 0
            for k, v in sorted(keep, key=lambda kv: kv[1]["data_offsets"][0]):
                b0, b1 = v["data_offsets"]
                out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + b1 - b0]}
                blobs.append(body[b0:b1])
                off += b1 - b0
            h = json.dumps(out).encode()
            h += b" " * ((-len(h)) % 8)
            data = struct.pack("<Q", len(h)) + h + b"".join(blobs)
        open(os.path.join(d, "model.safetensors"), "wb").write(data)


if __name__ == "__main__":
    main()
