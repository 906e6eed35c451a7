#!/usr/bin/python3
"""train_cli_flags.py TESSERA DIR — `tessera train`'s flag errors say what
is wrong and what is allowed: a missing value, a value that is not a
number or not an integer, one out of range, one not among the choices, an
unknown flag (with the nearest known one), a stray argument, and the same
through --config FILE.json; prepare-data's likewise. Each exits 2 before
anything is read or made. Last, plot-loss draws a log holding a resumed
run's steps twice (as --resume left them before it cut the log) as one
stroke."""
import json
import os
import shutil
import subprocess
import sys

exe, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = 0


def expect(args, want):
    global failures
    r = subprocess.run([exe, "train", *args], capture_output=True, text=True,
                       timeout=60)
    got = r.stderr.strip()
    if r.returncode != 2 or got != "tessera train: " + want:
        failures += 1
        print(f"FAIL {args}: rc {r.returncode}\n  got:  {got!r}\n"
              f"  want: {'tessera train: ' + want!r}")


expect(["--lr", "abc"],
       '--lr: "abc" is not a number; want a positive float <= 10, like 3e-4')
expect(["--lr"], "--lr needs a value: a positive float <= 10, like 3e-4")
expect(["--lr", "--steps", "3"],
       "--lr needs a value: a positive float <= 10, like 3e-4")
expect(["--lr", "0"],
       "--lr: 0 is out of range; want a positive float <= 10, like 3e-4")
expect(["--batch", "2.5"],
       '--batch: "2.5" is not an integer; want an integer in 1..1048576, '
       "like 8")
expect(["--grad-accum", "100"],
       "--grad-accum: 100 is out of range; want an integer in 1..64")
expect(["--beta2", "1"],
       "--beta2: 1 is out of range; want a float in [0, 1), like 0.95")
expect(["--keep-last", "-1"],
       "--keep-last: -1 is out of range; want an integer >= 0 (0: keep every "
       "checkpoint), like 3")
expect(["--schedule", "linear"],
       '--schedule: "linear" is not one of cosine, constant')
expect(["--shard"], "--shard needs a value: one of none, grad-opt or full")
expect(["--dtype", "f16"], '--dtype: "f16" is not one of f32, bf16')
expect(["--data"], "--data needs a value: a folder")
expect(["--lrr", "1e-3"], 'unknown option "--lrr"; did you mean "--lr"?')
expect(["--warmpu", "10"],
       'unknown option "--warmpu"; did you mean "--warmup"?')
expect(["--checkpoint-activation"],
       'unknown option "--checkpoint-activation"; did you mean '
       '"--checkpoint-activations"?')
expect(["--frobnicate"],
       'unknown option "--frobnicate" (see tessera train --help)')
expect(["data"], 'unexpected argument "data" (every option is --name VALUE; '
       "see tessera train --help)")
cfg = os.path.join(work, "opts.json")
json.dump({"lr": "abc"}, open(cfg, "w"))
expect(["--config", cfg],
       f'{cfg}: --lr: "abc" is not a number; want a positive float <= 10, '
       "like 3e-4")
json.dump({"steps": 0}, open(cfg, "w"))
expect(["--config", cfg],
       f"{cfg}: --steps: 0 is out of range; want a positive integer, like "
       "1000")
json.dump({"stpes": 5}, open(cfg, "w"))
expect(["--config", cfg], f'{cfg}: unknown option "--stpes"; did you mean '
       '"--steps"?')
json.dump({"lr": [1]}, open(cfg, "w"))
expect(["--config", cfg],
       f'{cfg}: "lr" must be a string, a number or a boolean')
expect(["--config"], "--config needs a value: a JSON file of options")


def expect_prepare(args, want):
    global failures
    r = subprocess.run([exe, "prepare-data", *args], capture_output=True,
                       text=True, timeout=60)
    got = r.stderr.splitlines()[0] if r.stderr else ""
    if r.returncode != 2 or got != "tessera prepare-data: " + want:
        failures += 1
        print(f"FAIL prepare-data {args}: rc {r.returncode}\n  got:  {got!r}"
              f"\n  want: {'tessera prepare-data: ' + want!r}")


expect_prepare(["-t"], "-t needs a value: a folder")
expect_prepare(["--val-fraction", "2"],
               '--val-fraction: "2" is not a float in 0..0.99, like 0.05')
expect_prepare(["--shard-tokens", "10"],
               '--shard-tokens: "10" is not an integer >= 1024, like 67108864')
expect_prepare(["--vocab", "5"], 'unknown option "--vocab"')
expect_prepare(["-t", "tok", "--out", "d"], "no input files")
r = subprocess.run([exe, "train", "--help"], capture_output=True, text=True)
if r.returncode != 0 or "--keep-last" not in r.stdout:
    failures += 1
    print("FAIL --help", r.returncode, r.stdout)
# plot-loss on a log of an older resume (steps 3-4 twice): one stroke,
# the later lines winning
log = os.path.join(work, "log.jsonl")
with open(log, "w") as f:
    for step, loss in [(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0), (3, 3.5),
                       (4, 2.5), (5, 2.0)]:
        f.write(json.dumps({"step": step, "loss": loss}) + "\n")
svg = os.path.join(work, "loss.svg")
r = subprocess.run([exe, "plot-loss", log, "--out", svg], capture_output=True,
                   text=True)
pts = []
if r.returncode == 0:
    text = open(svg).read()
    pts = [tuple(map(float, p.split(",")))
           for p in text.split('points="')[1].split('"')[0].split()]
xs = [x for x, _ in pts]
if len(pts) != 5 or xs != sorted(xs) or "5 points" not in r.stderr:
    failures += 1
    print("FAIL plot-loss of a log with repeated steps:", r.stderr, pts)
print(f"train_cli_flags: {'all passed' if not failures else f'{failures} failed'}")
sys.exit(1 if failures else 0)
