"""Benchmark of the exact nearest/second-nearest search of ``diffmem.metrics.memorization.nearest_two``.

Times the search of 1000 samples against 32768 training vectors of 1024 dims (the paper's largest train set at
32x32 grayscale) on random centered data, and prints one JSON line:
``{"seconds": <median wall time>, "seconds_all": [...], "n_samples": ..., "n_train": ..., "dim": ..., "device": ...,
"threads": ...}``. Run: ``python benchmarks/nn_search.py [--device cuda] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from diffmem.metrics.memorization import nearest_two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=1000)
    parser.add_argument("--n-train", type=int, default=32768)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    train = (torch.rand(args.n_train, args.dim, generator=generator) - 0.5).to(device)
    samples = (torch.rand(args.n_samples, args.dim, generator=generator) - 0.5).to(device)
    nearest_two(samples[:16], train[:4096])  # warm-up: kernels, thread pool

    seconds = []
    for _ in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        nearest_two(samples, train)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)

    print(json.dumps({
        "seconds": round(statistics.median(seconds), 4),
        "seconds_all": [round(s, 4) for s in seconds],
        "n_samples": args.n_samples,
        "n_train": args.n_train,
        "dim": args.dim,
        "device": str(device),
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
