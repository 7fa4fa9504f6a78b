"""Whether one power law is consistent with its points (diffmem.analysis.powerlaw's docstring, "Goodness of fit";
docs/analysis.md): the lack-of-fit F test, the lines through every run's interval, leave one out and the outlier test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import optimize, special, stats

from diffmem.analysis.cellfit import Cell, LeastSquares, RunBrackets, cell_least_squares, design_matrix

LACK_OF_FIT_LEVEL = 0.05
"""A law is called inconsistent with its points when the lack-of-fit test's p-value is below this."""


@dataclass(frozen=True)
class GoodnessOfFit:
    """Whether one power law is consistent with all points (the module docstring has the rules).

    ``test``: the name of the test, None when none is possible (``note`` says why); ``statistic``, ``df`` (numerator,
    denominator) and ``p_value`` of it; ``consistent``: p >= :data:`LACK_OF_FIT_LEVEL` (None untested).
    ``slopes_through_intervals``: the range of exponents of the lines that pass through every run's interval (None
    when none passes; not computed for joint laws or when a run has no interval, then ``line_through_intervals`` is
    None); ``restoring``: cells whose removal alone lets such a line pass (with 4 or more cells); ``influential``:
    (cell, exponent without it) for each cell whose removal moves the exponent outside the fit's interval (``exponents_without``: the
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


def goodness_of_fit(cells: list[Cell], ls: LeastSquares, xs: np.ndarray, ly: np.ndarray, kept: list,
                    runs: RunBrackets, ci: float, exponent_ci: tuple[float | None, float | None], one_variable: bool,
                    names: Sequence[str]) -> GoodnessOfFit:
    """The goodness of fit of a law fitted to ``cells`` (module docstring); ``runs``: what the runs ``kept``
    reported (:meth:`RunBrackets.of_points`)."""
    cell_of, variances, per_cell = runs.cell_of, runs.variance, runs.cell_variance(len(cells))
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
