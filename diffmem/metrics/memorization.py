"""Memorization test: nearest and second-nearest training images of every sample, and the memorized fraction.

A generated sample x is *memorized* when ``||x - a1|| / ||x - a2|| < threshold`` (default 1/3, Bonnaire et al. 2025,
following Yoon et al. 2023), with a1, a2 its nearest and second-nearest training images in L2 pixel space. Inputs
are the same float vectors the model was trained on (centered pixels, d = 1024 for 32x32 grayscale); images of
shape (n, C, H, W) are flattened to (n, C*H*W).

The search is exact and brute force. Distances are ranked with the expansion ``||t||^2 - 2 s.t`` (the ``||s||^2``
term is constant per sample) in float32 by matrix multiplication, after subtracting the train mean from both sides
(distances are shift-invariant, and centering keeps the float32 cancellation small even for uncentered inputs).
The ``n_candidates`` best train images of every sample are then re-scored exactly, in float64, from the difference
``s - t`` itself, and d1, d2 are taken from those exact scores. So an exact copy gives d1 == 0 and two identical
train images give d1 == d2. The result equals a float64 brute force unless more than ``n_candidates - 2`` train
images lie within float32 rounding (about 1e-6 relative) of the second-nearest distance, in which case d2 is still
that (tied) distance up to that rounding.

Memory: the work is chunked over samples and over train images. Besides the inputs themselves, the search holds
one float32 distance block of ``sample_chunk x train_chunk``, one float32 train chunk and one sample chunk of
``chunk x d``, a float64 re-scoring block of at most ``sample_chunk x train_chunk`` elements (plus its gather in
the train dtype), and ``n x n_candidates`` running candidates (12 bytes each). With the defaults (1024 x 4096) and
d = 1024 that is at most 16 + 16 + 4 + 32 + 16 MB, about 85 MB (+ 1 MB of candidates per 10k samples), whatever n and
N are (10k x 32768 included). Everything runs on the samples'
device (a CPU train set is streamed to the GPU chunk by chunk).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diffmem.io import COUNTS_ENCODING, pack_counts

DEFAULT_THRESHOLD = 1 / 3
DEFAULT_SAMPLE_CHUNK = 1024
DEFAULT_TRAIN_CHUNK = 4096
DEFAULT_N_CANDIDATES = 8


class MemorizationError(ValueError):
    """Bad input to the memorization test; the message is one line that says what to do."""


@dataclass(frozen=True, eq=False)
class MemorizationResult:
    """The memorized fraction of a set of samples and its 95% percentile-bootstrap interval.

    fraction: share of samples with d1/d2 < threshold, in [0, 1].
    lo, hi: 2.5 and 97.5 percentiles of the fraction over ``n_boot`` resamples (with replacement) of the samples.
    ratios: (n,) float64 CPU tensor of d1/d2 per sample (1.0 where d1 = d2 = 0, i.e. a tie).
    idx1: (n,) int64 CPU tensor, index of each sample's nearest training image.
    threshold: the ratio below which a sample counts as memorized.
    n: number of samples.
    d1: (n,) float64 CPU tensor of each sample's distance to its nearest training image (inputs' units), or None.
    """

    fraction: float
    lo: float
    hi: float
    ratios: torch.Tensor
    idx1: torch.Tensor
    threshold: float
    n: int
    d1: torch.Tensor | None = None

    @property
    def memorized(self) -> torch.Tensor:
        """(n,) bool CPU tensor: which samples are memorized."""
        return self.ratios < self.threshold

    def to_dict(self) -> dict[str, Any]:
        """The scalars: fraction, lo, hi, threshold, n."""
        return {"fraction": self.fraction, "lo": self.lo, "hi": self.hi, "threshold": self.threshold, "n": self.n}


def _as_rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """(n, ...) tensor -> (n, d) view; rejects non-real dtypes and empty or scalar inputs."""
    if not isinstance(x, torch.Tensor):
        raise MemorizationError(f"{what} must be a torch.Tensor of shape (n, ...), got {type(x).__name__}")
    if x.dim() < 1 or x.shape[0] == 0:
        raise MemorizationError(f"{what} must have shape (n, ...) with n >= 1, got {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise MemorizationError(f"{what} has dtype {x.dtype}; pass real-valued images (float or integer)")
    return x.reshape(x.shape[0], -1)


def _check_finite(x: torch.Tensor, what: str, chunk: int) -> None:
    if not x.is_floating_point():
        return
    for start in range(0, x.shape[0], chunk):
        if not torch.isfinite(x[start:start + chunk]).all():
            raise MemorizationError(f"{what} contains NaN or inf values (rows from {start}); "
                                    "check the sampler output before measuring memorization")


def _train_mean(train: torch.Tensor, device: torch.device, chunk: int) -> torch.Tensor:
    """(d,) float32 mean of the train rows on ``device``, accumulated in float64 chunk by chunk."""
    total = torch.zeros(train.shape[1], dtype=torch.float64, device=device)
    for start in range(0, train.shape[0], chunk):
        total += train[start:start + chunk].to(device=device).sum(0, dtype=torch.float64)
    return (total / train.shape[0]).to(torch.float32)


@torch.no_grad()
def nearest_k(
    samples: torch.Tensor,
    train: torch.Tensor,
    k: int,
    *,
    exclude_self: bool = False,
    sample_chunk: int = DEFAULT_SAMPLE_CHUNK,
    train_chunk: int = DEFAULT_TRAIN_CHUNK,
    n_candidates: int = DEFAULT_N_CANDIDATES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2 distances of every sample to its ``k`` nearest training images, increasing (exact search, module doc).

    Args:
        samples: (n, ...) real tensor; its device is where the search runs.
        train: (N, ...) real tensor with the same number of elements per row; any device.
        k: neighbours per sample, 1 <= k <= N (N - 1 with ``exclude_self``).
        exclude_self: the samples are the train images themselves (same rows, same order) and each row's own index
            is left out; an identical other image still counts, at distance 0.
        sample_chunk, train_chunk: rows per block of the distance matrix (bounds the memory, see the module doc).
        n_candidates: train images per sample re-scored exactly in float64: ``max(n_candidates, k + 1)``, at most
            the train images available.

    Returns:
        dist: (n, k) float64 distances, increasing along each row (same units as the inputs).
        index: (n, k) int64 indices into ``train`` (the lowest index first among exact ties).
        Both on the samples' device.
    """
    s_rows = _as_rows(samples, "samples")
    t_rows = _as_rows(train, "train")
    n, d = s_rows.shape
    n_train = t_rows.shape[0]
    available = n_train - (1 if exclude_self else 0)
    if not isinstance(k, int) or not 1 <= k <= available:
        raise MemorizationError(f"{k!r} nearest training images asked for, {available} available; ask for at least "
                                "1 and at most that many")
    if t_rows.shape[1] != d:
        raise MemorizationError(f"samples have {d} values per image but train has {t_rows.shape[1]}; pass images "
                                "of the same shape (e.g. both (n, 1, 32, 32))")
    if exclude_self and n != n_train:
        raise MemorizationError(f"exclude_self needs the train images themselves as samples: {n} samples, {n_train} "
                                "train images")
    for name, value, low in (("sample_chunk", sample_chunk, 1), ("train_chunk", train_chunk, 1),
                             ("n_candidates", n_candidates, 1)):
        if not isinstance(value, int) or value < low:
            raise MemorizationError(f"{name} = {value!r} must be an integer >= {low}")
    _check_finite(s_rows, "samples", sample_chunk)

    device = s_rows.device
    n_cand = min(max(n_candidates, k + 1), available)
    mean = _train_mean(t_rows, device, train_chunk)
    if not torch.isfinite(mean).all():  # a float64 sum of float32 values is non-finite only if a value is NaN/inf
        raise MemorizationError("train contains NaN or inf values; check the training tensor")

    # Running best candidates (approximate float32 scores) of every sample.
    best_score = torch.full((n, n_cand), math.inf, dtype=torch.float32, device=device)
    best_index = torch.zeros((n, n_cand), dtype=torch.int64, device=device)
    for t_start in range(0, n_train, train_chunk):
        t_block = t_rows[t_start:t_start + train_chunk].to(device=device, dtype=torch.float32) - mean
        t_sqnorm = (t_block * t_block).sum(1)
        k_block = min(n_cand, t_block.shape[0])
        for s_start in range(0, n, sample_chunk):
            s_block = s_rows[s_start:s_start + sample_chunk].to(dtype=torch.float32) - mean
            # score = ||t||^2 - 2 s.t = ||s - t||^2 - ||s||^2: same ranking as the distance, per sample.
            score = torch.addmm(t_sqnorm, s_block, t_block.T, beta=1.0, alpha=-2.0)
            if exclude_self:  # a sample's own row, where this train block holds it, is never a candidate
                own = torch.arange(s_start, s_start + score.shape[0], device=device) - t_start
                inside = (own >= 0) & (own < score.shape[1])
                score[inside.nonzero().squeeze(1), own[inside]] = math.inf
            block_score, block_index = score.topk(k_block, dim=1, largest=False, sorted=False)
            merged_score = torch.cat([best_score[s_start:s_start + sample_chunk], block_score], dim=1)
            merged_index = torch.cat([best_index[s_start:s_start + sample_chunk], block_index + t_start], dim=1)
            keep_score, keep_pos = merged_score.topk(n_cand, dim=1, largest=False, sorted=False)
            best_score[s_start:s_start + sample_chunk] = keep_score
            best_index[s_start:s_start + sample_chunk] = merged_index.gather(1, keep_pos)
        del t_block, t_sqnorm

    # Exact float64 re-scoring of the candidates, in row blocks of at most sample_chunk x train_chunk values.
    rows_per_block = max(1, (sample_chunk * train_chunk) // (n_cand * d))
    dist = torch.empty((n, k), dtype=torch.float64, device=device)
    index_out = torch.empty((n, k), dtype=torch.int64, device=device)
    for start in range(0, n, rows_per_block):
        index = best_index[start:start + rows_per_block].sort(dim=1).values  # ties then go to the lowest index
        cand = t_rows[index.to(t_rows.device)].to(device=device, dtype=torch.float64)  # (b, n_cand, d)
        cand.sub_(s_rows[start:start + rows_per_block].to(torch.float64).unsqueeze(1)).square_()
        sqdist = cand.sum(2)
        del cand
        if exclude_self:  # the own row stays out even where a block had fewer other candidates than asked
            own = torch.arange(start, start + index.shape[0], device=device)[:, None]
            sqdist[index == own] = math.inf
        order = sqdist.argsort(dim=1, stable=True)[:, :k]
        dist[start:start + rows_per_block] = sqdist.gather(1, order).sqrt()
        index_out[start:start + rows_per_block] = index.gather(1, order)
    return dist, index_out


def nearest_two(
    samples: torch.Tensor,
    train: torch.Tensor,
    *,
    sample_chunk: int = DEFAULT_SAMPLE_CHUNK,
    train_chunk: int = DEFAULT_TRAIN_CHUNK,
    n_candidates: int = DEFAULT_N_CANDIDATES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """L2 distances of every sample to its nearest and second-nearest training image (:func:`nearest_k` with k = 2).

    Args:
        samples: (n, ...) real tensor; its device is where the search runs.
        train: (N, ...) real tensor with the same number of elements per row, N >= 2; any device.
        sample_chunk, train_chunk: rows per block of the distance matrix (bounds the memory, see the module doc).
        n_candidates: train images per sample re-scored exactly in float64 (>= 2).

    Returns:
        d1: (n,) float64 distance to the nearest training image (same units as the inputs).
        d2: (n,) float64 distance to the second-nearest training image (d2 >= d1).
        idx1: (n,) int64 index into ``train`` of the nearest image (the lowest index among exact ties).
        All on the samples' device.
    """
    n_train = _as_rows(train, "train").shape[0]
    if n_train < 2:
        raise MemorizationError(f"train has {n_train} image(s); the second-nearest distance needs at least 2 "
                                "training images")
    if not isinstance(n_candidates, int) or n_candidates < 2:
        raise MemorizationError(f"n_candidates = {n_candidates!r} must be an integer >= 2")
    dist, index = nearest_k(samples, train, 2, sample_chunk=sample_chunk, train_chunk=train_chunk,
                            n_candidates=n_candidates)
    return dist[:, 0], dist[:, 1], index[:, 0]


def distance_ratio(d1: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
    """d1/d2 per sample, with 0/0 (a sample equal to two identical train images) counted as a tie: ratio 1."""
    return torch.where(d2 > 0, d1 / d2.clamp_min(torch.finfo(d2.dtype).tiny), torch.ones_like(d1))


def bootstrap_interval(indicators: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of (n,) values (0/1 indicators for f_mem; per-draw measures of
    split pairs, ``diffmem.metrics.pairs``).

    Draws ``n_boot`` resamples of the n values with replacement from ``numpy.random.default_rng(seed)`` and
    returns the (1 - level)/2 and (1 + level)/2 percentiles of their means.
    """
    values = np.asarray(indicators, dtype=np.float64)
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot, dtype=np.float64)
    per_draw = max(1, (1 << 22) // n)  # resamples drawn at once: bounds the index array at ~4M entries
    for start in range(0, n_boot, per_draw):
        count = min(per_draw, n_boot - start)
        picks = rng.integers(0, n, size=(count, n))
        means[start:start + count] = values[picks].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def memorized_fraction(
    samples: torch.Tensor,
    train: torch.Tensor,
    threshold: float = DEFAULT_THRESHOLD,
    n_boot: int = 1000,
    seed: int = 0,
    *,
    sample_chunk: int = DEFAULT_SAMPLE_CHUNK,
    train_chunk: int = DEFAULT_TRAIN_CHUNK,
) -> MemorizationResult:
    """Fraction of samples whose nearest/second-nearest distance ratio is below ``threshold``, with a 95% CI.

    Args:
        samples: (n, ...) generated images, in the same float space as the training data.
        train: (N, ...) training images, N >= 2.
        threshold: memorized when d1/d2 < threshold, in (0, 1]; the paper uses 1/3.
        n_boot: bootstrap resamples of the per-sample memorized indicators (>= 1).
        seed: seed of the bootstrap's numpy generator (the same seed gives the same interval).
        sample_chunk, train_chunk: block sizes of the search (see ``nearest_two``).
    """
    if not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise MemorizationError(f"threshold = {threshold!r} must be in (0, 1] (the paper uses 1/3)")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise MemorizationError(f"n_boot = {n_boot!r} must be an integer >= 1 (the paper uses 1000)")
    d1, d2, idx1 = nearest_two(samples, train, sample_chunk=sample_chunk, train_chunk=train_chunk)
    ratios = distance_ratio(d1, d2).cpu()
    memorized = (ratios < threshold).numpy()
    lo, hi = bootstrap_interval(memorized, n_boot, seed)
    return MemorizationResult(
        fraction=float(memorized.mean()),
        lo=lo,
        hi=hi,
        ratios=ratios,
        idx1=idx1.cpu(),
        threshold=float(threshold),
        n=int(ratios.shape[0]),
        d1=d1.cpu(),
    )


@dataclass(frozen=True)
class CopyCounts:
    """Which training images one evaluation's samples landed on, as sparse counts (indices into the train set).

    nearest_idx, nearest_n: the training images that are some sample's nearest image, in increasing index, and how
    many samples each is nearest to (the counts sum to the number of samples).
    copied_idx, copied_n: the training images that some memorized sample (d1/d2 < threshold) copies, in increasing
    index, and how many samples copy each (a copied image is always among the nearest ones, with copied_n <=
    nearest_n).
    """

    nearest_idx: list[int]
    nearest_n: list[int]
    copied_idx: list[int]
    copied_n: list[int]

    def dense(self, n_train: int) -> tuple[np.ndarray, np.ndarray]:
        """(nearest, copied): (n_train,) int64 counts of every training image."""
        nearest, copied = np.zeros(n_train, np.int64), np.zeros(n_train, np.int64)
        nearest[self.nearest_idx], copied[self.copied_idx] = self.nearest_n, self.copied_n
        return nearest, copied

    def record(self, step: int, n_samples: int, seed: int, threshold: float, n_train: int) -> dict[str, Any]:
        """The copies.jsonl line of an evaluation at ``step`` (optimizer steps) of ``n_samples`` samples drawn with
        ``seed``, against ``n_train`` training images: both count arrays dense and packed
        (:func:`diffmem.io.pack_counts`; a few kB per line where the plain lists of 10000 samples over 32768 images
        take about 80 kB), read back as these lists by :func:`diffmem.rundir.records.copies_lines`."""
        nearest, copied = self.dense(n_train)
        return {"step": step, "n_samples": n_samples, "seed": seed, "mem_threshold": threshold, "n_train": n_train,
                "encoding": COUNTS_ENCODING, "nearest": pack_counts(nearest), "copied": pack_counts(copied)}


def copy_counts(result: MemorizationResult) -> CopyCounts:
    """The per-training-image counts of ``result`` (:func:`memorized_fraction`): which images are nearest to the
    samples and which are copied, each with its number of samples."""
    def sparse(indices: torch.Tensor) -> tuple[list[int], list[int]]:
        idx, counts = torch.unique(indices, sorted=True, return_counts=True)
        return [int(i) for i in idx], [int(c) for c in counts]

    nearest_idx, nearest_n = sparse(result.idx1)
    copied_idx, copied_n = sparse(result.idx1[result.memorized])
    return CopyCounts(nearest_idx, nearest_n, copied_idx, copied_n)


def median_neighbour_distance(train: torch.Tensor) -> float:
    """D: the median over training images (N, ...; N >= 2) of the distance to their nearest *other* training image
    (the second-nearest of an image searched in its own set, which is itself at distance 0), in the inputs' units:
    the scale of the fixed-distance copy rules (:func:`copied_within`)."""
    return float(nearest_two(train, train)[1].median())


def copied_within(result: MemorizationResult, n_train: int, limit: float) -> np.ndarray:
    """(n_train,) int64: per training image, how many of ``result``'s samples have it as their nearest image at a
    distance d1 < ``limit`` (the inputs' units): a fixed-distance copy rule, beside the ratio rule."""
    if result.d1 is None:
        raise MemorizationError("this result kept no distances (d1); compute it with memorized_fraction")
    counts = np.zeros(n_train, np.int64)
    np.add.at(counts, result.idx1[result.d1 < limit].numpy(), 1)
    return counts


def first_copies(result: MemorizationResult, earlier: set[int], limit: int) -> tuple[list[int], list[int]]:
    """(images, samples): the training images that ``result``'s samples copy and that are not in ``earlier`` (the
    images copied at earlier steps), in increasing index, at most ``limit`` of them, and for each the sample that
    copies it most closely (the lowest d1/d2)."""
    images, picks = [], []
    memorized = result.memorized
    for image in sorted(set(result.idx1[memorized].tolist()) - earlier)[:limit]:
        candidates = torch.nonzero(memorized & (result.idx1 == image)).flatten()
        images.append(int(image))
        picks.append(int(candidates[result.ratios[candidates].argmin()]))
    return images, picks
