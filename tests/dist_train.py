#!/usr/bin/python3
"""dist_train.py — distributed training gives the single process's answers.

    dist_train.py TESSERA_BINARY WORKDIR

A tiny Qwen3 model on seeded random token shards, 20 steps of the same
global batch: one process; `mpirun -np 2` data parallel (gradients
all-reduced in many small buckets during the backward, compiled; the
same after the backward; and eager with recomputed layers and two
micro-batches); `--shard grad-opt`; `--shard full`. The losses agree step for step (relative difference
<= 1e-5) and so do the final weights and AdamW moments (<= 1e-4 of each
tensor's largest value: the two halves of a batch are summed in another
order, and 20 Adam steps carry that rounding). Then checkpoints cross over:
10 steps sharded over 2 ranks resumed by one process for 10 more, and 10
steps of one process resumed by 2 sharded ranks, both give the losses of
the uninterrupted run. Standard library and numpy only."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np

EXE, WORK = sys.argv[1], sys.argv[2]
FAILS = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)


def shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<IIIIQQ", 0x4B545354, 1, 2, 0, len(ids), 0))
        f.write(np.asarray(ids, dtype="<u2").tobytes())


def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k != "__metadata__":
            s, e = v["data_offsets"]
            out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32)
    return out


def losses(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f]


def train(out, steps, ranks=1, extra=()):
    args = [EXE, "train", "--model-config", CONFIG, "--data", DATA, "--out",
            out, "--batch", "4", "--seq", "32", "--steps", str(steps),
            "--warmup", "3", "--schedule", "constant", "--lr", "3e-3",
            "--seed", "5", "--peak-gflops", "100", "--quiet", *extra]
    env = dict(os.environ, TS_NUM_THREADS="1")
    # Open MPI's own allocations outlive MPI_Finalize: not ours to report
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    if ranks > 1:
        args = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                str(ranks), "-x", "TS_NUM_THREADS", "-x", "ASAN_OPTIONS",
                "-x", "UBSAN_OPTIONS", *args]
    r = subprocess.run(args, env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        print(r.stdout, r.stderr)
    check(r.returncode == 0,
          f"train {out} to step {steps} ({ranks} rank(s) {' '.join(extra)})")


def last_log(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()][-1]


def rel(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def same_tensors(a_dir, b_dir, name, tol):
    a = safetensors(os.path.join(a_dir, name))
    b = safetensors(os.path.join(b_dir, name))
    worst = max(float(np.max(np.abs(a[k] - b[k]))) /
                (float(np.max(np.abs(a[k]))) + 1e-30) for k in a)
    check(a.keys() == b.keys() and worst <= tol,
          f"{name}: {b_dir} = {a_dir} (worst {worst:.2e} <= {tol:g})")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
DATA, CONFIG = os.path.join(WORK, "data"), os.path.join(WORK, "config.json")
os.makedirs(DATA)
rng = np.random.default_rng(7)
# a learnable stream: repeated random phrases with noise
phrases = [rng.integers(0, 256, rng.integers(4, 12)) for _ in range(40)]
ids = np.concatenate([phrases[i] for i in rng.integers(0, 40, 3000)])
shard(os.path.join(DATA, "train_000.bin"), ids[:20000])
shard(os.path.join(DATA, "val_000.bin"), ids[20000:22000])
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 16,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": True,
           "torch_dtype": "float32"}, open(CONFIG, "w"))

W = lambda n: os.path.join(WORK, n)
train(W("one"), 20)
# data parallel: the all-reduce overlapped with the backward in buckets of
# 10 KiB (a few parameters each: many buckets in flight), and after it
train(W("dp"), 20, 2, ("--bucket-mb", "0.01"))
train(W("dp_after"), 20, 2, ("--no-overlap", "--bucket-mb", "0.01"))
train(W("zero2"), 20, 2, ("--shard", "grad-opt"))
train(W("fsdp"), 20, 2, ("--shard", "full"))
# overlapped, eager, layers recomputed in backward, 2 micro-batches
ACC = ("--grad-accum", "2", "--checkpoint-activations", "--eager")
train(W("one_acc"), 20, 1, ACC)
train(W("dp_acc"), 20, 2, ACC + ("--bucket-mb", "0.004"))
for run in ("dp", "dp_acc"):  # every bucket started while backward ran
    last = last_log(W(run))
    check(last.get("buckets", 0) > 4 and
          last.get("buckets_in_backward") == last.get("buckets"),
          f"{run}: {last.get('buckets_in_backward')} of {last.get('buckets')} "
          "all-reduces started during the backward")
last = last_log(W("dp_after"))
check("buckets" not in last, "dp_after: no all-reduce during the backward")
one = losses(W("one"))
check(len(one) == 20 and one[-1] < one[0] - 0.5,
      f"one process learns: loss {one[0]:.3f} -> {one[-1]:.3f}")
for run, ref in (("dp", "one"), ("dp_after", "one"), ("zero2", "one"),
                 ("fsdp", "one"), ("dp_acc", "one_acc")):
    want, got = losses(W(ref)), losses(W(run))
    check(len(got) == 20 and rel(want, got) <= 1e-5,
          f"{run}: 20 losses = one process's (worst {rel(want, got):.1e})")
    for f in ("model.safetensors", "optimizer.safetensors"):
        same_tensors(W(ref + "/step_000020"), W(run + "/step_000020"), f,
                     1e-4)

# checkpoints cross between sharded and single runs
train(W("x1"), 10, 2, ("--shard", "grad-opt"))
train(W("x1"), 20, 1, ("--resume",))
train(W("x2"), 10, 1)
train(W("x2"), 20, 2, ("--shard", "grad-opt", "--resume"))
for run in ("x1", "x2"):
    got = losses(W(run))
    check(len(got) == 20 and rel(one, got) <= 1e-5,
          f"{run}: resumed across modes, losses = one process's "
          f"(worst {rel(one, got):.1e})")

# a batch the ranks cannot split is refused with a reason
r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                    "2", EXE, "train", "--model-config", CONFIG, "--data",
                    DATA, "--out", W("bad"), "--batch", "3", "--steps", "1",
                    "--quiet"], capture_output=True, text=True, timeout=120,
                   env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
check(r.returncode != 0 and "multiple of the number of ranks" in r.stderr,
      "--batch 3 over 2 ranks: a clear error")

# a mixture of experts whose load-balancing loss needs every sparse layer's
# router logits cannot be fully sharded (its layers are not recomputed):
# refused by name, not trained with unreduced gradients
MOE = os.path.join(WORK, "moe.json")
json.dump({"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 32,
           "intermediate_size": 64, "moe_intermediate_size": 16,
           "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4,
           "num_experts_per_tok": 2, "router_aux_loss_coef": 0.01}, open(MOE, "w"))
r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                    "2", EXE, "train", "--model-config", MOE, "--data",
                    DATA, "--out", W("bad_moe"), "--batch", "4", "--seq",
                    "32", "--steps", "1", "--shard", "full", "--quiet"],
                   capture_output=True, text=True, timeout=120,
                   env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
check(r.returncode != 0 and "--shard full does not take a mixture of experts"
      in r.stderr, "moe with --shard full over 2 ranks: a clear error")
# and trains data parallel like one process: to 1e-5 without the
# load-balancing term; with it each rank balances its own tokens (as a
# micro-batch does in Hugging Face's), which is not the whole batch's term
MOE0 = os.path.join(WORK, "moe0.json")
json.dump(dict(json.load(open(MOE)), router_aux_loss_coef=0.0), open(MOE0, "w"))
for cfg, name, bound in ((MOE0, "m0", 1e-5), (MOE, "m", 1e-3)):
    train(W(name + "_one"), 4, 1, ("--model-config", cfg))
    train(W(name + "_dp"), 4, 2, ("--model-config", cfg))
    want, got = losses(W(name + "_one")), losses(W(name + "_dp"))
    check(len(got) == 4 and rel(want, got) <= bound,
          f"moe dp ({os.path.basename(cfg)}): 4 losses = one process's to "
          f"{bound:g} (worst {rel(want, got):.1e})")

# GPT-2 goes through the same decoder: data parallel, overlapped, and
# --shard full (its layer hooks) train like one process
GPT2 = os.path.join(WORK, "gpt2.json")
json.dump({"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2,
           "n_positions": 64, "vocab_size": 256}, open(GPT2, "w"))
train(W("g_one"), 6, 1, ("--model-config", GPT2))
train(W("g_dp"), 6, 2, ("--model-config", GPT2, "--bucket-mb", "0.01"))
train(W("g_full"), 6, 2, ("--model-config", GPT2, "--shard", "full"))
want = losses(W("g_one"))
for name in ("g_dp", "g_full"):
    got = losses(W(name))
    check(len(got) == 6 and rel(want, got) <= 1e-5,
          f"gpt2 {name[2:]}: 6 losses = one process's (worst {rel(want, got):.1e})")

# `tessera train --device vulkan:0` (where the machine has Vulkan; CI has
# lavapipe): the model, its gradients and AdamW's state on the device, the
# losses those of the host's run; more ranks with --device are refused
devs = subprocess.run([EXE, "devices"], capture_output=True, text=True).stdout
if re.search(r"^vulkan:0", devs, re.M):
    train(W("vk_one"), 6, 1, ("--device", "vulkan:0"))
    got = losses(W("vk_one"))
    train(W("cpu_one6"), 6, 1)
    want = losses(W("cpu_one6"))
    check(len(got) == 6 and rel(want, got) <= 1e-5,
          f"--device vulkan:0: 6 losses = the host's (worst {rel(want, got):.1e})")
else:
    print("dist_train: no Vulkan device; --device vulkan:0 not checked")

print(f"dist_train: {len(FAILS)} failure(s)")
sys.exit(1 if FAILS else 0)
