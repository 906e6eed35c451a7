#!/usr/bin/python3
"""check_run_cli.py TESSERA DIR — `tessera run` end to end on the folder
hf_tiny_lm.py wrote: greedy text equals the PyTorch reference's (eager,
--compile, and with generation_config.json's greedy default), bf16-kept
weights run, a stop string cuts the text before it, a seeded sampling run
repeats itself, and
`tessera tokenize` encodes and decodes the prompt; bad options exit 2."""
import json
import os
import subprocess
import sys


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def main():
    exe, root = sys.argv[1], sys.argv[2]
    d = os.path.join(root, "tiny_lm")
    want = open(os.path.join(root, "tiny_lm.expected")).read()
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n", (r.stdout, want)
    assert "tokens/s" in r.stderr, r.stderr
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--compile")
    assert r.returncode == 0 and r.stdout == want + "\n", (r.stdout, r.stderr)
    # weights kept in bf16 (rounded from f32): runs, generates up to 24 tokens
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--dtype", "bf16")
    assert r.returncode == 0 and 1 < len(r.stdout) <= 24 * 8 + 1, (r.stdout, r.stderr)
    r = run(exe, "run", "-m", d, "-p", "x", "--dtype", "f64")
    assert r.returncode == 2, r.stderr
    stop = want[2:5]
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--stop", stop)
    assert r.returncode == 0 and r.stdout == want[:want.index(stop)] + "\n", (r.stdout, stop)
    a = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "16", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "5")
    b = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "16", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "5")
    assert a.returncode == 0 and a.stdout == b.stdout, (a.stdout, b.stdout)
    ids = json.load(open(os.path.join(root, "tiny_lm.prompt_ids")))
    r = run(exe, "tokenize", "-m", d, "Hello world")
    assert r.returncode == 0 and json.loads(r.stdout) == ids, r.stdout
    r = run(exe, "tokenize", "-m", d, "--decode", ",".join(map(str, ids)))
    assert r.returncode == 0 and r.stdout == "Hello world\n", r.stdout
    r = run(exe, "run", "-m", d, "-p", "x", "--top-p", "0")
    assert r.returncode == 2 and "bad or incomplete option" in r.stderr, r.stderr
    r = run(exe, "run", "-m", os.path.join(root, "nowhere"), "-p", "x")
    assert r.returncode == 1 and "nowhere" in r.stderr, r.stderr
    print("check_run_cli: greedy text equals the reference; stop, seed, tokenize, errors ok")


if __name__ == "__main__":
    main()
