"""Train and held-out denoising losses at fixed diffusion times: the paper's overfitting signal, per image and per
noise level.

The loss gap test_loss - train_loss opens shortly before samples start copying training images. Every loss here is
the epsilon-prediction DSM loss (per-pixel mean squared error) at one DDPM step, with the model in eval mode (no
dropout) and a fixed seed. :func:`per_image_losses` gives one value per image and per step, the mean over ``draws``
independent noise draws; the noise of image i and draw k is the same at every step (common random numbers), so the
levels differ only by the noise level. :func:`loss_gap` is the historical single-level pair of set means.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from scipy import stats

from diffmem.diffusion import Diffusion


@torch.no_grad()
def per_image_losses(model: torch.nn.Module, diffusion: Diffusion, x0: torch.Tensor, t_steps: Sequence[int],
                     draws: int = 5, seed: int = 0, batch_size: int = 1024) -> torch.Tensor:
    """(len(t_steps), n) float64 CPU tensor: the DSM loss of ``model`` on each image of ``x0`` (n, C, S, S; centered
    pixels) at each DDPM step of ``t_steps``, averaged over ``draws`` noise draws from ``seed``."""
    was_training = model.training
    model.eval()
    out = torch.zeros((len(t_steps), len(x0)), dtype=torch.float64)
    for level, t_step in enumerate(t_steps):
        generator = torch.Generator(device=x0.device).manual_seed(seed)  # the same noise at every level
        for _ in range(draws):
            for start in range(0, len(x0), batch_size):
                xb = x0[start:start + batch_size]
                t = torch.full((len(xb),), int(t_step), device=x0.device, dtype=torch.long)
                per_image = diffusion.loss(model, xb, generator=generator, t=t, reduction="none")
                out[level, start:start + len(xb)] += per_image.double().cpu()
    model.train(was_training)
    return out / draws


def fixed_time_loss(model: torch.nn.Module, diffusion: Diffusion, x0: torch.Tensor, t_step: int, draws: int = 5,
                    seed: int = 0, batch_size: int = 1024) -> float:
    """Mean DSM loss of ``model`` on images ``x0`` (n, C, S, S; centered pixels) at DDPM step ``t_step``."""
    return float(per_image_losses(model, diffusion, x0, [t_step], draws, seed, batch_size).mean())


def loss_gap(model: torch.nn.Module, diffusion: Diffusion, train_x: torch.Tensor, test_x: torch.Tensor,
             t_step: int, draws: int = 5, seed: int = 0, batch_size: int = 1024) -> tuple[float, float]:
    """(train_loss, test_loss) at DDPM step ``t_step``; the same noise seed for both sets."""
    return (fixed_time_loss(model, diffusion, train_x, t_step, draws, seed, batch_size),
            fixed_time_loss(model, diffusion, test_x, t_step, draws, seed, batch_size))


@dataclass(frozen=True)
class LevelGap:
    """The train and held-out mean loss at one noise level and the 95 % interval of their difference.

    ``gap_lo``, ``gap_hi``: Welch's normal interval of test - train, ``gap +/- z sqrt(s_test^2/n_test +
    s_train^2/n_train)`` with the per-image sample variances (the images are the units; the noise draws are averaged
    within an image first)."""

    train: float
    test: float
    gap_lo: float
    gap_hi: float


def level_gaps(train_losses: torch.Tensor, test_losses: torch.Tensor, level: float = 0.95) -> list[LevelGap]:
    """One :class:`LevelGap` per row of the (levels, n_train) and (levels, n_test) per-image losses; a set of one
    image has no variance and gives a zero-width interval for its part."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    out = []
    for tr, te in zip(train_losses.double(), test_losses.double()):
        var = sum(float(v.var(unbiased=True)) / len(v) for v in (tr, te) if len(v) > 1)
        gap = float(te.mean() - tr.mean())
        half = z * var ** 0.5
        out.append(LevelGap(float(tr.mean()), float(te.mean()), gap - half, gap + half))
    return out
