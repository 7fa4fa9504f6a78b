"""A metric against the training step for the seeds of one cell (same N and W: runs, or split pairs): one seed as
its curve with its 95 % band, several seeds each thin with their mean bold and the 95 % t interval of the mean over
seeds (:func:`draw_cell_curves`, :func:`mean_over_seeds`), and the legend entries that say which was drawn
(:func:`curve_legend_extras`). Used by the window, collapse and pairs figures."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from matplotlib.lines import Line2D
from scipy import stats

from diffmem.analysis.runfiles import PairRecord, RunRecord
from diffmem.figures.style import finite_points, mark_interval


def _quality_band(rec: RunRecord) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95 % band of the quality metric per evaluation, +-1.96 standard errors (``fid_boot_std``, else
    ``fid_std``); None when the run recorded neither."""
    fid = rec.series("fid")
    se = rec.series("fid_boot_std")
    se = np.where(np.isfinite(se), se, rec.series("fid_std"))
    if not np.isfinite(se).any():
        return None
    return fid - 1.96 * se, fid + 1.96 * se


@dataclass(frozen=True)
class SeedMean:
    """One metric averaged over the seeds of a cell (same N and W).

    ``steps`` (optimizer steps, shape (m,)): every evaluated step of the seeds inside the range that all of them
    cover; each seed's curve is interpolated there linearly in log step (exact at its own evaluations). ``mean``
    (shape (m,)): the arithmetic mean over the seeds; ``lo``/``hi``: its 95 % Student-t interval over the seeds,
    mean -+ t(0.975, k - 1) * sd / sqrt(k) (None with one seed); ``seeds``: k."""

    steps: np.ndarray
    mean: np.ndarray
    lo: np.ndarray | None
    hi: np.ndarray | None
    seeds: int


def mean_over_seeds(records: Sequence[RunRecord], key: str) -> SeedMean | None:
    """:class:`SeedMean` of the metric ``key`` (a metrics.jsonl column) over ``records``, the seeds of one cell; None
    when no seed has a value or the seeds' step ranges do not overlap."""
    curves = []
    for rec in records:
        steps, y = rec.steps, rec.series(key)
        ok = finite_points(steps, y)
        if ok.any():
            curves.append((steps[ok], y[ok]))
    if not curves:
        return None
    start, end = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
    grid = np.unique(np.concatenate([s[(s >= start) & (s <= end)] for s, _ in curves]))
    if not len(grid):
        return None
    values = np.array([np.interp(np.log(grid), np.log(s), y) for s, y in curves])  # (seeds, steps)
    mean = values.mean(axis=0)
    k = len(curves)
    if k < 2:
        return SeedMean(grid, mean, None, None, 1)
    half = stats.t.ppf(0.975, k - 1) * values.std(axis=0, ddof=1) / math.sqrt(k)
    return SeedMean(grid, mean, mean - half, mean + half, k)


SEED_STYLE = dict(lw=0.6, alpha=0.55)
"""Each seed's curve where a cell has several seeds (thin, faint)."""

CELL_MEAN_STYLE = dict(lw=2.0)
"""The cell's mean over seeds (bold)."""


def _run_band(rec: RunRecord | PairRecord, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95 % band of one run's (or split pair's) ``key`` per evaluation: the quality metric's
    :func:`_quality_band`, else the recorded ``{key}_lo`` / ``{key}_hi`` (f_mem's bootstrap interval, a pair's
    measures'); None when not recorded."""
    if key == "fid":
        return _quality_band(rec)
    lo, hi = rec.series(f"{key}_lo"), rec.series(f"{key}_hi")
    return (lo, hi) if (np.isfinite(lo) & np.isfinite(hi)).any() else None


def _clip_band(key: str, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fraction bands (f_mem, own_fraction) inside [0, 1]; quality bands (log axis) no lower than half the curve;
    others as they are."""
    if key in ("f_mem", "own_fraction"):
        return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    if key == "fid":
        return np.maximum(lo, y * 0.5), hi
    return lo, hi


MIN_SEEDS_FOR_MEAN_BAND = 3
"""Seeds a cell needs for the band of its mean: with 2 the 95 % t interval is 12.7 standard errors wide and says
only that two seeds cannot place the mean, so each seed keeps its own band instead."""


def _draw_own_band(ax, rec: RunRecord | PairRecord, key: str, color, per_x: float, alpha: float) -> bool:
    """One run's (or pair's) 95 % band of ``key`` (:func:`_run_band`) against step / ``per_x``; False when none."""
    x, y = rec.steps / per_x, rec.series(key)
    band = _run_band(rec, key)
    if band is None:
        return False
    keep = finite_points(x, y) & np.isfinite(band[0]) & np.isfinite(band[1])
    if not keep.any():
        return False
    lo, hi = _clip_band(key, y[keep], band[0][keep], band[1][keep])
    mark_interval(ax.fill_between(x[keep], lo, hi, color=color, alpha=alpha, lw=0))
    return True


def draw_cell_curves(ax, records: Sequence[RunRecord | PairRecord], key: str, color, *,
                     per_x: float = 1.0) -> tuple[set[str], bool]:
    """The metric ``key`` of one cell (the seeds of one N and W: runs, or split pairs) against step / ``per_x``.

    One seed: its curve with dots and its own 95 % band (:func:`_run_band`). Several seeds: each seed thin
    (:data:`SEED_STYLE`) and their mean bold (:data:`CELL_MEAN_STYLE`); the band is the 95 % t interval of the mean
    over seeds (:func:`mean_over_seeds`) from :data:`MIN_SEEDS_FOR_MEAN_BAND` seeds on, each seed's own band below.
    Returns the kinds of band drawn (a subset of {"run", "each seed", "mean"}) and whether the cell has several
    seeds."""
    drawn = [rec for rec in records if finite_points(rec.steps, rec.series(key)).any()]
    if len(drawn) == 1:
        rec = drawn[0]
        x, y = rec.steps / per_x, rec.series(key)
        ok = finite_points(x, y)
        ax.plot(x[ok], y[ok], color=color, marker=".", ms=2.5)
        return ({"run"} if _draw_own_band(ax, rec, key, color, per_x, 0.25) else set()), False
    for rec in drawn:
        x, y = rec.steps / per_x, rec.series(key)
        ok = finite_points(x, y)
        ax.plot(x[ok], y[ok], color=color, **SEED_STYLE)
    cell = mean_over_seeds(drawn, key)
    if cell is None:
        return set(), len(drawn) > 1
    ax.plot(cell.steps / per_x, cell.mean, color=color, **CELL_MEAN_STYLE)
    if cell.seeds < MIN_SEEDS_FOR_MEAN_BAND:
        own = [_draw_own_band(ax, rec, key, color, per_x, 0.15) for rec in drawn]
        return ({"each seed"} if any(own) else set()), True
    lo, hi = _clip_band(key, cell.mean, cell.lo, cell.hi)
    mark_interval(ax.fill_between(cell.steps / per_x, lo, hi, color=color, alpha=0.25, lw=0))
    return {"mean"}, True


def curve_legend_extras(bands: set[str], seeded: bool, band_label: str = "95 % interval") -> list[Line2D]:
    """Legend entries for what :func:`draw_cell_curves` drew: with seeds the thin and bold lines, then each kind of
    band in ``bands`` ("run": ``band_label``; "each seed"; "mean": of the mean over seeds)."""
    extra = []
    if seeded:
        extra += [Line2D([], [], color="0.3", **SEED_STYLE, label="each seed"),
                  Line2D([], [], color="0.3", **CELL_MEAN_STYLE, label="mean over seeds")]
    texts = {"run": band_label, "each seed": f"{band_label} of each seed (fewer than {MIN_SEEDS_FOR_MEAN_BAND} seeds)",
             "mean": "95 % interval of the mean (t, over seeds)"}
    extra += [Line2D([], [], color="0.5", lw=5, alpha=0.3, label=texts[k]) for k in ("run", "each seed", "mean")
              if k in bands]
    return extra
