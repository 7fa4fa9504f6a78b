"""Power laws ``tau = prefactor * x1 ** a1 * x2 ** a2 ...`` fitted in log-log space over the runs of an experiment,
with a Student-t interval on the cell means, a goodness-of-fit test, and the fits.json they are stored in (written
by :mod:`diffmem.analysis.scaling`, read by advice and figures).

The method (docs/analysis.md, "Fits", copies this and gives its coverage study):

- **Cells.** Runs at the same x (the same N, or the same (N, W) for a joint law) are one cell: seeds are replicates
  of one x, not independent x values. A cell's value is the mean of ``log10 tau`` over its runs (``tau`` = each run's
  estimate, e.g. tau_mem's log-time bracket midpoint).
- **Fit.** Ordinary least squares of the cell means on ``log10 x`` (one column per variable), all cells weighted
  equally.
- **Interval.** Student t with ``df = cells - parameters`` degrees of freedom, on a variance that knows the
  measurement's resolution (:func:`cell_least_squares`). Each tau is known only within its bracket [lo, hi] of
  evaluations: its interval for tau_mem's onset, tau_gap, tau_bias and tau_auc; for a crossing interpolated between
  two evaluations (tau_gen, the level crossings) those two (``Estimate.bracket``), because the noise of the measure
  that its interval also carries differs from run to run and is part of the scatter the fit measures. Taken as
  uniform in log10 a bracket has the variance ``(log10 hi/lo)^2 / 12``, and a cell mean ``v_i``, the sum over its
  runs divided by runs^2. The residual scatter of the cell means is split into that known part and the
  scatter beyond the brackets, ``b^2 = max(0, (RSS - sum_i (1 - h_i) v_i) / df)`` (``h_i``: the cell's leverage).
  With ``b^2 > 0``: ``cov = C diag(b^2 + v) C'`` (``C = (X'X)^-1 X'``) and ``exponent +- t(0.975, df) * se``; when
  every cell's brackets are alike this is the plain t interval on the residual scatter, and a coarse bracket weighs
  by its width. With ``b^2 = 0`` (the residuals are no larger than the brackets alone explain) the residuals cannot
  say how the brackets' errors correlate: on one evaluation grid shared by every x they are the same function of
  tau, and three or four bracket midpoints can lie almost on a line with the wrong slope. The interval is then the
  wider of the plain t interval and the normal interval of the worst case of the values rounded to their bracket's
  midpoint, errors of one sign: ``+- z(0.975) * sum_i |C_ji| sqrt(r_i)`` (``r_i``: the part of ``v_i`` from such
  runs; an interpolated crossing's error is not a rounding, and the level-crossing study shows the worst case
  needless for it once runs in one bracket share their error, below). In either case the interval is never narrower
  than the normal interval of the brackets' errors alone when runs that report the same bracket share one error
  (seeds of one cell, or cells whose taus coincide, as tau_gen's across N at one width; crossings interpolated in
  one bracket): averaging such runs does not shrink it (``z sqrt(C S C')``,
  :func:`diffmem.analysis.cellfit.shared_bracket_covariance`). When the cell means lie exactly
  on one line (no residual: bracket midpoints on one shared grid can, a whole number of grid steps apart), nothing
  measures the run-to-run scatter, and the half width is multiplied by the factor that keeps the rule's coverage at
  every scatter on this design and these brackets, found by simulating the experiment on its brackets' own lattices
  (:func:`diffmem.analysis.cellfit.collinear_factor`; ``collinear_factor`` in fits.json, and the ``ci_note`` says
  so). With ``df = 0`` (as many cells as parameters) there is no interval. Its coverage was measured by simulation
  (:mod:`diffmem.analysis.coverage`): planted laws, 3-9 x values, 1 and 3 seeds, log-normal scatter 5-30 %, each
  tau reported as its bracket on an evaluation grid drawn per x, shared by every x, the paper's checkpoints or the
  suite's log-spaced rule, with and without refinement.
- **Goodness of fit** (:class:`GoodnessOfFit`). With seeds (some cell has >= 2 runs): a lack-of-fit F test of the
  line against free cell means, whose pure error is the seeds' within-cell variance plus each run's bracket
  variance ``(log10 hi/lo)^2 / 12`` (a tau known only within its bracket). With one run per x, lack of fit cannot be
  told from run-to-run scatter and no p-value is given; then, as always, the fit reports the slopes of the lines that
  pass through every run's interval (none: the brackets alone rule out one power law without scatter) and which
  single cell's removal lets one pass, any cell whose removal moves the exponent outside its interval, and the
  outlier test (each cell's externally studentized residual from the law of the others, Bonferroni over the cells,
  the others' scatter never taken below their bracket variance).

Censored runs (bounds, not measurements) are listed with their bound and left out; runs without the quantity are
listed with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from diffmem.analysis.cellfit import Cell, RunBrackets, interval_half_width, law_least_squares, make_cells
from diffmem.analysis.goodness import GoodnessOfFit, goodness_of_fit
from diffmem.analysis.runfiles import read_json

FIT_NAMES: tuple[str, ...] = ("tau_mem_vs_n", "tau_gen_vs_n", "tau_gen_vs_width", "tau_mem_vs_n_over_width")
EXTRA_FIT_NAMES: tuple[str, ...] = ("tau_mem_epochs_vs_n", "tau_mem_vs_width", "tau_bias_vs_n", "tau_bias_vs_width")
"""Fits added after fits.json files were first written, or written only for some experiments (tau_bias: split
pairs); loaded when present."""


FIT_METHOD = "ols-cell-means-t-evaluation-brackets"
FIT_METHOD_TEXT = ("log10 least squares on cell means (the runs of one x averaged in log10: seeds are replicates); "
                   "95% interval: Student t with (cells - parameters) degrees of freedom on each cell mean's bracket "
                   "variance (a run's bracket: its interval of evaluations, or for a crossing interpolated between "
                   "two evaluations those two) plus the scatter beyond the brackets estimated from the residuals; "
                   "where the brackets explain all the scatter at least the normal interval of the worst case of the "
                   "values rounded to their bracket's midpoint (errors of one sign); never narrower than the normal "
                   "interval of the brackets' errors, runs that report one bracket sharing one error; where the cell "
                   "means lie exactly on one line, widened by the factor that keeps the coverage at every scatter on "
                   "the law's own brackets (simulated); goodness of fit: lack-of-fit F test against free cell means "
                   "(pure error: within-cell variance + bracket variance) when seeds exist, and the lines through "
                   "every run's interval")
"""The fit method's name in fits.json and its one-line description (the module docstring has the whole rule)."""

OLD_FIT_METHOD = "bootstrap-over-runs"
"""The method of fits written by diffmem <= 0.3 (percentile bootstrap over runs; its coverage: docs/analysis.md).
Later files named "ols-cell-means-t" (the t interval on the residual scatter alone) and then
"ols-cell-means-t-bracket-variance" (the bracket variance, without the shared-bracket floor and the collinear
factor, whose shortfalls on one shared grid docs/coverage.md keeps), then "ols-cell-means-t-shared-brackets" (a
crossing's bracket was its whole interval, and every bracket entered the worst case); :func:`load_fits` refuses all
of them."""


COLLINEAR_NOTE = ("the cell means lie exactly on one line (no residual, as bracket midpoints on one shared "
                  "evaluation grid can), so the data do not measure the run-to-run scatter: the interval is widened "
                  "{factor:.2f}x, the factor that keeps its coverage at every scatter on these brackets (simulated; "
                  "docs/analysis.md, \"Coverage of the interval\"); more values of x or more seeds measure the "
                  "scatter")
"""The fit's ``ci_note`` in that case, formatted with the factor (``factor`` in fits.json)."""

BRACKETS_SET_NOTE = ("interval set by the brackets: the cells scatter no more than their brackets explain, so its "
                     "width is the evaluations' resolution (widest bracket {ratio:.2f}x, {run}), not the runs' "
                     "scatter; evaluations closer together inside the brackets narrow it")
"""A fit's :meth:`~PowerLawFit.resolution_note`, formatted with its widest bracket (docs/analysis.md, "When the
brackets set the interval")."""


def widest_bracket(points: Sequence[tuple], brackets: Sequence[tuple[str, float, float]]
                   ) -> tuple[str, float] | None:
    """(run, hi / lo) of the widest bracket among the fitted ``points`` (run, x, y, y_lo, y_hi): a run's own bracket
    where ``brackets`` gives one (an interpolated crossing: the two evaluations it lies between), else its interval;
    None when no run has a finite bracket."""
    own = {run: (lo, hi) for run, lo, hi in brackets}
    widest = None
    for run, _x, _y, lo, hi in points:
        lo, hi = own.get(run, (lo, hi))
        if lo is not None and hi is not None and 0 < lo <= hi and math.isfinite(hi):
            if widest is None or hi / lo > widest[1]:
                widest = (run, hi / lo)
    return widest


def resolution_note(set_by_brackets: bool, points: Sequence[tuple], brackets: Sequence[tuple[str, float, float]]
                    ) -> str | None:
    """:data:`BRACKETS_SET_NOTE` for a fit whose interval the brackets set, else None: the scatter beyond them is
    estimated as 0, so every part of the interval comes from them (the worst case of the rounded values, the errors
    that runs in one bracket share, or the t interval on residuals no larger than the brackets explain)."""
    widest = widest_bracket(points, brackets) if set_by_brackets else None
    return None if widest is None else BRACKETS_SET_NOTE.format(run=widest[0], ratio=widest[1])


def brackets_suffix(set_by_brackets: bool, points: Sequence[tuple], brackets: Sequence[tuple[str, float, float]]
                    ) -> str:
    """The end of a fit's one-line description when the brackets set its interval: ``; interval set by the
    brackets (widest 1.47x)``; else empty."""
    widest = widest_bracket(points, brackets) if set_by_brackets else None
    return "" if widest is None else f"; interval set by the brackets (widest {widest[1]:.2f}x)"


class AnalysisError(ValueError):
    """Bad input to the across-run analysis; the message says what to do."""


Point = tuple[str, float, float, "float | None", "float | None"]
"""(run, x, tau, tau_lo, tau_hi): a measured run; x and tau > 0; the interval may be None (unknown)."""


# --- the law of one variable ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PowerLawFit:
    """``y = prefactor * x ** exponent`` fitted in log-log space over cells of runs (module docstring).

    ``points``: (run, x, y, y_lo, y_hi) of the measured runs used (y_lo/y_hi: the run's own interval, None when
    unknown); ``brackets``: (run, lo, hi) of the runs whose bracket, the fit's resolution of the value
    (``Estimate.bracket``: the evaluations an interpolated crossing lies between), is narrower than that interval; the
    other runs' bracket is their interval; ``censored``: (run, x, bound) left out because tau is a bound; ``excluded``:
    (run, reason) left out because tau is missing. ``reason`` is None when fitted, else why not. ``df``, ``scatter``
    (residual standard deviation of a cell mean, log10) and ``cov`` (covariance of log10 prefactor and exponent,
    row-major 2 x 2) carry the interval; ``ci_note`` says when there is none, or why the one given may be too narrow
    (:data:`COLLINEAR_NOTE`). ``gof`` is the goodness of fit.
    """

    quantity: str
    x_name: str
    points: tuple[Point, ...]
    censored: tuple[tuple[str, float, float | None], ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    exponent: float | None = None
    exponent_lo: float | None = None
    exponent_hi: float | None = None
    prefactor: float | None = None
    prefactor_lo: float | None = None
    prefactor_hi: float | None = None
    reason: str | None = None
    ci_note: str | None = None
    ci: float = 0.95
    method: str = FIT_METHOD
    df: int | None = None
    scatter: float | None = None
    cov: tuple[float, float, float, float] | None = None
    t: float | None = None
    cells: tuple[Cell, ...] = ()
    gof: GoodnessOfFit | None = None
    beyond_brackets: float | None = None
    floor: tuple[tuple[float, float, float], ...] | None = None
    z: float | None = None
    rounding_cov: tuple[float, float, float, float] | None = None
    factor: float = 1.0
    brackets: tuple[tuple[str, float, float], ...] = ()

    @property
    def fitted(self) -> bool:
        return self.exponent is not None

    @property
    def n_runs(self) -> int:
        return len(self.points)

    @property
    def set_by_brackets(self) -> bool:
        """The interval is the brackets' own: the scatter beyond them is estimated as 0, the branch that floors the
        interval at their worst case (``bracket_floor`` in fits.json; :func:`resolution_note`)."""
        return self.exponent_lo is not None and self.floor is not None

    def resolution_note(self) -> str | None:
        """What sets the interval when the brackets do (:data:`BRACKETS_SET_NOTE`), else None."""
        return resolution_note(self.set_by_brackets, self.points, self.brackets)

    @property
    def x_range(self) -> tuple[float, float] | None:
        if not self.points:
            return None
        xs = [p[1] for p in self.points]
        return min(xs), max(xs)

    def predict(self, x: float | Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lo, hi) of the law at ``x`` (same shape as ``x``): the confidence interval of the law itself
        (Student t on the fit's covariance), not of a new run's tau. Without an interval (df = 0) lo = hi = value."""
        if not self.fitted:
            raise AnalysisError(f"{self.quantity} vs {self.x_name} is not fitted ({self.reason}); it cannot predict")
        lxq = np.log10(np.asarray(x, dtype=float))
        center = math.log10(self.prefactor) + self.exponent * lxq
        if self.cov is None or self.t is None:
            value = 10 ** center
            return value, value.copy(), value.copy()
        cov = np.array(self.cov).reshape(2, 2)
        floor = None if self.floor is None else np.array(self.floor)
        rounding = None if self.rounding_cov is None else np.array(self.rounding_cov).reshape(2, 2)
        half = np.vectorize(lambda v: interval_half_width(np.array([1.0, v]), cov, self.t, floor, self.z, rounding,
                                                          self.factor))(lxq)
        return 10 ** center, 10 ** (center - half), 10 ** (center + half)

    def to_dict(self) -> dict[str, Any]:
        rng = self.x_range
        return {
            "quantity": self.quantity, "x": self.x_name,
            "exponent": self.exponent, "exponent_lo": self.exponent_lo, "exponent_hi": self.exponent_hi,
            "prefactor": self.prefactor, "prefactor_lo": self.prefactor_lo, "prefactor_hi": self.prefactor_hi,
            "method": self.method, "ci": self.ci, "df": self.df, "t": self.t, "scatter_log10": self.scatter,
            "scatter_beyond_brackets_log10": self.beyond_brackets,
            "cov_log10": list(self.cov) if self.cov else None,
            "bracket_floor": [list(row) for row in self.floor] if self.floor else None, "z": self.z,
            "rounding_cov_log10": list(self.rounding_cov) if self.rounding_cov else None,
            "collinear_factor": self.factor,
            "n_runs": self.n_runs, "n_x": len({p[1] for p in self.points}),
            "x_min": rng[0] if rng else None, "x_max": rng[1] if rng else None,
            "reason": self.reason, "ci_note": self.ci_note,
            "goodness_of_fit": self.gof.to_dict() if self.gof else None,
            "cells": [c.to_dict([self.x_name]) for c in self.cells],
            "points": [{"run": r, "x": x, "y": y, "y_lo": lo, "y_hi": hi, **bracket_cells(self.brackets, r)}
                       for r, x, y, lo, hi in self.points],
            "censored": [{"run": r, "x": x, "lower_bound": b} for r, x, b in self.censored],
            "excluded": [{"run": r, "reason": why} for r, why in self.excluded],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PowerLawFit:
        """The fit of :meth:`to_dict`. A fit written by diffmem <= 0.3 (a bootstrap interval, no covariance) reads
        back with ``method`` "bootstrap-over-runs" and predicts without an interval; :func:`load_fits` refuses such
        files for the analysis."""
        try:
            return cls(
                quantity=d["quantity"], x_name=d["x"],
                points=tuple((p["run"], float(p["x"]), float(p["y"]), p.get("y_lo"), p.get("y_hi"))
                             for p in d.get("points", [])),
                censored=tuple((c["run"], float(c["x"]), c.get("lower_bound")) for c in d.get("censored", [])),
                excluded=tuple((e["run"], e["reason"]) for e in d.get("excluded", [])),
                exponent=d.get("exponent"), exponent_lo=d.get("exponent_lo"), exponent_hi=d.get("exponent_hi"),
                prefactor=d.get("prefactor"), prefactor_lo=d.get("prefactor_lo"),
                prefactor_hi=d.get("prefactor_hi"), reason=d.get("reason"), ci_note=d.get("ci_note"),
                ci=float(d.get("ci", 0.95)), method=d.get("method", OLD_FIT_METHOD), df=d.get("df"),
                scatter=d.get("scatter_log10"), beyond_brackets=d.get("scatter_beyond_brackets_log10"),
                floor=tuple(tuple(float(v) for v in row) for row in d["bracket_floor"])
                if d.get("bracket_floor") else None, z=d.get("z"),
                cov=tuple(d["cov_log10"]) if d.get("cov_log10") else None, t=d.get("t"),
                rounding_cov=tuple(d["rounding_cov_log10"]) if d.get("rounding_cov_log10") else None,
                factor=float(d.get("collinear_factor", 1.0)), brackets=brackets_of(d.get("points", [])),
                cells=tuple(Cell((float(c[d["x"]]),), tuple(c["runs"]), math.log10(c["geometric_mean"]),
                                 c.get("spread_log10")) for c in d.get("cells", [])),
                gof=GoodnessOfFit.from_dict(d["goodness_of_fit"]) if d.get("goodness_of_fit") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise AnalysisError(f"a fit in fits.json is malformed ({e!r}); rerun `diffmem analyze`") from None

    def describe(self) -> str:
        """One line, e.g. ``tau_mem ~ 312 * n^1.01 [0.95, 1.07] (12 runs in 4 cells, t 2 df; lack of fit ...)``."""
        if not self.fitted:
            return f"{self.quantity} vs {self.x_name}: not fitted ({self.reason})"
        ci = (f"[{self.exponent_lo:.3f}, {self.exponent_hi:.3f}]" if self.exponent_lo is not None
              else "[no interval]")
        text = (f"{self.quantity} ~ {self.prefactor:.3g} * {self.x_name}^{self.exponent:.3f} {ci} "
                f"({self.n_runs} runs in {len(self.cells)} cells, t {self.df} df"
                + (f", {len(self.censored)} censored left out" if self.censored else "") + ")")
        return text + (f"; {self.gof.summary()}" if self.gof else "") + brackets_suffix(self.set_by_brackets,
                                                                                       self.points, self.brackets)


def used_brackets(kept: Sequence[tuple], brackets: Mapping[str, tuple[float, float]] | None
                  ) -> tuple[tuple[str, float, float], ...]:
    """(run, lo, hi) of the runs among ``kept`` that ``brackets`` gives a bracket of their own, in ``kept``'s order."""
    given = brackets or {}
    return tuple((p[0], float(given[p[0]][0]), float(given[p[0]][1])) for p in kept if p[0] in given)


def bracket_cells(brackets: Sequence[tuple[str, float, float]], run: str) -> dict[str, float]:
    """fits.json's ``bracket_lo`` / ``bracket_hi`` of a point whose run has a bracket of its own, else nothing."""
    for r, lo, hi in brackets:
        if r == run:
            return {"bracket_lo": lo, "bracket_hi": hi}
    return {}


def brackets_of(points: Sequence[dict[str, Any]]) -> tuple[tuple[str, float, float], ...]:
    """The brackets of fits.json's ``points`` (those with ``bracket_lo`` / ``bracket_hi``)."""
    return tuple((p["run"], float(p["bracket_lo"]), float(p["bracket_hi"])) for p in points
                 if p.get("bracket_lo") is not None and p.get("bracket_hi") is not None)


def _clean_points(points, x_name: str, quantity: str, excluded) -> tuple[list, list]:
    kept, dropped = [], list(excluded)
    for point in points:
        run, x, y = point[:3]
        y_lo, y_hi = (point[3], point[4]) if len(point) == 5 else (None, None)
        xs = x if isinstance(x, tuple) else (x,)
        ok = y is not None and all(v is not None for v in xs)
        ok = ok and all(v > 0 and math.isfinite(v) for v in xs) and y > 0 and math.isfinite(y)
        if not ok:
            dropped.append((run, f"{x_name} = {x}, {quantity} = {y}: not positive"))
        else:
            kept.append((run, tuple(float(v) for v in xs) if isinstance(x, tuple) else float(x), float(y),
                         y_lo, y_hi))
    return kept, dropped


def fit_power_law(quantity: str, x_name: str,
                  points: Iterable[tuple[str, float, float] | tuple[str, float, float, float | None, float | None]], *,
                  censored: Iterable[tuple[str, float, float | None]] = (),
                  excluded: Iterable[tuple[str, str]] = (), ci: float = 0.95,
                  brackets: Mapping[str, tuple[float, float]] | None = None) -> PowerLawFit:
    """Fit ``y = A x^k`` to ``points`` (run, x, y[, y_lo, y_hi]) by the module docstring's method.

    ``brackets``: per run, the bracket the interval takes for its value where it is narrower than (lo, hi)
    (``Estimate.bracket``); the other runs' bracket is (lo, hi).

    Points with a non-positive x or y are moved to ``excluded``. Fewer than 2 distinct x -> not fitted (reason set);
    exactly 2 -> fitted without an interval (``ci_note`` says so).
    """
    if not 0 < ci < 1:
        raise AnalysisError(f"ci = {ci} must be in (0, 1), e.g. 0.95")
    kept, dropped = _clean_points(points, x_name, quantity, excluded)
    base = dict(quantity=quantity, x_name=x_name, points=tuple(kept), censored=tuple(censored),
                excluded=tuple(dropped), ci=ci)
    xs = np.array([[p[1]] for p in kept], dtype=float).reshape(len(kept), 1)
    ly = np.log10([p[2] for p in kept]) if kept else np.empty(0)
    cells = make_cells(xs, ly, [p[0] for p in kept])
    fit_brackets = used_brackets(kept, brackets)
    runs = RunBrackets.of_points(cells, xs, kept, brackets)
    ls = law_least_squares(cells, runs, ci) if len(cells) >= 2 else None
    if ls is None:
        return PowerLawFit(**base, cells=tuple(cells),
                           reason=f"fewer than 2 distinct {x_name} values among measured runs "
                                  f"({len(kept)} measured, {len(base['censored'])} censored)")
    k_lo, k_hi = ls.interval(1)
    c_lo, c_hi = ls.interval(0)
    note = None if ls.cov is not None else (f"only {len(cells)} distinct {x_name} values: a line through them has no "
                                            "interval (t with 0 degrees of freedom)")
    if ls.collinear:
        note = COLLINEAR_NOTE.format(factor=ls.factor)
    gof = goodness_of_fit(cells, ls, xs, ly, kept, runs, ci, (k_lo, k_hi), True, [x_name])
    return PowerLawFit(**base, exponent=float(ls.coef[1]), exponent_lo=k_lo, exponent_hi=k_hi,
                       prefactor=float(10 ** ls.coef[0]),
                       prefactor_lo=None if c_lo is None else float(10 ** c_lo),
                       prefactor_hi=None if c_hi is None else float(10 ** c_hi), ci_note=note,
                       df=ls.df, scatter=ls.scatter, beyond_brackets=ls.beyond_brackets,
                       floor=None if ls.floor is None else tuple(tuple(float(v) for v in row) for row in ls.floor),
                       z=ls.z,
                       cov=None if ls.cov is None else tuple(float(v) for v in ls.cov.ravel()), t=ls.t,
                       rounding_cov=(None if ls.rounding_cov is None
                                     else tuple(float(v) for v in ls.rounding_cov.ravel())),
                       factor=ls.factor, cells=tuple(cells), gof=gof, brackets=fit_brackets)


# --- the law of several variables ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class JointLawFit:
    """``y = prefactor * prod_j x_j ** exponents_j`` over cells of several variables (e.g. N and W), by the same
    method as :class:`PowerLawFit`. ``points``: (run, (x_1, ...), y, y_lo, y_hi); ``brackets`` as
    :class:`PowerLawFit`'s."""

    quantity: str
    x_names: tuple[str, ...]
    points: tuple[tuple[str, tuple[float, ...], float, float | None, float | None], ...]
    censored: tuple[tuple[str, tuple[float, ...], float | None], ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    exponents: tuple[float, ...] | None = None
    exponents_lo: tuple[float | None, ...] | None = None
    exponents_hi: tuple[float | None, ...] | None = None
    prefactor: float | None = None
    reason: str | None = None
    ci: float = 0.95
    df: int | None = None
    scatter: float | None = None
    cells: tuple[Cell, ...] = ()
    gof: GoodnessOfFit | None = None
    beyond_brackets: float | None = None
    floored: bool = False
    factor: float = 1.0
    brackets: tuple[tuple[str, float, float], ...] = ()

    @property
    def fitted(self) -> bool:
        return self.exponents is not None

    @property
    def set_by_brackets(self) -> bool:
        """As :attr:`PowerLawFit.set_by_brackets` (``interval_floored_by_brackets`` in fits.json)."""
        return self.fitted and self.exponents_lo[0] is not None and self.floored

    def resolution_note(self) -> str | None:
        """As :meth:`PowerLawFit.resolution_note`."""
        return resolution_note(self.set_by_brackets, self.points, self.brackets)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JointLawFit:
        """The fit of :meth:`to_dict` (as :meth:`PowerLawFit.from_dict`; AnalysisError when malformed)."""
        try:
            names = tuple(d["x"])

            def per_name(key: str) -> tuple | None:
                return None if d.get(key) is None else tuple(d[key][name] for name in names)

            def xs(entry: dict[str, Any]) -> tuple[float, ...]:
                return tuple(float(entry[name]) for name in names)

            return cls(
                quantity=d["quantity"], x_names=names,
                points=tuple((p["run"], xs(p), float(p["y"]), p.get("y_lo"), p.get("y_hi"))
                             for p in d.get("points", [])),
                censored=tuple((c["run"], xs(c), c.get("lower_bound")) for c in d.get("censored", [])),
                excluded=tuple((e["run"], e["reason"]) for e in d.get("excluded", [])),
                exponents=per_name("exponents"), exponents_lo=per_name("exponents_lo"),
                exponents_hi=per_name("exponents_hi"), prefactor=d.get("prefactor"), reason=d.get("reason"),
                ci=float(d.get("ci", 0.95)), df=d.get("df"), scatter=d.get("scatter_log10"),
                cells=tuple(Cell(xs(c), tuple(c["runs"]), math.log10(c["geometric_mean"]), c.get("spread_log10"))
                            for c in d.get("cells", [])),
                gof=GoodnessOfFit.from_dict(d["goodness_of_fit"]) if d.get("goodness_of_fit") else None,
                beyond_brackets=d.get("scatter_beyond_brackets_log10"),
                floored=bool(d.get("interval_floored_by_brackets")), factor=float(d.get("collinear_factor", 1.0)),
                brackets=brackets_of(d.get("points", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise AnalysisError(f"a joint law in fits.json is malformed ({e!r}); rerun `diffmem analyze`") from None

    def describe(self) -> str:
        if not self.fitted:
            return f"{self.quantity} vs {' and '.join(self.x_names)}: not fitted ({self.reason})"
        terms = []
        for name, k, lo, hi in zip(self.x_names, self.exponents, self.exponents_lo, self.exponents_hi):
            ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None else "[no interval]"
            terms.append(f"{name}^{k:.3f} {ci}")
        return (f"{self.quantity} ~ {self.prefactor:.3g} * " + " * ".join(terms)
                + f" ({len(self.points)} runs in {len(self.cells)} cells, t {self.df} df)"
                + (f"; {self.gof.summary()}" if self.gof else "")
                + brackets_suffix(self.set_by_brackets, self.points, self.brackets))

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantity": self.quantity, "x": list(self.x_names), "method": FIT_METHOD, "ci": self.ci,
            "exponents": None if self.exponents is None else dict(zip(self.x_names, self.exponents)),
            "exponents_lo": None if self.exponents_lo is None else dict(zip(self.x_names, self.exponents_lo)),
            "exponents_hi": None if self.exponents_hi is None else dict(zip(self.x_names, self.exponents_hi)),
            "prefactor": self.prefactor, "df": self.df, "scatter_log10": self.scatter,
            "scatter_beyond_brackets_log10": self.beyond_brackets, "interval_floored_by_brackets": self.floored,
            "collinear_factor": self.factor,
            "reason": self.reason,
            "n_runs": len(self.points),
            "goodness_of_fit": self.gof.to_dict() if self.gof else None,
            "cells": [c.to_dict(self.x_names) for c in self.cells],
            "points": [{"run": r, **dict(zip(self.x_names, x)), "y": y, "y_lo": lo, "y_hi": hi,
                        **bracket_cells(self.brackets, r)} for r, x, y, lo, hi in self.points],
            "censored": [{"run": r, **dict(zip(self.x_names, x)), "lower_bound": b} for r, x, b in self.censored],
            "excluded": [{"run": r, "reason": why} for r, why in self.excluded],
        }


def fit_joint_law(quantity: str, x_names: Sequence[str], points: Iterable[tuple], *,
                  censored: Iterable[tuple] = (), excluded: Iterable[tuple[str, str]] = (),
                  ci: float = 0.95, brackets: Mapping[str, tuple[float, float]] | None = None) -> JointLawFit:
    """Fit ``y = A prod_j x_j^k_j`` to ``points`` (run, (x_1, ..., x_p), y, y_lo, y_hi) by the module docstring's
    method. Not fitted (reason set) when the x values do not vary independently (e.g. one width only, or N and W
    changing together)."""
    if not 0 < ci < 1:
        raise AnalysisError(f"ci = {ci} must be in (0, 1), e.g. 0.95")
    names = tuple(x_names)
    kept, dropped = _clean_points(points, " and ".join(names), quantity, excluded)
    base = dict(quantity=quantity, x_names=names, points=tuple(kept), censored=tuple(censored),
                excluded=tuple(dropped), ci=ci)
    xs = np.array([p[1] for p in kept], dtype=float).reshape(len(kept), len(names))
    ly = np.log10([p[2] for p in kept]) if kept else np.empty(0)
    cells = make_cells(xs, ly, [p[0] for p in kept])
    fit_brackets = used_brackets(kept, brackets)
    runs = RunBrackets.of_points(cells, xs, kept, brackets)
    ls = law_least_squares(cells, runs, ci) if len(cells) > len(names) else None
    if ls is None:
        return JointLawFit(**base, cells=tuple(cells),
                           reason=f"{len(cells)} cells do not determine {len(names)} exponents (each variable must "
                                  "vary on its own, in at least " + str(len(names) + 1) + " cells)")
    ends = [ls.interval(j + 1) for j in range(len(names))]
    gof = goodness_of_fit(cells, ls, xs, ly, kept, runs, ci, (None, None), False, names)
    return JointLawFit(**base, exponents=tuple(float(v) for v in ls.coef[1:]),
                       exponents_lo=tuple(e[0] for e in ends), exponents_hi=tuple(e[1] for e in ends),
                       prefactor=float(10 ** ls.coef[0]), df=ls.df, scatter=ls.scatter, cells=tuple(cells), gof=gof,
                       beyond_brackets=ls.beyond_brackets, floored=ls.floor is not None, factor=ls.factor,
                       brackets=fit_brackets)


@dataclass(frozen=True)
class FitSet:
    """One law in one variable: over all runs, and per group of runs that agree on the other varied setting
    (``group_key`` "width" for a law in N, "n" for a law in W; None = no groups).

    ``all_runs`` is fitted only when the runs agree on ``group_key`` (one group): a law in N over runs of several
    widths would mix the effect of N with that of W, so where the runs differ (several groups) it is not fitted, its
    ``reason`` says so, and the laws are the groups' (diffmem.analysis.scaling)."""

    all_runs: PowerLawFit
    groups: dict[str, PowerLawFit] = field(default_factory=dict)
    group_key: str | None = None

    def laws(self) -> list[tuple[str, PowerLawFit]]:
        """The laws over comparable runs, each with the runs it covers: ``("width = 8", fit)`` per group when the
        runs differ in ``group_key`` and some group has a law; else ``(label, all_runs)``, labelled by the one group
        (``"width = 32"``) or "all runs" (no groups, or none fitted: the reason is then said once)."""
        if self.group_key is None or not self.groups:
            return [("all runs", self.all_runs)]
        if len(self.groups) == 1:
            (value,) = self.groups
            return [(f"{self.group_key} = {value}", self.all_runs)]
        if not any(fit.fitted for fit in self.groups.values()):
            return [("all runs", self.all_runs)]
        return [(f"{self.group_key} = {value}", fit) for value, fit in self.groups.items()]

    def to_dict(self) -> dict[str, Any]:
        out = self.all_runs.to_dict()
        if self.group_key is not None:
            out[f"by_{self.group_key}"] = {k: f.to_dict() for k, f in self.groups.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitSet:
        for key in ("width", "n"):
            if f"by_{key}" in d:
                groups = {k: PowerLawFit.from_dict(v) for k, v in d[f"by_{key}"].items()}
                return cls(PowerLawFit.from_dict(d), groups, key)
        return cls(PowerLawFit.from_dict(d))


JOINT_FIT_NAMES: tuple[str, ...] = ("tau_mem_vs_n_and_width", "tau_gen_vs_n_and_width", "tau_bias_vs_n_and_width")
"""Laws of N and W together (:class:`JointLawFit`); fitted only where both vary in the experiment (tau_bias's only in
an experiment with split pairs)."""


def load_fits(path: str | Path) -> dict[str, FitSet]:
    """Read fits.json (or the fits.json of an experiment folder) back into :class:`FitSet` objects (the laws of one
    variable; level-crossing laws ``tau_mem_at_*`` and ``tau_bias_at_*`` included)."""
    path = Path(path)
    if path.is_dir():
        path = path / "fits.json"
    data = read_json(path)
    if not isinstance(data, dict):
        raise AnalysisError(f"{path} is not a fits.json (a JSON object of fitted laws); rerun `diffmem analyze` on "
                            "its folder to write it again")
    missing = [name for name in FIT_NAMES if name not in data]
    if missing:
        raise AnalysisError(f"{path} lacks {', '.join(missing)}; rerun `diffmem analyze` with this version")
    if data.get("method_name") != FIT_METHOD:
        raise AnalysisError(f"{path} was written with fit method {data.get('method_name', 'bootstrap over runs')!r} "
                            f"by diffmem {data.get('diffmem_version')}; rerun `diffmem analyze` on its folder")
    names = [k for k in data if k in FIT_NAMES + EXTRA_FIT_NAMES or k.startswith(("tau_mem_at_", "tau_bias_at_"))]
    for name in names:
        if (problem := fit_problem(data[name], name)) is not None:
            raise AnalysisError(f"{path}: {problem}; the file is damaged: rerun `diffmem analyze` on its folder to "
                                "write it again")
    fits = {}
    for name in names:
        try:
            fits[name] = FitSet.from_dict(data[name])
        except AnalysisError as e:
            detail = str(e).split("(", 1)[-1].rsplit(")", 1)[0]
            raise AnalysisError(f"{path}: '{name}' is malformed ({detail}); the file is damaged: rerun `diffmem "
                                "analyze` on its folder to write it again") from None
    return fits


FIT_NUMBERS = ("exponent", "exponent_lo", "exponent_hi", "prefactor", "prefactor_lo", "prefactor_hi", "ci", "df", "t",
               "scatter_log10", "x_min", "x_max", "collinear_factor")
"""Keys of a fit in fits.json that hold a finite number or null."""
FIT_POSITIVE = ("prefactor", "prefactor_lo", "prefactor_hi", "x_min", "x_max")
"""Keys of a fit that are logarithms' arguments: > 0 where not null."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fit_problem(d: Any, key: str) -> str | None:
    """What is wrong with the fit ``d`` stored under ``key`` of fits.json (a phrase naming the key path), None when
    :meth:`PowerLawFit.from_dict` and the predictions can use it: numbers finite (no NaN or infinity) or null,
    prefactors and x > 0, a fitted law (exponent set) with a prefactor, a covariance of four numbers, points and
    cells with positive finite values (a point's bracket too, where it has one), and the same for each fit of
    ``by_width`` / ``by_n``."""
    if not isinstance(d, dict):
        return f"'{key}' is {type(d).__name__}, not a fit (a JSON object)"
    for name in ("quantity", "x"):
        if not isinstance(d.get(name), str):
            return f"'{key}.{name}' is {d.get(name)!r}, not a name"
    for name in FIT_NUMBERS:
        value = d.get(name)
        if value is not None and not _finite(value):
            return f"'{key}.{name}' is {value!r}, not a finite number or null"
        if name in FIT_POSITIVE and value is not None and value <= 0:
            return f"'{key}.{name}' is {value!r}, not > 0"
    if d.get("t") is not None and d["t"] < 0:
        return f"'{key}.t' is {d['t']!r}, below 0"
    if d.get("exponent") is not None and d.get("prefactor") is None:
        return f"'{key}.prefactor' is null while the law has an exponent"
    for name in ("cov_log10", "rounding_cov_log10"):
        cov = d.get(name)
        if cov is not None and not (isinstance(cov, list) and len(cov) == 4 and all(_finite(c) for c in cov)):
            return f"'{key}.{name}' is {cov!r}, not four finite numbers or null"
    if d.get("collinear_factor") is not None and d["collinear_factor"] < 1:
        return f"'{key}.collinear_factor' is {d['collinear_factor']!r}, below 1"
    for group, fields in (("points", ("x", "y")), ("cells", ("geometric_mean", d.get("x")))):
        items = d.get(group, [])
        if not isinstance(items, list):
            return f"'{key}.{group}' is {type(items).__name__}, not a list"
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                return f"'{key}.{group}[{i}]' is {type(item).__name__}, not an object"
            for field_name in fields:
                if not (_finite(item.get(field_name)) and item[field_name] > 0):
                    return f"'{key}.{group}[{i}].{field_name}' is {item.get(field_name)!r}, not a number > 0"
            for field_name in (("bracket_lo", "bracket_hi") if group == "points" else ()):
                value = item.get(field_name)
                if value is not None and not (_finite(value) and value > 0):
                    return f"'{key}.{group}[{i}].{field_name}' is {value!r}, not a number > 0 or null"
    for by in ("by_width", "by_n"):
        if by in d:
            if not isinstance(d[by], dict):
                return f"'{key}.{by}' is {type(d[by]).__name__}, not an object of fits"
            for group, fit in d[by].items():
                try:
                    float(group)
                except ValueError:
                    return f"'{key}.{by}' has the group {group!r}, not a number ({by[3:]})"
                if (problem := fit_problem(fit, f"{key}.{by}.{group}")) is not None:
                    return problem
    return None
