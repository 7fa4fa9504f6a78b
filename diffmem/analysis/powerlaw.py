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
  measurement's resolution (:func:`cell_least_squares`). Each tau is known only within its interval [lo, hi] (its
  bracket); taken as uniform in log10 it has the variance ``(log10 hi/lo)^2 / 12``, and a cell mean ``v_i``, the sum
  over its runs divided by runs^2. The residual scatter of the cell means is split into that known part and the
  scatter beyond the brackets, ``b^2 = max(0, (RSS - sum_i (1 - h_i) v_i) / df)`` (``h_i``: the cell's leverage).
  With ``b^2 > 0``: ``cov = C diag(b^2 + v) C'`` (``C = (X'X)^-1 X'``) and ``exponent +- t(0.975, df) * se``; when
  every cell's brackets are alike this is the plain t interval on the residual scatter, and a coarse bracket weighs
  by its width. With ``b^2 = 0`` (the residuals are no larger than the brackets alone explain) the residuals cannot
  say how the brackets' errors correlate: on one evaluation grid shared by every x they are the same function of
  tau, and three or four bracket midpoints can lie almost on a line with the wrong slope. The interval is then the
  wider of the plain t interval and the normal interval of the brackets' worst case, errors of one sign:
  ``+- z(0.975) * sum_i |C_ji| sqrt(v_i)``. With ``df = 0`` (as many cells as parameters) there is no interval. Its
  coverage was measured by simulation (:mod:`diffmem.analysis.coverage`): planted laws, 3-9 x values, 1 and 3
  seeds, log-normal scatter 5-30 %, each tau reported as its bracket on an evaluation grid drawn per x, shared by
  every x, the paper's checkpoints or the suite's log-spaced rule, with and without refinement.
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
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from scipy import optimize, special, stats

from diffmem.analysis.runfiles import read_json

FIT_NAMES: tuple[str, ...] = ("tau_mem_vs_n", "tau_gen_vs_n", "tau_gen_vs_width", "tau_mem_vs_n_over_width")
EXTRA_FIT_NAMES: tuple[str, ...] = ("tau_mem_epochs_vs_n", "tau_mem_vs_width", "tau_bias_vs_n", "tau_bias_vs_width")
"""Fits added after fits.json files were first written, or written only for some experiments (tau_bias: split
pairs); loaded when present."""


FIT_METHOD = "ols-cell-means-t-bracket-variance"
FIT_METHOD_TEXT = ("log10 least squares on cell means (the runs of one x averaged in log10: seeds are replicates); "
                   "95% interval: Student t with (cells - parameters) degrees of freedom on each cell mean's bracket "
                   "variance plus the scatter beyond the brackets estimated from the residuals, and where the "
                   "brackets explain all the scatter at least the normal interval of their worst case (errors of "
                   "one sign); goodness of fit: lack-of-fit F test against free cell means (pure error: within-cell "
                   "variance + bracket variance) when seeds exist, and the lines through every run's interval")
"""The fit method's name in fits.json and its one-line description (the module docstring has the whole rule)."""

OLD_FIT_METHOD = "bootstrap-over-runs"
"""The method of fits written by diffmem <= 0.3 (percentile bootstrap over runs; its coverage: docs/analysis.md).
diffmem 0.4 wrote "ols-cell-means-t" (the t interval on the residual scatter alone); :func:`load_fits` refuses
both."""

LACK_OF_FIT_LEVEL = 0.05
"""A law is called inconsistent with its points when the lack-of-fit test's p-value is below this."""


class AnalysisError(ValueError):
    """Bad input to the across-run analysis; the message says what to do."""


Point = tuple[str, float, float, "float | None", "float | None"]
"""(run, x, tau, tau_lo, tau_hi): a measured run; x and tau > 0; the interval may be None (unknown)."""


# --- the computation: cells, least squares, t interval, lack of fit -----------------------------------------------

@dataclass(frozen=True)
class Cell:
    """The runs at one x (one value per variable): ``mean`` and ``spread`` are the mean and the standard deviation
    (ddof 1; None with one run) of ``log10 tau`` over them."""

    x: tuple[float, ...]
    runs: tuple[str, ...]
    mean: float
    spread: float | None

    def label(self, names: Sequence[str]) -> str:
        return ", ".join(f"{name}={value:g}" for name, value in zip(names, self.x))

    def to_dict(self, names: Sequence[str]) -> dict[str, Any]:
        return {**{name: value for name, value in zip(names, self.x)}, "runs": list(self.runs),
                "n_runs": len(self.runs), "geometric_mean": 10 ** self.mean,
                "spread_log10": self.spread}


def make_cells(xs: np.ndarray, ly: np.ndarray, runs: Sequence[str]) -> list[Cell]:
    """Group runs by x. ``xs``: shape (n_runs, n_vars), ``ly``: log10 tau, shape (n_runs,); cells sorted by x."""
    keys = sorted({tuple(float(v) for v in row) for row in xs})
    cells = []
    for key in keys:
        idx = [i for i, row in enumerate(xs) if tuple(float(v) for v in row) == key]
        vals = ly[idx]
        cells.append(Cell(key, tuple(runs[i] for i in idx), float(vals.mean()),
                          float(vals.std(ddof=1)) if len(idx) > 1 else None))
    return cells


@dataclass(frozen=True)
class LeastSquares:
    """Least squares of cell means on ``[1, log10 x1, log10 x2, ...]`` and its interval (module docstring,
    "Interval"): ``coef`` (intercept, slopes); ``cov`` their covariance, read with the two-sided Student-t quantile
    ``t`` (None without degrees of freedom); ``df`` = cells - parameters; ``scatter`` the residual standard deviation
    of a cell mean in log10 and ``beyond_brackets`` the part of it that the cells' brackets do not explain (both None
    when df = 0); ``floor``: when the brackets explain all the residual scatter, the rows ``(C_i..., sd_i)`` of the
    brackets' worst-case term (``C = (X'X)^-1 X'``, one row per cell, ``sd_i`` its bracket standard deviation), read
    with the normal quantile ``z``; None otherwise."""

    coef: np.ndarray
    cov: np.ndarray | None
    df: int
    scatter: float | None
    t: float | None
    beyond_brackets: float | None = None
    floor: np.ndarray | None = None
    z: float | None = None

    def half_width(self, a: np.ndarray) -> float | None:
        """The half width (log10) of the interval of ``a @ coef`` (None without one): ``t * sqrt(a' cov a)``, and
        never less than ``z * sum_i |a' C_i| sd_i`` when the brackets set the floor."""
        return interval_half_width(a, self.cov, self.t, self.floor, self.z)

    def interval(self, j: int) -> tuple[float | None, float | None]:
        """The interval of coefficient ``j`` (0 = log10 prefactor)."""
        a = np.zeros(self.coef.size)
        a[j] = 1.0
        half = self.half_width(a)
        if half is None:
            return None, None
        return float(self.coef[j] - half), float(self.coef[j] + half)


def interval_half_width(a: np.ndarray, cov: np.ndarray | None, t: float | None, floor: np.ndarray | None,
                        z: float | None) -> float | None:
    """The half width of the interval of the linear combination ``a`` of a law's coefficients (log10): the t part
    ``t * sqrt(a' cov a)`` and, where ``floor`` (rows ``(C_i..., sd_i)``) is given, at least the brackets' worst
    case ``z * sum_i |a' C_i| sd_i``. None without a covariance."""
    if cov is None or t is None:
        return None
    half = t * math.sqrt(max(float(a @ cov @ a), 0.0))
    if floor is not None and z is not None:
        half = max(half, z * float(np.abs(floor[:, :-1] @ a) @ floor[:, -1]))
    return half


def design_matrix(cells: Sequence[Cell]) -> np.ndarray:
    """The least-squares design of ``cells``: rows ``[1, log10 x1, log10 x2, ...]``, shape (cells, 1 + variables)."""
    return np.column_stack([np.ones(len(cells)), np.log10([c.x for c in cells])])


@lru_cache(maxsize=256)
def t_quantile(ci: float, df: int) -> float:
    """The two-sided Student-t quantile of level ``ci`` with ``df`` degrees of freedom (cached: the coverage study
    asks for the same few thousands of times)."""
    return float(stats.t.ppf(0.5 + ci / 2, df))


@lru_cache(maxsize=16)
def z_quantile(ci: float) -> float:
    """The two-sided normal quantile of level ``ci`` (1.96 for 0.95)."""
    return float(stats.norm.ppf(0.5 + ci / 2))


def cell_least_squares(cells: Sequence[Cell], ci: float,
                       cell_variance: np.ndarray | None = None) -> LeastSquares | None:
    """The fit of :class:`LeastSquares`, or None when the design is singular (e.g. one distinct x).

    ``cell_variance`` (log10^2, one per cell, :func:`cell_bracket_variance`): the variance each cell mean has from
    its runs' brackets alone, ``v_i``; None or zeros: no bracket is known, and this is the plain t interval on the
    residual scatter. Otherwise (module docstring, "Interval") the scatter beyond the brackets is estimated as
    ``b^2 = max(0, (RSS - sum_i (1 - h_i) v_i) / df)`` (``h_i``: the cell's leverage, so that ``E[RSS] = sum_i
    (1 - h_i) (b^2 + v_i)``). With ``b^2 > 0``: ``cov = C diag(b^2 + v) C'`` (``C = (X'X)^-1 X'``), read with t;
    with every ``v_i`` equal it is the plain ``s^2 (X'X)^-1``. With ``b^2 = 0`` (the residuals are no larger than
    the brackets alone explain): ``cov = s^2 (X'X)^-1`` with t, floored at the brackets' worst case."""
    design = design_matrix(cells)
    y = np.array([c.mean for c in cells])
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    if rank < design.shape[1]:
        return None
    df = len(cells) - design.shape[1]
    if df <= 0:
        return LeastSquares(coef, None, 0, None, None)
    resid = y - design @ coef
    rss = float(resid @ resid)
    weights = np.linalg.inv(design.T @ design) @ design.T  # C: coefficients = C @ cell means
    v = np.zeros(len(cells)) if cell_variance is None else np.asarray(cell_variance, dtype=float)
    leverage = np.einsum("ij,ji->i", design, weights)
    beyond2 = max(0.0, (rss - float(((1.0 - leverage) * v).sum())) / df)
    t = t_quantile(ci, df)
    if beyond2 > 0 or not v.any():
        return LeastSquares(coef, (weights * (beyond2 + v)) @ weights.T, df, math.sqrt(rss / df), t,
                            math.sqrt(beyond2))
    floor = np.column_stack([weights.T, np.sqrt(v)])
    return LeastSquares(coef, rss / df * (weights @ weights.T), df, math.sqrt(rss / df), t, 0.0, floor,
                        z_quantile(ci))


def bracket_variances(lo: Sequence[float | None], hi: Sequence[float | None]) -> np.ndarray:
    """The variance (log10 units) of each tau known only to lie within its interval [lo, hi], taken as uniform in log:
    ``log10(hi / lo) ** 2 / 12``; 0 where the interval is unknown. Shape (n,)."""
    out = np.zeros(len(lo))
    for i, (a, b) in enumerate(zip(lo, hi)):
        if a is not None and b is not None and 0 < a < b:
            out[i] = math.log10(b / a) ** 2 / 12.0
    return out


@dataclass(frozen=True)
class GoodnessOfFit:
    """Whether one power law is consistent with all points (the module docstring has the rules).

    ``test``: the name of the test, None when none is possible (``note`` says why); ``statistic``, ``df`` (numerator,
    denominator) and ``p_value`` of it; ``consistent``: p >= :data:`LACK_OF_FIT_LEVEL` (None untested).
    ``slopes_through_intervals``: the range of exponents of the lines that pass through every run's interval (None
    when none passes; not computed for joint laws or when a run has no interval, then ``line_through_intervals`` is
    None); ``restoring``: cells whose removal alone lets such a line pass (with 4 or more cells); ``influential``: (cell, exponent without
    it) for each cell whose removal moves the exponent outside the fit's interval (``exponents_without``: the
    exponent without each cell, for every cell); ``outliers``: (cell, t, Bonferroni p) for each cell whose
    externally studentized residual (its distance from the law fitted to the other cells, in units of that law's
    prediction error, Student t with cells - 3 df) has a Bonferroni-adjusted two-sided p below
    :data:`LACK_OF_FIT_LEVEL`. A far-off cell inflates the fit's own interval, so ``influential`` rarely fires
    (masking); ``outliers`` is the test that finds such a cell.
    """

    test: str | None = None
    statistic: float | None = None
    df: tuple[int, int] | None = None
    p_value: float | None = None
    consistent: bool | None = None
    line_through_intervals: bool | None = None
    slopes_through_intervals: tuple[float, float] | None = None
    restoring: tuple[str, ...] = ()
    influential: tuple[tuple[str, float], ...] = ()
    exponents_without: tuple[tuple[str, float], ...] = ()
    outliers: tuple[tuple[str, float, float], ...] = ()
    note: str = ""

    def flagged(self) -> list[str]:
        """Plain sentences for the report: what fails and which points are responsible (empty when nothing is)."""
        out = []
        if self.consistent is False:
            out.append(f"one power law is rejected by the lack-of-fit test (p = {self.p_value:.2g})")
        if self.line_through_intervals is False:
            text = "no single line passes through every run's interval"
            if self.restoring:
                text += "; without " + " or without ".join(self.restoring) + " one does"
            out.append(text)
        for label, exponent in self.influential:
            out.append(f"without {label} the exponent is {exponent:.2f}, outside the interval")
        for label, t, p in self.outliers:
            out.append(f"{label} lies off the law of the other cells (studentized residual {t:.1f}, "
                       f"Bonferroni p = {p:.2g})")
        return out

    def summary(self) -> str:
        """One line: the test's result (or why there is none) and the flags."""
        head = (f"lack of fit p = {self.p_value:.2g}" if self.p_value is not None else "lack of fit: not testable")
        if self.slopes_through_intervals is not None:
            lo, hi = self.slopes_through_intervals
            head += f"; lines through every interval: slopes [{lo:.2f}, {hi:.2f}]"
        flags = self.flagged()
        return head + ("; " + "; ".join(flags) if flags else "")

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test, "statistic": self.statistic, "df": list(self.df) if self.df else None,
                "p_value": self.p_value, "consistent": self.consistent, "level": LACK_OF_FIT_LEVEL,
                "line_through_intervals": self.line_through_intervals,
                "slopes_through_intervals": list(self.slopes_through_intervals)
                if self.slopes_through_intervals else None,
                "restoring": list(self.restoring),
                "influential": [{"cell": c, "exponent_without": e} for c, e in self.influential],
                "exponents_without": {c: e for c, e in self.exponents_without},
                "outliers": [{"cell": c, "t": t, "p_bonferroni": p} for c, t, p in self.outliers],
                "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GoodnessOfFit:
        return cls(test=d.get("test"), statistic=d.get("statistic"),
                   df=tuple(d["df"]) if d.get("df") else None, p_value=d.get("p_value"),
                   consistent=d.get("consistent"), line_through_intervals=d.get("line_through_intervals"),
                   slopes_through_intervals=tuple(d["slopes_through_intervals"])
                   if d.get("slopes_through_intervals") else None,
                   restoring=tuple(d.get("restoring", ())),
                   influential=tuple((i["cell"], float(i["exponent_without"])) for i in d.get("influential", ())),
                   exponents_without=tuple((c, float(e)) for c, e in (d.get("exponents_without") or {}).items()),
                   outliers=tuple((o["cell"], float(o["t"]), float(o["p_bonferroni"])) for o in d.get("outliers", ())),
                   note=d.get("note", ""))


def lack_of_fit(cells: Sequence[Cell], ls: LeastSquares, ly: np.ndarray, variances: np.ndarray,
                cell_of: np.ndarray) -> tuple[float, tuple[int, int], float] | None:
    """(F, (df1, df2), p) of the lack-of-fit test, or None without seeds or without degrees of freedom.

    ``ly``: log10 tau per run, ``variances``: each run's bracket variance, ``cell_of``: each run's cell index. The
    numerator is the cell means' mean squared residual about the law; the denominator the variance of a cell mean if
    the law held: ``(s_pe^2 + mean bracket variance of the cell) / runs in the cell``, averaged over cells, with
    ``s_pe^2`` the pooled within-cell variance (df2 = runs - cells).
    """
    n_runs, n_cells = ly.size, len(cells)
    df1, df2 = ls.df, n_runs - n_cells
    if df1 <= 0 or df2 <= 0:
        return None
    design = design_matrix(cells)
    resid = np.array([c.mean for c in cells]) - design @ ls.coef
    means = np.array([c.mean for c in cells])
    s_pe2 = float(((ly - means[cell_of]) ** 2).sum()) / df2
    sizes = np.bincount(cell_of, minlength=n_cells)
    v_cell = np.bincount(cell_of, weights=variances, minlength=n_cells) / sizes
    expected = float(np.mean((s_pe2 + v_cell) / sizes))
    if expected <= 0:
        return None
    f_stat = float(resid @ resid) / df1 / expected
    return f_stat, (df1, df2), float(stats.f.sf(f_stat, df1, df2))


def leave_one_out(cells: Sequence[Cell], ci: float, names: Sequence[str],
                  cell_variance: np.ndarray | None = None) -> tuple[list[tuple[str, float]],
                                                                   list[tuple[str, float, float]]]:
    """Each cell left out in turn: (label, first exponent of the law fitted to the others) for every cell whose
    removal leaves a fittable law, and (label, t, Bonferroni p) for each outlying cell: its externally studentized
    residual ``t = (mean - prediction) / (s * sqrt(1 + x0' (X'X)^-1 x0))`` from the law of the other cells (Student
    t with their df), two-sided p times the number of cells, below :data:`LACK_OF_FIT_LEVEL`.

    ``cell_variance`` (log10^2, one per cell): the variance that each cell mean has from its runs' brackets alone
    (:func:`cell_bracket_variance`). ``s`` is never taken below the root of its mean over the other cells: cells
    known only to within their brackets cannot scatter less than that, and three bracket midpoints that happen to lie
    on one line (s ~ 0) would otherwise make any fourth point an outlier."""
    without: list[tuple[str, float]] = []
    outliers: list[tuple[str, float, float]] = []
    floor = np.zeros(len(cells)) if cell_variance is None else np.asarray(cell_variance, dtype=float)
    for i, c in enumerate(cells):
        rest = [d for j, d in enumerate(cells) if j != i]
        sub = cell_least_squares(rest, ci) if len(rest) >= 2 else None
        if sub is None:
            continue
        without.append((c.label(names), float(sub.coef[1])))
        if sub.cov is None:
            continue
        scatter = max(sub.scatter, math.sqrt(float(np.delete(floor, i).mean())))
        if scatter <= 0:
            continue
        x0 = np.concatenate([[1.0], np.log10(c.x)])
        unscaled = sub.cov / sub.scatter ** 2 if sub.scatter > 0 else _unscaled_cov(rest)
        se = scatter * math.sqrt(1.0 + float(x0 @ unscaled @ x0))
        t_stat = (c.mean - float(x0 @ sub.coef)) / se
        p_adj = min(1.0, len(cells) * 2 * float(special.stdtr(sub.df, -abs(t_stat))))  # = t.sf(|t|, df)
        if p_adj < LACK_OF_FIT_LEVEL:
            outliers.append((c.label(names), float(t_stat), p_adj))
    return without, outliers


def _unscaled_cov(cells: Sequence[Cell]) -> np.ndarray:
    """(X'X)^-1 of the cells' design [1, log10 x...]."""
    design = design_matrix(cells)
    return np.linalg.inv(design.T @ design)


def cell_bracket_variance(variances: np.ndarray, cell_of: np.ndarray, n_cells: int) -> np.ndarray:
    """Per cell, the variance of its mean from its runs' brackets, each run's independent of the others':
    ``sum of run bracket variances / runs^2`` (log10^2), shape (n_cells,)."""
    sizes = np.bincount(cell_of, minlength=n_cells)
    return np.bincount(cell_of, weights=variances, minlength=n_cells) / sizes ** 2


def cells_bracket_variance(cells: Sequence[Cell], xs: np.ndarray, kept: Sequence) -> tuple[np.ndarray, np.ndarray,
                                                                                          np.ndarray]:
    """(cell index of each run, each run's bracket variance, each cell's bracket variance) of the runs ``kept``
    (rows of ``xs``) grouped into ``cells``."""
    index = {c.x: i for i, c in enumerate(cells)}
    cell_of = np.array([index[tuple(float(v) for v in row)] for row in xs], dtype=int)
    variances = bracket_variances([p[3] for p in kept], [p[4] for p in kept])
    return cell_of, variances, cell_bracket_variance(variances, cell_of, len(cells))


def slopes_through_intervals(lx: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[float, float] | None:
    """The smallest and largest slope k of the lines a + k lx that pass through every interval [lo_i, hi_i] (log10
    units, shape (n,)), by linear programming; None when no line passes."""
    a_ub = np.concatenate([np.column_stack([np.ones_like(lx), lx]), -np.column_stack([np.ones_like(lx), lx])])
    b_ub = np.concatenate([hi, -lo])
    ends = []
    for sign in (1.0, -1.0):
        res = optimize.linprog([0.0, sign], A_ub=a_ub, b_ub=b_ub, bounds=[(None, None), (None, None)],
                               method="highs")
        if res.status == 2:  # infeasible
            return None
        if res.status != 0:  # unbounded (e.g. all x equal) or numerical trouble: no finite answer
            return None
        ends.append(float(res.x[1]))
    return ends[0], ends[1]


# --- the law of one variable ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PowerLawFit:
    """``y = prefactor * x ** exponent`` fitted in log-log space over cells of runs (module docstring).

    ``points``: (run, x, y, y_lo, y_hi) of the measured runs used (y_lo/y_hi: the run's own interval, None when
    unknown); ``censored``: (run, x, bound) left out because tau is a bound; ``excluded``: (run, reason) left out
    because tau is missing. ``reason`` is None when fitted, else why not. ``df``, ``scatter`` (residual standard
    deviation of a cell mean, log10) and ``cov`` (covariance of log10 prefactor and exponent, row-major 2 x 2) carry
    the interval; ``ci_note`` says when there is none. ``gof`` is the goodness of fit.
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

    @property
    def fitted(self) -> bool:
        return self.exponent is not None

    @property
    def n_runs(self) -> int:
        return len(self.points)

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
        half = np.vectorize(lambda v: interval_half_width(np.array([1.0, v]), cov, self.t, floor, self.z))(lxq)
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
            "n_runs": self.n_runs, "n_x": len({p[1] for p in self.points}),
            "x_min": rng[0] if rng else None, "x_max": rng[1] if rng else None,
            "reason": self.reason, "ci_note": self.ci_note,
            "goodness_of_fit": self.gof.to_dict() if self.gof else None,
            "cells": [c.to_dict([self.x_name]) for c in self.cells],
            "points": [{"run": r, "x": x, "y": y, "y_lo": lo, "y_hi": hi} for r, x, y, lo, hi in self.points],
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
        return text + (f"; {self.gof.summary()}" if self.gof else "")


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


def _goodness(cells: list[Cell], ls: LeastSquares, xs: np.ndarray, ly: np.ndarray, kept: list, ci: float,
              exponent_ci: tuple[float | None, float | None], one_variable: bool,
              names: Sequence[str]) -> GoodnessOfFit:
    """The goodness of fit of a law fitted to ``cells`` (module docstring)."""
    cell_of, variances, per_cell = cells_bracket_variance(cells, xs, kept)
    lof = lack_of_fit(cells, ls, ly, variances, cell_of)
    if lof is not None:
        f_stat, dfs, p = lof
        test = dict(test="lack-of-fit F (pure error: within-cell variance + bracket variance)", statistic=f_stat,
                    df=dfs, p_value=p, consistent=p >= LACK_OF_FIT_LEVEL)
        note = ""
    else:
        test = {}
        note = ("one run per x: lack of fit cannot be told from run-to-run scatter without seeds; no p-value"
                if ly.size == len(cells) else "too few cells for a lack-of-fit test")
    line = slopes = None
    restoring: list[str] = []
    influential: list[tuple[str, float]] = []
    have_intervals = all(p[3] is not None and p[4] is not None and 0 < p[3] <= p[2] <= p[4] for p in kept)
    if one_variable and have_intervals:
        lx = np.log10(xs[:, 0])
        lo = np.log10([p[3] for p in kept])
        hi = np.log10([p[4] for p in kept])
        slopes = slopes_through_intervals(lx, lo, hi)
        line = slopes is not None
        if not line and len(cells) >= 4:  # with 3 cells any 2 admit a line: naming them says nothing
            for i, c in enumerate(cells):
                keep = cell_of != i
                if len({float(v) for v in lx[keep]}) >= 2 and slopes_through_intervals(lx[keep], lo[keep],
                                                                                       hi[keep]) is not None:
                    restoring.append(c.label(names))
    k_lo, k_hi = exponent_ci
    without, outliers = leave_one_out(cells, ci, names, per_cell)
    if one_variable and k_lo is not None:
        influential = [(label, k) for label, k in without if not k_lo <= k <= k_hi]
    return GoodnessOfFit(**test, line_through_intervals=line, slopes_through_intervals=slopes,
                         restoring=tuple(restoring), influential=tuple(influential),
                         exponents_without=tuple(without) if one_variable else (), outliers=tuple(outliers),
                         note=note)


def fit_power_law(quantity: str, x_name: str,
                  points: Iterable[tuple[str, float, float] | tuple[str, float, float, float | None, float | None]], *,
                  censored: Iterable[tuple[str, float, float | None]] = (),
                  excluded: Iterable[tuple[str, str]] = (), ci: float = 0.95) -> PowerLawFit:
    """Fit ``y = A x^k`` to ``points`` (run, x, y[, y_lo, y_hi]) by the module docstring's method.

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
    ls = cell_least_squares(cells, ci, cells_bracket_variance(cells, xs, kept)[2]) if len(cells) >= 2 else None
    if ls is None:
        return PowerLawFit(**base, cells=tuple(cells),
                           reason=f"fewer than 2 distinct {x_name} values among measured runs "
                                  f"({len(kept)} measured, {len(base['censored'])} censored)")
    k_lo, k_hi = ls.interval(1)
    c_lo, c_hi = ls.interval(0)
    note = None if ls.cov is not None else (f"only {len(cells)} distinct {x_name} values: a line through them has no "
                                            "interval (t with 0 degrees of freedom)")
    gof = _goodness(cells, ls, xs, ly, kept, ci, (k_lo, k_hi), True, [x_name])
    return PowerLawFit(**base, exponent=float(ls.coef[1]), exponent_lo=k_lo, exponent_hi=k_hi,
                       prefactor=float(10 ** ls.coef[0]),
                       prefactor_lo=None if c_lo is None else float(10 ** c_lo),
                       prefactor_hi=None if c_hi is None else float(10 ** c_hi), ci_note=note,
                       df=ls.df, scatter=ls.scatter, beyond_brackets=ls.beyond_brackets,
                       floor=None if ls.floor is None else tuple(tuple(float(v) for v in row) for row in ls.floor),
                       z=ls.z,
                       cov=None if ls.cov is None else tuple(float(v) for v in ls.cov.ravel()), t=ls.t,
                       cells=tuple(cells), gof=gof)


# --- the law of several variables ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class JointLawFit:
    """``y = prefactor * prod_j x_j ** exponents_j`` over cells of several variables (e.g. N and W), by the same
    method as :class:`PowerLawFit`. ``points``: (run, (x_1, ...), y, y_lo, y_hi)."""

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

    @property
    def fitted(self) -> bool:
        return self.exponents is not None

    def describe(self) -> str:
        if not self.fitted:
            return f"{self.quantity} vs {' and '.join(self.x_names)}: not fitted ({self.reason})"
        terms = []
        for name, k, lo, hi in zip(self.x_names, self.exponents, self.exponents_lo, self.exponents_hi):
            ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None else "[no interval]"
            terms.append(f"{name}^{k:.3f} {ci}")
        return (f"{self.quantity} ~ {self.prefactor:.3g} * " + " * ".join(terms)
                + f" ({len(self.points)} runs in {len(self.cells)} cells, t {self.df} df)"
                + (f"; {self.gof.summary()}" if self.gof else ""))

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantity": self.quantity, "x": list(self.x_names), "method": FIT_METHOD, "ci": self.ci,
            "exponents": None if self.exponents is None else dict(zip(self.x_names, self.exponents)),
            "exponents_lo": None if self.exponents_lo is None else dict(zip(self.x_names, self.exponents_lo)),
            "exponents_hi": None if self.exponents_hi is None else dict(zip(self.x_names, self.exponents_hi)),
            "prefactor": self.prefactor, "df": self.df, "scatter_log10": self.scatter,
            "scatter_beyond_brackets_log10": self.beyond_brackets, "interval_floored_by_brackets": self.floored,
            "reason": self.reason,
            "n_runs": len(self.points),
            "goodness_of_fit": self.gof.to_dict() if self.gof else None,
            "cells": [c.to_dict(self.x_names) for c in self.cells],
            "points": [{"run": r, **dict(zip(self.x_names, x)), "y": y, "y_lo": lo, "y_hi": hi}
                       for r, x, y, lo, hi in self.points],
            "censored": [{"run": r, **dict(zip(self.x_names, x)), "lower_bound": b} for r, x, b in self.censored],
            "excluded": [{"run": r, "reason": why} for r, why in self.excluded],
        }


def fit_joint_law(quantity: str, x_names: Sequence[str], points: Iterable[tuple], *,
                  censored: Iterable[tuple] = (), excluded: Iterable[tuple[str, str]] = (),
                  ci: float = 0.95) -> JointLawFit:
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
    ls = (cell_least_squares(cells, ci, cells_bracket_variance(cells, xs, kept)[2]) if len(cells) > len(names)
          else None)
    if ls is None:
        return JointLawFit(**base, cells=tuple(cells),
                           reason=f"{len(cells)} cells do not determine {len(names)} exponents (each variable must "
                                  "vary on its own, in at least " + str(len(names) + 1) + " cells)")
    ends = [ls.interval(j + 1) for j in range(len(names))]
    gof = _goodness(cells, ls, xs, ly, kept, ci, (None, None), False, names)
    return JointLawFit(**base, exponents=tuple(float(v) for v in ls.coef[1:]),
                       exponents_lo=tuple(e[0] for e in ends), exponents_hi=tuple(e[1] for e in ends),
                       prefactor=float(10 ** ls.coef[0]), df=ls.df, scatter=ls.scatter, cells=tuple(cells), gof=gof,
                       beyond_brackets=ls.beyond_brackets, floored=ls.floor is not None)


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
               "scatter_log10", "x_min", "x_max")
"""Keys of a fit in fits.json that hold a finite number or null."""
FIT_POSITIVE = ("prefactor", "prefactor_lo", "prefactor_hi", "x_min", "x_max")
"""Keys of a fit that are logarithms' arguments: > 0 where not null."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fit_problem(d: Any, key: str) -> str | None:
    """What is wrong with the fit ``d`` stored under ``key`` of fits.json (a phrase naming the key path), None when
    :meth:`PowerLawFit.from_dict` and the predictions can use it: numbers finite (no NaN or infinity) or null,
    prefactors and x > 0, a fitted law (exponent set) with a prefactor, a covariance of four numbers, points and
    cells with positive finite values, and the same for each fit of ``by_width`` / ``by_n``."""
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
    cov = d.get("cov_log10")
    if cov is not None and not (isinstance(cov, list) and len(cov) == 4 and all(_finite(c) for c in cov)):
        return f"'{key}.cov_log10' is {cov!r}, not four finite numbers or null"
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
