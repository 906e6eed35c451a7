#!/usr/bin/python3
"""check_train_ckpt.py TESSERA DIR — `tessera train` against PyTorch, step by
step. A tiny Qwen3 (tied and untied, compiled and eager) trains 4 steps on
a data folder of exactly 3 windows with batch 3, so every step sees all of
them (in some order, which a mean does not see) and PyTorch knows each
batch. From each saved checkpoint (model.safetensors + optimizer.safetensors)
the reference (tests/ref/nn_ref.py's qwen3_forward, after modeling_qwen3.py)
computes the next step's loss and gradient norm, which must be the ones in
log.jsonl, and then one step of clipping (torch.nn.utils.clip_grad_norm_)
and AdamW as PyTorch does it at that step's warmup+cosine rate, which must
give the next checkpoint's weights and moments. Last, `tessera logits` on
the final checkpoint equals PyTorch's logits (to 1e-4 of the scale)."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ref"))
from nn_ref import qwen3_forward  # noqa: E402

V, C, L, H, KV, D, FF, T = 64, 32, 2, 2, 1, 16, 64, 12
LR, MIN_LR, WARMUP, STEPS, WD, B1, B2, EPS, CLIP = 1e-2, 1e-3, 2, 4, 0.1, 0.9, 0.95, 1e-8, 1.0


def load_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
        out[k] = torch.tensor(a.copy())
    return out


def write_shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<IIIIQQ", 0x4B545354, 1, 2, 0, len(ids), 0))
        f.write(np.array(ids, dtype=np.uint16).tobytes())


def lr_at(step):  # 0-based step index, as train.c's lr_at (cosine)
    s = step + 1
    if s < WARMUP:
        return LR * s / WARMUP
    if s >= STEPS:
        return MIN_LR
    p = (s - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * p))


def read_log(d):
    return {j["step"]: j for j in map(json.loads, open(os.path.join(d, "log.jsonl")))}


def close(what, got, want, rtol, atol):
    err = (got - want).abs() - rtol * want.abs()
    worst = float(err.max())
    assert worst <= atol, "%s: off by %.3g (max |got - want| %.3g)" % (
        what, worst, float((got - want).abs().max()))


def check_run(exe, root, name, tie, eager):
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    data = os.path.join(d, "data")
    os.makedirs(data)
    g = torch.Generator().manual_seed(7 if tie else 8)
    tokens = torch.randint(0, V, (3 * T + 1,), generator=g).tolist()
    write_shard(os.path.join(data, "train_000.bin"), tokens)
    ids = torch.tensor([tokens[w * T:w * T + T] for w in range(3)])
    targets = torch.tensor([tokens[w * T + 1:w * T + T + 1] for w in range(3)])
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
           "hidden_size": C, "intermediate_size": FF, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": tie, "torch_dtype": "float32"}
    cfg_path = os.path.join(d, "config.json")
    json.dump(cfg, open(cfg_path, "w"))
    out = os.path.join(d, "out")
    args = [exe, "train", "--model-config", cfg_path, "--data", data, "--out", out,
            "--batch", "3", "--seq", str(T), "--steps", str(STEPS), "--save-every", "1",
            "--keep-last", "0",
            "--lr", str(LR), "--min-lr", str(MIN_LR), "--warmup", str(WARMUP),
            "--weight-decay", str(WD), "--clip", str(CLIP), "--seed", "11",
            "--peak-gflops", "1", "--quiet", "--eager" if eager else "--compile"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    log = read_log(out)
    assert sorted(log) == list(range(1, STEPS + 1)), log
    cfgv = [V, C, L, H, KV, D, FF, 1e-6, 10000.0, 1.0 if tie else 0.0, 64]
    assert any(log[k]["grad_norm"] > CLIP for k in range(2, STEPS + 1)), log  # clips
    for k in range(1, STEPS):
        ck = os.path.join(out, "step_%06d" % k)
        p = load_safetensors(os.path.join(ck, "model.safetensors"))
        opt = load_safetensors(os.path.join(ck, "optimizer.safetensors"))
        assert ("lm_head.weight" in p) == (not tie), sorted(p)
        state = json.load(open(os.path.join(ck, "trainer_state.json")))
        assert state["step"] == k and state["loader_position"] == 3 * k, state
        # step k + 1: the loss and gradient norm of these weights
        w = {n: t.clone().requires_grad_(True) for n, t in p.items()}
        logits = qwen3_forward(w, cfgv, ids, 0)
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        loss.backward()
        want = log[k + 1]
        assert abs(float(loss) - want["loss"]) <= 1e-5 * abs(want["loss"]) + 2e-6, \
            (name, k + 1, float(loss), want["loss"])
        grads = {n: t.grad for n, t in w.items()}
        gnorm = float(torch.sqrt(sum((gr.double() ** 2).sum() for gr in grads.values())))
        assert abs(gnorm - want["grad_norm"]) <= 1e-4 * gnorm + 2e-6, \
            (name, k + 1, gnorm, want["grad_norm"])
        torch.nn.utils.clip_grad_norm_(list(w.values()), CLIP)
        # AdamW at step t = k + 1, as torch.optim.AdamW (every parameter decays)
        lr, t = lr_at(k), k + 1
        nxt = os.path.join(out, "step_%06d" % (k + 1))
        p2 = load_safetensors(os.path.join(nxt, "model.safetensors"))
        opt2 = load_safetensors(os.path.join(nxt, "optimizer.safetensors"))
        for n, t0 in p.items():
            gr = w[n].grad
            m = opt["exp_avg." + n] * B1 + gr * (1 - B1)
            v = opt["exp_avg_sq." + n] * B2 + gr * gr * (1 - B2)
            denom = (v.sqrt() / math.sqrt(1 - B2 ** t)) + EPS
            new = t0 * (1 - lr * WD) - (lr / (1 - B1 ** t)) * m / denom
            close("%s step %d %s" % (name, t, n), p2[n], new, 1e-5, 2e-6)
            close("%s step %d exp_avg.%s" % (name, t, n), opt2["exp_avg." + n], m, 1e-4, 1e-7)
            close("%s step %d exp_avg_sq.%s" % (name, t, n), opt2["exp_avg_sq." + n], v,
                  1e-4, 1e-9)
    # the final checkpoint through `tessera logits`
    last = os.path.join(out, "step_%06d" % STEPS)
    p = load_safetensors(os.path.join(last, "model.safetensors"))
    probe = torch.randint(0, V, (1, 20), generator=g)
    with torch.no_grad():
        want = qwen3_forward(p, cfgv, probe, 0)[0]
    npy = os.path.join(d, "logits.npy")
    r = subprocess.run([exe, "logits", "-m", last, "--ids", ",".join(map(str, probe[0].tolist())),
                        "--out", npy], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = torch.tensor(np.load(npy))
    err = float((got - want).abs().max() / want.abs().max())
    assert got.shape == want.shape and err <= 1e-4, (got.shape, err)
    shutil.rmtree(d)
    return err


def main():
    exe, root = sys.argv[1], sys.argv[2]
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(1)
    e1 = check_run(exe, root, "tied_compiled", True, False)
    e2 = check_run(exe, root, "untied_eager", False, True)
    print("check_train_ckpt: 2 runs x %d steps follow PyTorch (loss, grad norm, clipped "
          "AdamW); logits within %.1e of the scale" % (STEPS - 1, max(e1, e2)))


if __name__ == "__main__":
    main()
