#!/usr/bin/env python3
"""bench_python.py — Tessera from Python (issue 20), side by side in one run:

1. the binding's per-call cost: a tiny op (`a + b` on 4 floats) through
   tessera.Tensor, a bare ctypes call into libtessera (ts_tensor_ndim), and
   PyTorch's own `a + b` on the same tensors as the reference;
2. a PyTorch module compiled with tessera.torch.compile against the same
   module in PyTorch eager: the Qwen3-style model of bench/train_torch.py
   (hidden 512, 8 layers, 8 heads / 4 KV, head dim 64, MLP 1536, vocab
   32000, B 8, T 256 — the model and batch of bench_train's C path), f32:
   forward (no grad), and a training step with torch.optim.AdamW (foreach)
   both with the loss inside the compiled module (nanoGPT style: forward
   returns the loss) and with the loss in PyTorch after it.

Rounds alternate PyTorch and Tessera, so both see the same machine load;
figures are medians. Threads: 2 for both (torch.set_num_threads, Tessera's
context). Prints the CPU and the ISA paths of the build.

    PYTHONPATH=python /usr/bin/python3 bench/bench_python.py [--small] [--rounds N]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import tessera  # noqa: E402
import tessera.torch as ttorch  # noqa: E402
import train_torch  # noqa: E402


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def per_call_us(fn, n):
    for _ in range(1000):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def binding(n):
    a, b = tessera.tensor([1.0, 2.0, 3.0, 4.0]), tessera.tensor([4.0, 3.0, 2.0, 1.0])
    ta, tb = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([4.0, 3.0, 2.0, 1.0])
    lib, h = tessera._lib.lib, a._h
    rows = []
    for _ in range(3):
        rows.append((per_call_us(lambda: a + b, n), per_call_us(lambda: lib.ts_tensor_ndim(h), n),
                     per_call_us(lambda: ta + tb, n)))
    med = [statistics.median(r[i] for r in rows) for i in range(3)]
    print(f"binding: tessera a + b {med[0]:.2f} us/call, bare ctypes call {med[1]:.2f} us, "
          f"torch a + b {med[2]:.2f} us (tessera/torch {med[0] / med[2]:.2f}x)")
    return med


class WithLoss(nn.Module):
    """The model with its loss, as nanoGPT's forward(idx, targets)."""

    def __init__(self, model, vocab):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, ids, targets):
        return F.cross_entropy(self.model(ids).reshape(-1, self.vocab), targets.reshape(-1))


def timed(fn, rounds):
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="the small Qwen3 config (a smoke test)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200000, help="calls per binding timing")
    ap.add_argument("--c-path", metavar="BENCH_TRAIN", help="also run the C path (build/bench_train "
                    "--model qwen3 --no-eager) and compare its lead over PyTorch with this one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tessera.set_num_threads(args.threads)
    torch.manual_seed(1)
    print(f"machine: {cpu_name()}, {args.threads} threads; torch {torch.__version__}; "
          f"libtessera {tessera._lib.path}")
    binding(args.calls)

    model, V = train_torch.build("qwen3", args.small)
    c = train_torch.QWEN3_SMALL if args.small else train_torch.QWEN3
    B, T = (2, 32) if args.small else (8, 256)
    print(f"model: Qwen3-style, hidden {c['hidden']}, {c['layers']} layers, vocab {V}; batch {B}x{T}, f32")
    gen = torch.Generator().manual_seed(2)
    ids, tg = train_torch.random_batch(gen, B, T, V)

    # forward, no grad
    cm = ttorch.compile(model)
    with torch.no_grad():
        ref, out = model(ids), cm(ids)
        print(f"forward max |diff| vs torch: {(out - ref).abs().max().item():.2e}")
        fe, fc = [], []
        for _ in range(args.rounds + 1):
            fe += timed(lambda: model(ids), 1)
            fc += timed(lambda: cm(ids), 1)
    fe, fc = statistics.median(fe[1:]), statistics.median(fc[1:])
    print(f"forward: torch eager {fe * 1e3:.1f} ms, tessera compiled {fc * 1e3:.1f} ms -> {fe / fc:.2f}x")

    # training steps: torch.optim.AdamW on the torch parameters in both
    def make_step(fn, loss_inside):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=True)

        def step():
            opt.zero_grad(set_to_none=True)
            if loss_inside:
                loss = fn(ids, tg)
            else:
                loss = F.cross_entropy(fn(ids).reshape(-1, V), tg.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss.item()

        return step

    wl = WithLoss(model, V)
    results = {}
    for label, eager_fn, comp_fn, inside in (
            ("loss inside the module", wl, ttorch.compile(wl, train=True), True),
            ("loss in PyTorch", model, ttorch.compile(model, train=True), False)):
        se, sc = make_step(eager_fn, inside), make_step(comp_fn, inside)
        sc()  # capture and plan
        te, tc = [], []
        for _ in range(args.rounds):
            te += timed(se, 1)
            tc += timed(sc, 1)
        te, tc = statistics.median(te), statistics.median(tc)
        results[label] = te / tc
        print(f"train step ({label}): torch eager {te * 1e3:.1f} ms, tessera compiled "
              f"{tc * 1e3:.1f} ms -> {te / tc:.2f}x ({B * T / tc:.0f} tokens/s)")
    if args.c_path:
        cmd = [args.c_path, "--model", "qwen3", "--no-eager", "--steps", str(args.rounds),
               "--threads", str(args.threads)] + (["--small"] if args.small else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        m = re.search(r"per-round ratios \(median\): compiled/torch ([0-9.]+)x", out)
        if not m:
            raise SystemExit("bench_train printed no compiled/torch ratio:\n" + out)
        c_lead = float(m.group(1))
        py_lead = results["loss inside the module"]
        print(f"C path (bench_train, same model and batch): compiled/torch {c_lead:.2f}x; "
              f"torch module through tessera.torch.compile: {py_lead:.2f}x -> "
              f"{py_lead / c_lead * 100:.0f}% of the C path's lead")


if __name__ == "__main__":
    main()
