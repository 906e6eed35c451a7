#!/usr/bin/python3
"""contention.py — generation and training still finish, with the same
answers, while another process keeps one core busy.

    contention.py TESSERA_BINARY MODEL_DIR WORKDIR

A busy loop pinned to core 0 (the way a second job shares a server), then
`tessera run` greedy on the default model and a few `tessera train` steps on
a tiny Qwen3 over seeded random shards, each with 2 threads, once on an
idle machine and once beside the busy loop. Both runs of each must finish
(a generous time-out catches the old livelock-like collapse) and give the
same text and the same losses bit for bit: the thread pool hands out chunks
whose results do not depend on which thread ran them. Speed is measured by
bench/bench_contention.py, not here. Standard library only."""
import json
import os
import struct
import subprocess
import sys
import time

EXE, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
FAILS, PASSED = [], []
ENV = dict(os.environ, TS_NUM_THREADS="2")


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    (PASSED if ok else FAILS).append(what)


def busy_core0():
    code = ("import os\n"
            "try:\n os.sched_setaffinity(0, {0})\nexcept OSError:\n pass\n"
            "while True:\n pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


def run(args, what):
    t = time.time()
    try:
        r = subprocess.run([EXE, *args], env=ENV, capture_output=True,
                           text=True, timeout=300)
    except subprocess.TimeoutExpired:
        check(False, f"{what} finished within 300 s")
        return None, 0
    check(r.returncode == 0, f"{what} exits 0")
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
    return r, time.time() - t


def generate(label):
    r, secs = run(["run", "-m", MODEL, "-p", "And God said", "-n", "48",
                   "--temperature", "0", "--threads", "2"],
                  f"generation ({label})")
    print(f"  generation {label}: {secs:.2f} s")
    return r.stdout if r else None


def shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<IIIIQQ", 0x4B545354, 1, 2, 0, len(ids), 0))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def train(label):
    out = os.path.join(WORK, "train_" + label)
    r, secs = run(["train", "--model-config", CONFIG, "--data", DATA, "--out",
                   out, "--batch", "4", "--seq", "32", "--steps", "6",
                   "--warmup", "2", "--schedule", "constant", "--lr", "3e-3",
                   "--seed", "5", "--peak-gflops", "100", "--quiet",
                   "--threads", "2"], f"training ({label})")
    print(f"  training {label}: {secs:.2f} s")
    if not r:
        return None
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f if l.strip()]


os.makedirs(WORK, exist_ok=True)
DATA, CONFIG = os.path.join(WORK, "data"), os.path.join(WORK, "config.json")
os.makedirs(DATA, exist_ok=True)
seed, ids = 7, []
for _ in range(12000):
    seed = (seed * 1103515245 + 12345) % 2147483648
    ids.append((seed >> 8) % 256)
shard(os.path.join(DATA, "train_000.bin"), ids[:10000])
shard(os.path.join(DATA, "val_000.bin"), ids[10000:])
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": True,
           "torch_dtype": "float32"}, open(CONFIG, "w"))

idle_text, idle_loss = generate("idle"), train("idle")
hog = busy_core0()
try:
    time.sleep(0.2)
    busy_text, busy_loss = generate("core 0 busy"), train("core 0 busy")
finally:
    hog.kill()
    hog.wait()
check(idle_text is not None and idle_text == busy_text,
      "the same greedy text with core 0 busy")
check(idle_loss is not None and idle_loss == busy_loss and len(idle_loss) == 6,
      f"the same 6 losses with core 0 busy ({idle_loss} / {busy_loss})")
print(f"{len(PASSED)} passed, {len(FAILS)} failed")
sys.exit(1 if FAILS else 0)
