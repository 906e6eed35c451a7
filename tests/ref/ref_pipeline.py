#!/usr/bin/python3
"""Tiny complete Diffusers pipeline folders and what Diffusers' pipelines
compute with them, in plain PyTorch, for tests/test_pipeline.c and
tests/pipeline_cli.py (and bench/bench_diffusion.py, which imports the
writers and the loops).

usage: ref_pipeline.py OUT_DIR [CLIP_TOKENIZER_DIR]

The components come from the reference modules next to this file
(ref_unet_vae.py: UNet2DConditionModel, AutoencoderKL; ref_clip_text.py:
CLIPTextModel; ref_dit.py: DiTTransformer2DModel; ref_schedulers.py: DDIM,
Euler, DPM++ 2M). CLIP_TOKENIZER_DIR is a tokenizer/ folder with OpenAI
CLIP's vocabulary (the clip_peer fixture's clip_sd1); without it a
byte-level vocabulary without merges is written. Into OUT_DIR:
  sd/         StableDiffusionPipeline: model_index.json, scheduler/
              (DDIMScheduler, scaled_linear, SD's values), text_encoder/,
              tokenizer/, unet/ (cross_attention_dim = the text encoder's
              hidden size), vae/ (4 latent channels, factor 8)
  dit/        DiTPipeline with transformer/ (learned sigma), vae/,
              scheduler/ and id2label in model_index.json
  dit_pixel/  DiTPipeline without a vae (the transformer works on pixels;
              DDIM with clip_sample)
  cases.json  the cases: pipeline, prompt / class label, steps, guidance,
              scheduler, images, size; per case `name`
  ref.safetensors  per case NAME: NAME.noise (the initial latents, as the
              request's `latents`), NAME.latents (the final latents, as
              latents_only / --output-type latent return them) and
              NAME.image (B, 3, H, W) in [0, 1]
  NAME.noise.npy, NAME.latents.npy, NAME.image.npy  the same as .npy
  init.png    a 64x64 RGB image for image-to-image
The loops follow StableDiffusionPipeline.__call__ and DiTPipeline.__call__:
the given latents times init_noise_sigma; classifier-free guidance when
guidance > 1 (SD: the unconditional branch first, "" as the negative
prompt unless given; DiT: the conditional half first, the null class
num_classes, guidance on the first in_channels of the output, the learned
sigma dropped); latents / scaling_factor through the VAE's decoder (no VAE:
the samples themselves); (x / 2 + 0.5).clamp(0, 1)."""
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_clip_text  # noqa: E402
import ref_dit  # noqa: E402
import ref_schedulers  # noqa: E402
import ref_unet_vae  # noqa: E402

torch.set_grad_enabled(False)

# ---- the tokenizer (transformers' CLIPTokenizer for ASCII text) ----


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


class ClipTokenizer:
    """CLIPTokenizer's encode for ASCII text: lower case, whitespace
    collapsed, split as CLIP's pattern splits ASCII (letters, one digit,
    other non-space runs), byte characters, BPE with `</w>` on each word's
    last symbol; padded to 77 with bos first and eos last."""

    def __init__(self, d):
        with open(os.path.join(d, "vocab.json")) as f:
            self.vocab = json.load(f)
        with open(os.path.join(d, "merges.txt")) as f:
            lines = f.read().split("\n")[1:]
        self.ranks = {tuple(m.split()): i for i, m in enumerate(lines) if m.strip()}
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        pad = cfg.get("pad_token", "<|endoftext|>")
        pad = pad["content"] if isinstance(pad, dict) else pad
        self.bos = self.vocab["<|startoftext|>"]
        self.eos = self.vocab["<|endoftext|>"]
        self.pad = self.vocab[pad]
        self.b2u = bytes_to_unicode()

    def bpe(self, word):
        w = list(word[:-1]) + [word[-1] + "</w>"]
        while len(w) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), k) for k, (a, b) in
                     enumerate(zip(w, w[1:]))]
            r, k = min(pairs)
            if r == 1 << 30:
                break
            first, second = w[k], w[k + 1]
            out, j = [], 0
            while j < len(w):
                if j < len(w) - 1 and w[j] == first and w[j + 1] == second:
                    out.append(first + second)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            w = out
        return w

    def words(self, text):
        import re
        text = " ".join(text.split()).lower()
        return re.findall(r"'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\sa-z0-9]+", text)

    def encode(self, text, length=77):
        assert all(ord(c) < 128 for c in text), "ASCII prompts only"
        ids = []
        for word in self.words(text):
            chars = "".join(self.b2u[b] for b in word.encode())
            ids += [self.vocab[t] for t in self.bpe(chars)]
        ids = [self.bos] + ids[: length - 2] + [self.eos]
        return ids + [self.pad] * (length - len(ids))


def write_byte_vocab(d):
    """a CLIP tokenizer/ folder whose vocabulary is the 256 byte characters,
    the same with `</w>`, and the two special tokens; no merges"""
    os.makedirs(d, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    toks = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(toks)}, f)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    special = {"__type": "AddedToken", "content": "", "lstrip": False, "normalized": True,
               "rstrip": False, "single_word": False}

    def sp(c):
        return dict(special, content=c)

    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_prefix_space": False, "bos_token": sp("<|startoftext|>"),
                   "do_lower_case": True, "eos_token": sp("<|endoftext|>"), "errors": "replace",
                   "model_max_length": 77, "pad_token": "<|endoftext|>",
                   "tokenizer_class": "CLIPTokenizer", "unk_token": sp("<|endoftext|>")}, f,
                  indent=2)
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": sp("<|startoftext|>"), "eos_token": sp("<|endoftext|>"),
                   "pad_token": "<|endoftext|>", "unk_token": sp("<|endoftext|>")}, f, indent=2)


def copy_tokenizer(src, d):
    os.makedirs(d, exist_ok=True)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(os.path.join(src, name), os.path.join(d, name))


# ---- Tessera's ts_randn (src/core/random.c), for image-to-image's draw ----

M64 = (1 << 64) - 1


def ts_randn(shape, seed):
    """xoshiro256** seeded by splitmix64, normals by Box-Muller in pairs,
    rounded to float32: what ts_randn(ctx, TS_F32, ..., 1.0, seed) gives"""
    import math
    x = seed & M64
    s = []
    for _ in range(4):
        x = (x + 0x9E3779B97F4A7C15) & M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        s.append(z ^ (z >> 31))

    def rotl(v, k):
        return ((v << k) | (v >> (64 - k))) & M64

    def nxt():
        r = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return r

    n = int(np.prod(shape))
    out = []
    while len(out) < n:
        u1 = (nxt() >> 11) * (1.0 / 9007199254740992.0)
        u2 = (nxt() >> 11) * (1.0 / 9007199254740992.0)
        rad = math.sqrt(-2.0 * math.log(1.0 - u1))
        out += [rad * math.cos(2 * math.pi * u2), rad * math.sin(2 * math.pi * u2)]
    return torch.tensor(np.array(out[:n], dtype=np.float32).reshape(shape))


# ---- the text encoder (ref_clip_text's sizes are its module globals) ----


class ClipText:
    def __init__(self, hidden, layers, heads, inter, vocab, act="quick_gelu", seed=1):
        m = ref_clip_text
        self.sizes = dict(V=vocab, C=hidden, I=inter, L=layers, H=heads, P=77)
        self._set()
        self.act = act
        self.w = m.weights(seed)
        self.cfg = m.config(act)

    def _set(self):
        for k, v in self.sizes.items():
            setattr(ref_clip_text, k, v)

    def write(self, d):
        self._set()
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(self.cfg, f, indent=2)
        ref_clip_text.write_st(os.path.join(d, "model.safetensors"), self.w)

    def __call__(self, ids):
        self._set()
        return ref_clip_text.clip_text(self.w, self.act, torch.tensor([ids]).long())


# ---- scheduler configs ----


def sd_scheduler_config():
    """DDIMScheduler as SD 1.x's folders hold it (saved by Diffusers 0.30)"""
    return {"_class_name": "DDIMScheduler", "_diffusers_version": "0.30.0",
            "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
            "clip_sample": False, "clip_sample_range": 1.0, "dynamic_thresholding_ratio": 0.995,
            "num_train_timesteps": 1000, "prediction_type": "epsilon",
            "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "set_alpha_to_one": False,
            "steps_offset": 1, "thresholding": False, "timestep_spacing": "leading",
            "trained_betas": None}


def dit_scheduler_config():
    """DiT-XL-2-256's scheduler: DDIM over linear betas"""
    return {"_class_name": "DDIMScheduler", "_diffusers_version": "0.30.0",
            "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
            "clip_sample": False, "num_train_timesteps": 1000, "prediction_type": "epsilon",
            "set_alpha_to_one": True, "steps_offset": 0, "timestep_spacing": "leading",
            "trained_betas": None}


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


# ---- Stable Diffusion ----


class SD:
    """The components of a StableDiffusionPipeline and its loops."""

    def __init__(self, text, unet_cfg, vae_cfg, sched_cfg, seed=0):
        self.text = text
        self.unet_cfg, self.vae_cfg, self.sched_cfg = unet_cfg, vae_cfg, sched_cfg
        torch.manual_seed(100 + seed)
        self.unet = ref_unet_vae.UNet(unet_cfg)
        ref_unet_vae.randomize(self.unet, 200 + seed)
        torch.manual_seed(400 + seed)
        self.vae = ref_unet_vae.AutoencoderKL(vae_cfg)
        ref_unet_vae.randomize(self.vae, 500 + seed)
        self.sf = vae_cfg["scaling_factor"]
        self.factor = 2 ** (len(vae_cfg["block_out_channels"]) - 1)

    def write(self, d, tokenizer_src=None):
        shutil.rmtree(d, ignore_errors=True)
        write_json(os.path.join(d, "model_index.json"), {
            "_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
            "feature_extractor": [None, None], "image_encoder": [None, None],
            "requires_safety_checker": False, "safety_checker": [None, None],
            "scheduler": ["diffusers", "DDIMScheduler"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"]})
        write_json(os.path.join(d, "scheduler", "scheduler_config.json"), self.sched_cfg)
        if tokenizer_src:
            copy_tokenizer(tokenizer_src, os.path.join(d, "tokenizer"))
        else:
            write_byte_vocab(os.path.join(d, "tokenizer"))
        self.tok = ClipTokenizer(os.path.join(d, "tokenizer"))
        self.text.write(os.path.join(d, "text_encoder"))
        ref_unet_vae.write_component(os.path.join(d, "unet"), "UNet2DConditionModel",
                                     self.unet_cfg, self.unet.state_dict())
        ref_unet_vae.write_component(os.path.join(d, "vae"), "AutoencoderKL", self.vae_cfg,
                                     self.vae.state_dict())

    def embed(self, prompt):
        return self.text(self.tok.encode(prompt))

    def denoise(self, s, lat, ehs, guidance, start=0):
        cfg = guidance > 1
        for i in range(start, s.n):
            t = float(s.timesteps[i])
            x = torch.cat([lat, lat]) if cfg else lat
            x = s.scale_model_input(x, i)
            eps = self.unet(x, torch.full((x.shape[0],), t), ehs)[0]
            if cfg:
                u, c = eps.chunk(2)
                eps = u + guidance * (c - u)
            lat = s.step(eps, i, lat)
        return lat

    def conditioning(self, prompt, negative, n, guidance):
        pos = self.embed(prompt).repeat(n, 1, 1)
        if guidance <= 1:
            return pos
        return torch.cat([self.embed(negative or "").repeat(n, 1, 1), pos])

    def decode(self, lat):
        img = self.vae.decode(lat / self.sf)[0]
        return (img / 2 + 0.5).clamp(0, 1)

    def generate(self, prompt, noise, steps, guidance, kind, negative=None):
        """StableDiffusionPipeline(prompt, latents=noise) -> (latents, image)"""
        s = ref_schedulers.make(kind, self.sched_cfg)
        s.set_timesteps(steps)
        ehs = self.conditioning(prompt, negative, noise.shape[0], guidance)
        lat = self.denoise(s, noise * s.init_noise_sigma, ehs, guidance)
        return lat, self.decode(lat)

    def img2img(self, prompt, image01, eps, noise, steps, strength, guidance, kind):
        """StableDiffusionImg2ImgPipeline with the posterior's draw eps and
        the added noise given: image01 (B, 3, H, W) in [0, 1]"""
        s = ref_schedulers.make(kind, self.sched_cfg)
        s.set_timesteps(steps)
        t_start = max(steps - min(int(steps * strength), steps), 0)
        mean, logvar, _ = self.vae.encode(2 * image01 - 1)
        init = self.sf * (mean + torch.exp(0.5 * logvar) * eps)
        lat = s.add_noise(init, noise, t_start)
        ehs = self.conditioning(prompt, None, noise.shape[0], guidance)
        lat = self.denoise(s, lat, ehs, guidance, t_start)
        return lat, self.decode(lat), t_start


# ---- DiT ----


class DiT:
    def __init__(self, dit_cfg, vae_cfg, sched_cfg, labels, seed=0):
        self.cfg, self.vae_cfg, self.sched_cfg = dit_cfg, vae_cfg, sched_cfg
        self.labels = labels
        g = torch.Generator().manual_seed(700 + seed)
        self.P = {}
        for k, shp in ref_dit.param_shapes(dit_cfg).items():
            fan = shp[-1] if len(shp) > 1 else 8
            if len(shp) == 4:
                fan = shp[1] * shp[2] * shp[3]
            scale = 1.0 / np.sqrt(fan) if len(shp) > 1 else 0.1
            self.P[k] = (torch.randn(shp, generator=g) * scale).float()
        self.vae = None
        if vae_cfg:
            torch.manual_seed(800 + seed)
            self.vae = ref_unet_vae.AutoencoderKL(vae_cfg)
            ref_unet_vae.randomize(self.vae, 900 + seed)
        self.C = dit_cfg["in_channels"]
        self.null = dit_cfg["num_embeds_ada_norm"]

    def write(self, d):
        shutil.rmtree(d, ignore_errors=True)
        index = {"_class_name": "DiTPipeline", "_diffusers_version": "0.30.0",
                 "id2label": {str(k): v for k, v in enumerate(self.labels)},
                 "scheduler": ["diffusers", "DDIMScheduler"],
                 "transformer": ["diffusers", "DiTTransformer2DModel"],
                 "vae": ["diffusers", "AutoencoderKL"] if self.vae else [None, None]}
        write_json(os.path.join(d, "model_index.json"), index)
        write_json(os.path.join(d, "scheduler", "scheduler_config.json"), self.sched_cfg)
        td = os.path.join(d, "transformer")
        os.makedirs(td)
        ref_dit.st_write(os.path.join(td, "diffusion_pytorch_model.safetensors"),
                         [ref_dit.f32_item(k, v.numpy()) for k, v in self.P.items()],
                         meta={"format": "pt"})
        write_json(os.path.join(td, "config.json"), self.cfg)
        if self.vae:
            ref_unet_vae.write_component(os.path.join(d, "vae"), "AutoencoderKL", self.vae_cfg,
                                         self.vae.state_dict())

    def generate(self, class_ids, noise, steps, guidance, kind):
        """DiTPipeline(class_labels, latents=noise) -> (latents, image)"""
        s = ref_schedulers.make(kind, self.sched_cfg)
        s.set_timesteps(steps)
        P = {k: v.double() for k, v in self.P.items()}
        y = torch.tensor(class_ids)
        cfg = guidance > 1
        if cfg:
            y = torch.cat([y, torch.full_like(y, self.null)])
        lat = noise * s.init_noise_sigma
        for i in range(s.n):
            t = s.timesteps[i]
            x = torch.cat([lat, lat]) if cfg else lat
            x = s.scale_model_input(x, i)
            tt = torch.full((x.shape[0],), float(t))
            out = ref_dit.dit_forward(P, self.cfg, x.double(), tt, y).float()
            eps = out[:, :self.C]
            if cfg:
                c, u = eps.chunk(2)
                eps = u + guidance * (c - u)
            lat = s.step(eps, i, lat)
        img = lat
        if self.vae:
            img = self.vae.decode(lat / self.vae_cfg["scaling_factor"])[0]
        return lat, (img / 2 + 0.5).clamp(0, 1)


# ---- the fixture ----

PROMPT = "a photo of an astronaut riding a horse"
NEGATIVE = "blurry, low quality"
LABELS = ["tench, Tinca tinca", "goldfish, Carassius auratus", "great white shark",
          "tiger shark", "hammerhead", "electric ray", "stingray", "cock", "hen", "ostrich"]


def tiny_sd(tokenizer_src):
    tok_vocab = 49408
    if tokenizer_src:
        with open(os.path.join(tokenizer_src, "vocab.json")) as f:
            tok_vocab = len(json.load(f))
    else:
        tok_vocab = 514
    text = ClipText(hidden=32, layers=2, heads=4, inter=64, vocab=tok_vocab)
    unet = ref_unet_vae.unet_config(sample_size=8, cross_attention_dim=32)
    vae = ref_unet_vae.vae_config(
        block_out_channels=[8, 16, 16, 16], down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, sample_size=64)
    return SD(text, unet, vae, sd_scheduler_config())


def tiny_dit(pixel):
    if pixel:
        cfg = ref_dit.config(in_channels=3, out_channels=None, sample_size=16, patch_size=4,
                             num_embeds_ada_norm=len(LABELS))
        # a pixel-space model clips its x0 estimates to [-1, 1], as
        # Diffusers' pixel pipelines' DDIM/DDPM configs do; scaled_linear
        # betas keep the first step's 1 / sqrt(alphas_cumprod) at 15 (linear:
        # 156), which would magnify f32's rounding past the tolerance
        sched = dict(dit_scheduler_config(), clip_sample=True, beta_schedule="scaled_linear",
                     beta_start=0.00085, beta_end=0.012)
        return DiT(cfg, None, sched, LABELS, seed=1)
    cfg = ref_dit.config(in_channels=4, out_channels=8, sample_size=8, patch_size=2,
                         num_embeds_ada_norm=len(LABELS))
    vae = ref_unet_vae.vae_config(block_out_channels=[8, 16], norm_num_groups=8, sample_size=16)
    return DiT(cfg, vae, dit_scheduler_config(), LABELS)


def save(out, name, arrays, ref):
    for k, v in arrays.items():
        a = np.ascontiguousarray(v.float().numpy())
        np.save(os.path.join(out, f"{name}.{k}.npy"), a)
        ref[f"{name}.{k}"] = v.float()


def main():
    out = sys.argv[1]
    tok_src = sys.argv[2] if len(sys.argv) > 2 else None
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    sd = tiny_sd(tok_src)
    sd.write(os.path.join(out, "sd"), tok_src)
    dit = tiny_dit(False)
    dit.write(os.path.join(out, "dit"))
    pix = tiny_dit(True)
    pix.write(os.path.join(out, "dit_pixel"))

    cases, ref = [], {}
    g = torch.Generator().manual_seed(2024)
    steps = 6
    sd_cases = [("sd_ddim_cfg", "ddim", 7.5, 1, None), ("sd_euler_cfg", "euler", 7.5, 1, None),
                ("sd_dpm_cfg", "dpm++2m", 7.5, 1, None), ("sd_ddim_nocfg", "ddim", 1.0, 1, None),
                ("sd_euler_nocfg", "euler", 1.0, 1, None),
                ("sd_dpm_nocfg", "dpm++2m", 1.0, 1, None),
                ("sd_ddim_neg_2", "ddim", 5.0, 2, NEGATIVE)]
    for name, kind, gs, n, neg in sd_cases:
        noise = torch.randn(n, 4, 8, 8, generator=g)
        lat, img = sd.generate(PROMPT, noise, steps, gs, kind, neg)
        save(out, name, {"noise": noise, "latents": lat, "image": img}, ref)
        cases.append({"name": name, "pipeline": "sd", "prompt": PROMPT, "negative_prompt": neg,
                      "scheduler": kind, "guidance": gs, "steps": steps, "num_images": n,
                      "width": 64, "height": 64})
        print(name, "max|latents| %.3f" % float(lat.abs().max()),
              "image in (0,1): %.2f" % float(((img > 0) & (img < 1)).float().mean()))
    # image-to-image: the added noise given (the request's latents), the
    # posterior's draw what ts_pipeline_generate draws: ts_randn(seed + 1)
    seed = 7
    init = torch.rand(1, 3, 64, 64, generator=g)
    init = (init * 255).round() / 255  # what an 8-bit PNG holds
    from PIL import Image
    Image.fromarray((init[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(
        os.path.join(out, "init.png"))
    save(out, "init", {"image": init}, ref)
    for name, kind, strength in (("sd_img2img_ddim", "ddim", 0.6),
                                 ("sd_img2img_euler", "euler", 0.5)):
        eps = ts_randn((1, 4, 8, 8), seed + 1)
        noise = torch.randn(1, 4, 8, 8, generator=g)
        lat, img, t_start = sd.img2img(PROMPT, init, eps, noise, steps, strength, 7.5, kind)
        save(out, name, {"eps": eps, "noise": noise, "latents": lat, "image": img}, ref)
        cases.append({"name": name, "pipeline": "sd", "prompt": PROMPT, "scheduler": kind,
                      "guidance": 7.5, "steps": steps, "num_images": 1, "width": 64,
                      "height": 64, "strength": strength, "t_start": t_start, "seed": seed,
                      "init_image": "init.png"})
    dit_cases = [("dit_ddim_cfg", dit, "dit", "ddim", 4.0, [3, 3]),
                 ("dit_dpm_cfg", dit, "dit", "dpm++2m", 4.0, [1, 1]),
                 ("dit_ddim_nocfg", dit, "dit", "ddim", 1.0, [7]),
                 ("dit_pixel_ddim_cfg", pix, "dit_pixel", "ddim", 3.0, [2]),
                 ("dit_pixel_ddim_nocfg", pix, "dit_pixel", "ddim", 1.0, [5, 5])]
    for name, model, folder, kind, gs, ids in dit_cases:
        C, S = model.C, model.cfg["sample_size"]
        noise = torch.randn(len(ids), C, S, S, generator=g)
        lat, img = model.generate(ids, noise, steps, gs, kind)
        save(out, name, {"noise": noise, "latents": lat, "image": img}, ref)
        f = 2 ** (len(model.vae_cfg["block_out_channels"]) - 1) if model.vae else 1
        cases.append({"name": name, "pipeline": folder, "class_ids": ids,
                      "class_labels": [LABELS[k].split(",")[0] for k in ids], "scheduler": kind,
                      "guidance": gs, "steps": steps, "num_images": len(ids),
                      "width": S * f, "height": S * f})
        print(name, "max|latents| %.3f" % float(lat.abs().max()),
              "image in (0,1): %.2f" % float(((img > 0) & (img < 1)).float().mean()))
    ref_unet_vae.write_st(os.path.join(out, "ref.safetensors"), ref)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"prompt_ids": sd.tok.encode(PROMPT), "cases": cases}, f, indent=1)
    # broken folders, each wrong in one way
    os.makedirs(os.path.join(out, "err_no_index"))
    shutil.copytree(os.path.join(out, "sd", "unet"), os.path.join(out, "err_no_index", "unet"))
    bad = os.path.join(out, "err_class")
    shutil.copytree(os.path.join(out, "sd"), bad)
    with open(os.path.join(bad, "model_index.json")) as f:
        idx = json.load(f)
    idx["_class_name"] = "StableDiffusionXLPipeline"
    write_json(os.path.join(bad, "model_index.json"), idx)
    bad = os.path.join(out, "err_no_unet")
    shutil.copytree(os.path.join(out, "sd"), bad)
    shutil.rmtree(os.path.join(bad, "unet"))
    bad = os.path.join(out, "err_cross_dim")
    shutil.copytree(os.path.join(out, "sd"), bad)
    big = ClipText(hidden=48, layers=1, heads=4, inter=64, vocab=sd.text.sizes["V"], seed=3)
    shutil.rmtree(os.path.join(bad, "text_encoder"))
    big.write(os.path.join(bad, "text_encoder"))


if __name__ == "__main__":
    main()
