"""Which learning rates train stably from initialization: for each lr and seed, the first K optimizer steps of an
experiment's run, and whether the loss became non-finite (NaN or inf).

It builds the run exactly as ``diffmem train`` does (the config's model, data split, centring, loss, optimizer and
seeds: ``torch.manual_seed(seed)`` before the U-Net, the training generator seeded with the same seed), so seed s here
is seed s of a sweep, but it writes no run folder and evaluates nothing. One JSON line per (lr, seed), then one
summary line per lr: ``{"lr", "seeds", "diverged", "diverged_seeds", "first_nonfinite_step"}``.

Run from the repository root, for example the width-32 cell of the CPU reference experiment:
``python benchmarks/lr_stability.py experiments/cpu_digits.toml --lr 0.03 0.02 --seeds 20 --steps 100
--set data.n=64 --set model.width=32``. Divergence with SGD momentum at full batch shows within tens of steps from
initialization, so a short window is what this measures; a run can still diverge later.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from diffmem.config import load_config
from diffmem.data import load_images, make_splits, to_model
from diffmem.diffusion import Diffusion
from diffmem.model import build_from_config
from diffmem.train import EpochBatcher, build_optimizer, training_step


def first_steps(config: str, overrides: list[str], lr: float, seed: int, steps: int) -> dict:
    """The losses of the first ``steps`` optimizer steps of seed ``seed`` at learning rate ``lr`` (stops at the first
    non-finite loss)."""
    cfg, _ = load_config(config, [*overrides, f"train.lr={lr}", f"train.seed={seed}"])
    images = load_images(cfg.data)
    splits = make_splits(images, cfg.data)
    diffusion = Diffusion(cfg.diffusion)
    torch.manual_seed(seed)  # as train.py: the U-Net's initialization draws from the global generator
    model = build_from_config(cfg.model, cfg.data.image_size)
    optimizer = build_optimizer(cfg, model.parameters())
    generator = torch.Generator()
    generator.manual_seed(seed)
    train_x = to_model(splits.train, splits.mean)
    batcher = EpochBatcher(len(train_x), cfg.batch_size, generator)
    losses: list[float] = []
    for _ in range(steps):
        losses.append(float(training_step(model, diffusion, optimizer, batcher, train_x, generator)))
        if not math.isfinite(losses[-1]):
            break
    finite = [v for v in losses if math.isfinite(v)]
    return {"lr": lr, "seed": seed, "steps": len(losses), "diverged": not math.isfinite(losses[-1]),
            "first_loss": losses[0], "max_finite_loss": max(finite) if finite else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="experiment TOML file")
    parser.add_argument("--lr", type=float, nargs="+", required=True, help="learning rates to try")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. SEEDS-1")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per (lr, seed)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for lr in args.lr:
        rows = [first_steps(args.config, args.set, lr, seed, args.steps) for seed in range(args.seeds)]
        for row in rows:
            print(json.dumps(row), flush=True)
        bad = [r for r in rows if r["diverged"]]
        print(json.dumps({"lr": lr, "seeds": len(rows), "diverged": len(bad),
                          "diverged_seeds": [r["seed"] for r in bad],
                          "first_nonfinite_step": [r["steps"] for r in bad]}), flush=True)


if __name__ == "__main__":
    main()
