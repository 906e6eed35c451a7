#!/usr/bin/python3
"""check_cli.py TESSERA MODELS WORK — every family of the matrix through
the command line, as a user drives it: `tessera info` names the family;
`tessera logits` gives the reference's logits (f32 weights to 1e-4 of the
logit scale; --dtype bf16 against the bf16-rounded reference to 2e-3;
--device-map over two CPU devices equal to one device); `tessera train`
from the family's config.json (random init, --compile) runs 3 steps on
seeded token shards with finite losses, a later one below the first, and `--dtype bf16
--checkpoint-activations` runs too. MODELS is make_models.py's folder;
WORK a scratch folder. Standard library and numpy only."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

FAILS = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300)


def logits(exe, d, ids, work, *extra):
    out = os.path.join(work, "l.npy")
    r = run(exe, "logits", "-m", d, "--ids", ",".join(str(int(i)) for i in ids), "--out", out,
            *extra)
    if r.returncode:
        return None, r.stderr
    return np.load(out), ""


def shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<IIIIQQ", 0x4B545354, 1, 2, 0, len(ids), 0))
        f.write(np.asarray(ids, dtype="<u2").tobytes())


BF16_GEMM = False


def main():
    global BF16_GEMM
    exe, models, work = sys.argv[1], sys.argv[2], sys.argv[3]
    v = run(exe, "--version").stdout
    BF16_GEMM = any(f"cpu path in use: {lv}" in v for lv in ("avx512_bf16", "amx"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cases = [l.split() for l in open(os.path.join(models, "cases.txt")) if l.strip()]
    for case, model_type in cases:
        d = os.path.join(models, case)
        meta = json.load(open(os.path.join(models, case + ".json")))
        B, T, V = meta["B"], meta["T"], meta["V"]
        ids = np.fromfile(os.path.join(models, case + ".ids"), dtype="<i8").reshape(B, T)
        want = np.fromfile(os.path.join(models, case + ".logits"), dtype="<f4").reshape(B, T, V)[0]
        want16 = np.fromfile(os.path.join(models, case + ".logits_bf16"),
                             dtype="<f4").reshape(B, T, V)[0]
        r = run(exe, "info", "-m", d)
        check(r.returncode == 0 and model_type in r.stdout,
              f"{case}: tessera info names {model_type}")
        got, err = logits(exe, d, ids[0], work)
        scale = np.abs(want).max()
        e = np.abs(got - want).max() / scale if got is not None else np.inf
        check(e <= 1e-4, f"{case}: tessera logits = reference ({e:.1e} of the scale) {err}")
        got16, err = logits(exe, d, ids[0], work, "--dtype", "bf16")
        e16 = np.abs(got16 - want16).max() / scale if got16 is not None else np.inf
        # at AVX512_BF16 the products round the activations to bf16 as well
        # (test_compat.c's rule): 1.5x the weight rounding's own shift
        b16 = max(2e-3, 1.5 * meta["bf16_shift"]) if BF16_GEMM else 2e-3
        check(e16 <= b16, f"{case}: --dtype bf16 = bf16 reference ({e16:.1e}, bound {b16:.1e}) {err}")
        L = json.load(open(os.path.join(d, "config.json"))).get(
            "num_hidden_layers", json.load(open(os.path.join(d, "config.json"))).get("n_layer"))
        split = "embed,0:cpu:0;%s,head:cpu:1" % ("1-%d" % (L - 1) if L > 2 else "1")
        gots, err = logits(exe, d, ids[0], work, "--device-map", split)
        check(gots is not None and got is not None and np.array_equal(gots, got),
              f"{case}: --device-map {split} = one device {err}")
        # training from the family's config, random init
        data = os.path.join(work, "data_" + case)
        os.makedirs(data)
        rng = np.random.default_rng(3)
        phrases = [rng.integers(0, V, rng.integers(3, 8)) for _ in range(20)]
        stream = np.concatenate([phrases[i] for i in rng.integers(0, 20, 600)])
        shard(os.path.join(data, "train_000.bin"), stream[:3000])
        out = os.path.join(work, "run_" + case)
        r = run(exe, "train", "--model-config", os.path.join(d, "config.json"), "--data", data,
                "--out", out, "--batch", "2", "--seq", "16", "--steps", "3", "--lr", "1e-2",
                "--warmup", "1", "--quiet", "--compile")
        losses = []
        if r.returncode == 0:
            with open(os.path.join(out, "log.jsonl")) as f:
                losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
        check(r.returncode == 0 and len(losses) == 3 and all(np.isfinite(losses))
              and min(losses[1:]) < losses[0],
              f"{case}: tessera train --compile, 3 steps: {losses} {r.stderr[-300:]}")
        r = run(exe, "train", "--model-config", os.path.join(d, "config.json"), "--data", data,
                "--out", out + "_bf16", "--batch", "2", "--seq", "16", "--steps", "2",
                "--dtype", "bf16", "--checkpoint-activations", "--quiet")
        check(r.returncode == 0, f"{case}: tessera train --dtype bf16 "
              f"--checkpoint-activations {r.stderr[-300:]}")
    print(f"check_cli: {len(FAILS)} failure(s) over {len(cases)} families")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
