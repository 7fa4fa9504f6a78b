"""Benchmark: the cost of one evaluation (sampling, NN search, FID features, loss gap) and of the training steps
between two evaluations, for the demo's model (W=8, 16x16, no attention) on CPU.

Evaluates a freshly initialised model (the cost does not depend on the weights) through the same ``Evaluator`` that
training uses, several times, and prints one JSON line with the median seconds of each part, plus the seconds of
``--train-steps`` training steps at the demo's batch for comparison. Run:
``python benchmarks/eval_cost.py [--n-samples 256] [--sampler-steps 50] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from diffmem.cli import demo_config_path
from diffmem.config import load_config
from diffmem.data import load_images, make_splits, to_model
from diffmem.device import resolve_device
from diffmem.diffusion import Diffusion
from diffmem.evaluate import Evaluator
from diffmem.model import build_from_config
from diffmem.rundir import RunDir
from diffmem.train import build_optimizer

PARTS = ("sample_s", "nn_s", "fid_s", "loss_s", "wall_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=256)
    parser.add_argument("--sampler-steps", type=int, default=50)
    parser.add_argument("--n", type=int, default=64, help="train-set size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    cfg, _ = load_config(demo_config_path(), [f"data.n={args.n}", f"eval.n_samples={args.n_samples}",
                                              f"eval.sampler_steps={args.sampler_steps}"])
    device = resolve_device(args.device)
    images = load_images(cfg.data)
    splits = make_splits(images, cfg.data)
    diffusion = Diffusion(cfg.diffusion)
    torch.manual_seed(0)
    model = build_from_config(cfg.model, cfg.data.image_size).to(device)
    with tempfile.TemporaryDirectory() as tmp:
        evaluator = Evaluator(cfg, RunDir(tmp), splits, images.sha256, diffusion, device, log=lambda _m: None)
        evaluator.evaluate(model, 1)  # warm-up; also caches the FID reference statistics
        records = [evaluator.evaluate(model, 2 + i) for i in range(args.repeats)]

    optimizer = build_optimizer(cfg, model.parameters())
    train_x = to_model(splits.train, splits.mean).to(device)
    generator = torch.Generator(device=device).manual_seed(0)
    model.train()
    t0 = time.perf_counter()
    for _ in range(args.train_steps):
        idx = torch.randint(0, len(train_x), (cfg.batch_size,), generator=generator, device=device)
        loss = diffusion.loss(model, train_x[idx], generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    s_per_step = (time.perf_counter() - t0) / args.train_steps

    out = {part: statistics.median(r[part] for r in records) for part in PARTS}
    out |= {"n_samples": args.n_samples, "sampler_steps": args.sampler_steps, "n_train": args.n,
            "batch": cfg.batch_size, "train_s_per_step": s_per_step, "device": str(device),
            "threads": torch.get_num_threads(), "repeats": args.repeats}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
