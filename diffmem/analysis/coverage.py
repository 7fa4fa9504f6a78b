"""The coverage study of the fit interval (`diffmem coverage`): how often a 95 % interval for an exponent holds the
exponent that was planted, over many simulated experiments shaped like ours.

One simulated experiment (:func:`simulate_experiment`): ``n_x`` values of x doubling from 16; at each, ``seeds`` runs
whose true ``tau = 1000 * (x / 16) ** exponent * exp(scatter * e)`` with ``e`` standard normal (log-normal run-to-run
scatter; ``scatter`` is the standard deviation of ``ln tau``, 0.05 ~ 5 %). Each tau is then *reported* the way the
suite reports tau_mem: as the bracket ``[g_j, g_{j+1}]`` of a log-spaced evaluation grid with ratio ``grid_ratio``
(1.2: consecutive evaluations 1.2x apart) that contains it, with the bracket's log-midpoint as the value. The grid's
phase is drawn uniformly per x and shared by the seeds of that x (runs of one N share their evaluation steps).

Per setting the study fits every simulated experiment with

- ``t``: :func:`diffmem.analysis.powerlaw.fit_power_law`'s interval (Student t on the cell means), and
- ``bootstrap``: the interval diffmem used up to 0.3 (:func:`previous_bootstrap_interval`: a percentile bootstrap over
  runs, each resampled tau drawn log-uniformly within its bracket, one draw per x),

and reports each method's coverage (the fraction of experiments whose interval holds the planted exponent) and the
median width of its interval, plus the false-alarm rates of the goodness of fit under the (true) power law: how often
the lack-of-fit test rejects at the 5 % level where seeds make it possible, and how often the outlier test names a
cell (both should be at most about 5 %).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from diffmem.analysis.powerlaw import (bracket_variances, cell_bracket_variance, cell_least_squares, lack_of_fit,
                                       leave_one_out, make_cells)

EXPONENTS: tuple[float, ...] = (0.0, 0.5, 1.0)
N_XS: tuple[int, ...] = (3, 4, 6, 9)
SEEDS: tuple[int, ...] = (1, 3)
SCATTERS: tuple[float, ...] = (0.05, 0.30)


@dataclass(frozen=True)
class Setting:
    """One cell of the study: planted exponent, number of x values, seeds per x, log-normal scatter (sd of ln tau)
    and the evaluation grid's ratio."""

    exponent: float
    n_x: int
    seeds: int
    scatter: float
    grid_ratio: float = 1.2


@dataclass(frozen=True)
class SettingResult:
    """Coverage (fraction in [0, 1]) and median interval width of each method, over ``n_sim`` experiments;
    ``lof_rejection``: fraction of experiments in which the lack-of-fit test rejected at 5 % (None without seeds);
    ``outlier_flags``: fraction in which the outlier test named a cell (None with 3 x values: no test)."""

    setting: Setting
    n_sim: int
    coverage_t: float
    width_t: float
    coverage_bootstrap: float | None
    width_bootstrap: float | None
    lof_rejection: float | None
    outlier_flags: float | None = None


def simulate_experiment(rng: np.random.Generator, s: Setting) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray]:
    """(x, tau, tau_lo, tau_hi) of one simulated experiment, each of shape (n_x * seeds,) (module docstring)."""
    x = 16.0 * 2.0 ** np.arange(s.n_x)
    ln_true = math.log(1000.0) + s.exponent * np.log(x / 16.0)
    xs = np.repeat(x, s.seeds)
    ln_tau = np.repeat(ln_true, s.seeds) + s.scatter * rng.standard_normal(xs.size)
    phase = np.repeat(rng.random(s.n_x), s.seeds)
    step = math.log(s.grid_ratio)
    j = np.floor(ln_tau / step - phase)
    ln_lo = (j + phase) * step
    ln_hi = ln_lo + step
    return xs, np.exp((ln_lo + ln_hi) / 2), np.exp(ln_lo), np.exp(ln_hi)


def t_interval(xs: np.ndarray, tau: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               ci: float = 0.95) -> tuple[float, float, float, float | None, int]:
    """(exponent, lo, hi, lack-of-fit p or None, cells flagged as outliers) by the computation of
    ``fit_power_law`` (cells, least squares, t; its goodness of fit)."""
    ly = np.log10(tau)
    cells = make_cells(xs[:, None], ly, [str(i) for i in range(xs.size)])
    ls = cell_least_squares(cells, ci)
    k_lo, k_hi = ls.interval(1)
    index = {c.x: i for i, c in enumerate(cells)}
    cell_of = np.array([index[(float(v),)] for v in xs])
    variances = bracket_variances(lo, hi)
    lof = lack_of_fit(cells, ls, ly, variances, cell_of)
    _, outliers = leave_one_out(cells, ci, ["x"], cell_bracket_variance(variances, cell_of, len(cells)))
    return float(ls.coef[1]), k_lo, k_hi, (None if lof is None else lof[2]), len(outliers)


def previous_bootstrap_interval(xs: np.ndarray, tau: np.ndarray, lo: np.ndarray, hi: np.ndarray, *,
                                n_boot: int = 2000, seed: int = 0, ci: float = 0.95) -> tuple[float, float, float]:
    """(exponent, lo, hi) by the method of diffmem <= 0.3, kept here only to compare against: least squares of
    log10 tau on log10 x over the runs; interval = percentiles of ``n_boot`` refits on resamples of the runs with
    replacement, each resampled tau drawn log-uniformly within its bracket (one draw per distinct x), resamples with
    a single distinct x dropped."""
    lx, ly = np.log10(xs), np.log10(tau)
    llo, lhi = np.log10(lo), np.log10(hi)
    slope = float(np.polyfit(lx, ly, 1)[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, lx.size, size=(n_boot, lx.size))
    xb = lx[idx]
    _, group = np.unique(lx, return_inverse=True)
    u = rng.random((n_boot, group.max() + 1))[:, group][np.arange(n_boot)[:, None], idx]
    yb = llo[idx] + u * (lhi - llo)[idx]
    mx, my = xb.mean(axis=1, keepdims=True), yb.mean(axis=1, keepdims=True)
    sxx = ((xb - mx) ** 2).sum(axis=1)
    ok = sxx > 1e-12
    slopes = ((xb - mx) * (yb - my)).sum(axis=1)[ok] / sxx[ok]
    alpha = 100 * (1 - ci) / 2
    k_lo, k_hi = np.percentile(slopes, [alpha, 100 - alpha])
    return slope, float(k_lo), float(k_hi)


def run_setting(s: Setting, n_sim: int, seed: int = 0, bootstrap: bool = True) -> SettingResult:
    """Simulate ``n_sim`` experiments of setting ``s`` (seeded) and measure both methods on each."""
    rng = np.random.default_rng([seed, int(s.exponent * 1000), s.n_x, s.seeds, int(s.scatter * 1000)])
    hit_t, width_t, hit_b, width_b, rejected, tested, flagged = 0, [], 0, [], 0, 0, 0
    for _ in range(n_sim):
        xs, tau, lo, hi = simulate_experiment(rng, s)
        _, a, b, p, n_out = t_interval(xs, tau, lo, hi)
        flagged += n_out > 0
        hit_t += a <= s.exponent <= b
        width_t.append(b - a)
        if p is not None:
            tested += 1
            rejected += p < 0.05
        if bootstrap:
            _, a, b = previous_bootstrap_interval(xs, tau, lo, hi, seed=int(rng.integers(2 ** 31)))
            hit_b += a <= s.exponent <= b
            width_b.append(b - a)
    return SettingResult(s, n_sim, hit_t / n_sim, float(np.median(width_t)),
                         hit_b / n_sim if bootstrap else None, float(np.median(width_b)) if bootstrap else None,
                         rejected / tested if tested else None, flagged / n_sim if s.n_x >= 4 else None)


def settings(exponents: Sequence[float] = EXPONENTS, n_xs: Sequence[int] = N_XS, seeds: Sequence[int] = SEEDS,
             scatters: Sequence[float] = SCATTERS, grid_ratio: float = 1.2) -> list[Setting]:
    """Every combination, in the order of the table."""
    return [Setting(k, n, m, sc, grid_ratio) for m in seeds for sc in scatters for n in n_xs for k in exponents]


def format_table(results: Iterable[SettingResult]) -> str:
    """A markdown table: one row per setting."""
    lines = ["| seeds | scatter | x values | exponent | coverage, t | median width, t | coverage, bootstrap "
             "(<= 0.3) | median width, bootstrap | lack-of-fit rejections at 5 % | outlier flags at 5 % |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.setting
        boot = (f"{100 * r.coverage_bootstrap:.1f} %", f"{r.width_bootstrap:.2f}") if r.coverage_bootstrap is not None \
            else ("-", "-")
        lof = f"{100 * r.lof_rejection:.1f} %" if r.lof_rejection is not None else "-"
        out = f"{100 * r.outlier_flags:.1f} %" if r.outlier_flags is not None else "-"
        lines.append(f"| {s.seeds} | {100 * s.scatter:.0f} % | {s.n_x} | {s.exponent:g} | "
                     f"{100 * r.coverage_t:.1f} % | {r.width_t:.2f} | {boot[0]} | {boot[1]} | {lof} | {out} |")
    return "\n".join(lines)
