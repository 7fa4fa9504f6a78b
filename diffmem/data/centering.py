"""Pixels <-> model space: the model sees x / 255 - mean (float32), with ``mean`` from ``Splits.mean``.

``mean`` is float32 (1, S, S) in [0, 1] units; every function keeps the input's shape (..., 1, S, S) and device.
"""
from __future__ import annotations

import torch

from diffmem.data.errors import DataError


def to_model(x_uint8: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """uint8 pixels 0..255 (..., 1, S, S) -> float32 model input x / 255 - mean, on x's device."""
    if x_uint8.dtype != torch.uint8:
        raise DataError(f"to_model expects uint8 pixels 0..255, got {x_uint8.dtype}; pass the tensors of Splits")
    return x_uint8.to(torch.float32) / 255.0 - mean.to(device=x_uint8.device, dtype=torch.float32)


def to_pixels(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Model-space float (..., 1, S, S) -> float pixels x + mean, clamped to [0, 1], on x's device."""
    return (x + mean.to(device=x.device, dtype=x.dtype)).clamp(0.0, 1.0)


def to_uint8(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Model-space float (..., 1, S, S) -> uint8 pixels 0..255 (rounded), for saving images."""
    return (to_pixels(x, mean) * 255.0).round().to(torch.uint8)
