#!/usr/bin/python3
"""A plain PyTorch DiTTransformer2DModel (Diffusers' dit_transformer_2d.py,
BasicTransformerBlock with norm_type "ada_norm_zero", PatchEmbed with the
2-D sin-cos table, CombinedTimestepLabelEmbeddings, AdaLayerNormZero),
written from those definitions, for tests/test_dit.c.

  ref_dit.py OUT_DIR   writes small random-weight component folders in
                       Diffusers' layout (config.json with its keys,
                       diffusion_pytorch_model.safetensors with its names)
                       and, in each, ref.safetensors: the inputs, the
                       output, and the gradients of loss = sum(out * loss_w)
                       with respect to a few parameters

The reference runs in float64 except the sinusoidal timestep projection,
which Diffusers computes in float32 (as Tessera does)."""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_files import write as st_write  # noqa: E402

DT = torch.float64


def sincos_1d(dim, pos):
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    omega = 1.0 / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_2d(dim, gh, gw, base_size, interpolation_scale=1.0):
    """get_2d_sincos_pos_embed(dim, (gh, gw), base_size=...)"""
    grid_h = np.arange(gh, dtype=np.float64) / (gh / base_size) / interpolation_scale
    grid_w = np.arange(gw, dtype=np.float64) / (gw / base_size) / interpolation_scale
    grid = np.meshgrid(grid_w, grid_h)  # w goes first
    grid = np.stack(grid, axis=0).reshape([2, 1, gw, gh])
    emb_h = sincos_1d(dim // 2, grid[0])
    emb_w = sincos_1d(dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)  # (gh gw, dim)


def timestep_proj(t, dim=256, flip=True, shift=1.0, max_period=10000):
    """get_timestep_embedding, in float32 as Diffusers runs it"""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32)
    exponent = exponent / (half - shift)
    emb = torch.exp(exponent)
    emb = t.float()[:, None] * emb[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return emb


def linear(x, P, name):
    y = x @ P[name + ".weight"].T
    if name + ".bias" in P:
        y = y + P[name + ".bias"]
    return y


def layer_norm(x, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)


def dit_forward(P, cfg, x, t, y):
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    D, p = heads * hd, cfg["patch_size"]
    L, eps = cfg["num_layers"], cfg.get("norm_eps", 1e-5)
    cout = cfg.get("out_channels") or cfg["in_channels"]
    B, C, H, W = x.shape
    gh, gw = H // p, W // p
    h = torch.nn.functional.conv2d(x, P["pos_embed.proj.weight"],
                                   P["pos_embed.proj.bias"], stride=p)
    h = h.flatten(2).transpose(1, 2)
    base = cfg["sample_size"] // p
    pos = torch.from_numpy(sincos_2d(D, gh, gw, base)).float().to(DT)
    h = h + pos[None]
    tproj = timestep_proj(t).to(DT)
    emb0 = None
    for b in range(L):
        pre = f"transformer_blocks.{b}."
        te = linear(tproj, P, pre + "norm1.emb.timestep_embedder.linear_1")
        te = linear(torch.nn.functional.silu(te), P,
                    pre + "norm1.emb.timestep_embedder.linear_2")
        ce = P[pre + "norm1.emb.class_embedder.embedding_table.weight"][y]
        emb = te + ce
        if b == 0:
            emb0 = emb
        mod = linear(torch.nn.functional.silu(emb), P, pre + "norm1.linear")
        sh_msa, sc_msa, g_msa, sh_mlp, sc_mlp, g_mlp = mod.chunk(6, dim=1)
        n = layer_norm(h, 1e-6) * (1 + sc_msa[:, None]) + sh_msa[:, None]
        q = linear(n, P, pre + "attn1.to_q").view(B, -1, heads, hd).transpose(1, 2)
        k = linear(n, P, pre + "attn1.to_k").view(B, -1, heads, hd).transpose(1, 2)
        v = linear(n, P, pre + "attn1.to_v").view(B, -1, heads, hd).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, -1, D)
        a = linear(a, P, pre + "attn1.to_out.0")
        h = h + g_msa[:, None] * a
        n = layer_norm(h, eps) * (1 + sc_mlp[:, None]) + sh_mlp[:, None]
        f = linear(n, P, pre + "ff.net.0.proj")
        f = torch.nn.functional.gelu(f, approximate="tanh")
        f = linear(f, P, pre + "ff.net.2")
        h = h + g_mlp[:, None] * f
    shift, scale = linear(torch.nn.functional.silu(emb0), P, "proj_out_1").chunk(2, dim=1)
    h = layer_norm(h, 1e-6) * (1 + scale[:, None]) + shift[:, None]
    h = linear(h, P, "proj_out_2")
    h = h.reshape(B, gh, gw, p, p, cout)
    h = torch.einsum("nhwpqc->nchpwq", h)
    return h.reshape(B, cout, gh * p, gw * p)


def param_shapes(cfg):
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    p, C = cfg["patch_size"], cfg["in_channels"]
    cout = cfg.get("out_channels") or C
    nc = cfg["num_embeds_ada_norm"]
    bias = cfg.get("attention_bias", True)
    s = {"pos_embed.proj.weight": (D, C, p, p), "pos_embed.proj.bias": (D,)}
    for b in range(cfg["num_layers"]):
        pre = f"transformer_blocks.{b}."
        s[pre + "norm1.emb.timestep_embedder.linear_1.weight"] = (D, 256)
        s[pre + "norm1.emb.timestep_embedder.linear_1.bias"] = (D,)
        s[pre + "norm1.emb.timestep_embedder.linear_2.weight"] = (D, D)
        s[pre + "norm1.emb.timestep_embedder.linear_2.bias"] = (D,)
        s[pre + "norm1.emb.class_embedder.embedding_table.weight"] = (nc + 1, D)
        s[pre + "norm1.linear.weight"] = (6 * D, D)
        s[pre + "norm1.linear.bias"] = (6 * D,)
        for m in ("to_q", "to_k", "to_v"):
            s[pre + f"attn1.{m}.weight"] = (D, D)
            if bias:
                s[pre + f"attn1.{m}.bias"] = (D,)
        s[pre + "attn1.to_out.0.weight"] = (D, D)
        s[pre + "attn1.to_out.0.bias"] = (D,)
        s[pre + "ff.net.0.proj.weight"] = (4 * D, D)
        s[pre + "ff.net.0.proj.bias"] = (4 * D,)
        s[pre + "ff.net.2.weight"] = (D, 4 * D)
        s[pre + "ff.net.2.bias"] = (D,)
    s["proj_out_1.weight"] = (2 * D, D)
    s["proj_out_1.bias"] = (2 * D,)
    s["proj_out_2.weight"] = (p * p * cout, D)
    s["proj_out_2.bias"] = (p * p * cout,)
    return s


def f32_item(name, a):
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    return (name, "F32", list(a.shape), a.tobytes())


def config(**kw):
    c = {"_class_name": "DiTTransformer2DModel", "_diffusers_version": "0.30.0",
         "activation_fn": "gelu-approximate", "attention_bias": True,
         "attention_head_dim": 8, "dropout": 0.0, "in_channels": 4,
         "norm_elementwise_affine": False, "norm_eps": 1e-5,
         "norm_num_groups": 32, "norm_type": "ada_norm_zero",
         "num_attention_heads": 2, "num_embeds_ada_norm": 10, "num_layers": 2,
         "out_channels": None, "patch_size": 2, "sample_size": 8,
         "upcast_attention": False}
    c.update(kw)
    return c


GRAD_NAMES = ["pos_embed.proj.weight", "transformer_blocks.0.attn1.to_q.weight",
              "transformer_blocks.1.norm1.linear.weight",
              "transformer_blocks.0.norm1.emb.class_embedder.embedding_table.weight",
              "transformer_blocks.1.ff.net.0.proj.bias", "proj_out_1.weight",
              "proj_out_2.weight"]


def write_case(out, name, cfg, H, W, B, seed):
    g = torch.Generator().manual_seed(seed)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    P = {}
    items = []
    for k, shp in param_shapes(cfg).items():
        fan = shp[-1] if len(shp) > 1 else 8
        if len(shp) == 4:
            fan = shp[1] * shp[2] * shp[3]
        scale = 1.0 / math.sqrt(fan) if len(shp) > 1 else 0.1
        w = (torch.randn(shp, generator=g) * scale).float()
        items.append(f32_item(k, w.numpy()))
        P[k] = w.to(DT)
    st_write(os.path.join(d, "diffusion_pytorch_model.safetensors"), items,
             meta={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    C = cfg["in_channels"]
    x = torch.randn(B, C, H, W, generator=g).float()
    t = torch.tensor([999.0, 500.5, 1.0, 250.0, 37.0][:B])
    y = torch.tensor([0, cfg["num_embeds_ada_norm"], 3, 1, 2][:B])
    for k in GRAD_NAMES:
        if k in P:
            P[k].requires_grad_(True)
    out_t = dit_forward(P, cfg, x.to(DT), t, y)
    wts = torch.randn(out_t.shape, generator=g).float()
    loss = (out_t * wts.to(DT)).sum()
    loss.backward()
    ref = [f32_item("x", x.numpy()), f32_item("t", t.numpy()),
           ("y", "I64", [B], y.numpy().astype(np.int64).tobytes()),
           f32_item("out", out_t.detach().numpy()), f32_item("loss_w", wts.numpy()),
           f32_item("loss", np.array([loss.item()]))]
    for k in GRAD_NAMES:
        if k in P:
            ref.append(f32_item("grad." + k, P[k].grad.numpy()))
    st_write(os.path.join(d, "ref.safetensors"), ref)


def write_all(out):
    os.makedirs(out, exist_ok=True)
    # patch 2, learn_sigma (out = 2 in), square input at sample_size
    write_case(out, "dit_p2_sigma", config(out_channels=8), 8, 8, 4, 1)
    # patch 4, out = in, a non-square input (the table recomputed for it)
    write_case(out, "dit_p4", config(patch_size=4, in_channels=1, sample_size=16,
                                     num_attention_heads=4, attention_head_dim=4,
                                     num_embeds_ada_norm=62, num_layers=3),
               16, 8, 5, 2)
    # attention without q/k/v biases
    write_case(out, "dit_nobias", config(attention_bias=False, in_channels=2),
               8, 8, 3, 3)


if __name__ == "__main__":
    write_all(sys.argv[1])
