#!/usr/bin/python3
"""gguf_models.py TESSERA MODELS WORK — GGUF models end to end, on the two
folders tests/reference/hf_gguf_models.py wrote in MODELS (a Qwen3 with tied
embeddings and a Llama whose q/k rows GGUF permutes; every matrix whole rows
of 256, so each block format applies without a fallback). Files go to WORK.

1. tests/ref/gguf_writer.py (written from the spec, not from Tessera) makes
   f32 and bf16 GGUFs of each folder: `tessera logits` of each equals the
   folder's bit for bit at the same --dtype.
2. The same writer makes q8_0, q4_0, q4_k, q5_k and q6_k GGUFs (every matrix
   in that format, blocks by tests/ref/ggml_quants.py, norms f32): Tessera's
   logits stay within a bound of the folder's (max |diff| / max |logit|) and
   agree on the top-1 token at a bounded share of the positions; and they
   equal (to DEQUANT_TOL) Tessera's logits of a folder holding the blocks
   dequantized here as ggml's dequantize_row_* does.
3. `tessera convert --type f32|bf16`: the reader finds every tensor equal to
   the folder's (llama's q/k permuted back; bf16 rounded to nearest even),
   the architecture's hyperparameters, the tokenizer's tokens and merges and
   the chat template in the metadata; its logits equal the folder's.
4. `tessera quantize --type q8_0|q4_k_m`: each tensor's type is llama.cpp's
   choice (llama_tensor_get_type, no importance matrix) and its bytes are
   ggml_quants.py's quantization of the same rows; a q8_0 GGUF requantized
   to q4_k_m holds the reference's quantization of its dequantized rows;
   the files' logits stay within check 2's bounds (q4_k's for q4_k_m).
5. `tessera run` of the f32 conversion writes the folder's greedy text
   (plain prompt and --chat through the template from the metadata).
6. Errors: an unknown --type (the types listed), a missing input, truncated
   GGUFs given to `tessera run`: a message and exit 1, no crash."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import ggml_quants as gq  # noqa: E402
import gguf_writer as gw  # noqa: E402

exe, models, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

MODELS = ("qwen3_256", "llama_256")
T = 48  # positions compared per model
# check 2's bounds per model and format against the folder's f32 logits:
# the most max |diff| / max |logit|, the least share of the T positions whose
# top-1 token agrees (measured on this machine: qwen3 0.0085 0.032 0.067
# 0.112 0.129, all top-1 1.0; llama 0.024 0.071 0.121 0.218 0.380, top-1
# 0.96 0.90 0.71 0.63 0.56: the random Llama, untied and without q/k norms,
# spreads a weight's error further, and its flat random logits flip top-1
# more easily)
BOUNDS = {
    "qwen3_256": {"q8_0": (0.015, 0.95), "q6_k": (0.05, 0.9), "q5_k": (0.1, 0.9),
                  "q4_k": (0.17, 0.85), "q4_0": (0.2, 0.85)},
    "llama_256": {"q8_0": (0.035, 0.9), "q6_k": (0.1, 0.8), "q5_k": (0.18, 0.6),
                  "q4_k": (0.3, 0.5), "q4_0": (0.5, 0.45)},
}
# Tessera's logits of a quantized GGUF against its logits of a folder holding
# the same blocks dequantized here (ggml's dequantize_row_*), both at the
# sse2 level (TS_CPU_ISA), where a prefill's many rows multiply dequantized
# f32 weights (above it the int8 kernels quantize the activations too): the
# blocks are read as ggml reads them (measured: 0, the same f32 products)
DEQUANT_TOL = 1e-5
GGML_OF = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}
TYPE_NAME = {v[0]: k for k, v in gw.GGML.items()}
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL " + what)
    return ok


def run(*args, timeout=300, isa=None):
    env = dict(os.environ)
    if isa:  # the kernels of that ISA level (every machine has sse2)
        env["TS_CPU_ISA"] = isa
    return subprocess.run([exe, *args], capture_output=True, timeout=timeout, env=env)


def crashed(r):  # killed by a signal, or a sanitizer's report
    err = r.stderr.decode(errors="replace")
    return r.returncode < 0 or r.returncode > 2 or "Sanitizer" in err or "runtime error" in err


n_logits = 0


def logits(model, ids, dtype="f32", isa=None):
    global n_logits
    n_logits += 1
    out = os.path.join(work, "logits_%d.npy" % n_logits)
    r = run("logits", "-m", model, "--ids", ",".join(map(str, ids)), "--out", out,
            "--dtype", dtype, isa=isa)
    if not check(r.returncode == 0, "tessera logits -m %s: %s" % (model, r.stderr.decode())):
        return None
    return np.load(out)


def bf16_rne(a):
    """f32 -> bf16 bits, rounded to nearest even (as llama.cpp's converter
    and a cast do; the data hold no NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def llama_unpermute(w, n_head):  # the inverse of gguf_writer.llama_permute
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def use_more_bits(i, n):  # llama.cpp's, for the _M types
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(ftype, gname, ndim, tied, n_layers):
    """llama_tensor_get_type for q8_0 and q4_k_m without an importance
    matrix, rows whole 256-blocks: 1-D tensors stay F32; under q8_0 every
    matrix is Q8_0 (the output too); under q4_k_m the output (or a tied
    token_embd) is Q6_K, attn_v and ffn_down of the use_more_bits layers
    Q6_K, every other matrix Q4_K."""
    if ndim < 2:
        return "F32"
    if ftype == "q8_0":
        return "Q8_0"
    if gname == "output.weight" or (tied and gname == "token_embd.weight"):
        return "Q6_K"
    m = re.fullmatch(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight", gname)
    if m and use_more_bits(int(m[1]), n_layers):
        return "Q6_K"
    return "Q4_K"


class Model:
    """A folder, its Python f32 GGUF, and the reference blocks of its rows
    in GGUF layout (computed once per tensor and format)."""

    def __init__(self, name):
        self.name, self.dir = name, os.path.join(models, name)
        self.cfg = json.load(open(os.path.join(self.dir, "config.json")))
        self.tok = json.load(open(os.path.join(self.dir, "tokenizer.json")))
        self.tok_cfg = json.load(open(os.path.join(self.dir, "tokenizer_config.json")))
        self.arch = self.cfg["model_type"]
        self.tied = self.cfg["tie_word_embeddings"]
        self.layers = self.cfg["num_hidden_layers"]
        self.hf = {n: a for n, _, a in gw.read_safetensors(os.path.join(self.dir, "model.safetensors"))}
        self.f32_gguf = os.path.join(work, name + ".py_f32.gguf")
        gw.convert(self.dir, self.f32_gguf)
        self.ref = gw.Reader(self.f32_gguf)
        self.rows = {}  # gguf name -> f32 array as the GGUF holds it (ne reversed)
        for n in self.ref.tensor_order:
            num, ne, _ = self.ref.tensors[n]
            assert TYPE_NAME.get(num, str(num)) == "F32", (n, num)
            self.rows[n] = np.frombuffer(self.ref.data[n], dtype=np.float32).reshape(ne[::-1])
        self.blocks = {}
        rng = np.random.default_rng(17)
        self.ids = [int(i) for i in rng.integers(0, self.cfg["vocab_size"], T)]

    def quantized(self, gname, fmt):
        key = (gname, fmt)
        if key not in self.blocks:
            self.blocks[key] = gq.QUANTIZERS[fmt](self.rows[gname])
        return self.blocks[key]

    def heads_of(self, gname):  # llama's permuted tensors: their head count
        if self.arch != "llama":
            return 0
        if gname.endswith("attn_q.weight"):
            return self.cfg["num_attention_heads"]
        if gname.endswith("attn_k.weight"):
            return self.cfg["num_key_value_heads"]
        return 0


def retype(m, fmt, out):
    """m's f32 GGUF rewritten by the Python writer: matrices as fmt ("BF16" or
    a block format), 1-D tensors f32, the metadata as it is."""
    w = gw.Writer()
    for k in m.ref.order:
        w.add(k, *m.ref.kv[k])
    for n in m.ref.tensor_order:
        a = m.rows[n]
        ne = list(reversed(a.shape))
        if a.ndim < 2:
            w.tensor(n, "F32", ne, a.tobytes())
        elif fmt == "BF16":
            w.tensor(n, "BF16", ne, bf16_rne(a).tobytes())
        else:
            w.tensor(n, GGML_OF[fmt], ne, m.quantized(n, fmt))
    w.save(out)


def f16(b):  # (n, 2) bytes -> (n, 1) f32
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def scale_min_k4(sc):
    """get_scale_min_k4 for j = 0..7: (n, 12) bytes -> (n, 8) scales, mins."""
    sc = sc.astype(np.int64)
    d = np.empty((sc.shape[0], 8), np.int64)
    m = np.empty_like(d)
    d[:, :4], m[:, :4] = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    d[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return d.astype(np.float32), m.astype(np.float32)


def dequantize(fmt, data, shape):
    """ggml's dequantize_row_{q8_0,q4_0,q4_K,q5_K,q6_K}: blocks -> f32 rows."""
    bb = {"q8_0": 34, "q4_0": 18, "q4_k": 144, "q5_k": 176, "q6_k": 210}[fmt]
    b = np.frombuffer(data, dtype=np.uint8).reshape(-1, bb)
    if fmt == "q8_0":
        y = b[:, 2:].copy().view(np.int8).astype(np.float32) * f16(b[:, 0:2])
    elif fmt == "q4_0":
        q = b[:, 2:].astype(np.int64)
        y = np.concatenate([(q & 0xF) - 8, (q >> 4) - 8], axis=1).astype(np.float32) * f16(b[:, 0:2])
    elif fmt in ("q4_k", "q5_k"):
        d, dmin = f16(b[:, 0:2]), f16(b[:, 2:4])
        sc, mn = scale_min_k4(b[:, 4:16])
        ql = b[:, 16:144] if fmt == "q4_k" else b[:, 48:176]
        qh = b[:, 16:48].astype(np.int64) if fmt == "q5_k" else None
        y = np.empty((b.shape[0], 256), np.float32)
        for c in range(4):  # 64 values: 32 low nibbles, then 32 high ones
            q = ql[:, 32 * c:32 * c + 32].astype(np.int64)
            for half, nib in ((0, q & 0xF), (1, q >> 4)):
                j = 2 * c + half
                if qh is not None:
                    nib = nib + ((qh >> j) & 1) * 16
                dj = (d[:, 0] * sc[:, j]).astype(np.float32)
                mj = (dmin[:, 0] * mn[:, j]).astype(np.float32)
                y[:, 32 * j:32 * j + 32] = (dj[:, None] * nib.astype(np.float32)) - mj[:, None]
    else:  # q6_k: ql[128], qh[64], 16 int8 scales, d
        d = f16(b[:, 208:210])
        sc = b[:, 192:208].copy().view(np.int8).astype(np.float32)
        y = np.empty((b.shape[0], 256), np.float32)
        for h in range(2):
            ql = b[:, 64 * h:64 * h + 64].astype(np.int64)
            qh = b[:, 128 + 32 * h:160 + 32 * h].astype(np.int64)
            qs = [(ql[:, 0:32] & 0xF) | (((qh >> 0) & 3) << 4), (ql[:, 32:64] & 0xF) | (((qh >> 2) & 3) << 4),
                  (ql[:, 0:32] >> 4) | (((qh >> 4) & 3) << 4), (ql[:, 32:64] >> 4) | (((qh >> 6) & 3) << 4)]
            for s4, q in enumerate(qs):
                for l16 in range(2):
                    g = 8 * h + 2 * s4 + l16
                    ds = (d[:, 0] * sc[:, g]).astype(np.float32)
                    lo = 128 * h + 32 * s4 + 16 * l16
                    y[:, lo:lo + 16] = ds[:, None] * (q[:, 16 * l16:16 * l16 + 16] - 32).astype(np.float32)
    return y.astype(np.float32).reshape(shape)


def dequantized_folder(m, fmt, out):
    """m's folder with every matrix replaced by its fmt blocks dequantized
    (llama's q/k rows back in Hugging Face's order)."""
    os.makedirs(out, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(m.dir, f), out)
    ts = []
    for hname, a in m.hf.items():
        g = gw.gguf_name(m.arch, hname)
        if a.ndim == 2:
            a = dequantize(fmt, m.quantized(g, fmt), m.rows[g].shape)
            if m.heads_of(g):
                a = llama_unpermute(a, m.heads_of(g))
        ts.append((hname, np.ascontiguousarray(a)))
    gw.write_st(os.path.join(out, "model.safetensors"), ts)


def compare_logits(what, got, want):
    if got is None or want is None:
        return
    same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    diff = np.abs(got - want).max() / np.abs(want).max() if got.shape == want.shape else float("inf")
    print("  %-52s %s (max |diff| / max |logit| %.3g)" % (what, "equal bit for bit" if same else "DIFFERENT",
                                                          diff))
    check(same, what + ": logits differ")


def check1(m, base):
    print("1. %s: the Python writer's f32 and bf16 GGUFs" % m.name)
    bf16_gguf = os.path.join(work, m.name + ".py_bf16.gguf")
    retype(m, "BF16", bf16_gguf)
    compare_logits("f32 GGUF, --dtype f32", logits(m.f32_gguf, m.ids), base["f32"])
    compare_logits("f32 GGUF, --dtype bf16", logits(m.f32_gguf, m.ids, "bf16"), base["bf16"])
    compare_logits("bf16 GGUF, --dtype bf16", logits(bf16_gguf, m.ids, "bf16"), base["bf16"])


def check2(m, base):
    print("2. %s: the Python writer's quantized GGUFs against the folder's f32 logits, and against"
          " the folder of their blocks dequantized (bound %g)" % (m.name, DEQUANT_TOL))
    want = base["f32"]
    top_want = want.argmax(axis=1)
    measured = {}
    for fmt, (max_rel, min_top1) in BOUNDS[m.name].items():
        path = os.path.join(work, "%s.py_%s.gguf" % (m.name, fmt))
        retype(m, fmt, path)
        deq = os.path.join(work, "%s.dequantized_%s" % (m.name, fmt))
        dequantized_folder(m, fmt, deq)
        got, ref = logits(path, m.ids), logits(deq, m.ids, isa="sse2")
        got0 = logits(path, m.ids, isa="sse2")
        if got is None or ref is None or got0 is None:
            continue
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        top1 = float((got.argmax(axis=1) == top_want).mean())
        drel = float(np.abs(got0 - ref).max() / np.abs(ref).max())
        measured[fmt] = rel
        ok = rel <= max_rel and top1 >= min_top1 and drel <= DEQUANT_TOL
        print("  %-5s max |diff| / max |logit| %.4f (bound %.3f), top-1 agreement %2d/%d = %.3f (bound %.2f); "
              "against the dequantized folder %.2g %s" % (fmt, rel, max_rel, round(top1 * T), T, top1, min_top1,
                                                         drel, "ok" if ok else "OUT OF BOUNDS"))
        check(ok, "%s %s: error %.4f / top-1 %.3f / dequantized %.3g out of bounds" % (m.name, fmt, rel, top1,
                                                                                       drel))
    if len(measured) == len(BOUNDS[m.name]):  # more bits, closer logits
        check(measured["q8_0"] < measured["q6_k"] < measured["q5_k"] < measured["q4_k"] and
              measured["q8_0"] < measured["q4_0"], "%s: errors not ordered by bits: %s" % (m.name, measured))


def tensors_equal_folder(m, r, kind):
    """Every folder tensor in r under its GGUF name, equal to the folder's
    (f32) or its nearest-even bf16 (matrices of a bf16 file)."""
    bad = 0
    for hname, a in m.hf.items():
        g = gw.gguf_name(m.arch, hname)
        if not check(g in r.tensors, "%s %s: no tensor %s" % (m.name, kind, g)):
            bad += 1
            continue
        num, ne, _ = r.tensors[g]
        want_t = "BF16" if kind == "bf16" and a.ndim == 2 else "F32"
        if not check(TYPE_NAME.get(num, str(num)) == want_t and ne == list(reversed(a.shape)),
                     "%s %s: %s is %s %s, want %s %s" % (m.name, kind, g, TYPE_NAME.get(num, str(num)), ne, want_t,
                                                         list(reversed(a.shape)))):
            bad += 1
            continue
        dt = np.uint16 if want_t == "BF16" else np.float32
        got = np.frombuffer(r.data[g], dtype=dt).reshape(a.shape)
        if m.heads_of(g):
            got = llama_unpermute(got, m.heads_of(g))
        want = bf16_rne(a) if want_t == "BF16" else a
        if not check(np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)),
                     "%s %s: %s differs from the folder's %s" % (m.name, kind, g, hname)):
            bad += 1
    extra = set(r.tensors) - {gw.gguf_name(m.arch, n) for n in m.hf}
    check(not extra, "%s %s: tensors the folder lacks: %s" % (m.name, kind, sorted(extra)))
    return bad


def metadata_ok(m, r, kind, file_type):
    """The architecture's hyperparameters from config.json, the tokenizer's
    tokens (by id), merges and eos, the chat template; and every key the
    Python converter writes, with its value."""
    c, a = m.cfg, m.arch
    want = {
        "general.architecture": (gw.STR, a.encode()),
        "general.file_type": (gw.U32, file_type),
        a + ".block_count": (gw.U32, c["num_hidden_layers"]),
        a + ".embedding_length": (gw.U32, c["hidden_size"]),
        a + ".feed_forward_length": (gw.U32, c["intermediate_size"]),
        a + ".context_length": (gw.U32, c["max_position_embeddings"]),
        a + ".attention.head_count": (gw.U32, c["num_attention_heads"]),
        a + ".attention.head_count_kv": (gw.U32, c["num_key_value_heads"]),
        a + ".attention.key_length": (gw.U32, c["head_dim"]),
        a + ".attention.value_length": (gw.U32, c["head_dim"]),
        a + ".rope.freq_base": (gw.F32, float(np.float32(c["rope_theta"]))),
        a + ".attention.layer_norm_rms_epsilon": (gw.F32, float(np.float32(c["rms_norm_eps"]))),
        "tokenizer.ggml.model": (gw.STR, b"gpt2"),
        "tokenizer.ggml.eos_token_id": (gw.U32, c["eos_token_id"]),
        "tokenizer.chat_template": (gw.STR, m.tok_cfg["chat_template"].encode()),
    }
    vocab = dict(m.tok["model"]["vocab"])
    for t in m.tok["added_tokens"]:
        vocab[t["content"]] = t["id"]
    by_id = sorted(vocab, key=vocab.get)
    want["tokenizer.ggml.tokens"] = (gw.ARR, (gw.STR, [t.encode() for t in by_id]))
    want["tokenizer.ggml.merges"] = (gw.ARR, (gw.STR, [" ".join(p).encode() for p in m.tok["model"]["merges"]]))
    for k, v in m.ref.kv.items():  # the Python converter's keys, all of them
        want.setdefault(k, v)
    bad = [k for k, v in want.items() if r.kv.get(k) != v]
    for k in bad:
        print("  %s: %s = %s, want %s" % (kind, k, str(r.kv.get(k))[:120], str(want[k])[:120]))
    check(not bad, "%s %s: metadata keys wrong or missing: %s" % (m.name, kind, bad))
    return len(want) - len(bad), len(want)


def check3(m, base):
    print("3. %s: tessera convert" % m.name)
    for kind, ftype in (("f32", 0), ("bf16", 32)):
        out = os.path.join(work, "%s.convert_%s.gguf" % (m.name, kind))
        r = run("convert", m.dir, out, "--type", kind, "-q")
        if not check(r.returncode == 0, "convert %s --type %s: %s" % (m.name, kind, r.stderr.decode())):
            continue
        rd = gw.Reader(out)
        bad = tensors_equal_folder(m, rd, kind)
        good, n_keys = metadata_ok(m, rd, kind, ftype)
        print("  --type %-4s %d tensors, %d differ from the folder's; metadata %d/%d keys as expected "
              "(%d tokens, %d merges)" % (kind, len(rd.tensors), bad, good, n_keys,
                                          len(rd.kv["tokenizer.ggml.tokens"][1][1]),
                                          len(rd.kv["tokenizer.ggml.merges"][1][1])))
        compare_logits("convert --type %s, --dtype %s" % (kind, kind), logits(out, m.ids, kind), base[kind])
        if kind == "f32":
            m.converted_f32 = out


def check_quantized_file(m, path, ftype, source_rows, label):
    """path holds each tensor in llama.cpp's type for ftype, its bytes the
    reference's quantization of source_rows[gguf name] (1-D: the f32 bytes)."""
    r = gw.Reader(path)
    counts, bad = {}, 0
    for g in m.ref.tensor_order:
        if not check(g in r.tensors, "%s: no tensor %s" % (label, g)):
            bad += 1
            continue
        num, ne, _ = r.tensors[g]
        rows = source_rows(g)
        want_t = expected_type(ftype, g, rows.ndim, m.tied, m.layers)
        got_t = TYPE_NAME.get(num, str(num))
        counts[got_t] = counts.get(got_t, 0) + 1
        if not check(got_t == want_t and ne == list(reversed(rows.shape)),
                     "%s: %s is %s %s, want %s %s" % (label, g, got_t, ne, want_t, list(reversed(rows.shape)))):
            bad += 1
            continue
        if want_t == "F32":
            want = rows.tobytes()
        elif rows is m.rows[g]:
            want = m.quantized(g, want_t.lower())
        else:
            want = gq.QUANTIZERS[want_t.lower()](rows)
        if not check(r.data[g] == want, "%s: %s's %s bytes differ from ggml_quants.py's" % (label, g, want_t)):
            bad += 1
    check(set(r.tensors) == set(m.ref.tensors), "%s: tensor names differ" % label)
    check(r.kv.get("general.file_type") == (gw.U32, {"q8_0": 7, "q4_k_m": 15}[ftype]),
          "%s: general.file_type %s" % (label, r.kv.get("general.file_type")))
    check(r.kv.get("general.quantization_version") == (gw.U32, 2), "%s: no quantization_version" % label)
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template",
              m.arch + ".block_count", m.arch + ".attention.head_count_kv"):
        check(r.kv.get(k) == m.ref.kv[k], "%s: metadata %s differs" % (label, k))
    print("  %-34s types %s as llama.cpp's rule says; %d/%d tensors differ from ggml_quants.py's bytes"
          % (label, ", ".join("%s x %d" % kv for kv in sorted(counts.items())), bad, len(m.ref.tensor_order)))
    return r


def check4(m, base):
    print("4. %s: tessera quantize" % m.name)
    for ftype in ("q8_0", "q4_k_m"):
        out = os.path.join(work, "%s.quantize_%s.gguf" % (m.name, ftype))
        r = run("quantize", m.dir, out, "--type", ftype, "-q")
        if not check(r.returncode == 0, "quantize %s %s: %s" % (m.name, ftype, r.stderr.decode())):
            continue
        check_quantized_file(m, out, ftype, lambda g: m.rows[g], "%s from the folder" % ftype)
        got = logits(out, m.ids)
        if got is not None:  # q4_k_m has more bits than q4_k: q4_k's bounds
            want = base["f32"]
            max_rel, min_top1 = BOUNDS[m.name]["q8_0" if ftype == "q8_0" else "q4_k"]
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            top1 = float((got.argmax(1) == want.argmax(1)).mean())
            print("  %-34s logits: max |diff| / max |logit| %.4f (bound %.3f), top-1 agreement %.3f (bound %.2f)"
                  % ("", rel, max_rel, top1, min_top1))
            check(rel <= max_rel and top1 >= min_top1, "%s quantize %s: logits out of bounds" % (m.name, ftype))
        if ftype == "q8_0":
            q8 = out
    # a GGUF input: the q8_0 file again as q4_k_m, from its dequantized rows
    again = os.path.join(work, "%s.requantize_q4_k_m.gguf" % m.name)
    r = run("quantize", q8, again, "--type", "q4_k_m", "-q")
    if check(r.returncode == 0, "quantize %s q8_0 GGUF -> q4_k_m: %s" % (m.name, r.stderr.decode())):
        q8r = gw.Reader(q8)

        def rows_of_q8(g):
            if m.rows[g].ndim < 2:
                return m.rows[g]
            return dequantize("q8_0", q8r.data[g], m.rows[g].shape)

        check_quantized_file(m, again, "q4_k_m", rows_of_q8, "q4_k_m from the q8_0 GGUF")
        check(logits(again, m.ids) is not None, "%s: the requantized file's logits" % m.name)


def check5(m):
    print("5. %s: tessera run, the folder against its f32 conversion" % m.name)
    for extra in ([], ["--chat"]):
        args = ["-p", "The quick brown fox", "-n", "8", "--temperature", "0", *extra]
        a = run("run", "-m", m.dir, *args)
        b = run("run", "-m", m.converted_f32, *args)
        ok = a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and len(a.stdout) > 1
        print("  run %-8s folder %r, GGUF %r %s" % (" ".join(extra) or "(plain)", a.stdout, b.stdout,
                                                    "equal" if ok else "DIFFERENT"))
        check(ok, "%s: run %s: %s / %s" % (m.name, extra, a.stderr.decode(), b.stderr.decode()))


def check6(m):
    print("6. errors")
    bad = os.path.join(work, "q3.gguf")
    r = run("quantize", m.dir, bad, "--type", "q3_k")
    err = r.stderr.decode()
    ok = r.returncode == 1 and "q3_k" in err and not os.path.exists(bad) and all(
        t in err for t in ("q8_0", "q4_0", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "bf16"))
    print("  quantize --type q3_k: exit %d: %s" % (r.returncode, err.strip()))
    check(ok and not crashed(r), "unknown type: " + err)
    for cmd in ("quantize", "convert"):
        missing = os.path.join(work, "no_such_model")
        r = run(cmd, missing, os.path.join(work, "x.gguf"), "--type", "q8_0")
        err = r.stderr.decode()
        print("  %s of a missing input: exit %d: %s" % (cmd, r.returncode, err.strip()))
        check(r.returncode == 1 and missing in err and not crashed(r), "%s missing input: %s" % (cmd, err))
    blob = open(m.converted_f32, "rb").read()
    for cut, needle in ((len(blob) // 2, "runs past the end"), (100, "metadata count"),
                        (len(blob) - 1, "runs past the end")):
        path = os.path.join(work, "truncated_%d.gguf" % cut)
        open(path, "wb").write(blob[:cut])
        r = run("run", "-m", path, "-p", "The", "-n", "4")
        err = r.stderr.decode()
        print("  run on a GGUF cut to %d of %d bytes: exit %d: %s" % (cut, len(blob), r.returncode, err.strip()))
        check(r.returncode == 1 and needle in err and "truncated_%d.gguf" % cut in err and not crashed(r),
              "truncated GGUF (%d bytes): exit %d: %s" % (cut, r.returncode, err))


def check6_nan_scale(m):
    """a NaN in a q8_0 block's scale: the load refuses it by tensor and
    block (as NaN weights are), --no-check-weights loads it anyway"""
    src = os.path.join(work, "%s.py_q8_0.gguf" % m.name)
    rd = gw.Reader(src)
    name = next(n for n in rd.tensor_order if rd.tensors[n][0] == gw.GGML["Q8_0"][0]
                and n.startswith("blk.1."))
    at = rd.data_start + rd.tensors[name][2] + 34  # block 1's d
    blob = bytearray(open(src, "rb").read())
    blob[at:at + 2] = struct.pack("<H", 0x7e00)
    path = os.path.join(work, "%s.nan_scale.gguf" % m.name)
    open(path, "wb").write(blob)
    r = run("run", "-m", path, "-p", "The", "-n", "2")
    err = r.stderr.decode()
    print("  run on a q8_0 GGUF with a NaN scale: exit %d: %s" % (r.returncode, err.strip()))
    check(r.returncode == 1 and "has a NaN scale in block 1" in err and not crashed(r),
          "NaN scale: exit %d: %s" % (r.returncode, err))
    r = run("run", "-m", path, "-p", "The", "-n", "2", "--no-check-weights")
    check(r.returncode == 0 and not crashed(r), "NaN scale with --no-check-weights: %s" % r.stderr.decode())


def main():
    x = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)
    assert np.array_equal(llama_unpermute(gw.llama_permute(x, 2), 2), x)
    for name in MODELS:
        m = Model(name)
        print("== %s: %s, %d tensors, tied embeddings %s" % (name, m.arch, len(m.hf), m.tied))
        base = {"f32": logits(m.dir, m.ids), "bf16": logits(m.dir, m.ids, "bf16")}
        if base["f32"] is None or base["bf16"] is None:
            break
        check1(m, base)
        check2(m, base)
        check3(m, base)
        check4(m, base)
        if hasattr(m, "converted_f32"):
            check5(m)
            if name == MODELS[0]:
                check6(m)
                check6_nan_scale(m)
    if failures:
        print("%d failures" % len(failures))
        sys.exit(1)
    print("gguf_models: all checks passed")


if __name__ == "__main__":
    main()
