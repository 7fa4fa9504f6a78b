"""The computation under every power law (diffmem.analysis.powerlaw): runs grouped into cells, least squares on the
cell means, and the interval that knows each tau's bracket (the rule: powerlaw's docstring, "Interval";
docs/analysis.md): the cells' bracket variance, the floor of the bracket errors that runs reporting one bracket
share (:func:`shared_bracket_covariance`), and, when the cell means lie exactly on one line, the factor that keeps
the interval's coverage whatever the scatter (:func:`collinear_factor`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from scipy import stats


COLLINEAR_SCATTER = 1e-9
"""Residual standard deviation of the cell means (log10) below which they lie exactly on one line (bracket
midpoints on one shared grid can; measured taus never do)."""


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
    with the normal quantile ``z``; None otherwise. ``rounding_cov``: the covariance of the coefficients from the
    rounding errors alone, runs that report one bracket sharing one error (``C S C'``,
    :func:`shared_bracket_covariance`; None without brackets), read with ``z`` as a floor in every branch.
    ``factor``: the multiplier of the half width when the cell means lie exactly on one line
    (:func:`collinear_factor`; 1 otherwise)."""

    coef: np.ndarray
    cov: np.ndarray | None
    df: int
    scatter: float | None
    t: float | None
    beyond_brackets: float | None = None
    floor: np.ndarray | None = None
    z: float | None = None
    rounding_cov: np.ndarray | None = None
    factor: float = 1.0

    @property
    def collinear(self) -> bool:
        """True when the cell means lie exactly on one line (no residual: bracket midpoints on one shared grid can;
        measured taus never do) and the brackets explain all the scatter."""
        return self.floor is not None and self.scatter is not None and self.scatter < COLLINEAR_SCATTER

    def half_width(self, a: np.ndarray) -> float | None:
        """The half width (log10) of the interval of ``a @ coef`` (None without one): ``t * sqrt(a' cov a)``, never
        less than ``z * sum_i |a' C_i| sd_i`` when the brackets set the floor nor than ``z * sqrt(a' rounding_cov a)``,
        times ``factor``."""
        return interval_half_width(a, self.cov, self.t, self.floor, self.z, self.rounding_cov, self.factor)

    def interval(self, j: int) -> tuple[float | None, float | None]:
        """The interval of coefficient ``j`` (0 = log10 prefactor)."""
        a = np.zeros(self.coef.size)
        a[j] = 1.0
        half = self.half_width(a)
        if half is None:
            return None, None
        return float(self.coef[j] - half), float(self.coef[j] + half)


def interval_half_width(a: np.ndarray, cov: np.ndarray | None, t: float | None, floor: np.ndarray | None,
                        z: float | None, rounding_cov: np.ndarray | None = None,
                        factor: float = 1.0) -> float | None:
    """The half width of the interval of the linear combination ``a`` of a law's coefficients (log10): the t part
    ``t * sqrt(a' cov a)``; where ``floor`` (rows ``(C_i..., sd_i)``) is given, at least the brackets' worst case
    ``z * sum_i |a' C_i| sd_i``; where ``rounding_cov`` is given, at least ``z * sqrt(a' rounding_cov a)``; all times
    ``factor``. None without a covariance."""
    if cov is None or t is None:
        return None
    half = t * math.sqrt(max(float(a @ cov @ a), 0.0))
    if floor is not None and z is not None:
        half = max(half, z * float(np.abs(floor[:, :-1] @ a) @ floor[:, -1]))
    if rounding_cov is not None and z is not None:
        half = max(half, z * math.sqrt(max(float(a @ rounding_cov @ a), 0.0)))
    return factor * half


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


def cell_least_squares(cells: Sequence[Cell], ci: float, cell_variance: np.ndarray | None = None,
                       shared: np.ndarray | None = None,
                       worst_variance: np.ndarray | None = None) -> LeastSquares | None:
    """The fit of :class:`LeastSquares`, or None when the design is singular (e.g. one distinct x).

    ``cell_variance`` (log10^2, one per cell, :func:`cell_bracket_variance`): the variance each cell mean has from
    its runs' brackets alone, ``v_i``; None or zeros: no bracket is known, and this is the plain t interval on the
    residual scatter. Otherwise (module docstring, "Interval") the scatter beyond the brackets is estimated as
    ``b^2 = max(0, (RSS - sum_i (1 - h_i) v_i) / df)`` (``h_i``: the cell's leverage, so that ``E[RSS] = sum_i
    (1 - h_i) (b^2 + v_i)``). With ``b^2 > 0``: ``cov = C diag(b^2 + v) C'`` (``C = (X'X)^-1 X'``), read with t;
    with every ``v_i`` equal it is the plain ``s^2 (X'X)^-1``. With ``b^2 = 0`` (the residuals are no larger than
    the brackets alone explain): ``cov = s^2 (X'X)^-1`` with t, floored at the brackets' worst case, taken over
    ``worst_variance`` (the part of ``cell_variance`` from values rounded to their bracket's midpoint,
    :meth:`RunBrackets.rounded_cell_variance`; default all of it). ``shared``
    (cells x cells, :func:`shared_bracket_covariance`): the covariance of the cell means' rounding errors; given, the
    interval is never narrower than its normal interval (``rounding_cov = C shared C'``, read with z)."""
    design = design_matrix(cells)
    y = np.array([c.mean for c in cells])
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    if rank < design.shape[1]:
        return None
    df = len(cells) - design.shape[1]
    if df <= 0:
        return LeastSquares(coef, None, 0, None, None)
    v = np.zeros(len(cells)) if cell_variance is None else np.asarray(cell_variance, dtype=float)
    weights, leverage = design_weights(design)
    _, rss, beyond2 = scatter_split(design, weights, leverage, y[None, :], v)
    rss, beyond2 = float(rss[0]), float(beyond2[0])
    t, z = t_quantile(ci, df), z_quantile(ci)
    rounding = None if shared is None else weights @ shared @ weights.T
    if beyond2 > 0 or not v.any():
        return LeastSquares(coef, (weights * (beyond2 + v)) @ weights.T, df, math.sqrt(rss / df), t,
                            math.sqrt(beyond2), None, z, rounding)
    worst = v if worst_variance is None else np.asarray(worst_variance, dtype=float)
    floor = np.column_stack([weights.T, np.sqrt(worst)])
    return LeastSquares(coef, rss / df * (weights @ weights.T), df, math.sqrt(rss / df), t, 0.0, floor, z, rounding)


def design_weights(design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``C = (X'X)^-1 X'`` (coefficients = C @ cell means; shape (parameters, cells)) and each cell's leverage
    ``h_i`` (shape (cells,)) of the design ``X``."""
    weights = np.linalg.inv(design.T @ design) @ design.T
    return weights, np.einsum("ij,ji->i", design, weights)


def scatter_split(design: np.ndarray, weights: np.ndarray, leverage: np.ndarray, means: np.ndarray,
                  v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coefficients (B, parameters), RSS (B,), b^2 (B,)) of a batch of experiments' cell means ``means`` (B, cells)
    with bracket variances ``v``: least squares and the scatter beyond the brackets of :func:`cell_least_squares`."""
    coef = means @ weights.T
    resid = means - coef @ design.T
    rss = (resid ** 2).sum(axis=1)
    df = design.shape[0] - design.shape[1]
    return coef, rss, np.maximum(0.0, (rss - float(((1.0 - leverage) * v).sum())) / df)


def batch_half_widths(design: np.ndarray, means: np.ndarray, v: np.ndarray, shared: np.ndarray | None,
                      ci: float, worst: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule of :func:`cell_least_squares` (factor 1) for a batch of experiments on one design at once: cell
    means ``means`` (B, cells), bracket variances ``v`` (cells,), ``shared`` rounding covariances (B, cells, cells)
    or None, ``worst`` the worst case's variances (cells,; None: ``v``). Returns (coefficients (B, p), half width of
    each coefficient's interval (B, p), the experiments whose cell means lie exactly on one line (B,)).
    ``tests/test_cellfit.py`` checks it against cell_least_squares."""
    weights, leverage = design_weights(design)
    coef, rss, beyond2 = scatter_split(design, weights, leverage, means, v)
    df = design.shape[0] - design.shape[1]
    t, z = t_quantile(ci, df), z_quantile(ci)
    sq = weights ** 2  # (p, cells)
    positive = (beyond2 > 0) | (not v.any())
    half_positive = t * np.sqrt(beyond2[:, None] * sq.sum(axis=1)[None, :] + (sq @ v)[None, :])
    half_t = t * np.sqrt(rss[:, None] / df * np.diag(np.linalg.inv(design.T @ design))[None, :])
    half_floor = np.maximum(half_t, z * (np.abs(weights) @ np.sqrt(v if worst is None else worst))[None, :])
    half = np.where(positive[:, None], half_positive, half_floor)
    if shared is not None:
        rounding = np.einsum("pi,bij,pj->bp", weights, shared, weights)
        half = np.maximum(half, z * np.sqrt(np.maximum(rounding, 0.0)))
    collinear = ~positive & (np.sqrt(rss / df) < COLLINEAR_SCATTER)
    return coef, half, collinear


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


def cell_index(cells: Sequence[Cell], xs: np.ndarray) -> np.ndarray:
    """The cell of each run (rows of ``xs``, shape (runs, variables)), shape (runs,)."""
    index = {c.x: i for i, c in enumerate(cells)}
    return np.array([index[tuple(float(v) for v in row)] for row in xs], dtype=int)



# --- runs that share a bracket, and cell means on one line ---------------------------------------------------------

@dataclass(frozen=True)
class RunBrackets:
    """What each run of a law reported, in log10: its ``value`` and its bracket ``lo``, ``hi`` (NaN where unknown),
    with ``cell_of`` its cell and ``variance`` its bracket variance (:func:`bracket_variances`: 0 where unknown);
    each of shape (runs,)."""

    cell_of: np.ndarray
    value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    variance: np.ndarray

    @classmethod
    def of(cls, cell_of: np.ndarray, values: Sequence[float], lo: Sequence[float | None],
           hi: Sequence[float | None]) -> RunBrackets:
        """From values and brackets in natural units (lo, hi None where unknown)."""
        def log(seq):
            return np.array([math.log10(x) if x is not None and x > 0 else math.nan for x in seq], dtype=float)
        return cls(np.asarray(cell_of, dtype=int), np.log10(np.asarray(values, dtype=float)), log(lo), log(hi),
                   bracket_variances(lo, hi))

    @classmethod
    def of_points(cls, cells: Sequence[Cell], xs: np.ndarray, kept: Sequence,
                  brackets: Mapping[str, tuple[float, float]] | None = None) -> RunBrackets:
        """Of the runs ``kept`` ((run, x, y, y_lo, y_hi), rows of ``xs``) grouped into ``cells``; a run's bracket is
        its interval (y_lo, y_hi), or ``brackets[run]`` where given (an interpolated crossing's evaluations)."""
        ends = [(brackets or {}).get(p[0], (p[3], p[4])) for p in kept]
        return cls.of(cell_index(cells, xs), [p[2] for p in kept], [e[0] for e in ends], [e[1] for e in ends])

    @property
    def known(self) -> np.ndarray:
        """Runs whose bracket is known and has a width."""
        return self.variance > 0

    def cell_variance(self, n_cells: int) -> np.ndarray:
        """Each cell mean's bracket variance, its runs' taken as independent (:func:`cell_bracket_variance`)."""
        return cell_bracket_variance(self.variance, self.cell_of, n_cells)

    def rounded_cell_variance(self, n_cells: int) -> np.ndarray:
        """The part of :meth:`cell_variance` from runs whose value is a rounded midpoint (:attr:`rounded`)."""
        return cell_bracket_variance(np.where(self.rounded, self.variance, 0.0), self.cell_of, n_cells)

    @property
    def rounded(self) -> np.ndarray:
        """Runs whose value is its bracket's log-midpoint (a tau rounded to its bracket, as tau_mem's onset is; a
        crossing interpolated between two evaluations, tau_gen or a level crossing, is not)."""
        mid = np.where(self.known, (self.lo + self.hi) / 2, math.nan)
        with np.errstate(invalid="ignore"):
            return self.known & (np.abs(self.value - mid) <= 1e-9 * np.maximum(1.0, np.abs(self.value)))

    def averaging(self, n_cells: int) -> np.ndarray:
        """The (cells, runs) matrix that takes run values to cell means."""
        out = np.zeros((n_cells, self.cell_of.size))
        out[self.cell_of, np.arange(self.cell_of.size)] = 1.0
        return out / out.sum(axis=1, keepdims=True)


def shared_bracket_covariance(runs: RunBrackets, n_cells: int, lo: np.ndarray | None = None) -> np.ndarray:
    """The covariance (log10^2) of the cell means' bracket errors when runs that report the same bracket share one
    error and all others are independent: the same value rounded from the same bracket (seeds of one cell, or cells
    whose taus coincide, as tau_gen's at one width across N on one evaluation grid), or crossings of one cell
    interpolated between the same two evaluations (seeds whose curves cross in one step of the grid: the
    interpolation's error comes from the curve's shape in that step, which seeds of one setting share; runs of other
    cells have other curves, and their errors in one step are not one). Shape (cells, cells); its
    diagonal is at least :func:`cell_bracket_variance`'s. ``lo``: brackets' lower ends to compare instead of
    ``runs.lo`` (shape (runs,) or (B, runs) for a batch of experiments, each run's bracket keeping its width; then
    the shape is (B, cells, cells))."""
    lower = runs.lo if lo is None else lo
    sd = np.sqrt(runs.variance)
    width = np.where(runs.known, runs.hi - runs.lo, math.nan)
    known, rounded = runs.known, runs.rounded
    one_cell = runs.cell_of[:, None] == runs.cell_of[None, :]
    pair = ((rounded[:, None] & rounded[None, :]) | (known[:, None] & known[None, :] & one_cell)) \
        & np.isclose(width[:, None], width[None, :], rtol=1e-9, atol=0.0)
    same = np.isclose(lower[..., :, None], lower[..., None, :], rtol=0.0, atol=1e-9) & pair
    same = same | np.eye(runs.cell_of.size, dtype=bool)
    averaging = runs.averaging(n_cells)
    return averaging @ (same * np.outer(sd, sd)) @ averaging.T


COLLINEAR_BOOTSTRAP = 1000
"""Simulated experiments per scatter level in :func:`collinear_factor`."""
COLLINEAR_LEVELS = tuple(2.0 ** k for k in range(-4, 4))
"""The scatter levels of :func:`collinear_factor`, in units of the brackets' median standard deviation."""


def collinear_factor(design: np.ndarray, runs: RunBrackets, coef: np.ndarray, ci: float,
                     n_boot: int = COLLINEAR_BOOTSTRAP, seed: int = 0) -> float:
    """The factor (>= 1) by which the interval of a law whose cell means lie exactly on one line is widened so that,
    on this design and these brackets, the rule keeps its coverage ``ci`` whatever the run-to-run scatter.

    Cell means on one line leave no residual, so nothing in the data measures the scatter; and bracket midpoints on
    one shared grid fall on one line far more often than measured values would (a whole number of grid steps apart).
    The factor is found by simulating this very experiment: each rounded run's grid is taken, near its tau, as a
    log-uniform lattice with its bracket's width through its bracket (runs on one grid share the lattice); the taus
    are placed on the fitted law, shifted together by a uniform fraction of the median bracket (the grid's unknown
    phase), with log-normal scatter of standard deviation ``level`` x the brackets' median standard deviation for
    each of :data:`COLLINEAR_LEVELS`; each simulated experiment is rounded to its lattices and fitted by the rule
    (:func:`batch_half_widths`). At each level and for each coefficient the factor is the smallest that brings the
    share of simulated experiments whose interval holds the coefficient up to ``ci`` when it widens the simulated
    fits that lie on one line themselves; the result is the largest over levels and coefficients (``n_boot``
    experiments per level, seeded: the same inputs give the same factor; :func:`simulate_on_brackets`). Runs whose
    value is not a rounded midpoint (a level crossing's interpolation, an unknown bracket) are simulated unrounded."""
    if not runs.rounded.any():
        return 1.0
    need = math.ceil(ci * n_boot)
    factor = 1.0
    for sim in simulate_on_brackets(design, runs, coef, ci, n_boot, seed):
        for j in range(coef.size):
            short = need - int(((sim.ratio[:, j] <= 1.0) & ~sim.collinear).sum())
            on_line = np.sort(sim.ratio[sim.collinear, j])
            on_line = on_line[np.isfinite(on_line)]
            if short > 0 and on_line.size:
                factor = max(factor, float(on_line[min(short, on_line.size) - 1]))
    return factor


@dataclass(frozen=True)
class SimulatedFits:
    """One scatter level of :func:`simulate_on_brackets`: ``level`` (in units of the brackets' median standard
    deviation), the simulated experiments' cell ``means`` (B, cells) and, for each, ``ratio`` (B, parameters): the
    distance of each fitted coefficient from the truth in units of the rule's half width (:func:`batch_half_widths`,
    factor 1; inf where the half width is 0 and the fit misses), and ``collinear`` (B,): the fits whose cell means
    lie exactly on one line."""

    level: float
    means: np.ndarray
    ratio: np.ndarray
    collinear: np.ndarray


def simulate_on_brackets(design: np.ndarray, runs: RunBrackets, coef: np.ndarray, ci: float, n_boot: int, seed: int,
                         rounded_variance: np.ndarray | None = None) -> Iterator[SimulatedFits]:
    """The simulation of :func:`collinear_factor`, one :class:`SimulatedFits` per level of
    :data:`COLLINEAR_LEVELS`: this experiment's design and brackets, each rounded run's grid a log-uniform lattice
    with its bracket's width through its bracket, the taus on the law ``coef`` shifted together by a uniform
    fraction of the median bracket and scattered log-normally, rounded and fitted by the rule with
    ``rounded_variance`` as the rounded values' variances (default :meth:`RunBrackets.rounded_cell_variance`).
    Seeded: the same inputs give the same draws."""
    rounded = runs.rounded
    n_cells = design.shape[0]
    width = np.where(rounded, runs.hi - runs.lo, 0.0)
    step = float(np.median(width[rounded]))
    sd = step / math.sqrt(12.0)
    v = runs.cell_variance(n_cells)
    worst = runs.rounded_cell_variance(n_cells) if rounded_variance is None else rounded_variance
    averaging = runs.averaging(n_cells)
    centre = design[runs.cell_of] @ coef
    anchor = np.where(rounded, runs.lo, 0.0)
    rng = np.random.default_rng(seed)
    for level in COLLINEAR_LEVELS:
        shift = rng.uniform(0.0, step, n_boot)
        true = centre[None, :] + shift[:, None] + level * sd * rng.standard_normal((n_boot, runs.cell_of.size))
        index = np.floor((true - anchor) / np.where(rounded, width, 1.0))
        lower = anchor + index * width
        value = np.where(rounded, lower + width / 2, true)
        shared = shared_bracket_covariance(runs, n_cells, np.where(rounded, lower, np.nan))
        means = value @ averaging.T
        fit, half, collinear = batch_half_widths(design, means, v, shared, ci, worst)
        truth = np.repeat(coef[None, :], n_boot, axis=0)
        truth[:, 0] += shift
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(half > 0, np.abs(fit - truth) / half, np.where(fit == truth, 0.0, np.inf))
        yield SimulatedFits(level, means, ratio, collinear)


def law_least_squares(cells: Sequence[Cell], runs: RunBrackets, ci: float) -> LeastSquares | None:
    """The least squares and interval of a law (powerlaw's docstring, "Interval"): :func:`cell_least_squares` on the
    cells' bracket variance with the floor of their shared rounding errors, and, when the cell means lie exactly on
    one line, the half width times :func:`collinear_factor`."""
    n_cells = len(cells)
    ls = cell_least_squares(cells, ci, runs.cell_variance(n_cells), shared_bracket_covariance(runs, n_cells),
                            runs.rounded_cell_variance(n_cells))
    if ls is None or not ls.collinear:
        return ls
    return replace(ls, factor=collinear_factor(design_matrix(cells), runs, ls.coef, ci))
