"""Sampling-free signals of memorization (issue 42): what a run's losses tell without drawing a sample, dated and
calibrated against tau_mem.

Read from the keys every evaluation records at the diffusion times ``eval.loss_ts`` (``train_losses``,
``test_losses``, ``auc_lo`` per level, ``membership_auc_lo`` over the levels combined; docs/analysis.md, Metrics).
Runs without them (folders written before the keys) have no signals: every column below is empty for them and no
law or calibration is written. Steps are optimizer steps.

The timescales of one run (:func:`run_signals`):

- **tau_gap(t)**: per noise level t of ``loss_ts``, the rule of tau_gap (:func:`diffmem.analysis.timescales.tau_gap`)
  on that level's mean train and held-out losses.
- **tau_gap_first**, with its level **tau_gap_first_t**: the earliest of them, the level whose gap opens first
  (:func:`first_gap`): the smallest measured tau_gap(t); a level whose gap was open at the first evaluation (an
  upper bound) comes before any measured one, and then tau_gap_first is that upper bound; when no level's gap
  opened, a lower bound at the last step with no level.
- **tau_auc**: the membership AUC of the levels combined stays above 0.5 (``estimate_run``'s tau_auc,
  :func:`diffmem.analysis.timescales.tau_auc`); **tau_auc(t)** the same rule on each level's ``auc_lo``.

**The no-member control** (:func:`control_reading`; runs whose evaluations record the control keys,
``control_losses``, ``control_auc_lo``, ...): each signal's rule applied to the control block in the train set's
place, and mirrored (the control fitted *worse* than the held-out images), so two-sided. The control must never open:
the model saw neither group. A signal whose control opened (measured, or open from the first evaluation) at some
level is **flagged** (``<signal>_flag`` in summary.csv, ``flags`` in fits.json's calibration, the report): it
measures how the image sets were drawn as much as memorization. A flagged signal keeps its value in summary.csv but
enters no law and no lag law (:func:`signal_estimate` gives it no value, naming the flag), and a level whose control
opened is not a candidate for tau_gap_first. Runs without the control keys (folders written before them, a training
part of one block) have no control: ``control_n`` is empty and nothing is flagged; the report says so.

The calibration against tau_mem (:func:`lag`, :func:`cell_lags`, :func:`lag_verdicts`): for each signal S
(tau_gap at the run's ``loss_t``, tau_gap_first, tau_auc) and each reference R (the onset tau_mem and each level
crossing tau_mem_at_L), the **lag** R / S, how many times later memorization is seen in the samples than the
signal shows it (> 1: the signal is an early warning). Names: ``gap_lag``, ``gap_first_lag``, ``auc_lag`` against
the onset, ``auc_lag_at_0.01`` against tau_mem_at_0.01, and so on (:func:`lag_name`).

- Per run, the interval from the two brackets: ``lo = R.lo / S.hi``, ``hi = R.hi / S.lo``. Censored when either is;
  a bound where the brackets give one (R a lower bound or S an upper bound: the lag is a lower bound, value = lo; R
  an upper bound or S a lower bound: an upper bound, value = hi); no value when the two bounds point opposite ways.
- Per cell (N, W), over its seeds whose lag is measured: the geometric mean, and with k >= 2 of them the 95 %
  Student-t interval of the mean of the log lags, ``exp(mean +- t(0.975, k - 1) * sd / sqrt(k))`` (scipy.stats.t),
  widened where needed to the geometric means of the seeds' own lower and upper ends (seeds on one evaluation grid
  can share one bracket exactly, sd = 0, while each lag is known only within it); with one, that run's own
  interval.
- The law of each lag against N (per width) and against W (per N) by the project's fit (diffmem.analysis.powerlaw,
  fitted in :mod:`diffmem.analysis.scaling` like every law, each run's lag interval as its bracket: uniform in log
  over lo..hi, which overstates the variance of a ratio of two brackets by up to a factor 2, a conservative width).
  Its exponent is the difference of the exponents of R and S: **a lag that changes with N** <=> the 95 % interval
  of the lag's exponent excludes 0; **a constant lag** (S scales with N as tau_mem does) <=> it holds 0, excludes
  R's own exponent (the lag of a signal flat in N) and is at most :data:`CONSTANT_LAG_MAX_WIDTH` wide; otherwise
  **not resolved**. An **early warning** <=> every cell's lag interval lies above 1. :func:`lag_verdicts` says
  which, in a sentence.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from diffmem.analysis import timescales
from diffmem.analysis.powerlaw import FitSet, PowerLawFit
from diffmem.analysis.timescales import Estimate, TimescaleInputError

SIGNALS: dict[str, str] = {"tau_gap": "gap_lag", "tau_gap_first": "gap_first_lag", "tau_auc": "auc_lag"}
"""The sampling-free timescales and the name of their lag against tau_mem."""

FITTED_SIGNALS = ("tau_gap", "tau_gap_first", "tau_auc")
"""The signals whose laws in N and W fits.json holds (``tau_auc_vs_n``, ...) for runs that record the keys."""


def estimate_columns(name: str) -> tuple[str, ...]:
    """The four summary.csv columns of a timescale or lag: value, ``_lo``, ``_hi``, ``_censored``."""
    return (name, f"{name}_lo", f"{name}_hi", f"{name}_censored")


CONTROL_COLUMNS: tuple[str, ...] = ("control_n", "tau_gap_control", "tau_gap_flag", "tau_gap_first_flag",
                                    "tau_auc_control", "tau_auc_flag")
"""summary.csv's columns of the no-member control: the control images per evaluation, the step from which the
control of tau_gap (at the run's ``loss_t``) and of tau_auc (levels combined) left its null by the signal's own rule
(empty: it never did), and each signal's flag (empty, or why it is flagged)."""

SIGNAL_COLUMNS: tuple[str, ...] = (
    "tau_gap_lo", "tau_gap_hi", *estimate_columns("tau_auc"), *estimate_columns("tau_gap_first"), "tau_gap_first_t",
    "membership_n",
    *estimate_columns("gap_lag"), *estimate_columns("gap_first_lag"), *estimate_columns("auc_lag"),
    *CONTROL_COLUMNS,
)
"""summary.csv's columns of the sampling-free signals, after the level columns, written only when some run records
the keys (empty for the others): ``tau_gap_lo`` / ``tau_gap_hi`` (the bracket of tau_gap at the run's ``loss_t``,
whose value and censoring are summary.csv's ``tau_gap`` and ``tau_gap_censored``), ``tau_auc`` (combined AUC) and
``tau_gap_first`` with their intervals,
``tau_gap_first_t`` (its diffusion time), ``membership_n`` (images per group of the AUC), and the lags against the
onset tau_mem, ``gap_lag`` = tau_mem / tau_gap, ``gap_first_lag`` = tau_mem / tau_gap_first, ``auc_lag`` = tau_mem /
tau_auc, each with its interval and whether it is censored (module docstring). The lags against the level crossings
and the per-level timescales are in fits.json's ``calibration``."""

CALIBRATION_METHOD = (
    "lag = tau_mem (onset or level crossing) / signal, per run with the interval [R.lo / S.hi, R.hi / S.lo] of the "
    "two brackets (censored when either is); per cell the geometric mean over the measured seeds with the 95 % "
    "Student-t interval of the mean log lag (>= 2 seeds), at least from the geometric mean of the seeds' lower to "
    "that of their upper ends (the run's own interval with one seed); lag laws by the fit "
    "method of every law, their exponent = exponent(tau_mem) - exponent(signal): constant lag <=> its interval holds "
    "0, excludes the reference's exponent and is at most 0.5 wide (otherwise not resolved); early warning <=> every "
    "cell's lag interval lies above 1")
"""The calibration's method in one line (fits.json ``calibration.method``)."""


def lag_name(signal: str, reference: str = "tau_mem") -> str:
    """The lag of ``signal`` against ``reference``: ``auc_lag`` (tau_mem / tau_auc), ``auc_lag_at_0.01``
    (tau_mem_at_0.01 / tau_auc)."""
    base = SIGNALS[signal]
    return base if reference == "tau_mem" else f"{base}{reference[len('tau_mem'):]}"


LAG_PATTERN = re.compile(r"^(gap|gap_first|auc)_lag(_at_[0-9.e+-]+)?$")


def is_signal_quantity(name: str) -> bool:
    """Whether ``name`` is a timescale of this module (tau_auc, tau_gap_first) or a lag (``auc_lag_at_0.1``)."""
    return name in ("tau_auc", "tau_gap_first") or LAG_PATTERN.match(name) is not None


# --- one run --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ControlReading:
    """A signal's rule applied to the no-member control: ``above`` (the control read as the train set is, e.g. its
    AUC above 0.5) and ``below`` (mirrored: e.g. its AUC below 0.5). ``left`` is the step from which the control
    left its null (the earlier side that opened), None when it never did."""

    above: Estimate
    below: Estimate

    @property
    def left(self) -> float | None:
        opened = [e.value for e in (self.above, self.below) if left_its_null(e)]
        return min(opened) if opened else None

    def flag(self, what: str) -> str:
        """'' when the control held its null, else one phrase naming ``what`` and the side and step."""
        if self.left is None:
            return ""
        side = "above" if left_its_null(self.above) and self.above.value == self.left else "below"
        return f"the control of {what} left its null ({side}) from about step {self.left:.4g}"

    def to_dict(self) -> dict[str, Any]:
        return {"above": estimate_dict(self.above), "below": estimate_dict(self.below), "left": self.left}


def left_its_null(est: Estimate) -> bool:
    """Whether a control's estimate says it opened: measured, or open from the first evaluation (an upper bound);
    not when it never opened (a lower bound) or has no value."""
    return est.value is not None and (not est.censored or est.lo is None)


@dataclass(frozen=True)
class LevelSignal:
    """One noise level's timescales: ``t`` (diffusion time of ``eval.loss_ts``), tau_gap(t) and tau_auc(t), and
    their no-member controls (None without the control keys)."""

    t: float
    tau_gap: Estimate
    tau_auc: Estimate
    gap_control: ControlReading | None = None
    auc_control: ControlReading | None = None

    @property
    def gap_flag(self) -> str:
        return self.gap_control.flag(f"tau_gap(t = {self.t:g})") if self.gap_control is not None else ""


@dataclass(frozen=True)
class RunSignals:
    """The sampling-free signals of one run (module docstring): per level, the combined tau_auc, the earliest gap
    ``tau_gap_first`` at level ``first_t`` (None when no gap opened), the lags by :func:`lag_name` and the images per
    group of the AUC (``membership_n``, the last recorded)."""

    levels: tuple[LevelSignal, ...]
    tau_auc: Estimate
    tau_gap_first: Estimate
    first_t: float | None
    lags: dict[str, Estimate] = field(default_factory=dict)
    membership_n: int | None = None
    tau_gap: Estimate | None = None  # tau_gap at the run's loss_t (estimate_run's), for its bracket's columns
    control_n: int | None = None  # control images per evaluation; None: no control recorded
    controls: dict[str, ControlReading] = field(default_factory=dict)  # "tau_gap", "tau_auc": their controls
    flags: dict[str, str] = field(default_factory=dict)  # signal -> why it is flagged (only flagged signals)

    def estimates(self) -> dict[str, Estimate]:
        """Every timescale and lag by name, flagged or not (summary.csv's values)."""
        return {"tau_auc": self.tau_auc, "tau_gap_first": self.tau_gap_first, **self.lags}

    def flag_of(self, quantity: str) -> str:
        """Why ``quantity`` (a signal or a lag of one) is flagged, '' when it is not."""
        if quantity in self.flags:
            return self.flags[quantity]
        match = LAG_PATTERN.match(quantity)
        if match:
            signal = {v: k for k, v in SIGNALS.items()}[f"{match.group(1)}_lag"]
            return self.flags.get(signal, "")
        return ""

    def row(self) -> dict[str, Any]:
        """The :data:`SIGNAL_COLUMNS` cells of the run's summary.csv row."""
        cells: dict[str, Any] = {"tau_gap_first_t": self.first_t, "membership_n": self.membership_n,
                                 "control_n": self.control_n}
        if self.tau_gap is not None:
            cells |= {"tau_gap_lo": self.tau_gap.lo, "tau_gap_hi": self.tau_gap.hi}
        for name, est in self.estimates().items():
            if name in SIGNAL_COLUMNS:
                cells |= dict(zip(estimate_columns(name), (est.value, est.lo, est.hi, est.censored)))
        for name in ("tau_gap", "tau_auc"):
            if name in self.controls:
                cells[f"{name}_control"] = self.controls[name].left
        for name in ("tau_gap", "tau_gap_first", "tau_auc"):
            cells[f"{name}_flag"] = self.flags.get(name, "") if self.control_n else None
        return cells

    def to_dict(self) -> dict[str, Any]:
        """The run's entry of fits.json ``calibration.runs`` (without its name, N, W and seed)."""
        return {"loss_ts": [lv.t for lv in self.levels], "membership_n": self.membership_n,
                "tau_gap_t": [estimate_dict(lv.tau_gap) for lv in self.levels],
                "tau_auc_t": [estimate_dict(lv.tau_auc) for lv in self.levels],
                "tau_auc": estimate_dict(self.tau_auc), "tau_gap_first": estimate_dict(self.tau_gap_first),
                "tau_gap_first_t": self.first_t, "lags": {k: estimate_dict(e) for k, e in self.lags.items()},
                "control_n": self.control_n,
                "control": ({"tau_gap_t": [lv.gap_control.to_dict() for lv in self.levels],
                             "tau_auc_t": [lv.auc_control.to_dict() for lv in self.levels],
                             **{k: c.to_dict() for k, c in self.controls.items()}}
                            if self.control_n else None),
                "flags": dict(self.flags)}


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """An estimate as fits.json's calibration stores it: value, lo, hi, censored."""
    return {"value": est.value, "lo": est.lo, "hi": est.hi, "censored": est.censored}


def has_signals(evaluations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some evaluation recorded the per-level losses or the membership AUC."""
    return any(e.get("loss_ts") or e.get("membership_auc_lo") is not None for e in evaluations)


def level_series(evaluations: Sequence[Mapping[str, Any]], key: str, t: float) -> list[float | None]:
    """The per-level list ``key`` (e.g. ``train_losses``) at the diffusion time ``t``, one value per evaluation
    (None where that evaluation did not record ``t``); levels are matched by their time, not their position."""
    out: list[float | None] = []
    for e in evaluations:
        ts, values = e.get("loss_ts") or [], e.get(key)
        hit = [i for i, v in enumerate(ts) if math.isclose(float(v), t, rel_tol=1e-9)]
        out.append(float(values[hit[0]]) if hit and values and values[hit[0]] is not None else None)
    return out


def recorded_levels(evaluations: Sequence[Mapping[str, Any]]) -> tuple[float, ...]:
    """Every diffusion time recorded by some evaluation, increasing."""
    return tuple(sorted({float(t) for e in evaluations for t in (e.get("loss_ts") or [])}))


def first_gap(levels: Sequence[LevelSignal]) -> tuple[Estimate, float | None]:
    """(tau_gap_first, its level t): the level whose gap opens first (module docstring), among the levels whose
    control held its null; t is None when no such level's gap opened (a lower bound at the last step) or none has
    tau_gap."""
    levels = [lv for lv in levels if not lv.gap_flag]
    ahead = [lv for lv in levels if lv.tau_gap.value is not None and lv.tau_gap.censored and lv.tau_gap.lo is None]
    measured = [lv for lv in levels if lv.tau_gap.measured]
    for group, what in ((ahead, "open at the first evaluation"), (measured, "the smallest measured tau_gap(t)")):
        if group:
            best = min(group, key=lambda lv: (lv.tau_gap.value, lv.t))
            est = best.tau_gap
            return Estimate(est.value, est.lo, est.hi, est.censored, f"level t = {best.t:g}, {what}; {est.rule}"), \
                best.t
    bounds = [lv.tau_gap for lv in levels if lv.tau_gap.value is not None]
    if not bounds:
        return Estimate(None, None, None, False, "no level with train and held-out losses at 3 evaluations"), None
    last = max(b.value for b in bounds)
    return Estimate(last, last, None, True, "no level's gap opened by the last evaluation (lower bound)"), None


def lag(reference: Estimate, signal: Estimate) -> Estimate:
    """reference / signal with the interval of the two brackets (module docstring): ``lo = R.lo / S.hi``, ``hi =
    R.hi / S.lo``; censored (a bound, or no value) when either is."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None and a > 0 and b > 0 else None

    if reference.value is None or signal.value is None:
        return Estimate(None, None, None, False, "reference or signal not measured")
    lo, hi = ratio(reference.lo, signal.hi), ratio(reference.hi, signal.lo)
    if not (reference.censored or signal.censored):
        value = ratio(reference.value, signal.value)
        return Estimate(value, lo, hi, False, "R / S, interval [R.lo / S.hi, R.hi / S.lo]")
    if lo is not None and hi is None:
        return Estimate(lo, lo, None, True, "R / S is a lower bound (R a lower bound or S an upper bound)")
    if hi is not None and lo is None:
        return Estimate(hi, None, hi, True, "R / S is an upper bound (R an upper bound or S a lower bound)")
    return Estimate(None, None, None, True, "R and S are bounds pointing opposite ways: no bound on R / S")


def run_signals(evaluations: Sequence[Mapping[str, Any]], estimates: Mapping[str, Estimate],
                run: str = "run") -> RunSignals | None:
    """The sampling-free signals of one run from its metrics records (one per step, sorted) and ``estimates``, its
    :func:`diffmem.analysis.timescales.estimate_run` (tau_mem, its level crossings ``tau_mem_at_L``, tau_gap and
    the combined tau_auc); None when the run did not record the keys. Bad per-run data: None with a warning."""
    if not has_signals(evaluations):
        return None
    steps = [float(e["step"]) for e in evaluations]
    control_n = next((e["control_n"] for e in reversed(evaluations) if e.get("control_n")), None)
    try:
        levels = tuple(LevelSignal(
            t, timescales.tau_gap(steps, level_series(evaluations, "train_losses", t),
                                  level_series(evaluations, "test_losses", t)),
            timescales.tau_auc(steps, level_series(evaluations, "auc_lo", t)),
            *(control_reading(steps, evaluations, t) if control_n else (None, None)))
            for t in recorded_levels(evaluations))
        combined = combined_control(steps, evaluations) if control_n else None
    except TimescaleInputError as e:
        warnings.warn(f"run {run}: sampling-free signals not estimated: {e}", stacklevel=2)
        return None
    auc = estimates.get("tau_auc", Estimate(None, None, None, False, "not estimated"))
    first, first_t = first_gap(levels)
    signals = {"tau_gap": estimates.get("tau_gap", Estimate(None, None, None, False, "not estimated")),
               "tau_gap_first": first, "tau_auc": auc}
    references = ["tau_mem"] + [k for k in estimates if k.startswith("tau_mem_at_")]
    lags = {lag_name(s, r): lag(estimates[r], est) for s, est in signals.items() for r in references
            if r in estimates}
    n = next((e["membership_n"] for e in reversed(evaluations) if e.get("membership_n") is not None), None)
    controls: dict[str, ControlReading] = {}
    flags: dict[str, str] = {}
    if control_n:
        loss_t = next((float(e["loss_t"]) for e in reversed(evaluations) if e.get("loss_t") is not None), None)
        at_loss_t = next((lv for lv in levels if loss_t is not None and math.isclose(lv.t, loss_t, rel_tol=1e-9)),
                         None)
        if at_loss_t is not None:
            controls["tau_gap"] = at_loss_t.gap_control
            if at_loss_t.gap_flag:
                flags["tau_gap"] = at_loss_t.gap_flag
        controls["tau_auc"] = combined
        if combined.flag("tau_auc"):
            flags["tau_auc"] = combined.flag("tau_auc")
        if all(lv.gap_flag for lv in levels):
            flags["tau_gap_first"] = "the control of every level's gap left its null"
    return RunSignals(levels, auc, first, first_t, lags, n, signals["tau_gap"], control_n, controls, flags)


def control_reading(steps: Sequence[float], evaluations: Sequence[Mapping[str, Any]],
                    t: float) -> tuple[ControlReading, ControlReading]:
    """(gap control, AUC control) at level ``t``: tau_gap's rule on the control's and the held-out images' losses,
    both ways round, and tau_auc's rule on the control AUC's lower end above 0.5 and its upper end below 0.5."""
    control = level_series(evaluations, "control_losses", t)
    test = level_series(evaluations, "test_losses", t)
    hi = level_series(evaluations, "control_auc_hi", t)
    return (ControlReading(timescales.tau_gap(steps, control, test), timescales.tau_gap(steps, test, control)),
            ControlReading(timescales.tau_auc(steps, level_series(evaluations, "control_auc_lo", t)),
                           timescales.tau_auc(steps, [None if v is None else 1.0 - v for v in hi])))


def combined_control(steps: Sequence[float], evaluations: Sequence[Mapping[str, Any]]) -> ControlReading:
    """The control of tau_auc (levels combined): its rule on ``control_membership_auc_lo`` above 0.5 and on
    ``control_membership_auc_hi`` below 0.5."""
    lo = [e.get("control_membership_auc_lo") for e in evaluations]
    hi = [e.get("control_membership_auc_hi") for e in evaluations]
    return ControlReading(timescales.tau_auc(steps, lo), timescales.tau_auc(steps, [None if v is None else 1.0 - v
                                                                                    for v in hi]))


def signal_estimate(signals: RunSignals | None, quantity: str) -> Estimate | None:
    """A run's sampling-free timescale or lag by name; an empty Estimate (with the reason) for a run without the
    keys; None when ``quantity`` is not one of this module's (:func:`is_signal_quantity`)."""
    if not is_signal_quantity(quantity):
        return None
    if signals is None:
        return Estimate(None, None, None, False, "the run did not record the per-level losses (eval.loss_ts)")
    flag = signals.flag_of(quantity)
    if flag:
        return Estimate(None, None, None, False, f"flagged, left out: {flag}")
    return signals.estimates().get(quantity, Estimate(None, None, None, False, f"{quantity} is not defined here"))


# --- across runs ----------------------------------------------------------------------------------------------------

def signal_quantities(runs: Sequence[Any]) -> list[str]:
    """The quantities whose laws fits.json holds for ``runs`` (RunSummary: ``signals``): the signals of
    :data:`FITTED_SIGNALS`, then every lag, in a stable order; [] when no run records the keys."""
    recorded = [r.signals for r in runs if r.signals is not None]
    if not recorded:
        return []
    lags = sorted({k for s in recorded for k in s.lags}, key=lambda k: (k.split("_at_")[0], k))
    return list(FITTED_SIGNALS) + lags


def cell_lags(runs: Sequence[Any], ci: float = 0.95) -> list[dict[str, Any]]:
    """Per cell (N, W) and per lag of :func:`signal_quantities`: the geometric mean over the seeds whose lag is
    measured and its interval (module docstring), the runs and those censored or without a value. ``runs``:
    RunSummary (``run``, ``n``, ``width``, ``signals``)."""
    out = []
    names = [q for q in signal_quantities(runs) if q not in FITTED_SIGNALS]
    for n, width in sorted({(r.n, r.width) for r in runs if r.signals is not None}):
        cell = [r for r in runs if (r.n, r.width) == (n, width) and r.signals is not None]
        for name in names:
            ests = [(r.run, r.signals.lags.get(name)) for r in cell]
            measured = [(run, e) for run, e in ests if e is not None and e.measured and e.value > 0]
            entry: dict[str, Any] = {"n": n, "width": width, "lag": name, "runs": [run for run, _ in ests],
                                     "measured": len(measured), "geometric_mean": None, "lo": None, "hi": None,
                                     "interval": None,
                                     "censored": [run for run, e in ests if e is not None and e.censored]}
            if len(measured) >= 2:
                logs = np.log([e.value for _, e in measured])
                half = float(stats.t.ppf(0.5 + ci / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
                lo, hi = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
                ends = [(e.lo, e.hi) for _, e in measured]
                if all(a is not None and b is not None and a > 0 and b > 0 for a, b in ends):
                    lo = min(lo, float(np.exp(np.mean(np.log([a for a, _ in ends])))))
                    hi = max(hi, float(np.exp(np.mean(np.log([b for _, b in ends])))))
                entry |= {"geometric_mean": float(np.exp(logs.mean())), "lo": lo, "hi": hi,
                          "interval": "t over seeds, at least the brackets' geometric means"}
            elif measured:
                e = measured[0][1]
                entry |= {"geometric_mean": e.value, "lo": e.lo, "hi": e.hi, "interval": "the run's brackets"}
            out.append(entry)
    return out


def _signal_and_reference(name: str) -> tuple[str, str]:
    base, _, level = name.partition("_at_")
    signal = {v: k for k, v in SIGNALS.items()}[base]
    return signal, "tau_mem" + (f"_at_{level}" if level else "")


CONSTANT_LAG_MAX_WIDTH = 0.5
"""The widest 95 % interval of a lag's exponent that may call the lag constant: over the N range of a sweep (8x to
32x) a lag within N^[-0.25, 0.25] changes by at most a factor of 1.7 to 2.4."""


def verdict(fit: PowerLawFit, cells: Sequence[Mapping[str, Any]],
            reference_exponent: float | None = None) -> tuple[str, bool | None, str]:
    """(verdict, early warning, sentence) of one lag law over ``cells`` (its cells of :func:`cell_lags`).

    The verdict is "lag changes with <x>" when the exponent's 95 % interval excludes 0; "constant lag" only when it
    holds 0, excludes ``reference_exponent`` (the reference's own exponent in x, e.g. tau_mem's: the lag of a signal
    that does not scale at all) and is at most :data:`CONSTANT_LAG_MAX_WIDTH` wide; otherwise "not resolved" (no
    law, no interval, an interval wide enough to hold both a constant lag and a signal flat in x, or no reference
    exponent to tell them apart). Early warning: True when every cell's lag interval lies above 1, False when some
    cell's lies below 1, else None."""
    signal, reference = _signal_and_reference(fit.quantity)
    lows = [c["lo"] for c in cells if c["geometric_mean"] is not None]
    highs = [c["hi"] for c in cells if c["geometric_mean"] is not None]
    early = (True if lows and all(v is not None and v > 1 for v in lows)
             else False if any(v is not None and v < 1 for v in highs) else None)
    who = f"{signal} against {reference}"
    if not fit.fitted:
        return "not resolved", early, f"{who}: not resolved (no law: {fit.reason})."
    if fit.exponent_lo is None:
        return "not resolved", early, (f"{who}: not resolved (the lag's exponent in {fit.x_name}, {fit.exponent:.2f}, "
                                       "has no interval: too few cells).")
    interval = f"{fit.exponent:.2f} [{fit.exponent_lo:.2f}, {fit.exponent_hi:.2f}]"
    where = {True: "an early warning", False: "not an early warning (in some cell it comes after the reference)",
             None: "not resolved as an early warning (some cell's lag interval holds 1 or has no value)"}[early]
    if not fit.exponent_lo <= 0 <= fit.exponent_hi:
        trend = "grows" if fit.exponent > 0 else "shrinks"
        return f"lag changes with {fit.x_name}", early, (
            f"{who}: {where}; the lag {trend} with {fit.x_name} (exponent {interval} excludes 0: the signal does not "
            "scale as the reference does).")
    width = fit.exponent_hi - fit.exponent_lo
    if reference_exponent is None:
        why = f"no law of {reference} in {fit.x_name} to compare with"
    elif fit.exponent_lo <= reference_exponent <= fit.exponent_hi:
        why = (f"it also holds {reference}'s own exponent {reference_exponent:.2f}, the lag of a signal that does "
               f"not scale with {fit.x_name}")
    elif width > CONSTANT_LAG_MAX_WIDTH:
        why = f"it is {width:.2f} wide, more than the {CONSTANT_LAG_MAX_WIDTH:g} a constant lag is claimed within"
    else:
        return "constant lag", early, (f"{who}: {where}, with a constant lag (the lag's exponent in {fit.x_name}, "
                                       f"{interval}, holds 0 and excludes {reference}'s exponent "
                                       f"{reference_exponent:.2f}).")
    return "not resolved", early, (f"{who}: {where}; whether the lag is constant is not resolved (the lag's exponent "
                                   f"in {fit.x_name}, {interval}, holds 0, but {why}).")


def lag_verdicts(fits: Mapping[str, FitSet], cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per lag law in N over comparable runs (per width: FitSet.laws) in ``fits``: the law's name, its
    runs, exponent with interval, the reference's exponent in the same runs (its law in ``fits``), and
    :func:`verdict`'s verdict, early warning and sentence."""
    out = []
    for name, fit_set in fits.items():
        quantity = name.removesuffix("_vs_n")
        if not name.endswith("_vs_n") or not LAG_PATTERN.match(quantity):
            continue
        signal, reference = _signal_and_reference(quantity)
        references = dict(fits[f"{reference}_vs_n"].laws()) if f"{reference}_vs_n" in fits else {}
        for group, fit in fit_set.laws():
            width = group.removeprefix("width = ")
            mine = [c for c in cells if c["lag"] == quantity and (not width.isdigit() or str(c["width"]) == width)]
            ref_fit = references.get(group)
            ref_exponent = ref_fit.exponent if ref_fit is not None and ref_fit.fitted else None
            text, early, sentence = verdict(fit, mine, ref_exponent)
            out.append({"law": name, "runs": group, "signal": signal, "reference": reference,
                        "exponent": fit.exponent, "exponent_lo": fit.exponent_lo, "exponent_hi": fit.exponent_hi,
                        "reference_exponent": ref_exponent, "verdict": text, "early_warning": early,
                        "sentence": sentence})
    return out


def calibration(runs: Sequence[Any], fits: Mapping[str, FitSet]) -> dict[str, Any] | None:
    """fits.json's ``calibration`` section (None when no run records the keys): the method, per run its signals
    (:meth:`RunSignals.to_dict`), per cell the lags (:func:`cell_lags`) and per lag law in N its verdict
    (:func:`lag_verdicts`). ``runs``: RunSummary; ``fits``: the laws of one variable, lag laws included."""
    if not signal_quantities(runs):
        return None
    cells = cell_lags(runs)
    return {"method": CALIBRATION_METHOD,
            "runs": [{"run": r.run, "n": r.n, "width": r.width, "seed": r.seed, **r.signals.to_dict()}
                     for r in runs if r.signals is not None],
            "cells": cells, "laws": lag_verdicts(fits, cells)}
