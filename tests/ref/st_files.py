#!/usr/bin/python3
"""Writes safetensors files for tests/test_safetensors.c into DIR (argv[1]):
valid ones in Hugging Face's exact layout (written here byte by byte, the
way the safetensors library does: u64 header length, JSON header padded with
spaces to 8 bytes, data back to back) and malformed ones, each broken in one
way. Values follow simple formulas the C test recomputes."""
import json
import os
import struct
import sys

import numpy as np


def bf16_bytes(a):
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    return (u >> 16).astype(np.uint16).tobytes()  # values exact in bf16


def tensors():
    return [
        ("w.f32", "F32", [3, 4], (np.arange(12, dtype=np.float32) * 0.5).tobytes()),
        ("w.bf16", "BF16", [6], bf16_bytes(np.arange(6) - 2.5)),
        ("w.f16", "F16", [2, 2], (np.arange(4, dtype=np.float16) / 4).tobytes()),
        ("ids.i64", "I64", [5], (np.arange(5, dtype=np.int64) * 1000000007).tobytes()),
        ("ids.i32", "I32", [2, 3], (np.arange(6, dtype=np.int32) - 3).tobytes()),
        ("scalar", "F32", [], np.array([7.25], dtype=np.float32).tobytes()),
        ("empty", "F32", [0, 3], b""),
    ]


def write(path, items, meta=None, pad_to=8, header_override=None, data_extra=b"",
          cut=0, length_override=None):
    hdr = {}
    off = 0
    for name, dt, shape, data in items:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    if meta:
        hdr["__metadata__"] = meta
    h = header_override if header_override is not None else json.dumps(hdr).encode()
    if pad_to:
        h += b" " * ((-len(h)) % pad_to)
    n = length_override if length_override is not None else len(h)
    blob = struct.pack("<Q", n) + h + b"".join(d for _, _, _, d in items) + data_extra
    if cut:
        blob = blob[:-cut]
    with open(path, "wb") as f:
        f.write(blob)


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    items = tensors()
    write(f"{d}/valid.safetensors", items, meta={"format": "pt", "note": "tessera"})
    # the header padded to 8k + 1 bytes: the data section starts unaligned,
    # so tensors are copied out instead of viewed
    hdr = {}
    off = 0
    for name, dt, shape, data in items:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8 + 1)
    with open(f"{d}/unaligned.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(x[3] for x in items))
    # sharded folder: two shards and an index
    os.makedirs(f"{d}/sharded", exist_ok=True)
    write(f"{d}/sharded/model-00001-of-00002.safetensors", items[:3])
    write(f"{d}/sharded/model-00002-of-00002.safetensors", items[3:])
    wm = {n: ("model-00001-of-00002.safetensors" if i < 3 else
              "model-00002-of-00002.safetensors") for i, (n, *_r) in enumerate(items)}
    with open(f"{d}/sharded/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    # an index naming a tensor its shard does not hold
    os.makedirs(f"{d}/badindex", exist_ok=True)
    write(f"{d}/badindex/a.safetensors", items[:2])
    with open(f"{d}/badindex/model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"w.f32": "a.safetensors", "ghost": "a.safetensors"}}, f)

    one = [items[0]]
    bad = {
        "truncated": dict(cut=5),
        "tiny": None,
        "header_too_long": dict(length_override=10**9),
        "header_past_end": dict(length_override=4096),
        "not_json": dict(header_override=b"{not json"),
        "not_object": dict(header_override=b"[1, 2, 3]"),
        "unknown_dtype": dict(header_override=json.dumps(
            {"w.f32": {"dtype": "Q7", "shape": [3, 4], "data_offsets": [0, 48]}}).encode()),
        "unsupported_dtype": dict(header_override=json.dumps(
            {"w.f32": {"dtype": "F64", "shape": [3, 2], "data_offsets": [0, 48]}}).encode()),
        "size_mismatch": dict(header_override=json.dumps(
            {"w.f32": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 48]}}).encode()),
        "negative_shape": dict(header_override=json.dumps(
            {"w.f32": {"dtype": "F32", "shape": [-3, 4], "data_offsets": [0, 48]}}).encode()),
        "missing_field": dict(header_override=json.dumps(
            {"w.f32": {"dtype": "F32", "data_offsets": [0, 48]}}).encode()),
        "overlap": dict(header_override=json.dumps(
            {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
             "b": {"dtype": "F32", "shape": [8], "data_offsets": [16, 48]}}).encode()),
        "hole": dict(header_override=json.dumps(
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
             "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}}).encode()),
        "past_data": dict(header_override=json.dumps(
            {"a": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}}).encode()),
        "trailing_bytes": dict(data_extra=b"\0" * 16),
        "duplicate_key": dict(header_override=(
            b'{"a": {"dtype": "F32", "shape": [12], "data_offsets": [0, 48]}, '
            b'"a": {"dtype": "F32", "shape": [12], "data_offsets": [0, 48]}}')),
    }
    for name, kw in bad.items():
        if kw is None:
            with open(f"{d}/bad_{name}.safetensors", "wb") as f:
                f.write(b"\x05\x00\x00")
        else:
            write(f"{d}/bad_{name}.safetensors", one, **kw)


if __name__ == "__main__":
    main()
