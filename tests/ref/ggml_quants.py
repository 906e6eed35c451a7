#!/usr/bin/python3
"""ggml_quants.py - an independent numpy transcription of llama.cpp's
(ggml-quants.c) reference quantizers, written from their definitions, for
tests/test_quant.c: quantize_row_{q8_0,q4_0,q4_K,q5_K,q6_K,q8_K}_ref
without an importance matrix.

Every step is one f32 operation in ggml's order (numpy float32 arrays, no
fused multiply-add), so the bytes are ggml's. The blocks of all rows are
processed at once: a loop over the elements of a block, vectorized over the
blocks, keeps each sum in ggml's order.

Usage: ggml_quants.py OUT   writes the cases file the C test reads:
  "TSQREF1\\0", u32 count, then per case: 8-byte dtype name (ts_dtype_name,
  or "q8_k" for the activation format), u32 rows, u32 k, rows*k f32 values,
  u32 nbytes, the nbytes ggml writes for those rows.
"""
import struct
import sys

import numpy as np

f32 = np.float32
QK_K = 256
GROUP_MAX_EPS = f32(1e-15)


def nearest_int(v):
    """ggml's nearest_int: the f32 sum with 1.5 * 2^23 leaves the rounded
    integer in the low mantissa bits (ties to even)."""
    with np.errstate(all="ignore"):
        val = (v.astype(f32) + f32(12582912.0)).astype(f32)
    i = val.view(np.int32).astype(np.int64)
    return (i & 0x007FFFFF) - 0x00400000


def to_f16_bits(x):
    return np.asarray(x, dtype=f32).astype(np.float16).view(np.uint16)


def from_f16_bits(h):
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(f32)


def roundf(t):
    """C roundf: halves away from zero (exact in f64)."""
    t64 = t.astype(np.float64)
    return np.sign(t64) * np.floor(np.abs(t64) + 0.5)


def first_absmax(x):
    """(amax, max): the first element of largest magnitude, as ggml's
    `if (ax > amax) { amax = ax; max = x; }` from amax = max = 0."""
    ax = np.abs(x)
    idx = np.argmax(ax, axis=1)
    amax = ax[np.arange(x.shape[0]), idx]
    mx = np.where(amax > 0, x[np.arange(x.shape[0]), idx], f32(0))
    return amax.astype(f32), mx.astype(f32)


# ---- block 32 formats ----

def quantize_q8_0(x):
    b = x.reshape(-1, 32)
    amax = np.max(np.abs(b), axis=1).astype(f32)
    d = (amax / f32(127)).astype(f32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
    qs = roundf((b * idv[:, None]).astype(f32)).astype(np.int8)
    out = np.zeros((b.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = to_f16_bits(d).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = qs.view(np.uint8)
    return out.tobytes()


def quantize_q4_0(x):
    b = x.reshape(-1, 32)
    amax, mx = first_absmax(b)
    d = (mx / f32(-8)).astype(f32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
    t = ((b * idv[:, None]).astype(f32) + f32(8.5)).astype(f32)
    q = np.minimum(15, np.trunc(t.astype(np.float64)).astype(np.int64))
    out = np.zeros((b.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = to_f16_bits(d).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out.tobytes()


# ---- k-quants ----

def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep):
    """x, w: (S, n) f32. Returns (L (S, n) int, scale (S,), the_min (S,))."""
    S, n = x.shape
    mn = x[:, 0].copy()
    mx = x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = (sum_w * x[:, 0]).astype(f32)
    for i in range(1, n):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = (sum_w + w[:, i]).astype(f32)
        sum_x = (sum_x + (w[:, i] * x[:, i]).astype(f32)).astype(f32)
    mn = np.where(mn > 0, f32(0), mn).astype(f32)
    flat = mx == mn
    rng = np.where(flat, f32(1), mx - mn).astype(f32)
    xm = (x - mn[:, None]).astype(f32)
    iscale = (f32(nmax) / rng).astype(f32)
    scale = (f32(1) / iscale).astype(f32)
    L = np.clip(nearest_int((iscale[:, None] * xm).astype(f32)), 0, nmax)
    best = np.zeros(S, dtype=f32)
    for i in range(n):
        diff = ((scale * L[:, i].astype(f32)).astype(f32) + mn).astype(f32)
        diff = (diff - x[:, i]).astype(f32)
        diff = (diff * diff).astype(f32)
        best = (best + (w[:, i] * diff).astype(f32)).astype(f32)
    for st in range(nstep + 1):
        # min moves with each better fit, and the next trials start from it
        rng = np.where(flat, f32(1), mx - mn).astype(f32)
        xm = (x - mn[:, None]).astype(f32)
        num = ((f32(rmin) + (f32(rdelta) * f32(st))) + f32(nmax)).astype(f32)
        isc = (num / rng).astype(f32)
        La = np.clip(nearest_int((isc[:, None] * xm).astype(f32)), 0, nmax)
        Lf = La.astype(f32)
        sl = np.zeros(S, f32)
        sl2 = np.zeros(S, f32)
        sxl = np.zeros(S, f32)
        for i in range(n):
            wl = (w[:, i] * Lf[:, i]).astype(f32)
            sl = (sl + wl).astype(f32)
            sl2 = (sl2 + (wl * Lf[:, i]).astype(f32)).astype(f32)
            sxl = (sxl + (wl * x[:, i]).astype(f32)).astype(f32)
        D = ((sum_w * sl2).astype(f32) - (sl * sl).astype(f32)).astype(f32)
        ok = D > 0
        Ds = np.where(ok, D, f32(1)).astype(f32)
        with np.errstate(all="ignore"):
            ts = (((sum_w * sxl).astype(f32) - (sum_x * sl).astype(f32))
                  .astype(f32) / Ds).astype(f32)
            tm = (((sl2 * sum_x).astype(f32) - (sl * sxl).astype(f32))
                  .astype(f32) / Ds).astype(f32)
            pos = tm > 0
            tm = np.where(pos, f32(0), tm).astype(f32)
            ts = np.where(pos, (sxl / np.where(sl2 != 0, sl2, f32(1)))
                          .astype(f32), ts).astype(f32)
        err = np.zeros(S, f32)
        for i in range(n):
            diff = ((ts * Lf[:, i]).astype(f32) + tm).astype(f32)
            diff = (diff - x[:, i]).astype(f32)
            diff = (diff * diff).astype(f32)
            err = (err + (w[:, i] * diff).astype(f32)).astype(f32)
        upd = ok & (err < best) & ~flat
        L = np.where(upd[:, None], La, L)
        best = np.where(upd, err, best)
        scale = np.where(upd, ts, scale)
        mn = np.where(upd, tm, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, f32(0), scale).astype(f32)
    return L, scale, (-mn).astype(f32)


def pack_scales_k4(ls, lm):
    """ls, lm: (B, 8) ints 0..63 -> (B, 12) bytes (get_scale_min_k4)."""
    B = ls.shape[0]
    q = np.zeros((B, 12), dtype=np.int64)
    for j in range(8):
        if j < 4:
            q[:, j] = ls[:, j]
            q[:, j + 4] = lm[:, j]
        else:
            q[:, j + 4] = (ls[:, j] & 0xF) | ((lm[:, j] & 0xF) << 4)
            q[:, j - 4] |= (ls[:, j] >> 4) << 6
            q[:, j] |= (lm[:, j] >> 4) << 6
    return q.astype(np.uint8)


def kquant_scales(x, nmax, rmin, nstep):
    """q4_K / q5_K shared part. x: (B, 256). Returns d, dmin (f16 bits),
    packed scales (B, 12), L (B, 256)."""
    B = x.shape[0]
    sub = x.reshape(B * 8, 32)
    sum_x2 = np.zeros(B * 8, f32)
    for i in range(32):
        sum_x2 = (sum_x2 + (sub[:, i] * sub[:, i]).astype(f32)).astype(f32)
    av_x = np.sqrt((sum_x2 / f32(32)).astype(f32)).astype(f32)
    w = (av_x[:, None] + np.abs(sub)).astype(f32)
    L, scales, mins = make_qkx2_quants(sub, w, nmax, rmin, 0.1, nstep)
    L = L.reshape(B, 256)
    scales = scales.reshape(B, 8)
    mins = mins.reshape(B, 8)
    ms = scales.max(axis=1)
    max_scale = np.where(ms > 0, ms, f32(0)).astype(f32)
    mm = mins.max(axis=1)
    max_min = np.where(mm > 0, mm, f32(0)).astype(f32)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))
    ls = nearest_int((inv_scale.astype(f32)[:, None] * scales).astype(f32))
    lm = nearest_int((inv_min.astype(f32)[:, None] * mins).astype(f32))
    ls = np.minimum(63, ls & 0xFF)
    lm = np.minimum(63, lm & 0xFF)
    d = to_f16_bits((max_scale / f32(63)).astype(f32))
    dmin = to_f16_bits((max_min / f32(63)).astype(f32))
    df = from_f16_bits(d)
    dminf = from_f16_bits(dmin)
    for j in range(8):
        dj = (df * ls[:, j].astype(f32)).astype(f32)
        dm = (dminf * lm[:, j].astype(f32)).astype(f32)
        xs = x[:, 32 * j:32 * j + 32]
        with np.errstate(all="ignore"):
            t = ((xs + dm[:, None]).astype(f32) /
                 np.where(dj != 0, dj, f32(1))[:, None]).astype(f32)
        lnew = np.clip(nearest_int(t), 0, nmax)
        L[:, 32 * j:32 * j + 32] = np.where((dj != 0)[:, None], lnew,
                                            L[:, 32 * j:32 * j + 32])
    return d, dmin, pack_scales_k4(ls, lm), L


def quantize_q4_K(x):
    b = x.reshape(-1, QK_K)
    B = b.shape[0]
    d, dmin, sc, L = kquant_scales(b, 15, -1.0, 20)
    out = np.zeros((B, 144), dtype=np.uint8)
    out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(-1, 1).view(np.uint8)
    out[:, 4:16] = sc
    for c in range(4):
        lo = L[:, 64 * c:64 * c + 32]
        hi = L[:, 64 * c + 32:64 * c + 64]
        out[:, 16 + 32 * c:16 + 32 * c + 32] = (lo | (hi << 4)).astype(
            np.uint8)
    return out.tobytes()


def quantize_q5_K(x):
    b = x.reshape(-1, QK_K)
    B = b.shape[0]
    d, dmin, sc, L = kquant_scales(b, 31, -0.5, 15)
    out = np.zeros((B, 176), dtype=np.uint8)
    out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(-1, 1).view(np.uint8)
    out[:, 4:16] = sc
    qh = np.zeros((B, 32), dtype=np.int64)
    for c in range(4):
        l1 = L[:, 64 * c:64 * c + 32]
        l2 = L[:, 64 * c + 32:64 * c + 64]
        qh |= ((l1 > 15).astype(np.int64) << (2 * c))
        qh |= ((l2 > 15).astype(np.int64) << (2 * c + 1))
        out[:, 48 + 32 * c:48 + 32 * c + 32] = (
            (l1 & 0xF) | ((l2 & 0xF) << 4)).astype(np.uint8)
    out[:, 16:48] = qh.astype(np.uint8)
    return out.tobytes()


def make_qx_quants(x, nmax):
    """rmse_type 1 (weights x^2). x: (S, n). Returns (L (S, n) in 0..2nmax-1,
    scale (S,))."""
    S, n = x.shape
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    mxs = np.where(zero, f32(1), mx).astype(f32)
    w = (x * x).astype(f32)

    def trial(iscale):
        l = np.clip(nearest_int((iscale[:, None] * x).astype(f32)), -nmax,
                    nmax - 1)
        lf = l.astype(f32)
        sumlx = np.zeros(S, f32)
        suml2 = np.zeros(S, f32)
        for i in range(n):
            sumlx = (sumlx + ((w[:, i] * x[:, i]).astype(f32) * lf[:, i])
                     .astype(f32)).astype(f32)
            suml2 = (suml2 + ((w[:, i] * lf[:, i]).astype(f32) * lf[:, i])
                     .astype(f32)).astype(f32)
        return l, sumlx, suml2

    iscale = (f32(-nmax) / mxs).astype(f32)
    l, sumlx, suml2 = trial(iscale)
    L = l + nmax
    with np.errstate(all="ignore"):
        scale = np.where(suml2 != 0, sumlx / np.where(suml2 != 0, suml2,
                                                      f32(1)), f32(0))
    scale = scale.astype(f32)
    best = (scale * sumlx).astype(f32)
    for st in range(-9, 10):
        if st == 0:
            continue
        num = (f32(nmax) + (f32(0.1) * f32(st))).astype(f32)
        iscale = (-num / mxs).astype(f32)
        l, sumlx, suml2 = trial(iscale)
        upd = (suml2 > 0) & ((sumlx * sumlx).astype(f32) >
                             (best * suml2).astype(f32)) & ~zero
        L = np.where(upd[:, None], l + nmax, L)
        with np.errstate(all="ignore"):
            ns = (sumlx / np.where(suml2 != 0, suml2, f32(1))).astype(f32)
        scale = np.where(upd, ns, scale).astype(f32)
        best = np.where(upd, (scale * sumlx).astype(f32), best).astype(f32)
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, f32(0), scale).astype(f32)
    return L, scale


def quantize_q6_K(x):
    b = x.reshape(-1, QK_K)
    B = b.shape[0]
    L, scales = make_qx_quants(b.reshape(B * 16, 16), 32)
    L = L.reshape(B, 256)
    scales = scales.reshape(B, 16)
    max_abs, max_scale = first_absmax(scales)
    zero = max_abs < GROUP_MAX_EPS
    ms = np.where(zero, f32(1), max_scale).astype(f32)
    iscale = (f32(-128) / ms).astype(f32)
    d = to_f16_bits((f32(1) / iscale).astype(f32))
    qsc = np.minimum(127, nearest_int((iscale[:, None] * scales)
                                      .astype(f32)))
    df = from_f16_bits(d)
    for j in range(16):
        dj = (df * qsc[:, j].astype(f32)).astype(f32)
        xs = b[:, 16 * j:16 * j + 16]
        with np.errstate(all="ignore"):
            t = (xs / np.where(dj != 0, dj, f32(1))[:, None]).astype(f32)
        lnew = np.clip(nearest_int(t), -32, 31) + 32
        L[:, 16 * j:16 * j + 16] = np.where((dj != 0)[:, None], lnew,
                                            L[:, 16 * j:16 * j + 16])
    out = np.zeros((B, 210), dtype=np.uint8)
    for h in range(2):
        q = [L[:, 128 * h + 32 * s:128 * h + 32 * s + 32] for s in range(4)]
        out[:, 64 * h:64 * h + 32] = ((q[0] & 0xF) | ((q[2] & 0xF) << 4))
        out[:, 64 * h + 32:64 * h + 64] = ((q[1] & 0xF) | ((q[3] & 0xF) << 4))
        out[:, 128 + 32 * h:128 + 32 * h + 32] = (
            (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) |
            ((q[3] >> 4) << 6))
    out[:, 192:208] = qsc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d.reshape(-1, 1).view(np.uint8)
    out[zero] = 0
    return out.tobytes()


def quantize_q8_K(x):
    b = x.reshape(-1, QK_K)
    B = b.shape[0]
    amax, mx = first_absmax(b)
    zero = amax == 0
    iscale = (f32(-127) / np.where(zero, f32(1), mx)).astype(f32)
    qs = np.minimum(127, nearest_int((iscale[:, None] * b).astype(f32)))
    qs = np.where(zero[:, None], 0, qs)
    bsums = qs.reshape(B, 16, 16).sum(axis=2)
    d = np.where(zero, f32(0), (f32(1) / iscale).astype(f32)).astype(f32)
    out = np.zeros((B, 292), dtype=np.uint8)
    out[:, 0:4] = d.reshape(-1, 1).view(np.uint8)
    out[:, 4:260] = qs.astype(np.int8).view(np.uint8)
    out[:, 260:292] = bsums.astype(np.int16).view(np.uint8)
    return out.tobytes()


QUANTIZERS = {
    "q8_0": quantize_q8_0,
    "q4_0": quantize_q4_0,
    "q4_k": quantize_q4_K,
    "q5_k": quantize_q5_K,
    "q6_k": quantize_q6_K,
    "q8_k": quantize_q8_K,
}


def test_rows(rng, rows, k, block):
    """Rows of many kinds: gaussian, uniform, heavy-tailed, all positive,
    with zero and constant blocks, outliers, tiny and large magnitudes."""
    out = np.zeros((rows, k), dtype=np.float64)
    for r in range(rows):
        kind = r % 10
        if kind == 0:
            v = rng.standard_normal(k)
        elif kind == 1:
            v = rng.uniform(-1, 1, k)
        elif kind == 2:
            v = rng.standard_t(3, k) * 0.02
        elif kind == 3:
            v = rng.uniform(0.1, 2.0, k)  # all positive: min > 0 paths
        elif kind == 4:
            v = -rng.uniform(0.0, 3.0, k)
        elif kind == 5:
            v = rng.standard_normal(k)
            v[rng.integers(0, k, 4)] *= 50  # outliers
        elif kind == 6:
            v = rng.standard_normal(k) * 1e-3
            for b0 in range(0, k, block):  # zero, constant, ramp blocks
                c = (b0 // block) % 4
                if c == 0:
                    v[b0:b0 + block] = 0
                elif c == 1:
                    v[b0:b0 + block] = 0.37
                elif c == 2:
                    v[b0:b0 + block] = np.arange(block) - block / 2
        elif kind == 7:
            v = rng.standard_normal(k) * 1e4
        elif kind == 8:
            v = np.round(rng.standard_normal(k) * 4) / 8  # many ties
        else:
            v = rng.standard_normal(k) * 0.05
            v[::16] = 0
        out[r] = v
    return out.astype(f32)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: ggml_quants.py OUT\n")
        return 2
    rng = np.random.default_rng(1234)
    cases = []
    for name, rows, k, block in [("q8_0", 40, 1024, 32),
                                 ("q4_0", 40, 1024, 32),
                                 ("q4_k", 40, 1024, 256),
                                 ("q5_k", 40, 1024, 256),
                                 ("q6_k", 40, 1024, 256),
                                 ("q8_k", 40, 1024, 256)]:
        x = test_rows(rng, rows, k, block)
        cases.append((name, x, QUANTIZERS[name](x)))
    with open(sys.argv[1], "wb") as f:
        f.write(b"TSQREF1\0")
        f.write(struct.pack("<I", len(cases)))
        for name, x, data in cases:
            f.write(name.encode().ljust(8, b"\0"))
            f.write(struct.pack("<II", x.shape[0], x.shape[1]))
            f.write(x.astype("<f4").tobytes())
            f.write(struct.pack("<I", len(data)))
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
