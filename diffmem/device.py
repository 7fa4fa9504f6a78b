"""Choosing the torch device a job runs on."""
from __future__ import annotations

import os

import torch

from diffmem.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda when available, else cpu. Asking for cuda without a GPU, or for "cuda:K" with K not below the
    number of GPUs this process sees (a sweep job sees exactly one, as cuda:0), is a one-line ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device '{name}' was asked for but torch sees no CUDA GPU; use --set train.device=cpu "
                          "or auto")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None:
        seen = torch.cuda.device_count()
        if device.index >= seen:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
            raise ConfigError(f"device '{name}' was asked for but this process sees {seen} GPU(s), cuda:0 to "
                              f"cuda:{seen - 1}{where}; use --set train.device=cuda (a sweep job is given its own "
                              "GPU as cuda), or a smaller index")
    return device
