"""The speed of diffmem's own code paths (`diffmem bench`): training steps, DDIM sampling, one full evaluation.

Each function returns a JSON-able dict (seconds, images/s, FLOPs) and is what ``diffmem bench <train|sample|eval>``
prints as its last line. ``bench_train`` times the exact step of ``diffmem.train`` (the data tensor on the device,
``EpochBatcher``, ``Diffusion.loss``, ``zero_grad(set_to_none=True)``, ``backward``, ``optimizer.step``, the loss kept
on the device) with the same objects, on random uint8 images, so that a comparison against
``benchmarks/reference_train.py`` measures the loop and not the model: both build ``build_unet(width,
image_size, attention)`` and use Adam at lr 1e-4.

FLOPs are those ``torch.utils.flop_counter.FlopCounterMode`` counts (matmuls and convolutions, forward + backward of
one training step; normalisation, activations and the optimizer are not counted). The machine's peak is the best of
a few timed dense n x n matmuls in the same process, in the math the timed step used (fp32, TF32 on a GPU where
torch lets cuDNN or cuBLAS use it, bf16 under ``precision="bf16"``: :func:`peak_flops`), so utilisation = achieved /
peak is a ratio of two numbers measured side by side and the peak is not that of slower math than the step's.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from diffmem.acceleration import PRECISIONS, deterministic_algorithms, memory_format, step_model
from diffmem.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from diffmem.data import to_model, train_mean
from diffmem.device import resolve_device
from diffmem.diffusion import Diffusion
from diffmem.model import build_from_config, count_parameters
from diffmem.train import EpochBatcher, build_optimizer, training_step


class BenchError(ValueError):
    """A benchmark asked for an impossible setting; the message says which and what to use."""


def _quiet(_message: str) -> None:
    """The default log: print nothing."""


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall time measures it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise BenchError(f"{name} must be >= 1, got {value}")


def matmul_flops_per_s(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048,
                       repeats: int = 3) -> float:
    """Dense matmul FLOP/s of this machine: the best of ``repeats`` timed (n x n) @ (n x n) products, 2 n^3 FLOPs
    each, after one untimed warm-up."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def uses_tf32() -> bool:
    """Whether this process's fp32 GPU kernels may use TF32 tensor cores: matmuls
    (``torch.backends.cuda.matmul.allow_tf32``, off by default) or cuDNN convolutions
    (``torch.backends.cudnn.allow_tf32``, on by default; the U-Net's FLOPs are mostly convolutions)."""
    return bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)


def peak_flops(device: torch.device, n: int = 0, precision: str = "fp32") -> dict[str, Any]:
    """The dense matmul peak of the math a training step of ``precision`` uses, measured as that step runs, so that
    utilisation = achieved / peak stays below 1: "fp32" (FLOP/s) with TF32 allowed when :func:`uses_tf32` says the
    step's kernels may use it ("math": "tf32", else "fp32"); with ``precision`` "bf16" also "bf16", and the peak
    (the larger: autocast runs some ops in fp32) is then "math" "bf16". "peak": the denominator. From n x n matmuls
    (n = 0: 2048 on CPU, 8192 on a GPU; a smaller n measures less than the peak)."""
    big = device.type == "cuda"
    size, repeats = n or (8192 if big else 2048), 5 if big else 3
    tf32 = big and uses_tf32()
    if big:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        out: dict[str, Any] = {"fp32": matmul_flops_per_s(device, torch.float32, n=size, repeats=repeats),
                               "math": "tf32" if tf32 else "fp32"}
    finally:
        if big:
            torch.backends.cuda.matmul.allow_tf32 = before
    out["peak"] = out["fp32"]
    if precision == "bf16":
        out["bf16"] = matmul_flops_per_s(device, torch.bfloat16, n=size, repeats=repeats)
        if out["bf16"] > out["fp32"]:
            out["peak"], out["math"] = out["bf16"], "bf16"
    return out


def training_step_flops(model: torch.nn.Module, diffusion: Diffusion, x0: torch.Tensor,
                        generator: torch.Generator) -> int:
    """FLOPs of one training step's forward + backward on the batch ``x0`` (B, C, S, S), as FlopCounterMode counts
    them; the gradients it leaves are cleared."""
    with FlopCounterMode(display=False) as counter:
        loss = diffusion.loss(model, x0, generator=generator)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def _random_train_set(n_images: int, image_size: int, device: torch.device) -> torch.Tensor:
    """Random uint8 images (n_images, 1, S, S) centred with ``to_model`` (float32, on ``device``), like the
    reference loop's data."""
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.integers(0, 256, size=(n_images, 1, image_size, image_size), dtype=np.uint8))
    return to_model(pixels, train_mean(pixels)).to(device)


def _bench_config(width: int, image_size: int, batch: int, attention: bool, n_images: int,
                  device: torch.device) -> RunConfig:
    """The RunConfig of a benchmark model: the paper's U-Net at this width, Adam lr 1e-4 (as the reference)."""
    return RunConfig(data=DataConfig(n=n_images, image_size=image_size),
                     model=ModelConfig(width=width, attention=attention),
                     train=TrainConfig(optimizer="adam", lr=1e-4, batch_size=batch, device=str(device)))


def _apply_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def bench_train(width: int, image_size: int, batch: int, steps: int, device: str = "cpu", attention: bool = False,
                warmup: int = 3, *, n_images: int = 1024, threads: int = 0, adam_impl: str = "default",
                channels_last: bool = False, precision: str = "fp32", compile: bool = False,
                deterministic: bool = TrainConfig.deterministic, peak_matmul_n: int = 0,
                log: Callable[[str], None] = _quiet) -> dict[str, Any]:
    """Time ``steps`` training steps of diffmem's loop (after ``warmup`` untimed ones) and count their FLOPs.

    ``adam_impl``: "default" is the optimizer ``diffmem.train.build_optimizer`` builds (torch's Adam with its default
    implementation); "foreach" / "fused" / "single" force that Adam implementation, to measure what a switch would
    change. ``channels_last``, ``precision`` and ``compile`` are the training switches of
    :mod:`diffmem.acceleration` (train.channels_last, train.precision, train.compile); ``deterministic`` is
    train.deterministic (CUDA only; its default is the config's). ``threads`` > 0 calls
    ``torch.set_num_threads``. ``peak_matmul_n``: the side of the timed matmuls (0: see :func:`peak_flops`).
    Returns images_per_s, s_per_step (wall seconds per optimizer step), flops_per_step, achieved_flops_per_s,
    peak_flops_per_s (fp32 matmul; peak_bf16_flops_per_s on a GPU), utilisation, and the settings.
    """
    _check_positive(width=width, image_size=image_size, batch=batch, steps=steps, n_images=n_images)
    if warmup < 0:
        raise BenchError(f"warmup must be >= 0, got {warmup}")
    if precision not in PRECISIONS:
        raise BenchError(f"unknown precision '{precision}'; choose " + " or ".join(PRECISIONS))
    if adam_impl not in ("default", "foreach", "fused", "single"):
        raise BenchError(f"unknown adam_impl '{adam_impl}'; choose default, foreach, fused or single")
    dev = resolve_device(device)
    _apply_threads(threads)
    cfg = _bench_config(width, image_size, batch, attention, n_images, dev)
    diffusion = Diffusion(cfg.diffusion)
    torch.manual_seed(0)
    model = build_from_config(cfg.model, image_size).to(dev)
    stepper = step_model(model, channels_last=channels_last, compile=compile)
    if adam_impl == "default":
        optimizer = build_optimizer(cfg, model.parameters())
    else:
        flags = {"foreach": dict(foreach=True), "fused": dict(fused=True), "single": dict(foreach=False)}[adam_impl]
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, **flags)
    generator = torch.Generator(device=dev).manual_seed(0)
    train_x = _random_train_set(n_images, image_size, dev).contiguous(memory_format=memory_format(channels_last))
    batcher = EpochBatcher(len(train_x), cfg.batch_size, generator)
    window = torch.zeros(steps + warmup, device=dev)  # the loop keeps each loss on the device (no host sync)
    log(f"bench train: W={width} {image_size}x{image_size} batch {cfg.batch_size} attention={attention} "
        f"params {count_parameters(model)} device {dev} threads {torch.get_num_threads()}")

    model.train()
    t0 = time.perf_counter()
    with deterministic_algorithms(deterministic, dev):
        for i in range(warmup + steps):
            if i == warmup:
                _sync(dev)
                t0 = time.perf_counter()
            window[i] = training_step(stepper, diffusion, optimizer, batcher, train_x, generator, precision)
        _sync(dev)
    elapsed = time.perf_counter() - t0
    final_loss = float(window[-1])
    log(f"bench train: {steps} steps in {elapsed:.3f} s, last loss {final_loss:.4f}; counting FLOPs")

    flops = training_step_flops(model, diffusion, train_x[:cfg.batch_size], generator)
    log("bench train: timing dense matmuls for the machine's peak")
    peak = peak_flops(dev, peak_matmul_n, precision)
    s_per_step = elapsed / steps
    achieved = flops / s_per_step
    out = {
        "impl": "diffmem", "width": width, "image_size": image_size, "batch": cfg.batch_size, "steps": steps,
        "warmup": warmup, "attention": attention, "device": str(dev), "threads": torch.get_num_threads(),
        "adam_impl": adam_impl, "channels_last": channels_last, "precision": precision, "compile": compile,
        "deterministic": deterministic,
        "params": count_parameters(model),
        "s_per_step": s_per_step, "images_per_s": steps * cfg.batch_size / elapsed, "final_loss": final_loss,
        "flops_per_step": flops, "achieved_flops_per_s": achieved, "peak_flops_per_s": peak["peak"],
        "peak_math": peak["math"], "utilisation": achieved / peak["peak"],
    }
    if "bf16" in peak:
        out["peak_bf16_flops_per_s"] = peak["bf16"]
    return out


def bench_sample(width: int, image_size: int, n_samples: int = 256, sampler_steps: int = 50, device: str = "cpu",
                 attention: bool = False, batch_size: int = 1000, *, threads: int = 0, peak_matmul_n: int = 0,
                 log: Callable[[str], None] = _quiet) -> dict[str, Any]:
    """Time ``Diffusion.sample`` (deterministic DDIM on the official schedule: ``sampler_steps - 1`` U-Net calls per
    image) of ``n_samples`` images from a freshly initialised model (the
    cost does not depend on the weights), after one untimed warm-up batch. Returns images_per_s, seconds,
    s_per_model_call (one U-Net forward of a batch), forward FLOPs per image and step, achieved FLOP/s and the
    utilisation against the fp32 matmul peak (``peak_matmul_n`` as in :func:`bench_train`)."""
    _check_positive(width=width, image_size=image_size, n_samples=n_samples, batch_size=batch_size)
    if sampler_steps < 2:
        raise BenchError(f"sampler_steps must be >= 2 (the official DDIM sequence makes steps - 1 updates), got "
                         f"{sampler_steps}")
    dev = resolve_device(device)
    _apply_threads(threads)
    diffusion = Diffusion()
    torch.manual_seed(0)
    model = build_from_config(ModelConfig(width=width, attention=attention), image_size).to(dev)
    shape = (1, image_size, image_size)
    log(f"bench sample: W={width} {image_size}x{image_size} {n_samples} samples, DDIM {sampler_steps} steps, "
        f"device {dev} threads {torch.get_num_threads()}")
    generator = torch.Generator(device="cpu").manual_seed(0)
    diffusion.sample(model, min(n_samples, batch_size), shape, generator, steps=2, batch_size=batch_size, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
    diffusion.sample(model, n_samples, shape, generator, steps=sampler_steps, batch_size=batch_size, device=dev)
    _sync(dev)
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        x = torch.zeros((1, *shape), device=dev)
        model(x, torch.zeros(1, dtype=torch.long, device=dev))
    flops_per_image_step = int(counter.get_total_flops())
    peak = peak_flops(dev, peak_matmul_n)["peak"]
    steps_per_image = diffusion.network_calls("ddim", sampler_steps)
    calls = -(-n_samples // batch_size) * steps_per_image
    achieved = flops_per_image_step * n_samples * steps_per_image / seconds
    return {
        "impl": "diffmem", "width": width, "image_size": image_size, "attention": attention, "n_samples": n_samples,
        "sampler": "ddim", "sampler_steps": sampler_steps, "batch_size": batch_size, "device": str(dev),
        "threads": torch.get_num_threads(), "seconds": seconds, "images_per_s": n_samples / seconds,
        "s_per_model_call": seconds / calls, "flops_per_image_step": flops_per_image_step,
        "achieved_flops_per_s": achieved, "peak_flops_per_s": peak, "utilisation": achieved / peak,
    }


EVAL_PARTS = ("sample_s", "nn_s", "fid_s", "loss_s", "wall_s")


def bench_eval(n_samples: int = 256, sampler_steps: int = 50, n: int = 64, repeats: int = 3, train_steps: int = 200,
               device: str = "cpu", config_path=None, *, threads: int = 0,
               log: Callable[[str], None] = _quiet) -> dict[str, Any]:
    """One full evaluation of the demo's model (``experiments/demo.toml`` unless ``config_path``) through the same
    ``Evaluator`` that training uses, ``repeats`` times after a warm-up (which also caches the FID reference
    statistics), on a freshly initialised model. Returns the median seconds of each part (sample_s, nn_s, fid_s,
    loss_s, wall_s), the seconds per training step at the config's batch (timed over ``train_steps`` steps of the
    training loop), and the evaluation cost relative to training in the config's schedule (train.steps, or
    sweep.steps_per_n x n when set, with eval.times evaluations): eval_over_train_last_gap = one evaluation's wall_s
    over the training seconds of the last (longest) gap between two evaluations; eval_over_train_total = all
    evaluations over all training."""
    from diffmem.config import demo_config_path, load_config
    from diffmem.data import load_images, make_splits
    from diffmem.evaluate import Evaluator
    from diffmem.rundir import RunDir
    from diffmem.eval_grid import evaluation_steps

    _check_positive(n_samples=n_samples, sampler_steps=sampler_steps, n=n, repeats=repeats, train_steps=train_steps)
    _apply_threads(threads)
    cfg, sweep = load_config(config_path or demo_config_path(), [
        f"data.n={n}", f"eval.n_samples={n_samples}", f"eval.sampler_steps={sampler_steps}"])
    dev = resolve_device(device)
    images = load_images(cfg.data)
    splits = make_splits(images, cfg.data)
    diffusion = Diffusion(cfg.diffusion)
    torch.manual_seed(0)
    model = build_from_config(cfg.model, cfg.data.image_size).to(dev)
    log(f"bench eval: {n_samples} samples, DDIM {sampler_steps}, N={n}, {repeats} repeats, device {dev}")
    with tempfile.TemporaryDirectory() as tmp:
        evaluator = Evaluator(cfg, RunDir(tmp), splits, images.sha256, diffusion, dev, log=_quiet)
        evaluator.evaluate(model, 1)
        records = []
        for i in range(repeats):
            records.append(evaluator.evaluate(model, 2 + i))
            log(f"bench eval: repeat {i + 1}: {records[-1]['wall_s']:.2f} s")

    optimizer = build_optimizer(cfg, model.parameters())
    train_x = to_model(splits.train, splits.mean).to(dev)
    generator = torch.Generator(device=dev).manual_seed(0)
    batcher = EpochBatcher(len(train_x), cfg.batch_size, generator)
    model.train()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(train_steps):
        idx = batcher.next()
        loss = diffusion.loss(model, train_x if idx is None else train_x[idx], generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    _sync(dev)
    s_per_step = (time.perf_counter() - t0) / train_steps

    out: dict[str, Any] = {part: statistics.median(r[part] for r in records) for part in EVAL_PARTS}
    steps_total = sweep.run_steps(n, cfg.train.steps)
    schedule = evaluation_steps(cfg.eval.times, steps_total)
    last_gap = schedule[-1] - schedule[-2] if len(schedule) > 1 else schedule[-1]
    out |= {"n_samples": n_samples, "sampler_steps": sampler_steps, "n_train": n, "batch": cfg.batch_size,
            "train_s_per_step": s_per_step, "train_steps_timed": train_steps, "schedule_steps": steps_total,
            "schedule_evaluations": len(schedule), "last_gap_steps": last_gap,
            "eval_over_train_last_gap": out["wall_s"] / (last_gap * s_per_step),
            "eval_over_train_total": len(schedule) * out["wall_s"] / (steps_total * s_per_step),
            "device": str(dev), "threads": torch.get_num_threads(), "repeats": repeats}
    return out
