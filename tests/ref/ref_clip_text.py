#!/usr/bin/python3
"""Small random-weight CLIPTextModel folders in Transformers' layout
(config.json as CLIPTextConfig writes it, model.safetensors with the real
tensor names under text_model.) and their last_hidden_state from a plain
PyTorch CLIPTextModel written here from the model's definition (pre-norm
layers, causal attention scaled by head_dim^-0.5, quick_gelu or gelu, the
final layer norm), for tests/test_clip_text.c. Into OUT (argv[1]):
  clip_quick/  hidden_act quick_gelu (SD 1.x), f32 weights
  clip_gelu/   hidden_act gelu (SD 2.x), f32 weights
  clip_bf16/   clip_quick's weights stored in BF16
  err_missing/ err_shape/ err_act/  one fault each
  ref.safetensors: for each model M and T in (77, 9): M.ids{T} (2, T)
  (i64 for 77, i32 for 9) and M.out{T} (2, T, C) f32; M.bf16w{T}: the
  output with the matrices rounded to bf16 (what a bf16 load keeps);
  M.allbf16{T}: with every tensor rounded (clip_bf16's file)."""
import json
import os
import struct
import sys

import numpy as np
import torch

V, C, I, L, H, P = 1000, 64, 128, 2, 4, 77
EPS = 1e-5


def config(act):
    return {
        "_name_or_path": "tiny-clip", "architectures": ["CLIPTextModel"],
        "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0,
        "eos_token_id": 2, "hidden_act": act, "hidden_size": C,
        "initializer_factor": 1.0, "initializer_range": 0.02,
        "intermediate_size": I, "layer_norm_eps": EPS,
        "max_position_embeddings": P, "model_type": "clip_text_model",
        "num_attention_heads": H, "num_hidden_layers": L, "pad_token_id": 1,
        "projection_dim": 32, "torch_dtype": "float32",
        "transformers_version": "4.25.0.dev0", "vocab_size": V,
    }


def weights(seed):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.08, mean=0.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * s + mean

    w = {"text_model.embeddings.token_embedding.weight": r(V, C, s=0.5),
         "text_model.embeddings.position_embedding.weight": r(P, C, s=0.2)}
    for i in range(L):
        p = f"text_model.encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            w[p + n + ".weight"] = r(C, s=0.1, mean=1.0)
            w[p + n + ".bias"] = r(C, s=0.1)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[p + "self_attn." + n + ".weight"] = r(C, C, s=C ** -0.5)
            w[p + "self_attn." + n + ".bias"] = r(C, s=0.05)
        w[p + "mlp.fc1.weight"] = r(I, C, s=C ** -0.5)
        w[p + "mlp.fc1.bias"] = r(I, s=0.05)
        w[p + "mlp.fc2.weight"] = r(C, I, s=I ** -0.5)
        w[p + "mlp.fc2.bias"] = r(C, s=0.05)
    w["text_model.final_layer_norm.weight"] = r(C, s=0.1, mean=1.0)
    w["text_model.final_layer_norm.bias"] = r(C, s=0.1)
    return {k: v.float() for k, v in w.items()}


def bf16_round(w):
    return {k: (v.to(torch.bfloat16).float() if v.dim() >= 2 else v)
            for k, v in w.items()}


def clip_text(w, act, ids):
    """CLIPTextModel's last_hidden_state, in f64"""
    w = {k: v.double() for k, v in w.items()}
    B, T = ids.shape
    h = w["text_model.embeddings.token_embedding.weight"][ids] + \
        w["text_model.embeddings.position_embedding.weight"][:T]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    D = C // H
    ln = torch.nn.functional.layer_norm
    for i in range(L):
        p = f"text_model.encoder.layers.{i}."
        x = ln(h, (C,), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], EPS)

        def proj(n, x=x):
            y = x @ w[p + f"self_attn.{n}.weight"].T + w[p + f"self_attn.{n}.bias"]
            return y.view(B, T, H, D).transpose(1, 2)
        q, k, v = proj("q_proj") * D ** -0.5, proj("k_proj"), proj("v_proj")
        a = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        h = h + a @ w[p + "self_attn.out_proj.weight"].T + w[p + "self_attn.out_proj.bias"]
        x = ln(h, (C,), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], EPS)
        x = x @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"]
        if act == "quick_gelu":
            x = x * torch.sigmoid(1.702 * x)
        else:
            x = torch.nn.functional.gelu(x)
        h = h + x @ w[p + "mlp.fc2.weight"].T + w[p + "mlp.fc2.bias"]
    h = ln(h, (C,), w["text_model.final_layer_norm.weight"],
           w["text_model.final_layer_norm.bias"], EPS)
    return h.float()


DT = {torch.float32: ("F32", np.float32), torch.int32: ("I32", np.int32),
      torch.int64: ("I64", np.int64)}


def tensor_bytes(t, bf16):
    if bf16 and t.dtype == torch.float32:
        u = t.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int16)
        return "BF16", u.tobytes()
    name, npdt = DT[t.dtype]
    return name, t.contiguous().numpy().astype(npdt).tobytes()


def write_st(path, tensors, bf16=False):
    hdr, blobs, off = {}, [], 0
    for name, t in tensors.items():
        dt, data = tensor_bytes(t, bf16)
        hdr[name] = {"dtype": dt, "shape": list(t.shape),
                     "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def folder(out, name, cfg, w, bf16=False):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_st(os.path.join(d, "model.safetensors"), w, bf16)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    ids = {77: torch.randint(0, V, (2, 77), generator=g, dtype=torch.int64),
           9: torch.randint(0, V, (2, 9), generator=g, dtype=torch.int64).int()}
    ids[77][:, 0] = 0  # bos, then padding with eos as SD 1.x does
    ids[77][0, 20:] = 2
    ref = {}
    for name, act, seed in (("clip_quick", "quick_gelu", 1), ("clip_gelu", "gelu", 2)):
        w = weights(seed)
        folder(out, name, config(act), w)
        for T, x in ids.items():
            ref[f"{name}.ids{T}"] = x
            ref[f"{name}.out{T}"] = clip_text(w, act, x.long())
            ref[f"{name}.bf16w{T}"] = clip_text(bf16_round(w), act, x.long())
            ref[f"{name}.allbf16{T}"] = clip_text(
                {k: v.to(torch.bfloat16).float() for k, v in w.items()}, act, x.long())
        if name == "clip_quick":
            folder(out, "clip_bf16", config(act), w, bf16=True)
            bad = dict(w)
            del bad["text_model.encoder.layers.1.mlp.fc2.weight"]
            folder(out, "err_missing", config(act), bad)
            bad = dict(w)
            bad["text_model.encoder.layers.0.self_attn.k_proj.weight"] = torch.zeros(C, C + 1)
            folder(out, "err_shape", config(act), bad)
            cfg = config(act)
            cfg["hidden_act"] = "swish"
            folder(out, "err_act", cfg, w)
    write_st(os.path.join(out, "ref.safetensors"), ref)


if __name__ == "__main__":
    main()
