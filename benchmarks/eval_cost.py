"""Benchmark: the cost of one evaluation (sampling, NN search, FID features, loss gap) and of the training steps
between two evaluations, for the demo's model (experiments/demo.toml) on CPU.

A thin wrapper of :func:`diffmem.throughput.bench_eval` (also ``diffmem bench eval``): it prints one JSON line with the
median seconds of each part, the seconds per training step at the demo's batch, and the evaluation cost relative to
the training between two evaluations of the demo's schedule. Run:
``python benchmarks/eval_cost.py [--n-samples 256] [--sampler-steps 50] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import json

from diffmem.throughput import bench_eval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=256)
    parser.add_argument("--sampler-steps", type=int, default=50)
    parser.add_argument("--n", type=int, default=64, help="train-set size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    print(json.dumps(bench_eval(args.n_samples, args.sampler_steps, args.n, args.repeats, args.train_steps,
                                device=args.device, threads=args.threads)))


if __name__ == "__main__":
    main()
