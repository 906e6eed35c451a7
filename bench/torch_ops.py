#!/usr/bin/env python3
"""PyTorch side of bench_ops: the reference figures that bench_ops prints
beside Tessera's own, measured in the same run.

bench_ops starts this script with popen and reads its standard output, one
result per line, `key value...` (lines it does not know are ignored):

  torch <version>
  threads <n>
  matmul <N> <median seconds> <GFLOP/s>
  attn <causal|noncausal> <median seconds>

Usage (what bench_ops passes):
  torch_ops.py --threads 2 --reps 7 --matmul 512,1024,2048
  torch_ops.py --threads 2 --reps 7 --attn 1,16,8,1024,128

Attention is the straightforward PyTorch implementation, not
scaled_dot_product_attention: k and v repeated to H heads with
repeat_interleave, scores = q @ k^T * scale, causal mask by masked_fill with
-inf (the boolean mask is built once, outside the timing, as a model would
cache it), softmax over the last dim, @ v. Everything runs under
torch.inference_mode().
"""
import argparse
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--matmul", default="", help="comma-separated sizes N")
    p.add_argument("--attn", default="", help="B,H,KV,T,D")
    return p.parse_args()


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def timeit(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return median(ts)


def main():
    args = parse_args()
    # Thread pools read these when they start, so set them before the import.
    n = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = n
    os.environ["OPENBLAS_NUM_THREADS"] = n
    os.environ["MKL_NUM_THREADS"] = n
    import torch

    torch.set_num_threads(args.threads)
    print("torch", torch.__version__, flush=True)
    print("threads", torch.get_num_threads(), flush=True)
    gen = torch.Generator().manual_seed(1234)
    # Let the caller's worker threads (OpenBLAS, OpenMP) stop spinning.
    time.sleep(0.2)

    with torch.inference_mode():
        for tok in filter(None, args.matmul.split(",")):
            N = int(tok)
            a = torch.randn(N, N, generator=gen, dtype=torch.float32)
            b = torch.randn(N, N, generator=gen, dtype=torch.float32)
            sec = timeit(lambda: torch.matmul(a, b), args.reps, args.warmup)
            print("matmul %d %.9f %.3f" % (N, sec, 2.0 * N**3 / sec / 1e9),
                  flush=True)

        if args.attn:
            B, H, KV, T, D = (int(x) for x in args.attn.split(","))
            S = T
            q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float32)
            k = torch.randn(B, KV, S, D, generator=gen, dtype=torch.float32)
            v = torch.randn(B, KV, S, D, generator=gen, dtype=torch.float32)
            scale = 1.0 / (D ** 0.5)
            rep = H // KV
            # Query t sees keys s <= t + (S - T): mask out s > t + (S - T).
            mask = torch.ones(T, S, dtype=torch.bool).triu(1 + S - T)

            def attention(causal):
                kk = k.repeat_interleave(rep, dim=1)
                vv = v.repeat_interleave(rep, dim=1)
                scores = (q @ kk.transpose(-2, -1)) * scale
                if causal:
                    scores = scores.masked_fill(mask, float("-inf"))
                p = torch.softmax(scores, dim=-1)
                return p @ vv

            # Alternate the two modes rep by rep, as bench_ops does.
            for _ in range(args.warmup):
                attention(True)
                attention(False)
            tc, tn = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                attention(True)
                t1 = time.perf_counter()
                attention(False)
                t2 = time.perf_counter()
                tc.append(t1 - t0)
                tn.append(t2 - t1)
            print("attn causal %.9f" % median(tc), flush=True)
            print("attn noncausal %.9f" % median(tn), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
