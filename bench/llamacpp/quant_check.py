#!/usr/bin/python3
"""quant_check.py — the bytes llama.cpp's quantizer wrote, set beside the
rows it read, so that Tessera's quantizers can be held against them byte for
byte.

dump: from llama-quantize's output GGUF and the BF16 GGUF it was made from,
for a few tensors, the first rows' source values and quantized blocks:

  PYTHONPATH=build-llamacpp/src/gguf-py /usr/bin/python3 \\
      bench/llamacpp/quant_check.py dump QUANT.gguf BF16.gguf OUTDIR \\
      [--tensors a,b,...] [--rows 32] [--no-oracle]

  OUTDIR/<tensor>.src.npy      f32 (R, C): the rows llama-quantize read
                               (bf16 widened exactly to f32)
  OUTDIR/<tensor>.src.bf16     the same rows as raw bf16 bits, (R, C) u16 LE
  OUTDIR/<tensor>.<type>.bin   llama-quantize's bytes for those rows:
                               R * row_bytes, rows in order (e.g. .q4_k.bin)
  OUTDIR/manifest.json         per tensor: type, rows, cols, block size,
                               bytes per block and per row, file names,
                               sha256, and the oracle's verdict
Unless --no-oracle, each tensor's rows also go through ts-quant-oracle
(build-llamacpp/build/bin, made by tools.sh) into <tensor>.<type>.oracle.bin,
and the manifest says whether the oracle gives llama-quantize's bytes (it
must: it calls the same ggml code).

compare: holds another quantizer's output against a dump:

  quant_check.py compare OUTDIR CANDIDATE_DIR

CANDIDATE_DIR/<tensor>.<type>.bin must hold the same R rows quantized from
<tensor>.src.npy (or .src.bf16); for each tensor it prints "equal" or the
number of differing blocks and the first one (row, block, byte offset, both
blocks in hex). Exit status 1 when any tensor differs or is missing.

Default tensors: token_embd.weight, blk.0.attn_q.weight, blk.0.attn_v.weight,
blk.0.ffn_down.weight, blk.1.ffn_down.weight, and the first tensor of any
quantized type in QUANT.gguf not yet covered (Q4_K_M mixes Q4_K and Q6_K).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LLAMACPP = os.environ.get("LLAMACPP_DIR", os.path.join(ROOT, "build-llamacpp"))
sys.path.insert(0, os.path.join(LLAMACPP, "src", "gguf-py"))
import gguf  # noqa: E402

DEFAULT_TENSORS = ["token_embd.weight", "blk.0.attn_q.weight",
                   "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
                   "blk.1.ffn_down.weight"]
UNQUANTIZED = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
               gguf.GGMLQuantizationType.BF16}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def suffix(qtype):
    """file suffix of a ggml type: Q4_K -> q4_k"""
    return qtype.name.lower()


def pick_tensors(quant, wanted):
    by_name = {t.name: t for t in quant.tensors}
    if wanted:
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise SystemExit(f"tensors not in the quantized file: {', '.join(missing)}")
        return [by_name[n] for n in wanted]
    picked = [by_name[n] for n in DEFAULT_TENSORS if n in by_name]
    covered = {t.tensor_type for t in picked}
    for t in quant.tensors:
        if t.tensor_type not in covered and t.tensor_type not in UNQUANTIZED:
            picked.append(t)
            covered.add(t.tensor_type)
    return picked


def source_rows(src_tensor, rows, path):
    """(R, C) f32 and the raw bits the quantizer read, from the BF16 file"""
    cols = int(src_tensor.shape[0])
    t = src_tensor.tensor_type
    if t == gguf.GGMLQuantizationType.BF16:
        bits = np.asarray(src_tensor.data).view(np.uint16).reshape(-1, cols)[:rows]
        return (bits.astype(np.uint32) << 16).view(np.float32), bits, "bf16"
    if t == gguf.GGMLQuantizationType.F32:
        x = np.asarray(src_tensor.data).reshape(-1, cols)[:rows].astype(np.float32)
        return x, x.view(np.uint32), "f32"
    if t == gguf.GGMLQuantizationType.F16:
        h = np.asarray(src_tensor.data).reshape(-1, cols)[:rows]
        return h.astype(np.float32), h.view(np.uint16), "f16"
    raise SystemExit(f"{path}: {src_tensor.name} is {t.name}; the source must be BF16, F16 or F32")


def run_oracle(oracle, qtype, src_npy, out_bin):
    r = subprocess.run([oracle, qtype.name, src_npy, out_bin],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return out_bin, r.stderr.strip()


def first_difference(a, b, row_bytes, block_bytes):
    """(differing block count, description of the first) for equal-length
    byte arrays laid out as rows of blocks"""
    blocks_a = a.reshape(-1, block_bytes)
    blocks_b = b.reshape(-1, block_bytes)
    diff = np.nonzero((blocks_a != blocks_b).any(axis=1))[0]
    if len(diff) == 0:
        return 0, ""
    k = int(diff[0])
    per_row = row_bytes // block_bytes
    byte = int(np.nonzero(blocks_a[k] != blocks_b[k])[0][0])
    return len(diff), (f"first at row {k // per_row}, block {k % per_row}, byte {byte} of the "
                       f"block (file offset {k * block_bytes + byte})\n"
                       f"    expected {blocks_a[k].tobytes().hex()}\n"
                       f"    got      {blocks_b[k].tobytes().hex()}")


def dump(a):
    quant = gguf.GGUFReader(a.quant)
    src = gguf.GGUFReader(a.source)
    src_by_name = {t.name: t for t in src.tensors}
    wanted = [n for n in a.tensors.split(",") if n] if a.tensors else None
    oracle = None if a.no_oracle else os.path.join(LLAMACPP, "build", "bin", "ts-quant-oracle")
    if oracle and not os.access(oracle, os.X_OK):
        raise SystemExit(f"{oracle}: not built (bench/llamacpp/build.sh), or pass --no-oracle")
    os.makedirs(a.outdir, exist_ok=True)
    entries, bad = [], 0
    for qt in pick_tensors(quant, wanted):
        if qt.name not in src_by_name:
            raise SystemExit(f"{a.source}: no tensor {qt.name}")
        st = src_by_name[qt.name]
        if list(st.shape) != list(qt.shape):
            raise SystemExit(f"{qt.name}: shape {list(st.shape)} in {a.source}, "
                             f"{list(qt.shape)} in {a.quant}")
        cols, total_rows = int(qt.shape[0]), int(np.prod(qt.shape[1:]))
        rows = total_rows if a.rows <= 0 else min(a.rows, total_rows)
        block, block_bytes = gguf.GGML_QUANT_SIZES[qt.tensor_type]
        row_bytes = cols // block * block_bytes
        x, bits, src_type = source_rows(st, rows, a.source)
        base = os.path.join(a.outdir, qt.name)
        np.save(base + ".src.npy", np.ascontiguousarray(x))
        np.ascontiguousarray(bits).tofile(base + f".src.{src_type}")
        q = np.asarray(qt.data).reshape(-1)[: rows * row_bytes]
        qbin = base + f".{suffix(qt.tensor_type)}.bin"
        q.tofile(qbin)
        e = {"tensor": qt.name, "type": qt.tensor_type.name, "type_id": int(qt.tensor_type),
             "rows": rows, "cols": cols, "total_rows": total_rows,
             "block_size": block, "block_bytes": block_bytes, "row_bytes": row_bytes,
             "src_npy": os.path.basename(base + ".src.npy"),
             "src_raw": os.path.basename(base + f".src.{src_type}"), "src_type": src_type,
             "llama_quantize_bin": os.path.basename(qbin), "sha256": sha256(qbin)}
        verdict = "quantized by llama-quantize"
        if qt.tensor_type in UNQUANTIZED:
            verdict = f"kept as {qt.tensor_type.name} by llama-quantize (nothing to check)"
        elif oracle:
            obin = base + f".{suffix(qt.tensor_type)}.oracle.bin"
            got, msg = run_oracle(oracle, qt.tensor_type, base + ".src.npy", obin)
            if got is None:
                e["oracle"] = f"failed: {msg}"
                bad += 1
            else:
                n, first = first_difference(q, np.fromfile(obin, dtype=np.uint8),
                                            row_bytes, block_bytes)
                e["oracle"] = "equal" if n == 0 else f"{n} blocks differ; {first}"
                bad += n != 0
            verdict = f"oracle {e['oracle'].splitlines()[0]}"
        entries.append(e)
        print(f"{qt.name:28s} {qt.tensor_type.name:5s} {rows:6d} x {cols:5d} "
              f"({row_bytes} B/row) {verdict}")
    manifest = {"quantized_gguf": os.path.abspath(a.quant),
                "source_gguf": os.path.abspath(a.source), "tensors": entries}
    with open(os.path.join(a.outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"{a.outdir}/manifest.json: {len(entries)} tensors")
    return 1 if bad else 0


def compare(a):
    with open(os.path.join(a.outdir, "manifest.json")) as f:
        manifest = json.load(f)
    status = 0
    for e in manifest["tensors"]:
        if e["type"] in ("F32", "F16", "BF16"):
            continue
        ref = np.fromfile(os.path.join(a.outdir, e["llama_quantize_bin"]), dtype=np.uint8)
        path = os.path.join(a.candidate_dir, e["llama_quantize_bin"])
        if not os.path.exists(path):
            print(f"{e['tensor']:28s} {e['type']:5s} missing: {path}")
            status = 1
            continue
        got = np.fromfile(path, dtype=np.uint8)
        if got.size != ref.size:
            print(f"{e['tensor']:28s} {e['type']:5s} {got.size} bytes, {ref.size} expected")
            status = 1
            continue
        n, first = first_difference(ref, got, e["row_bytes"], e["block_bytes"])
        total = ref.size // e["block_bytes"]
        if n == 0:
            print(f"{e['tensor']:28s} {e['type']:5s} equal ({total} blocks)")
        else:
            print(f"{e['tensor']:28s} {e['type']:5s} {n} of {total} blocks differ; {first}")
            status = 1
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="rows and llama-quantize's bytes for a few tensors")
    d.add_argument("quant", help="GGUF written by llama-quantize")
    d.add_argument("source", help="the BF16 (or F16/F32) GGUF it was quantized from")
    d.add_argument("outdir")
    d.add_argument("--tensors", help="comma-separated tensor names")
    d.add_argument("--rows", type=int, default=32, help="rows per tensor, 0 for all (default 32)")
    d.add_argument("--no-oracle", action="store_true", help="do not run ts-quant-oracle")
    c = sub.add_parser("compare", help="hold a candidate's bytes against a dump")
    c.add_argument("outdir", help="a folder written by dump")
    c.add_argument("candidate_dir", help="folder with <tensor>.<type>.bin files")
    a = ap.parse_args()
    sys.exit(dump(a) if a.cmd == "dump" else compare(a))


if __name__ == "__main__":
    main()
