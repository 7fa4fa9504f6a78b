"""Across runs: per-run timescales -> summary.csv, power-law fits -> fits.json (`diffmem analyze`).

The fit method (cells of seeds, least squares on cell means, Student-t interval, goodness of fit) is stated in
:mod:`diffmem.analysis.powerlaw`; docs/analysis.md copies it with its coverage study. Censored runs (bounds, not
measurements) are listed with their bound and left out; runs without the quantity are listed with the reason.

fits.json holds ``tau_mem_vs_n`` and ``tau_gen_vs_n`` (per width: ``by_width``), ``tau_gen_vs_width`` and
``tau_mem_vs_width`` (per N: ``by_n``), ``tau_mem_vs_n_over_width`` (x = N / W over the whole grid: it assumes
tau_mem depends on N / W only), ``tau_mem_epochs_vs_n``, the level crossings ``tau_mem_at_{level}_vs_n`` and
``_vs_width`` (one per level of ``eval.mem_levels``), and the joint laws ``tau_mem_vs_n_and_width`` and
``tau_gen_vs_n_and_width`` (tau ~ N^a W^b, fitted where N and W both vary). A law in one variable is fitted over runs
that agree on the other varied setting, per width for a law in N and per N for a law in W; its top-level entry (over
all runs) is fitted only when the runs agree on that setting and otherwise says why not (:func:`_law_set`): the joint
law is the one law over the whole grid. An experiment with split pairs (pairs.jsonl, `diffmem pairs`) adds tau_bias
per pair (:data:`PAIR_COLUMNS` of summary.csv) and its laws ``tau_bias_vs_n``, ``tau_bias_vs_width`` and
``tau_bias_vs_n_and_width``, one point per pair. Runs that record the per-level losses add the sampling-free
signals (:mod:`diffmem.analysis.signals`: :data:`~diffmem.analysis.signals.SIGNAL_COLUMNS` of summary.csv, the laws
of tau_gap, tau_gap_first, tau_auc and of their lags to tau_mem, fits.json's ``calibration``).
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from diffmem import __version__
from diffmem.analysis import timescales
from diffmem.analysis.images import SUMMARY_IMAGE_COLUMNS, analyze_images
from diffmem.analysis.powerlaw import (FIT_METHOD, FIT_METHOD_TEXT, FitSet, JointLawFit, PowerLawFit,
                                       fit_joint_law, fit_power_law)
from diffmem.analysis.blind import BLIND_COLUMNS, BLIND_METHOD, experiment_baselines
from diffmem.analysis.copy_rules import analyze_copy_rules
from diffmem.analysis.fit_order import SUMMARY_FIT_COLUMNS, analyze_fit_order
from diffmem.analysis.gap_sizes import GapSizes, gap_size_columns, gap_size_quantities, run_gap_sizes
from diffmem.analysis.runfiles import (RunFolderError, RunRecord, read_experiment, read_pairs, write_csv,
                                       write_json)
from diffmem.analysis.signals import (SIGNAL_COLUMNS, ControlReading, RunSignals, calibration, recorded_levels,
                                     run_signals, signal_estimate, signal_quantities)
from diffmem.config import ANALYSIS_KEYS, EXECUTION_KEYS, EvalConfig
from diffmem.io import contained
from diffmem.rundir import RunDir
from diffmem.analysis.timescales import Estimate, TimescaleInputError

SUMMARY_COLUMNS: tuple[str, ...] = (
    "run", "n", "width", "params", "seed", "steps",
    "tau_gen", "tau_gen_lo", "tau_gen_hi",
    "tau_mem", "tau_mem_lo", "tau_mem_hi", "tau_mem_censored",
    "tau_gap", "min_fid", "final_f_mem",
    # extras after the contract's columns
    "state", "fid_extractor", "tau_gen_censored", "tau_gap_censored", "n_evals", "planned_steps",
    "batch", "tau_mem_epochs", "tau_mem_epochs_lo", "tau_mem_epochs_hi", "tau_gen_epochs",
    "fid_first", "fid_plateau_noise", "fid_noise_to_fall", "tau_gen_bracket_lo", "tau_gen_bracket_hi",
    "tau_mem_n_samples", "seeds_in_cell", "tau_gen_seed_gmean", "tau_gen_seed_gsd", "tau_mem_seed_gmean",
    "tau_mem_seed_gsd", "data_source", "image_size", "optimizer", "lr", "train_s", "eval_s",
)
"""Columns of summary.csv, in order. ``steps`` is the last evaluated step (an integer); ``planned_steps`` is
train.steps; ``batch`` the effective batch; ``*_epochs`` the same timescale in passes over the train set (steps x batch
/ n). Quality's resolution: ``fid_first`` is the FID / FD at the first evaluation, ``fid_plateau_noise`` the plateau's
noise sigma of the tau_gen rule (the FID's own standard error over the plateau, or its scatter about the curve's local
trend when no standard error was recorded), ``fid_noise_to_fall`` = fid_plateau_noise / (fid_first - min_fid): how large
that noise is against the curve's fall to its plateau (small: tau_gen is well resolved). ``tau_gen_bracket_lo/hi``: the
evaluated steps just before and after tau_gen's crossing, the part of its interval that only more evaluations narrow and
the bracket the fits take (the interval [tau_gen_lo, tau_gen_hi] holds it and also carries the FID's noise); tau_mem's
interval is its bracket of evaluations already. ``tau_mem_n_samples``: the samples drawn at the evaluation where
tau_mem's onset was detected (more samples detect it earlier: compare runs only at equal counts, or use the level
crossings). Seeds: ``seeds_in_cell`` counts the runs of the same (n, width) and, over those whose value is measured,
``*_seed_gmean`` is the geometric mean and ``*_seed_gsd`` the geometric standard deviation (a factor: 1.10 = +-10 %;
empty with fewer than 2 measured seeds). What each run was: ``data_source`` (data.source), ``image_size``
(data.image_size, pixels), ``optimizer`` and ``lr`` (train.optimizer, train.lr); every run of one analysis agrees on
them (:func:`check_comparable`). What each run cost: ``train_s``, the seconds its training steps took (cumulative over
resumes, evaluations excluded), and ``eval_s``, the seconds of all its evaluations (every metrics line's ``wall_s``,
refinement included); empty for metrics written before diffmem recorded them. After these come six columns per level L
of ``eval.mem_levels`` (:func:`level_columns`): ``tau_mem_at_L``, ``_lo``, ``_hi``, ``_censored``, the step at which
f_mem crosses L and its interval, and ``_bracket_lo``, ``_bracket_hi``, the two evaluations it is interpolated between
(the bracket the fits take: ``Estimate.bracket``)."""


ANALYSIS_OUTPUTS = ("summary.csv", "fits.json", "report.md", "figures", "images")
"""What `diffmem analyze` writes into its output folder; none may be a symbolic link (:func:`diffmem.io.contained`)."""

PAIR_COLUMNS: tuple[str, ...] = ("pair", "tau_bias", "tau_bias_lo", "tau_bias_hi", "tau_bias_censored",
                                 "pair_evals", "tau_bias_control", "tau_bias_flag")
"""summary.csv's columns of split pairs, last, written only when the experiment has a pairs.jsonl (`diffmem
pairs`): both members' rows name their pair (the split-0 run's name) and carry the pair's tau_bias, its interval
``tau_bias_lo`` / ``tau_bias_hi`` (the bracket of evaluations: the one before and the one from which the bias stays
established, optimizer steps), whether it is censored, and the pair's paired evaluations ``pair_evals``, then its
no-member control: ``tau_bias_control``, the step from which the control bias left 0 by tau_bias's rule (either
way; empty: it held), and ``tau_bias_flag``, why tau_bias is flagged (empty: not flagged; a flagged value enters no
law); both empty for lines written before the control bias. After the level columns, ``tau_bias_at_L_flag`` per
level: flagged when the control bias itself reaches L (either sign), by the crossing's rule. Other runs leave them empty. After them come six columns per level L of ``eval.bias_levels`` (:func:`level_columns` of
``tau_bias``): ``tau_bias_at_L``, ``_lo``, ``_hi``, ``_censored``, ``_bracket_lo``, ``_bracket_hi``, the step at
which the pair's bias crosses L, its interval, and the two evaluations it is interpolated between."""


def _rounded(seconds: float | None) -> float | None:
    """Seconds to 0.1 s for summary.csv (timings are not reproducible below that)."""
    return None if seconds is None else round(seconds, 1)


def level_name(level: float, quantity: str = "tau_mem") -> str:
    """The name of the level-crossing timescale of ``quantity`` at ``level``: ``tau_mem_at_0.01`` (an f_mem level,
    as estimate_run names it), ``tau_bias_at_0.05`` (a split pair's bias level)."""
    return f"{quantity}_at_{level:g}"


def level_of(name: str) -> float:
    """The level of a level-crossing name (``tau_mem_at_0.01`` -> 0.01, ``tau_bias_at_0.05`` -> 0.05)."""
    return float(name.rsplit("_at_", 1)[1])


def level_cells_of(name: str, est: Estimate) -> dict[str, Any]:
    """The summary.csv cells of one level crossing (:func:`level_columns`)."""
    bracket = est.bracket or (None, None)
    return {name: est.value, f"{name}_lo": est.lo, f"{name}_hi": est.hi, f"{name}_censored": est.censored,
            f"{name}_bracket_lo": bracket[0], f"{name}_bracket_hi": bracket[1]}


def level_columns(levels: Sequence[float], quantity: str = "tau_mem") -> list[str]:
    """summary.csv's columns of ``quantity``'s level crossings, in order."""
    suffixes = ("", "_lo", "_hi", "_censored", "_bracket_lo", "_bracket_hi")
    return [level_name(v, quantity) + suffix for v in levels for suffix in suffixes]


def level_keys(rows: Sequence[dict[str, Any]], quantity: str = "tau_mem") -> list[str]:
    """The level-crossing timescales of ``quantity`` that summary.csv rows hold (``tau_mem_at_0.01``, ...; their
    ``_lo``/``_hi``/``_censored``/``_flag`` columns left out), by level."""
    prefix = f"{quantity}_at_"
    keys = {k for r in rows for k in r if k.startswith(prefix) and not k.endswith(("_lo", "_hi", "_censored", "_flag"))}
    return sorted(keys, key=level_of)


# --- one run --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSummary:
    """One row of summary.csv with the estimates behind it."""

    run: str
    n: int
    width: int
    params: int | None
    seed: int
    batch: int
    steps: int | None
    state: str
    n_evals: int
    planned_steps: int | None
    fid_extractor: str | None
    min_fid: float | None
    final_f_mem: float | None
    fid_first: float | None
    tau_gen: Estimate
    tau_mem: Estimate
    tau_gap: Estimate
    tau_gen_bracket: tuple[int, int] | None = None  # evaluated steps around tau_gen's crossing
    levels: dict[str, Estimate] = field(default_factory=dict)  # level_name(L) -> the crossing of f_mem level L
    tau_mem_n_samples: int | None = None  # samples of the evaluation at which tau_mem's onset was detected
    data_source: str | None = None  # data.source
    image_size: int | None = None  # data.image_size (pixels)
    optimizer: str | None = None  # train.optimizer
    lr: float | None = None  # train.lr
    train_s: float | None = None  # seconds of training steps (RunCost)
    eval_s: float | None = None  # seconds of evaluations (RunCost)
    signals: RunSignals | None = None  # the sampling-free signals (diffmem.analysis.signals); None without the keys
    gap_sizes: GapSizes | None = None  # the gap as an effect size per level (diffmem.analysis.gap_sizes)

    def estimate(self, quantity: str) -> Estimate:
        """A timescale by name: tau_gen, tau_mem, tau_gap, tau_mem_epochs, a level crossing (tau_mem_at_L), or a
        sampling-free signal or lag (tau_auc, tau_gap_first, auc_lag, ...: diffmem.analysis.signals)."""
        if quantity in self.levels:
            return self.levels[quantity]
        if self.gap_sizes is not None and (found := self.gap_sizes.estimate(quantity)) is not None:
            return found
        if (found := signal_estimate(self.signals, quantity)) is not None:
            return found
        if quantity.startswith("tau_mem_at_"):
            return Estimate(None, None, None, False, f"f_mem level {quantity[11:]} is not in this run's "
                                                     "eval.mem_levels")
        return getattr(self, quantity)

    def row(self) -> dict[str, Any]:
        """The summary.csv row (keys = :data:`SUMMARY_COLUMNS` and the level columns; the seed columns are added
        across runs by :func:`seed_columns`)."""
        level_cells = {}
        for name, est in self.levels.items():
            level_cells.update(level_cells_of(name, est))
        return {**level_cells, "tau_mem_n_samples": self.tau_mem_n_samples,
            "run": self.run, "n": self.n, "width": self.width, "params": self.params, "seed": self.seed,
            "steps": self.steps,
            "tau_gen": self.tau_gen.value, "tau_gen_lo": self.tau_gen.lo, "tau_gen_hi": self.tau_gen.hi,
            "tau_mem": self.tau_mem.value, "tau_mem_lo": self.tau_mem.lo, "tau_mem_hi": self.tau_mem.hi,
            "tau_mem_censored": self.tau_mem.censored,
            "tau_gap": self.tau_gap.value, "min_fid": self.min_fid, "final_f_mem": self.final_f_mem,
            "state": self.state, "fid_extractor": self.fid_extractor,
            "tau_gen_censored": self.tau_gen.censored, "tau_gap_censored": self.tau_gap.censored,
            "n_evals": self.n_evals, "planned_steps": self.planned_steps,
            "batch": self.batch, "tau_mem_epochs": self.tau_mem_epochs.value, "tau_mem_epochs_lo": self.tau_mem_epochs.lo,
            "tau_mem_epochs_hi": self.tau_mem_epochs.hi, "tau_gen_epochs": self.tau_gen_epochs.value,
            "fid_first": self.fid_first, "fid_plateau_noise": self.tau_gen.noise,
            "fid_noise_to_fall": self.fid_noise_to_fall,
            "tau_gen_bracket_lo": self.tau_gen_bracket[0] if self.tau_gen_bracket else None,
            "tau_gen_bracket_hi": self.tau_gen_bracket[1] if self.tau_gen_bracket else None,
            "data_source": self.data_source, "image_size": self.image_size, "optimizer": self.optimizer,
            "lr": self.lr, "train_s": _rounded(self.train_s), "eval_s": _rounded(self.eval_s),
            **(self.signals.row() if self.signals is not None else {}),
            **(self.gap_sizes.row() if self.gap_sizes is not None else {}),
        }


    @property
    def fid_noise_to_fall(self) -> float | None:
        """The plateau's noise over the quality curve's fall from the first evaluation to its lowest value."""
        if self.tau_gen.noise is None or self.fid_first is None or self.min_fid is None:
            return None
        fall = self.fid_first - self.min_fid
        return self.tau_gen.noise / fall if fall > 0 else None

    def _in_epochs(self, est: Estimate) -> Estimate:
        """The same estimate in epochs (passes over the train set): steps x batch / n."""
        f = self.batch / self.n
        scale = lambda v: None if v is None else v * f  # noqa: E731
        return Estimate(scale(est.value), scale(est.lo), scale(est.hi), est.censored, f"{est.rule}; x batch / n",
                        est.level, est.noise, None if est.bracket is None else (scale(est.bracket[0]),
                                                                                 scale(est.bracket[1])))

    @property
    def tau_mem_epochs(self) -> Estimate:
        return self._in_epochs(self.tau_mem)

    @property
    def tau_gen_epochs(self) -> Estimate:
        return self._in_epochs(self.tau_gen)


@dataclass(frozen=True)
class PairSummary:
    """One split pair as the analysis sees it: ``run`` is the pair's id (its split-0 run's name; the fits take a
    pair as one point, as they take a run), ``members`` its two runs, its N, W and training seed, its paired
    evaluations and tau_bias (optimizer steps)."""

    run: str
    members: tuple[str, str]
    n: int
    width: int
    seed: int
    n_evals: int
    tau_bias: Estimate
    levels: dict[str, Estimate] = field(default_factory=dict)  # tau_bias_at_L per level L of eval.bias_levels
    control: ControlReading | None = None  # tau_bias's rule on the control bias (pairs.jsonl control_bias_*)
    level_controls: dict[str, ControlReading] = field(default_factory=dict)  # per level: the control bias reaches L?

    @property
    def flag(self) -> str:
        """Why the pair's tau_bias is flagged ('' when its control held its null or it has none)."""
        return self.control.flag("tau_bias (the control bias)") if self.control is not None else ""

    def flag_of(self, quantity: str) -> str:
        """Why ``quantity`` is flagged: tau_bias when the control bias left 0 by tau_bias's rule; a level crossing
        tau_bias_at_L when the control bias itself reaches L (either sign) by the crossing's rule: a size the
        blocks alone give is not the models'. '' when not flagged."""
        if quantity == "tau_bias":
            return self.flag
        control = self.level_controls.get(quantity)
        return control.flag(f"{quantity} (the control bias reaches the level)") if control is not None else ""

    def estimate(self, quantity: str) -> Estimate:
        """tau_bias or one of its level crossings by name (a pair has no other timescale); no value, naming the
        flag, when its control flags it (:meth:`flag_of`)."""
        if flag := self.flag_of(quantity):
            return Estimate(None, None, None, False, f"flagged, left out: {flag}")
        if quantity == "tau_bias":
            return self.tau_bias
        if quantity in self.levels:
            return self.levels[quantity]
        return Estimate(None, None, None, False, f"a split pair has tau_bias and its level crossings, not {quantity}")

    def row(self) -> dict[str, Any]:
        """The :data:`PAIR_COLUMNS` and bias-level cells of both members' summary.csv rows."""
        e = self.tau_bias
        cells = {"pair": self.run, "tau_bias": e.value, "tau_bias_lo": e.lo, "tau_bias_hi": e.hi,
                 "tau_bias_censored": e.censored, "pair_evals": self.n_evals,
                 "tau_bias_control": self.control.left if self.control is not None else None,
                 "tau_bias_flag": self.flag if self.control is not None else None}
        for name, est in self.levels.items():
            cells |= level_cells_of(name, est)
            cells[f"{name}_flag"] = self.flag_of(name) if self.control is not None else None
        return cells


def summarize_pairs(lines_by_pair: dict[str, list[dict[str, Any]]],
                    bias_levels: Mapping[str, Sequence[float]] | None = None) -> tuple[PairSummary, ...]:
    """tau_bias and its level crossings of every split pair from its pairs.jsonl lines
    (:func:`diffmem.analysis.runfiles.read_pairs`: one per step, sorted); a pair whose lines the estimator refuses
    gets no value, with a warning. ``bias_levels``: each pair's levels (its split-0 run's ``eval.bias_levels``), by
    the pair's id; a pair not in it gets the default's."""
    out = []
    for pair, lines in lines_by_pair.items():
        if not lines:
            continue
        first = lines[0]
        steps = [float(r["step"]) for r in lines]
        bias, bias_lo, bias_hi = ([r.get(k) for r in lines] for k in ("bias", "bias_lo", "bias_hi"))
        levels = (bias_levels or {}).get(pair, EvalConfig.bias_levels)
        control, level_controls = None, {}
        try:
            est = timescales.tau_bias(steps, bias_lo)
            crossings = {level_name(v, "tau_bias"): timescales.tau_bias_level(steps, bias, bias_lo, bias_hi, v)
                         for v in levels}
            if any(r.get("control_bias_lo") is not None for r in lines):  # lines written before it have none
                c, c_lo, c_hi = ([r.get(k) for r in lines] for k in ("control_bias", "control_bias_lo",
                                                                       "control_bias_hi"))
                neg = lambda values: [None if v is None else -v for v in values]  # noqa: E731
                control = ControlReading(timescales.tau_bias(steps, c_lo), timescales.tau_bias(steps, neg(c_hi)))
                level_controls = {level_name(v, "tau_bias"): ControlReading(
                    timescales.tau_bias_level(steps, c, c_lo, c_hi, v),
                    timescales.tau_bias_level(steps, neg(c), neg(c_hi), neg(c_lo), v)) for v in levels}
        except TimescaleInputError as e:
            warnings.warn(f"pair {pair}: tau_bias not estimated: {e}", stacklevel=2)
            est, crossings = Estimate(None, None, None, False, str(e)), {}
        out.append(PairSummary(pair, (str(first.get("run_a")), str(first.get("run_b"))), int(first["n"]),
                               int(first["width"]), int(first["seed_train"]), len(lines), est, crossings, control,
                               level_controls))
    return tuple(out)


def kept_pairs(pairs: Sequence[PairSummary], runs: Sequence[RunSummary],
               experiment_dir: str | Path) -> tuple[PairSummary, ...]:
    """The pairs whose two runs are both among ``runs``; each other pair is left out with a warning (its runs were
    moved out of the experiment folder, e.g. into an experiment of their own)."""
    names = {r.run for r in runs}
    kept = []
    for p in pairs:
        if set(p.members) <= names:
            kept.append(p)
        else:
            warnings.warn(f"pair {p.run}: its runs {' and '.join(p.members)} are not both in {experiment_dir}; left "
                          "out of the analysis", stacklevel=2)
    return tuple(kept)


def seed_columns(runs: Sequence[RunSummary]) -> dict[str, dict[str, Any]]:
    """Per run name, the seed columns of its cell (the runs with the same n and width): ``seeds_in_cell``, and for
    tau_gen and tau_mem the geometric mean and geometric standard deviation over the cell's measured runs."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        cell = [o for o in runs if o.n == r.n and o.width == r.width]
        row: dict[str, Any] = {"seeds_in_cell": len(cell)}
        for q in ("tau_gen", "tau_mem"):
            values = np.log([getattr(o, q).value for o in cell if getattr(o, q).measured])
            row[f"{q}_seed_gmean"] = float(np.exp(values.mean())) if values.size else None
            row[f"{q}_seed_gsd"] = float(np.exp(values.std(ddof=1))) if values.size >= 2 else None
        out[r.run] = row
    return out


def _scheduled(record: RunRecord) -> set[int] | None:
    """The steps of a run's evaluation grid (every budget it had), None when its config.json cannot say."""
    try:
        stored = RunDir(record.path).read_config()
    except ValueError:
        return None
    return set(stored.scheduled_steps()) if stored is not None else None


def summarize_run(record: RunRecord) -> RunSummary:
    """Estimate tau_gen, tau_mem and tau_gap of one run from its metrics (rules: :mod:`diffmem.analysis.timescales`)."""
    steps = record.steps
    f_mem = record.series("f_mem")
    fid = record.series("fid")
    names = ("tau_mem", "tau_gen", "tau_gap") + tuple(level_name(v) for v in record.mem_levels)
    try:
        estimates = timescales.estimate_run(record.evaluations, mem_levels=record.mem_levels)
    except TimescaleInputError as e:  # bad per-run data: missing estimates with a warning, not a failed analysis
        warnings.warn(f"run {record.name}: timescales not estimated: {e}", stacklevel=2)
        estimates = {name: Estimate(None, None, None, False, str(e)) for name in names}
    tau_mem, tau_gen, tau_gap = estimates["tau_mem"], estimates["tau_gen"], estimates["tau_gap"]
    finite_fid = fid[np.isfinite(fid)]
    finite_f = f_mem[np.isfinite(f_mem)]
    return RunSummary(
        run=record.name, n=record.n, width=record.width, params=record.params, seed=record.seed, batch=record.batch,
        steps=int(steps[-1]) if steps.size else None, state=record.state, n_evals=int(steps.size),
        planned_steps=record.planned_steps, fid_extractor=record.last_value("fid_extractor"),
        min_fid=float(finite_fid.min()) if finite_fid.size else None,
        final_f_mem=float(finite_f[-1]) if finite_f.size else None,
        fid_first=float(finite_fid[0]) if finite_fid.size else None,
        tau_gen=tau_gen, tau_mem=tau_mem, tau_gap=tau_gap,
        tau_gen_bracket=None if tau_gen.bracket is None else (int(tau_gen.bracket[0]), int(tau_gen.bracket[1])),
        levels={level_name(v): estimates[level_name(v)] for v in record.mem_levels},
        tau_mem_n_samples=_onset_samples(record.evaluations, tau_mem),
        data_source=record.config.data.source, image_size=record.config.data.image_size,
        optimizer=record.config.train.optimizer, lr=record.config.train.lr,
        train_s=record.cost.train_s, eval_s=record.cost.eval_s,
        signals=run_signals(record.evaluations, estimates, record.name),
        gap_sizes=run_gap_sizes(record.evaluations, record.config.eval.gap_sizes, tau_gap, _scheduled(record)),
    )


def _onset_samples(records: Sequence[dict[str, Any]], est: Estimate) -> int | None:
    """n_samples of the evaluation at which a measured tau_mem onset was detected (its bracket's upper end)."""
    if not est.measured:
        return None
    for r in records:
        if float(r["step"]) == est.hi:
            return r.get("n_samples")
    return None


# --- power-law fits -------------------------------------------------------------------------------------------------

def _split(runs: Sequence[RunSummary], quantity: str, x_of) -> tuple[list, list, list, dict]:
    """(points, censored, excluded, brackets) of ``quantity`` for the fits: points (run, x, value, lo, hi) with the
    run's interval, and the runs whose bracket is narrower than it (``Estimate.bracket``)."""
    points, censored, excluded, brackets = [], [], [], {}
    for r in runs:
        est = r.estimate(quantity)
        x = x_of(r)
        if est.value is None:
            excluded.append((r.run, est.rule))
        elif est.censored and est.hi is None:
            censored.append((r.run, x, est.value))
        elif est.censored:  # an upper bound: the event happened before the first evaluation
            excluded.append((r.run, f"upper bound only: {est.rule}"))
        else:
            points.append((r.run, x, est.value, est.lo, est.hi))
            if est.bracket is not None:
                brackets[r.run] = est.bracket
    return points, censored, excluded, brackets


def _fit(runs, quantity, x_name, x_of) -> PowerLawFit:
    points, censored, excluded, brackets = _split(runs, quantity, x_of)
    return fit_power_law(quantity, x_name, points, censored=censored, excluded=excluded, brackets=brackets)


def _fit_joint(runs, quantity) -> JointLawFit:
    points, censored, excluded, brackets = _split(runs, quantity, lambda r: (float(r.n), float(r.width)))
    return fit_joint_law(quantity, ("n", "width"), points, censored=censored, excluded=excluded, brackets=brackets)


def _n_of(r) -> float:
    return float(r.n)


def _width_of(r) -> float:
    return float(r.width)


def _by(runs, key: str, quantity: str, x_name: str, x_of) -> dict[str, PowerLawFit]:
    """One fit per value of ``key`` (the runs sharing it)."""
    values = sorted({getattr(r, key) for r in runs})
    return {str(v): _fit([r for r in runs if getattr(r, key) == v], quantity, x_name, x_of) for v in values}


def _law_set(runs, quantity: str, x_name: str, x_of, key: str) -> FitSet:
    """``quantity`` against ``x_name`` per value of ``key`` (the other varied setting), and over all runs only when
    they agree on ``key``: over runs that differ in it the law would mix the two settings' effects (in an uneven grid
    such as N = 32..256 at W = 8 plus W = 16, 32 at N = 64 its exponent depends on how the grid is laid out), so it is
    not fitted and its reason names the laws to read instead. A law that no x variation allows keeps its own reason."""
    groups = _by(runs, key, quantity, x_name, x_of)
    over_all = _fit(runs, quantity, x_name, x_of)
    if over_all.fitted and len(groups) > 1:
        over_all = PowerLawFit(quantity, x_name, points=(), reason=(
            f"the runs differ in {key} ({', '.join(groups)}): a law in {x_name} over all of them would mix the "
            f"effects of {x_name} and {key}; the laws over runs of one {key} are in by_{key}, and a joint law of "
            "n and width (where fitted) covers the whole grid"))
    return FitSet(over_all, groups, key)


def _vs_n(runs, quantity: str) -> FitSet:
    """``quantity`` against N, per width (over all runs when there is one width)."""
    return _law_set(runs, quantity, "n", _n_of, "width")


def _vs_width(runs, quantity: str) -> FitSet:
    """``quantity`` against W, per N (over all runs when there is one N)."""
    return _law_set(runs, quantity, "width", _width_of, "n")


def fit_all(runs: Sequence[RunSummary]) -> dict[str, FitSet]:
    """The laws of one variable in fits.json (see the module docstring), per group of comparable runs."""
    fits = {
        "tau_mem_vs_n": _vs_n(runs, "tau_mem"),
        "tau_gen_vs_n": _vs_n(runs, "tau_gen"),
        "tau_gen_vs_width": _vs_width(runs, "tau_gen"),
        "tau_mem_vs_n_over_width": FitSet(_fit(runs, "tau_mem", "n_over_width", lambda r: r.n / r.width)),
        "tau_mem_epochs_vs_n": _vs_n(runs, "tau_mem_epochs"),
        "tau_mem_vs_width": _vs_width(runs, "tau_mem"),
    }
    for name in sorted({name for r in runs for name in r.levels}, key=level_of):
        fits[f"{name}_vs_n"] = _vs_n(runs, name)
        fits[f"{name}_vs_width"] = _vs_width(runs, name)
    for name in signal_quantities(runs) + gap_size_quantities(runs):  # runs that record the per-level losses
        fits[f"{name}_vs_n"] = _vs_n(runs, name)
        if len({r.width for r in runs}) > 1:
            fits[f"{name}_vs_width"] = _vs_width(runs, name)
    return fits


def fit_pairs(pairs: Sequence[PairSummary]) -> tuple[dict[str, FitSet], dict[str, JointLawFit]]:
    """tau_bias's laws, one point per split pair, by the method of tau_mem's: ``tau_bias_vs_n`` (``by_width``),
    ``tau_bias_vs_width`` (``by_n``) and the joint ``tau_bias_vs_n_and_width``."""
    fits = {"tau_bias_vs_n": _vs_n(pairs, "tau_bias"), "tau_bias_vs_width": _vs_width(pairs, "tau_bias")}
    for name in sorted({name for p in pairs for name in p.levels}, key=level_of):
        fits[f"{name}_vs_n"] = _vs_n(pairs, name)
        fits[f"{name}_vs_width"] = _vs_width(pairs, name)
    return fits, {"tau_bias_vs_n_and_width": _fit_joint(pairs, "tau_bias")}


def fit_joint(runs: Sequence[RunSummary]) -> dict[str, JointLawFit]:
    """The laws of N and W together, tau ~ N^a W^b (not fitted, with the reason, unless both vary)."""
    return {f"{q}_vs_n_and_width": _fit_joint(runs, q) for q in ("tau_mem", "tau_gen")}


def sample_count_note(runs: Sequence[RunSummary]) -> str | None:
    """A warning when tau_mem's onsets were detected with different sample counts (more samples detect copies
    earlier, so such onsets measure different quantities); None when they agree."""
    counts = sorted({r.tau_mem_n_samples for r in runs if r.tau_mem_n_samples is not None})
    if len(counts) < 2:
        return None
    return (f"tau_mem's onsets were detected with {', '.join(map(str, counts))} samples per evaluation: the onset "
            "depends on the sample count, so these runs measure different quantities; compare the level crossings "
            "(tau_mem_at_*) instead")


# --- the whole experiment -------------------------------------------------------------------------------------------

# Config keys on which the runs of one experiment may differ: the grid's axes and the budget, where the same images
# are and which of them, how densely and with how many samples the runs are evaluated, and how they execute
# (EXECUTION_KEYS) or are analyzed (ANALYSIS_KEYS). Every other key changes what a run trains or measures (the data
# source, the image size, the model beyond its width, the diffusion, the optimizer and its lr, the sampler, the
# memorization rule, ...), so runs that differ in one have timescales that no law can join: analyze refuses them.
MAY_DIFFER = frozenset({
    "data.n", "model.width", "train.seed", "train.steps",
    "data.path", "data.cache_dir", "data.subset_index", "data.n_heldout",
    "eval.times", "eval.n_samples", "eval.n_boot", "eval.seed", "eval.fid", "eval.fid_n_reference",
    "eval.fid_reference_sets", "eval.fid_boot", "eval.loss_noise_draws", "eval.loss_n_test", "eval.checkpoint_ratio",
    "eval.refine_ratio", "eval.refine_n_samples", "eval.stop_f_mem",
}) | EXECUTION_KEYS | ANALYSIS_KEYS


class IncomparableRuns(RunFolderError):
    """The runs of an experiment differ in a key that makes their timescales incomparable."""


def incomparable_keys(records: Sequence[RunRecord]) -> list[str]:
    """``"key (value in run, other value in other run)"`` for every config key outside :data:`MAY_DIFFER` on which
    the runs disagree (the first run showing each value); [] when they can be analyzed together."""
    flat = [(r.name, {f"{section}.{key}": json.dumps(value) for section, values in r.config.to_dict().items()
                      for key, value in values.items()}) for r in records]
    out = []
    for key in flat[0][1] if flat else {}:
        if key in MAY_DIFFER:
            continue
        first: dict[str, str] = {}
        for name, values in flat:
            first.setdefault(values[key], name)
        if len(first) > 1:
            out.append(f"{key} ({', '.join(f'{value} in {name}' for value, name in first.items())})")
    return out


def check_comparable(experiment_dir: str | Path, records: Sequence[RunRecord]) -> None:
    """Raise IncomparableRuns (one line) when the runs differ in a key outside :data:`MAY_DIFFER`, before anything
    is written."""
    differ = incomparable_keys(records)
    if differ:
        more = f" and {len(differ) - 2} more key(s)" if len(differ) > 2 else ""
        raise IncomparableRuns(f"the runs of {experiment_dir} differ in {' and '.join(differ[:2])}{more}: their "
                               "timescales are not comparable, so no law can be fitted across them; move the runs of "
                               "each kind into their own experiment folder and analyze each")

@dataclass(frozen=True)
class Summary:
    """What `diffmem analyze` produced: per-run rows, fits and the files written."""

    experiment_dir: Path
    runs: tuple[RunSummary, ...]
    fits: dict[str, FitSet]
    summary_csv: Path
    fits_json: Path
    figures: tuple[Any, ...] = ()  # diffmem.plots.FigureResult per figure (written or skipped): write_results
    joint: dict[str, JointLawFit] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    report: Path | None = None  # report.md (diffmem.analysis.report), written by write_results
    pairs: tuple[PairSummary, ...] = ()  # split pairs (pairs.jsonl), with tau_bias

    def format(self) -> str:
        """Human text: one line per run, the seed cells (when there are seeds), one line per fitted law over
        comparable runs (:meth:`FitSet.laws`) with the runs it covers and its goodness of fit (a law none of whose
        groups is fitted: one line with the reason; report.md lists every law not fitted), the notes, the files
        written."""
        lines = [f"{len(self.runs)} run(s) in {self.experiment_dir}"]
        for r in self.runs:
            def show(e: Estimate) -> str:
                if e.value is None:
                    return "-"
                text = f"{e.value:.3g}"
                return (">" + text if e.hi is None else "<" + text) if e.censored else text
            steps = str(r.steps) if r.steps is not None else "-"
            levels = "".join(f" {k[8:]}={show(e)}" for k, e in r.levels.items())
            lines.append(f"  {r.run:<24} N={r.n:<6} W={r.width:<4} {r.state:<7} steps={steps:<9} "
                         f"tau_gen={show(r.tau_gen):<9} tau_mem={show(r.tau_mem):<9} tau_gap={show(r.tau_gap)}"
                         + levels)
        cells = seed_columns(self.runs)
        if any(c["seeds_in_cell"] > 1 for c in cells.values()):
            lines.append("  seeds per cell (geometric mean x/ geometric sd over measured seeds):")
            seen = set()
            for r in self.runs:
                if (r.n, r.width) in seen:
                    continue
                seen.add((r.n, r.width))
                c = cells[r.run]
                text = "  ".join(f"{q}={c[f'{q}_seed_gmean']:.4g}" + (f" x/ {c[f'{q}_seed_gsd']:.3f}"
                                                                       if c[f"{q}_seed_gsd"] else "")
                                 for q in ("tau_gen", "tau_mem") if c[f"{q}_seed_gmean"] is not None)
                lines.append(f"    N={r.n:<6} W={r.width:<4} {c['seeds_in_cell']} seeds  {text}")
        for p in self.pairs:
            lines.append(f"  pair {p.run:<19} N={p.n:<6} W={p.width:<4} {p.n_evals} paired evaluations  "
                         f"tau_bias={show(p.tau_bias)}"
                         + "".join(f"  {name}={show(est)}" for name, est in p.levels.items()))
        for name, fs in self.fits.items():
            shown = [(label, fit) for label, fit in fs.laws() if fit.fitted] or fs.laws()[:1]
            lines += [f"  {name} ({label}): {fit.describe()}" for label, fit in shown]
        for name, fit in self.joint.items():
            lines.append(f"  {name}: {fit.describe()}")
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"wrote {self.summary_csv}, {self.fits_json}" + (f" and {self.report}" if self.report else ""))
        for fig in self.figures:
            if fig.skipped:
                lines.append(f"  skipped {fig.name}: {fig.skipped}")
            else:
                lines.append(f"  figure {fig.name}: " + ", ".join(p.name for p in fig.files))
        return "\n".join(lines)


def only_n_samples(record: RunRecord, n_samples: int) -> RunRecord:
    """The run with only its evaluations that drew ``n_samples`` samples (e.g. the grid's, leaving out refinement
    evaluations made with more)."""
    kept = tuple(e for e in record.evaluations if e.get("n_samples") == n_samples)
    return dataclasses.replace(record, evaluations=kept)


def require_sample_count(experiment_dir: Path, records: Sequence[RunRecord], n_samples: int) -> None:
    """Raise RunFolderError (one line listing the sample counts recorded) when no evaluation of ``records`` drew
    ``n_samples`` samples: the analysis would overwrite summary.csv and fits.json with every timescale empty."""
    counts = sorted({e.get("n_samples") for r in records for e in r.evaluations} - {None})
    if n_samples not in counts:
        present = ", ".join(str(c) for c in counts) or "none"
        raise RunFolderError(f"--n-samples {n_samples}: no evaluation in {experiment_dir} drew {n_samples} samples "
                             f"(the sample counts recorded: {present}); pass one of those, nothing was written")


def analyze(experiment_dir: str | Path, *, out_dir: str | Path | None = None,
            n_samples: int | None = None) -> Summary:
    """Read every run folder of ``experiment_dir`` (or the run folder itself) and write summary.csv and fits.json
    into ``out_dir`` (default: ``experiment_dir``; atomically). It computes and draws nothing: the figures and the
    report page come after it, from these files (:func:`diffmem.results.write_results`, `diffmem analyze`).
    ``n_samples``: use only the evaluations that drew that many samples (to compare sample counts; write those files
    elsewhere with ``out_dir``).

    Split pairs: ``experiment_dir/pairs.jsonl`` (`diffmem pairs`), when present, adds each pair's tau_bias to its
    members' rows and tau_bias's laws to fits.json (``n_samples`` keeps only its lines with that many samples).

    Works on partial experiments (runs still training are summarized from the evaluations they have). Refuses
    (IncomparableRuns, nothing written) runs that differ in a key outside :data:`MAY_DIFFER`, e.g. the data source
    or the image size."""
    experiment_dir = Path(experiment_dir)
    target = experiment_dir if out_dir is None else Path(out_dir)
    if out_dir is not None and not target.is_dir():
        raise RunFolderError(f"--out '{target}' is not a folder; create it first (summary.csv and fits.json go there)")
    for name in ANALYSIS_OUTPUTS:  # nothing is written, replaced or deleted through a link: refused before any work
        contained(target, target / name)
    records = read_experiment(experiment_dir)
    check_comparable(experiment_dir, records)
    if n_samples is not None:
        require_sample_count(experiment_dir, records, n_samples)
        records = [only_n_samples(r, n_samples) for r in records]
    existing = [name for name in ("summary.csv", "fits.json") if (target / name).exists()]
    if existing and not any(r.evaluations for r in records):
        raise RunFolderError(f"no run of {experiment_dir} has an evaluation (every metrics.jsonl is missing or "
                             f"empty), so the analysis would overwrite {target / existing[0]} with empty results; "
                             "nothing was written: restore the metrics.jsonl files, or evaluate the runs "
                             "(`diffmem evaluate RUN`) first")
    runs = tuple(summarize_run(r) for r in records)
    pair_lines = read_pairs(experiment_dir, {r.name: r.config.train.steps for r in records})
    if n_samples is not None:
        pair_lines = {p: [line for line in lines if line.get("n_samples") == n_samples]
                      for p, lines in pair_lines.items()}
    pairs = kept_pairs(summarize_pairs(pair_lines, {r.name: r.config.eval.bias_levels for r in records}), runs,
                       experiment_dir)
    fits = fit_all(runs)
    joint = fit_joint(runs)
    if pairs:
        pair_fits, pair_joint = fit_pairs(pairs)
        fits |= pair_fits
        joint |= pair_joint
    pair_cells = {member: p.row() for p in pairs for member in p.members}
    notes = tuple(n for n in (sample_count_note(runs),) if n)
    levels = sorted({level_of(k) for r in runs for k in r.levels})
    bias_levels = sorted({level_of(k) for p in pairs for k in p.levels})
    seeds = seed_columns(runs)
    images = analyze_images(records, target, n_samples)  # issue 43: images/ and its columns, when runs have copies
    blind, blind_sets = experiment_baselines(records)  # issue 59: the data alone, for runs with images.json
    fitted = analyze_fit_order(records, target)  # issue 60: which images are fitted first, from image_losses.jsonl
    copy_rules = analyze_copy_rules(records, n_samples) if images.section else None  # the order under each rule
    summary_csv = write_csv(target / "summary.csv",
                            SUMMARY_COLUMNS + tuple(level_columns(levels))
                            + (SIGNAL_COLUMNS if any(r.signals for r in runs) else ())
                            + tuple(gap_size_columns(sorted({v for rec in records for v in rec.config.eval.gap_sizes}),
                                                     sorted({t for r in records for t in recorded_levels(r.evaluations)}))
                                    if any(r.gap_sizes for r in runs) else ())
                            + ((*PAIR_COLUMNS, *level_columns(bias_levels, "tau_bias"),
                                *(f"{level_name(v, 'tau_bias')}_flag" for v in bias_levels)) if pairs else ())
                            + (SUMMARY_IMAGE_COLUMNS if images.section else ())
                            + (SUMMARY_FIT_COLUMNS if fitted.section else ())
                            + (BLIND_COLUMNS if blind else ()),
                            ({**r.row(), **seeds[r.run], **pair_cells.get(r.run, {}), **images.summary.get(r.run, {}),
                              **fitted.summary.get(r.run, {}), **(blind[r.run].row() if r.run in blind else {})}
                             for r in runs))
    censored = {q: [r.run for r in runs if getattr(r, q).censored] for q in ("tau_mem", "tau_gen")}
    if pairs:
        censored["tau_bias"] = [p.run for p in pairs if p.tau_bias.censored]
    fits_json = write_json(target / "fits.json", {
        "diffmem_version": __version__,
        "method_name": FIT_METHOD, "method": FIT_METHOD_TEXT, "ci": 0.95,
        "only_n_samples": n_samples,
        "notes": list(notes),
        "censored_runs": censored,
        **{name: fs.to_dict() for name, fs in fits.items()},
        **{name: fit.to_dict() for name, fit in joint.items()},
        **({"calibration": c} if (c := calibration(runs, fits)) is not None else {}),
        **({"images": images.section} if images.section else {}),
        **({"fit_order": fitted.section} if fitted.section else {}),
        **({"copy_rules": copy_rules} if copy_rules else {}),
        **({"blind_baseline": {"method": BLIND_METHOD, "sets": blind_sets}} if blind_sets else {}),
    })
    return Summary(experiment_dir, runs, fits, summary_csv, fits_json, (), joint, notes, None, pairs)
