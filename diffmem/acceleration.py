"""Speed switches of the training step, behind config keys whose defaults are the plain fp32 path.

- ``train.precision = "bf16"``: the U-Net's forward (and so its backward) runs under ``torch.autocast`` with
  bfloat16; parameters, optimizer state and the loss's reduction stay fp32. On GPUs with bf16 tensor cores this is the
  fast path; the result is a slightly different loss trajectory (tests/test_acceleration.py bounds it).
- ``train.channels_last = true``: model weights and the data tensor in channels-last memory format (NHWC), which
  cuDNN's fastest convolution kernels want. Numerically the same computation.
- ``train.compile = true``: the training forward goes through ``torch.compile`` (TorchInductor). The run folder's
  weights are those of the uncompiled module, which shares its parameters, so checkpoints and resume are unchanged.

Evaluation (sampling, nearest neighbours, FID) always runs the plain fp32 path, so f_mem and FID never depend on
these switches.
"""
from __future__ import annotations

import contextlib

import torch

from diffmem.config import TRAIN_PRECISIONS as PRECISIONS


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of ``precision`` on ``device`` (a no-op context for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision '{precision}' is unknown; choose " + " or ".join(PRECISIONS))


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def step_model(model: torch.nn.Module, *, channels_last: bool = False, compile: bool = False) -> torch.nn.Module:
    """The module the training step calls: ``model`` itself (moved to channels-last in place when asked), or its
    ``torch.compile`` wrapper, which shares ``model``'s parameters."""
    if channels_last:
        model.to(memory_format=torch.channels_last)
    return torch.compile(model) if compile else model
