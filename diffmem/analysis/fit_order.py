"""Which training images the model fits first, without a copy rule (issue 60): each training image's own denoising
loss against the control block's at every evaluation (``<run>/image_losses.jsonl``), and the order in which the
images leave the control's range.

Per run and evaluation, every image gets one score per noise level, its loss divided by the control images' mean
loss at that level, averaged over the levels (the membership AUC's combined score, with the control block, images
never trained on but drawn as the train set, as the reference). Then:

- an image's **z-score** is its score minus the control images' mean score, over their standard deviation (ddof 1);
- an image is **fitted** at an evaluation when its z-score is at most -:data:`FIT_Z` (its loss below what nearly
  every image the model never saw gets);
- its **fit step** is the first evaluation from which it is fitted at every later one (the rule of tau_auc: a
  single chance excursion does not count), bracketed by the evaluation before it; never: censored at the last step
  (+inf in the correlations, tied last). A chance z <= -2 at the evaluation just before the true one (about 2.3 % per
  image for normal scores) moves it one evaluation earlier;
- **the control's false rate**: the same rule applied to each control image against the other control images
  (leave-one-out mean and deviation): the share of never-trained images the rule calls fitted by the last
  evaluation. It is the rule's own false-positive rate on this run's data; the fitted share of the train set means
  something only well above it.

Across the runs that share one train set (the seeds of a cell: images.json ``train`` equal), the **seed agreement**
is the mean over seed pairs of Spearman's rho between their fit steps, with a percentile-bootstrap interval over
images (:func:`diffmem.analysis.images.seed_stability`); per run, the rank correlation of the fit step with each
descriptor of the copy analysis (distance to the nearest other training image, to the nearest held-out image, the
k-NN distance; :func:`diffmem.analysis.images.spearman_interval`). Each interval is a 95 % *per-interval* interval;
the report says how many there are, so a reader can hold them to a family-wise level (Bonferroni: 95 % / count).

Runs without image_losses.jsonl or without a control block (folders written before them) get none of this.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from diffmem.analysis.images import Correlation, seed_stability, spearman_interval

FIT_Z = 2.0
"""An image is fitted when its score is this many control standard deviations below the control's mean."""


@dataclass(frozen=True)
class FitOrder:
    """One run's fit steps (optimizer steps): ``step`` (N,) (+inf: never fitted), ``bracket_lo`` (N,) (the
    evaluation before; nan when fitted from the first or never), the ``steps`` evaluated, the fitted share of the
    train set at each of them (``fitted_share``, (E,)) and the control's false rate at each (``control_rate``,
    (E,))."""

    step: np.ndarray
    bracket_lo: np.ndarray
    steps: np.ndarray
    fitted_share: np.ndarray
    control_rate: np.ndarray
    correlations: dict[str, Correlation] = field(default_factory=dict)

    @property
    def fitted(self) -> int:
        return int(np.isfinite(self.step).sum())

    def summary(self) -> dict[str, Any]:
        return {"images_fitted": self.fitted, "fitted_share_final": float(self.fitted_share[-1]),
                "control_rate_final": float(self.control_rate[-1]),
                "correlations": {k: c.to_dict() for k, c in self.correlations.items()}}


def scores(train: np.ndarray, control: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image the level-averaged loss over the control's level mean: train (L, N) and control (L, Nc) losses of
    one evaluation -> ((N,), (Nc,))."""
    scale = control.mean(axis=1, keepdims=True)
    scale = np.where(scale > 0, scale, 1.0)
    return (train / scale).mean(axis=0), (control / scale).mean(axis=0)


def z_scores(train: np.ndarray, control: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train z (N,), control leave-one-out z (Nc,)) of one evaluation's losses (module docstring); the control needs
    at least 3 images (2 left when one is left out)."""
    s_train, s_control = scores(train, control)
    sd = s_control.std(ddof=1)
    z_train = (s_train - s_control.mean()) / (sd if sd > 0 else math.inf)
    n = len(s_control)
    total, total_sq = s_control.sum(), (s_control ** 2).sum()
    others_mean = (total - s_control) / (n - 1)
    others_var = (total_sq - s_control ** 2 - (n - 1) * others_mean ** 2) / (n - 2)
    others_sd = np.sqrt(np.maximum(others_var, 0.0))
    z_control = (s_control - others_mean) / np.where(others_sd > 0, others_sd, math.inf)
    return z_train, z_control


def stays_fitted(steps: np.ndarray, fitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fit step, bracket lo) per image from ``fitted`` (E, N) booleans: the first evaluation from which the image
    is fitted at every later one (module docstring)."""
    e, n = fitted.shape
    # from the end: fitted at k and at every later evaluation
    tail = np.flip(np.cumprod(np.flip(fitted, axis=0), axis=0), axis=0).astype(bool)
    step = np.full(n, math.inf)
    lo = np.full(n, math.nan)
    for i in range(n):
        where = np.flatnonzero(tail[:, i])
        if where.size:
            k = int(where[0])
            step[i] = steps[k]
            lo[i] = steps[k - 1] if k > 0 else math.nan
    return step, lo


def fit_order(lines: Sequence[dict[str, Any]], z: float = FIT_Z) -> FitOrder | None:
    """The fit steps of one run from its image_losses.jsonl lines (validated, decoded: ``train`` (L, N), ``control``
    (L, Nc)); the latest line per step is used. None without lines or with fewer than 3 control images."""
    by_step = {int(line["step"]): line for line in lines}
    if not by_step:
        return None
    steps = np.array(sorted(by_step), dtype=float)
    ordered = [by_step[int(s)] for s in steps]
    if any(line["control"].shape[1] < 3 for line in ordered):
        return None
    zs = [z_scores(line["train"], line["control"]) for line in ordered]
    fitted_train = np.stack([zt <= -z for zt, _ in zs])
    fitted_control = np.stack([zc <= -z for _, zc in zs])
    step, lo = stays_fitted(steps, fitted_train)
    control_step, _ = stays_fitted(steps, fitted_control)
    share = np.array([(step <= s).mean() for s in steps])
    rate = np.array([(control_step <= s).mean() for s in steps])
    return FitOrder(step, lo, steps, share, rate)


def with_correlations(order: FitOrder, descriptors: dict[str, np.ndarray] | None) -> FitOrder:
    """``order`` with the rank correlation of its fit steps with each descriptor (none without descriptors)."""
    if descriptors is None:
        return order
    return FitOrder(order.step, order.bracket_lo, order.steps, order.fitted_share, order.control_rate,
                    {name: spearman_interval(order.step, values) for name, values in descriptors.items()})


def seed_agreement(orders: Sequence[FitOrder]) -> Correlation | None:
    """The mean over seed pairs of Spearman's rho between the fit steps of runs that share their train set; None
    with fewer than 2 such runs."""
    if len(orders) < 2:
        return None
    return seed_stability(np.stack([o.step for o in orders]))


FIT_COLUMNS = ("index", "source_index", "fit_step", "fit_bracket_lo")
"""Columns of ``images/<run>_fit.csv``: per training image, its fit step and the evaluation before it."""

SUMMARY_FIT_COLUMNS = ("images_fitted", "fitted_share_final", "fit_control_rate_final", "rho_fit_nn_train",
                       "rho_fit_nn_train_lo", "rho_fit_nn_train_hi")
"""summary.csv's columns of the fit order (runs with image_losses.jsonl and a control block)."""


@dataclass(frozen=True)
class FitOrderAnalysis:
    """The experiment's fit orders: per run its :class:`FitOrder`, fits.json's ``fit_order`` section, and the
    summary.csv cells by run."""

    runs: dict[str, FitOrder]
    section: dict[str, Any] | None
    summary: dict[str, dict[str, Any]]


def analyze_fit_order(records: Sequence[Any], target: Any) -> FitOrderAnalysis:
    """Write ``images/<run>_fit.csv`` for every run of ``records`` (RunRecord) that recorded image_losses.jsonl with a
    control block, and return the analysis (module docstring). Descriptors come from the copy analysis's
    :func:`diffmem.analysis.images.train_images` (once per train set), seed agreement per cell from the runs that
    share one train set."""
    from pathlib import Path

    from diffmem.analysis.images import IMAGES_DIR, source_indices, train_images
    from diffmem.analysis.runfiles import write_csv
    from diffmem.rundir import RunDir, image_losses_lines, read_images_file

    orders: dict[str, FitOrder] = {}
    cache: dict[Any, Any] = {}
    by_record = {}
    trained_on: dict[str, Any] = {}  # images.json's train indices (older folders: the subset index), read once
    for r in records:
        lines = [line for _, line in image_losses_lines(RunDir(r.path).image_losses_path, r.config.train.steps,
                                                        r.n)]
        order = fit_order(lines)
        if order is None:
            continue
        manifest = read_images_file(RunDir(r.path))
        trained_on[r.name] = manifest.train if manifest else r.config.data.subset_index  # the run's train set
        key = (r.config.data, r.config.eval.loss_n_test, trained_on[r.name])
        if key not in cache:
            try:
                cache[key] = train_images(r.config, RunDir(r.path).recorded_dataset_sha256()).descriptors
            except (ValueError, OSError):
                cache[key] = None
        orders[r.name] = with_correlations(order, cache[key])
        by_record[r.name] = r
    if not orders:
        return FitOrderAnalysis({}, None, {})
    folder = Path(target) / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, order in orders.items():
        src = source_indices(by_record[name])
        write_csv(folder / f"{name}_fit.csv", FIT_COLUMNS,
                  ({"index": i, "source_index": int(src[i]),
                    "fit_step": float(order.step[i]) if math.isfinite(order.step[i]) else None,
                    "fit_bracket_lo": float(order.bracket_lo[i]) if math.isfinite(order.bracket_lo[i]) else None}
                   for i in range(len(order.step))))
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in orders:
        r = by_record[name]
        groups.setdefault((r.n, r.width, trained_on[name]), []).append(name)
    cells = []
    for (n, width, _), names in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        agreement = seed_agreement([orders[k] for k in names])
        cells.append({"n": n, "width": width, "runs": names,
                      "seed_agreement": agreement.to_dict() if agreement else None})
    intervals = sum(len(o.correlations) for o in orders.values()) + sum(1 for c in cells if c["seed_agreement"])
    section = {"z": FIT_Z, "runs": {k: o.summary() for k, o in orders.items()}, "cells": cells,
               "intervals": intervals, "interval_note": "95 % per interval (percentile bootstrap over images); for "
               f"a family-wise 95 % over the {intervals} intervals hold each to {100 - 5 / max(intervals, 1):.3g} %"}
    summary = {}
    for name, o in orders.items():
        rho = o.correlations.get("nn_train_distance")
        summary[name] = {"images_fitted": o.fitted, "fitted_share_final": float(o.fitted_share[-1]),
                         "fit_control_rate_final": float(o.control_rate[-1]),
                         "rho_fit_nn_train": rho.rho if rho else None, "rho_fit_nn_train_lo": rho.lo if rho else None,
                         "rho_fit_nn_train_hi": rho.hi if rho else None}
    return FitOrderAnalysis(orders, section, summary)


def fit_order_section(section: dict[str, Any] | None) -> list[str]:
    """report.md's section "Which images are fitted first" from fits.json's ``fit_order``; [] without it."""
    if not section:
        return []
    from diffmem.analysis.markdown import correlation_text as rho, table

    run_rows = [[name, s["images_fitted"], f"{s['fitted_share_final']:.2f}", f"{s['control_rate_final']:.2f}",
                 rho(s["correlations"].get("nn_train_distance")), rho(s["correlations"].get("nn_heldout_distance"))]
                for name, s in section["runs"].items()]
    cell_rows = [[c["n"], c["width"], len(c["runs"]), rho(c["seed_agreement"])] for c in section["cells"]]
    return ["## Which images are fitted first", "",
            f"Without a copy rule, from each training image's own loss (image_losses.jsonl): an image is fitted from "
            f"the evaluation on which its level-averaged loss stays at least {section['z']:g} standard deviations "
            "below the control block's (images never trained on, drawn as the train set); the control's false rate "
            "is the same rule applied to each control image against the others. Rank correlations of the fit step "
            "(never fitted: last) with the distance to the nearest other training image and to the nearest "
            f"held-out image. {section['interval_note']}.", ""] + \
        table(["run", "images fitted", "share fitted (last)", "control false rate (last)", "rho with nn train",
               "rho with nn held-out"], run_rows) + ["", "Agreement of the fit order across the seeds of a cell "
                                                     "(mean Spearman rho over seed pairs):", ""] + \
        table(["N", "W", "seeds", "seed agreement"], cell_rows) + [""]
