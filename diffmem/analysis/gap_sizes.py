"""The train/held-out loss gap as an effect size, per noise level (issue 60): when does the gap reach a given size,
where is the held-out loss lowest, and at which level is the gap largest in the denoiser's own units.

Read from the per-level means every evaluation records (metrics.jsonl ``train_losses``, ``test_losses``,
``loss_gap_lo``, ``loss_gap_hi`` at the diffusion times ``loss_ts``). Steps are optimizer steps. Per run and level t:

- **the relative gap** r(t) = test / train - 1 (unit-free: the same in the loss's epsilon units and in x0 units),
  with the 95 % interval ``[loss_gap_lo / train, loss_gap_hi / train]`` (Welch's interval of the difference divided
  by the train mean, whose own noise, a few per cent of a much smaller spread, is left out);
- **tau_gap_<L>_t<t>**: the step at which r(t) first reaches the size L of ``eval.gap_sizes`` (0.1, 0.3, 1: the
  held-out loss 10 %, 30 %, 100 % above the train loss), read by the rule of every level crossing
  (:func:`diffmem.analysis.timescales.level_crossing`: log-time interpolation, interval from the data's 95 % bounds;
  never reached: a lower bound at the last step). Unlike tau_gap's 5 % noise-band rule, a crossing of a fixed size
  does not move with the evaluations placed around it: more evaluations only narrow its interval;
- **tau_test_min_t<t>**: the evaluation with the lowest held-out loss, the interval its two neighbours (at the last
  evaluation: a lower bound, still falling; at the first: an upper bound);
- **tau_gap_bracket**: "grid" when tau_gap's bracket (the 5 % rule) lies on the run's evaluation grid, "refinement"
  when an evaluation added after training for another estimator's bracket set it: the rule then reads another grid,
  and its value moves with where those evaluations fell;
- **gap_x0_peak_t**: at the run's last evaluation, the level whose absolute gap is largest in the denoiser's x0
  units: the epsilon-loss gap times (1 - abar) / abar = e^{2t} - 1 (x0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar)
  with abar = e^{-2t}), so "which level opens widest" does not depend on the loss's units; ``gap_eps_peak_t`` is the
  same in epsilon units, for comparison.

With the no-member control recorded (``control_losses``), each crossing's rule is also applied to the control's
relative gap, test / control - 1 and control / test - 1; a crossing whose control reaches the same size is flagged
and enters no law (as in :mod:`diffmem.analysis.signals`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from diffmem.analysis import timescales
from diffmem.analysis.signals import ControlReading, level_series, recorded_levels
from diffmem.analysis.timescales import Estimate


def crossing_name(size: float, t: float) -> str:
    """``tau_gap_0.3_t0.01``: the step at which the relative gap at level ``t`` reaches ``size``."""
    return f"tau_gap_{size:g}_t{t:g}"


def minimum_name(t: float) -> str:
    """``tau_test_min_t0.01``: the step of the lowest held-out loss at level ``t``."""
    return f"tau_test_min_t{t:g}"


@dataclass(frozen=True)
class GapSizes:
    """One run's effect-size readings (module docstring): ``estimates`` by name (:func:`crossing_name`,
    :func:`minimum_name`), the control of each crossing (None without a control), the flags of crossings whose
    control reached their size, and the levels of the largest gap at the last evaluation."""

    estimates: dict[str, Estimate]
    controls: dict[str, ControlReading | None] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    x0_peak_t: float | None = None
    eps_peak_t: float | None = None
    tau_gap_bracket: str | None = None  # "grid" | "refinement": where tau_gap's (5 % rule) bracket ends lie

    def estimate(self, name: str) -> Estimate | None:
        """The estimate of ``name`` for a law: None when not one of these, no value (naming the flag) when
        flagged."""
        if name not in self.estimates:
            return None
        if name in self.flags:
            return Estimate(None, None, None, False, f"flagged, left out: {self.flags[name]}")
        return self.estimates[name]

    def row(self) -> dict[str, Any]:
        """summary.csv's cells: per estimate its value, ``_lo``, ``_hi``, ``_censored`` and ``_flag``, then the two
        peak levels."""
        cells: dict[str, Any] = {"gap_x0_peak_t": self.x0_peak_t, "gap_eps_peak_t": self.eps_peak_t,
                                 "tau_gap_bracket": self.tau_gap_bracket}
        for name, est in self.estimates.items():
            cells |= {name: est.value, f"{name}_lo": est.lo, f"{name}_hi": est.hi, f"{name}_censored": est.censored,
                      f"{name}_flag": self.flags.get(name, "") if self.controls.get(name) is not None else None}
        return cells

    def to_dict(self) -> dict[str, Any]:
        return {"estimates": {k: {"value": e.value, "lo": e.lo, "hi": e.hi, "censored": e.censored}
                              for k, e in self.estimates.items()},
                "controls": {k: c.to_dict() for k, c in self.controls.items() if c is not None},
                "flags": dict(self.flags), "gap_x0_peak_t": self.x0_peak_t, "gap_eps_peak_t": self.eps_peak_t}


def gap_size_columns(sizes: Sequence[float], levels: Sequence[float]) -> list[str]:
    """summary.csv's columns of :meth:`GapSizes.row` for these sizes and levels, in order."""
    out = ["gap_x0_peak_t", "gap_eps_peak_t", "tau_gap_bracket"]
    for t in levels:
        for name in [crossing_name(v, t) for v in sizes] + [minimum_name(t)]:
            out += [name, f"{name}_lo", f"{name}_hi", f"{name}_censored", f"{name}_flag"]
    return out


def relative_gap(train: Sequence[float | None], test: Sequence[float | None], gap_lo: Sequence[float | None],
                 gap_hi: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(keep, r, r_lo, r_hi): which evaluations have all four values and a positive train loss, and there the
    relative gap test / train - 1 with its interval [gap_lo / train, gap_hi / train]."""
    tr, te, lo, hi = (np.array([np.nan if v is None else float(v) for v in s], dtype=float)
                      for s in (train, test, gap_lo, gap_hi))
    keep = np.isfinite(tr) & np.isfinite(te) & np.isfinite(lo) & np.isfinite(hi) & (tr > 0)
    return keep, te[keep] / tr[keep] - 1.0, lo[keep] / tr[keep], hi[keep] / tr[keep]


def heldout_minimum(steps: np.ndarray, test: np.ndarray) -> Estimate:
    """The step of the lowest held-out loss, bracketed by its neighbouring evaluations (module docstring)."""
    rule = "the evaluation with the lowest held-out loss; interval = its two neighbouring evaluations"
    if len(test) < 3:
        return Estimate(None, None, None, False, "fewer than 3 evaluations with a held-out loss")
    k = int(np.argmin(test))
    if k == len(test) - 1:
        return Estimate(float(steps[k]), float(steps[k]), None, True,
                        "the held-out loss is lowest at the last evaluation (lower bound: still falling)")
    if k == 0:
        return Estimate(float(steps[0]), None, float(steps[0]), True,
                        "the held-out loss is lowest at the first evaluation (upper bound)")
    return Estimate(float(steps[k]), float(steps[k - 1]), float(steps[k + 1]), False, rule)


def bracket_source(tau_gap: Estimate | None, scheduled: set[int] | None) -> str | None:
    """Where tau_gap's bracket ends lie: "grid" when both are steps of the run's evaluation grid, "refinement" when
    one is an evaluation added after training (placed for tau_mem's, tau_gen's or tau_auc's bracket, so tau_gap's
    5 % rule reads another grid there); None without a measured tau_gap or a known grid."""
    if tau_gap is None or not tau_gap.measured or scheduled is None or tau_gap.lo is None or tau_gap.hi is None:
        return None
    return "grid" if {int(tau_gap.lo), int(tau_gap.hi)} <= scheduled else "refinement"


def run_gap_sizes(evaluations: Sequence[Mapping[str, Any]], sizes: Sequence[float], tau_gap: Estimate | None = None,
                  scheduled: set[int] | None = None) -> GapSizes | None:
    """The effect-size readings of one run from its metrics records (one per step, sorted); None when it recorded
    no per-level losses. ``tau_gap`` and ``scheduled`` (the run's evaluation grid): to say where tau_gap's bracket
    comes from (:func:`bracket_source`)."""
    levels = recorded_levels(evaluations)
    if not levels:
        return None
    steps = np.array([float(e["step"]) for e in evaluations])
    has_control = any(e.get("control_losses") for e in evaluations)
    estimates: dict[str, Estimate] = {}
    controls: dict[str, ControlReading | None] = {}
    flags: dict[str, str] = {}
    for t in levels:
        train, test = level_series(evaluations, "train_losses", t), level_series(evaluations, "test_losses", t)
        keep, r, r_lo, r_hi = relative_gap(train, test, level_series(evaluations, "loss_gap_lo", t),
                                           level_series(evaluations, "loss_gap_hi", t))
        if has_control:
            control = level_series(evaluations, "control_losses", t)
            c_keep, c_up, c_up_lo, c_up_hi = relative_gap(control, test, level_series(evaluations, "control_gap_lo", t),
                                                          level_series(evaluations, "control_gap_hi", t))
            flipped = [None if v is None else -v for v in level_series(evaluations, "control_gap_hi", t)]
            flipped_hi = [None if v is None else -v for v in level_series(evaluations, "control_gap_lo", t)]
            d_keep, c_dn, c_dn_lo, c_dn_hi = relative_gap(test, control, flipped, flipped_hi)
        for size in sizes:
            name = crossing_name(size, t)
            if keep.any():
                estimates[name] = timescales.level_crossing(steps[keep], r, r_lo, r_hi, size, "relative gap")
            else:
                estimates[name] = Estimate(None, None, None, False, "no evaluation with the level's losses and gap")
            controls[name] = None
            if has_control and c_keep.any() and d_keep.any():
                reading = ControlReading(
                    timescales.level_crossing(steps[c_keep], c_up, c_up_lo, c_up_hi, size, "control relative gap"),
                    timescales.level_crossing(steps[d_keep], c_dn, c_dn_lo, c_dn_hi, size, "control relative gap"))
                controls[name] = reading
                if reading.flag(name):
                    flags[name] = reading.flag(name)
        values = np.array([np.nan if v is None else float(v) for v in test], dtype=float)
        finite = np.isfinite(values)
        estimates[minimum_name(t)] = heldout_minimum(steps[finite], values[finite])
    last = evaluations[-1]
    gaps = [(float(t), float(te) - float(tr)) for t, tr, te in zip(last.get("loss_ts") or [],
                                                                   last.get("train_losses") or [],
                                                                   last.get("test_losses") or [])
            if tr is not None and te is not None]
    x0 = max(gaps, key=lambda g: g[1] * math.expm1(2 * g[0]))[0] if gaps else None
    eps = max(gaps, key=lambda g: g[1])[0] if gaps else None
    return GapSizes(estimates, controls, flags, x0, eps, bracket_source(tau_gap, scheduled))


def gap_size_quantities(runs: Sequence[Any]) -> list[str]:
    """The effect-size quantities some run of ``runs`` (RunSummary: ``gap_sizes``) has, in a stable order."""
    names: dict[str, None] = {}
    for r in runs:
        if r.gap_sizes is not None:
            names |= dict.fromkeys(r.gap_sizes.estimates)
    return list(names)
