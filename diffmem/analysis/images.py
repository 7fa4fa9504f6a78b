"""Which training images are copied, and when (issue 43): the per-image timeline of each run, its descriptors, the
copied fraction of the train set against the step and the rank correlations, from each run's ``copies.jsonl``.

Inputs: a run's copies.jsonl (one line per evaluation, :meth:`diffmem.rundir.RunDir.copies`) and its train set,
rebuilt from its config as the evaluation builds it (``load_images`` + ``make_splits``, centered by ``to_model``:
the distances below are L2 distances in that space, the space of the memorization test). Outputs, in the analysis
folder (``diffmem analyze``'s ``--out``, default the experiment folder; never inside a run folder):

- ``images/<run>.csv`` (:data:`IMAGE_COLUMNS`), one row per training image: its first-copy step and bracket, its
  copies, and three descriptors computed once per train set;
- ``images/copied_fraction.csv`` (:data:`FRACTION_COLUMNS`), one row per run and base evaluation: the fraction of
  the train set copied by that evaluation's samples with its 95 % interval;
- :func:`analyze_images`'s per-run summary.csv columns (:data:`SUMMARY_IMAGE_COLUMNS`) and fits.json's ``images``
  section (per run and per cell: correlations with intervals, the cell's copied-fraction curve, seed and N
  stability).

Rules (docs/analysis.md, "Which images are copied"):

- an image is *copied* by an evaluation when at least one of its samples copies it (d1/d2 < eval.mem_threshold
  with the image as nearest, :func:`diffmem.metrics.memorization.copy_counts`). Two identical training images give
  every sample near them d1 = d2, a ratio of 1: neither is ever counted as copied;
- lines: the latest line per (step, sample count) is used (a step evaluated again replaces its line, as for
  metrics). The *first copy* uses every line, refinement evaluations (more samples, eval.refine_n_samples)
  included: the first step at which any line copies the image; ``first_copy_bracket_lo`` is the evaluated step
  before it (where no line copied it), ``first_copy_n_samples`` the sample count of the line that copied it (the
  smallest when several did). The *curves* (copies per evaluation, the copied fraction) use only the evaluations with
  the run's base eval.n_samples, so that one curve is one estimator;
- never-copied images have first_copy_step empty in the CSV and count as +inf (tied last) in the correlations.

Intervals (95 %; the correlations by percentile bootstrap with fixed seeds and :data:`N_BOOT` resamples):

- copied fraction: the number D of distinct images an evaluation's n samples copy estimates E[D], the expected
  number for n samples of that model (the estimand; the fraction is D / N). The indicators "image i copied at least
  once" are functions of multinomial counts, which are negatively associated, so Var D <= sum_i q_i (1 - q_i) <=
  E[D]: D is at most as dispersed as a Poisson count of the same mean. The interval is Garwood's exact Poisson
  interval for the mean of D (:func:`distinct_interval`, chi-square quantiles from scipy), capped at N, divided by N:
  conservative where D is under-dispersed, exact in the Poisson limit (many images, each rarely copied); its
  coverage on planted multinomial draws is checked in the tests. A cell's curve is the mean over its seeds (the same
  base step in each); the seeds' counts are independent, so their sum is again at most Poisson-dispersed and the
  cell's interval is the Garwood interval of the summed count divided by (seeds x N). A percentile bootstrap over
  the samples is not used: a resample misses an image copied by one sample with probability (1 - 1/n)^n ~ 0.37, so
  its interval sits under the point value where most copied images have one copy;
- rank correlations: Spearman's rho (ties averaged) between first_copy_step and each descriptor, the interval over
  resamples of the images (:func:`spearman_interval`); pooled over a cell's seeds as one rho over every (image,
  seed), with a cluster bootstrap (images resampled, each with all of its seeds);
- seed stability: the mean over seed pairs of Spearman's rho between their first-copy steps (images resampled);
- N stability: per cell each image's mean over seeds of its within-seed rank of first_copy_step, and Spearman's rho
  of that score between two cells of one width over the training images they share (nested train sets: the same
  source indices), images resampled.

Resamples whose rho is undefined (a constant resampled column) are left out of the percentiles; an interval with
none left is empty.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from scipy import stats
from scipy.stats import rankdata, spearmanr

from diffmem.analysis.markdown import correlation_text
from diffmem.analysis.runfiles import RunRecord, write_csv
from diffmem.config import RunConfig
from diffmem.rundir import RunDir, read_images_file

if TYPE_CHECKING:
    import torch

    from diffmem.data import Splits

# The train set is rebuilt (diffmem.data, torch) inside the functions that need it, not imported here: `diffmem
# analyze` imports this module for every experiment, and most have no copies.jsonl (no train set to rebuild).

DENSITY_K = 5
"""Images in the density score: ``knn_distance`` is the mean distance to the k = 5 nearest other training images."""
N_BOOT = 1000
"""Bootstrap resamples of every interval of this module."""
BOOT_SEED = 0
"""Seed of the bootstrap's numpy generators (the copied fraction's generator of step s is seeded [BOOT_SEED, s])."""
LEVEL = 0.95
IMAGES_DIR = "images"
"""The folder of the analysis that holds ``<run>.csv`` and :data:`FRACTION_FILE`."""
FRACTION_FILE = "copied_fraction.csv"
DESCRIPTORS = ("nn_train_distance", "nn_heldout_distance", "knn_distance")
"""The descriptors of a training image: distance to its nearest other training image, to its nearest held-out
image (the first eval.loss_n_test of the held-out pool, the test loss's images), and the mean distance to its
:data:`DENSITY_K` nearest other training images (small: a dense region of the data)."""
IMAGE_COLUMNS = ("index", "source_index", "first_copy_step", "first_copy_bracket_lo", "first_copy_n_samples",
                 "copies_last", "copies_total", "evals_copied") + DESCRIPTORS
"""Columns of ``images/<run>.csv`` (docs/analysis.md)."""
FRACTION_COLUMNS = ("run", "n", "width", "seed", "step", "n_samples", "images_copied", "copied_fraction",
                    "copied_fraction_lo", "copied_fraction_hi")
"""Columns of ``images/copied_fraction.csv``: one row per run and base evaluation."""
SUMMARY_IMAGE_COLUMNS = ("images_copied", "copied_fraction_final", "copied_fraction_final_lo",
                         "copied_fraction_final_hi", "rho_first_copy_nn_train", "rho_first_copy_nn_train_lo",
                         "rho_first_copy_nn_train_hi")
"""summary.csv's columns of this module, per run (empty for a run without copies.jsonl)."""
_BLOCK = 1 << 22  # elements of one block of distances or of bootstrap draws


# --- descriptors ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainImages:
    """A run's train set as the evaluation sees it: ``pixels`` uint8 (N, C, S, S), ``descriptors`` per
    :data:`DESCRIPTORS` ((N,) float64 arrays, distances in the centered model space)."""

    pixels: torch.Tensor
    descriptors: dict[str, np.ndarray]


def run_splits(cfg: RunConfig, dataset_sha256: str | None = None) -> Splits:
    """The splits of a run rebuilt from its config as the evaluation built them. DataError when the data cannot be
    loaded or are not those the run trained on (``dataset_sha256``, config.json's record, differs from theirs): a
    table or a gallery of other images would be silently wrong."""
    from diffmem.data import load_images, make_splits

    images = load_images(cfg.data)
    images.check_recorded(dataset_sha256, cfg.data.source)
    return make_splits(images, cfg.data)


def train_pixels(cfg: RunConfig, dataset_sha256: str | None = None) -> torch.Tensor:
    """The train set of a run with config ``cfg``, uint8 (N, C, S, S) (what the gallery of copied images shows);
    DataError as :func:`run_splits`."""
    return run_splits(cfg, dataset_sha256).train


def train_images(cfg: RunConfig, dataset_sha256: str | None = None) -> TrainImages:
    """Rebuild the train set and the held-out images of the test loss of a run from its config and compute the
    descriptors. DataError as :func:`run_splits`."""
    from diffmem.data import to_model
    from diffmem.metrics.memorization import nearest_k

    splits = run_splits(cfg, dataset_sha256)
    train = to_model(splits.train, splits.mean)
    heldout = to_model(splits.heldout[:cfg.eval.loss_n_test], splits.mean)
    n = len(train)
    nan = np.full(n, math.nan)
    if n >= 2:
        near = nearest_k(train, train, min(DENSITY_K, n - 1), exclude_self=True)[0].numpy()
        nn_train, knn = near[:, 0], near.mean(1)
    else:
        nn_train, knn = nan, nan
    nn_heldout = nearest_k(train, heldout, 1)[0][:, 0].numpy() if len(heldout) else nan
    return TrainImages(splits.train, {"nn_train_distance": nn_train, "nn_heldout_distance": nn_heldout,
                                      "knn_distance": knn})


# --- one run's timeline ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timeline:
    """One run's copies per training image, from its copies.jsonl lines (:func:`timeline`).

    steps, n_samples: (E,) the base evaluations (eval.n_samples samples), increasing steps.
    copied: (E, N) int64, samples of each base evaluation that copy each image.
    first_copy_step: (N,) float, the first step at which any line copies the image (inf: never).
    first_copy_bracket_lo: (N,) float, the evaluated step before it (NaN: copied at the first evaluation, or never).
    first_copy_n_samples: (N,) float, the samples of the line that first copied it (NaN: never).
    """

    steps: np.ndarray
    n_samples: np.ndarray
    copied: np.ndarray
    first_copy_step: np.ndarray
    first_copy_bracket_lo: np.ndarray
    first_copy_n_samples: np.ndarray

    @property
    def n_train(self) -> int:
        return self.copied.shape[1]


def _latest_per_step_and_count(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest line per (step, n_samples), sorted by step then sample count."""
    latest = {(r["step"], r["n_samples"]): r for r in lines}
    return [latest[key] for key in sorted(latest)]


def timeline(lines: Sequence[dict[str, Any]], n_train: int, base_n_samples: int) -> Timeline:
    """The :class:`Timeline` of validated copies.jsonl ``lines`` of a run with ``n_train`` images whose base
    evaluations draw ``base_n_samples`` samples (the rules of the module docstring)."""
    used = _latest_per_step_and_count(lines)
    first = np.full(n_train, math.inf)
    first_n = np.full(n_train, math.nan)
    for line in used:  # by step, then sample count: the first line that copies an image claims it
        idx = np.asarray(line["copied_idx"], dtype=np.int64)
        new = idx[np.isinf(first[idx])]
        first[new], first_n[new] = line["step"], line["n_samples"]
    all_steps = np.array(sorted({line["step"] for line in used}), dtype=float)
    bracket = np.full(n_train, math.nan)
    copied_ever = np.isfinite(first)
    position = np.searchsorted(all_steps, first[copied_ever])
    bracket[copied_ever] = np.where(position > 0, all_steps[np.maximum(position - 1, 0)], math.nan)
    base = [line for line in used if line["n_samples"] == base_n_samples]
    copied = np.zeros((len(base), n_train), dtype=np.int64)
    for e, line in enumerate(base):
        copied[e, line["copied_idx"]] = line["copied_n"]
    return Timeline(np.array([line["step"] for line in base], dtype=np.int64),
                    np.array([line["n_samples"] for line in base], dtype=np.int64), copied, first, bracket, first_n)


def distinct_interval(count: int, limit: int, level: float = LEVEL) -> tuple[float, float]:
    """Garwood's exact Poisson interval at ``level`` for the mean of a count ``count`` of distinct copied images,
    capped at ``limit`` (the images that could be copied): [chi2(a/2; 2k) / 2, chi2(1 - a/2; 2k + 2) / 2] with
    a = 1 - level, the lower end 0 for k = 0 (module docstring: why a Poisson interval is conservative here)."""
    tail = (1.0 - level) / 2.0
    lo = 0.0 if count == 0 else float(stats.chi2.ppf(tail, 2 * count)) / 2.0
    hi = float(stats.chi2.ppf(1.0 - tail, 2 * count + 2)) / 2.0
    return min(lo, float(limit)), min(hi, float(limit))


def _percentiles(values: np.ndarray) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if not len(values):
        return None, None
    tail = 100.0 * (1.0 - LEVEL) / 2.0
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return float(lo), float(hi)


# --- rank correlations ----------------------------------------------------------------------------------------------

def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row pair of ``a`` and ``b`` (shape (B, n)): the Pearson correlation of their ranks
    (ties averaged, +inf ranked last), as scipy.stats.spearmanr; NaN for a row with a constant column."""
    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    denominator = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (ra * rb).sum(1) / np.where(denominator > 0, denominator, 1.0), math.nan)


@dataclass(frozen=True)
class Correlation:
    """Spearman's rho with its 95 % percentile-bootstrap interval (None where undefined) over ``n_images``."""

    rho: float | None
    lo: float | None
    hi: float | None
    n_images: int

    def to_dict(self) -> dict[str, Any]:
        return {"rho": self.rho, "lo": self.lo, "hi": self.hi, "n_images": self.n_images}


def _rho(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    value = spearmanr(a, b).statistic
    return float(value) if np.isfinite(value) else None


def _image_picks(n: int, n_boot: int, per_image: int, seed: int):
    """Blocks of (count, n) image indices resampled with replacement (n_boot rows in all)."""
    rng = np.random.default_rng(seed)
    per_draw = max(1, _BLOCK // max(1, n * per_image))
    for start in range(0, n_boot, per_draw):
        yield rng.integers(0, n, size=(min(per_draw, n_boot - start), n))


def spearman_interval(x: np.ndarray, y: np.ndarray, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Correlation:
    """Spearman's rho between ``x`` and ``y`` of shape (S, n) (S seeds of the same n images; a (n,) array is one
    seed) over every (image, seed), with a percentile-bootstrap interval that resamples images and keeps all the
    seeds of each (a cluster bootstrap; S = 1: the plain bootstrap over images)."""
    x, y = np.atleast_2d(np.asarray(x, float)), np.atleast_2d(np.asarray(y, float))
    s, n = x.shape
    rho = _rho(x.ravel(), y.ravel())
    if rho is None:
        return Correlation(None, None, None, n)
    draws = []
    for picks in _image_picks(n, n_boot, s, seed):
        xs = x[:, picks].transpose(1, 0, 2).reshape(len(picks), -1)
        ys = y[:, picks].transpose(1, 0, 2).reshape(len(picks), -1)
        draws.append(spearman_rows(xs, ys))
    lo, hi = _percentiles(np.concatenate(draws))
    return Correlation(rho, lo, hi, n)


def seed_stability(first: np.ndarray, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Correlation | None:
    """The mean over seed pairs of Spearman's rho between the rows of ``first`` (S, n) (each seed's first-copy
    steps of the same images), with a percentile-bootstrap interval over images; None with fewer than 2 seeds."""
    s, n = first.shape
    if s < 2:
        return None
    pairs = list(itertools.combinations(range(s), 2))
    rhos = [_rho(first[a], first[b]) for a, b in pairs]
    if any(r is None for r in rhos):
        return Correlation(None, None, None, n)
    draws = []
    for picks in _image_picks(n, n_boot, s, seed):
        ranks = [first[k][picks] for k in range(s)]
        draws.append(np.mean([spearman_rows(ranks[a], ranks[b]) for a, b in pairs], axis=0))
    lo, hi = _percentiles(np.concatenate(draws))
    return Correlation(float(np.mean(rhos)), lo, hi, n)


def first_copy_score(first: np.ndarray) -> np.ndarray:
    """(n,) mean over seeds of each image's within-seed rank of its first-copy step (``first``: (S, n); ties
    averaged, never-copied ranked last)."""
    return rankdata(first, axis=1).mean(0)


# --- runs, cells, the experiment ------------------------------------------------------------------------------------

@dataclass
class RunImages:
    """One run's per-image results (:func:`run_images`)."""

    record: RunRecord
    timeline: Timeline
    source_indices: np.ndarray  # (N,) each training image's index in the source (images.json, or the ordered block)
    descriptors: dict[str, np.ndarray] | None
    descriptors_note: str | None
    correlations: dict[str, Correlation] = field(default_factory=dict)

    @property
    def images_copied(self) -> np.ndarray:
        """(E,) distinct images copied by each base evaluation."""
        return (self.timeline.copied > 0).sum(1)

    @property
    def fraction(self) -> np.ndarray:
        """(E,) distinct images copied by each base evaluation / N."""
        return self.images_copied / self.timeline.n_train

    def table(self) -> list[dict[str, Any]]:
        """The rows of ``images/<run>.csv``."""
        tl = self.timeline
        last = tl.copied[-1] if len(tl.steps) else np.zeros(tl.n_train, dtype=np.int64)
        cols = {"index": np.arange(tl.n_train), "source_index": self.source_indices,
                "first_copy_step": tl.first_copy_step, "first_copy_bracket_lo": tl.first_copy_bracket_lo,
                "first_copy_n_samples": tl.first_copy_n_samples, "copies_last": last,
                "copies_total": tl.copied.sum(0), "evals_copied": (tl.copied > 0).sum(0),
                **(self.descriptors or {})}
        return [{k: _cell(v[i]) for k, v in cols.items()} for i in range(tl.n_train)]

    def fraction_rows(self) -> list[dict[str, Any]]:
        r, tl = self.record, self.timeline
        rows = []
        for e, step in enumerate(tl.steps):
            lo, hi = distinct_interval(int(self.images_copied[e]), tl.n_train)
            rows.append({"run": r.name, "n": r.n, "width": r.width, "seed": r.seed, "step": int(step),
                         "n_samples": int(tl.n_samples[e]), "images_copied": int(self.images_copied[e]),
                         "copied_fraction": float(self.fraction[e]), "copied_fraction_lo": lo / tl.n_train,
                         "copied_fraction_hi": hi / tl.n_train})
        return rows

    def summary(self) -> dict[str, Any]:
        """This run's :data:`SUMMARY_IMAGE_COLUMNS`."""
        last = self.fraction_rows()[-1] if len(self.timeline.steps) else {}
        rho = self.correlations.get("nn_train_distance")
        return {"images_copied": int(np.isfinite(self.timeline.first_copy_step).sum()),
                "copied_fraction_final": last.get("copied_fraction"),
                "copied_fraction_final_lo": last.get("copied_fraction_lo"),
                "copied_fraction_final_hi": last.get("copied_fraction_hi"),
                "rho_first_copy_nn_train": rho.rho if rho else None,
                "rho_first_copy_nn_train_lo": rho.lo if rho else None,
                "rho_first_copy_nn_train_hi": rho.hi if rho else None}


def _cell(value: Any) -> Any:
    if isinstance(value, (np.floating, float)):
        return float(value) if np.isfinite(value) else None
    return int(value) if isinstance(value, (np.integer, int)) else value


def run_images(record: RunRecord, lines: Sequence[dict[str, Any]], base_n_samples: int,
               descriptors: dict[str, np.ndarray] | None, descriptors_note: str | None = None) -> RunImages:
    """The per-image results of one run from its validated copies.jsonl ``lines`` (see :func:`timeline`) and its
    train set's ``descriptors`` (None: not available, ``descriptors_note`` says why)."""
    tl = timeline(lines, record.n, base_n_samples)
    out = RunImages(record, tl, source_indices(record), descriptors, descriptors_note)
    if descriptors is not None:
        out.correlations = {d: spearman_interval(tl.first_copy_step, descriptors[d]) for d in DESCRIPTORS}
    return out


def source_indices(record: RunRecord) -> np.ndarray:
    """(N,) the source index of each training image of a run: images.json's ``train`` where the folder has one, else
    (a folder written before it, on the source's ordering) block ``data.subset_index`` of the ordering."""
    manifest = read_images_file(RunDir(record.path))
    if manifest is not None:
        return np.array(manifest.train, dtype=np.int64)
    return record.config.data.subset_index * record.n + np.arange(record.n)


def _descriptors_of(record: RunRecord, cache: dict[Any, Any]) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The descriptors of a run's train set, computed once per distinct train set (seeds share theirs)."""
    from diffmem.data import DataError

    cfg = record.config
    recorded = RunDir(record.path).recorded_dataset_sha256()
    key = (cfg.data, cfg.eval.loss_n_test, recorded)  # a run that trained on other data is checked on its own
    if key not in cache:
        try:
            cache[key] = (train_images(cfg, recorded).descriptors, None)
        except (DataError, OSError) as e:
            cache[key] = (None, f"descriptors not computed: {e}")
    return cache[key]


@dataclass(frozen=True)
class ImagesAnalysis:
    """What :func:`analyze_images` produced: per-run summary columns by run name, fits.json's ``images`` section
    (None: no run has copies.jsonl) and the files written."""

    summary: dict[str, dict[str, Any]]
    section: dict[str, Any] | None
    files: tuple[Path, ...] = ()


def seed_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The Student-t interval of the mean of per-seed fractions (k >= 2), ``mean +- t(level, k - 1) sd / sqrt k``
    (scipy.stats.t), clipped to [0, 1]: the interval over what varies between seeds (which images a seed copies, its
    training noise), not only over the sampling noise of one model."""
    x = np.asarray(values, dtype=float)
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return max(0.0, float(x.mean()) - half), min(1.0, float(x.mean()) + half)


def _cell_curve(runs: Sequence[RunImages]) -> dict[str, Any]:
    """A cell's copied fraction against the step: mean over seeds at the base steps all its seeds evaluated. With two
    seeds or more its interval (``lo``, ``hi``) is the Student-t interval over the seeds (:func:`seed_interval`),
    which holds the seed-to-seed spread; with one seed, the Garwood interval of its count. ``sampling_lo`` /
    ``sampling_hi``: the Garwood interval of the seeds' summed count over (seeds x N), the sampling noise alone
    (module docstring)."""
    shared = sorted(set.intersection(*(set(r.timeline.steps.tolist()) for r in runs)))
    rows: dict[str, Any] = {"step": [], "n_samples": [], "mean": [], "lo": [], "hi": [], "sampling_lo": [],
                            "sampling_hi": [],
                            "interval": ("Student t over the seeds' fractions" if len(runs) >= 2 else
                                         "Garwood (one seed: sampling noise only)")}
    for step in shared:
        at = [int(np.flatnonzero(r.timeline.steps == step)[0]) for r in runs]
        limit = sum(r.timeline.n_train for r in runs)
        lo, hi = (v / limit for v in distinct_interval(sum(int(r.images_copied[e]) for r, e in zip(runs, at)), limit))
        fractions = [float(r.fraction[e]) for r, e in zip(runs, at)]
        rows["step"].append(step)
        rows["n_samples"].append(int(runs[0].timeline.n_samples[at[0]]))
        rows["mean"].append(float(np.mean(fractions)))
        rows["sampling_lo"].append(lo)
        rows["sampling_hi"].append(hi)
        seed_lo, seed_hi = seed_interval(fractions) if len(runs) >= 2 else (lo, hi)
        rows["lo"].append(seed_lo)
        rows["hi"].append(seed_hi)
    return rows


def _cell_section(runs: Sequence[RunImages]) -> dict[str, Any]:
    first = np.stack([r.timeline.first_copy_step for r in runs])
    with_descriptors = [r for r in runs if r.descriptors is not None]
    correlations = {}
    if len(with_descriptors) == len(runs):
        correlations = {d: spearman_interval(first, np.broadcast_to(runs[0].descriptors[d], first.shape)).to_dict()
                        for d in DESCRIPTORS}
    stability = seed_stability(first)
    r0 = runs[0].record
    return {"n": r0.n, "width": r0.width, "runs": [r.record.name for r in runs], "seeds": [r.record.seed for r in runs],
            "images_copied_mean": float(np.mean([np.isfinite(r.timeline.first_copy_step).sum() for r in runs])),
            "copied_fraction": _cell_curve(runs), "correlations": correlations,
            "descriptors_note": next((r.descriptors_note for r in runs if r.descriptors_note), None),
            "seed_stability": stability.to_dict() if stability else None}


def _n_stability(cells: dict[tuple[int, int], list[RunImages]]) -> list[dict[str, Any]]:
    """Spearman's rho of the first-copy score (:func:`first_copy_score`) between the cells of one width over the
    training images they share (the same source indices)."""
    out = []
    for (n_a, w_a), (n_b, w_b) in itertools.combinations(sorted(cells, key=lambda c: (c[1], c[0])), 2):
        if w_a != w_b:
            continue
        a, b = cells[(n_a, w_a)], cells[(n_b, w_b)]
        src_a, src_b = a[0].source_indices, b[0].source_indices
        shared, ia, ib = np.intersect1d(src_a, src_b, return_indices=True)
        score_a = first_copy_score(np.stack([r.timeline.first_copy_step for r in a]))
        score_b = first_copy_score(np.stack([r.timeline.first_copy_step for r in b]))
        corr = spearman_interval(score_a[ia], score_b[ib]) if len(shared) >= 2 else Correlation(None, None, None,
                                                                                               len(shared))
        out.append({"width": w_a, "n_a": n_a, "n_b": n_b, "shared_images": int(len(shared)), **corr.to_dict()})
    return out


def analyze_images(records: Sequence[RunRecord], target: str | Path,
                   n_samples: int | None = None) -> ImagesAnalysis:
    """Write ``images/<run>.csv`` and ``images/copied_fraction.csv`` into ``target`` for the runs of ``records``
    that have a copies.jsonl with lines, and return their summary columns and fits.json's ``images`` section.
    ``n_samples``: the base sample count of the curves (default: each run's eval.n_samples). Runs without
    copies.jsonl are left out (no file, empty columns); with none, nothing is written. A bad line is the one-line
    RecordError of :meth:`diffmem.rundir.RunDir.copies`."""
    target = Path(target) / IMAGES_DIR
    cache: dict[Any, Any] = {}
    done: list[RunImages] = []
    for record in records:
        lines = RunDir(record.path).copies()
        if not lines:
            continue
        descriptors, note = _descriptors_of(record, cache)
        done.append(run_images(record, lines, n_samples or record.config.eval.n_samples, descriptors, note))
    if not done:
        return ImagesAnalysis({}, None)
    files = [write_csv(target / f"{r.record.name}.csv", IMAGE_COLUMNS, r.table()) for r in done]
    files.append(write_csv(target / FRACTION_FILE, FRACTION_COLUMNS, (row for r in done for row in r.fraction_rows())))
    cells: dict[tuple[int, int], list[RunImages]] = {}
    for r in done:
        cells.setdefault((r.record.n, r.record.width), []).append(r)
    section = {
        "ci": LEVEL, "n_boot": N_BOOT, "density_k": DENSITY_K, "descriptors": list(DESCRIPTORS),
        "folder": IMAGES_DIR,
        "runs": {r.record.name: {"n": r.record.n, "width": r.record.width, "seed": r.record.seed,
                                 "descriptors_note": r.descriptors_note, **r.summary(),
                                 "correlations": {d: c.to_dict() for d, c in r.correlations.items()}}
                 for r in done},
        "cells": [_cell_section(cells[c]) for c in sorted(cells, key=lambda c: (c[1], c[0]))],
        "n_stability": _n_stability(cells),
    }
    return ImagesAnalysis({r.record.name: r.summary() for r in done}, section, tuple(files))



# --- report.md ------------------------------------------------------------------------------------------------------

DESCRIPTOR_WORDS = {
    "nn_train_distance": ("isolated images (far from their nearest other training image)",
                          "images with a near-duplicate (close to another training image)",
                          "the distance to the nearest other training image"),
    "nn_heldout_distance": ("images far from every held-out image (atypical)",
                            "images close to a held-out image (typical)",
                            "the distance to the nearest held-out image"),
    "knn_distance": ("images in sparse regions (outliers)", "images in dense regions (prototypical)",
                     f"the mean distance to the {DENSITY_K} nearest other training images"),
}
"""Per descriptor: what is copied first when rho(first-copy step, descriptor) < 0, when > 0, and its name."""


def _rho_text(c: dict[str, Any] | None) -> str:
    text = correlation_text(c, "")
    return f"rho = {text}" if text else "rho undefined (no image copied, or every image at one step)"


def _excludes_zero(c: dict[str, Any] | None) -> int:
    """+1 / -1 when the interval of ``c`` lies above / below 0, else 0."""
    if not c or c.get("lo") is None or c.get("hi") is None:
        return 0
    return 1 if c["lo"] > 0 else -1 if c["hi"] < 0 else 0


def descriptor_sentence(name: str, c: dict[str, Any] | None) -> str:
    """One sentence on a (pooled) correlation between the first-copy step and descriptor ``name``."""
    negative, positive, label = DESCRIPTOR_WORDS[name]
    sign = _excludes_zero(c)
    if sign < 0:
        return f"{negative} are copied first: {_rho_text(c)}"
    if sign > 0:
        return f"{positive} are copied first: {_rho_text(c)}"
    return f"no detectable relation with {label}: {_rho_text(c)}"


def images_section(section: dict[str, Any] | None) -> list[str]:
    """report.md's section "Which images are copied" from fits.json's ``images`` section: per cell a plain
    sentence on the copied fraction, the order of first copies against each descriptor and across seeds; then the
    agreement across N. [] without copies."""
    if not section:
        return []
    lines = ["## Which images are copied", "",
             f"From `{section.get('folder', IMAGES_DIR)}/` and the `images` section of `fits.json` (each run's "
             "`copies.jsonl`). A training image is copied by an evaluation when one of its samples copies it; its "
             "first-copy step is the first evaluation that does (refinement evaluations included). rho: Spearman's "
             "rank correlation between the first-copy step (never-copied images last) and a descriptor, pooled over "
             "a cell's seeds, with its 95 % bootstrap interval over images. The rules are in diffmem's "
             "docs/analysis.md, section Which images are copied.", ""]
    for cell in section.get("cells", []):
        curve = cell.get("copied_fraction") or {}
        head = f"- N = {cell['n']}, W = {cell['width']} ({len(cell['runs'])} seed(s)): "
        if curve.get("step"):
            lo, hi = curve["lo"][-1], curve["hi"][-1]
            interval = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
            head += (f"the last evaluation shared by the seeds (step {curve['step'][-1]}) copies "
                     f"{curve['mean'][-1]:.3g}{interval} of the training set (mean over seeds); ")
        head += f"{cell['images_copied_mean']:.3g} of {cell['n']} images are copied at least once (mean over seeds)."
        parts = [head]
        defined = [c for c in (cell.get("correlations") or {}).values() if c.get("rho") is not None]
        if cell.get("correlations") and not defined:
            parts.append("No order of first copies to relate to the descriptors yet (no image copied, or every "
                         "copied image first copied at one step).")
        elif cell.get("correlations"):
            text = "; ".join(descriptor_sentence(d, cell["correlations"].get(d))
                             for d in section.get("descriptors", DESCRIPTORS))
            parts.append(text[:1].upper() + text[1:] + ".")
        elif cell.get("descriptors_note"):
            parts.append(f"No descriptors: {cell['descriptors_note']}.")
        stability = cell.get("seed_stability")
        if stability and stability.get("rho") is not None:
            sign = _excludes_zero(stability)
            verdict = ("the seeds copy the same images first" if sign > 0 else
                       "the seeds copy different images first" if sign < 0 else
                       "the seeds' orders agree no more than chance detects")
            parts.append(f"Across seeds, {verdict}: mean pairwise {_rho_text(stability)}.")
        lines.append(" ".join(parts))
    across = section.get("n_stability", [])
    if across:
        lines += ["", "Across N (the images that nested train sets share; each image's mean rank over the seeds):",
                  ""]
        for pair in across:
            sign = _excludes_zero(pair)
            verdict = ("agree" if sign > 0 else "disagree" if sign < 0 else "show no detectable agreement")
            lines.append(f"- W = {pair['width']}: N = {pair['n_a']} and N = {pair['n_b']} share "
                         f"{pair['shared_images']} images; their first-copy orders {verdict}: {_rho_text(pair)}.")
    return lines + [""]
