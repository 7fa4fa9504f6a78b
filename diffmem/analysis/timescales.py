"""Timescale estimators of one run: tau_mem, tau_gen and tau_gap, each with an interval and an explicit rule.

Every estimator takes plain sequences (one entry per evaluation; ``None`` or NaN marks a metric that was not
recorded at that evaluation and is dropped) and returns an :class:`Estimate`. Steps are optimizer steps (>= 0);
"log-time interpolation" between two evaluations at steps ``a < b`` places a point at ``a * (b / a) ** u`` for a
fraction ``u`` in [0, 1] (linear, ``a + u * (b - a)``, when ``a`` is 0).

A *censored* estimate is a bound, not a measurement: when ``hi`` is None the value is a lower bound (the event did not
happen by the last evaluation), when ``lo`` is None it is an upper bound (the event had already happened at the first
evaluation). Censored estimates are reported but never fitted.

Definitions (docs/analysis.md copies them):

- **tau_mem** (:func:`tau_mem`). An evaluation is *memorized* when the lower end of the 95% confidence interval of
  f_mem exceeds ``floor`` (default 0): ``f_mem_lo > floor``; it is *clean* when the upper end is at most ``floor``
  (``f_mem_hi <= floor``; with floor 0 and a percentile bootstrap: not one memorized sample). Let ``b`` be the first
  memorized evaluation and ``c`` the last clean evaluation before it. tau_mem = the log-time midpoint
  ``sqrt(step_c * step_b)``, with the interval [step_c, step_b]: memorization is established at step_b and not a
  single memorized sample was seen at step_c. If no evaluation before ``b`` is clean, the midpoint uses the
  evaluation just before ``b`` and the interval's lower end is the first evaluation's step. Never memorized:
  censored, value = lo = the last evaluated step, hi = None. Memorized at the first evaluation: censored upper bound.
  Why the lower bound of the interval: f_mem is a fraction of a finite sample, and one near-copy among 128 samples
  moves it by 0.008; readings like 0.10 -> 0.02 -> 0.27 happen. The percentile bootstrap interval of a fraction
  k/n has its lower end above 0 only when about k >= 4 samples are memorized (the bootstrap puts mass
  (1 - k/n)^n ~ e^-k on zero, below 2.5% from k = 4 on), so one or two chance near-copies do not trigger it, the
  threshold follows the number of samples by itself, and the rule does not depend on how often the run was
  evaluated (unlike "two consecutive evaluations"). A later dip does not undo a detection: the first significant
  evaluation counts. When the interval was not recorded it is computed from ``n_samples`` as the 2.5% and 97.5%
  quantiles of Binomial(n_samples, f_mem) / n_samples, the limit of the percentile bootstrap of a fraction.
- **tau_gen** (:func:`tau_gen`). FID (or FD) reaches its plateau. Let ``m`` be the minimum, made robust to a single
  low outlier: the mean of the 3 lowest values over the evaluations (of all values when fewer). The plateau band is
  ``m + band`` with ``band = max(rtol * |m|, z * sigma)`` (defaults rtol = 0.05, z = 3: the lowest values of a noisy
  plateau lie 1.5 to 2 sigma below its level, so the band must reach past that), where ``sigma`` is the noise of
  the plateau: the larger of the metric's own sampling noise (the median of the per-evaluation standard errors
  ``se`` over the plateau, when given, e.g. from a bootstrap over samples) and the scatter of the plateau's
  neighbour differences, ``1.4826 * MAD(diff) / sqrt 2`` (0 with fewer than 3 evaluations; a slow drift of the
  plateau does not inflate it). The plateau runs from the first evaluation inside the band through the minimum and
  on while the curve stays inside the band; a later rise (quality often worsens once the model memorizes) ends it
  and is not counted as noise, so it cannot widen the band and pull tau_gen earlier. Since the band and its first evaluation depend on each other, they are found
  by iteration from ``band = rtol * |m|`` until the first evaluation inside the band no longer moves (at most 10
  rounds). tau_gen is the step at which the FID curve, linear in log time between evaluations, first falls to
  ``m + band``. Interval: at least the bracket of evaluations around that crossing (the last one above the band, the
  first one inside it: the grid cannot place the plateau's start more finely), widened by the same crossing for the
  per-evaluation bounds (``fid -/+ z * max(se_i, sigma)`` unless ``lo``/``hi`` are passed): ``lo`` = the earlier of the
  bracket's start and the step where the lower bound first reaches the band, ``hi`` = the later of the bracket's end
  and the step where the upper bound does (None if it never does). When fewer than 3 evaluations lie from that first
  evaluation to the last, the plateau is not confirmed (FID may still fall): censored, value = lo = the crossing,
  hi = None. On the plateau at the first evaluation: censored upper bound. Fewer than 2 FID values: value None.
- **tau_gap** (:func:`tau_gap`). The train/test loss gap opens. ``gap = test_loss - train_loss``. The reference
  evaluations are those up to and including the minimum of the test loss (at least the first 3); their median gap
  ``g0`` and robust scatter ``s0 = 1.4826 * MAD`` define the noise band, ``band_i = max(z * s0, rtol * test_loss_i)``
  (defaults z = 3, rtol = 0.05). The gap is *open* at evaluation i when ``gap_i - g0 > band_i``. tau_gap is the step
  where ``gap - g0 - band`` crosses 0 (log-time interpolation) before the first evaluation that is open together
  with the next one (the last evaluation counts alone). Interval: the bracket [previous step, that step]. Never
  open: censored, value = lo = the last step, hi = None. Fewer than 3 evaluations with both losses: value None.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats


class TimescaleInputError(ValueError):
    """The arrays given to an estimator cannot be used (wrong lengths, bad steps, missing intervals)."""


@dataclass(frozen=True)
class Estimate:
    """One timescale in optimizer steps, with its interval and the rule that produced it.

    ``value`` is None when the data cannot define it (e.g. no FID recorded); ``rule`` then says why. ``censored``
    marks a bound: ``hi`` None -> lower bound, ``lo`` None -> upper bound. For tau_gen only (None otherwise):
    ``level``, the upper edge of the plateau band ``m + band`` in the metric's units (a model is on the plateau when
    its FID is at or below it), and ``noise``, the plateau's noise ``sigma`` in the same units.
    """

    value: float | None
    lo: float | None
    hi: float | None
    censored: bool
    rule: str
    level: float | None = None
    noise: float | None = None

    @property
    def measured(self) -> bool:
        """True when ``value`` is a measurement that may enter a fit (present and not censored)."""
        return self.value is not None and not self.censored

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- helpers --------------------------------------------------------------------------------------------------------

def _as_float_array(values: Sequence[Any] | None, length: int, name: str) -> np.ndarray:
    """A float array with NaN where the input held None; ``None`` itself gives an all-NaN array."""
    if values is None:
        return np.full(length, np.nan)
    arr = np.array([np.nan if v is None else v for v in values], dtype=float)
    if arr.shape != (length,):
        raise TimescaleInputError(f"{name} has {arr.size} entries but steps has {length}; pass one value per "
                                  "evaluation (None where it was not recorded)")
    return arr


def _check_steps(steps: Sequence[Any]) -> np.ndarray:
    s = np.asarray(list(steps), dtype=float)
    if s.ndim != 1:
        raise TimescaleInputError("steps must be a flat sequence of optimizer steps")
    if np.any(~np.isfinite(s)) or np.any(s < 0):
        raise TimescaleInputError("steps must be finite and >= 0 (optimizer steps)")
    if np.any(np.diff(s) <= 0):
        raise TimescaleInputError("steps must be strictly increasing (sort the evaluations and drop repeats)")
    return s


def _log_between(a: float, b: float, u: float) -> float:
    """The point at fraction ``u`` of [a, b] in log time (linear when ``a`` is 0)."""
    u = min(max(u, 0.0), 1.0)
    if a <= 0:
        return a + u * (b - a)
    return float(a * (b / a) ** u)


def first_crossing_down(steps: np.ndarray, y: np.ndarray, level: float) -> float | None:
    """Step at which ``y`` (linear in log time between evaluations) first falls to ``level``; None if never."""
    below = np.flatnonzero(y <= level)
    if below.size == 0:
        return None
    i = int(below[0])
    if i == 0:
        return float(steps[0])
    y0, y1 = y[i - 1], y[i]
    u = (y0 - level) / (y0 - y1) if y0 != y1 else 1.0
    return _log_between(float(steps[i - 1]), float(steps[i]), u)


def binomial_interval(fraction: np.ndarray, n_samples: np.ndarray | int,
                      level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Central ``level`` interval of Binomial(n, f) / n: the limit of the percentile bootstrap of a fraction.

    ``fraction`` and ``n_samples`` broadcast; returns (lo, hi) as fractions in [0, 1].
    """
    n = np.asarray(n_samples, dtype=float)
    f = np.clip(np.asarray(fraction, dtype=float), 0.0, 1.0)
    alpha = (1.0 - level) / 2
    lo = stats.binom.ppf(alpha, n, f) / n
    hi = stats.binom.ppf(1.0 - alpha, n, f) / n
    return np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)


# --- tau_mem --------------------------------------------------------------------------------------------------------

def tau_mem(steps: Sequence[float], f_mem: Sequence[float | None], lo: Sequence[float | None] | None = None,
            hi: Sequence[float | None] | None = None, *, n_samples: int | Sequence[int] | None = None,
            floor: float = 0.0) -> Estimate:
    """The first step at which memorization is established (see the module docstring for the exact rule).

    ``f_mem``, ``lo``, ``hi``: fractions in [0, 1] per evaluation (the recorded f_mem and its 95% bootstrap
    interval). Where ``lo``/``hi`` are missing they come from ``n_samples`` (samples per evaluation); missing with no
    ``n_samples`` is an error. ``floor``: f_mem_lo must exceed it to count as memorized.
    """
    s = _check_steps(steps)
    f = _as_float_array(f_mem, s.size, "f_mem")
    f_lo = _as_float_array(lo, s.size, "lo")
    f_hi = _as_float_array(hi, s.size, "hi")
    keep = np.isfinite(f)
    if not keep.any():
        return Estimate(None, None, None, False, "no f_mem recorded")
    s, f, f_lo, f_hi = s[keep], f[keep], f_lo[keep], f_hi[keep]
    missing = ~np.isfinite(f_lo) | ~np.isfinite(f_hi)
    source = "bootstrap interval"
    if missing.any():
        if n_samples is None:
            raise TimescaleInputError("f_mem_lo/f_mem_hi are missing for some evaluations; pass n_samples (samples "
                                      "per evaluation) so the interval can be computed from the binomial law")
        counts = np.broadcast_to(np.asarray(n_samples, dtype=float), keep.shape)[keep]
        b_lo, b_hi = binomial_interval(f, counts)
        f_lo = np.where(np.isfinite(f_lo), f_lo, b_lo)
        f_hi = np.where(np.isfinite(f_hi), f_hi, b_hi)
        source = "binomial interval where the bootstrap one was not recorded"
    rule = (f"first evaluation with f_mem_lo > {floor:g} ({source}); log-time midpoint with the last evaluation "
            f"with f_mem_hi <= {floor:g} before it")
    memorized = np.flatnonzero(f_lo > floor)
    if memorized.size == 0:
        last = float(s[-1])
        return Estimate(last, last, None, True, f"never memorized by the last evaluation (lower bound); {rule}")
    b = int(memorized[0])
    if b == 0:
        first = float(s[0])
        return Estimate(first, None, first, True, f"memorized already at the first evaluation (upper bound); {rule}")
    clean = np.flatnonzero(f_hi[:b] <= floor)
    if clean.size:
        c, lower = int(clean[-1]), float(s[clean[-1]])
    else:
        c, lower = b - 1, float(s[0])
        rule += "; no clean evaluation before it, interval from the first evaluation"
    value = _log_between(float(s[c]), float(s[b]), 0.5)
    return Estimate(value, lower, float(s[b]), False, rule)


# --- tau_gen --------------------------------------------------------------------------------------------------------

def _plateau(y: np.ndarray, start: int, level: float) -> slice:
    """The plateau: the evaluations from ``start`` through the lowest value after it, and on while the curve stays
    at or below ``level``; it ends before the first evaluation after the minimum that rises above ``level`` (a
    late rise of the curve is not plateau noise)."""
    end = start + int(np.argmin(y[start:])) + 1
    while end < y.size and y[end] <= level:
        end += 1
    return slice(start, end)


def _plateau_noise(y: np.ndarray, part: slice) -> float:
    """Robust scatter of ``y`` over the plateau ``part`` from its neighbour differences, 1.4826 * MAD(diff) / sqrt 2
    (a slow drift of the plateau does not inflate it); 0 with fewer than 3 evaluations."""
    d = np.diff(y[part])
    if d.size < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2.0))


def tau_gen(steps: Sequence[float], fid: Sequence[float | None], lo: Sequence[float | None] | None = None,
            hi: Sequence[float | None] | None = None, *, se: Sequence[float | None] | None = None,
            rtol: float = 0.05, z: float = 3.0) -> Estimate:
    """The step at which FID (or FD) reaches its plateau (see the module docstring for the exact rule).

    ``fid``: one value per evaluation (None where not recorded). ``se``: optional per-evaluation standard errors of
    the FID (its sampling noise). ``lo``/``hi``: optional per-evaluation bounds; by default
    ``fid -/+ z * max(se, sigma)``.
    """
    if rtol < 0 or z < 0:
        raise TimescaleInputError("tau_gen needs rtol >= 0 and z >= 0")
    s = _check_steps(steps)
    y = _as_float_array(fid, s.size, "fid")
    y_lo = _as_float_array(lo, s.size, "lo")
    y_hi = _as_float_array(hi, s.size, "hi")
    y_se = _as_float_array(se, s.size, "se")
    keep = np.isfinite(y)
    if keep.sum() < 2:
        return Estimate(None, None, None, False, "fewer than 2 FID evaluations")
    s, y, y_lo, y_hi, y_se = s[keep], y[keep], y_lo[keep], y_hi[keep], y_se[keep]
    m = float(np.mean(np.sort(y)[:3]))
    band, sigma = rtol * abs(m), 0.0
    start = int(np.flatnonzero(y <= m + band)[0])
    for _ in range(10):  # widen the band with the plateau's noise until its start is stable
        part = _plateau(y, start, m + band)
        se_part = y_se[part][np.isfinite(y_se[part])]
        sigma = max(_plateau_noise(y, part), float(np.median(se_part)) if se_part.size else 0.0)
        band = max(rtol * abs(m), z * sigma)
        new_start = int(np.flatnonzero(y <= m + band)[0])
        if new_start == start:
            break
        start = new_start
    level = m + band
    y_lo = np.where(np.isfinite(y_lo), y_lo, y - z * np.where(np.isfinite(y_se), np.maximum(y_se, sigma), sigma))
    y_hi = np.where(np.isfinite(y_hi), y_hi, y + z * np.where(np.isfinite(y_se), np.maximum(y_se, sigma), sigma))
    rule = (f"first log-time crossing of m + max({rtol:g} * |m|, {z:g} * sigma) = {level:.4g} "
            f"(m = mean of the 3 lowest = {m:.4g}, sigma {sigma:.3g})")
    first_in = int(np.flatnonzero(y <= level)[0])
    if first_in == 0:
        first = float(s[0])
        return Estimate(first, None, first, True,
                        f"on the plateau already at the first evaluation (upper bound); {rule}", level, sigma)
    value = first_crossing_down(s, y, level)
    if s.size - first_in < 3:
        return Estimate(value, value, None, True, f"fewer than 3 evaluations on the plateau, FID may still fall "
                                                  f"(lower bound); {rule}", level, sigma)
    lower = min(first_crossing_down(s, y_lo, level), float(s[first_in - 1]))
    upper = first_crossing_down(s, y_hi, level)
    return Estimate(value, lower, None if upper is None else max(upper, float(s[first_in])), False, rule, level,
                    sigma)


# --- tau_gap --------------------------------------------------------------------------------------------------------

def tau_gap(steps: Sequence[float], train_loss: Sequence[float | None], test_loss: Sequence[float | None], *,
            z: float = 3.0, rtol: float = 0.05) -> Estimate:
    """The step at which test_loss - train_loss leaves its noise band (see the module docstring for the exact rule).

    Losses are the DSM losses at the fixed diffusion time of the run (same units for both), one per evaluation.
    """
    if z < 0 or rtol < 0:
        raise TimescaleInputError("tau_gap needs z >= 0 and rtol >= 0")
    s = _check_steps(steps)
    train = _as_float_array(train_loss, s.size, "train_loss")
    test = _as_float_array(test_loss, s.size, "test_loss")
    keep = np.isfinite(train) & np.isfinite(test)
    if keep.sum() < 3:
        return Estimate(None, None, None, False, "fewer than 3 evaluations with both train and test loss")
    s, train, test = s[keep], train[keep], test[keep]
    gap = test - train
    n_ref = max(int(np.argmin(test)) + 1, 3)
    ref = gap[:n_ref]
    g0 = float(np.median(ref))
    s0 = float(1.4826 * np.median(np.abs(ref - g0)))
    excess = gap - g0 - np.maximum(z * s0, rtol * np.abs(test))
    rule = (f"first evaluation where gap - {g0:.3g} > max({z:g} * {s0:.3g}, {rtol:g} * test_loss) at it and the "
            f"next evaluation; reference = evaluations up to the test-loss minimum")
    is_open = excess > 0
    persistent = is_open.copy()
    persistent[:-1] &= is_open[1:]
    hits = np.flatnonzero(persistent)
    if hits.size == 0:
        last = float(s[-1])
        return Estimate(last, last, None, True, f"gap never opened by the last evaluation (lower bound); {rule}")
    g = int(hits[0])
    if g == 0:
        first = float(s[0])
        return Estimate(first, None, first, True, f"gap open already at the first evaluation (upper bound); {rule}")
    e0, e1 = float(excess[g - 1]), float(excess[g])
    u = -e0 / (e1 - e0) if e0 < 0 else 0.0
    value = _log_between(float(s[g - 1]), float(s[g]), u)
    return Estimate(value, float(s[g - 1]), float(s[g]), False, rule)


# --- all three from a run's metrics records --------------------------------------------------------------------------

def quality_se(record: dict[str, Any]) -> float | None:
    """The standard error of one evaluation's FID (FD): its bootstrap over samples (``fid_boot_std``) when recorded,
    else the spread over its K reference sets divided by sqrt K (``fid_std``), else None."""
    if record.get("fid_boot_std") is not None:
        return float(record["fid_boot_std"])
    if record.get("fid_std") is not None and record.get("fid_sets"):
        return float(record["fid_std"]) / float(np.sqrt(len(record["fid_sets"])))
    return None


def evaluation_bracket(records: Sequence[dict[str, Any]], estimate: Estimate,
                       key: str = "fid") -> tuple[int, int] | None:
    """The evaluated steps just before and just after a measured crossing of the ``key`` curve (``estimate`` from
    ``records``, one per step, sorted by step): what only more evaluations can narrow. The estimate's interval holds
    it and is wider where it also carries the metric's noise (tau_gen). None when the estimate is not measured."""
    if not estimate.measured:
        return None
    steps = [int(r["step"]) for r in records if r.get(key) is not None]
    before = [s for s in steps if s <= estimate.value]
    after = [s for s in steps if s >= estimate.value]
    return (before[-1], after[0]) if before and after else None


def estimate_run(records: Sequence[dict[str, Any]]) -> dict[str, Estimate]:
    """tau_mem, tau_gen and tau_gap of one run from its metrics.jsonl records (one per step, sorted by step): the one
    place where the columns meet the estimators, for the analysis, the training loop's stop rule and refinement."""
    def col(key: str) -> list[float | None]:
        return [r.get(key) for r in records]

    steps = [float(r["step"]) for r in records]
    n_samples = col("n_samples")
    return {
        "tau_mem": tau_mem(steps, col("f_mem"), col("f_mem_lo"), col("f_mem_hi"),
                           n_samples=n_samples if all(v is not None for v in n_samples) else None),
        "tau_gen": tau_gen(steps, col("fid"), se=[quality_se(r) for r in records]),
        "tau_gap": tau_gap(steps, col("train_loss"), col("test_loss")),
    }
