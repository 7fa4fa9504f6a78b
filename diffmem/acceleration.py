"""Speed switches of the training step, behind config keys whose defaults are the plain fp32 path.

- ``train.precision = "bf16"``: the U-Net's forward (and so its backward) runs under ``torch.autocast`` with
  bfloat16; parameters, optimizer state and the loss's reduction stay fp32. On GPUs with bf16 tensor cores this is the
  fast path; the result is a slightly different loss trajectory (tests/test_acceleration.py bounds it).
- ``train.channels_last = true``: model weights and the data tensor in channels-last memory format (NHWC), which
  cuDNN's fastest convolution kernels want. The same computation, rounded by other kernels (and with element
  dropout, ``model.dropout_type = "element"``, masks drawn in memory order, so other, equally random, masks).
- ``train.compile = true``: the training forward goes through ``torch.compile`` (TorchInductor). The run folder's
  weights are those of the uncompiled module, which shares its parameters, so checkpoints and resume are unchanged.
  Inductor draws the random numbers of dropout as eager PyTorch does (``torch._inductor.config.fallback_random``),
  so a compiled run draws the same dropout masks and differs from an eager one only by the rounding of fused kernels.

channels-last and compile change the bits of a trajectory (other kernels, other rounding), not its statistics: they
may change between reruns, and the training state records that the trajectory was then no longer replayable bit for
bit (:class:`diffmem.rundir.state.Trajectory`). ``train.deterministic`` (:func:`deterministic_algorithms`) trades
speed the other way, for a CUDA trajectory that is bitwise reproducible.

Evaluation (sampling, nearest neighbours, FID) always runs the plain fp32 path on a contiguous copy of the weights
(:func:`evaluation_copy`), so f_mem and FID never depend on these switches and the inline evaluation of a step gives
the numbers ``diffmem evaluate`` gives for its checkpoint.
"""
from __future__ import annotations

import contextlib
import copy
import os
from typing import Iterator

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
    ``torch.compile`` wrapper, which shares ``model``'s parameters and draws its random numbers (dropout) from the
    same generators, in the same order, as the eager module (Inductor's ``fallback_random``, set for the process)."""
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if not compile:
        return model
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True  # read when the graph compiles, at the first call
    return torch.compile(model)


def evaluation_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with contiguous fp32 parameters and buffers, as ``diffmem evaluate`` builds it from a
    checkpoint (same values; a channels-last model's kernels would round differently). Draws no random number."""
    plain = copy.deepcopy(model)
    for tensor in [*plain.parameters(), *plain.buffers()]:
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32).clone(memory_format=torch.contiguous_format)
    return plain


CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs for reproducible results (CUDA >= 10.2), before its first use


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool, device: torch.device) -> Iterator[None]:
    """On a CUDA ``device``, while active: with ``enabled`` (``train.deterministic``) PyTorch's deterministic
    algorithms (an operation without one raises a RuntimeError naming it), cuDNN's deterministic kernels, no cuDNN
    benchmarking, and ``CUBLAS_WORKSPACE_CONFIG`` set (when unset) before anything touches CUDA; without it the
    nondeterministic kernels are allowed (PyTorch's default). The previous settings come back on exit; the environment
    variable stays (cuBLAS reads it once per process). On a CPU nothing changes: its kernels are deterministic for a
    given thread count either way."""
    if device.type != "cuda":
        yield
        return
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False if enabled else before[3]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
