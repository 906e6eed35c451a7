#!/usr/bin/python3
"""check_tools.py — checks the tools of this folder against independent
references before their figures are trusted:

1. ts-quant-oracle against gguf-py's numpy quantizers (Q4_0, Q4_1, Q5_0,
   Q5_1, Q8_0: byte for byte) and dequantizers (those and Q2_K..Q6_K: the
   oracle's --dequant must equal gguf-py's dequantization of its bytes),
   on fixed-seed rows with outliers, zeros and tiny values.
2. The random model: the BF16 GGUF's tensors hold the bytes of the HF
   folder's safetensors (every tensor), and llama.cpp's logits on the BF16
   GGUF (ts-llama-logits) agree with the PyTorch reference forward
   (tests/ref/nn_ref.py's qwen3_forward, after modeling_qwen3.py) on the HF
   folder, for a fixed sequence of ids: the two files are one model, and
   llama.cpp reads it as Qwen3.

  PYTHONPATH=build-llamacpp/src/gguf-py /usr/bin/python3 bench/llamacpp/check_tools.py
      [--models build-llamacpp/models] [--stem qwen3-0.6b-random] [--threads 2]

Exit status 1 when a check fails.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LLAMACPP = os.environ.get("LLAMACPP_DIR", os.path.join(ROOT, "build-llamacpp"))
BIN = os.path.join(LLAMACPP, "build", "bin")
sys.path.insert(0, os.path.join(LLAMACPP, "src", "gguf-py"))
import gguf  # noqa: E402
from gguf import quants  # noqa: E402

Q = gguf.GGMLQuantizationType
NUMPY_QUANTIZERS = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
DEQUANT_ONLY = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
failures = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def test_rows():
    """(16, 512) f32: normal * 0.02, a zero row, a row with outliers, a
    row of tiny values, a constant row, and bf16-representable values"""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((16, 512)) * 0.02).astype(np.float32)
    x[1] = 0
    x[2, ::37] *= 500
    x[3] *= 1e-6
    x[4] = 0.25
    x[5] = (x[5].view(np.uint32) & 0xFFFF0000).view(np.float32)
    return x


def oracle(qtype, x, tmp):
    src = os.path.join(tmp, "rows.npy")
    np.save(src, x)
    out, deq = os.path.join(tmp, "q.bin"), os.path.join(tmp, "deq.f32")
    r = subprocess.run([os.path.join(BIN, "ts-quant-oracle"), qtype.name, src, out,
                        "--dequant", deq], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ts-quant-oracle {qtype.name}: {r.stderr.strip()}")
    return np.fromfile(out, dtype=np.uint8), np.fromfile(deq, dtype=np.float32)


def check_oracle():
    x = test_rows()
    with tempfile.TemporaryDirectory() as tmp:
        for qt in NUMPY_QUANTIZERS + DEQUANT_ONLY:
            q, deq = oracle(qt, x, tmp)
            q2 = q.reshape(x.shape[0], -1)
            if qt in NUMPY_QUANTIZERS:
                ref = quants.quantize(x, qt).reshape(q2.shape)
                nd = int((ref != q2).sum())
                check(nd == 0, f"oracle {qt.name} bytes = gguf-py's numpy quantizer"
                      + ("" if nd == 0 else f" ({nd} bytes differ)"))
            ref_deq = quants.dequantize(q2, qt).reshape(-1)
            d = float(np.max(np.abs(ref_deq - deq)))
            check(d == 0.0, f"oracle {qt.name} --dequant = gguf-py's dequantize"
                  + ("" if d == 0 else f" (max |diff| {d:g})"))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[a:b])
    return out


def check_model(models, stem, threads):
    gguf_path = os.path.join(models, f"{stem}-bf16.gguf")
    hf_dir = os.path.join(models, f"{stem}-hf")
    st = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    r = gguf.GGUFReader(gguf_path)
    sys.path.insert(0, HERE)
    from make_qwen3_gguf import tensor_plan  # noqa: E402  (the name map)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    s = dict(V=cfg["vocab_size"], C=cfg["hidden_size"], L=cfg["num_hidden_layers"],
             H=cfg["num_attention_heads"], KV=cfg["num_key_value_heads"],
             D=cfg["head_dim"], F=cfg["intermediate_size"])
    by_name = {t.name: t for t in r.tensors}
    same = 0
    for hf_name, gg_name, shape, is_norm in tensor_plan(s):
        t = by_name[gg_name]
        dt, sh, raw = st[hf_name]
        bits = raw.view(np.uint16).reshape(sh)
        if is_norm:
            g = np.asarray(t.data, dtype=np.float32)
            ok = np.array_equal(g, (bits.astype(np.uint32) << 16).view(np.float32))
        else:
            ok = t.tensor_type == Q.BF16 and np.array_equal(
                np.asarray(t.data).view(np.uint16).reshape(sh), bits)
        same += ok
        if not ok:
            check(False, f"{gg_name} differs from {hf_name}")
    check(same == len(by_name) == len(st),
          f"{gguf_path}: all {len(by_name)} tensors hold the safetensors' values")

    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    from nn_ref import qwen3_forward  # noqa: E402
    ids = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198,
           785, 6722, 315, 9625]  # "<|im_start|>user\nHello, world!<|im_end|>..."
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        rr = subprocess.run([os.path.join(BIN, "ts-llama-logits"), "-m", gguf_path,
                             "--ids", ",".join(map(str, ids)), "-o", out, "-t", str(threads)],
                            capture_output=True, text=True)
        if rr.returncode != 0:
            check(False, f"ts-llama-logits: {rr.stderr.strip()[-300:]}")
            return
        got = np.fromfile(out, dtype=np.float32).reshape(len(ids), s["V"])
    p = {}
    for name, (dt, sh, raw) in st.items():
        bits = raw.view(np.uint16).reshape(sh).astype(np.uint32) << 16
        p[name] = torch.from_numpy(bits.view(np.float32))
    cfgv = [s["V"], s["C"], s["L"], s["H"], s["KV"], s["D"], s["F"],
            cfg["rms_norm_eps"], cfg["rope_theta"], 1.0, cfg["max_position_embeddings"]]
    with torch.no_grad():
        ref = qwen3_forward(p, cfgv, torch.tensor([ids]), 0)[0].numpy()
    err = np.abs(got - ref)
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    top = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    # llama.cpp's CPU backend multiplies BF16 weights by activations rounded
    # to bf16, so it is not f32-exact; a wrong layout or rope would give a
    # relative error near 1
    check(rel < 0.02 and top >= 0.9,
          f"llama.cpp's logits on the BF16 GGUF vs PyTorch on the HF folder: "
          f"relative L2 error {rel:.4f}, max |diff| {float(err.max()):.4f} "
          f"(logits' sd {float(ref.std()):.3f}), argmax agrees at {top * 100:.0f}% of "
          f"{len(ids)} positions")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=os.path.join(LLAMACPP, "models"))
    ap.add_argument("--stem", default="qwen3-0.6b-random")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-model", action="store_true", help="only the oracle checks")
    a = ap.parse_args()
    check_oracle()
    if not a.skip_model:
        check_model(a.models, a.stem, a.threads)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
