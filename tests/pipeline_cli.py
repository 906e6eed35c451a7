#!/usr/bin/python3
"""`tessera diffuse` and `tessera serve PIPELINE` on the tiny pipeline
folders tests/ref/ref_pipeline.py writes.

usage: pipeline_cli.py TESSERA FIXTURE_DIR WORK_DIR

diffuse: --output-type np equals the reference image (1e-4 of
max(1, max|ref|)) given the reference's --latents, the PNG reads back as
that array rounded, --output-type latent equals the reference latents,
DiT by class label, --compile and placements give the same array,
--image/--strength runs; bad inputs (no -m, no model_index.json, an
unknown --class, a --size not a multiple of 8, --latents of the wrong
shape, a text pipeline without --prompt) exit non-zero naming the fault.
serve: POST /v1/images/generations returns n base64 PNGs of the asked
size; a bad size, response_format url and a missing prompt are 400s naming
the field; /health is ok; /v1/completions is a 404 naming the images
endpoint; the server keeps serving after bad requests."""
import base64
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
from PIL import Image

exe, fix, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
env = dict(os.environ, TS_NUM_THREADS="2")
cases = {c["name"]: c for c in json.load(open(os.path.join(fix, "cases.json")))["cases"]}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def rel(a, ref):
    if a is None or a.shape != ref.shape:
        return float("inf")
    return float(np.abs(a - ref).max() / max(1.0, np.abs(ref).max()))


def diffuse(*args):
    r = subprocess.run([exe, "diffuse", *args], capture_output=True, text=True, env=env,
                       timeout=600)
    return r.returncode, r.stdout + r.stderr


def case_args(name):
    c = cases[name]
    a = ["-m", os.path.join(fix, c["pipeline"]), "--steps", str(c["steps"]),
         "--guidance", str(c["guidance"]), "--scheduler", c["scheduler"],
         "--size", "%dx%d" % (c["width"], c["height"]), "-n", str(c["num_images"]),
         "--latents", os.path.join(fix, name + ".noise.npy"), "-q"]
    if c.get("prompt"):
        a += ["--prompt", c["prompt"]]
    if c.get("negative_prompt"):
        a += ["--negative-prompt", c["negative_prompt"]]
    if c.get("class_labels"):
        a += ["--class", c["class_labels"][0]]
    return a


def ref(name, what):
    return np.load(os.path.join(fix, f"{name}.{what}.npy"))


def run_np(name, *extra, kind="np"):
    out = os.path.join(work, f"{name}.{kind}.npy")
    if os.path.exists(out):
        os.remove(out)
    rc, log = diffuse(*case_args(name), "--output-type", kind, "--out", out, *extra)
    if rc != 0:
        print(log)
        return None
    a = np.load(out)
    # np is Diffusers' output_type="np": (B, H, W, C)
    return a.transpose(0, 3, 1, 2) if kind == "np" else a


# ---- diffuse against the reference ----

for name in ("sd_ddim_cfg", "sd_euler_nocfg", "sd_dpm_cfg", "sd_ddim_neg_2", "dit_ddim_cfg",
             "dit_pixel_ddim_nocfg"):
    a = run_np(name)
    e = rel(a, ref(name, "image"))
    check(e <= 1e-4, f"diffuse {name} --output-type np: the reference image (rel {e:.3g})")
    lat = run_np(name, kind="latent")
    e = rel(lat, ref(name, "latents"))
    check(e <= 1e-4, f"diffuse {name} --output-type latent: the reference latents (rel {e:.3g})")

# the PNG is the array rounded to 8 bits
a = run_np("sd_ddim_cfg")
png = os.path.join(work, "sd_ddim_cfg.png")
rc, log = diffuse(*case_args("sd_ddim_cfg"), "--out", png)
check(rc == 0 and os.path.exists(png), "diffuse writes a PNG (default output type)" + log[-300:])
if rc == 0 and a is not None:
    im = np.asarray(Image.open(png).convert("RGB")).astype(np.int32)
    want = np.round(a[0].transpose(1, 2, 0) * 255).astype(np.int32)  # a is (B, C, H, W)
    d = np.abs(im - want)
    check(im.shape == (64, 64, 3) and d.max() <= 1 and (d == 0).mean() >= 0.99,
          f"the PNG reads back as the np array rounded (max diff {d.max()}, "
          f"equal {100 * (d == 0).mean():.1f}%)")
    # two images: one PNG each, named apart
    base = os.path.join(work, "two.png")
    rc, log = diffuse(*case_args("sd_ddim_neg_2"), "--out", base)
    pngs = sorted(f for f in os.listdir(work) if f.startswith("two") and f.endswith(".png"))
    check(rc == 0 and len(pngs) == 2, f"-n 2 writes two PNGs ({pngs}) {log[-300:]}")

# compiled, and placed over two devices: the same array
for extra in (["--compile"], ["--devices", "cpu:0,cpu:1", "--device-map", "balanced"],
              ["--device-map", "unet=cpu:0+cpu:1"],
              ["--devices", "cpu:0,cpu:1", "--cfg-parallel"]):
    b = run_np("sd_ddim_cfg", *extra)
    same = a is not None and b is not None and np.array_equal(a, b)
    e = rel(b, a) if a is not None else float("inf")
    check(e <= 1e-6, f"diffuse {' '.join(extra)}: the same image ({'bits' if same else e})")
# the batch split runs each replica's products on fewer rows (another
# summation order in the kernels): the same images within 1e-5, not bit for bit
b = run_np("sd_ddim_neg_2", "--devices", "cpu:0,cpu:1", "--batch-devices", "2")
e = rel(b, run_np("sd_ddim_neg_2"))
check(e <= 1e-5, f"diffuse -n 2 --batch-devices 2: the same images (rel {e:.3g})")
b = run_np("sd_ddim_cfg", "--dtype", "bf16")
e = rel(b, ref("sd_ddim_cfg", "image"))
check(e <= 5e-2, f"diffuse --dtype bf16: near the f32 reference (rel {e:.3g})")

# image-to-image from the PNG: the reference given the same noise (the
# posterior's draw is ts_randn(seed + 1), which the reference repeats)
for name in ("sd_img2img_ddim", "sd_img2img_euler"):
    c = cases[name]
    b = run_np(name, "--image", os.path.join(fix, "init.png"), "--strength",
               str(c["strength"]), "--seed", str(c["seed"]))
    e = rel(b, ref(name, "image"))
    check(e <= 1e-4, f"diffuse {name} --image init.png: the reference image (rel {e:.3g})")

# image-to-image runs and gives an image of the input's size
out = os.path.join(work, "i2i.png")
rc, log = diffuse("-m", os.path.join(fix, "sd"), "--prompt", "a horse", "--image",
                  os.path.join(fix, "init.png"), "--strength", "0.6", "--steps", "4",
                  "--seed", "3", "--out", out, "-q")
check(rc == 0 and os.path.exists(out) and Image.open(out).size == (64, 64),
      "diffuse --image --strength 0.6 writes a 64x64 PNG " + log[-300:])

# ---- bad inputs ----


def fails(args, needles, what):
    rc, log = diffuse(*args)
    low = log.lower()
    ok = rc != 0 and all(n.lower() in low for n in needles)
    check(ok, f"{what}: exit {rc}, names {needles}: {log.strip()[-200:]}")


sd = os.path.join(fix, "sd")
fails(["--prompt", "x"], ["-m"], "no -m")
fails(["-m", os.path.join(fix, "err_no_index"), "--prompt", "x"], ["model_index.json"],
      "no model_index.json")
fails(["-m", os.path.join(fix, "dit"), "--class", "unicorn", "--steps", "2"], ["unicorn"],
      "an unknown --class label")
fails(["-m", sd, "--prompt", "x", "--size", "60x64", "--steps", "2"], ["60"],
      "--size not a multiple of 8")
fails(["-m", sd, "--prompt", "x", "--steps", "2", "--latents",
       os.path.join(fix, "dit_pixel_ddim_cfg.noise.npy")], ["latents"],
      "--latents of the wrong shape")
fails(["-m", sd, "--steps", "2"], ["--prompt"], "a text pipeline without --prompt")
fails(["-m", sd, "--prompt", "x", "--scheduler", "heun"], ["heun"], "an unknown --scheduler")
fails(["-m", sd, "--prompt", "x", "--output-type", "jpeg"], ["jpeg"],
      "an unknown --output-type")

# ---- the server ----


def start(model):
    p = subprocess.Popen([exe, "serve", "-m", model, "--port", "0", "--disable-log-requests"],
                         stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    p.reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
    p.reader.start()
    t0 = time.time()
    while time.time() - t0 < 120:
        for line in list(lines):
            m = re.search(r" on (http://[0-9.]+:\d+)", line)
            if m:
                return p, m.group(1), lines
        if p.poll() is not None and not p.reader.is_alive():
            break
        time.sleep(0.05)
    p.kill()
    raise SystemExit(f"serve {model} did not start: {''.join(lines)}")


def request(url, path, body=None):
    """(status, parsed JSON or text)"""
    req = urllib.request.Request(
        url + path, data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def pngs_of(resp):
    out = []
    for d in resp.get("data", []):
        out.append(np.asarray(Image.open(io.BytesIO(base64.b64decode(d["b64_json"])))))
    return out


GEN = "/v1/images/generations"
p, url, lines = start(sd)
try:
    st, body = request(url, "/health")
    check(st == 200, f"/health: {st} {body}")
    good = {"prompt": "a photo of an astronaut riding a horse", "n": 2, "size": "64x64",
            "response_format": "b64_json", "seed": 5, "num_inference_steps": 3,
            "guidance_scale": 7.5, "negative_prompt": "blurry"}
    st, body = request(url, GEN, good)
    ims = pngs_of(body) if st == 200 else []
    check(st == 200 and len(ims) == 2 and all(i.shape[:2] == (64, 64) for i in ims),
          f"images: 2 PNGs of 64x64 ({st}, {[i.shape for i in ims]})")
    check(st == 200 and isinstance(body.get("created"), int), "images: created")
    st2, body2 = request(url, GEN, good)
    check(st2 == 200 and [i.tobytes() for i in pngs_of(body2)] == [i.tobytes() for i in ims],
          "images: the same seed gives the same PNGs")
    st, body = request(url, GEN, dict(good, n=1, size="128x64"))
    ims = pngs_of(body) if st == 200 else []
    check(st == 200 and len(ims) == 1 and ims[0].shape[:2] == (64, 128),
          f"images: size 128x64 is 128 wide, 64 high ({st})")
    for bad, field in ((dict(good, size="65x64"), "size"), (dict(good, size="big"), "size"),
                       (dict(good, response_format="url"), "response_format"),
                       ({k: v for k, v in good.items() if k != "prompt"}, "prompt"),
                       (dict(good, n=0), "n"), (dict(good, num_inference_steps=-1),
                                                "num_inference_steps")):
        st, body = request(url, GEN, bad)
        text = json.dumps(body)
        check(st == 400 and field in text, f"images: bad {field} -> 400 naming it ({st} {text[:160]})")
    st, body = request(url, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(st == 404 and GEN in json.dumps(body),
          f"/v1/completions on a pipeline: 404 naming {GEN} ({st} {json.dumps(body)[:160]})")
    st, body = request(url, GEN, dict(good, n=1))
    check(st == 200 and len(pngs_of(body)) == 1, "images: still serving after bad requests")
finally:
    p.terminate()
    p.wait(timeout=60)

# a class-conditional pipeline: the prompt is a class label
p, url, lines = start(os.path.join(fix, "dit"))
try:
    st, body = request(url, GEN, {"prompt": "goldfish", "n": 1, "response_format": "b64_json",
                                  "num_inference_steps": 2})
    ims = pngs_of(body) if st == 200 else []
    check(st == 200 and len(ims) == 1 and ims[0].shape[:2] == (16, 16),
          f"DiT images: a 16x16 PNG for class 'goldfish' ({st})")
    st, body = request(url, GEN, {"prompt": "unicorn", "n": 1})
    check(st == 400 and "unicorn" in json.dumps(body), f"DiT images: unknown label -> 400 ({st})")
finally:
    p.terminate()
    p.wait(timeout=60)

print(f"pipeline_cli: {len(failures)} failures")
sys.exit(1 if failures else 0)
