"""The coverage study of the fit interval (`diffmem coverage`): how often a 95 % interval for an exponent holds the
exponent that was planted, over many simulated experiments evaluated the way sweeps really are.

One simulated experiment (:func:`simulate_experiment`): ``n_x`` values of x doubling from 16; at each, ``seeds`` runs
whose true ``tau = tau0 * (x / 16) ** exponent * exp(scatter * e)`` with ``e`` standard normal (log-normal run-to-run
scatter; ``scatter`` is the standard deviation of ``ln tau``, 0.05 ~ 5 %). Each tau is then *reported* the way the
suite reports tau_mem: as the bracket of consecutive evaluation steps that contains it, with the bracket's
log-midpoint as the value. The evaluation grid (``Setting.grid``) is one of

- ``"independent"``: a log-spaced grid with ratio ``grid_ratio`` whose phase is drawn per x and shared by the seeds
  of that x (the study of diffmem <= 0.4); tau0 = 1000;
- ``"shared"``: the same grid with one phase for the whole experiment: every N evaluated at the same steps;
- ``"paper"``: the official code's 45 checkpoints (``eval.times = "paper"``) with one budget for every N, tau0 drawn
  log-uniformly per experiment so that every tau lies between 2000 steps and half the last checkpoint;
- ``"suite"``: the suite's own rule, ``eval.times = 30`` log-spaced steps up to a budget that grows with N,
  ``max(8000, 300 N)`` (experiments/cpu_digits.toml), tau0 drawn log-uniformly in [200, 2000] per experiment;

each without refinement or (``refined``) refined the way ``eval.refine_ratio`` refines a run after training: kept
checkpoints at most ``refine_ratio`` apart (:func:`diffmem.eval_grid.kept_steps`; every step for the continuous
grids), the one nearest the bracket's log-midpoint evaluated until the bracket is at most ``refine_ratio`` wide
(:func:`diffmem.eval_grid.nearest_log_midpoint`).

Per setting the study fits every simulated experiment with :func:`diffmem.analysis.powerlaw.fit_power_law`'s
computation and reports its coverage (the fraction of experiments whose interval holds the planted exponent) and
median width, beside the plain t interval of diffmem <= 0.4 (:func:`previous_t_interval`: Student t on the residual
scatter alone) on the same draws, and, on the independent grid, the false-alarm rates of the goodness of fit under
the (true) power law: how often the lack-of-fit test rejects at the 5 % level where seeds make it possible, and how
often the outlier test names a cell (both should be at most about 5 %). Each setting's coverage is also read over only
the experiments whose every planted tau (without scatter) lies in a bracket small against the scatter
(:func:`fine_against_scatter`): on the paper's checkpoints, coarse below 10^4 steps and fine above, one setting
holds both kinds.

Each study ends with the checks against issue #39's targets (:func:`target_checks`) and re-runs every row above the
width target with its planted exponent shifted by a little (:func:`around_wide_rows`): whether the plain t covered
a row is a property of the grid, the design and the scatter only if it still covers there.

The joint law ``tau = tau0 N^a W^b`` (:func:`run_joint_setting`) and the level-crossing laws
(:func:`run_level_setting`: planted f_mem curves read by the suite's own ``tau_mem_level``) have studies of their
own, on the same grids.
"""
from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from diffmem.analysis.cellfit import (RunBrackets, bracket_variances, cell_index, cell_least_squares,
                                      law_least_squares, make_cells)
from diffmem.analysis.goodness import lack_of_fit, leave_one_out
from diffmem.analysis.timescales import Estimate, binomial_interval, tau_mem_level
from diffmem.eval_grid import evaluation_steps, kept_steps, nearest_log_midpoint

EXPONENTS: tuple[float, ...] = (0.0, 0.5, 1.0)
N_XS: tuple[int, ...] = (3, 4, 6, 9)
SEEDS: tuple[int, ...] = (1, 3)
SCATTERS: tuple[float, ...] = (0.05, 0.15, 0.30)
GRIDS: tuple[str, ...] = ("independent", "shared", "paper", "suite")
SUITE_TIMES, SUITE_STEPS_PER_N, SUITE_MIN_STEPS = 30, 300, 8000
"""The suite's rule as experiments/cpu_digits.toml sets it: 30 log-spaced evaluations up to max(8000, 300 N)."""


@dataclass(frozen=True)
class Setting:
    """One cell of the study: planted exponent, number of x values, seeds per x, log-normal scatter (sd of ln tau),
    the evaluation grid (:data:`GRIDS`), whether brackets are refined, the continuous grids' ratio and the ratio
    refinement stops at."""

    exponent: float
    n_x: int
    seeds: int
    scatter: float
    grid: str = "independent"
    refined: bool = False
    grid_ratio: float = 1.2
    refine_ratio: float = 1.1


@dataclass(frozen=True)
class SettingResult:
    """Coverage (fraction in [0, 1]) and median interval width (exponent units) of the fit's interval and of the
    previous plain t interval over ``n_sim`` experiments; ``lof_rejection``: fraction in which the lack-of-fit test
    rejected at 5 % (None without seeds); ``outlier_flags``: fraction in which the outlier test named a cell (None
    with 3 x values: no test)."""

    setting: Setting
    n_sim: int
    coverage: float
    width: float
    coverage_previous: float
    width_previous: float
    lof_rejection: float | None
    outlier_flags: float | None = None
    bracket_sd: float | None = None
    """The median over experiments of the runs' median bracket standard deviation (log10; ``(log10 hi/lo) /
    sqrt(12)``): what "scatter large against the brackets" is measured against (:func:`target_checks`)."""
    coverage_fine: float | None = None
    """The coverage over only the experiments whose planted taus all lie where the grid is fine against the scatter
    (:func:`fine_against_scatter`; None when there is none), ..."""
    n_fine: int = 0
    """... and how many of the ``n_sim`` experiments those are."""


# --- the grids ------------------------------------------------------------------------------------------------------

def refine_bracket(tau: float, lo: float, hi: float, kept: np.ndarray, ratio: float) -> tuple[float, float]:
    """The bracket [lo, hi] of ``tau`` narrowed as ``eval.refine_ratio`` narrows it: while it is wider than
    ``ratio`` and holds a kept step (``kept``: ascending), the one nearest its log-midpoint is evaluated and the
    bracket keeps the side that holds tau."""
    while hi / lo > ratio:
        inside = kept[(kept > lo) & (kept < hi)]
        if inside.size == 0:
            break
        s = float(nearest_log_midpoint(inside.tolist(), lo, hi))
        lo, hi = (lo, s) if tau < s else (s, hi)
    return lo, hi


def continuous_brackets(ln_tau: np.ndarray, phase: np.ndarray, s: Setting) -> tuple[np.ndarray, np.ndarray]:
    """(ln lo, ln hi) of each tau on a log grid with ratio ``grid_ratio`` and the given phase (fraction of a step);
    refined: halved in log until at most ``refine_ratio`` wide (kept checkpoints at every step)."""
    step = math.log(s.grid_ratio)
    ln_lo = (np.floor(ln_tau / step - phase) + phase) * step
    ln_hi = ln_lo + step
    if s.refined:
        while step > math.log(s.refine_ratio) + 1e-12:
            mid = (ln_lo + ln_hi) / 2
            below = ln_tau < mid
            ln_lo, ln_hi = np.where(below, ln_lo, mid), np.where(below, mid, ln_hi)
            step /= 2
    return ln_lo, ln_hi


def grid_step(grid: np.ndarray, tau: float) -> tuple[float, float]:
    """The two consecutive steps of ``grid`` (ascending) around ``tau`` (the first or last step where it lies
    outside)."""
    j = int(np.clip(np.searchsorted(grid, tau, side="right"), 1, grid.size - 1))
    return float(grid[j - 1]), float(grid[j])


def step_brackets(tau: np.ndarray, grids: Sequence[np.ndarray], s: Setting) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of each tau among the steps of its run's grid (``grids[i]``: ascending evaluation steps of run i),
    refined among kept checkpoints when ``s.refined``."""
    lo, hi = np.empty(tau.size), np.empty(tau.size)
    for i, (t, grid) in enumerate(zip(tau, grids)):
        a, b = grid_step(grid, float(t))
        if s.refined:
            a, b = refine_bracket(float(t), a, b, kept_grid(grid, s.refine_ratio), s.refine_ratio)
        lo[i], hi[i] = a, b
    return lo, hi


def kept_grid(grid: np.ndarray, ratio: float) -> np.ndarray:
    """The steps a run evaluated on ``grid`` (ascending) keeps as checkpoints for refinement to ``ratio``, with the
    grid's own steps: ascending, as floats (:func:`diffmem.eval_grid.kept_steps`; cached per grid and ratio)."""
    return _kept_grid(tuple(int(v) for v in grid), ratio)


@lru_cache(maxsize=256)
def _kept_grid(steps: tuple[int, ...], ratio: float) -> np.ndarray:
    kept = np.array(sorted(set(kept_steps(list(steps), ratio)) | set(steps)), dtype=float)
    kept.flags.writeable = False
    return kept


def planted_taus(rng: np.random.Generator, s: Setting, xs: np.ndarray,
                 law: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(true taus, the law's taus without scatter) of runs at ``xs`` whose law relative to the first x is ``law``
    (shape of xs), with tau0 placed by the grid's rule (module docstring) and log-normal scatter."""
    span = float(law.max() / law.min())
    if s.grid == "paper":
        last = float(step_grid("paper", 10 ** 8)[-1])
        lmin, lmax = math.log(2000.0), math.log(last / 2.0 / span)
        tau0 = math.exp(rng.uniform(lmin, max(lmin, lmax)))
    elif s.grid == "suite":
        tau0 = math.exp(rng.uniform(math.log(200.0), math.log(2000.0)))
    else:
        tau0 = 1000.0
    return tau0 * law * np.exp(s.scatter * rng.standard_normal(xs.size)), tau0 * law


def fine_against_scatter(s: Setting, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether the scatter is large against every bracket ``[lo, hi]`` (those the law's taus without scatter fall
    in, one per run): its standard deviation at least :data:`LARGE_SCATTER` times each bracket's. An experiment of
    the paper's checkpoints is not when a tau lies among the coarse early steps, whatever the setting's median."""
    return bool(np.all(s.scatter / math.log(10) >= LARGE_SCATTER * np.sqrt(bracket_variances(lo, hi))))


def planted_brackets(s: Setting, n: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the brackets the law's taus without scatter ``centre`` get on the setting's grid (runs at N ``n``;
    on the continuous grids every bracket has the same width, whatever the phase)."""
    if s.grid in ("independent", "shared"):
        ln_lo, ln_hi = continuous_brackets(np.log(centre), np.zeros(centre.size), s)
        return np.exp(ln_lo), np.exp(ln_hi)
    return step_brackets(centre, grids_of(s, n), s)


def reported_brackets(rng: np.random.Generator, s: Setting, cell: np.ndarray, n: np.ndarray,
                      tau: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, lo, hi) of each tau as the suite reports it on the setting's grid: the bracket and its log-midpoint.
    ``cell``: an id per run (runs of one cell share their evaluation steps, so one grid phase on the independent
    grid); ``n``: each run's N, which sets its budget on the suite's grid."""
    if s.grid in ("independent", "shared"):
        keys, cell_index = np.unique(cell, return_inverse=True)
        phase = rng.random(keys.size)[cell_index] if s.grid == "independent" else np.full(tau.size, rng.random())
        ln_lo, ln_hi = continuous_brackets(np.log(tau), phase, s)
        lo, hi = np.exp(ln_lo), np.exp(ln_hi)
    else:
        lo, hi = step_brackets(tau, grids_of(s, n), s)
    return np.sqrt(lo * hi), lo, hi


def grids_of(s: Setting, budget_x: np.ndarray) -> list[np.ndarray]:
    """The evaluation steps of each run of a step grid ("paper": one grid for all; "suite": per N)."""
    if s.grid == "paper":
        return [step_grid("paper", 10 ** 8)] * budget_x.size
    return [step_grid(SUITE_TIMES, max(SUITE_MIN_STEPS, int(SUITE_STEPS_PER_N * n))) for n in budget_x]


@lru_cache(maxsize=256)
def step_grid(times: int | str, budget: int) -> np.ndarray:
    """:func:`diffmem.eval_grid.evaluation_steps` as floats (cached: read-only, shared by the simulations)."""
    grid = np.array(evaluation_steps(times, budget), dtype=float)
    grid.flags.writeable = False
    return grid


def simulate_experiment(rng: np.random.Generator, s: Setting) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray]:
    """(x, tau, tau_lo, tau_hi) of one simulated experiment, each of shape (n_x * seeds,) (module docstring)."""
    return simulate_planted_experiment(rng, s)[:4]


def simulate_planted_experiment(rng: np.random.Generator, s: Setting) -> tuple[np.ndarray, ...]:
    """:func:`simulate_experiment` and, fifth, the law's taus without scatter (shape of x), from which
    :func:`planted_brackets` and :func:`fine_against_scatter` tell whether the grid is fine against the scatter
    where they lie."""
    x = 16.0 * 2.0 ** np.arange(s.n_x)
    xs = np.repeat(x, s.seeds)
    tau, centre = planted_taus(rng, s, xs, (xs / 16.0) ** s.exponent)
    value, lo, hi = reported_brackets(rng, s, xs, xs, tau)
    return xs, value, lo, hi, centre


# --- the intervals --------------------------------------------------------------------------------------------------

def fit_interval(xs: np.ndarray, tau: np.ndarray, lo: np.ndarray, hi: np.ndarray, ci: float = 0.95,
                 goodness: bool = True) -> tuple[float, float, float, float | None, int | None]:
    """(exponent, lo, hi, lack-of-fit p or None, cells flagged as outliers) by the computation of
    ``fit_power_law`` (cells, least squares, the interval with its bracket variance; its goodness of fit, unless
    ``goodness`` is False: then p and the outlier count are None)."""
    ly = np.log10(tau)
    cells = make_cells(xs[:, None], ly, [str(i) for i in range(xs.size)])
    runs = RunBrackets.of(cell_index(cells, xs[:, None]), tau, lo, hi)
    ls = law_least_squares(cells, runs, ci)
    k_lo, k_hi = ls.interval(1)
    if not goodness:
        return float(ls.coef[1]), k_lo, k_hi, None, None
    lof = lack_of_fit(cells, ls, ly, runs.variance, runs.cell_of)
    _, outliers = leave_one_out(cells, ci, ["x"], runs.cell_variance(len(cells)))
    return float(ls.coef[1]), k_lo, k_hi, (None if lof is None else lof[2]), len(outliers)


def previous_t_interval(xs: np.ndarray, tau: np.ndarray, ci: float = 0.95) -> tuple[float, float, float]:
    """(exponent, lo, hi) by the interval of diffmem <= 0.4, kept here only to compare against: Student t with
    cells - 2 df on the residual scatter of the cell means alone, ``s^2 (X'X)^-1``, blind to the brackets."""
    cells = make_cells(xs[:, None], np.log10(tau), [str(i) for i in range(xs.size)])
    ls = cell_least_squares(cells, ci)
    k_lo, k_hi = ls.interval(1)
    return float(ls.coef[1]), k_lo, k_hi


def setting_rng(seed: int, *parts: float) -> np.random.Generator:
    """The seeded generator of one setting (reproducible whatever the order settings run in). Each part enters as
    ``round(1000 p) + 1000``, taken modulo 2^32 where that is negative (a planted exponent below -1,
    :func:`around_wide_rows`), as numpy seeds are non-negative."""
    return np.random.default_rng([seed, *((int(round(1000 * p)) + 1000) % 2 ** 32 for p in parts)])


class FineTally:
    """Counts, over the experiments whose grid is fine against the scatter where the law's taus lie
    (:func:`fine_against_scatter`), how often each interval held its exponent."""

    def __init__(self, n_coefficients: int = 1):
        self.n = 0
        self.hits = np.zeros(n_coefficients)

    def add(self, fine: bool, *inside: bool) -> None:
        if fine:
            self.n += 1
            self.hits += np.array(inside, dtype=float)

    def coverage(self, j: int) -> float | None:
        """The coverage of coefficient ``j`` over those experiments (None without any)."""
        return float(self.hits[j] / self.n) if self.n else None


def run_setting(s: Setting, n_sim: int, seed: int = 0) -> SettingResult:
    """Simulate ``n_sim`` experiments of setting ``s`` (seeded) and measure both intervals on each; the goodness
    of fit's false-alarm rates only on the independent grid (the study of diffmem <= 0.4; it is most of the cost)."""
    rng = setting_rng(seed, s.exponent, s.n_x, s.seeds, s.scatter, GRIDS.index(s.grid), s.refined)
    goodness = s.grid == "independent"
    hit, width, hit_prev, width_prev, rejected, tested, flagged, sds = 0, [], 0, [], 0, 0, 0, []
    fine = FineTally()
    for _ in range(n_sim):
        xs, tau, lo, hi, centre = simulate_planted_experiment(rng, s)
        sds.append(median_bracket_sd(lo, hi))
        _, a, b, p, n_out = fit_interval(xs, tau, lo, hi, goodness=goodness)
        flagged += bool(n_out)
        inside = a <= s.exponent <= b
        hit += inside
        fine.add(fine_against_scatter(s, *planted_brackets(s, xs, centre)), inside)
        width.append(b - a)
        if p is not None:
            tested += 1
            rejected += p < 0.05
        _, a, b = previous_t_interval(xs, tau)
        hit_prev += a <= s.exponent <= b
        width_prev.append(b - a)
    return SettingResult(s, n_sim, hit / n_sim, float(np.median(width)), hit_prev / n_sim,
                         float(np.median(width_prev)), rejected / tested if tested else None,
                         flagged / n_sim if s.n_x >= 4 and goodness else None, float(np.median(sds)),
                         fine.coverage(0), fine.n)


def median_bracket_sd(lo: np.ndarray, hi: np.ndarray) -> float:
    """The median over runs of each bracket's standard deviation in log10, ``log10(hi / lo) / sqrt(12)``."""
    return float(np.median(np.sqrt(bracket_variances(lo, hi))))


def settings(exponents: Sequence[float] = EXPONENTS, n_xs: Sequence[int] = N_XS, seeds: Sequence[int] = SEEDS,
             scatters: Sequence[float] = SCATTERS, grids: Sequence[str] = GRIDS,
             refined: Sequence[bool] = (False, True), grid_ratio: float = 1.2,
             refine_ratio: float = 1.1) -> list[Setting]:
    """Every combination, in the order of the table (a row per grid, refinement, seeds, scatter, x values; the
    exponents side by side)."""
    return [Setting(k, n, m, sc, g, r, grid_ratio, refine_ratio)
            for g in grids for r in refined for m in seeds for sc in scatters for n in n_xs for k in exponents]


def run_all(todo: Sequence[Setting], run: Callable, n_sim: int, seed: int, jobs: int = 1) -> list:
    """``run(setting, n_sim, seed)`` for every setting, in ``jobs`` processes (results in the order of ``todo``)."""
    bar = dict(total=len(todo), unit="setting", file=sys.stderr, disable=None)
    if jobs <= 1:
        return [run(s, n_sim, seed) for s in tqdm(todo, **bar)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(tqdm(pool.map(run, todo, [n_sim] * len(todo), [seed] * len(todo)), **bar))


def _percent(values: Iterable[float | None]) -> str:
    return " / ".join("-" if v is None else f"{100 * v:.1f}" for v in values)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table of ``header`` and ``rows`` (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def format_table(results: Sequence[SettingResult]) -> str:
    """A markdown table: a row per grid, refinement, seeds, scatter and x values, the exponents 0 / 0.5 / 1 side by
    side (coverage in %, median widths in exponent units)."""
    rows: dict[tuple, list[SettingResult]] = {}
    for r in results:
        s = r.setting
        rows.setdefault((s.grid, s.refined, s.seeds, s.scatter, s.n_x), []).append(r)
    cells = []
    for (grid, refined, seeds, scatter, n_x), group in rows.items():
        width = float(np.median([r.width for r in group]))
        prev = float(np.median([r.width_previous for r in group]))
        ratio = f"{width / prev:.2f}" if prev > 1e-9 else "-"  # a median of 0: collinear midpoints, no width
        cells.append([grid, "yes" if refined else "no", str(seeds), f"{100 * scatter:.0f} %", str(n_x),
                      _percent(r.coverage for r in group), f"{width:.3f}", ratio,
                      _percent(r.coverage_previous for r in group), _percent(r.lof_rejection for r in group),
                      _percent(r.outlier_flags for r in group)])
    return markdown_table(["grid", "refined", "seeds", "scatter", "x values", "coverage % (exponent 0 / 0.5 / 1)",
                           "median width", "width / previous", "previous t: coverage %", "lack-of-fit rejections %",
                           "outlier flags %"], cells)


# --- the joint law --------------------------------------------------------------------------------------------------

JOINT_LAYOUTS: dict[str, tuple[tuple[float, float], ...]] = {
    "cross": ((32, 8), (64, 8), (128, 8), (256, 8), (64, 16), (64, 32)),
    "full": tuple((n, w) for n in (32, 64, 128) for w in (8, 16, 32)),
}
"""Cells (N, W) of the joint-law study: "cross" is the reference experiment's grid (an N axis at W = 8 and a width
axis at N = 64, results/cpu_digits_2), "full" every (N, W) of 3 x 3."""
JOINT_EXPONENTS: tuple[tuple[float, float], ...] = ((1.0, -1.0), (0.0, -1.0))
"""(a, b) of tau ∝ N^a W^b: the paper's tau_mem and tau_gen."""


@dataclass(frozen=True)
class JointSetting:
    """One cell of the joint study: planted (a, b), the (N, W) layout, seeds, scatter, grid and refinement."""

    exponents: tuple[float, float]
    layout: str
    seeds: int
    scatter: float
    grid: str = "shared"
    refined: bool = False
    grid_ratio: float = 1.2
    refine_ratio: float = 1.1

    def as_setting(self) -> Setting:
        return Setting(0.0, 0, self.seeds, self.scatter, self.grid, self.refined, self.grid_ratio, self.refine_ratio)


@dataclass(frozen=True)
class JointResult:
    """Coverage of each exponent (N's, W's) and of both at once, and median widths, over ``n_sim`` experiments."""

    setting: JointSetting
    n_sim: int
    coverage: tuple[float, float]
    coverage_both: float
    width: tuple[float, float]
    coverage_previous: tuple[float, float]
    bracket_sd: float | None = None
    width_previous: tuple[float, float] | None = None
    coverage_fine: tuple[float, float] | None = None
    """The coverage of each exponent over only the experiments whose grid is fine against the scatter where the
    law's taus lie (:func:`fine_against_scatter`; None when there is none), ..."""
    n_fine: int = 0
    """... and how many of the ``n_sim`` experiments those are."""


def joint_experiments(s: JointSetting, n_sim: int,
                      seed: int = 0) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]], list[np.ndarray]]:
    """The (N, W) of each run, shape (runs, 2), ``n_sim`` simulated experiments of the joint law, each (value, lo,
    hi) per run, and each one's law taus without scatter (shape (runs,); :func:`fine_against_scatter`): taus placed
    as the single-variable study places them, brackets from the setting's grid (the suite's budget grows with N);
    seeded per setting."""
    a_true, b_true = s.exponents
    cells = np.array(JOINT_LAYOUTS[s.layout], dtype=float)
    xs = np.repeat(cells, s.seeds, axis=0)
    rng = setting_rng(seed, a_true, b_true, len(cells), s.seeds, s.scatter, GRIDS.index(s.grid), s.refined)
    law = (xs[:, 0] / 32.0) ** a_true * (xs[:, 1] / 8.0) ** b_true
    cell_ids = np.unique(xs, axis=0, return_inverse=True)[1].ravel()  # cells numbered in (N, W) order
    setting = s.as_setting()
    draws, centres = [], []
    for _ in range(n_sim):
        tau, centre = planted_taus(rng, setting, xs[:, 0], law)
        draws.append(reported_brackets(rng, setting, cell_ids, xs[:, 0], tau))
        centres.append(centre)
    return xs, draws, centres


def run_joint_setting(s: JointSetting, n_sim: int, seed: int = 0) -> JointResult:
    """Simulate ``n_sim`` experiments of the joint law (:func:`joint_experiments`) and fit each as
    ``fit_joint_law`` does."""
    a_true, b_true = s.exponents
    xs, draws, centres = joint_experiments(s, n_sim, seed)
    setting = s.as_setting()
    hits, both, widths, hits_prev, widths_prev, sds = np.zeros(2), 0, [], np.zeros(2), [], []
    tally = FineTally(2)
    for (value, lo, hi), centre in zip(draws, centres):
        sds.append(median_bracket_sd(lo, hi))
        fitted = make_cells(xs, np.log10(value), [str(i) for i in range(len(xs))])
        ls = law_least_squares(fitted, RunBrackets.of(cell_index(fitted, xs), value, lo, hi), 0.95)
        prev = cell_least_squares(fitted, 0.95)
        inside = []
        for j, truth in enumerate((a_true, b_true)):
            k_lo, k_hi = ls.interval(j + 1)
            inside.append(k_lo <= truth <= k_hi)
            widths.append((j, k_hi - k_lo))
            p_lo, p_hi = prev.interval(j + 1)
            hits_prev[j] += p_lo <= truth <= p_hi
            widths_prev.append((j, p_hi - p_lo))
        hits += inside
        both += all(inside)
        tally.add(fine_against_scatter(setting, *planted_brackets(setting, xs[:, 0], centre)), *inside)
    width = tuple(float(np.median([w for j, w in widths if j == i])) for i in (0, 1))
    width_prev = tuple(float(np.median([w for j, w in widths_prev if j == i])) for i in (0, 1))
    return JointResult(s, n_sim, (hits[0] / n_sim, hits[1] / n_sim), both / n_sim, width,
                       (hits_prev[0] / n_sim, hits_prev[1] / n_sim), float(np.median(sds)), width_prev,
                       (tally.coverage(0), tally.coverage(1)) if tally.n else None, tally.n)


def joint_settings(grids: Sequence[str] = GRIDS, refined: Sequence[bool] = (False, True), seeds: Sequence[int] = SEEDS,
                   scatters: Sequence[float] = SCATTERS, grid_ratio: float = 1.2,
                   refine_ratio: float = 1.1) -> list[JointSetting]:
    """Every combination of the joint study, in the order of its table."""
    return [JointSetting(e, layout, m, sc, g, r, grid_ratio, refine_ratio)
            for g in grids for r in refined for layout in JOINT_LAYOUTS for m in seeds for sc in scatters
            for e in JOINT_EXPONENTS]


def format_joint_table(results: Sequence[JointResult]) -> str:
    """A markdown table of the joint study: a row per setting."""
    return markdown_table(
        ["grid", "refined", "cells", "seeds", "scatter", "planted (a, b)", "coverage % of a / b / both",
         "median width of a / b", "previous t: coverage % of a / b"],
        ([r.setting.grid, "yes" if r.setting.refined else "no", r.setting.layout, str(r.setting.seeds),
          f"{100 * r.setting.scatter:.0f} %", f"({r.setting.exponents[0]:g}, {r.setting.exponents[1]:g})",
          _percent((*r.coverage, r.coverage_both)), f"{r.width[0]:.3f} / {r.width[1]:.3f}",
          _percent(r.coverage_previous)] for r in results))


# --- the level crossings --------------------------------------------------------------------------------------------

LEVEL = 0.1
LEVEL_SAMPLES = 1000
LEVEL_RISE = 2.0
"""The level study's planted curve: f_mem = LEVEL * (s / tau_L) ** LEVEL_RISE (capped at 1), read at each
evaluation as Binomial(LEVEL_SAMPLES, f) / LEVEL_SAMPLES with its binomial interval."""


def planted_f_mem_curve(steps: np.ndarray, tau_level: float) -> np.ndarray:
    """The planted f_mem itself at ``steps``, before sampling: ``LEVEL (s / tau_level)^LEVEL_RISE``, capped at 1."""
    return np.minimum(LEVEL * (steps / tau_level) ** LEVEL_RISE, 1.0)


def planted_f_mem(rng: np.random.Generator, steps: np.ndarray,
                  tau_level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A planted f_mem curve crossing LEVEL at ``tau_level`` as an evaluation reads it at ``steps``: (f_mem, its 95 %
    interval's lower and upper ends), each a fraction per step, shape (steps,)."""
    observed = rng.binomial(LEVEL_SAMPLES, planted_f_mem_curve(steps, tau_level)) / LEVEL_SAMPLES
    f_lo, f_hi = binomial_interval(observed, LEVEL_SAMPLES)
    return observed, f_lo, f_hi


def measured_crossing(steps: np.ndarray, f_mem: np.ndarray, f_lo: np.ndarray, f_hi: np.ndarray) -> Estimate | None:
    """tau_mem_at_LEVEL read by the suite's estimator from f_mem and its interval at ``steps``: its value, interval
    and bracket (the two evaluations it is interpolated between, what the fits take); None when it is censored."""
    est = tau_mem_level(steps.tolist(), f_mem.tolist(), f_lo.tolist(), f_hi.tolist(), LEVEL)
    return est if est.measured and est.bracket is not None else None


def planted_level_crossing(rng: np.random.Generator, steps: np.ndarray, tau_level: float) -> Estimate | None:
    """The :func:`measured_crossing` of a planted f_mem curve crossing LEVEL at ``tau_level`` and sampled at
    ``steps`` (:func:`planted_f_mem`)."""
    return measured_crossing(steps, *planted_f_mem(rng, steps, tau_level))


def level_experiments(s: Setting, n_sim: int, seed: int = 0,
                      read: Callable[[np.random.Generator, np.ndarray, float], Any] = planted_level_crossing
                      ) -> Iterator[tuple[np.ndarray, list, bool]]:
    """``n_sim`` simulated experiments of a level-crossing law, each (x of each run, its crossing, whether the grid
    is fine against the scatter where the law's taus lie, :func:`fine_against_scatter`): each run's f_mem curve is
    planted (crossing LEVEL at its tau) and evaluated at the setting's grid (refined settings: every kept
    checkpoint evaluated, as a dense grid); experiments with a censored run are drawn again. Seeded per setting.
    ``read(rng, steps, tau)`` reads one run (default :func:`planted_level_crossing`; None: censored); a reader that
    draws as :func:`planted_f_mem` does and is None where it is sees the same experiments."""
    rng = setting_rng(seed, 7, s.exponent, s.n_x, s.seeds, s.scatter, GRIDS.index(s.grid), s.refined)
    xs = np.repeat(16.0 * 2.0 ** np.arange(s.n_x), s.seeds)
    done = 0
    while done < n_sim:
        tau, centre = planted_taus(rng, s, xs, (xs / 16.0) ** s.exponent)
        grids = level_grids(rng, s, xs)
        rows = [read(rng, steps, t) for steps, t in zip(grids, tau)]
        if any(r is None for r in rows):
            continue
        done += 1
        steps = np.array([grid_step(grid, c) for grid, c in zip(grids, centre)])
        yield xs, rows, fine_against_scatter(s, steps[:, 0], steps[:, 1])


def run_level_setting(s: Setting, n_sim: int, seed: int = 0) -> SettingResult:
    """The study of one setting for a level-crossing law (:func:`level_experiments`): tau_mem_at_LEVEL read with its
    interpolated value and its bracket, then fitted as every law is."""
    hit, width, hit_prev, width_prev, sds = 0, [], 0, [], []
    fine = FineTally()
    for xs, rows, is_fine in level_experiments(s, n_sim, seed):
        value = np.array([r.value for r in rows])
        lo, hi = (np.array(v, dtype=float) for v in zip(*(r.bracket for r in rows)))
        sds.append(median_bracket_sd(lo, hi))
        _, a, b, _, _ = fit_interval(xs, value, lo, hi)
        inside = a <= s.exponent <= b
        hit += inside
        fine.add(is_fine, inside)
        width.append(b - a)
        _, a, b = previous_t_interval(xs, value)
        hit_prev += a <= s.exponent <= b
        width_prev.append(b - a)
    return SettingResult(s, n_sim, hit / n_sim, float(np.median(width)), hit_prev / n_sim,
                         float(np.median(width_prev)), None, None, float(np.median(sds)), fine.coverage(0), fine.n)


def level_grids(rng: np.random.Generator, s: Setting, xs: np.ndarray) -> list[np.ndarray]:
    """The evaluated steps of each run for the level study: the continuous grids as steps ``1000 * ratio ** (j +
    phase)`` over a wide span, the step grids as the suite evaluates them; refined: with every kept checkpoint."""
    if s.grid in ("independent", "shared"):
        ratio = s.refine_ratio if s.refined else s.grid_ratio
        j = np.arange(-30, 90)  # 1000 * ratio ** j spans every planted tau (up to ~4e5) with room below it
        keys = np.unique(xs)
        phases = rng.random(keys.size) if s.grid == "independent" else np.full(keys.size, rng.random())
        by_x = {k: 1000.0 * ratio ** (j + p) for k, p in zip(keys, phases)}
        return [by_x[v] for v in xs]
    grids = grids_of(s, xs)
    if not s.refined:
        return grids
    return [kept_grid(grid, s.refine_ratio) for grid in grids]


def level_settings(grids: Sequence[str] = GRIDS, refined: Sequence[bool] = (False, True), seeds: Sequence[int] = SEEDS,
                   scatters: Sequence[float] = SCATTERS, n_xs: Sequence[int] = (3, 4, 6),
                   grid_ratio: float = 1.2, refine_ratio: float = 1.1) -> list[Setting]:
    """The level-crossing study's settings (planted exponent 1, the law of tau_mem), in the order of its table."""
    return [Setting(1.0, n, m, sc, g, r, grid_ratio, refine_ratio)
            for g in grids for r in refined for m in seeds for sc in scatters for n in n_xs]


def format_level_table(results: Sequence[SettingResult]) -> str:
    """A markdown table of the level study: a row per setting."""
    return markdown_table(
        ["grid", "refined", "seeds", "scatter", "x values", "coverage %", "median width", "previous t: coverage %",
         "previous t: median width"],
        ([r.setting.grid, "yes" if r.setting.refined else "no", str(r.setting.seeds),
          f"{100 * r.setting.scatter:.0f} %", str(r.setting.n_x), f"{100 * r.coverage:.1f}", f"{r.width:.3f}",
          f"{100 * r.coverage_previous:.1f}", f"{r.width_previous:.3f}"] for r in results))


def coverage_summary(results: Sequence[SettingResult]) -> str:
    """One line: the lowest and highest coverage of the fit's interval over the results, and of the previous one."""
    cov = [r.coverage for r in results]
    prev = [r.coverage_previous for r in results]
    return (f"fit interval: coverage {100 * min(cov):.1f}-{100 * max(cov):.1f} % over {len(results)} settings; "
            f"previous t interval: {100 * min(prev):.1f}-{100 * max(prev):.1f} %")


TARGET_LOW = 0.93
"""Issue #39's targets for every setting: coverage at least this, ..."""
TARGET_HIGH = 0.97
"""... at most this where the scatter is large against the brackets, ..."""
TARGET_WIDTH = 1.25
"""... and, where the previous t interval covered (at least :data:`TARGET_LOW`), a median width at most this times
its."""
LARGE_SCATTER = 3.0
"""Scatter "large against the brackets": its standard deviation (log10) at least this many times the brackets' median
standard deviation (:attr:`SettingResult.bracket_sd`)."""


def target_checks(rows: Sequence[tuple[str, float, float, float | None, float | None, int]],
                  widths: Sequence[tuple[str, float, float]]) -> str:
    """Lines that check issue #39's targets: ``rows`` (label, coverage, scatter as sd of ln tau, the brackets' median
    sd in log10 or None, the coverage over the experiments fine against the scatter or None, and how many those are)
    give the settings below :data:`TARGET_LOW` and those above :data:`TARGET_HIGH` at 30 % scatter, split by whether
    the scatter is large against their median bracket (:data:`LARGE_SCATTER`), each with its coverage where every
    law's tau lies on a grid fine against the scatter (:func:`fine_against_scatter`), then the settings above
    :data:`TARGET_HIGH` there; ``widths`` (label, median width, the previous t's median width) of the rows where the
    previous t covered give the largest ratio and any above :data:`TARGET_WIDTH`."""
    low = [f"{label} {100 * cov:.1f} %" for label, cov, *_ in rows if cov < TARGET_LOW]
    high, high_wide, high_fine = [], [], []
    for label, cov, scatter, sd, cov_fine, n_fine in rows:
        if scatter < 0.3:
            continue
        if cov_fine is not None and cov_fine > TARGET_HIGH:
            high_fine.append(f"{label} {100 * cov_fine:.1f} % of {n_fine}")
        if cov <= TARGET_HIGH:
            continue
        against = scatter / math.log(10) / sd if sd else math.inf
        fine = (f"; {100 * cov_fine:.1f} % in the {n_fine} experiments fine against it" if cov_fine is not None
                else "; no experiment fine against it")
        (high if against >= LARGE_SCATTER else high_wide).append(
            f"{label} {100 * cov:.1f} % (scatter {against:.1f}x the brackets' sd{fine})")
    lines = [f"below {100 * TARGET_LOW:.0f} %: " + ("; ".join(low) if low else f"none of {len(rows)}"),
             f"above {100 * TARGET_HIGH:.0f} % at 30 % scatter, >= {LARGE_SCATTER:g}x the brackets' sd: "
             + ("; ".join(high) if high else "none"),
             f"above {100 * TARGET_HIGH:.0f} % at 30 % scatter, < {LARGE_SCATTER:g}x the brackets' sd (brackets "
             "not small against it): " + ("; ".join(high_wide) if high_wide else "none"),
             f"above {100 * TARGET_HIGH:.0f} % at 30 % scatter over the experiments whose every law's tau lies where "
             f"the scatter is >= {LARGE_SCATTER:g}x its bracket's sd: " + ("; ".join(high_fine) if high_fine else
                                                                           "none")]
    ratios = sorted(((w / p, label) for label, w, p in widths if p > 1e-9), reverse=True)
    if ratios:
        over = [f"{label} {r:.2f}x" for r, label in ratios if r > TARGET_WIDTH]
        lines.append(f"where the previous t covered ({len(ratios)} rows): median width at most {ratios[0][0]:.2f}x "
                     f"its ({ratios[0][1]})" + (f"; above {TARGET_WIDTH:g}x: " + "; ".join(over) if over else ""))
    return "\n".join("- " + line for line in lines)


def setting_label(s: Setting, exponent: bool = True) -> str:
    """A short name of a setting, e.g. ``shared refined 1 seed 5 % 3 x exponent 1``."""
    return (f"{s.grid}{' refined' if s.refined else ''} {s.seeds} seed{'s' if s.seeds > 1 else ''} "
            f"{100 * s.scatter:.0f} % {s.n_x} x" + (f" exponent {s.exponent:g}" if exponent else ""))


def law_width_rows(results: Sequence[SettingResult]) -> dict[str, list[SettingResult]]:
    """The rows of a laws or level-crossing table (the exponents of one row pooled, as :func:`format_table` does)
    where the previous t covered every exponent: the rows the width target reads, by label."""
    rows: dict[str, list[SettingResult]] = {}
    for r in results:
        rows.setdefault(setting_label(r.setting, exponent=False), []).append(r)
    return {label: group for label, group in rows.items() if all(r.coverage_previous >= TARGET_LOW for r in group)}


def pooled_widths(group: Sequence[SettingResult]) -> tuple[float, float]:
    """The median width of the fit's interval and of the previous t's over a row's exponents."""
    return float(np.median([r.width for r in group])), float(np.median([r.width_previous for r in group]))


def law_target_checks(results: Sequence[SettingResult]) -> str:
    """:func:`target_checks` of the laws or level-crossing study; widths compared per row of the table
    (:func:`law_width_rows`)."""
    widths = [(label, *pooled_widths(group)) for label, group in law_width_rows(results).items()]
    return target_checks([(setting_label(r.setting), r.coverage, r.setting.scatter, r.bracket_sd, r.coverage_fine,
                           r.n_fine) for r in results], widths)


def joint_label(r: JointResult, j: int) -> str:
    """A short name of exponent ``j`` (0: N's, 1: W's) of a joint setting, e.g. ``paper full 1 seed 5 % (0, -1) N's
    exponent``."""
    s = r.setting
    return (f"{s.grid}{' refined' if s.refined else ''} {s.layout} {s.seeds} seed{'s' if s.seeds > 1 else ''} "
            f"{100 * s.scatter:.0f} % ({s.exponents[0]:g}, {s.exponents[1]:g}) {'NW'[j]}'s exponent")


def joint_width_rows(results: Sequence[JointResult]) -> list[tuple[JointResult, int]]:
    """The (setting, exponent) rows of the joint study where the previous t covered: the rows the width target
    reads."""
    return [(r, j) for r in results for j in (0, 1) if r.coverage_previous[j] >= TARGET_LOW and r.width_previous]


def joint_target_checks(results: Sequence[JointResult]) -> str:
    """:func:`target_checks` of the joint study, each exponent a row."""
    rows = [(joint_label(r, j), r.coverage[j], r.setting.scatter, r.bracket_sd,
             None if r.coverage_fine is None else r.coverage_fine[j], r.n_fine) for r in results for j in (0, 1)]
    widths = [(joint_label(r, j), r.width[j], r.width_previous[j]) for r, j in joint_width_rows(results)]
    return target_checks(rows, widths)


# --- around the planted exponents of the rows above the width target ------------------------------------------------

AROUND_SHIFTS: tuple[float, ...] = (-0.1, -0.05, 0.05, 0.1)
"""The shifts of a planted exponent at which :func:`around_wide_rows` re-runs a row above the width target: small
against the spacing of the planted exponents (0.5) and against what tells the paper's laws apart (tau_mem ~ N,
tau_gen flat in N)."""


@dataclass(frozen=True)
class AroundRow:
    """A row above the width target re-run with its planted exponent shifted (:func:`around_wide_rows`): its
    ``label``, its width ratio against the previous t, and per shift of :data:`AROUND_SHIFTS` (the coverage of the
    fit's interval, the previous t's, the ratio of their median widths); coverages are fractions in [0, 1]."""

    label: str
    ratio: float
    readings: tuple[tuple[float, float, float], ...]


def around_wide_rows(results: Sequence[SettingResult] | Sequence[JointResult], run: Callable, n_sim: int,
                     seed: int = 0, jobs: int = 1) -> list[AroundRow]:
    """Every row above the width target (:data:`TARGET_WIDTH` where the previous t covered) re-run by ``run``
    (:func:`run_setting`, :func:`run_level_setting` or :func:`run_joint_setting`, whichever printed ``results``)
    with the row's planted exponent shifted by each of :data:`AROUND_SHIFTS`, the rest of the setting kept; the
    same seed. A joint row shifts the exponent it reads; a row of one variable, pooling its planted exponents as
    the table does, shifts each. Whether the previous t covered a row is a property of the setting only if it
    covers there too; what it reads there says whether the width target's baseline holds its coverage beside the
    exponent the study plants."""
    if results and isinstance(results[0], JointResult):
        wide = [(joint_label(r, j), r.width[j] / r.width_previous[j], [(r.setting, j)])
                for r, j in joint_width_rows(results) if above_width_target(r.width[j], r.width_previous[j])]
    else:
        wide = [(label, pooled[0] / pooled[1], [(r.setting, None) for r in group])
                for label, group in law_width_rows(results).items()
                for pooled in [pooled_widths(group)] if above_width_target(*pooled)]
    todo = [shifted_setting(s, j, d) for _, _, members in wide for d in AROUND_SHIFTS for s, j in members]
    done = iter(run_all(todo, run, n_sim, seed, jobs))
    rows = []
    for label, ratio, members in wide:
        readings = []
        for _ in AROUND_SHIFTS:
            got = [(next(done), j) for _, j in members]
            if got[0][1] is None:
                group = [r for r, _ in got]
                width, previous = pooled_widths(group)
                readings.append((min(r.coverage for r in group), min(r.coverage_previous for r in group),
                                 width / previous))
            else:
                (r, j), = got
                readings.append((r.coverage[j], r.coverage_previous[j], r.width[j] / r.width_previous[j]))
        rows.append(AroundRow(label, ratio, tuple(readings)))
    return rows


def above_width_target(width: float, previous: float) -> bool:
    """Whether a median width is above :data:`TARGET_WIDTH` times the previous t's (a previous width of 0, which
    :func:`target_checks` leaves out too, never is)."""
    return previous > 1e-9 and width > TARGET_WIDTH * previous


def shifted_setting(s: Setting | JointSetting, j: int | None, shift: float) -> Setting | JointSetting:
    """``s`` with its planted exponent (a joint setting's exponent ``j``) moved by ``shift``."""
    if j is None:
        return replace(s, exponent=round(s.exponent + shift, 10))
    exponents = list(s.exponents)
    exponents[j] = round(exponents[j] + shift, 10)
    return replace(s, exponents=tuple(exponents))


def format_around(rows: Sequence[AroundRow]) -> str:
    """Lines that read :func:`around_wide_rows`: per row, the previous t's and the fit's coverage at each shift and
    the fit's width against the previous t's there; then in how many rows the previous t reads below
    :data:`TARGET_LOW` at some shift, and the others' lowest reading."""
    if not rows:
        return f"- no row above {TARGET_WIDTH:g}x the previous t's width"
    lines = [f"- the planted exponent shifted by {' / '.join(f'{d:+g}' for d in AROUND_SHIFTS)} in each row above "
             f"{TARGET_WIDTH:g}x (coverage % of the previous t, of the fit; the fit's median width against the "
             "previous t's):"]
    held = []
    for row in rows:
        fit, prev, ratio = zip(*row.readings)
        lines.append(f"  - {row.label} ({row.ratio:.2f}x): previous t {_percent(prev)} (lowest {100 * min(prev):.2f} "
                     f"%), fit {_percent(fit)}, width {min(ratio):.2f}-{max(ratio):.2f}x")
        if min(prev) >= TARGET_LOW:
            held.append(f"{row.label} (previous t at least {100 * min(prev):.2f} %, width {min(ratio):.2f}-"
                        f"{max(ratio):.2f}x)")
    lines.append(f"- the previous t reads below {100 * TARGET_LOW:.0f} % at a shifted exponent in "
                 f"{len(rows) - len(held)} of the {len(rows)} rows; it holds in: " + ("; ".join(held) or "none"))
    return "\n".join(lines)


__all__ = ["Setting", "SettingResult", "JointSetting", "JointResult", "simulate_experiment", "fit_interval",
           "previous_t_interval", "simulate_planted_experiment", "fine_against_scatter", "run_setting",
           "joint_experiments", "run_joint_setting", "level_experiments", "planted_f_mem",
           "planted_f_mem_curve", "measured_crossing",
           "run_level_setting",
           "settings", "joint_settings", "level_settings", "format_table", "format_joint_table", "format_level_table",
           "coverage_summary", "run_all", "target_checks", "law_target_checks", "joint_target_checks",
           "AROUND_SHIFTS", "AroundRow", "around_wide_rows", "format_around"]
