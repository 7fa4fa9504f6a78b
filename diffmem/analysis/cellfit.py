"""The computation under every power law (diffmem.analysis.powerlaw): runs grouped into cells, least squares on the
cell means, and the interval that knows each tau's bracket (the rule: powerlaw's docstring, "Interval";
docs/analysis.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
from scipy import stats


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
