"""The blind baseline: how well a run's train set can be told from its non-members by the images alone, without the
model. A reader sees what the data alone give before reading any signal of the model (issue 59).

Two model-free measures of one run's image sets, as images.json names them (``diffmem.rundir.images_file``):

* **a kernel two-sample test** between the train set (m images) and the scored non-members (n): the squared maximum
  mean discrepancy MMD^2 (Gretton et al., JMLR 2012; the biased V-statistic) with a Gaussian kernel on the pixels
  (x / 255, flattened) whose bandwidth is the median pairwise distance of the pooled images, and its p-value by
  :func:`scipy.stats.permutation_test` (permutations of the group labels, one-sided: a larger MMD than chance).
  Exchangeable sets give a uniform p-value;
* **a distance-only membership score**: each image's distance to its nearest *reference* image, the images of the
  source's training part that the run does not train on (its control block and the other blocks), scored as
  membership inference scores a loss (nearer, likelier a member). Its AUC of members against non-members, with
  DeLong's 95 % interval (:func:`diffmem.metrics.membership.delong_auc`), is 0.5 for exchangeable sets; above 0.5 the
  train set sits nearer the rest of the training part than the non-members do, as blocks of a clustered ordering do.

Runs that share their image sets (the seeds of a cell) get one baseline. Folders without images.json (written before
it) get none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from diffmem.metrics.membership import delong_auc

BLIND_METHOD = ("MMD^2 (Gaussian kernel on pixels x / 255, bandwidth = median pooled distance) of train set against "
                "scored non-members, one-sided p by scipy.stats.permutation_test over group labels; distance-only "
                "membership AUC (score = minus the distance to the nearest training-part image the run does not "
                "train on) with DeLong's 95 % interval")
"""The baseline's method in one line (fits.json ``blind_baseline.method``)."""

BLIND_COLUMNS = ("blind_mmd_p", "blind_auc", "blind_auc_lo", "blind_auc_hi")
"""summary.csv's columns of the blind baseline (empty for runs without images.json)."""


@dataclass(frozen=True)
class BlindBaseline:
    """The blind baseline of one set of images: ``mmd2`` (squared MMD, kernel units) and its permutation ``mmd_p``
    over ``permutations`` label permutations; ``auc`` of the distance-only score with DeLong's 95 % interval
    (``auc_lo``, ``auc_hi``); the group sizes ``m`` (members), ``n`` (non-members), ``reference`` (images the
    distances are taken to)."""

    mmd2: float
    mmd_p: float
    permutations: int
    auc: float
    auc_lo: float
    auc_hi: float
    m: int
    n: int
    reference: int

    def row(self) -> dict[str, Any]:
        return {"blind_mmd_p": self.mmd_p, "blind_auc": self.auc, "blind_auc_lo": self.auc_lo,
                "blind_auc_hi": self.auc_hi}

    def to_dict(self) -> dict[str, Any]:
        return {"mmd2": self.mmd2, "mmd_p": self.mmd_p, "permutations": self.permutations, "auc": self.auc,
                "auc_lo": self.auc_lo, "auc_hi": self.auc_hi, "m": self.m, "n": self.n, "reference": self.reference}


def _flat(images: np.ndarray) -> np.ndarray:
    x = np.asarray(images, dtype=np.float64)
    return x.reshape(len(x), -1)


def gaussian_kernel(x: np.ndarray) -> np.ndarray:
    """(k, k) Gaussian kernel matrix exp(-d^2 / (2 h^2)) of the rows of ``x`` (k, d), h^2 the median of the nonzero
    squared distances between distinct rows (the median heuristic)."""
    sq = np.einsum("ij,ij->i", x, x)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0)
    np.fill_diagonal(d2, 0.0)
    pairs = d2[np.triu_indices(len(x), 1)]
    positive = pairs[pairs > 0]
    h2 = float(np.median(positive)) if positive.size else 1.0
    return np.exp(-d2 / (2 * h2))


def mmd2_of_labels(kernel: np.ndarray, members: np.ndarray) -> np.ndarray:
    """The biased MMD^2 of the group ``members`` (bool, (..., k): True for the first group) against the rest, from
    the pooled ``kernel`` (k, k): mean K_xx + mean K_yy - 2 mean K_xy; one value per leading index."""
    z = members.astype(np.float64)
    w = 1.0 - z
    kz, kw = z @ kernel, w @ kernel
    m, n = z.sum(-1), w.sum(-1)
    return ((kz * z).sum(-1) / m ** 2 + (kw * w).sum(-1) / n ** 2 - 2 * (kz * w).sum(-1) / (m * n))


def nearest_distance(x: np.ndarray, reference: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """(len(x),) L2 distance from each row of ``x`` to its nearest row of ``reference``, in chunks of rows (an exact
    search; the sets here are small, a few thousand images)."""
    sq_ref = np.einsum("ij,ij->i", reference, reference)
    out = np.empty(len(x))
    for start in range(0, len(x), chunk):
        block = x[start:start + chunk]
        d2 = np.einsum("ij,ij->i", block, block)[:, None] + sq_ref[None, :] - 2 * block @ reference.T
        out[start:start + chunk] = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    return out


def blind_baseline(members: np.ndarray, nonmembers: np.ndarray, reference: np.ndarray, permutations: int = 1000,
                   seed: int = 0) -> BlindBaseline:
    """The blind baseline (module docstring) of ``members`` (m, ...), ``nonmembers`` (n, ...) and ``reference``
    (r, ...) images in one pixel space (e.g. x / 255); m, n >= 2, r >= 1."""
    x, y, ref = _flat(members), _flat(nonmembers), _flat(reference)
    if len(x) < 2 or len(y) < 2 or len(ref) < 1:
        raise ValueError(f"the blind baseline needs at least 2 members and 2 non-members and 1 reference image "
                         f"(got {len(x)}, {len(y)}, {len(ref)})")
    kernel = gaussian_kernel(np.concatenate([x, y]))
    m = len(x)

    def statistic(idx_x: np.ndarray, idx_y: np.ndarray, axis: int) -> np.ndarray:
        labels = np.zeros(idx_x.shape[:-1] + (len(kernel),), dtype=bool)
        np.put_along_axis(labels, idx_x.astype(np.int64), True, axis=-1)
        return mmd2_of_labels(kernel, labels)

    result = stats.permutation_test((np.arange(m), np.arange(m, len(kernel))), statistic, vectorized=True,
                                    n_resamples=permutations, alternative="greater", batch=50,
                                    permutation_type="independent", random_state=np.random.default_rng(seed))
    auc = delong_auc(-nearest_distance(x, ref), -nearest_distance(y, ref))
    return BlindBaseline(float(result.statistic), float(result.pvalue), permutations, auc.auc, auc.lo, auc.hi,
                         len(x), len(y), len(ref))


def experiment_baselines(records: Any) -> tuple[dict[str, BlindBaseline], list[dict[str, Any]]]:
    """The blind baseline of every run of ``records`` (:class:`diffmem.analysis.runfiles.RunRecord`) whose folder
    has an images.json: (by run name, fits.json's list of distinct image sets with their runs). Runs that share
    their images (the seeds of a cell) share one computation. The source's images are loaded once per data config
    (this imports torch, as the copies' analysis does); a damaged images.json is a one-line ImagesFileError, images
    that are not the recorded data a one-line DataError."""
    from diffmem.rundir import RunDir, read_images_file

    manifests = {r.name: m for r in records if (m := read_images_file(RunDir(r.path))) is not None}
    if not manifests:
        return {}, []
    from diffmem.data import load_images  # here: torch only for experiments that have images.json

    loaded: dict[tuple[Any, ...], np.ndarray] = {}
    by_set: dict[tuple[Any, ...], tuple[BlindBaseline, list[str]]] = {}
    for r in records:
        manifest = manifests.get(r.name)
        if manifest is None:
            continue
        data = r.config.data
        source_key = (data.source, data.path, data.image_size, data.cache_dir)
        if source_key not in loaded:
            images = load_images(data)
            images.check_recorded(manifest.dataset_sha256, data.source)
            loaded[source_key] = images.images.numpy().astype(np.float64) / 255.0
        pixels = loaded[source_key]
        if len(pixels) != manifest.source_count:
            raise ValueError(f"{r.path / 'images.json'} counts {manifest.source_count} source images, the data "
                             f"found hold {len(pixels)}; use the data the run trained on")
        key = (manifest.dataset_sha256, manifest.train, manifest.nonmembers)
        if key not in by_set:
            used = set(manifest.train) | set(manifest.heldout)
            reference = np.array([i for i in range(manifest.source_count) if i not in used], dtype=np.int64)
            baseline = blind_baseline(pixels[list(manifest.train)], pixels[list(manifest.nonmembers)],
                                      pixels[reference])
            by_set[key] = (baseline, [])
        by_set[key][1].append(r.name)
    per_run = {name: baseline for baseline, names in by_set.values() for name in names}
    sets = [{"runs": names, **baseline.to_dict()} for baseline, names in by_set.values()]
    return per_run, sets
