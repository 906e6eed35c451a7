#!/usr/bin/python3
"""Writes small random-weight UNet2DConditionModel and AutoencoderKL folders
in Diffusers' exact layout (config.json with the real keys,
diffusion_pytorch_model.safetensors with the real tensor names) into DIR
(argv[1]), with the inputs and the outputs of plain PyTorch modules written
here from Diffusers' definitions (unet_2d_condition.py, unet_2d_blocks.py,
resnet.py, transformer_2d.py, attention.py, attention_processor.py,
autoencoder_kl.py, vae.py; no diffusers package): each block's output, the
whole model's, and the whole model's with the matrices and kernels rounded
to bf16. tests/test_unet_vae.c loads the folders and compares. Also writes
broken folders for the error checks."""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_grad_enabled(False)

# ---- the modules, named as Diffusers names their parameters ----


class ResnetBlock2D(nn.Module):
    def __init__(self, cin, cout, temb, groups, eps, scale=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        if temb:
            self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps, affine=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.conv_shortcut = nn.Conv2d(cin, cout, 1)
        self.scale = scale

    def forward(self, x, temb=None):
        h = self.conv1(F.silu(self.norm1(x)))
        if temb is not None:
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        sc = self.conv_shortcut(x) if hasattr(self, "conv_shortcut") else x
        return (sc + h) / self.scale


class Attention(nn.Module):
    """Diffusers' Attention, default processor, no norms on q/k."""

    def __init__(self, qdim, cdim, heads, dim_head, bias, group_norm=None):
        super().__init__()
        inner = heads * dim_head
        if group_norm:
            self.group_norm = nn.GroupNorm(group_norm, qdim, eps=1e-6)
        self.to_q = nn.Linear(qdim, inner, bias=bias)
        self.to_k = nn.Linear(cdim, inner, bias=bias)
        self.to_v = nn.Linear(cdim, inner, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, qdim), nn.Dropout(0.0)])
        self.heads, self.dim_head = heads, dim_head

    def forward(self, x, ctx=None):
        res = x
        four = x.ndim == 4
        if four:
            B, C, H, W = x.shape
            x = x.view(B, C, H * W).transpose(1, 2)
        if hasattr(self, "group_norm"):
            x = self.group_norm(x.transpose(1, 2)).transpose(1, 2)
        ctx = x if ctx is None else ctx
        q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx)
        B, T, _ = q.shape
        sp = lambda t: t.view(B, -1, self.heads, self.dim_head).transpose(1, 2)
        q, k, v = sp(q), sp(k), sp(v)
        a = torch.softmax(q @ k.transpose(-1, -2) * self.dim_head**-0.5, -1)
        o = (a @ v).transpose(1, 2).reshape(B, T, -1)
        o = self.to_out[0](o)
        if four:
            o = o.transpose(-1, -2).reshape(B, C, H, W)
            o = o + res  # residual_connection (VAE)
        return o


class GEGLU(nn.Module):
    def __init__(self, dim, inner):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)

    def forward(self, x):
        h, g = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(g)


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.ModuleList(
            [GEGLU(dim, 4 * dim), nn.Dropout(0.0), nn.Linear(4 * dim, dim)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, cross):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn1 = Attention(dim, dim, heads, dim_head, False)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.attn2 = Attention(dim, cross, heads, dim_head, False)
        self.norm3 = nn.LayerNorm(dim, eps=1e-5)
        self.ff = FeedForward(dim)

    def forward(self, x, ehs):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), ehs) + x
        return self.ff(self.norm3(x)) + x


class Transformer2DModel(nn.Module):
    def __init__(self, heads, dim_head, cin, layers, cross, groups, linear):
        super().__init__()
        inner = heads * dim_head
        self.norm = nn.GroupNorm(groups, cin, eps=1e-6, affine=True)
        self.linear = linear
        if linear:
            self.proj_in = nn.Linear(cin, inner)
            self.proj_out = nn.Linear(inner, cin)
        else:
            self.proj_in = nn.Conv2d(cin, inner, 1)
            self.proj_out = nn.Conv2d(inner, cin, 1)
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(inner, heads, dim_head, cross) for _ in range(layers)])

    def forward(self, x, ehs):
        B, C, H, W = x.shape
        res = x
        h = self.norm(x)
        if not self.linear:
            h = self.proj_in(h)
            inner = h.shape[1]
            h = h.permute(0, 2, 3, 1).reshape(B, H * W, inner)
        else:
            h = h.permute(0, 2, 3, 1).reshape(B, H * W, C)
            h = self.proj_in(h)
        for b in self.transformer_blocks:
            h = b(h, ehs)
        if not self.linear:
            h = h.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
            h = self.proj_out(h)
        else:
            h = self.proj_out(h)
            h = h.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        return h + res


class Downsample2D(nn.Module):
    def __init__(self, c, pad):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=pad)
        self.pad = pad

    def forward(self, x):
        if self.pad == 0:
            x = F.pad(x, (0, 1, 0, 1), mode="constant", value=0)
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class TimestepEmbedding(nn.Module):
    def __init__(self, cin, dim):
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


def timestep_embedding(t, dim, flip, shift, max_period=10000):
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32)
    exponent = exponent / (half - shift)
    emb = t[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return emb


class Block(nn.Module):
    pass


class UNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        boc = cfg["block_out_channels"]
        n = len(boc)
        lpb = cfg["layers_per_block"]
        lpb = [lpb] * n if isinstance(lpb, int) else lpb
        heads = cfg.get("num_attention_heads") or cfg["attention_head_dim"]
        heads = [heads] * n if isinstance(heads, int) else heads
        tl = cfg.get("transformer_layers_per_block", 1)
        tl = [tl] * n if isinstance(tl, int) else tl
        G, eps, cross = cfg["norm_num_groups"], cfg["norm_eps"], cfg["cross_attention_dim"]
        lin = cfg.get("use_linear_projection", False)
        T = 4 * boc[0]
        self.conv_in = nn.Conv2d(cfg["in_channels"], boc[0], 3, padding=1)
        self.time_embedding = TimestepEmbedding(boc[0], T)
        self.down_blocks = nn.ModuleList()
        out = boc[0]
        for i, kind in enumerate(cfg["down_block_types"]):
            inp, out = out, boc[i]
            b = Block()
            b.resnets = nn.ModuleList(
                [ResnetBlock2D(inp if j == 0 else out, out, T, G, eps) for j in range(lpb[i])])
            if kind == "CrossAttnDownBlock2D":
                b.attentions = nn.ModuleList(
                    [Transformer2DModel(heads[i], out // heads[i], out, tl[i], cross, G, lin)
                     for _ in range(lpb[i])])
            if i < n - 1:
                b.downsamplers = nn.ModuleList(
                    [Downsample2D(out, cfg.get("downsample_padding", 1))])
            self.down_blocks.append(b)
        top = boc[-1]
        ms = cfg.get("mid_block_scale_factor", 1)
        self.mid_block = Block()
        self.mid_block.resnets = nn.ModuleList(
            [ResnetBlock2D(top, top, T, G, eps, ms), ResnetBlock2D(top, top, T, G, eps, ms)])
        self.mid_block.attentions = nn.ModuleList(
            [Transformer2DModel(heads[-1], top // heads[-1], top, tl[-1], cross, G, lin)])
        self.up_blocks = nn.ModuleList()
        rb, rh, rl, rt = boc[::-1], heads[::-1], lpb[::-1], tl[::-1]
        out = rb[0]
        for i, kind in enumerate(cfg["up_block_types"]):
            prev, out = out, rb[i]
            inp = rb[min(i + 1, n - 1)]
            nl = rl[i] + 1
            b = Block()
            b.resnets = nn.ModuleList()
            for j in range(nl):
                skip = inp if j == nl - 1 else out
                rin = prev if j == 0 else out
                b.resnets.append(ResnetBlock2D(rin + skip, out, T, G, eps))
            if kind == "CrossAttnUpBlock2D":
                b.attentions = nn.ModuleList(
                    [Transformer2DModel(rh[i], out // rh[i], out, rt[i], cross, G, lin)
                     for _ in range(nl)])
            if i < n - 1:
                b.upsamplers = nn.ModuleList([Upsample2D(out)])
            self.up_blocks.append(b)
        self.conv_norm_out = nn.GroupNorm(G, boc[0], eps=eps)
        self.conv_out = nn.Conv2d(boc[0], cfg["out_channels"], 3, padding=1)

    def forward(self, sample, t, ehs):
        cfg = self.cfg
        outs = []
        if cfg.get("center_input_sample"):
            sample = 2 * sample - 1.0
        te = timestep_embedding(t, self.conv_in.out_channels, cfg.get("flip_sin_to_cos", True),
                                cfg.get("freq_shift", 0))
        emb = self.time_embedding(te)
        x = self.conv_in(sample)
        skips = [x]
        outs.append(x)
        for b in self.down_blocks:
            for j, r in enumerate(b.resnets):
                x = r(x, emb)
                if hasattr(b, "attentions"):
                    x = b.attentions[j](x, ehs)
                skips.append(x)
            if hasattr(b, "downsamplers"):
                x = b.downsamplers[0](x)
                skips.append(x)
            outs.append(x)
        m = self.mid_block
        x = m.resnets[0](x, emb)
        x = m.attentions[0](x, ehs)
        x = m.resnets[1](x, emb)
        outs.append(x)
        for b in self.up_blocks:
            for j, r in enumerate(b.resnets):
                x = torch.cat([x, skips.pop()], dim=1)
                x = r(x, emb)
                if hasattr(b, "attentions"):
                    x = b.attentions[j](x, ehs)
            if hasattr(b, "upsamplers"):
                x = b.upsamplers[0](x)
            outs.append(x)
        x = self.conv_out(F.silu(self.conv_norm_out(x)))
        outs.append(x)
        return x, outs


class MidBlock2D(nn.Module):
    def __init__(self, C, G, attn):
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResnetBlock2D(C, C, 0, G, 1e-6), ResnetBlock2D(C, C, 0, G, 1e-6)])
        if attn:
            self.attentions = nn.ModuleList([Attention(C, C, 1, C, True, group_norm=G)])

    def forward(self, x):
        x = self.resnets[0](x)
        if hasattr(self, "attentions"):
            x = self.attentions[0](x)
        return self.resnets[1](x)


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, G, lpb = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        n = len(boc)
        self.conv_in = nn.Conv2d(cfg["in_channels"], boc[0], 3, padding=1)
        self.down_blocks = nn.ModuleList()
        out = boc[0]
        for i in range(n):
            inp, out = out, boc[i]
            b = Block()
            b.resnets = nn.ModuleList(
                [ResnetBlock2D(inp if j == 0 else out, out, 0, G, 1e-6) for j in range(lpb)])
            if i < n - 1:
                b.downsamplers = nn.ModuleList([Downsample2D(out, 0)])
            self.down_blocks.append(b)
        self.mid_block = MidBlock2D(boc[-1], G, cfg.get("mid_block_add_attention", True))
        self.conv_norm_out = nn.GroupNorm(G, boc[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(boc[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x, outs):
        x = self.conv_in(x)
        outs.append(x)
        for b in self.down_blocks:
            for r in b.resnets:
                x = r(x)
            if hasattr(b, "downsamplers"):
                x = b.downsamplers[0](x)
            outs.append(x)
        x = self.mid_block(x)
        outs.append(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, G, lpb = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        n = len(boc)
        self.conv_in = nn.Conv2d(cfg["latent_channels"], boc[-1], 3, padding=1)
        self.mid_block = MidBlock2D(boc[-1], G, cfg.get("mid_block_add_attention", True))
        self.up_blocks = nn.ModuleList()
        rb = boc[::-1]
        out = rb[0]
        for i in range(n):
            prev, out = out, rb[i]
            b = Block()
            b.resnets = nn.ModuleList(
                [ResnetBlock2D(prev if j == 0 else out, out, 0, G, 1e-6) for j in range(lpb + 1)])
            if i < n - 1:
                b.upsamplers = nn.ModuleList([Upsample2D(out)])
            self.up_blocks.append(b)
        self.conv_norm_out = nn.GroupNorm(G, boc[0], eps=1e-6)
        self.conv_out = nn.Conv2d(boc[0], cfg["out_channels"], 3, padding=1)

    def forward(self, z, outs):
        x = self.conv_in(z)
        outs.append(x)
        x = self.mid_block(x)
        outs.append(x)
        for b in self.up_blocks:
            for r in b.resnets:
                x = r(x)
            if hasattr(b, "upsamplers"):
                x = b.upsamplers[0](x)
            outs.append(x)
        x = self.conv_out(F.silu(self.conv_norm_out(x)))
        outs.append(x)
        return x


class AutoencoderKL(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        L2 = 2 * cfg["latent_channels"]
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        if cfg.get("use_quant_conv", True):
            self.quant_conv = nn.Conv2d(L2, L2, 1)
        if cfg.get("use_post_quant_conv", True):
            self.post_quant_conv = nn.Conv2d(L2 // 2, L2 // 2, 1)

    def encode(self, x):
        outs = []
        h = self.encoder(x, outs)
        if hasattr(self, "quant_conv"):
            h = self.quant_conv(h)
        outs.append(h)
        mean, logvar = torch.chunk(h, 2, dim=1)
        return mean, torch.clamp(logvar, -30.0, 20.0), outs

    def decode(self, z):
        outs = []
        if hasattr(self, "post_quant_conv"):
            z = self.post_quant_conv(z)
        return self.decoder(z, outs), outs


# ---- weights and files ----


def randomize(model, seed):
    """Torch's default init (not zero for conv_out), norms and biases moved
    off their defaults so that every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)
        is_norm = "norm" in leaf[0].rsplit(".", 1)[-1]
        if is_norm and leaf[1] == "weight":
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        elif leaf[1] == "bias":
            p.copy_(0.1 * torch.randn(p.shape, generator=g))


def bf16_round(model):
    """a copy whose matrices and kernels are rounded to bf16, as Tessera
    keeps them with dtype TS_BF16 (vectors stay f32)"""
    import copy
    m = copy.deepcopy(model)
    for _, p in m.named_parameters():
        if p.ndim >= 2:
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return m


def write_st(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().to(torch.float32).numpy())
        b = a.tobytes()
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_component(d, cls, cfg, sd):
    os.makedirs(d, exist_ok=True)
    full = {"_class_name": cls, "_diffusers_version": "0.30.0"}
    full.update(cfg)
    with open(f"{d}/config.json", "w") as f:
        json.dump(full, f, indent=2)
    write_st(f"{d}/diffusion_pytorch_model.safetensors", sd)


def unet_config(**kw):
    cfg = {
        "sample_size": 16, "in_channels": 4, "out_channels": 4,
        "center_input_sample": False, "flip_sin_to_cos": True, "freq_shift": 0,
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
        "only_cross_attention": False, "block_out_channels": [32, 64],
        "layers_per_block": 1, "downsample_padding": 1, "mid_block_scale_factor": 1,
        "dropout": 0.0, "act_fn": "silu", "norm_num_groups": 8, "norm_eps": 1e-5,
        "cross_attention_dim": 32, "transformer_layers_per_block": 1,
        "encoder_hid_dim": None, "encoder_hid_dim_type": None,
        "attention_head_dim": 4, "num_attention_heads": None,
        "dual_cross_attention": False, "use_linear_projection": False,
        "class_embed_type": None, "addition_embed_type": None,
        "addition_time_embed_dim": None, "num_class_embeds": None,
        "upcast_attention": False, "resnet_time_scale_shift": "default",
        "resnet_skip_time_act": False, "resnet_out_scale_factor": 1.0,
        "time_embedding_type": "positional", "time_embedding_dim": None,
        "time_embedding_act_fn": None, "timestep_post_act": None,
        "time_cond_proj_dim": None, "conv_in_kernel": 3, "conv_out_kernel": 3,
        "projection_class_embeddings_input_dim": None, "attention_type": "default",
        "class_embeddings_concat": False, "mid_block_only_cross_attention": None,
        "cross_attention_norm": None, "addition_embed_type_num_heads": 64,
    }
    cfg.update(kw)
    return cfg


UNETS = {
    # SD 1.x style: 1x1 conv projections, one head count
    "unet_a": unet_config(),
    # SD 2.x style: linear projections, head counts per block, two
    # transformer layers, 16 groups, centered input, cos/sin unflipped
    "unet_b": unet_config(layers_per_block=2, norm_num_groups=16, use_linear_projection=True,
                          attention_head_dim=[2, 4], transformer_layers_per_block=2,
                          center_input_sample=True, flip_sin_to_cos=False, freq_shift=1),
    # three levels, scaled mid block, padding-0 downsamplers
    "unet_c": unet_config(block_out_channels=[32, 32, 64],
                          down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                            "DownBlock2D"],
                          up_block_types=["UpBlock2D", "CrossAttnUpBlock2D",
                                          "CrossAttnUpBlock2D"],
                          mid_block_scale_factor=1.5, downsample_padding=0, attention_head_dim=2),
}


def vae_config(**kw):
    cfg = {
        "in_channels": 3, "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
        "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
        "block_out_channels": [16, 32], "layers_per_block": 1, "act_fn": "silu",
        "latent_channels": 4, "norm_num_groups": 8, "sample_size": 32,
        "scaling_factor": 0.18215, "shift_factor": None, "latents_mean": None,
        "latents_std": None, "force_upcast": True, "use_quant_conv": True,
        "use_post_quant_conv": True, "mid_block_add_attention": True,
    }
    cfg.update(kw)
    return cfg


VAES = {
    "vae_a": vae_config(),
    "vae_b": vae_config(block_out_channels=[16, 32, 32], layers_per_block=2,
                        down_block_types=["DownEncoderBlock2D"] * 3,
                        up_block_types=["UpDecoderBlock2D"] * 3, scaling_factor=0.13025,
                        use_quant_conv=False, use_post_quant_conv=False),
    "vae_c": vae_config(mid_block_add_attention=False),
}


def legacy_names(sd):
    """the attention names of checkpoints Diffusers converts at load"""
    ren = {".to_q.": ".query.", ".to_k.": ".key.", ".to_v.": ".value.",
           ".to_out.0.": ".proj_attn."}
    out = {}
    for k, v in sd.items():
        for a, b in ren.items():
            if "mid_block.attentions" in k:
                k = k.replace(a, b)
        out[k] = v
    return out


def main():
    root = sys.argv[1]
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    B, S = 2, 7
    for k, (name, cfg) in enumerate(UNETS.items()):
        torch.manual_seed(100 + k)
        m = UNet(cfg)
        randomize(m, 200 + k)
        sd = m.state_dict()
        write_component(f"{root}/{name}", "UNet2DConditionModel", cfg, sd)
        g = torch.Generator().manual_seed(300 + k)
        sample = torch.randn(B, cfg["in_channels"], 16, 16, generator=g)
        t = torch.tensor([999.0, 17.5])
        ehs = torch.randn(B, S, cfg["cross_attention_dim"], generator=g)
        out, outs = m(sample, t, ehs)
        out16, _ = bf16_round(m)(sample, t, ehs)
        io = {"sample": sample, "timestep": t, "ehs": ehs, "out": out, "out_bf16": out16}
        for j, o in enumerate(outs):
            io[f"block.{j}"] = o
        write_st(f"{root}/{name}.io.safetensors", io)
        print(name, "blocks", len(outs), "max|out|", float(out.abs().max()))
    for k, (name, cfg) in enumerate(VAES.items()):
        torch.manual_seed(400 + k)
        m = AutoencoderKL(cfg)
        randomize(m, 500 + k)
        sd = m.state_dict()
        write_component(f"{root}/{name}", "AutoencoderKL", cfg, sd)
        g = torch.Generator().manual_seed(600 + k)
        f = 2 ** (len(cfg["block_out_channels"]) - 1)
        image = torch.rand(B, 3, 32, 32, generator=g) * 2 - 1
        z = torch.randn(B, 4, 32 // f, 32 // f, generator=g)
        mean, logvar, eouts = m.encode(image)
        dec, douts = m.decode(z)
        m16 = bf16_round(m)
        mean16, logvar16, _ = m16.encode(image)
        dec16, _ = m16.decode(z)
        io = {"image": image, "z": z, "mean": mean, "logvar": logvar, "dec": dec,
              "mean_bf16": mean16, "logvar_bf16": logvar16, "dec_bf16": dec16}
        for j, o in enumerate(eouts):
            io[f"enc.{j}"] = o
        for j, o in enumerate(douts):
            io[f"dec.{j}"] = o
        write_st(f"{root}/{name}.io.safetensors", io)
        if name == "vae_a":
            write_component(f"{root}/vae_legacy", "AutoencoderKL", cfg, legacy_names(sd))
        print(name, "max|dec|", float(dec.abs().max()), "max|mean|", float(mean.abs().max()))
    # broken folders, each wrong in one way (from unet_a)
    torch.manual_seed(100)
    cfg = UNETS["unet_a"]
    sd = UNet(cfg).state_dict()
    os.makedirs(f"{root}/err_no_weights")
    shutil.copy(f"{root}/unet_a/config.json", f"{root}/err_no_weights/config.json")
    bad = dict(cfg)
    bad["down_block_types"] = ["CrossAttnDownBlock2D", "SimpleCrossAttnDownBlock2D"]
    write_component(f"{root}/err_block_type", "UNet2DConditionModel", bad, sd)
    wrong = dict(sd)
    wrong["down_blocks.0.resnets.0.conv1.weight"] = torch.zeros(32, 32, 3, 1)
    write_component(f"{root}/err_shape", "UNet2DConditionModel", cfg, wrong)
    missing = {k: v for k, v in sd.items() if k != "mid_block.attentions.0.proj_out.bias"}
    write_component(f"{root}/err_missing", "UNet2DConditionModel", cfg, missing)
    bad = dict(cfg)
    bad["resnet_time_scale_shift"] = "scale_shift"
    write_component(f"{root}/err_scale_shift", "UNet2DConditionModel", bad, sd)
    bad = dict(VAES["vae_a"])
    bad["up_block_types"] = ["UpDecoderBlock2D", "AttnUpDecoderBlock2D"]
    torch.manual_seed(400)
    write_component(f"{root}/err_vae_block_type", "AutoencoderKL", bad,
                    AutoencoderKL(VAES["vae_a"]).state_dict())


if __name__ == "__main__":
    main()
