#!/usr/bin/env python3
"""train_torch.py — the PyTorch side of bench/bench_train.c (issue 6): the
same models and training step as Tessera's, in f32 on 2 threads.

Models (written after Hugging Face's modeling_gpt2.py and
modeling_qwen3.py, with their parameter names, since transformers is not
installed here; torch 1.13 has no scaled_dot_product_attention, so
attention is the eager q @ k^T, causal mask, softmax, @ v both files use
with torch < 2):
  gpt2   GPT-2 124M: d 768, 12 layers, 12 heads, vocab 50257, 1024
         positions, LayerNorm eps 1e-5, tanh GELU, Conv1D (addmm), tied head.
  qwen3  the Qwen3-style model of bench_compile.c: hidden 512, 8 layers, 8
         heads / 4 KV, head dim 64, MLP 1536, vocab 32000, q/k RMSNorm, RoPE
         theta 1e6, untied head.
Step (src/train/train.c's train_step): zero_grad(set_to_none), forward,
mean cross-entropy, backward, clip_grad_norm_(1.0), AdamW (lr 3e-4, betas
0.9/0.95, eps 1e-8, weight decay 0.1; foreach=True: torch 1.13 has no fused
CPU AdamW), loss.item().

Modes:
  train_torch.py --model gpt2|qwen3 [--steps N] [--warmup N] [--small]
      runs the steps alone and prints tokens/s and ms/step (median).
  train_torch.py --serve --model M [--batch B --seq T] [--small]
      the co-process bench_train drives: prints "ready N" (parameters)
      once built, then for each "step" line on stdin runs one step and
      prints "SECONDS LOSS"; ends at "quit" or end of input.
  train_torch.py --check --bin BUILD/bench_train [--full] [--keep DIR]
      correctness: a random GPT-2 (small, or 124M with --full) is written
      as a Hugging Face folder (config.json, model.safetensors) with a
      batch; `bench_train --check DIR` loads it with ts_decoder_load and runs
      one training step eagerly and compiled; its loss, gradient norm
      (total and per parameter) and the loss after one AdamW step must
      equal PyTorch's. Exit status 0 when they do.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0

GPT2_124M = dict(vocab=50257, hidden=768, layers=12, heads=12, positions=1024,
                 eps=1e-5)
GPT2_SMALL = dict(vocab=512, hidden=64, layers=2, heads=4, positions=64,
                  eps=1e-5)
QWEN3 = dict(vocab=32000, hidden=512, layers=8, heads=8, kv_heads=4,
             head_dim=64, intermediate=1536, eps=1e-6, theta=1e6)
QWEN3_SMALL = dict(vocab=1000, hidden=128, layers=2, heads=4, kv_heads=2,
                   head_dim=32, intermediate=384, eps=1e-6, theta=1e6)


# ---- GPT-2 -----------------------------------------------------------------

class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight (in, out), x @ W + b by addmm."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]),
                           self.weight).view(shape)


class GPT2Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H, self.D = H, C // H
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, self.D).transpose(1, 2)
                   for t in (q, k, v))
        w = (q @ k.transpose(-1, -2)) / math.sqrt(self.D)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        w = torch.where(causal, w, torch.finfo(w.dtype).min)
        a = torch.softmax(w, dim=-1) @ v
        return self.c_proj(a.transpose(1, 2).reshape(B, T, C))


class GPT2MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate='tanh'))


class GPT2Block(nn.Module):
    def __init__(self, C, H, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.attn = GPT2Attention(C, H)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.mlp = GPT2MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c['vocab'], c['hidden'])
        self.wpe = nn.Embedding(c['positions'], c['hidden'])
        self.h = nn.ModuleList(GPT2Block(c['hidden'], c['heads'], c['eps'])
                               for _ in range(c['layers']))
        self.ln_f = nn.LayerNorm(c['hidden'], eps=c['eps'])


class GPT2(nn.Module):
    """GPT2LMHeadModel's names: transformer.*, the head tied to wte."""

    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Body(c)
        std, resid = 0.02, 0.02 / math.sqrt(2 * c['layers'])
        for name, p in self.named_parameters():  # _init_weights
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, 0.0, resid)
            elif name.endswith('ln_1.weight') or name.endswith(
                    'ln_2.weight') or name.endswith('ln_f.weight'):
                nn.init.ones_(p)
            elif name.endswith('.bias'):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        t = self.transformer
        pos = torch.arange(ids.shape[1])
        x = t.wte(ids) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.T


# ---- Qwen3 -----------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Qwen3Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, H, KV, D = c['hidden'], c['heads'], c['kv_heads'], c['head_dim']
        self.H, self.KV, self.D = H, KV, D
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, KV * D, bias=False)
        self.v_proj = nn.Linear(C, KV * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.q_norm = RMSNorm(D, c['eps'])
        self.k_norm = RMSNorm(D, c['eps'])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.D))
        k = self.k_norm(self.k_proj(x).view(B, T, self.KV, self.D))
        v = self.v_proj(x).view(B, T, self.KV, self.D).transpose(1, 2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.H // self.KV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        w = (q @ k.transpose(-1, -2)) / math.sqrt(self.D)
        mask = torch.full((T, T), float('-inf')).triu(1)
        a = torch.softmax(w + mask, dim=-1) @ v
        return self.o_proj(a.transpose(1, 2).reshape(B, T, self.H * self.D))


class Qwen3MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, Fi = c['hidden'], c['intermediate']
        self.gate_proj = nn.Linear(C, Fi, bias=False)
        self.up_proj = nn.Linear(C, Fi, bias=False)
        self.down_proj = nn.Linear(Fi, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Qwen3Attention(c)
        self.mlp = Qwen3MLP(c)
        self.input_layernorm = RMSNorm(c['hidden'], c['eps'])
        self.post_attention_layernorm = RMSNorm(c['hidden'], c['eps'])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c['vocab'], c['hidden'])
        self.layers = nn.ModuleList(Qwen3Layer(c) for _ in range(c['layers']))
        self.norm = RMSNorm(c['hidden'], c['eps'])


class Qwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Qwen3Body(c)
        self.lm_head = nn.Linear(c['hidden'], c['vocab'], bias=False)
        for name, p in self.named_parameters():
            if not name.endswith('norm.weight'):
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids):
        T, D = ids.shape[1], self.c['head_dim']
        inv = 1.0 / (self.c['theta'] ** (torch.arange(0, D, 2).float() / D))
        freqs = torch.arange(T).float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


# ---- the step --------------------------------------------------------------

def build(name, small):
    if name == 'gpt2':
        c = GPT2_SMALL if small else GPT2_124M
        return GPT2(c), c['vocab']
    c = QWEN3_SMALL if small else QWEN3
    return Qwen3(c), c['vocab']


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                             weight_decay=WD, foreach=True)


def train_step(model, opt, ids, targets, V):
    """One step as train.c's train_step; returns (loss, grad norm)."""
    opt.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return loss.item(), float(gnorm)


def random_batch(gen, B, T, V):
    ids = torch.randint(0, V, (B, T + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def serve(args):
    torch.manual_seed(1)
    model, V = build(args.model, args.small)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(2)
    n = sum(p.numel() for p in model.parameters())
    print('ready %d' % n, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == 'quit':
            break
        if cmd != 'step':
            print('error unknown command %r' % cmd, flush=True)
            continue
        ids, tg = random_batch(gen, args.batch, args.seq, V)
        t0 = time.perf_counter()
        loss, _ = train_step(model, opt, ids, tg, V)
        dt = time.perf_counter() - t0
        print('%.6f %.6f' % (dt, loss), flush=True)


def standalone(args):
    torch.manual_seed(1)
    model, V = build(args.model, args.small)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(2)
    times, loss = [], 0.0
    for s in range(args.warmup + args.steps):
        ids, tg = random_batch(gen, args.batch, args.seq, V)
        t0 = time.perf_counter()
        loss, _ = train_step(model, opt, ids, tg, V)
        if s >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    print('torch %s B=%d T=%d: %.1f ms/step, %.1f tokens/s, last loss %.4f'
          % (args.model, args.batch, args.seq, 1e3 * med,
             args.batch * args.seq / med, loss))


# ---- the check against Tessera ---------------------------------------------

def save_safetensors(path, tensors):
    """A minimal safetensors writer (the package is not installed)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(t.shape),
                        'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header['__metadata__'] = {'format': 'pt'}
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, 'rb') as f:
        data = f.read()
    (n,) = struct.unpack_from('<Q', data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == '__metadata__':
            continue
        assert h['dtype'] == 'F32', (path, name, h['dtype'])
        a, b = h['data_offsets']
        t = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]),
                             dtype=torch.float32)
        out[name] = t.reshape(h['shape'])
    return out


def close(a, b, rtol, atol=0.0):
    return abs(a - b) <= atol + rtol * abs(b)


def check(args):
    torch.manual_seed(3)
    c = GPT2_124M if args.full else GPT2_SMALL
    model = GPT2(c)
    B, T = (4, 64) if args.full else (3, 16)
    gen = torch.Generator().manual_seed(4)
    ids, tg = random_batch(gen, B, T, c['vocab'])
    tg[0, :2] = -100  # ignored positions count for nothing
    d = args.keep or tempfile.mkdtemp(prefix='ts_gpt2_check_')
    os.makedirs(d, exist_ok=True)
    cfg = {'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel'],
           'vocab_size': c['vocab'], 'n_embd': c['hidden'],
           'n_layer': c['layers'], 'n_head': c['heads'],
           'n_positions': c['positions'], 'layer_norm_epsilon': c['eps'],
           'activation_function': 'gelu_new', 'tie_word_embeddings': True}
    with open(os.path.join(d, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(d, 'model.safetensors'),
                     dict(model.named_parameters()))
    with open(os.path.join(d, 'batch.bin'), 'wb') as f:
        f.write(struct.pack('<qq', B, T))
        f.write(ids.numpy().astype('<i8').tobytes())
        f.write(tg.numpy().astype('<i8').tobytes())
    # PyTorch: one step, then the loss on the same batch after it; in
    # float64 so that the reference carries no rounding of its own
    ref = GPT2(c).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    opt.zero_grad(set_to_none=True)
    logits = ref(ids)
    loss = F.cross_entropy(logits.reshape(-1, c['vocab']), tg.reshape(-1))
    loss.backward()
    full = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    grads = {n: float(g.norm()) for n, g in full.items()}
    gnorm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP))
    opt.step()
    with torch.no_grad():
        loss2 = float(F.cross_entropy(ref(ids).reshape(-1, c['vocab']),
                                      tg.reshape(-1)))
    want = {'loss': float(loss), 'gnorm': gnorm, 'loss2': loss2}
    out = subprocess.run([args.bin, '--check', d], capture_output=True,
                         text=True)
    if out.returncode != 0:
        print(out.stdout + out.stderr)
        print('check: bench_train --check failed (exit %d)' % out.returncode)
        return 1
    got = {}  # mode -> {key: value}, key 'grad NAME' for per-parameter norms
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ('eager', 'compiled'):
            got.setdefault(parts[0], {})[parts[1]] = float(parts[2])
        elif len(parts) == 4 and parts[1] == 'grad':
            got.setdefault(parts[0], {})['grad ' + parts[2]] = float(parts[3])
    bad = 0
    print('GPT-2 %s (d %d, %d layers, %d heads, vocab %d), batch %dx%d, '
          'torch float64 reference' % ('124M' if args.full else 'small',
                                       c['hidden'], c['layers'], c['heads'],
                                       c['vocab'], B, T))
    for mode in ('eager', 'compiled'):
        g = got.get(mode, {})
        for k in ('loss', 'gnorm', 'loss2'):
            ok = k in g and close(g[k], want[k], 1e-5 if k != 'gnorm'
                                  else 1e-4)
            bad += not ok
            print('  %-8s %-6s tessera %.7f torch %.7f  %s'
                  % (mode, k, g.get(k, float('nan')), want[k],
                     'ok' if ok else 'MISMATCH'))
        worst, wname, missing = 0.0, '', 0
        for n, v in grads.items():
            if 'grad ' + n not in g:
                missing += 1
                continue
            err = abs(g['grad ' + n] - v) / max(v, 1e-12)
            if err > worst:
                worst, wname = err, n
        ok = missing == 0 and worst < 1e-3
        bad += not ok
        print('  %-8s per-parameter gradient norms: %d of %d, worst relative '
              'difference %.2e (%s)  %s' % (mode, len(grads) - missing,
                                            len(grads), worst, wname,
                                            'ok' if ok else 'MISMATCH'))
        # element-wise: max |tessera - torch| over max |torch|, per tensor
        path = os.path.join(d, 'grads_%s.safetensors' % mode)
        tg_ = load_safetensors(path) if os.path.exists(path) else {}
        worst, wname = 0.0, ''
        for n, ref_g in full.items():
            if n not in tg_ or tuple(tg_[n].shape) != tuple(ref_g.shape):
                worst, wname = float('inf'), n + ' (absent)'
                break
            err = float((tg_[n].double() - ref_g).abs().max()) / max(
                float(ref_g.abs().max()), 1e-30)
            if err > worst:
                worst, wname = err, n
        ok = worst < 1e-3
        bad += not ok
        print('  %-8s gradients element by element: worst max|diff|/max|ref| '
              '%.2e (%s)  %s' % (mode, worst, wname,
                                 'ok' if ok else 'MISMATCH'))
    if not args.keep:
        shutil.rmtree(d)
    print('check: %s' % ('passed' if not bad else '%d mismatches' % bad))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', choices=('gpt2', 'qwen3'), default='gpt2')
    ap.add_argument('--batch', type=int)
    ap.add_argument('--seq', type=int)
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--warmup', type=int, default=1)
    ap.add_argument('--small', action='store_true')
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--serve', action='store_true')
    ap.add_argument('--check', action='store_true')
    ap.add_argument('--bin', default='build/bench_train')
    ap.add_argument('--full', action='store_true')
    ap.add_argument('--keep')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.batch is None:
        args.batch = 4 if args.model == 'gpt2' else 8
    if args.seq is None:
        args.seq = 64 if args.model == 'gpt2' else 256
    if args.small:
        args.batch, args.seq = 2, 32
    if args.check:
        sys.exit(check(args))
    if args.serve:
        serve(args)
    else:
        standalone(args)


if __name__ == '__main__':
    main()
