"""The training speed switches (train.precision, train.channels_last, train.compile) keep the loss trajectory."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from diffmem.acceleration import memory_format, step_model
from diffmem.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from diffmem.diffusion import Diffusion
from diffmem.model import build_from_config
from diffmem.train import EpochBatcher, build_optimizer, training_step

STEPS = 50


def trajectory(*, precision: str = "fp32", channels_last: bool = False, compile: bool = False,
               dropout: float = 0.0, dropout_type: str = "channel", steps: int = STEPS) -> np.ndarray:
    """Losses of ``steps`` training steps of a W = 8, 16x16 U-Net (Adam, batch 8 of 32 fixed random images), seeded.

    Dropout is off by default: its masks are drawn in memory order, so channels-last would draw different (equally
    random) masks and the comparison would measure dropout, not arithmetic.
    """
    cfg = RunConfig(data=DataConfig(n=32, image_size=16),
                    model=ModelConfig(width=8, attention=False, norm_groups=1, dropout=dropout,
                                      dropout_type=dropout_type),
                    train=TrainConfig(optimizer="adam", lr=3e-3, batch_size=8))
    torch.manual_seed(0)
    model = build_from_config(cfg.model, 16)
    optimizer = build_optimizer(cfg, model.parameters())
    generator = torch.Generator().manual_seed(0)
    train_x = torch.rand(32, 1, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    train_x = train_x.contiguous(memory_format=memory_format(channels_last))
    stepper = step_model(model, channels_last=channels_last, compile=compile)
    batcher = EpochBatcher(32, 8, generator)
    diffusion = Diffusion(cfg.diffusion)
    return np.array([float(training_step(stepper, diffusion, optimizer, batcher, train_x, generator, precision))
                     for _ in range(steps)])


@pytest.fixture(scope="module")
def plain() -> np.ndarray:
    return trajectory()


@pytest.mark.e2e
def test_channels_last_gives_the_same_trajectory(plain):
    np.testing.assert_allclose(trajectory(channels_last=True), plain, rtol=1e-4)


@pytest.mark.e2e
def test_bf16_autocast_follows_the_fp32_trajectory(plain):
    """bf16 keeps ~3 significant digits per forward. Measured here: median step 0.4% off, worst 5.5-6.2%, the mean of
    the last 10 steps 0.9% off. Bounds: median 1%, every step 10%, last 10 steps 2%."""
    for fast in (trajectory(precision="bf16"), trajectory(precision="bf16", channels_last=True)):
        rel = np.abs(fast / plain - 1)
        assert np.median(rel) < 1e-2 and rel.max() < 0.1, rel
        assert abs(fast[-10:].mean() / plain[-10:].mean() - 1) < 2e-2
    assert plain[-10:].mean() < plain[:5].mean()  # the trajectory being compared is one of training


@pytest.mark.slow
def test_compiled_step_gives_the_same_trajectory(plain):
    """torch.compile (TorchInductor; on CPU it builds C++ kernels, about a minute here)."""
    np.testing.assert_allclose(trajectory(compile=True), plain, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("dropout_type", ["channel", "element"])
def test_compiled_step_draws_the_eager_dropout_masks(dropout_type):
    """With dropout on (the default model's 0.1) Inductor may draw the masks from its own generator (a
    trajectory that an eager rerun cannot continue); with fallback_random (set by step_model) it draws them from
    torch's generator as eager PyTorch does: the same generator state afterwards, the same losses to rounding.
    Measured here without fallback_random: element dropout ends with another generator state and losses up to 0.9 %
    apart; channel dropout (nn.Dropout2d, the default) was drawn eagerly by Inductor on this CPU either way."""
    eager = trajectory(dropout=0.1, dropout_type=dropout_type, steps=10)
    eager_rng = torch.get_rng_state()
    compiled = trajectory(dropout=0.1, dropout_type=dropout_type, steps=10, compile=True)
    assert torch.equal(torch.get_rng_state(), eager_rng)
    np.testing.assert_allclose(compiled, eager, rtol=1e-3)
