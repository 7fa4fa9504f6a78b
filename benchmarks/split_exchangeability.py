"""How exchangeable the train set and its non-members are on digits, by the images alone: the blind baseline
(diffmem.analysis.blind) of the source order's split and of the shuffled split at each N, and how clustered the
digits' ordering is (the mean distance between images of one label, by how far apart they are in the ordering).

    python benchmarks/split_exchangeability.py [--permutations 999]

Prints one table; docs/data.md quotes it.
"""
from __future__ import annotations

import argparse

import numpy as np

from diffmem.analysis.blind import blind_baseline
from diffmem.config import DataConfig
from diffmem.data import embedded_digits, make_splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--permutations", type=int, default=999)
    parser.add_argument("--n", type=int, nargs="+", default=[16, 32, 64, 128])
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    digits = embedded_digits(8)
    pixels = digits.images.numpy().astype(np.float64) / 255.0
    labels = load_digits().target
    flat = pixels.reshape(len(pixels), -1)
    i, j = np.triu_indices(len(flat), 1)
    same = labels[i] == labels[j]
    gap = j - i
    dist = np.sqrt(((flat[i] - flat[j]) ** 2).sum(1))
    print("digits' ordering: mean L2 distance (pixels x / 255) between two images of one label, by their distance "
          "in the ordering")
    for lo, hi in ((1, 50), (50, 400), (400, 1797)):
        pick = same & (gap >= lo) & (gap < hi)
        print(f"  {lo:4d} <= gap < {hi:4d}: {dist[pick].mean():.3f} over {pick.sum()} pairs")
    print()
    print(f"blind baseline, 1000 held out, {args.permutations} permutations")
    print("   N  order      MMD p   distance AUC [95 %]")
    for n in args.n:
        for order in ("source", "shuffled"):
            s = make_splits(digits, DataConfig(source="digits", image_size=8, n=n, n_heldout=1000, order=order))
            used = set(s.train_indices.tolist()) | set(s.heldout_indices.tolist())
            reference = np.array([k for k in range(len(pixels)) if k not in used])
            b = blind_baseline(pixels[s.train_indices], pixels[s.heldout_indices], pixels[reference],
                               permutations=args.permutations, seed=0)
            print(f"{n:4d}  {order:9s} {b.mmd_p:6.3f}   {b.auc:.3f} [{b.auc_lo:.3f}, {b.auc_hi:.3f}]")


if __name__ == "__main__":
    main()
