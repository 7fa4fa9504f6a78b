"""Power laws ``tau = prefactor * x ** exponent`` fitted in log-log space with a bootstrap-over-runs interval, and the
fits.json they are stored in (written by :mod:`diffmem.analysis.scaling`, read by advice and figures).

The fitting rule is stated in :mod:`diffmem.analysis.scaling`'s docstring (docs/analysis.md copies it). This module holds
what both the writer (scaling) and the readers (advise, plots, the theory's figures) need, so that none of them
imports another.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from diffmem.analysis.runfiles import read_json

FIT_NAMES: tuple[str, ...] = ("tau_mem_vs_n", "tau_gen_vs_n", "tau_gen_vs_width", "tau_mem_vs_n_over_width")
EXTRA_FIT_NAMES: tuple[str, ...] = ("tau_mem_epochs_vs_n", "tau_mem_vs_width")
"""Fits added after fits.json files were first written; loaded when present."""


class AnalysisError(ValueError):
    """Bad input to the across-run analysis; the message says what to do."""


@dataclass(frozen=True)
class PowerLawFit:
    """``y = prefactor * x ** exponent`` fitted in log-log space, with a bootstrap-over-runs interval.

    ``points``: (run, x, y, y_lo, y_hi) of the measured runs used (y_lo/y_hi: the run's own interval, None when
    unknown); ``censored``: (run, x, bound) left out because tau is a bound;
    ``excluded``: (run, reason) left out because tau is missing. ``reason`` is None when fitted, else why not.
    """

    quantity: str
    x_name: str
    points: tuple[tuple[str, float, float, float | None, float | None], ...]
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
    n_boot: int = 2000
    seed: int = 0
    ci: float = 0.95

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

    def bootstrap_coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """(log10 prefactor, exponent) of each valid bootstrap refit (arrays of equal length, seeded)."""
        return _bootstrap_loglog(*_log_arrays(self.points), self.n_boot, self.seed)

    def predict(self, x: float | Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, lo, hi) of the law at ``x`` (same shape as ``x``); the interval from the bootstrap refits."""
        if not self.fitted:
            raise AnalysisError(f"{self.quantity} vs {self.x_name} is not fitted ({self.reason}); it cannot predict")
        lxq = np.log10(np.asarray(x, dtype=float))
        value = 10 ** (math.log10(self.prefactor) + self.exponent * lxq)
        c_b, k_b = self.bootstrap_coefficients()
        if c_b.size == 0:
            return value, value.copy(), value.copy()
        curves = c_b[:, None] + k_b[:, None] * np.atleast_1d(lxq)[None, :]
        alpha = 100 * (1 - self.ci) / 2
        lo = 10 ** np.percentile(curves, alpha, axis=0).reshape(np.shape(lxq))
        hi = 10 ** np.percentile(curves, 100 - alpha, axis=0).reshape(np.shape(lxq))
        return value, lo, hi

    def to_dict(self) -> dict[str, Any]:
        rng = self.x_range
        return {
            "quantity": self.quantity, "x": self.x_name,
            "exponent": self.exponent, "exponent_lo": self.exponent_lo, "exponent_hi": self.exponent_hi,
            "prefactor": self.prefactor, "prefactor_lo": self.prefactor_lo, "prefactor_hi": self.prefactor_hi,
            "n_runs": self.n_runs, "n_x": len({p[1] for p in self.points}),
            "x_min": rng[0] if rng else None, "x_max": rng[1] if rng else None,
            "reason": self.reason, "ci_note": self.ci_note,
            "points": [{"run": r, "x": x, "y": y, "y_lo": lo, "y_hi": hi} for r, x, y, lo, hi in self.points],
            "censored": [{"run": r, "x": x, "lower_bound": b} for r, x, b in self.censored],
            "excluded": [{"run": r, "reason": why} for r, why in self.excluded],
            "n_boot": self.n_boot, "seed": self.seed, "ci": self.ci,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PowerLawFit:
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
                n_boot=int(d.get("n_boot", 2000)), seed=int(d.get("seed", 0)), ci=float(d.get("ci", 0.95)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise AnalysisError(f"a fit in fits.json is malformed ({e!r}); rerun `diffmem analyze`") from None

    def describe(self) -> str:
        """One line, e.g. ``tau_mem ~ 312 * n^1.01 [0.95, 1.07] (12 runs)``."""
        if not self.fitted:
            return f"{self.quantity} vs {self.x_name}: not fitted ({self.reason})"
        return (f"{self.quantity} ~ {self.prefactor:.3g} * {self.x_name}^{self.exponent:.3f} "
                f"[{self.exponent_lo:.3f}, {self.exponent_hi:.3f}] ({self.n_runs} runs"
                + (f", {len(self.censored)} censored left out" if self.censored else "") + ")")


def _log_arrays(points) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """log10 of x, y and of each point's interval (the interval collapses to y where it is unknown)."""
    lx = np.log10([p[1] for p in points])
    ly = np.log10([p[2] for p in points])
    lo = np.array([math.log10(min(p[3], p[2])) if p[3] and p[3] > 0 else math.log10(p[2]) for p in points])
    hi = np.array([math.log10(max(p[4], p[2])) if p[4] and p[4] > 0 else math.log10(p[2]) for p in points])
    return lx, ly, lo, hi


def _bootstrap_loglog(lx: np.ndarray, ly: np.ndarray, ly_lo: np.ndarray, ly_hi: np.ndarray, n_boot: int,
                      seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares (intercept, slope) of log y on log x for ``n_boot`` seeded resamples of the points with
    replacement, each resampled y drawn uniformly in [ly_lo, ly_hi] (log10 units)."""
    if lx.size == 0 or n_boot <= 0:
        return np.empty(0), np.empty(0)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, lx.size, size=(n_boot, lx.size))
    X = lx[idx]
    # one draw per distinct x and resample: runs at the same x share the evaluation grid, hence its error
    _, group = np.unique(lx, return_inverse=True)
    u = rng.random((n_boot, group.max() + 1))[:, group][np.arange(n_boot)[:, None], idx]
    Y = ly_lo[idx] + u * (ly_hi - ly_lo)[idx]
    mx, my = X.mean(axis=1, keepdims=True), Y.mean(axis=1, keepdims=True)
    sxx = ((X - mx) ** 2).sum(axis=1)
    sxy = ((X - mx) * (Y - my)).sum(axis=1)
    ok = sxx > 1e-12
    slope = sxy[ok] / sxx[ok]
    return my[ok, 0] - slope * mx[ok, 0], slope


def fit_power_law(quantity: str, x_name: str,
                  points: Iterable[tuple[str, float, float] | tuple[str, float, float, float | None, float | None]], *,
                  censored: Iterable[tuple[str, float, float | None]] = (),
                  excluded: Iterable[tuple[str, str]] = (), n_boot: int = 2000, seed: int = 0,
                  ci: float = 0.95) -> PowerLawFit:
    """Fit ``y = A x^k`` by log-log least squares to ``points`` (run, x, y[, y_lo, y_hi]); CI by a seeded bootstrap
    over runs with each y drawn within its own interval (see the module docstring).

    Points with a non-positive x or y are moved to ``excluded``. Fewer than 2 distinct x -> not fitted (reason set).
    """
    if not 0 < ci < 1:
        raise AnalysisError(f"ci = {ci} must be in (0, 1), e.g. 0.95")
    kept, dropped = [], list(excluded)
    for point in points:
        run, x, y = point[:3]
        y_lo, y_hi = (point[3], point[4]) if len(point) == 5 else (None, None)
        if x is None or y is None or not (x > 0 and y > 0) or not (math.isfinite(x) and math.isfinite(y)):
            dropped.append((run, f"{x_name} = {x}, {quantity} = {y}: not positive"))
        else:
            kept.append((run, float(x), float(y), y_lo, y_hi))
    base = dict(quantity=quantity, x_name=x_name, points=tuple(kept), censored=tuple(censored),
                excluded=tuple(dropped), n_boot=n_boot, seed=seed, ci=ci)
    n_distinct = len({p[1] for p in kept})
    if n_distinct < 2:
        return PowerLawFit(**base, reason=f"fewer than 2 distinct {x_name} values among measured runs "
                                          f"({len(kept)} measured, {len(base['censored'])} censored)")
    lx, ly, ly_lo, ly_hi = _log_arrays(kept)
    slope, intercept = np.polyfit(lx, ly, 1)
    c_b, k_b = _bootstrap_loglog(lx, ly, ly_lo, ly_hi, n_boot, seed)
    alpha = 100 * (1 - ci) / 2
    k_lo, k_hi = np.percentile(k_b, [alpha, 100 - alpha])
    c_lo, c_hi = np.percentile(c_b, [alpha, 100 - alpha])
    note = (f"only {n_distinct} distinct {x_name} values: the bootstrap interval is degenerate"
            if n_distinct < 3 else None)
    return PowerLawFit(**base, exponent=float(slope), exponent_lo=float(k_lo), exponent_hi=float(k_hi),
                       prefactor=float(10 ** intercept), prefactor_lo=float(10 ** c_lo),
                       prefactor_hi=float(10 ** c_hi), ci_note=note)


@dataclass(frozen=True)
class FitSet:
    """A pooled fit and the same law fitted per group (``group_key`` "width" or "n"; None = no groups)."""

    pooled: PowerLawFit
    groups: dict[str, PowerLawFit] = field(default_factory=dict)
    group_key: str | None = None

    @property
    def note(self) -> str | None:
        """A warning when the pooled fit mixes several groups (e.g. widths, whose laws differ)."""
        if self.group_key is not None and len(self.groups) > 1:
            return (f"pooled over {len(self.groups)} values of {self.group_key}; the per-{self.group_key} fits in "
                    f"by_{self.group_key} are the ones to read")
        return None

    def to_dict(self) -> dict[str, Any]:
        out = self.pooled.to_dict()
        if self.group_key is not None:
            out["pooled_note"] = self.note
            out[f"by_{self.group_key}"] = {k: f.to_dict() for k, f in self.groups.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitSet:
        for key in ("width", "n"):
            if f"by_{key}" in d:
                groups = {k: PowerLawFit.from_dict(v) for k, v in d[f"by_{key}"].items()}
                return cls(PowerLawFit.from_dict(d), groups, key)
        return cls(PowerLawFit.from_dict(d))


def load_fits(path: str | Path) -> dict[str, FitSet]:
    """Read fits.json (or the fits.json of an experiment folder) back into :class:`FitSet` objects."""
    path = Path(path)
    if path.is_dir():
        path = path / "fits.json"
    data = read_json(path)
    missing = [name for name in FIT_NAMES if name not in data]
    if missing:
        raise AnalysisError(f"{path} lacks {', '.join(missing)}; rerun `diffmem analyze` with this version")
    return {name: FitSet.from_dict(data[name]) for name in FIT_NAMES + EXTRA_FIT_NAMES if name in data}
