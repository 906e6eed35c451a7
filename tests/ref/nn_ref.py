"""nn_ref.py — the PyTorch reference for tests/test_nn.c: Qwen3 written by
hand after Hugging Face's modeling_qwen3.py (RMSNorm in f32, q_norm/k_norm
per head before rotate-half RoPE, repeat_kv for grouped-query attention,
causal softmax attention), cross-entropy with ignore_index -100,
clip_grad_norm_, torch.optim.AdamW, and a linear layer with bias.

Usage: nn_ref.py IN OUT. Both files are sequences of records:
  u32 name length, name (utf-8), u32 dtype (0 f32, 1 i64, 2 f64),
  u32 ndim, i64 shape[ndim], row-major data (little-endian).
Names are "<case>/<key>". Case "A" and "B" are models: keys cfg (f64
[V, C, L, H, KV, D, F, eps, theta, tie, max_pos]), ids, targets,
param/<hf name>, and optionally hp (f64 [lr, beta1, beta2, eps, wd,
max_norm, steps, pos0]) with cgrad/<hf name> (the C side's gradients, which
clip_grad_norm_ and AdamW start from). Case "L" is a linear layer: x, w, b.
"""
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {0: np.float32, 1: np.int64, 2: np.float64}
CODES = {np.dtype(np.float32): 0, np.dtype(np.int64): 1,
         np.dtype(np.float64): 2}


def read_records(path):
    recs = {}
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode()
        off += n
        code, ndim = struct.unpack_from("<II", data, off)
        off += 8
        shape = struct.unpack_from("<%dq" % ndim, data, off)
        off += 8 * ndim
        dt = np.dtype(DTYPES[code])
        count = int(np.prod(shape)) if ndim else 1
        arr = np.frombuffer(data, dtype=dt, count=count, offset=off)
        off += count * dt.itemsize
        recs[name] = torch.from_numpy(arr.reshape(shape).copy())
    return recs


def write_records(path, recs):
    with open(path, "wb") as f:
        for name, t in recs.items():
            a = t.detach().contiguous().numpy()
            if a.dtype == np.float64:
                a = a.astype(np.float32)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", CODES[a.dtype], a.ndim))
            f.write(struct.pack("<%dq" % a.ndim, *a.shape))
            f.write(a.tobytes())


def rmsnorm(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    return w * x.to(dt)


def rope_tables(T, D, theta, pos0):
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64)
                                .float() / D))
    pos = torch.arange(pos0, pos0 + T, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    B, KV, T, D = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(B, KV, n_rep, T, D)
    return x.reshape(B, KV * n_rep, T, D)


def qwen3_forward(p, cfg, ids, pos0):
    V, C, L, H, KV, D, Fi = (int(v) for v in cfg[:7])
    eps, theta, tie = float(cfg[7]), float(cfg[8]), bool(cfg[9])
    B, T = ids.shape
    cos, sin = rope_tables(T, D, theta, pos0)
    mask = torch.full((T, T), float("-inf")).triu(1)
    x = p["model.embed_tokens.weight"][ids]  # (B, T, C)
    for i in range(L):
        pre = "model.layers.%d." % i
        h = rmsnorm(x, p[pre + "input_layernorm.weight"], eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(B, T, KV, D)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(B, T, KV, D)
        q = rmsnorm(q, p[pre + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = rmsnorm(k, p[pre + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, H // KV)
        v = repeat_kv(v, H // KV)
        s = (q @ k.transpose(2, 3)) * D ** -0.5 + mask
        a = torch.softmax(s, dim=-1, dtype=torch.float32) @ v  # (B, H, T, D)
        a = a.transpose(1, 2).reshape(B, T, H * D)
        x = x + a @ p[pre + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], eps)
        g = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
        u = h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (g * u) @ p[pre + "mlp.down_proj.weight"].T
    x = rmsnorm(x, p["model.norm.weight"], eps)
    lm = p["model.embed_tokens.weight"] if tie else p["lm_head.weight"]
    return x @ lm.T


def model_case(recs, case, out):
    pre = case + "/param/"
    names = [k[len(pre):] for k in recs if k.startswith(pre)]
    p = {n: recs[pre + n].clone().requires_grad_(True) for n in names}
    cfg = recs[case + "/cfg"].tolist()
    ids, targets = recs[case + "/ids"], recs[case + "/targets"]
    hp = recs.get(case + "/hp")
    logits = qwen3_forward(p, cfg, ids, 0)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           targets.reshape(-1), ignore_index=-100)
    loss.backward()
    out[case + "/logits"] = logits
    out[case + "/loss"] = loss.reshape(1)
    for n in names:
        out[case + "/grad/" + n] = p[n].grad.clone()  # clipped below
    if hp is None:
        return
    lr, b1, b2, eps, wd, max_norm, steps, pos0 = hp.tolist()
    with torch.no_grad():
        out[case + "/logits_pos"] = qwen3_forward(p, cfg, ids, int(pos0))
    # the optimizer runs on the C side's gradients (cgrad/), so that it is
    # checked apart from the small differences of the backward pass
    p = {n: recs[pre + n].clone().requires_grad_(True) for n in names}
    for n in names:
        p[n].grad = recs[case + "/cgrad/" + n].clone()
    params = [p[n] for n in names]
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    out[case + "/clip_norm"] = total.reshape(1)
    opt = torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps,
                            weight_decay=wd)
    for _ in range(int(steps)):
        opt.step()
    for n in names:
        out[case + "/adamw/" + n] = p[n].detach().clone()
        out[case + "/exp_avg_sq/" + n] = opt.state[p[n]]["exp_avg_sq"].clone()


def linear_case(recs, out):
    x = recs["L/x"].clone().requires_grad_(True)
    w = recs["L/w"].clone().requires_grad_(True)
    b = recs["L/b"].clone().requires_grad_(True)
    y = F.linear(x, w, b)
    (y * y).sum().backward()
    out["L/y"], out["L/gx"] = y, x.grad
    out["L/gw"], out["L/gb"] = w.grad, b.grad


def main():
    torch.set_num_threads(2)
    recs = read_records(sys.argv[1])
    out = {}
    for case in sorted({k.split("/")[0] for k in recs}):
        if case == "L":
            linear_case(recs, out)
        else:
            model_case(recs, case, out)
    write_records(sys.argv[2], out)


if __name__ == "__main__":
    main()
