"""Tiny run configurations shared by the tests (seconds per run on a CPU), as ``--set`` override lists.

Importable from any test module: pytest puts this folder on ``sys.path`` when it collects the tests (its default
"prepend" import mode, no package needed).
"""
from __future__ import annotations

from diffmem.config import RunConfig, load_config

_TINY_MODEL = ["model.width=8", "model.attention=false", "model.norm_groups=1"]
_TINY_EVAL = ["eval.fid_extractor=diffmem-randconv-v1", "eval.loss_noise_draws=1", "eval.fid_reference_sets=1",
              "eval.clip_sample=true"]

TINY = [
    "data.source=lfw_faces", "data.image_size=16", "data.n=8", "data.n_heldout=36", *_TINY_MODEL,
    "train.optimizer=adam", "train.lr=1e-3", "train.batch_size=4", "train.steps=60", "train.device=cpu",
    "eval.times=4", "eval.n_samples=16", "eval.sampler_steps=4", "eval.n_boot=50", "eval.loss_n_test=16", *_TINY_EVAL,
]
"""8 embedded faces at 16x16, W = 8, 60 Adam steps, 4 evaluations of 16 DDIM-4 samples."""

TINY_CELEBA = [
    "data.source=celeba", "data.image_size=8", "data.n=8", "data.n_heldout=8", *_TINY_MODEL,
    "train.optimizer=adam", "train.lr=1e-3", "train.batch_size=4", "train.steps=20", "train.device=cpu",
    "eval.times=2", "eval.n_samples=8", "eval.sampler_steps=3", "eval.n_boot=20", "eval.loss_n_test=8", *_TINY_EVAL,
]
"""The CelebA fixture at 8x8 (data.path is the test's), 20 steps, 2 evaluations."""

TINY_GRID = [
    "data.source=lfw_faces", "data.image_size=16", "data.n_heldout=36", "model.attention=false", "model.norm_groups=1",
    "train.optimizer=adam", "train.lr=1e-3", "train.batch_size=4", "train.steps=20", "train.device=cpu",
    "train.num_threads=1", "eval.times=2", "eval.n_samples=8", "eval.sampler_steps=3", "eval.n_boot=20",
    "eval.fid=false", "eval.loss_n_test=8", *_TINY_EVAL,
]
"""For sweeps: N and W come from the grid; 20 steps, 2 evaluations without FID, one thread per run.
lfw_faces at 16x16 with 36 held out leaves 64 training images, so n = 80 is a grid point that must fail."""

SMOKE = [
    "data.source=lfw_faces", "data.image_size=16", "data.n_heldout=36", *_TINY_MODEL, "train.steps=5",
    "train.device=cpu", "eval.times=1", "eval.n_samples=4", "eval.sampler_steps=2", "eval.n_boot=10",
    "eval.loss_n_test=4", *_TINY_EVAL,
]
"""The smallest run that reaches every check of the CLI (bad-input tests add the one bad value)."""


def tiny_config(*extra: str, base: list[str] = TINY) -> RunConfig:
    """``base`` plus ``extra`` overrides, validated."""
    cfg, _ = load_config(None, base + list(extra))
    return cfg


def sets(overrides: list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]`` for a CLI call."""
    return sum((["--set", s] for s in overrides), [])
