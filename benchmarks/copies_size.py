"""Size of a run's copies.jsonl for the paper's largest run: N = 32768 training images, ~110 evaluations of 10000
samples, each line written by the evaluation's own code (CopyCounts.record, packed counts).

Three cases of where the samples land: "spread" (each sample's nearest image drawn uniformly from the train set, no
copies), "half copies" (the same, half of the samples copies), "worst" (every sample on its own image, all copies:
the least compressible counts). Prints the bytes of one line, of the whole file, and of the plain lists (indices and
counts as JSON numbers, the first format) for comparison; then, for the "half copies" file written in full to a
temporary run folder, the time to read it back validated and unpacked (``RunDir.copies``, median of 3 reads): what
an evaluation would pay at the end of the run if it re-read the file instead of keeping its ``CopyHistory``.

    python benchmarks/copies_size.py [--n-train 32768] [--n-samples 10000] [--evaluations 110]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

from diffmem.io import append_jsonl
from diffmem.metrics.memorization import CopyCounts
from diffmem.rundir import RunDir


def counts_of(nearest: np.ndarray, copied: np.ndarray) -> CopyCounts:
    def sparse(values: np.ndarray) -> tuple[list[int], list[int]]:
        idx, n = np.unique(values, return_counts=True)
        return idx.tolist(), n.tolist()

    return CopyCounts(*sparse(nearest), *sparse(copied))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=32768)
    parser.add_argument("--n-samples", type=int, default=10000)
    parser.add_argument("--evaluations", type=int, default=110)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    spread = rng.integers(0, args.n_train, args.n_samples)
    worst = rng.permutation(args.n_train)[:args.n_samples]
    cases = {"spread, no copies": (spread, spread[:0]), "spread, half copies": (spread, spread[::2]),
             "worst: all distinct, all copies": (worst, worst)}
    print(f"N = {args.n_train}, {args.n_samples} samples per evaluation, {args.evaluations} evaluations")
    for name, (nearest, copied) in cases.items():
        counts = counts_of(nearest, copied)
        packed = len(json.dumps(counts.record(1, args.n_samples, 0, 1 / 3, args.n_train))) + 1
        plain = len(json.dumps(counts.__dict__)) + 1
        print(f"{name:32s} packed line {packed / 1e3:7.1f} kB, file {packed * args.evaluations / 1e6:6.2f} MB"
              f"   (plain lists: line {plain / 1e3:6.1f} kB, file {plain * args.evaluations / 1e6:6.2f} MB)")
    with tempfile.TemporaryDirectory() as folder:
        run = RunDir(folder)
        for k in range(args.evaluations):
            nearest = rng.integers(0, args.n_train, args.n_samples)
            append_jsonl(run.copies_path, counts_of(nearest, nearest[::2]).record(
                100 * (k + 1), args.n_samples, 0, 1 / 3, args.n_train))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run.copies()
            times.append(time.perf_counter() - start)
        print(f"reading back the whole half-copies file ({run.copies_path.stat().st_size / 1e6:.2f} MB, "
              f"{args.evaluations} lines): {statistics.median(times):.2f} s (median of 3)")


if __name__ == "__main__":
    main()
