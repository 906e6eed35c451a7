#!/usr/bin/python3
"""check_refs.py TMP COMPAT_OUT — checks the references themselves:
1. ref_models.py reproduces the logits of the older hand-written references
   (tests/reference/hf_qwen3.py, hf_decoders.py, hf_gpt2.py) on their own
   models, run here into TMP;
2. each case of make_models.py (in COMPAT_OUT) exercises its feature: the
   logits move when the feature is switched off (a sliding window longer
   than the sequence, no soft-cap, the short longrope factors, ...).
Exits 1 on any failure."""
import copy
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_models as R  # noqa: E402

failures = 0


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b0, b1 = v["data_offsets"]
        raw = body[b0:b1]
        if v["dtype"] == "BF16":
            a = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = a.view(np.float32)
        else:
            a = np.frombuffer(raw, dtype="<f4")
        out[k] = torch.from_numpy(a.copy()).view(*v["shape"])
    return out


def read_model(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        p = {}
        for fn in sorted(set(json.load(open(idx))["weight_map"].values())):
            p.update(read_safetensors(os.path.join(d, fn)))
        return p
    return read_safetensors(os.path.join(d, "model.safetensors"))


def report(what, err, bound):
    global failures
    ok = err <= bound
    failures += not ok
    print("%-44s %.2e %s (bound %.0e)" % (what, err, "ok" if ok else "FAIL", bound))


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def against_old_references(tmp):
    ref_dir = os.path.join(HERE, "..", "reference")
    for script in ("hf_qwen3.py", "hf_decoders.py", "hf_gpt2.py"):
        subprocess.check_call([sys.executable, os.path.join(ref_dir, script), tmp])
    for name in sorted(os.listdir(tmp)):
        d = os.path.join(tmp, name)
        if not os.path.isdir(d) or name.startswith("bad_"):
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        p = read_model(d)
        if cfg["model_type"] == "gpt2":  # GPT2Model's bare names -> GPT2LMHeadModel's
            p = {(k if k.startswith("transformer.") else "transformer." + k): v
                 for k, v in p.items()}
        raw = open(os.path.join(tmp, name + ".ids"), "rb").read()
        B, T = struct.unpack("<qq", raw[:16])
        ids = torch.from_numpy(np.frombuffer(raw[16:], dtype="<i8").copy()).view(B, T)
        want = torch.from_numpy(np.fromfile(os.path.join(tmp, name + ".logits"),
                                             dtype="<f4")).view(B, T, -1)
        with torch.no_grad():
            got = R.forward(cfg, p, ids)[0]
        report("old reference %s" % name, rel(got, want), 1e-5)


def ablations(out):
    """(case, what, change to the config) whose logits must move."""
    def no_window(c):
        c["sliding_window"] = 4096

    def no_caps(c):
        c["attn_logit_softcapping"] = None
        c["final_logit_softcapping"] = None

    def short_factors(c):
        c["original_max_position_embeddings"] = 64

    def no_biases(c):
        c["attention_bias"] = c["mlp_bias"] = False

    def plain_rope(c):
        c["rope_scaling"] = None

    def no_local_base(c):
        c["rope_local_base_freq"] = c["rope_theta"]

    def all_global(c):
        c["sliding_window_pattern"] = 1

    def no_mlp_only(c):
        c["mlp_only_layers"] = []

    def no_renorm(c):
        c["norm_topk_prob"] = False

    def scalar_is_head_dim(c):
        c["query_pre_attn_scalar"] = c["head_dim"]

    cases = [("mistral", "sliding window", no_window),
             ("mixtral", "sliding window", no_window),
             ("gemma2", "sliding window", no_window),
             ("gemma2", "soft-caps", no_caps),
             ("gemma2", "query_pre_attn_scalar", scalar_is_head_dim),
             ("gemma3", "sliding window", no_window),
             ("gemma3", "linear rope scaling", plain_rope),
             ("gemma3", "rope_local_base_freq", no_local_base),
             ("gemma3", "global layer (pattern)", all_global),
             ("phi3_longrope", "long factors", short_factors),
             ("llama31", "llama3 rope scaling", plain_rope),
             ("qwen3_yarn", "yarn rope scaling", plain_rope),
             ("llama_bias", "attention and MLP biases", no_biases),
             ("qwen3_moe", "mlp_only_layers", None),
             ("qwen3_moe", "norm_topk_prob", no_renorm)]
    for case, what, change in cases:
        d = os.path.join(out, case)
        cfg = json.load(open(os.path.join(d, "config.json")))
        p = read_model(d)
        ref = json.load(open(os.path.join(out, case + ".json")))
        ids = torch.from_numpy(np.fromfile(os.path.join(out, case + ".ids"),
                                           dtype="<i8")).view(ref["B"], ref["T"])
        with torch.no_grad():
            base = R.forward(cfg, p, ids)[0]
            c2 = copy.deepcopy(cfg)
            if change is None:  # layer 1 dense: the describe() sees it as such
                d1 = R.describe(cfg)
                moved = 1.0 if d1["moe"] == [True, False, True] else 0.0
            else:
                change(c2)
                moved = rel(R.forward(c2, p, ids)[0], base)
        global failures
        ok = moved > 1e-3
        failures += not ok
        print("%-44s moves logits by %.2e %s" % ("%s: %s" % (case, what), moved,
                                                   "ok" if ok else "FAIL (not exercised)"))
    # the saved logits are what the reference computes now
    for line in open(os.path.join(out, "cases.txt")):
        case = line.split()[0]
        d = os.path.join(out, case)
        cfg = json.load(open(os.path.join(d, "config.json")))
        ref = json.load(open(os.path.join(out, case + ".json")))
        ids = torch.from_numpy(np.fromfile(os.path.join(out, case + ".ids"),
                                           dtype="<i8")).view(ref["B"], ref["T"])
        want = torch.from_numpy(np.fromfile(os.path.join(out, case + ".logits"),
                                             dtype="<f4")).view(ref["B"], ref["T"], -1)
        with torch.no_grad():
            got = R.forward(cfg, read_model(d), ids)[0]
        report("reloaded %s" % case, rel(got, want), 1e-6)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_refs.py TMP COMPAT_OUT")
    os.makedirs(sys.argv[1], exist_ok=True)
    against_old_references(sys.argv[1])
    ablations(sys.argv[2])
    print("check_refs: %s" % ("%d failed" % failures if failures else "all passed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
