"""Does the order of first copies belong to the images or to the copy rule (issue 60)? The copy-based order of
:mod:`diffmem.analysis.images` read again under every rule a run recorded, from one sample count.

The ratio rule (d1 / d2 < ``eval.mem_threshold``) is most lenient for an image far from the other training images:
an isolated image's d2 is large, so a sample far from it still counts as its copy. A fixed-distance rule (d1 < f x
D, D the train set's median nearest-neighbour distance; copies.jsonl ``copied_within``, ``eval.copy_distances``) does
not depend on the other images. If "isolated images are copied first" belongs to the images, it holds under both.

Per run and rule, from the base evaluations only (``eval.n_samples`` samples: refinement evaluations, which draw
more and so find copies earlier, are left out, so that one order is one estimator):

- each image's first copy step (+inf: never copied by the last base evaluation);
- how many images were copied, and how many distinct first-copy steps the order has (few steps: a coarse order);
- Spearman's rho between the first copy step and the distance to the nearest other training image, with a 95 %
  percentile-bootstrap interval over images (:func:`diffmem.analysis.images.spearman_interval`), per interval;
  fits.json gives their count for a family-wise reading (Bonferroni);
- the same rho over the images copied under the rule only (never-copied images left out), which separates "which of
  the copied images go first" from "copied at all against never copied".

Runs whose copies.jsonl lines carry no ``copied_within`` (written before it) get the ratio rule alone.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from diffmem.analysis.images import spearman_interval


def first_copy_steps(steps: Sequence[int], counts: np.ndarray) -> np.ndarray:
    """(N,) the first step at which an image's count is above 0 (+inf: never); ``counts`` (E, N) by evaluation in
    increasing ``steps``."""
    first = np.full(counts.shape[1], math.inf)
    for s, row in zip(steps, counts):
        new = (row > 0) & np.isinf(first)
        first[new] = s
    return first


def rule_counts(lines: Sequence[dict[str, Any]], n_train: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """(steps, counts by rule name): the base lines' (E, N) counts of copies under the ratio rule ("ratio 1/3") and
    each recorded fixed-distance rule ("d1 < 0.3 D"); a rule enters only when every line recorded it."""
    from diffmem.rundir.records import within_counts

    latest = {int(line["step"]): line for line in lines}
    steps = sorted(latest)
    ordered = [latest[s] for s in steps]
    out: dict[str, np.ndarray] = {}
    if not ordered:
        return steps, out
    ratio = np.zeros((len(ordered), n_train), dtype=np.int64)
    for e, line in enumerate(ordered):
        ratio[e, line["copied_idx"]] = line["copied_n"]
    out[f"ratio {ordered[0]['mem_threshold']:.3g}"] = ratio
    fractions = {tuple(line.get("copy_distances") or ()) for line in ordered}
    if len(fractions) == 1 and (recorded := next(iter(fractions))):
        per_line = [within_counts(line) for line in ordered]
        for k, f in enumerate(recorded):
            out[f"d1 < {f:g} D"] = np.stack([counts[k] for counts in per_line])
    return steps, out


def rule_sensitivity(lines: Sequence[dict[str, Any]], n_train: int, base_n_samples: int,
                     nn_train: np.ndarray | None) -> dict[str, Any]:
    """One run's table (module docstring): per rule, images copied, distinct first-copy steps, and the rank
    correlations with ``nn_train`` (None: not computed). ``lines``: validated copies.jsonl lines."""
    base = [line for line in lines if line["n_samples"] == base_n_samples]
    steps, counts = rule_counts(base, n_train)
    rules = {}
    for name, c in counts.items():
        first = first_copy_steps(steps, c)
        copied = np.isfinite(first)
        row: dict[str, Any] = {"images_copied": int(copied.sum()),
                               "distinct_first_steps": int(len(set(first[copied].tolist())))}
        if nn_train is not None:
            row["rho_nn_train"] = spearman_interval(first, nn_train).to_dict()
            row["rho_nn_train_copied_only"] = (spearman_interval(first[copied], nn_train[copied]).to_dict()
                                               if copied.sum() >= 3 else None)
        rules[name] = row
    return {"base_n_samples": base_n_samples, "base_evaluations": len(steps), "rules": rules}


def rules_section(section: dict[str, Any] | None) -> list[str]:
    """report.md's table of the copy-rule sensitivity from fits.json's ``images.copy_rules``; [] without it."""
    if not section:
        return []
    from diffmem.analysis.markdown import correlation_text, table

    rows = [[run, rule, r["images_copied"], r["distinct_first_steps"], correlation_text(r.get("rho_nn_train")),
             correlation_text(r.get("rho_nn_train_copied_only"))]
            for run, entry in section["runs"].items() for rule, r in entry["rules"].items()]
    return ["", "**The order of first copies under each copy rule** (base evaluations only, refinements left out): "
            "images copied, distinct first-copy steps, and Spearman's rho of the first copy step with the distance "
            "to the nearest other training image (never copied: last), then over the copied images only. "
            f"{section['interval_note']}.", ""] + \
        table(["run", "rule", "images copied", "distinct first steps", "rho with nn train",
               "rho, copied images only"], rows)


def analyze_copy_rules(records: Sequence[Any], n_samples: int | None = None) -> dict[str, Any] | None:
    """fits.json's ``copy_rules`` section for the runs of ``records`` (RunRecord) that have copies.jsonl lines (None
    without any): per run :func:`rule_sensitivity`, with the descriptors of the copy analysis (once per train set;
    none where the data cannot be loaded, naming why), and the count of intervals for a family-wise reading.
    ``n_samples``: the base sample count (default: each run's eval.n_samples)."""
    from diffmem.analysis.images import train_images
    from diffmem.rundir import RunDir

    cache: dict[Any, Any] = {}
    runs = {}
    for r in records:
        lines = RunDir(r.path).copies()
        if not lines:
            continue
        recorded = RunDir(r.path).recorded_dataset_sha256()
        key = (r.config.data, r.config.eval.loss_n_test, recorded)
        if key not in cache:
            try:
                cache[key] = train_images(r.config, recorded).descriptors["nn_train_distance"]
            except (ValueError, OSError):
                cache[key] = None
        runs[r.name] = rule_sensitivity(lines, r.n, n_samples or r.config.eval.n_samples, cache[key])
    if not runs:
        return None
    intervals = sum(1 for entry in runs.values() for rule in entry["rules"].values()
                    for k in ("rho_nn_train", "rho_nn_train_copied_only") if rule.get(k))
    return {"runs": runs, "intervals": intervals,
            "interval_note": f"Each interval is 95 % on its own; over the {intervals} intervals of this table a "
                             f"family-wise 95 % holds each to {100 - 5 / max(intervals, 1):.3g} % (Bonferroni)"}
