#!/usr/bin/python3
"""bench_diffusion.py — Tessera's diffusion pipeline beside plain PyTorch
(issue 23), on a small SD-layout model at 256x256 with random weights in
Diffusers' folder layout (written by tests/ref/ref_pipeline.py's writers):
latents 4x32x32; UNet block_out_channels (64, 128, 256, 256),
CrossAttnDownBlock2D x3 + DownBlock2D, UNetMidBlock2DCrossAttn, UpBlock2D +
CrossAttnUpBlock2D x3, layers_per_block 2, attention_head_dim 8,
cross_attention_dim 256; CLIP text encoder hidden 256, 4 layers; VAE
block_out_channels (64, 128, 256, 256).

Side by side, same machine, same thread count (torch.set_num_threads(N) =
TS_NUM_THREADS=N), each side in its own subprocess (peak memory from
wait4's ru_maxrss):
  (a) one UNet step at batch 2 (classifier-free guidance): the PyTorch
      reference module vs build/bench_unet (eager and compiled);
  (b) the whole 25-step DDIM pipeline with guidance 7.5 from the same
      latents: the PyTorch reference pipeline vs `tessera diffuse
      --latents` (eager and --compile); the two images' max abs diff;
  (c) the peak RSS of each.

usage: bench_diffusion.py [--build build] [--threads N] [--steps 25]
                          [--reps 5] [--work DIR] [--step-only]
                          [--tokenizer CLIP_TOKENIZER_DIR]
(the tests/ref modules it imports need ref_dit.py, ref_clip_text.py)
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "ref")
sys.path.insert(0, REF)

PROMPT = "a photo of an astronaut riding a horse"


def bench_model_configs():
    import ref_unet_vae as ruv
    unet = ruv.unet_config(
        sample_size=32, block_out_channels=[64, 128, 256, 256], layers_per_block=2,
        down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
        up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
        attention_head_dim=8, cross_attention_dim=256, norm_num_groups=32)
    vae = ruv.vae_config(
        block_out_channels=[64, 128, 256, 256], down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2, norm_num_groups=32,
        sample_size=256)
    return None, unet, vae


def bench_model(tokenizer):
    """the SD components, the same weights at every call (seeded)"""
    import ref_pipeline as rp
    vocab = 514
    if tokenizer:
        with open(os.path.join(tokenizer, "vocab.json")) as f:
            vocab = len(json.load(f))
    text = rp.ClipText(hidden=256, layers=4, heads=4, inter=1024, vocab=vocab)
    _, unet, vae = bench_model_configs()
    return rp.SD(text, unet, vae, rp.sd_scheduler_config())


def run_measured(cmd, env):
    """(returncode, stdout, stderr, wall s, peak RSS MB) of cmd, reaped by
    wait4 for the child's own rusage"""
    import threading
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = [], []
    readers = [threading.Thread(target=lambda f=f, d=d: d.append(f.read()))
               for f, d in ((p.stdout, out), (p.stderr, err))]
    for r in readers:
        r.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.time() - t0
    for r in readers:
        r.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    return (p.returncode, b"".join(out).decode(), b"".join(err).decode(), wall,
            ru.ru_maxrss / 1024)


def child_torch(args):
    """runs in a subprocess: the PyTorch side; prints one JSON line"""
    import resource

    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    if args.child == "write":
        import ref_pipeline as rp
        sd = bench_model(args.tokenizer)
        sd.write(os.path.join(args.work, "sd"), args.tokenizer)
        noise = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(3))
        np.save(os.path.join(args.work, "noise.npy"), noise.numpy())
        print(json.dumps({"torch": torch.__version__,
                          "unet": sum(p.numel() for p in sd.unet.parameters()),
                          "vae": sum(p.numel() for p in sd.vae.parameters()),
                          "text": sum(v.numel() for v in sd.text.w.values())}))
        return
    t0 = time.time()
    if args.child == "step":
        import ref_unet_vae as ruv
        torch.manual_seed(100)
        unet = ruv.UNet(bench_model_configs()[1])
        ruv.randomize(unet, 200)
    else:
        import ref_pipeline as rp
        sd = bench_model(args.tokenizer)  # the weights the folder holds
        sd.tok = rp.ClipTokenizer(os.path.join(args.work, "sd", "tokenizer"))
    res = {"load_s": time.time() - t0}
    if args.child == "step":
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 4, 32, 32, generator=g)
        ehs = torch.randn(2, 77, 256, generator=g)
        t = torch.full((2,), 801.0)
        for key in ("step_ms", "step_cl_ms"):
            if key == "step_cl_ms":  # NHWC, what oneDNN's convolutions prefer
                unet = unet.to(memory_format=torch.channels_last)
                x = x.contiguous(memory_format=torch.channels_last)
            unet(x, t, ehs)
            times = []
            for _ in range(args.reps):
                t1 = time.time()
                unet(x, t, ehs)
                times.append(1e3 * (time.time() - t1))
            res[key] = sorted(times)[len(times) // 2]
    else:
        noise = torch.from_numpy(np.load(os.path.join(args.work, "noise.npy")))
        t1 = time.time()
        lat, img = sd.generate(PROMPT, noise, args.steps, 7.5, "ddim")
        res["generate_s"] = time.time() - t1
        np.save(os.path.join(args.work, "torch_image.npy"), img.numpy())
    res["peak_rss_mb_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/bench_diffusion")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--step-only", action="store_true", help="only (a)")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    args.work = os.path.abspath(args.work)
    if args.child:
        sys.path.insert(0, HERE)
        return child_torch(args)

    # the parent stays small (no torch): a forked child's ru_maxrss starts
    # from its parent's resident size, and exec keeps it
    import numpy as np
    os.makedirs(args.work, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--work", args.work, "--threads",
          str(args.threads), "--steps", str(args.steps), "--reps", str(args.reps)]
    if args.tokenizer:
        me += ["--tokenizer", args.tokenizer]
    exe = os.path.join(args.build, "tessera")
    env = dict(os.environ, TS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    rc, out, err, _, _ = run_measured(me + ["--child", "write"], env)
    if rc != 0:
        raise SystemExit(f"writing the model failed: {err}")
    info = json.loads(out.strip().splitlines()[-1])
    rc, out, err, _, _ = run_measured([exe, "devices"], env)
    print(f"machine: {os.cpu_count()} cores; threads {args.threads}; torch {info['torch']}")
    print("tessera devices:\n  " + out.strip().replace("\n", "\n  "))
    print(f"model: UNet {info['unet'] / 1e6:.1f} M parameters, VAE {info['vae'] / 1e6:.1f} M, "
          f"text encoder {info['text'] / 1e6:.1f} M; 256x256, latents 4x32x32; "
          f"{args.steps} DDIM steps, guidance 7.5")

    def torch_side(kind):
        rc, out, err, wall, rss = run_measured(me + ["--child", kind], env)
        if rc != 0:
            raise SystemExit(f"torch {kind} failed: {err}")
        r = json.loads(out.strip().splitlines()[-1])
        r["wall_s"], r["peak_rss_mb"] = wall, rss
        return r

    # (a) one UNet step at batch 2
    ts = torch_side("step")
    rc, out, err, wall, rss = run_measured(
        [os.path.join(args.build, "bench_unet"), os.path.join(args.work, "sd", "unet"),
         "--batch", "2", "--size", "32", "--seq", "77", "--reps", str(args.reps), "--json"], env)
    if rc != 0:
        raise SystemExit(f"bench_unet failed: {err}")
    us = json.loads(out.strip().splitlines()[-1])
    print("\n(a) one UNet step, batch 2 (CFG), 32x32 latents, 77 text positions:")
    print(f"  PyTorch          {ts['step_ms']:8.1f} ms   peak RSS {ts['peak_rss_mb']:.0f} MB")
    print(f"  PyTorch NHWC     {ts['step_cl_ms']:8.1f} ms   (channels_last)")
    print(f"  Tessera eager    {us['eager_ms']:8.1f} ms   ({ts['step_ms'] / us['eager_ms']:.2f}x "
          f"PyTorch's speed)   ISA {us['isa']}")
    print(f"  Tessera compiled {us['compiled_ms']:8.1f} ms   "
          f"({ts['step_ms'] / us['compiled_ms']:.2f}x, "
          f"{ts['step_cl_ms'] / us['compiled_ms']:.2f}x NHWC's; first, recording: "
          f"{us['first_compiled_ms']:.0f} ms)   peak RSS {rss:.0f} MB")

    if args.step_only:
        return
    # (b) the whole pipeline
    tp = torch_side("pipeline")
    results = {}
    for mode, extra in (("eager", []), ("compiled", ["--compile"])):
        dst = os.path.join(args.work, f"tessera_{mode}.npy")
        rc, out, err, wall, rss = run_measured(
            [exe, "diffuse", "-m", os.path.join(args.work, "sd"), "--prompt", PROMPT,
             "--steps", str(args.steps), "--guidance", "7.5", "--scheduler", "ddim",
             "--size", "256x256", "--latents", os.path.join(args.work, "noise.npy"),
             "--output-type", "np", "--out", dst, *extra], env)
        if rc != 0:
            raise SystemExit(f"tessera diffuse ({mode}) failed: {err}")
        img = np.load(dst).transpose(0, 3, 1, 2)  # np output is (B, H, W, C)
        ref = np.load(os.path.join(args.work, "torch_image.npy"))
        results[mode] = (wall, rss, float(np.abs(img - ref).max()), (out + err).strip())
    print(f"\n(b) the whole pipeline, {args.steps} DDIM steps, guidance 7.5, 256x256 (one "
          "process each, load included):")
    print(f"  PyTorch          {tp['wall_s']:7.2f} s  (generate {tp['generate_s']:.2f} s, "
          f"load {tp['load_s']:.2f} s)   peak RSS {tp['peak_rss_mb']:.0f} MB")
    for mode, (wall, rss, diff, log) in results.items():
        print(f"  Tessera {mode:9s}{wall:7.2f} s  ({tp['wall_s'] / wall:.2f}x PyTorch's speed)"
              f"   peak RSS {rss:.0f} MB   image max|diff| vs PyTorch {diff:.2e}")
    print("\n  tessera diffuse's own lines (eager):")
    for line in results["eager"][3].splitlines()[-6:]:
        print("    " + line)


if __name__ == "__main__":
    main()
