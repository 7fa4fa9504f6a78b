"""tau_gen and tau_mem of one random-features curve, with the rules stated.

- **tau_gen**: :func:`diffmem.analysis.timescales.tau_gen`, the U-Net rule unchanged, applied to ``score_error``
  (the distance to the exact score plays FID's part) with ``z = 0``: the curves are exact, so the band has no noise
  term and is ``rtol * min`` (5%). Interval: the bracket of grid times around the crossing.
- **tau_mem**: the U-Net rule needs copies among generated samples, which a score at one diffusion time cannot
  produce. The theory's rule: the time at which the generalization loss L_gen = test_loss - train_loss first
  reaches ``fraction`` (default 1/2) of its tau -> infinity value (log-time interpolation on the grid; interval:
  the bracket of grid times). Half the rise, because the rise is spread over the rho_1 bulk: its onset is set by the
  bulk's fast right edge, its end by the slow left edge that the paper's psi_p / (Delta_t lambda_min) uses.
- **tau_gap**: the U-Net's loss-gap rule (:func:`diffmem.analysis.timescales.tau_gap`, ``z = 0``), reported for
  comparison: it fires when the gap exceeds 5% of the test loss, an absolute level that the finite-n gap of the
  population modes (~ 1 / psi_n) reaches early for small psi_n.
"""
from __future__ import annotations

import numpy as np

from diffmem.analysis import timescales
from diffmem.analysis.timescales import Estimate, bound_at_an_end, first_crossing_down


def gap_rise_time(taus: np.ndarray, train_loss: np.ndarray, test_loss: np.ndarray, gap_at_infinity: float,
                  fraction: float = 0.5) -> Estimate:
    """First training time at which test_loss - train_loss reaches ``fraction * gap_at_infinity``."""
    gap = np.asarray(test_loss, dtype=float) - np.asarray(train_loss, dtype=float)
    level = fraction * gap_at_infinity
    rule = f"first time L_gen = test - train loss reaches {fraction:g} x its tau -> inf value ({level:.4g})"
    if not gap_at_infinity > 0:
        return Estimate(None, None, None, False, f"L_gen(inf) = {gap_at_infinity:.3g} <= 0: no memorization")
    above = np.flatnonzero(gap >= level)
    i = int(above[0]) if above.size else None
    bound = bound_at_an_end(taus, i, rule, never="not reached by the last time", already="reached at the first time")
    if bound is not None:
        return bound
    value = first_crossing_down(np.asarray(taus, dtype=float), -gap, -level)  # the same log-time interpolation
    return Estimate(value, float(taus[i - 1]), float(taus[i]), False, rule)


def curve_timescales(taus: np.ndarray, curves: dict[str, np.ndarray], at_infinity: dict[str, float],
                     fraction: float = 0.5) -> dict[str, Estimate]:
    """tau_gen, tau_mem and tau_gap (see the module docstring) of one set of curves on the grid ``taus``."""
    return {
        "tau_gen": timescales.tau_gen(taus, curves["score_error"], z=0.0),
        "tau_mem": gap_rise_time(taus, curves["train_loss"], curves["test_loss"],
                                 at_infinity["test_loss"] - at_infinity["train_loss"], fraction),
        "tau_gap": timescales.tau_gap(taus, curves["train_loss"], curves["test_loss"], z=0.0),
    }
