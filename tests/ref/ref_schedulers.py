"""ref_schedulers.py — a plain PyTorch/NumPy re-implementation of Diffusers'
DDIMScheduler (eta 0), EulerDiscreteScheduler (s_churn 0),
DPMSolverMultistepScheduler (dpmsolver++, order 1/2, midpoint/heun) and
DDPMScheduler (fixed_small), written from their definitions with their
float32 tensors and NumPy steps, for tests/test_scheduler.c.

usage: ref_schedulers.py OUT_DIR
Writes OUT_DIR/<case>/scheduler_config.json for a grid of kind x
beta_schedule x prediction_type x timestep_spacing (and special cases), and
OUT_DIR/cases.json: per case the timesteps for 25 and 10 steps,
init_noise_sigma, a full sampling loop with a fixed deterministic fake model
(model_output = tanh(model_input * 0.5 + t / 1000)) from given noise, an
img2img start (strength 0.6: t_start, add_noise) and its loop; DDPM cases:
alphas_cumprod, add_noise at per-row training timesteps, and one step's mean
and standard deviation.
"""
import json
import math
import os
import sys

import numpy as np
import torch

SHAPE = (1, 2, 3, 4)


def betas_for(cfg):
    n = cfg.get("num_train_timesteps", 1000)
    bs, be = cfg.get("beta_start", 0.0001), cfg.get("beta_end", 0.02)
    sched = cfg.get("beta_schedule", "linear")
    if cfg.get("trained_betas") is not None:
        return torch.tensor(cfg["trained_betas"], dtype=torch.float32)
    if sched == "linear":
        return torch.linspace(bs, be, n, dtype=torch.float32)
    if sched == "scaled_linear":
        return torch.linspace(bs**0.5, be**0.5, n, dtype=torch.float32) ** 2
    if sched == "squaredcos_cap_v2":

        def ab(t):
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        b = [min(1 - ab((i + 1) / n) / ab(i / n), 0.999) for i in range(n)]
        return torch.tensor(b, dtype=torch.float32)
    raise ValueError(sched)


class DDIM:
    """DDIMScheduler; DDPM=True gives DDPMScheduler's step (fixed_small)."""

    def __init__(self, cfg, ddpm=False):
        self.cfg = dict(cfg)
        self.ddpm = ddpm
        self.N = cfg.get("num_train_timesteps", 1000)
        self.betas = betas_for(cfg)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)
        one = cfg.get("set_alpha_to_one", True)
        self.final_alpha_cumprod = torch.tensor(1.0) if one else self.alphas_cumprod[0]
        self.one = torch.tensor(1.0)
        self.init_noise_sigma = 1.0
        self.pred = cfg.get("prediction_type", "epsilon")
        self.clip = cfg.get("clip_sample", True)
        self.clip_range = cfg.get("clip_sample_range", 1.0)
        self.spacing = cfg.get("timestep_spacing", "leading")
        self.offset = cfg.get("steps_offset", 0)

    def set_timesteps(self, n):
        N = self.N
        if self.spacing == "linspace":
            ts = np.linspace(0, N - 1, n).round()[::-1].copy().astype(np.int64)
        elif self.spacing == "leading":
            r = N // n
            ts = (np.arange(0, n) * r).round()[::-1].copy().astype(np.int64)
            ts += self.offset
        else:
            r = N / n
            ts = np.round(np.arange(N, 0, -r)).astype(np.int64)
            ts -= 1
        self.n = n
        self.timesteps = torch.from_numpy(ts)

    def scale_model_input(self, x, i):
        return x

    def _x0_eps(self, mo, t, x):
        ap = self.alphas_cumprod[t]
        bp = 1 - ap
        if self.pred == "epsilon":
            x0 = (x - bp ** (0.5) * mo) / ap ** (0.5)
            eps = mo
        elif self.pred == "sample":
            x0 = mo
            eps = (x - ap ** (0.5) * x0) / bp ** (0.5)
        else:
            x0 = (ap**0.5) * x - (bp**0.5) * mo
            eps = (ap**0.5) * mo + (bp**0.5) * x
        if self.clip:
            x0 = x0.clamp(-self.clip_range, self.clip_range)
        return x0, eps

    def step(self, mo, i, x):
        t = int(self.timesteps[i])
        prev_t = t - self.N // self.n
        if self.ddpm:
            return self._ddpm_step(mo, t, prev_t, x)[0]
        ap_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.final_alpha_cumprod
        x0, eps = self._x0_eps(mo, t, x)
        direction = (1 - ap_prev) ** (0.5) * eps
        return ap_prev ** (0.5) * x0 + direction

    def _ddpm_step(self, mo, t, prev_t, x):
        ap = self.alphas_cumprod[t]
        ap_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.one
        bp, bp_prev = 1 - ap, 1 - ap_prev
        cur_alpha = ap / ap_prev
        cur_beta = 1 - cur_alpha
        x0, _ = self._x0_eps(mo, t, x)
        c0 = (ap_prev ** (0.5) * cur_beta) / bp
        cx = cur_alpha ** (0.5) * bp_prev / bp
        mean = c0 * x0 + cx * x
        std = 0.0
        if t > 0:
            var = (1 - ap_prev) / (1 - ap) * cur_beta
            std = float(torch.clamp(var, min=1e-20) ** 0.5)
        return mean, std

    def add_noise(self, x, noise, i):
        t = int(self.timesteps[i])
        ac = self.alphas_cumprod.to(dtype=x.dtype)
        return ac[t] ** 0.5 * x + (1 - ac[t]) ** 0.5 * noise

    def add_noise_at(self, x, noise, ts):
        ac = self.alphas_cumprod.to(dtype=x.dtype)
        s = (ac[ts] ** 0.5).flatten()
        m = ((1 - ac[ts]) ** 0.5).flatten()
        while len(s.shape) < len(x.shape):
            s, m = s.unsqueeze(-1), m.unsqueeze(-1)
        return s * x + m * noise


class Sigmas:
    """What Euler and DPM share: the sigma table and its interpolation."""

    def _sigma_table(self):
        return np.array(((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5)

    def _finish_sigmas(self, ts, final):
        sig = self._sigma_table()
        sig = np.interp(ts, np.arange(0, len(sig)), sig)
        if final == "sigma_min":
            last = ((1 - self.alphas_cumprod[0]) / self.alphas_cumprod[0]) ** 0.5
        else:
            last = 0
        return torch.from_numpy(np.concatenate([sig, [last]]).astype(np.float32))


class Euler(Sigmas):
    def __init__(self, cfg):
        self.N = cfg.get("num_train_timesteps", 1000)
        self.betas = betas_for(cfg)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)
        self.pred = cfg.get("prediction_type", "epsilon")
        self.spacing = cfg.get("timestep_spacing", "linspace")
        self.offset = cfg.get("steps_offset", 0)
        self.final = cfg.get("final_sigmas_type", "zero")
        self.ttype = cfg.get("timestep_type", "discrete")

    def set_timesteps(self, n):
        N = self.N
        if self.spacing == "linspace":
            ts = np.linspace(0, N - 1, n, dtype=np.float32)[::-1].copy()
        elif self.spacing == "leading":
            r = N // n
            ts = (np.arange(0, n) * r).round()[::-1].copy().astype(np.float32)
            ts += self.offset
        else:
            r = N / n
            ts = (np.arange(N, 0, -r)).round().copy().astype(np.float32)
            ts -= 1
        self.sigmas = self._finish_sigmas(ts, self.final)
        if self.ttype == "continuous" and self.pred == "v_prediction":
            self.timesteps = torch.Tensor([0.25 * s.log() for s in self.sigmas[:-1]])
        else:
            self.timesteps = torch.from_numpy(ts.astype(np.float32))
        self.n = n

    @property
    def init_noise_sigma(self):
        mx = self.sigmas.max()
        if self.spacing in ["linspace", "trailing"]:
            return float(mx)
        return float((mx**2 + 1) ** 0.5)

    def scale_model_input(self, x, i):
        sigma = self.sigmas[i]
        return x / ((sigma**2 + 1) ** 0.5)

    def step(self, mo, i, x):
        sigma = self.sigmas[i]
        sigma_hat = sigma * (0.0 + 1)
        if self.pred == "epsilon":
            x0 = x - sigma_hat * mo
        elif self.pred == "v_prediction":
            x0 = mo * (-sigma / (sigma**2 + 1) ** 0.5) + (x / (sigma**2 + 1))
        else:
            x0 = mo
        derivative = (x - x0) / sigma_hat
        dt = self.sigmas[i + 1] - sigma_hat
        return x + derivative * dt

    def add_noise(self, x, noise, i):
        return x + noise * self.sigmas[i]


class DPM(Sigmas):
    def __init__(self, cfg):
        self.N = cfg.get("num_train_timesteps", 1000)
        self.betas = betas_for(cfg)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)
        self.alpha_t = torch.sqrt(self.alphas_cumprod)
        self.sigma_t = torch.sqrt(1 - self.alphas_cumprod)
        self.lambda_t = torch.log(self.alpha_t) - torch.log(self.sigma_t)
        self.init_noise_sigma = 1.0
        self.pred = cfg.get("prediction_type", "epsilon")
        self.spacing = cfg.get("timestep_spacing", "linspace")
        self.offset = cfg.get("steps_offset", 0)
        self.final = cfg.get("final_sigmas_type", "zero")
        self.order = cfg.get("solver_order", 2)
        self.solver_type = cfg.get("solver_type", "midpoint")
        self.lower_order_final = cfg.get("lower_order_final", True)
        self.euler_at_final = cfg.get("euler_at_final", False)
        self.lambda_min_clipped = cfg.get("lambda_min_clipped", -float("inf"))

    def set_timesteps(self, n):
        N = self.N
        clipped = torch.searchsorted(torch.flip(self.lambda_t, [0]), self.lambda_min_clipped)
        last = ((N - clipped).numpy()).item()
        if self.spacing == "linspace":
            ts = np.linspace(0, last - 1, n + 1).round()[::-1][:-1].copy().astype(np.int64)
        elif self.spacing == "leading":
            r = last // (n + 1)
            ts = (np.arange(0, n + 1) * r).round()[::-1][:-1].copy().astype(np.int64)
            ts += self.offset
        else:
            r = N / n
            ts = np.arange(last, 0, -r).round().copy().astype(np.int64)
            ts -= 1
        self.sigmas = self._finish_sigmas(ts, self.final)
        self.timesteps = torch.from_numpy(ts).to(dtype=torch.int64)
        self.n = len(ts)
        self.model_outputs = [None] * self.order
        self.lower_order_nums = 0

    def scale_model_input(self, x, i):
        return x

    @staticmethod
    def _as(sigma):
        alpha_t = 1 / ((sigma**2 + 1) ** 0.5)
        return alpha_t, sigma * alpha_t

    def step(self, mo, i, x):
        n = len(self.timesteps)
        lower_final = (i == n - 1) and (
            self.euler_at_final or (self.lower_order_final and n < 15) or self.final == "zero"
        )
        a_s0, s_s0 = self._as(self.sigmas[i])
        if self.pred == "epsilon":
            x0 = (x - s_s0 * mo) / a_s0
        elif self.pred == "sample":
            x0 = mo
        else:
            x0 = a_s0 * x - s_s0 * mo
        for k in range(self.order - 1):
            self.model_outputs[k] = self.model_outputs[k + 1]
        self.model_outputs[-1] = x0
        a_t, s_t = self._as(self.sigmas[i + 1])
        lam_t = torch.log(a_t) - torch.log(s_t)
        lam_s0 = torch.log(a_s0) - torch.log(s_s0)
        h = lam_t - lam_s0
        if self.order == 1 or self.lower_order_nums < 1 or lower_final:
            out = (s_t / s_s0) * x - (a_t * (torch.exp(-h) - 1.0)) * x0
        else:
            a_s1, s_s1 = self._as(self.sigmas[i - 1])
            lam_s1 = torch.log(a_s1) - torch.log(s_s1)
            m0, m1 = self.model_outputs[-1], self.model_outputs[-2]
            h0 = lam_s0 - lam_s1
            r0 = h0 / h
            D0, D1 = m0, (1.0 / r0) * (m0 - m1)
            if self.solver_type == "midpoint":
                out = (
                    (s_t / s_s0) * x
                    - (a_t * (torch.exp(-h) - 1.0)) * D0
                    - 0.5 * (a_t * (torch.exp(-h) - 1.0)) * D1
                )
            else:
                out = (
                    (s_t / s_s0) * x
                    - (a_t * (torch.exp(-h) - 1.0)) * D0
                    + (a_t * ((torch.exp(-h) - 1.0) / h + 1.0)) * D1
                )
        if self.lower_order_nums < self.order:
            self.lower_order_nums += 1
        return out

    def add_noise(self, x, noise, i):
        a, s = self._as(self.sigmas[i])
        return a * x + s * noise


def make(kind, cfg):
    return {"ddim": lambda: DDIM(cfg), "euler": lambda: Euler(cfg), "dpm++2m": lambda: DPM(cfg),
            "ddpm": lambda: DDIM(cfg, ddpm=True)}[kind]()


def fake_model(x, t):
    return torch.tanh(x * 0.5 + t / 1000.0)


def run_loop(s, latents, start):
    for i in range(start, s.n):
        t = float(s.timesteps[i])
        x_in = s.scale_model_input(latents, i)
        mo = fake_model(x_in, t)
        latents = s.step(mo, i, latents)
    return latents


def flat(t):
    return [float(v) for v in t.flatten().tolist()]


def case_record(name, kind, cfg, set_kind, noise, orig, noise2):
    rec = {"name": name, "kind": set_kind}
    for n in (25, 10):
        s = make(kind, cfg)
        s.set_timesteps(n)
        rec["timesteps_%d" % n] = [float(v) for v in s.timesteps.tolist()]
        rec["init_sigma_%d" % n] = float(s.init_noise_sigma)
        lat = noise * s.init_noise_sigma
        rec["loop_%d" % n] = flat(run_loop(s, lat, 0))
    s = make(kind, cfg)
    s.set_timesteps(25)
    t_start = 25 - min(int(25 * 0.6), 25)
    rec["t_start"] = t_start
    noisy = s.add_noise(orig, noise2, t_start)
    rec["add_noise"] = flat(noisy)
    rec["img2img"] = flat(run_loop(s, noisy, t_start))
    return rec


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    noise = torch.randn(SHAPE, generator=g, dtype=torch.float32)
    orig = torch.rand(SHAPE, generator=g, dtype=torch.float32) * 2 - 1
    noise2 = torch.randn(SHAPE, generator=g, dtype=torch.float32)
    cases = []
    classes = {"ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler",
               "dpm++2m": "DPMSolverMultistepScheduler", "ddpm": "DDPMScheduler"}
    betas = {"linear": (0.0001, 0.02), "scaled_linear": (0.00085, 0.012),
             "squaredcos_cap_v2": (0.0001, 0.02)}
    grid = []
    for kind in ("ddim", "euler", "dpm++2m"):
        for bs in ("linear", "scaled_linear", "squaredcos_cap_v2"):
            for pred in ("epsilon", "v_prediction", "sample"):
                for sp in ("leading", "trailing", "linspace"):
                    cfg = {"_class_name": classes[kind], "num_train_timesteps": 1000,
                           "beta_start": betas[bs][0], "beta_end": betas[bs][1],
                           "beta_schedule": bs, "prediction_type": pred, "timestep_spacing": sp,
                           "steps_offset": 1 if sp == "leading" else 0}
                    if kind == "ddim":
                        cfg.update(clip_sample=False, set_alpha_to_one=False)
                    grid.append(("%s_%s_%s_%s" % (kind, bs, pred, sp), kind, cfg, None))
    # special cases: defaults, PNDM run as DDIM / Euler, clipping, options
    sd15 = {"_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
            "beta_schedule": "scaled_linear", "beta_start": 0.00085, "num_train_timesteps": 1000,
            "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
            "trained_betas": None, "clip_sample": False}
    grid.append(("pndm_sd15_as_ddim", "ddim", sd15, None))
    grid.append(("pndm_sd15_as_euler", "euler", sd15, "euler"))
    grid.append(("pndm_sd15_as_dpm", "dpm++2m", sd15, "dpm++2m"))
    grid.append(("ddim_defaults_clip", "ddim", {"_class_name": "DDIMScheduler"}, None))
    grid.append(("ddim_clip_sample_range", "ddim",
                 {"_class_name": "DDIMScheduler", "prediction_type": "sample",
                  "clip_sample": True, "clip_sample_range": 0.5}, None))
    grid.append(("euler_defaults", "euler", {"_class_name": "EulerDiscreteScheduler"}, None))
    grid.append(("euler_sigma_min", "euler",
                 {"_class_name": "EulerDiscreteScheduler", "final_sigmas_type": "sigma_min",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}, None))
    grid.append(("euler_continuous_v", "euler",
                 {"_class_name": "EulerDiscreteScheduler", "prediction_type": "v_prediction",
                  "timestep_type": "continuous"}, None))
    grid.append(("dpm_defaults", "dpm++2m", {"_class_name": "DPMSolverMultistepScheduler"}, None))
    grid.append(("dpm_heun", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler", "solver_type": "heun"}, None))
    grid.append(("dpm_order1", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler", "solver_order": 1}, None))
    grid.append(("dpm_sigma_min", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler", "final_sigmas_type": "sigma_min",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}, None))
    grid.append(("dpm_sigma_min_no_lof", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler", "final_sigmas_type": "sigma_min",
                  "lower_order_final": False}, None))
    grid.append(("dpm_lambda_clip", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler",
                  "beta_schedule": "squaredcos_cap_v2", "lambda_min_clipped": -5.1}, None))
    grid.append(("dpm_neg_inf", "dpm++2m",
                 {"_class_name": "DPMSolverMultistepScheduler",
                  "lambda_min_clipped": -float("inf"), "variance_type": None}, None))
    for name, kind, cfg, set_kind in grid:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "scheduler_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)  # -inf is written as -Infinity, as Diffusers does
        cases.append(case_record(name, kind, cfg, set_kind, noise, orig, noise2))
    # DDPM: the training schedule, add_noise at per-row timesteps, one step
    ddpm = []
    for bs in ("linear", "scaled_linear", "squaredcos_cap_v2"):
        for pred in ("epsilon", "v_prediction"):
            cfg = {"_class_name": "DDPMScheduler", "beta_schedule": bs,
                   "beta_start": betas[bs][0], "beta_end": betas[bs][1],
                   "prediction_type": pred, "clip_sample": bs != "linear"}
            name = "ddpm_%s_%s" % (bs, pred)
            d = os.path.join(out, name)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "scheduler_config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
            s = DDIM(cfg, ddpm=True)
            B = 4
            x = torch.rand((B, 3, 2, 2), generator=g) * 2 - 1
            nz = torch.randn((B, 3, 2, 2), generator=g)
            tt = torch.tensor([0, 10, 500, 999])
            rec = {"name": name, "alphas_cumprod": [float(v) for v in s.alphas_cumprod.tolist()],
                   "x": flat(x), "noise": flat(nz), "train_t": tt.tolist(),
                   "noisy": flat(s.add_noise_at(x, nz, tt))}
            s.set_timesteps(10)
            rec["timesteps_10"] = [int(v) for v in s.timesteps.tolist()]
            steps = []
            for i in (0, 4, 9):
                mo = fake_model(noise, float(s.timesteps[i]))
                t = int(s.timesteps[i])
                mean, std = s._ddpm_step(mo, t, t - s.N // s.n, noise)
                steps.append({"i": i, "mean": flat(mean), "std": std})
            rec["steps"] = steps
            ddpm.append(rec)
    doc = {"shape": list(SHAPE), "noise": flat(noise), "orig": flat(orig), "noise2": flat(noise2),
           "cases": cases, "ddpm": ddpm}
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(doc, f)
    print("wrote %d scheduler cases and %d DDPM cases to %s" % (len(cases), len(ddpm), out))


if __name__ == "__main__":
    main()
