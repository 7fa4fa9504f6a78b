"""DDPM forward process, denoising score-matching loss and sampling, through diffusers' schedulers.

Units: images are centered pixels (``diffmem.data.to_model``: pixel/255 - train mean), shape (B, C, S, S);
timesteps are integer DDPM steps in [0, T). The model predicts the added noise (epsilon parametrization).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffmem.config import DiffusionConfig


class Diffusion:
    """A variance-preserving DDPM schedule (alpha_bar_t = prod_{s<=t} (1 - beta_s)) and its losses and samplers."""

    def __init__(self, cfg: DiffusionConfig = DiffusionConfig()):
        self.cfg = cfg
        self.ddpm = DDPMScheduler(num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start,
                                  beta_end=cfg.beta_end, beta_schedule=cfg.beta_schedule)
        self._alpha_bar_cpu = self.ddpm.alphas_cumprod.to(torch.float32)
        self._alpha_bar: dict[torch.device, torch.Tensor] = {}

    @property
    def num_timesteps(self) -> int:
        return self.cfg.num_train_timesteps

    def alpha_bar(self, device: torch.device | str) -> torch.Tensor:
        """alpha_bar_t for t = 0..T-1, shape (T,), float32, cached per device."""
        device = torch.device(device)
        if device not in self._alpha_bar:
            self._alpha_bar[device] = self._alpha_bar_cpu.to(device)
        return self._alpha_bar[device]

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise; ``t`` integer of shape (B,).

        The same formula as ``DDPMScheduler.add_noise``, with the schedule kept on the data's device so that a training
        step makes no host-device copy.
        """
        ab = self.alpha_bar(x0.device)[t].view(-1, *([1] * (x0.dim() - 1)))
        return ab.sqrt() * x0 + (1 - ab).sqrt() * noise

    def step_for_time(self, t: float) -> int:
        """The DDPM step whose alpha_bar is closest to exp(-2 t) (continuous VP time t; t = 0.01 -> step ~40)."""
        target = math.exp(-2.0 * t)
        return int(torch.argmin((self._alpha_bar_cpu - target).abs()).item())

    def loss(self, model: torch.nn.Module, x0: torch.Tensor, generator: torch.Generator | None = None,
             t: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
        """Denoising score-matching loss E ||eps_theta(x_t, t) - eps||^2 / dim.

        ``t`` (B,) integer steps; uniform over [t_min, T) when None (``diffusion.t_min``, official: 1, i.e. steps
        1..999). ``reduction="none"`` returns one value per image (B,).
        Noise and timesteps come from ``generator`` (on x0's device) so that a run is reproducible.
        """
        b = x0.shape[0]
        if t is None:
            t = torch.randint(self.cfg.t_min, self.num_timesteps, (b,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, dtype=x0.dtype, generator=generator)
        pred = model(self.add_noise(x0, noise, t), t).sample
        per_image = (pred - noise).pow(2).flatten(1).mean(1)
        return per_image.mean() if reduction == "mean" else per_image

    def sampler(self, kind: str = "ddim", steps: int = 100, clip_sample: bool = True):
        """A fresh diffusers scheduler for sampling: deterministic DDIM (eta 0) or ancestral DDPM."""
        common = dict(num_train_timesteps=self.cfg.num_train_timesteps, beta_start=self.cfg.beta_start,
                      beta_end=self.cfg.beta_end, beta_schedule=self.cfg.beta_schedule, clip_sample=clip_sample)
        if kind == "ddim":
            sched = DDIMScheduler(**common, set_alpha_to_one=True)
        elif kind == "ddpm":
            sched = DDPMScheduler(**common)
        else:
            raise ValueError(f"unknown sampler '{kind}'; choose ddim or ddpm")
        sched.set_timesteps(steps)
        return sched

    @staticmethod
    def network_calls(kind: str, steps: int, schedule: str = "official") -> int:
        """U-Net forward passes per batch of samples: ``steps - 1`` for the official DDIM sequence, else ``steps``."""
        return steps - 1 if kind == "ddim" and schedule == "official" else steps

    def official_ddim_timesteps(self, steps: int) -> list[int]:
        """The official code's DDIM sequence: ``floor(linspace(0, T - 1, steps))`` in descending order, e.g. 999,
        988, 978, ..., 10, 0 for T = 1000 and 100 steps (``steps - 1`` updates, one network call each)."""
        if steps < 2:
            raise ValueError(f"the official DDIM sequence needs >= 2 points, got {steps}")
        return [int(t) for t in np.linspace(0, self.num_timesteps - 1, steps).astype(int)[::-1]]

    def ddim_official(self, model: torch.nn.Module, x: torch.Tensor, steps: int, clip_sample: bool) -> torch.Tensor:
        """Deterministic DDIM (eta = 0) from noise ``x`` (B, C, S, S) along ``official_ddim_timesteps(steps)``.

        Each update from t to t' is x' = sqrt(ab_t') x0_hat + sqrt(1 - ab_t') eps_hat with
        x0_hat = (x - sqrt(1 - ab_t) eps_hat) / sqrt(ab_t); the last update lands on DDPM step 0 (alpha_bar_0 =
        1 - beta_0), not on alpha_bar = 1. ``clip_sample`` clips x0_hat to [-1, 1] and keeps eps_hat (diffusers'
        convention). Written here rather than through diffusers' ``DDIMScheduler`` because that scheduler always
        steps from t to t - T // steps and ends on alpha_bar = 1, so it cannot follow this sequence.
        """
        ab = self.alpha_bar(x.device)
        seq = self.official_ddim_timesteps(steps)
        for t, t_prev in zip(seq[:-1], seq[1:]):
            eps = model(x, torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)).sample
            x0 = (x - (1 - ab[t]).sqrt() * eps) / ab[t].sqrt()
            if clip_sample:
                x0 = x0.clamp(-1.0, 1.0)
            x = ab[t_prev].sqrt() * x0 + (1 - ab[t_prev]).sqrt() * eps
        return x

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, n: int, shape: tuple[int, ...], generator: torch.Generator,
               kind: str = "ddim", steps: int = 100, clip_sample: bool = False, batch_size: int = 1000,
               device: torch.device | str = "cpu", schedule: str = "official") -> torch.Tensor:
        """``n`` samples of shape ``shape`` = (C, S, S), in centered pixel units, returned on ``device``.

        ``kind="ddim"`` with ``schedule="official"``: :meth:`ddim_official`; with ``schedule="diffusers"``:
        diffusers' ``DDIMScheduler`` ("leading" spacing, eta 0, last update to alpha_bar = 1). ``kind="ddpm"``:
        diffusers' ancestral ``DDPMScheduler`` over ``steps`` steps. Starting noise (and DDPM's per-step noise) comes
        from ``generator``, so a fixed seed gives fixed samples. ``clip_sample`` clips the *predicted clean image* to
        [-1, 1] (in centered pixel units a loose bound); it keeps DDIM from diverging on an under-trained model
        (the demo's calibration, experiments/README.md); the official code does not clip.
        """
        if schedule not in ("official", "diffusers"):
            raise ValueError(f"unknown DDIM schedule '{schedule}'; choose official or diffusers")
        was_training = model.training
        model.eval()
        out = []
        official = kind == "ddim" and schedule == "official"
        sched = None if official else self.sampler(kind, steps, clip_sample)  # stateless once its timesteps are set
        for start in range(0, n, batch_size):
            b = min(batch_size, n - start)
            x = torch.randn((b, *shape), generator=generator, device=generator.device).to(device)
            if official:
                x = self.ddim_official(model, x, steps, clip_sample)
            else:
                for t in sched.timesteps:
                    tt = torch.full((b,), int(t), device=device, dtype=torch.long)
                    eps = model(x, tt).sample
                    if kind == "ddim":
                        x = sched.step(eps, t, x, eta=0.0).prev_sample
                    else:
                        x = sched.step(eps, t, x, generator=generator).prev_sample
            out.append(x)
        model.train(was_training)
        return torch.cat(out)
