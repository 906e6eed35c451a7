#!/usr/bin/python3
"""check_logits_cli.py TESSERA DIR — runs `tessera logits` on a model that
hf_qwen3.py wrote and compares the .npy it writes with the PyTorch
reference's logits (to 1e-4 of the logit scale); also `tessera info`, a
bad --ids argument (exit status 2, message on stderr) and a file given for
the model folder (exit status 1, its folder suggested)."""
import os
import subprocess
import sys
import tempfile

import numpy as np


def main():
    exe, root = sys.argv[1], sys.argv[2]
    name = "gqa2_untied"
    raw = np.fromfile(os.path.join(root, name + ".ids"), dtype=np.int64)
    B, T = int(raw[0]), int(raw[1])
    ids = raw[2:].reshape(B, T)
    want = np.fromfile(os.path.join(root, name + ".logits"), dtype=np.float32).reshape(B, T, -1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.npy")
        r = subprocess.run([exe, "logits", "-m", os.path.join(root, name), "--ids",
                            ",".join(str(int(i)) for i in ids[0]), "--out", out],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = np.load(out)
    assert got.shape == want[0].shape, (got.shape, want[0].shape)
    err = np.abs(got - want[0]).max() / np.abs(want[0]).max()
    assert err <= 1e-4, err
    r = subprocess.run([exe, "info", "-m", os.path.join(root, name)], capture_output=True, text=True)
    assert r.returncode == 0 and "architecture   qwen3" in r.stdout, r.stdout + r.stderr
    # memory needed: bf16 weights + a 512-token f32 KV cache (max_positions 512)
    import json
    c = json.load(open(os.path.join(root, name, "config.json")))
    kv = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 4
    assert ("KV cache       %.1f KiB per token" % (kv / 1024)) in r.stdout, r.stdout
    # the same logits through a device split, and for a GPT-2 folder
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "s.npy")
        r = subprocess.run([exe, "logits", "-m", os.path.join(root, name), "--ids",
                            ",".join(str(int(i)) for i in ids[0]), "--out", out,
                            "--device-map", "embed:cpu:1;0:cpu:2;1,head:cpu:0"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert np.array_equal(np.load(out), got)
        graw = np.fromfile(os.path.join(root, "gpt2_bare.ids"), dtype=np.int64)
        gB, gT = int(graw[0]), int(graw[1])
        gids = graw[2:].reshape(gB, gT)
        gwant = np.fromfile(os.path.join(root, "gpt2_bare.logits"), dtype=np.float32).reshape(gB, gT, -1)
        r = subprocess.run([exe, "logits", "-m", os.path.join(root, "gpt2_bare"), "--ids",
                            ",".join(str(int(i)) for i in gids[0]), "--out", out],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        gerr = np.abs(np.load(out) - gwant[0]).max() / np.abs(gwant[0]).max()
        assert gerr <= 1e-4, gerr
    r = subprocess.run([exe, "logits", "-m", os.path.join(root, name), "--ids", "3,-1", "--out",
                        "/dev/null"], capture_output=True, text=True)
    assert r.returncode == 2 and "--ids wants comma-separated token ids" in r.stderr, r.stderr
    r = subprocess.run([exe, "info", "-m", os.path.join(root, "bad_unknown_type")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not supported" in r.stderr, r.stderr
    # a file given for its folder: said so, with the folder to give
    r = subprocess.run([exe, "info", "-m", os.path.join(root, name, "config.json")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "got a file" in r.stderr and \
        ("did you mean its folder %s?" % os.path.realpath(os.path.join(root, name))) in r.stderr, \
        r.stderr
    print("check_logits_cli: logits within %.2e of the scale; info and errors as expected" % err)


if __name__ == "__main__":
    main()
