"""The train/test denoising loss at one fixed diffusion time: the paper's overfitting signal.

The loss gap test_loss - train_loss opens shortly before samples start copying training images. Both losses are the
epsilon-prediction DSM loss (per-pixel mean squared error) at the single DDPM step ``t_step``, averaged over every
image of the set and ``draws`` independent noise draws, with the model in eval mode (no dropout) and a fixed seed.
"""
from __future__ import annotations

import torch

from diffmem.diffusion import Diffusion


@torch.no_grad()
def fixed_time_loss(model: torch.nn.Module, diffusion: Diffusion, x0: torch.Tensor, t_step: int, draws: int = 5,
                    seed: int = 0, batch_size: int = 1024) -> float:
    """Mean DSM loss of ``model`` on images ``x0`` (n, C, S, S; centered pixels) at DDPM step ``t_step``."""
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=x0.device).manual_seed(seed)
    total = torch.zeros((), dtype=torch.float64, device=x0.device)
    for _ in range(draws):
        for start in range(0, len(x0), batch_size):
            xb = x0[start:start + batch_size]
            t = torch.full((len(xb),), t_step, device=x0.device, dtype=torch.long)
            total += diffusion.loss(model, xb, generator=generator, t=t, reduction="none").double().sum()
    model.train(was_training)
    return float(total / (draws * len(x0)))


def loss_gap(model: torch.nn.Module, diffusion: Diffusion, train_x: torch.Tensor, test_x: torch.Tensor,
             t_step: int, draws: int = 5, seed: int = 0, batch_size: int = 1024) -> tuple[float, float]:
    """(train_loss, test_loss) at DDPM step ``t_step``; the same noise seed for both sets."""
    return (fixed_time_loss(model, diffusion, train_x, t_step, draws, seed, batch_size),
            fixed_time_loss(model, diffusion, test_x, t_step, draws, seed, batch_size))
