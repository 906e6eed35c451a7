#!/usr/bin/python3
"""scaling_calc.py — back-of-the-envelope memory, communication and step time
for training the decoders Tessera runs (Qwen3, Llama, GPT-2) with data
parallelism (mode none), --shard grad-opt (ZeRO-2), --shard full (ZeRO-3 /
FSDP), ZeRO-1 for reference (mode opt), and, as a plan for later, tensor x
pipeline x data layouts. Python 3 standard library only. Every formula and
assumption is in docs/SCALING.md, which quotes this script's tables with
the commands that made them.

  /usr/bin/python3 bench/scaling_calc.py --model llama3-8b --ranks 1,8,64
  /usr/bin/python3 bench/scaling_calc.py --model llama3-70b \
      --layout dp=32,tp=8,pp=4 --global-batch 2048
  /usr/bin/python3 bench/scaling_calc.py --self-test

Units: bytes inside; GiB (2^30) for memory, GB (1e9) for traffic, seconds.
Letters as in the doc: P parameters, N ranks, L layers, d hidden, H heads,
K KV heads, Q head dim, F FFN width, V vocab, s sequence, b micro-batch."""
import argparse
import math
import sys

PRESETS = {  # published configs; seq = the training length the tables use
    "default": dict(arch="qwen3", d=256, L=8, H=4, K=2, Q=64, F=768,
                    V=4096, tied=True, seq=256),
    "gpt2-124m": dict(arch="gpt2", d=768, L=12, H=12, K=12, Q=64, F=3072,
                      V=50257, tied=True, ctx=1024, seq=1024),
    "qwen3-0.6b": dict(arch="qwen3", d=1024, L=28, H=16, K=8, Q=128, F=3072,
                       V=151936, tied=True, seq=4096),
    "llama3-8b": dict(arch="llama", d=4096, L=32, H=32, K=8, Q=128, F=14336,
                      V=128256, tied=False, seq=8192),
    "llama3-70b": dict(arch="llama", d=8192, L=80, H=64, K=8, Q=128,
                       F=28672, V=128256, tied=False, seq=8192),
}
# bytes per parameter: w = weights used by forward/backward, g = gradients
# (also the reduced dtype), m = f32 master copy, o = the two AdamW moments;
# a = bytes per saved activation element
DTYPES = {"f32": dict(w=4, g=4, m=0, o=8, a=4),
          "bf16": dict(w=2, g=2, m=4, o=8, a=2)}
# per-rank one-direction bandwidth (Gb/s) and per-hop latency (us)
LINKS = {"eth100": (100, 20), "ib400": (400, 5), "nvlink4": (3600, 3),
         "v5e-ici": (1600, 3), "v5p-ici": (4800, 3), "v5p-dcn": (50, 20)}
# memory (GiB as the runtime sees it), dense peak (TFLOP/s), default links
DEVICES = {"cpu": dict(mem=24, tflops=0.187, link="eth100", tp="eth100"),
           "h100": dict(mem=79.6, tflops=989, link="ib400", tp="nvlink4"),
           "h200": dict(mem=140.4, tflops=989, link="ib400", tp="nvlink4"),
           "v5e": dict(mem=16, tflops=197, link="v5e-ici", tp="v5e-ici"),
           "v5p": dict(mem=95, tflops=459, link="v5p-ici", tp="v5p-ici")}
FIT_RESERVE = 0.9  # "fits" = estimate <= 90% of capacity
MODES = ("none", "opt", "grad-opt", "full")
GiB, GB = 2.0**30, 1e9


# ---- parameters and FLOPs ----

def layer_params(m):
    d, H, K, Q, F = m["d"], m["H"], m["K"], m["Q"], m["F"]
    if m["arch"] == "gpt2":  # c_attn, c_proj, c_fc, mlp c_proj (+biases), 2 LN
        return 3 * d * d + 3 * d + d * d + d + d * F + F + F * d + d + 4 * d
    qk_norm = 2 * Q if m["arch"] == "qwen3" else 0
    return d * (H + 2 * K) * Q + H * Q * d + 3 * d * F + 2 * d + qk_norm


def embed_params(m):  # input side: token (+ GPT-2's learned positions)
    return m["V"] * m["d"] + m.get("ctx", 0) * m["d"]


def head_params(m):  # untied LM head and the final norm
    norm = 2 * m["d"] if m["arch"] == "gpt2" else m["d"]
    return norm + (0 if m["tied"] else m["V"] * m["d"])


def count_params(m):
    return m["L"] * layer_params(m) + embed_params(m) + head_params(m)


def flops_per_token(m, s):
    """6 x matmul parameters (the blocks and the LM head, tied or not) plus
    attention scores 12*L*H*Q*s (PaLM's count); forward + backward."""
    return 6 * (m["L"] * layer_params(m) + m["V"] * m["d"]) \
        + 12 * m["L"] * m["H"] * m["Q"] * s


# ---- memory ----

def act_token_layer(m, e):
    """bytes saved per token per block for backward: two norm inputs and two
    norm outputs (4d), Q K V and the attention output (2(H+K)Q), the MLP's
    intermediates (SwiGLU gate, up, product 3F; GELU in and out 2F), Qwen3's
    pre-q/k-norm values, an f32 logsumexp per head. Fused attention (no s^2
    scores), no dropout: Korthikanti's 34sbh becomes 32sbh for GPT-2."""
    mlp = 2 * m["F"] if m["arch"] == "gpt2" else 3 * m["F"]
    qk = (m["H"] + m["K"]) * m["Q"] if m["arch"] == "qwen3" else 0
    return e * (4 * m["d"] + 2 * (m["H"] + m["K"]) * m["Q"] + mlp + qk) \
        + 4 * m["H"]


def activations(m, s, b, e, ckpt, layers=None, tp=1, inflight=1.0,
                logits=True):
    """bytes per rank: `inflight` micro-batches of `layers` blocks saved,
    plus (ckpt) one block recomputed, plus f32 logits once (the fused
    cross-entropy writes their gradient over them)."""
    layers = m["L"] if layers is None else layers
    full = s * b * act_token_layer(m, e) / tp
    kept = s * b * m["d"] * e / tp if ckpt else full
    out = inflight * layers * kept + (full if ckpt else 0)
    return out + (4.0 * s * b * m["V"] / tp if logits else 0)


def states(P, n, mode, bt, unit):
    """bytes per rank of weights, gradients, master and moments. `unit` =
    the largest group of parameters gathered at once (a block or the
    embedding): full keeps two gathered (current + prefetch) and one
    unsharded gradient group; grad-opt one unsharded gradient group; opt
    (ZeRO-1) keeps whole gradients and shards master and moments only."""
    w, g, mo = bt["w"], bt["g"], bt["m"] + bt["o"]
    if mode == "none" or n == 1:
        return (w + g + mo) * P
    if mode == "opt":
        return (w + g) * P + mo * P / n
    if mode == "grad-opt":
        return w * P + (g + mo) * P / n + g * unit
    return (w + g + mo) * P / n + (2 * w + g) * unit


def fits(total):
    """the smallest device that holds `total` (all larger ones do too)"""
    ok = [k for k, v in sorted(DEVICES.items(), key=lambda kv: kv[1]["mem"])
          if total <= FIT_RESERVE * v["mem"] * GiB]
    return ok[0] if ok else "none"


# ---- communication ----

def coll_bytes(kind, n, nbytes):
    """bytes each rank sends: ring all-reduce 2(n-1)/n, reduce-scatter and
    all-gather (n-1)/n of the full buffer"""
    if n <= 1:
        return 0.0
    return (2.0 if kind == "ar" else 1.0) * (n - 1) / n * nbytes


def coll_steps(kind, n, algo):
    """latency hops: ring n-1 per phase; recursive halving/doubling log2 n"""
    if n <= 1:
        return 0
    k = n - 1 if algo == "ring" else math.ceil(math.log2(n))
    return 2 * k if kind == "ar" else k


def dp_comm(P, n, mode, bt, accum, units, a):
    """(bytes, seconds, bytes, seconds): the forward-side, then the
    backward-side collectives of one step. none: one all-reduce of the accumulated gradients. opt: one
    reduce-scatter of them, one parameter all-gather (overlapping the next
    forward). grad-opt: the same but a reduce-scatter per micro-batch.
    full: all-gather before each unit's forward and again before its
    backward, reduce-scatter after, every micro-batch. Latency: one
    collective per bucket (none, opt, grad-opt) or per unit (full)."""
    w, g = P * bt["w"], P * bt["g"]
    bucket = a.bucket_mb * 1e6
    bw, lat = a.link_gbps * 1e9 / 8, a.latency_us * 1e-6

    def t(kind, nbytes, calls):
        return coll_bytes(kind, n, nbytes) / bw + \
            calls * coll_steps(kind, n, a.algo) * lat
    if n <= 1:
        return 0.0, 0.0, 0.0, 0.0
    nb_g, nb_w = math.ceil(g / bucket), math.ceil(w / bucket)
    if mode == "none":
        return 0.0, 0.0, coll_bytes("ar", n, g), t("ar", g, nb_g)
    if mode in ("opt", "grad-opt"):
        k = accum if mode == "grad-opt" else 1
        return (coll_bytes("ag", n, w), t("ag", w, nb_w),
                k * coll_bytes("rs", n, g), k * t("rs", g, nb_g))
    ag = coll_bytes("ag", n, w)
    return (accum * ag, accum * t("ag", w, units),
            accum * (ag + coll_bytes("rs", n, g)),
            accum * (t("ag", w, units) + t("rs", g, units)))


def bubble(pp, mb, v=1):
    """idle fraction of a 1F1B / GPipe pipeline of pp stages over mb
    micro-batches, each stage split into v interleaved chunks"""
    return (pp - 1) / (v * mb + pp - 1)


def overlapped(compute, ckpt, f_t, b_t):
    """forward-side comm hides behind forward compute (1/3 of it, 1/4 with
    recompute), backward-side behind the rest; the excess is exposed"""
    fwd = compute * (0.25 if ckpt else 1 / 3)
    return max(fwd, f_t) + max(compute - fwd, b_t)


# ---- tables ----

def md(headers, rows):
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def gib(x):
    return f"{x / GiB:.{2 if x < GiB else 1 if x < 10 * GiB else 0}f}"


def gb(x):
    return f"{x / GB:,.0f} GB" if x >= 100 * GB else f"{x / GB:.3g} GB"


def secs(x):
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s" if x < 1000 \
        else f"{x:,.0f} s"


def plain_tables(m, a):
    bt, P, s, b, ckpt = DTYPES[a.dtype], a.P, a.seq, a.micro_batch, \
        a.checkpoint_activations
    unit = max(layer_params(m), embed_params(m), head_params(m))
    act = activations(m, s, b, bt["a"], ckpt)
    rows = []
    for n in a.ranks:
        row = [n]
        for mode in MODES:
            tot = states(P, n, mode, bt, unit) + act
            row += [gib(tot), fits(tot)]
        rows.append(row)
    print(f"\nMemory per rank, GiB, with {gib(act)} GiB of activations for a "
          f"micro-batch of {b} x {s}. fits = the smallest device it fits in "
          f"at {FIT_RESERVE:.0%} (v5e 16 < cpu 24 < h100 80 < v5p 95 < h200 "
          "141 GiB):\n")
    print(md(["N"] + [x for mode in MODES for x in (mode, "fits")], rows))
    fpt = flops_per_token(m, s) * (4 / 3 if ckpt else 1)
    rows = []
    for n in a.ranks:
        seqs = a.global_batch / n
        if seqs < 1:
            rows.append([n, f"{seqs:.2g}", "batch < ranks"] + ["—"] * 4)
            continue
        accum = math.ceil(seqs / b)
        comp = fpt * seqs * s / (a.peak_tflops * 1e12 * a.mfu)
        row = [n, f"{seqs:g}", secs(comp)]
        for mode in MODES:
            fb, ft, bb, btm = dp_comm(P, n, mode, bt, accum, m["L"] + 2, a)
            eff = comp / overlapped(comp, ckpt, ft, btm)
            row.append(f"{gb(fb + bb)}, {secs(ft + btm)}, {eff:.0%}"
                       if n > 1 else "—")
        rows.append(row)
    print(f"\nPer rank per step, global batch {a.global_batch} x {s} tokens, "
          f"micro-batch {b}, {a.link_gbps:g} Gb/s, {a.latency_us:g} us/hop "
          f"({a.algo}), {a.peak_tflops:g} TFLOP/s x MFU {a.mfu:g}. Cell: "
          "bytes sent, comm time, compute / overlapped step time:\n")
    print(md(["N", "seqs/rank", "compute"] + list(MODES), rows))


def layout_table(m, a, lay):
    bt, s, b, e = DTYPES[a.dtype], a.seq, a.micro_batch, DTYPES[a.dtype]["a"]
    dp, tp, pp, v = (lay.get(k, 1) for k in ("dp", "tp", "pp", "v"))
    mb = lay.get("microbatches") or a.global_batch // (dp * b)
    if mb < 1:
        sys.exit("scaling_calc: --layout: global batch smaller than dp x b")
    ckpt, N, gbs = a.checkpoint_activations, dp * tp * pp, dp * b * mb
    lst = math.ceil(m["L"] / pp)
    vd = m["V"] * m["d"]
    if pp == 1:
        first = last = a.P / tp
    else:  # a tied embedding is copied onto the last stage as its LM head
        blocks = lst * layer_params(m) / tp
        first = blocks + embed_params(m) / tp
        last = blocks + (head_params(m) + (vd if m["tied"] else 0)) / tp
    unit = max(layer_params(m), embed_params(m), vd) / tp
    # 1F1B: the first stage holds pp micro-batches; interleaving adds
    # (pp-1)/(pp*v) of them (Korthikanti et al. 2022)
    inflight = min(pp, mb) * (1 + (pp - 1) / (pp * v) if v > 1 else 1)
    act_first = activations(m, s, b, e, ckpt, lst, tp, inflight, pp == 1)
    act_last = activations(m, s, b, e, ckpt, lst, tp, 1, True)
    useful = flops_per_token(m, s) * gbs * s / N / (a.peak_tflops * 1e12)
    comp = useful * (4 / 3 if ckpt else 1) / a.mfu
    idle = bubble(pp, mb, v)
    pipe = comp / (1 - idle)
    tp_bw, tp_lat = LINKS[a.tp_link][0] * 1e9 / 8, LINKS[a.tp_link][1] * 1e-6
    n_ar = lst * mb * (6 if ckpt else 4)  # 2 fwd + 2 bwd (+ 2 recompute)
    tp_b = n_ar * coll_bytes("ar", tp, s * b * m["d"] * e)
    tp_t = tp_b / tp_bw + n_ar * coll_steps("ar", tp, a.algo) * tp_lat
    hops = 2 * mb * v if pp > 1 else 0  # activation out, its gradient back
    pp_b = hops * s * b * m["d"] * e / tp
    pp_t = pp_b / (a.link_gbps * 1e9 / 8) + hops * a.latency_us * 1e-6
    rows = []
    for mode in MODES:
        mem = max(states(first, dp, mode, bt, unit) + act_first,
                  states(last, dp, mode, bt, unit) + act_last)
        fb, ft, bb, btm = dp_comm(max(first, last), dp, mode, bt, mb, lst, a)
        step = overlapped(pipe, ckpt, ft, btm) + tp_t + pp_t
        rows.append([mode, gib(mem), fits(mem), f"{gb(fb + bb)}, "
                     f"{secs(ft + btm)}", secs(step), f"{useful / step:.1%}"])
    print(f"""
Layout dp={dp} tp={tp} pp={pp} v={v} on N={N} devices:
- {mb} micro-batches of {b} x {s} per step: global {gbs} sequences, \
{gbs * s / 2**20:.1f} Mi tokens
- parameters per device: first stage {first / 1e9:.3g}B, last {last / 1e9:.3g}B
- activations: first stage {gib(act_first)} GiB, last {gib(act_last)} GiB
- compute {secs(comp)} per step; pipeline bubble {idle:.1%}
- TP: {gb(tp_b)}, {secs(tp_t)} on {a.tp_link} (not overlapped); PP: \
{gb(pp_b)}, {secs(pp_t)} on {a.link_gbps:g} Gb/s

dp mode = how the dp group shards; the tp x pp split always applies:
""")
    print(md(["dp mode", "GiB/device", "fits", "DP bytes, time", "step",
              "MFU"], rows))


# ---- command line ----

def parse_layout(text):
    out = {}
    for part in text.split(","):
        k, _, val = part.partition("=")
        keys = ("dp", "tp", "pp", "v", "microbatches")
        if k not in keys or not val.isdigit() or int(val) < 1:
            sys.exit(f"scaling_calc: --layout: bad item '{part}' (want "
                     "dp=,tp=,pp=,v=,microbatches= positive integers)")
        out[k] = int(val)
    return out


def model_from(a):
    m = dict(PRESETS[a.model]) if a.model else dict(arch=a.arch, tied=a.tied)
    for key, opt in (("L", "layers"), ("d", "hidden"), ("H", "heads"),
                     ("K", "kv_heads"), ("Q", "head_dim"), ("F", "ffn"),
                     ("V", "vocab")):
        if getattr(a, opt) is not None:
            m[key] = getattr(a, opt)
    m.setdefault("K", m.get("H"))
    if m.get("Q") is None and m.get("d") and m.get("H"):
        m["Q"] = m["d"] // m["H"]
    names = dict(L="--layers", d="--hidden", H="--heads", F="--ffn",
                 V="--vocab")
    missing = [o for k, o in names.items() if m.get(k) is None]
    if missing:
        sys.exit("scaling_calc: give --model or a whole config (missing: "
                 + " ".join(missing) + ")")
    return m


def self_test():
    n = {k: count_params(v) for k, v in PRESETS.items()}
    assert n["gpt2-124m"] == 124_439_808, n["gpt2-124m"]
    assert n["qwen3-0.6b"] == 596_049_920, n["qwen3-0.6b"]
    q = PRESETS["qwen3-0.6b"]
    assert n["qwen3-0.6b"] - embed_params(q) == 440_467_456
    assert n["llama3-8b"] == 8_030_261_248, n["llama3-8b"]
    assert n["llama3-70b"] == 70_553_706_496, n["llama3-70b"]
    assert n["default"] == 7_345_408, n["default"]
    bf = DTYPES["bf16"]
    # P = 1e9 bf16 gradients on 8 ranks: all-reduce 2*7/8*2e9 bytes
    assert coll_bytes("ar", 8, 2e9) == 3.5e9
    assert coll_bytes("rs", 8, 2e9) == coll_bytes("ag", 8, 2e9) == 1.75e9
    a = argparse.Namespace(bucket_mb=25, link_gbps=400, latency_us=0,
                           algo="ring")
    none = dp_comm(1e9, 8, "none", bf, 1, 10, a)
    full = dp_comm(1e9, 8, "full", bf, 1, 10, a)
    zero2 = dp_comm(1e9, 8, "grad-opt", bf, 1, 10, a)
    assert none[0] + none[2] == 3.5e9 and zero2[0] + zero2[2] == 3.5e9
    assert full[0] + full[2] == 5.25e9 == 1.5 * (none[0] + none[2])
    assert abs(none[3] - 3.5e9 / 50e9) < 1e-12  # 70 ms at 400 Gb/s
    assert dp_comm(1e9, 1, "full", bf, 4, 10, a) == (0.0, 0.0, 0.0, 0.0)
    # Llama-3-8B on 8 ranks, bf16: 28.1 GB all-reduced per rank per step
    assert round(coll_bytes("ar", 8, 2 * n["llama3-8b"])) == 28_105_914_368
    # one TP all-reduce of b*s*d bf16 activations, s = d = 8192, tp = 8
    assert coll_bytes("ar", 8, 8192 * 8192 * 2) == 234_881_024
    assert states(1e9, 1, "none", bf, 0) == 16e9  # 2+2+4+8 bytes/param
    assert states(1e9, 1, "none", DTYPES["f32"], 0) == 16e9  # 4+4+8
    g2 = PRESETS["gpt2-124m"]  # Korthikanti's 34sbh less two dropout masks
    assert act_token_layer(g2, 2) == 32 * 768 + 4 * 12
    assert coll_steps("ar", 1024, "rhd") == 20
    assert coll_steps("ag", 8, "ring") == 7
    assert bubble(4, 12) == 0.2 and bubble(1, 7) == 0
    assert bubble(4, 12, 3) == 3 / 39  # interleaved: (p-1)/(v*m+p-1)
    print("scaling_calc self-test: ok (" + ", ".join(
        f"{k} {v:,}" for k, v in n.items()) + ")")


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS))
    p.add_argument("--arch", choices=("qwen3", "llama", "gpt2"),
                   default="llama", help="for a custom config")
    p.add_argument("--tied", action="store_true", help="tied embeddings")
    for opt, kind, text in (
            ("layers", int, "L"), ("hidden", int, "d"), ("heads", int, "H"),
            ("kv-heads", int, "K (default H)"), ("ffn", int, "F"),
            ("head-dim", int, "Q (default d/H)"), ("vocab", int, "V"),
            ("params", float, "P, instead of the count from the config"),
            ("seq", int, "s, tokens per sequence (default: the preset's)"),
            ("micro-batch", int, "b, sequences per rank per pass (1)"),
            ("global-batch", int, "sequences per step, all ranks (512)"),
            ("peak-tflops", float, "dense peak (default: the device's)"),
            ("link-gbps", float, "data-parallel link, one direction"),
            ("latency-us", float, "per hop of a collective")):
        p.add_argument("--" + opt, type=kind, help=text)
    p.add_argument("--ranks", default="1,2,8,64,1024,4096")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="bf16 = bf16 compute, f32 master and moments")
    p.add_argument("--checkpoint-activations", action="store_true")
    p.add_argument("--device", choices=sorted(DEVICES), default="h100")
    p.add_argument("--link", choices=sorted(LINKS), help="data-parallel link")
    p.add_argument("--tp-link", choices=sorted(LINKS))
    p.add_argument("--algo", choices=("ring", "rhd"), default="ring",
                   help="rhd = recursive halving/doubling (log2 N hops)")
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--mfu", type=float, default=0.4)
    p.add_argument("--layout",
                   help="dp=..,tp=..,pp=..[,v=..][,microbatches=..]")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    m = model_from(a)
    lay = parse_layout(a.layout) if a.layout else None
    dev = DEVICES[a.device]
    a.link = a.link or dev["link"]
    a.tp_link = a.tp_link or dev["tp"]
    a.link_gbps = a.link_gbps or LINKS[a.link][0]
    a.latency_us = LINKS[a.link][1] if a.latency_us is None else a.latency_us
    a.peak_tflops = a.peak_tflops or dev["tflops"]
    a.seq = a.seq or m.get("seq", 2048)  # --global-batch counts sequences
    a.micro_batch = a.micro_batch or 1
    a.global_batch = a.global_batch or 512
    a.P = int(a.params) if a.params else count_params(m)
    try:
        a.ranks = [int(x) for x in a.ranks.split(",")]
    except ValueError:
        a.ranks = [0]
    if min(a.ranks + [a.seq, a.micro_batch, a.global_batch]) < 1 \
            or not 0 < a.mfu <= 1:
        sys.exit("scaling_calc: --ranks (like 1,8,64), --seq, --micro-batch "
                 "and --global-batch must be positive, --mfu in (0, 1]")
    name = a.model or "custom"
    print(f"{name}: P = {a.P:,} ({count_params(m) - embed_params(m):,} "
          f"without the input embedding), {m['L']} layers, d {m['d']}, "
          f"H {m['H']}, KV {m['K']}, Q {m['Q']}, F {m['F']}, V {m['V']}, "
          f"{'tied' if m['tied'] else 'untied'}; {a.dtype}, s {a.seq}, "
          f"b {a.micro_batch}, activation checkpointing "
          f"{'on' if a.checkpoint_activations else 'off'}; "
          f"{flops_per_token(m, a.seq) / 1e9:.3g} GFLOP/token (fwd+bwd)")
    if lay:
        layout_table(m, a, lay)
    else:
        plain_tables(m, a)


if __name__ == "__main__":
    main()
