"""Timescale estimators of one run: tau_mem (and its level crossings tau_mem_at_L), tau_gen, tau_gap and tau_auc, and
of one split pair: tau_bias; each with an interval and an explicit rule.

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
- **tau_mem_at_L** (:func:`tau_mem_level`). The step at which f_mem first rises to the fixed fraction ``L``
  (``eval.mem_levels``, default 0.01 and 0.1). Let ``i`` be the first evaluation with ``f_mem >= L``; tau_mem_at_L
  is the log-time interpolation of f_mem = L between evaluations ``i - 1`` and ``i``. Interval: from the last
  evaluation before f_mem_hi first reaches L (there the 95% interval still excludes L; the first evaluation's step
  when f_mem_hi is at or above L from the start) to the first evaluation at which f_mem_lo reaches L (the crossing is
  established): evaluated steps, not interpolations, because f_mem is not observed in between. A non-monotone f_mem
  keeps its first crossing (a later dip below L does not undo it, as for the onset), and the interval spans
  everything from the first step the data cannot exclude to the first step the data establish, so a crossing read
  on a chance excursion has a wide interval. Censoring: f_mem below L at every evaluation: lower bound, value = lo =
  the last step; at or above L at the first evaluation: upper bound at the first step; f_mem reached L but f_mem_lo
  never did: not established, lower bound at the interval's early end. Its *bracket* (``Estimate.bracket``) is the
  two evaluations it is interpolated between, the grid's resolution: the power-law fits take it as the value's
  bracket, because f_mem's sampling noise, which the interval also carries, differs from run to run and enters a
  fit through the scatter between runs (docs/analysis.md, "The interval"). Missing intervals come from ``n_samples``
  (binomial) as for tau_mem. Unlike the onset, whose step is where k ~ 4 copies among the n samples become
  significant (f_mem ~ 4/n, so it moves earlier as n grows), the level L is a property of the model: more samples
  narrow the interval around the same step.
- **tau_gen** (:func:`tau_gen`). FID (or FD) reaches its plateau; the band comes from the metric's own sampling
  error, not from its differences between evaluations (which measure the curve's trend and the model's swings
  between checkpoints). The curve read is the running median of each evaluation and its two neighbours
  (:func:`smoothed_quality`; the first and last evaluations keep their value): it leaves a monotone stretch
  unchanged and removes an excursion of one evaluation up or down. Let ``m`` be its minimum. The plateau band is
  ``m + band`` with ``band = max(rtol * |m|, z * sigma)`` (defaults rtol = 0.05, z = 3), where ``sigma`` is the
  metric's sampling error on the plateau: the median of the per-evaluation standard errors ``se`` over the plateau
  evaluations (over every evaluation with one when none on the plateau has one). The plateau runs from the first
  evaluation whose smoothed value is inside the band through the minimum and on while the smoothed curve stays
  inside the band; a later rise (quality often worsens once the model memorizes) ends it and never widens the band.
  The band and the plateau's first evaluation depend on each other; they are iterated from ``band = rtol * |m|``
  until that evaluation no longer moves (at most 10 rounds). z = 3: ``m`` is the lowest of many smoothed values and
  lies 1 to 2 sigma below the plateau's level, and the smoothed value at the plateau's first evaluation can lie 1
  sigma above it. rtol = 0.05: where the sampling error is tiny, a model within 5% of the run's best quality counts as
  on the plateau; a smaller tolerance would read tau_gen on the slow last approach to the minimum, where the swings
  between checkpoints (tens of percent at full batch: results/demo_step_scan) already dominate. Without any ``se``
  (a run with ``eval.fid_boot = 0`` and one reference set): ``sigma = |m| * r``, with ``r`` the relative scatter of
  the whole curve about its local trend (:func:`scatter_about_local_trend` of ln FID: a trend linear in log time
  gives no residual, and the whole curve rather than the plateau, which the band itself delimits, avoids measuring
  a lucky low stretch; it assumes the noise is proportional to the FID); the rule string says so. tau_gen is the
  step at which the smoothed curve, linear in log time between evaluations, first falls to ``m + band``. Interval:
  at least the bracket of evaluations around that crossing (the last one above the band, the first one inside it:
  the grid cannot place the plateau's start more finely), widened by the same crossing for the smoothed
  per-evaluation 95% bounds (``fid -/+ 1.96 se_i``, ``sigma`` where ``se_i`` is missing, unless ``lo``/``hi`` are
  passed; none with z = 0, an exact curve): ``lo`` = the earlier of the bracket's start and the step where the lower
  bound first reaches the band, ``hi`` = the later of the bracket's end and the step where the upper bound does (None
  if it never does). When fewer than 3 evaluations lie from that first evaluation to the last, the plateau is not
  confirmed (FID may still fall): censored, value = lo = the crossing, hi = None. On the plateau at the first
  evaluation: censored upper bound. Fewer than 2 FID values: value None. Swings of the model larger than the band that
  last two evaluations or more are not removed: tau_gen is the *first* entry of the smoothed curve into the band, and
  the interval carries the sampling error and the grid, not the swings. Its bracket (``Estimate.bracket``, what the
  power-law fits take, as for the level crossings) is the last evaluation above the band and the first inside it.
  tau_gen is read from the whole quality curve whatever f_mem does: when the FID is still falling at tau_mem, tau_gen
  may reach or pass tau_mem (an empty window); it is never capped.
- **tau_gap** (:func:`tau_gap`). The train/test loss gap opens. ``gap = test_loss - train_loss``. The reference
  evaluations are those up to and including the minimum of the test loss (at least the first 3); their median gap
  ``g0`` and robust scatter ``s0 = 1.4826 * MAD`` define the noise band, ``band_i = max(z * s0, rtol * test_loss_i)``
  (defaults z = 3, rtol = 0.05). The gap is *open* at evaluation i when ``gap_i - g0 > band_i``. tau_gap is the step
  where ``gap - g0 - band`` crosses 0 (log-time interpolation) before the first evaluation that is open together
  with the next one (the last evaluation counts alone). Interval: the bracket [previous step, that step]. Never
  open: censored, value = lo = the last step, hi = None. Fewer than 3 evaluations with both losses: value None.
- **tau_bias** (:func:`tau_bias`). A split pair's samples start to favour their own train set
  (docs/split-pairs.md). At each paired evaluation the bias (mean over draws of ln(d_other / d_own)) has a 95%
  bootstrap interval; the bias is *established* at an evaluation when its lower end is above 0. Let ``b`` be the
  first evaluation from which the bias is established at every evaluation up to the last one. tau_bias = the
  log-time midpoint ``sqrt(step_{b-1} * step_b)``, interval (and bracket) [step_{b-1}, step_b]. Why "stays": the
  bias of an untrained model is a noisy ratio of two nearly equal distances, and its interval leaves 0 by chance at
  single early evaluations, so the first exit alone would date the bias to the first steps; a bias that grows with
  training stays out. Not established at the last evaluation: censored lower bound at the last step. Established
  from the first evaluation on: censored upper bound at the first step. tau_bias dates when the bias becomes
  *detectable*: the paired design resolves very small biases, so it can come where the bias is still 1e-5.
- **tau_bias_at_L** (:func:`tau_bias_level`). The step at which the bias first rises to the level ``L``
  (``eval.bias_levels``, default 0.05 and 0.1: samples about 5 % and 10 % nearer their own train set than the other
  set), by the rule of tau_mem_at_L (:func:`level_crossing`) on the bias and its 95 % interval. Like f_mem's levels
  it is a property of the models: more draws narrow its interval around the same step, where tau_bias moves earlier.
- **tau_auc** (:func:`tau_auc`). The membership AUC of the per-image losses (``diffmem.metrics.membership``) leaves
  0.5: the rule of tau_bias on the lower end of its 95 % (DeLong) interval, with 0.5 for 0 (the first evaluation from
  which ``auc_lo > 0.5`` at every later evaluation; log-time midpoint, bracket of the two evaluations). "Stays"
  for the same reason: with N images per group the interval leaves 0.5 by chance at single evaluations of an
  untrained model. Like tau_mem's onset it is a detection time: more images per group move it earlier.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy import ndimage, stats

from diffmem.analysis.runfiles import quality_se  # its home: runfiles, which imports no scipy

CI_Z = float(stats.norm.ppf(0.975))  # tau_gen's interval: crossings for each evaluation's 95% bounds, fid -/+ 1.96 se


class TimescaleInputError(ValueError):
    """The arrays given to an estimator cannot be used (wrong lengths, bad steps, missing intervals)."""


@dataclass(frozen=True)
class Estimate:
    """One timescale in optimizer steps, with its interval and the rule that produced it.

    ``value`` is None when the data cannot define it (e.g. no FID recorded); ``rule`` then says why. ``censored``
    marks a bound: ``hi`` None -> lower bound, ``lo`` None -> upper bound. For tau_gen only (None otherwise):
    ``level``, the upper edge of the plateau band ``m + band`` in the metric's units (a model is on the plateau when
    its FID is at or below it), and ``noise``, the plateau's noise ``sigma`` in the same units. ``bracket``: for a
    measured value interpolated between two evaluations whose interval also carries the measure's noise (tau_gen,
    the level crossings), the steps of those two evaluations: the grid's resolution, which the power-law fits take
    as the value's bracket (:attr:`fit_bracket`); None otherwise.
    """

    value: float | None
    lo: float | None
    hi: float | None
    censored: bool
    rule: str
    level: float | None = None
    noise: float | None = None
    bracket: tuple[float, float] | None = None

    @property
    def measured(self) -> bool:
        """True when ``value`` is a measurement that may enter a fit (present and not censored)."""
        return self.value is not None and not self.censored

    @property
    def fit_bracket(self) -> tuple[float | None, float | None]:
        """The steps a power-law fit takes as this value's bracket, the resolution of the evaluation grid around it:
        ``bracket`` where the estimate has one (an interpolated crossing), else the interval (lo, hi), which is the
        bracket of evaluations itself (tau_mem's onset, tau_gap, tau_bias, tau_auc)."""
        return self.bracket if self.bracket is not None else (self.lo, self.hi)

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


def bound_at_an_end(steps: Sequence[float], first: int | None, rule: str, *, never: str, already: str
                    ) -> Estimate | None:
    """The censored estimate of an event whose first evaluation is ``first`` (an index into ``steps``, optimizer
    steps ascending; None: it never happened): a lower bound at the last step when it never happened (``never``
    says so), an upper bound at the first step when it had already happened there (``already``); None when it
    happened in between, where the caller measures it."""
    if first is None:
        last = float(steps[-1])
        return Estimate(last, last, None, True, f"{never} (lower bound); {rule}")
    if first == 0:
        step = float(steps[0])
        return Estimate(step, None, step, True, f"{already} (upper bound); {rule}")
    return None


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

def _f_mem_with_interval(steps: Sequence[float], f_mem: Sequence[float | None],
                         lo: Sequence[float | None] | None, hi: Sequence[float | None] | None,
                         n_samples: int | Sequence[int] | None) -> tuple[np.ndarray, ...] | None:
    """(steps, f_mem, f_mem_lo, f_mem_hi, source) over the evaluations that recorded f_mem, the interval completed
    from the binomial law where it was not recorded (``source`` says which); None when no f_mem was recorded."""
    s = _check_steps(steps)
    f = _as_float_array(f_mem, s.size, "f_mem")
    f_lo = _as_float_array(lo, s.size, "lo")
    f_hi = _as_float_array(hi, s.size, "hi")
    keep = np.isfinite(f)
    if not keep.any():
        return None
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
    return s, f, f_lo, f_hi, source


def tau_mem(steps: Sequence[float], f_mem: Sequence[float | None], lo: Sequence[float | None] | None = None,
            hi: Sequence[float | None] | None = None, *, n_samples: int | Sequence[int] | None = None,
            floor: float = 0.0) -> Estimate:
    """The first step at which memorization is established (see the module docstring for the exact rule).

    ``f_mem``, ``lo``, ``hi``: fractions in [0, 1] per evaluation (the recorded f_mem and its 95% bootstrap
    interval). Where ``lo``/``hi`` are missing they come from ``n_samples`` (samples per evaluation); missing with no
    ``n_samples`` is an error. ``floor``: f_mem_lo must exceed it to count as memorized.
    """
    curves = _f_mem_with_interval(steps, f_mem, lo, hi, n_samples)
    if curves is None:
        return Estimate(None, None, None, False, "no f_mem recorded")
    s, f, f_lo, f_hi, source = curves
    rule = (f"first evaluation with f_mem_lo > {floor:g} ({source}); log-time midpoint with the last evaluation "
            f"with f_mem_hi <= {floor:g} before it")
    memorized = np.flatnonzero(f_lo > floor)
    b = int(memorized[0]) if memorized.size else None
    bound = bound_at_an_end(s, b, rule, never="never memorized by the last evaluation",
                            already="memorized already at the first evaluation")
    if bound is not None:
        return bound
    clean = np.flatnonzero(f_hi[:b] <= floor)
    if clean.size:
        c, lower = int(clean[-1]), float(s[clean[-1]])
    else:
        c, lower = b - 1, float(s[0])
        rule += "; no clean evaluation before it, interval from the first evaluation"
    value = _log_between(float(s[c]), float(s[b]), 0.5)
    return Estimate(value, lower, float(s[b]), False, rule)


def tau_mem_level(steps: Sequence[float], f_mem: Sequence[float | None], lo: Sequence[float | None] | None,
                  hi: Sequence[float | None] | None, level: float, *,
                  n_samples: int | Sequence[int] | None = None) -> Estimate:
    """The step at which f_mem first rises to the fixed fraction ``level`` (see the module docstring for the rule).

    ``steps``: optimizer steps, one per evaluation. ``f_mem``, ``lo``, ``hi``: fractions in [0, 1] per evaluation (the
    recorded f_mem and its 95% interval; None where not recorded). Where ``lo``/``hi`` are missing they come from
    ``n_samples`` as in :func:`tau_mem`. ``level``: a fraction in (0, 1), e.g. 0.01. Unlike the onset (:func:`tau_mem`),
    the step does not move with the number of samples per evaluation; only its interval narrows with more samples.
    """
    if not 0.0 < level < 1.0:
        raise TimescaleInputError(f"level = {level!r} must be a fraction in (0, 1), e.g. 0.01")
    curves = _f_mem_with_interval(steps, f_mem, lo, hi, n_samples)
    if curves is None:
        return Estimate(None, None, None, False, "no f_mem recorded")
    s, f, f_lo, f_hi, source = curves
    return level_crossing(s, f, f_lo, f_hi, level, "f_mem", f"({source})")


def level_crossing(s: np.ndarray, y: np.ndarray, y_lo: np.ndarray, y_hi: np.ndarray, level: float, name: str,
                   source: str = "") -> Estimate:
    """The step at which a rising measure ``y`` first reaches ``level``, with the interval of the data's 95 % bounds:
    the rule of tau_mem_at_L (module docstring), shared by every level crossing (f_mem's, the bias's).

    ``s``: optimizer steps, ascending; ``y``, ``y_lo``, ``y_hi``: the measure and its interval at each (finite, one
    per step); ``name`` and ``source`` only word the rule."""
    rule = (f"first log-time crossing of {name} = {level:g}; interval from the last evaluation before {name}_hi first "
            f"reaches {level:g} to the first with {name}_lo >= {level:g}" + (f" {source}" if source else ""))
    reached = np.flatnonzero(y >= level)
    i = int(reached[0]) if reached.size else None
    bound = bound_at_an_end(s, i, rule, never=f"{name} below {level:g} at every evaluation",
                            already=f"{name} >= {level:g} already at the first evaluation")
    if bound is not None:
        return bound
    u = (level - y[i - 1]) / (y[i] - y[i - 1])
    value = _log_between(float(s[i - 1]), float(s[i]), u)
    j = int(np.flatnonzero(y_hi >= level)[0])  # y_hi >= y, so it reaches the level at i or before
    if j == 0:
        lower = float(s[0])
        rule += f"; {name}_hi >= {level:g} already at the first evaluation, interval from it"
    else:
        lower = float(s[j - 1])
    established = np.flatnonzero(y_lo >= level)
    if established.size == 0:
        return Estimate(lower, lower, None, True,
                        f"{name} reached {level:g} at {value:.4g} but {name}_lo did not by the last evaluation (lower "
                        f"bound: the last evaluation before {name}_hi reached it); {rule}")
    return Estimate(value, lower, float(s[int(established[0])]), False, rule, bracket=(float(s[i - 1]), float(s[i])))


# --- tau_gen --------------------------------------------------------------------------------------------------------

def smoothed_quality(y: np.ndarray) -> np.ndarray:
    """The quality curve that tau_gen reads: the running median of each evaluation and its two neighbours (shape of
    ``y``, one value per evaluation, same units). The first and last evaluations keep their own value. A monotone
    stretch is unchanged; a value above or below both its neighbours becomes the nearer neighbour's."""
    y = np.asarray(y, dtype=float)
    return ndimage.median_filter(y, size=3, mode="nearest") if y.size >= 3 else y.copy()


def _plateau(y: np.ndarray, start: int, level: float) -> slice:
    """The plateau: the evaluations from ``start`` through the lowest value after it, and on while the curve stays
    at or below ``level``; it ends before the first evaluation after the minimum that rises above ``level`` (a
    late rise of the curve is not plateau noise)."""
    end = start + int(np.argmin(y[start:])) + 1
    while end < y.size and y[end] <= level:
        end += 1
    return slice(start, end)


def scatter_about_local_trend(steps: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Robust noise of ``y`` (its units) about its local trend in log time, and the number of residuals it rests on.

    Each evaluation with a neighbour on both sides is compared with the straight line through them in log time (the
    pseudo-residuals of Gasser, Sroka and Jennen-Steinmetz 1986): with ``u`` the log-time fraction of its step between
    theirs, ``y_i - ((1 - u) y_prev + u y_next)`` has standard deviation ``sigma * sqrt(1 + u^2 + (1 - u)^2)`` for
    independent noise ``sigma``, so each is divided by that factor, and ``sigma`` is their normal-scaled median
    absolute deviation (scipy.stats.median_abs_deviation). A trend linear in log time leaves them at 0 (neighbour
    differences would count it as noise), and the median ignores the few kinks where the trend bends. ``steps``:
    optimizer steps, increasing, same shape as ``y``. (0.0, n) with fewer than 3 residuals.
    """
    n = y.size - 2
    if n < 3:
        return 0.0, max(n, 0)
    a, b, c = steps[:-2], steps[1:-1], steps[2:]
    if a[0] > 0:
        u = np.log(b / a) / np.log(c / a)
    else:  # step 0 has no log time: the first line is linear in steps, the others in log time
        u = np.concatenate([[(b[0] - a[0]) / (c[0] - a[0])], np.log(b[1:] / a[1:]) / np.log(c[1:] / a[1:])])
    resid = (y[1:-1] - ((1 - u) * y[:-2] + u * y[2:])) / np.sqrt(1 + u ** 2 + (1 - u) ** 2)
    return float(stats.median_abs_deviation(resid, scale="normal")), int(n)


def tau_gen(steps: Sequence[float], fid: Sequence[float | None], lo: Sequence[float | None] | None = None,
            hi: Sequence[float | None] | None = None, *, se: Sequence[float | None] | None = None,
            rtol: float = 0.05, z: float = 3.0) -> Estimate:
    """The step (optimizer steps) at which FID (or FD) reaches its plateau (see the module docstring for the rule).

    ``fid``: one value per evaluation (None where not recorded). ``se``: per-evaluation standard errors of the FID
    (its sampling error, same units; None where not recorded); without any, the curve's relative scatter about its
    local trend stands in for it. ``lo``/``hi``: optional per-evaluation bounds of the FID; by default each
    evaluation's 95% bounds ``fid -/+ 1.96 se`` (none with ``z = 0``, an exact curve). In the result, ``level`` is the
    band's upper edge ``m + band`` and ``noise`` the band's ``sigma``, both in FID units.
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
    has_se = np.isfinite(y_se)
    smooth = smoothed_quality(y)
    m = float(smooth.min())
    if has_se.any():
        # sigma is the median se over the plateau, which the band delimits: iterate until the plateau's start is stable
        band = rtol * abs(m)
        start = int(np.flatnonzero(smooth <= m + band)[0])
        for _ in range(10):
            part = _plateau(smooth, start, m + band)
            on_plateau = y_se[part][has_se[part]]
            sigma = float(np.median(on_plateau if on_plateau.size else y_se[has_se]))
            band = max(rtol * abs(m), z * sigma)
            new_start = int(np.flatnonzero(smooth <= m + band)[0])
            if new_start == start:
                break
            start = new_start
        source = "median se over the plateau" if on_plateau.size else "median se, none on the plateau"
    else:
        relative, used = scatter_about_local_trend(s, np.log(y)) if np.all(y > 0) else (0.0, 0)
        sigma = relative * abs(m)
        band = max(rtol * abs(m), z * sigma)
        source = (f"no se recorded: |m| x the relative scatter of the curve about its local log-time trend, "
                  f"{relative:.3g} over {used} evaluations" if used >= 3 else
                  "no se recorded and fewer than 5 evaluations or a value <= 0: sigma 0")
    level = m + band
    err = (CI_Z if z > 0 else 0.0) * np.where(has_se, y_se, sigma)  # z = 0: an exact curve, no noise term
    bound_lo = smoothed_quality(np.where(np.isfinite(y_lo), y_lo, y - err))
    bound_hi = smoothed_quality(np.where(np.isfinite(y_hi), y_hi, y + err))
    rule = (f"first log-time crossing of the running median of 3 evaluations down to m + max({rtol:g} * |m|, "
            f"{z:g} * sigma) = {level:.4g} (m = its minimum = {m:.4g}, sigma {sigma:.3g}: {source})")
    first_in = int(np.flatnonzero(smooth <= level)[0])
    if first_in == 0:
        first = float(s[0])
        return Estimate(first, None, first, True,
                        f"on the plateau already at the first evaluation (upper bound); {rule}", level, sigma)
    value = first_crossing_down(s, smooth, level)
    if s.size - first_in < 3:
        return Estimate(value, value, None, True, f"fewer than 3 evaluations on the plateau, FID may still fall "
                                                  f"(lower bound); {rule}", level, sigma)
    early = first_crossing_down(s, bound_lo, level)  # None only when bounds passed as lo lie above the FID
    lower = float(s[first_in - 1]) if early is None else min(early, float(s[first_in - 1]))
    upper = first_crossing_down(s, bound_hi, level)
    return Estimate(value, lower, None if upper is None else max(upper, float(s[first_in])), False, rule, level,
                    sigma, (float(s[first_in - 1]), float(s[first_in])))


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
    g = int(hits[0]) if hits.size else None
    bound = bound_at_an_end(s, g, rule, never="gap never opened by the last evaluation",
                            already="gap open already at the first evaluation")
    if bound is not None:
        return bound
    e0, e1 = float(excess[g - 1]), float(excess[g])
    u = -e0 / (e1 - e0) if e0 < 0 else 0.0
    value = _log_between(float(s[g - 1]), float(s[g]), u)
    return Estimate(value, float(s[g - 1]), float(s[g]), False, rule)


# --- tau_bias: split pairs --------------------------------------------------------------------------------------------

def stays_above(steps: Sequence[float], lo: Sequence[float | None], floor: float, what: str) -> Estimate:
    """The first evaluation from which ``lo`` (the lower end of a measure's 95 % interval, one per evaluation, None
    where not recorded) stays above ``floor`` at it and at every later evaluation: the rule of tau_bias and tau_auc
    (module docstring); ``what`` names the measure in the rule and the censoring reasons."""
    s = _check_steps(steps)
    low = _as_float_array(lo, s.size, f"{what}_lo")
    keep = np.isfinite(low)
    if not keep.any():
        return Estimate(None, None, None, False, f"no evaluation with {what}'s interval recorded")
    s, low = s[keep], low[keep]
    rule = (f"first evaluation from which {what}_lo > {floor:g} at it and at every later evaluation; the timescale = "
            "log-time midpoint of it and the evaluation before, interval = those two steps")
    not_above = np.flatnonzero(low <= floor)
    b = int(not_above[-1]) + 1 if not_above.size else 0  # the first evaluation of the final run above the floor
    bound = bound_at_an_end(s, b if b < s.size else None, rule,
                            never=f"{what} not established above {floor:g} at the last evaluation",
                            already=f"{what} established above {floor:g} from the first evaluation on")
    if bound is not None:
        return bound
    value = _log_between(float(s[b - 1]), float(s[b]), 0.5)
    return Estimate(value, float(s[b - 1]), float(s[b]), False, rule)


def tau_bias(steps: Sequence[float], bias_lo: Sequence[float | None]) -> Estimate:
    """The first evaluation step from which a split pair's bias stays established (see the module docstring).

    ``steps``: optimizer steps, one per paired evaluation (pairs.jsonl, ``diffmem.paired_evaluation``);
    ``bias_lo``: the lower end of the 95% bootstrap interval of the bias (the mean log ratio of the distances to
    the other and to the own train set, no unit) at each of them, None where not recorded.
    """
    return stays_above(steps, bias_lo, 0.0, "bias")


def tau_auc(steps: Sequence[float], auc_lo: Sequence[float | None]) -> Estimate:
    """The first evaluation step from which the membership AUC's 95 % interval stays above 0.5 (module docstring):
    the per-image losses tell training images from held-out ones from then on. ``auc_lo``: the lower end of DeLong's
    interval per evaluation (metrics.jsonl ``membership_auc_lo``, or one level's ``auc_lo``), None where not
    recorded."""
    return stays_above(steps, auc_lo, 0.5, "auc")


def tau_bias_level(steps: Sequence[float], bias: Sequence[float | None], bias_lo: Sequence[float | None],
                   bias_hi: Sequence[float | None], level: float) -> Estimate:
    """The step at which a split pair's bias first rises to ``level`` (tau_bias_at_L; module docstring): the rule of
    tau_mem_at_L applied to the bias and its 95 % bootstrap interval (pairs.jsonl ``bias``, ``bias_lo``,
    ``bias_hi``: the mean log ratio of the distances to the other and to the own train set, no unit; None where not
    recorded). ``level`` > 0, e.g. 0.05: samples about 5 % nearer their own train set than the other."""
    if not level > 0.0:
        raise TimescaleInputError(f"level = {level!r} must be > 0 (a mean log ratio), e.g. 0.05")
    s = _check_steps(steps)
    y = _as_float_array(bias, s.size, "bias")
    y_lo = _as_float_array(bias_lo, s.size, "bias_lo")
    y_hi = _as_float_array(bias_hi, s.size, "bias_hi")
    keep = np.isfinite(y) & np.isfinite(y_lo) & np.isfinite(y_hi)
    if not keep.any():
        return Estimate(None, None, None, False, "no paired evaluation with the bias and its interval recorded")
    return level_crossing(s[keep], y[keep], y_lo[keep], y_hi[keep], level, "bias")


# --- all three from a run's metrics records --------------------------------------------------------------------------

def estimate_run(records: Sequence[dict[str, Any]],
                 mem_levels: Sequence[float] = (0.01, 0.1)) -> dict[str, Estimate]:
    """tau_mem, tau_gen, tau_gap and tau_auc (from ``membership_auc_lo``) of one run from its metrics.jsonl records (one per step, sorted by step), and for
    each fraction L of ``mem_levels`` (``eval.mem_levels``) the level crossing ``tau_mem_at_{L:g}``
    (:func:`tau_mem_level`; e.g. keys "tau_mem_at_0.01", "tau_mem_at_0.1"): the one place where the columns meet the
    estimators, for the analysis, the training loop's stop rule and refinement. Values in optimizer steps."""
    def col(key: str) -> list[float | None]:
        return [r.get(key) for r in records]

    steps = [float(r["step"]) for r in records]
    n_samples = col("n_samples")
    counts = n_samples if all(v is not None for v in n_samples) else None
    out = {
        "tau_mem": tau_mem(steps, col("f_mem"), col("f_mem_lo"), col("f_mem_hi"), n_samples=counts),
        "tau_gen": tau_gen(steps, col("fid"), se=[quality_se(r) for r in records]),
        "tau_gap": tau_gap(steps, col("train_loss"), col("test_loss")),
        "tau_auc": tau_auc(steps, col("membership_auc_lo")),
    }
    for level in mem_levels:
        out[f"tau_mem_at_{level:g}"] = tau_mem_level(steps, col("f_mem"), col("f_mem_lo"), col("f_mem_hi"), level,
                                                     n_samples=counts)
    return out
