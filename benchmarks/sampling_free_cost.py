"""Benchmark: one sampling-free evaluation (the per-level train and held-out losses, their gaps and the membership AUC,
as ``Evaluator._loss_levels`` computes them) against one f_mem evaluation (``eval.n_samples`` DDIM samples and the
nearest-neighbour search), for one model at one run's settings, on one CPU thread.

Default: the digits reference experiment (experiments/cpu_digits.toml) at N = 64, W = 8: 1000 DDIM-20 samples for f_mem;
6 noise levels (``eval.loss_ts``) x 5 noise draws (``eval.loss_noise_draws``) over the 64 train and the 1000 held-out
images (``eval.loss_n_test``) for the recorded evaluation, and over 64 + 64 images for the monitor
(``diffmem.monitor.MembershipMonitor``, which needs only as many held-out images as train images). The model has its
initial weights: the cost of a network call does not depend on them. Prints the median seconds of each over the
rounds (each round runs all three, in turn) and the ratios, then one JSON line. Run:
``python benchmarks/sampling_free_cost.py [--config experiments/cpu_digits.toml] [--set data.n=64] [--rounds 5]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from diffmem.config import load_config
from diffmem.data import load_images, make_splits, to_model
from diffmem.diffusion import Diffusion
from diffmem.evaluate import draw_samples
from diffmem.metrics.losses import level_gaps, per_image_losses
from diffmem.metrics.membership import membership_aucs
from diffmem.metrics.memorization import memorized_fraction
from diffmem.model import build_from_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/cpu_digits.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override (default: data.n=64, model.width=8)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg, _ = load_config(args.config, ["data.n=64", "model.width=8", "train.device=cpu", *args.set])
    e = cfg.eval
    splits = make_splits(load_images(cfg.data), cfg.data)
    train_x = to_model(splits.train, splits.mean)
    test_x = to_model(splits.heldout[:e.loss_n_test], splits.mean)
    torch.manual_seed(0)
    model = build_from_config(cfg.model, cfg.data.image_size).eval()
    diffusion = Diffusion(cfg.diffusion)
    steps = [diffusion.step_for_time(t) for t in e.loss_ts]
    m = min(len(train_x), len(test_x))

    def sampling_free(train: torch.Tensor, test: torch.Tensor) -> None:
        tr, te = (per_image_losses(model, diffusion, x, steps, e.loss_noise_draws, e.seed) for x in (train, test))
        level_gaps(tr, te)
        membership_aucs(tr.numpy(), te.numpy())

    def f_mem() -> None:
        samples = draw_samples(diffusion, model, e, e.n_samples, tuple(train_x.shape[1:]), torch.device("cpu"))
        memorized_fraction(samples, train_x, threshold=e.mem_threshold, n_boot=e.n_boot, seed=e.seed)

    parts = {"f_mem_s": f_mem, "levels_s": lambda: sampling_free(train_x, test_x),
             "monitor_s": lambda: sampling_free(train_x[:m], test_x[:m])}
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.rounds):
        for name, work in parts.items():
            t0 = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {"config": args.config, "n": len(train_x), "width": cfg.model.width, "n_samples": e.n_samples,
              "sampler_steps": e.sampler_steps, "loss_ts": list(e.loss_ts), "draws": e.loss_noise_draws,
              "n_test": len(test_x), "rounds": args.rounds, **{k: round(v, 3) for k, v in medians.items()},
              "f_mem_over_levels": round(medians["f_mem_s"] / medians["levels_s"], 1),
              "f_mem_over_monitor": round(medians["f_mem_s"] / medians["monitor_s"], 1)}
    print(f"f_mem evaluation ({e.n_samples} DDIM-{e.sampler_steps} samples + NN search): {medians['f_mem_s']:.2f} s; "
          f"sampling-free, recorded ({len(e.loss_ts)} levels x {e.loss_noise_draws} draws, {len(train_x)} + "
          f"{len(test_x)} images): {medians['levels_s']:.2f} s; monitor ({m} + {m} images): "
          f"{medians['monitor_s']:.3f} s (medians of {args.rounds} rounds)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
