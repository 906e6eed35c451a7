#!/usr/bin/python3
"""dist_bench.py — distributed training on this machine, side by side.

The Qwen3-style model of the compiled-mode issue (hidden 512, 8 layers,
8 heads / 4 KV, head dim 64, MLP 1536, vocab 32000), f32, global batch 8 x
256, random tokens: `tessera train` as 1 rank with 2 threads against
`mpirun -np 2` ranks of 1 thread each, data parallel (the all-reduce
overlapped with the backward, and after it: --no-overlap), --shard
grad-opt and --shard full. Prints tokens/s (mean over the timed steps, the first steps
— compilation — left out), MFU and the share of step time spent in
collectives, from each run's log.jsonl.

    /usr/bin/python3 bench/dist_bench.py [--exe build/tessera] [--steps 8]
        [--skip 2] [--modes one,dp,dp-after,grad-opt,full]
        [--work /tmp/dist_bench]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--exe", default=os.path.join(os.path.dirname(__file__), "..",
                                              "build", "tessera"))
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--skip", type=int, default=2)
ap.add_argument("--modes", default="one,dp,dp-after,grad-opt,full")
ap.add_argument("--work", default="/tmp/dist_bench")
a = ap.parse_args()
if a.steps <= a.skip:
    sys.exit("dist_bench: --steps must exceed --skip")

shutil.rmtree(a.work, ignore_errors=True)
data = os.path.join(a.work, "data")
os.makedirs(data)
V = 32000
state = 12345  # a seeded LCG: no numpy needed
ids = []
for _ in range(200_000):
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    ids.append((state >> 33) % V)
with open(os.path.join(data, "train_000.bin"), "wb") as f:
    f.write(struct.pack("<IIIIQQ", 0x4B545354, 1, 2, 0, len(ids), 0))
    f.write(struct.pack(f"<{len(ids)}H", *ids))
config = os.path.join(a.work, "config.json")
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "vocab_size": V, "hidden_size": 512, "intermediate_size": 1536,
           "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 64,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
           "rope_theta": 1e6, "tie_word_embeddings": True}, open(config, "w"))

runs = {"one": (1, []), "dp": (2, []), "dp-after": (2, ["--no-overlap"]),
        "grad-opt": (2, ["--shard", "grad-opt"]),
        "full": (2, ["--shard", "full"])}
rows = []
for mode in a.modes.split(","):
    ranks, extra = runs[mode]
    out = os.path.join(a.work, mode)
    cmd = [a.exe, "train", "--model-config", config, "--data", data, "--out",
           out, "--batch", "8", "--seq", "256", "--steps", str(a.steps),
           "--warmup", "2", "--lr", "3e-4", "--save-every", "0", "--quiet",
           *extra]
    env = dict(os.environ, TS_NUM_THREADS="2" if ranks == 1 else "1")
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",
               "core", "-np", str(ranks), "-x", "TS_NUM_THREADS", *cmd]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"dist_bench: {mode} failed:\n{r.stderr}")
    log = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    timed = log[a.skip:]
    secs = timed[-1]["elapsed_s"] - log[a.skip - 1]["elapsed_s"]
    tps = 8 * 256 * len(timed) / secs
    mfu = sum(x["mfu"] for x in timed) / len(timed)
    comm = sum(x.get("comm_share", 0) for x in timed) / len(timed)
    rows.append((mode, ranks, tps, mfu, comm, log[-1]["loss"]))

print(f"Qwen3-style 512x8, vocab {V}, f32, global batch 8 x 256, "
      f"{a.steps - a.skip} timed steps")
print(f"{'run':<10} {'ranks x threads':>16} {'tokens/s':>9} {'vs 1 rank':>9} "
      f"{'MFU':>6} {'comm':>6} {'last loss':>9}")
base = next((r[2] for r in rows if r[0] == "one"), None)
for mode, ranks, tps, mfu, comm, loss in rows:
    rel = f"{tps / base:.2f}x" if base else "-"
    print(f"{mode:<10} {f'{ranks} x {2 // ranks}':>16} {tps:9.0f} {rel:>9} "
          f"{100 * mfu:5.1f}% {100 * comm:5.1f}% {loss:9.4f}")
