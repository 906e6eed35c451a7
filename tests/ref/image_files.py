"""image_files.py — PNG and .npy files from independent writers (PIL, a
small zlib+struct PNG writer, NumPy) for tests/test_image.c, and the check
that NumPy and PIL read back what Tessera wrote.

usage: image_files.py make DIR   writes DIR/*.png, *.npy and DIR/manifest.json
       image_files.py check DIR  reads DIR/out_*.{png,npy} written by test_image
"""
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image


def png_chunk(kind, data):
    c = struct.pack(">I", len(data)) + kind + data
    return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(path, w, h, depth, color, rows_bytes):
    """A PNG from already-packed rows (filter 0 each), written by hand."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0)
    raw = b"".join(b"\x00" + r for r in rows_bytes)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
                + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def pattern(c, h, w, mul=(91, 17, 5)):
    cc, yy, xx = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    return ((cc * mul[0] + yy * mul[1] + xx * mul[2]) % 256).astype(np.uint8)


def make(d):
    os.makedirs(d, exist_ok=True)
    man = {"png": {}, "npy": {}}
    rng = np.random.default_rng(5)

    def save_png(name, img, expect):  # expect (C, H, W) float32
        img.save(os.path.join(d, name))
        np.save(os.path.join(d, name + ".expect.npy"), expect.astype(np.float32))
        man["png"][name] = list(expect.shape)

    g = pattern(1, 5, 7)[0]
    save_png("gray8.png", Image.fromarray(g, "L"), g[None] / 255.0)
    rgb = pattern(3, 9, 13)
    save_png("rgb8.png", Image.fromarray(rgb.transpose(1, 2, 0), "RGB"), rgb / 255.0)
    rgba = rng.integers(0, 256, (4, 4, 6), dtype=np.uint8)
    save_png("rgba8.png", Image.fromarray(rgba.transpose(1, 2, 0), "RGBA"), rgba[:3] / 255.0)
    la = rng.integers(0, 256, (2, 3, 5), dtype=np.uint8)
    save_png("la8.png", Image.fromarray(la.transpose(1, 2, 0), "LA"), la[:1] / 255.0)
    pal = rng.integers(0, 256, (16, 3), dtype=np.uint8)
    idx = rng.integers(0, 16, (3, 8), dtype=np.uint8)
    p = Image.fromarray(idx, "P")
    p.putpalette(pal.flatten().tolist())
    save_png("palette.png", p, pal[idx].transpose(2, 0, 1) / 255.0)
    g16 = rng.integers(0, 65536, (4, 5)).astype(np.uint16)
    save_png("gray16.png", Image.fromarray(g16, "I;16"), g16[None] / 65535.0)
    bits = rng.integers(0, 2, (3, 9)).astype(bool)
    save_png("bilevel.png", Image.fromarray(bits), bits[None].astype(np.float32))
    # by hand: 16-bit RGB (PIL cannot write it) and 4-bit gray
    r16 = rng.integers(0, 65536, (3, 3, 4)).astype(np.uint16)
    raw_png(os.path.join(d, "rgb16.png"), 4, 3, 16, 2,
            [r16[:, y, :].transpose(1, 0).astype(">u2").tobytes() for y in range(3)])
    np.save(os.path.join(d, "rgb16.png.expect.npy"), (r16 / 65535.0).astype(np.float32))
    man["png"]["rgb16.png"] = [3, 3, 4]
    g4 = rng.integers(0, 16, (2, 6)).astype(np.uint8)
    raw_png(os.path.join(d, "gray4.png"), 6, 2, 4, 0,
            [bytes((int(r[2 * k]) << 4) | int(r[2 * k + 1]) for k in range(3)) for r in g4])
    np.save(os.path.join(d, "gray4.png.expect.npy"), (g4[None] * 17 / 255.0).astype(np.float32))
    man["png"]["gray4.png"] = [1, 2, 6]
    # malformed PNGs
    with open(os.path.join(d, "not_png.png"), "wb") as f:
        f.write(b"GIF89a not a png at all")
    whole = open(os.path.join(d, "rgb8.png"), "rb").read()
    with open(os.path.join(d, "truncated.png"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    bad = bytearray(whole)
    i = whole.index(b"IDAT") + 8
    bad[i] ^= 0xFF
    with open(os.path.join(d, "bad_crc.png"), "wb") as f:
        f.write(bytes(bad))
    with open(os.path.join(d, "huge.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 0, 0, 0, 0))
                + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b""))

    # .npy from NumPy
    def save_npy(name, a, **kw):
        path = os.path.join(d, name)
        if kw:
            with open(path, "wb") as f:
                np.lib.format.write_array(f, a, **kw)
        else:
            np.save(path, a)
        man["npy"][name] = {"shape": list(a.shape), "values": [float(v) for v in a.flatten(order="C")]}

    save_npy("f4.npy", (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1))
    save_npy("f8.npy", rng.standard_normal((2, 3, 4)))
    save_npy("f2.npy", np.array([0.5, -2.25, 1000.0], dtype=np.float16))
    save_npy("i8.npy", np.array([-3, 0, 7, 2**40, -(2**41)], dtype=np.int64))
    save_npy("i4.npy", np.array([[1, -2], [3, -4]], dtype=np.int32))
    save_npy("scalar.npy", np.array(3.25, dtype=np.float32))
    save_npy("v2.npy", rng.standard_normal((3, 1, 2)).astype(np.float32), version=(2, 0))
    np.save(os.path.join(d, "fortran.npy"), np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
    np.save(os.path.join(d, "big_endian.npy"), np.ones(3, dtype=">f4"))
    np.save(os.path.join(d, "uint8.npy"), np.ones(3, dtype=np.uint8))
    with open(os.path.join(d, "bad_magic.npy"), "wb") as f:
        f.write(b"\x93NUMPX" + b"\x01\x00" + b"\x10\x00" + b" " * 16)
    whole = open(os.path.join(d, "f8.npy"), "rb").read()
    with open(os.path.join(d, "truncated.npy"), "wb") as f:
        f.write(whole[:-4])
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f)
    print("wrote image and array files to", d)


def check(d):
    fails = []

    def expect(name, got, want):
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            fails.append("%s: got %s %s %s, expected %s %s" % (name, got.dtype, got.shape, got.flatten()[:6],
                                                                want.dtype, want.shape))

    expect("out_f32.npy", np.load(os.path.join(d, "out_f32.npy")),
           (np.arange(24, dtype=np.float32) * 0.25 - 3).reshape(2, 3, 4))
    expect("out_i64.npy", np.load(os.path.join(d, "out_i64.npy")),
           np.arange(5, dtype=np.int64) * 1000000007 - 2)
    expect("out_i32.npy", np.load(os.path.join(d, "out_i32.npy")),
           (-np.arange(6, dtype=np.int32) * 3).reshape(3, 2))
    expect("out_scalar.npy", np.load(os.path.join(d, "out_scalar.npy")), np.array(2.5, dtype=np.float32))
    with open(os.path.join(d, "out_f32.npy"), "rb") as f:
        head = f.read(10)
        hlen = head[8] | head[9] << 8
        if (10 + hlen) % 64:
            fails.append("out_f32.npy: header not padded to 64 bytes")
    g = pattern(1, 5, 7)[0].copy()
    g[0, 0], g[0, 1], g[0, 2] = 0, 255, 0  # -0.5, 1.7, NaN written
    im = Image.open(os.path.join(d, "out_gray.png"))
    if im.mode != "L":
        fails.append("out_gray.png: mode %s" % im.mode)
    expect("out_gray.png", np.asarray(im), g)
    im = Image.open(os.path.join(d, "out_rgb.png"))
    if im.mode != "RGB":
        fails.append("out_rgb.png: mode %s" % im.mode)
    expect("out_rgb.png", np.asarray(im), pattern(3, 9, 13).transpose(1, 2, 0))
    # rounding as Diffusers' numpy_to_pil: (x * 255).round()
    vals = np.load(os.path.join(d, "out_round.npy"))
    want = (np.clip(vals, 0, 1) * 255).round().astype(np.uint8)
    expect("out_round.png", np.asarray(Image.open(os.path.join(d, "out_round.png"))), want[0])
    for f in fails:
        print(f)
    print("check:", "FAILED" if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2]))
