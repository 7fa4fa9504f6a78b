"""Choosing the torch device a job runs on."""
from __future__ import annotations

import torch

from diffmem.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda when available, else cpu. Asking for cuda without a GPU is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device '{name}' was asked for but torch sees no CUDA GPU; use --set train.device=cpu "
                          "or auto")
    return torch.device(name)
