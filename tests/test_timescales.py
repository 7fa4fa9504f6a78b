"""Estimators of one run (tau_mem, tau_gen, tau_gap) on curves with known answers, and the training-loop monitors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffmem.analysis.timescales import Estimate, TimescaleInputError, binomial_interval, tau_gap, tau_gen, tau_mem
from diffmem.metrics.memorization import bootstrap_interval
from diffmem.monitor import LossGapMonitor, MemorizationMonitor, MonitorError

STEPS = np.unique(np.round(np.geomspace(1, 1e6, 40)).astype(int)).astype(float)


def _f_mem_run(tau: float, n_samples: int = 256, f_max: float = 0.8, seed: int = 0):
    """Binomial f_mem curve that starts rising at ``tau``, with its binomial 95% interval."""
    rng = np.random.default_rng(seed)
    f_true = np.where(STEPS > tau, f_max * (1 - tau / STEPS), 0.0)
    f = rng.binomial(n_samples, f_true) / n_samples
    lo, hi = binomial_interval(f, n_samples)
    return f, lo, hi


# --- tau_mem --------------------------------------------------------------------------------------------------------

def test_tau_mem_step_function_gives_log_midpoint_and_bracket():
    steps = [10, 100, 1000, 10000]
    f = [0.0, 0.0, 0.3, 0.5]
    est = tau_mem(steps, f, lo=[0, 0, 0.2, 0.4], hi=[0, 0, 0.4, 0.6])
    assert est == Estimate(math.sqrt(100 * 1000), 100.0, 1000.0, False, est.rule)
    assert est.measured and "f_mem_lo > 0" in est.rule


def test_tau_mem_ignores_insignificant_readings_and_later_dips():
    # one chance near-copy at step 100 (lower bound 0), then significant at 1000, then a dip 0.10 -> 0.02 -> 0.27
    steps = [10, 100, 1000, 2000, 4000]
    f = [0.0, 1 / 128, 0.10, 0.02, 0.27]
    lo, hi = binomial_interval(np.array(f), 128)
    assert lo[1] == 0 and lo[2] > 0  # as the percentile bootstrap: one sample of 128 is not significant
    est = tau_mem(steps, f, lo, hi)
    assert est.hi == 1000 and est.lo == 10  # last evaluation with no memorized sample at all
    assert est.value == pytest.approx(math.sqrt(10 * 1000))


def test_lower_bound_needs_about_four_memorized_samples():
    lo, _ = binomial_interval(np.array([3 / 128, 4 / 128]), 128)
    assert lo[0] == 0 and lo[1] > 0
    for k, positive in ((3, False), (4, True)):  # the recorded percentile bootstrap agrees
        indicators = np.arange(128) < k
        assert (bootstrap_interval(indicators, 1000, 0)[0] > 0) == positive


def test_tau_mem_recovers_planted_onset_within_one_evaluation():
    for tau in (300.0, 5000.0, 2e5):
        f, lo, hi = _f_mem_run(tau)
        est = tau_mem(STEPS, f, lo, hi)
        assert est.lo <= tau * 1.05 and est.hi >= tau  # the bracket holds the planted onset
        assert abs(math.log10(est.value / tau)) < 0.2
        ratio = STEPS[1:] / STEPS[:-1]
        assert est.hi / est.lo < ratio.max() ** 3  # a bracket of a few evaluations, not the whole run


def test_tau_mem_computes_interval_from_n_samples_when_missing():
    f, lo, hi = _f_mem_run(5000.0, n_samples=256)
    with_bounds = tau_mem(STEPS, f, lo, hi)
    without = tau_mem(STEPS, f, n_samples=256)
    assert without.value == with_bounds.value and "binomial" in without.rule
    with pytest.raises(TimescaleInputError, match="n_samples"):
        tau_mem(STEPS, f)


def test_tau_mem_never_memorized_is_censored_lower_bound():
    est = tau_mem([1, 10, 100], [0.0, 0.0, 0.004], [0, 0, 0], [0, 0, 0.01])
    assert est.censored and not est.measured
    assert est.value == est.lo == 100 and est.hi is None


def test_tau_mem_memorized_at_first_evaluation_is_upper_bound():
    est = tau_mem([50, 100], [0.5, 0.6], [0.4, 0.5], [0.6, 0.7])
    assert est.censored and est.lo is None and est.hi == est.value == 50


def test_tau_mem_floor_and_missing_values():
    steps = [1, 10, 100, 1000]
    est = tau_mem(steps, [0.0, 0.02, 0.2, 0.4], [0.0, 0.01, 0.1, 0.3], [0.0, 0.03, 0.3, 0.5], floor=0.05)
    assert est.hi == 100 and est.lo == 10  # f_mem_hi 0.03 <= floor: clean at step 10
    dropped = tau_mem(steps, [0.0, None, 0.2, 0.4], [0.0, None, 0.1, 0.3], [0.0, None, 0.3, 0.5])
    assert dropped.hi == 100 and dropped.lo == 1
    none = tau_mem(steps, [None] * 4)
    assert none.value is None and not none.censored and "no f_mem" in none.rule


def test_estimators_reject_bad_steps_and_lengths():
    with pytest.raises(TimescaleInputError, match="increasing"):
        tau_mem([10, 5], [0, 0], [0, 0], [0, 0])
    with pytest.raises(TimescaleInputError, match="entries"):
        tau_gen([1, 2, 3], [1.0, 2.0])
    with pytest.raises(TimescaleInputError, match=">= 0"):
        tau_gap([-1, 2, 3], [1, 1, 1], [1, 1, 1])


# --- tau_gen --------------------------------------------------------------------------------------------------------

def _fid_curve(tau: float, noise: float = 0.0, seed: int = 0, fid_min: float = 30.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fid = fid_min * (1 + 5 * np.maximum(0.0, np.log10(tau / STEPS)))
    return fid * (1 + noise * rng.standard_normal(STEPS.size))


def test_tau_gen_finds_the_plateau_of_a_clean_curve():
    est = tau_gen(STEPS, _fid_curve(1e4))
    # band = 5% of the minimum: the curve enters it 0.01 decades before the planted plateau
    assert est.value == pytest.approx(1e4 / 10 ** 0.01, rel=1e-3)
    i = int(np.searchsorted(STEPS, est.value))
    assert (est.lo, est.hi) == (STEPS[i - 1], STEPS[i])  # no noise: the interval is the bracket of evaluations
    assert est.measured
    assert est.level == pytest.approx(30.0 * 1.05)  # the plateau band's upper edge: m + 5% of m, FID units


def test_tau_gen_level_is_the_band_the_noise_widened():
    se = np.full(STEPS.size, 3.0)
    est = tau_gen(STEPS, _fid_curve(1e4), se=se)
    assert est.level == pytest.approx(30.0 + 3 * 3.0)  # m + z * sigma, sigma = the given standard error
    assert tau_mem(STEPS, *_f_mem_run(1e4)).level is None


def test_tau_gen_with_noise_stays_near_the_plateau_and_brackets_it():
    errors = []
    for seed in range(20):
        est = tau_gen(STEPS, _fid_curve(1e4, noise=0.03, seed=seed))
        assert est.lo <= est.value <= est.hi
        errors.append(abs(math.log10(est.value / 1e4)))
    step = math.log10(STEPS[-1] / STEPS[-2])  # one evaluation interval, in decades
    assert max(errors) < 3 * step and np.median(errors) < step / 2


def _rising_after(fid: np.ndarray, rise_at: float, rise: float = 0.5) -> np.ndarray:
    """Quality worsens again after ``rise_at``: the FID grows by ``rise`` x its plateau per decade."""
    return fid * (1 + rise * np.maximum(0.0, np.log10(STEPS / rise_at)))


@pytest.mark.parametrize("rise_at", [1.2e5, 2e5, 3e5])
def test_tau_gen_is_not_pulled_earlier_when_quality_worsens_after_the_plateau(rise_at):
    # a plateau reached at 1e5; before the fix a rise from 2e5 on was read as 7.5e4, outside the bracket of 1e5
    bracket = STEPS[np.searchsorted(STEPS, 1e5) - 1], STEPS[np.searchsorted(STEPS, 1e5)]
    clean = tau_gen(STEPS, _rising_after(_fid_curve(1e5), rise_at))
    assert bracket[0] < clean.value <= bracket[1] and not clean.censored
    errors = [abs(math.log10(tau_gen(STEPS, _rising_after(_fid_curve(1e5, noise=0.03, seed=seed), rise_at)).value
                             / 1e5)) for seed in range(20)]
    step = math.log10(STEPS[-1] / STEPS[-2])
    assert max(errors) < step / 2 and np.median(errors) < step / 3


def test_tau_gen_carries_the_metrics_own_sampling_noise():
    fid = _fid_curve(1e4)
    quiet = tau_gen(STEPS, fid, se=np.full(STEPS.size, 0.01))
    noisy = tau_gen(STEPS, fid, se=np.full(STEPS.size, 3.0))  # 10% of the plateau: a band of 30%
    assert quiet.value == pytest.approx(tau_gen(STEPS, fid).value)
    assert noisy.value < quiet.value and noisy.lo <= quiet.lo and noisy.hi >= quiet.hi
    assert "sigma 3" in noisy.rule


def test_tau_gen_missing_fid_gives_none_not_an_exception():
    assert tau_gen(STEPS, [None] * STEPS.size).value is None
    assert tau_gen([1.0], [40.0]).value is None
    fid = list(_fid_curve(1e4))
    fid[5] = None
    assert tau_gen(STEPS, fid).value == pytest.approx(tau_gen(STEPS, _fid_curve(1e4)).value)


def test_tau_gen_still_falling_is_censored():
    est = tau_gen(STEPS, _fid_curve(1e7))
    assert est.censored and est.hi is None and est.value == est.lo
    assert "still fall" in est.rule


# --- tau_gap --------------------------------------------------------------------------------------------------------

def _losses(tau: float | None, noise: float = 0.005, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = 0.1 + 0.9 / (1 + STEPS / 100)
    train, test = base.copy(), base.copy()
    if tau is not None:
        after = STEPS > tau
        train[after] = base[after] * (tau / STEPS[after]) ** 0.5
        test[after] = base[after] * (1 + 0.3 * np.log10(STEPS[after] / tau))
    return (train * (1 + noise * rng.standard_normal(STEPS.size)),
            test * (1 + noise * rng.standard_normal(STEPS.size)))


def test_tau_gap_recovers_planted_opening():
    for tau in (3e3, 5e4):
        train, test = _losses(tau)
        est = tau_gap(STEPS, train, test)
        assert est.measured and est.lo <= est.value <= est.hi
        assert tau <= est.hi and abs(math.log10(est.value / tau)) < 0.25


def test_tau_gap_never_open_is_censored_and_one_outlier_does_not_count():
    train, test = _losses(None)
    test[20] *= 1.5  # a single outlying evaluation
    est = tau_gap(STEPS, train, test)
    assert est.censored and est.value == STEPS[-1] and est.hi is None
    assert tau_gap(STEPS[:2], train[:2], test[:2]).value is None


# --- monitors -------------------------------------------------------------------------------------------------------

def test_memorization_monitor_stops_on_copies_not_on_novel_samples():
    gen = torch.Generator().manual_seed(0)
    train = torch.randn(20, 1, 4, 4, generator=gen)
    monitor = MemorizationMonitor(train, stop_at=0.01, n_boot=200)
    novel = monitor.update(100, torch.randn(64, 1, 4, 4, generator=gen) * 3)
    assert not novel.should_stop and novel.lo <= 0.01 and monitor.first_stop_step is None
    copies = train[torch.arange(64) % 20] + 1e-3 * torch.randn(64, 1, 4, 4, generator=gen)
    reading = monitor.update(200, copies)
    assert reading.should_stop and reading.f_mem == 1.0 and reading.lo > 0.01 and "copies" in reading.reason
    assert monitor.first_stop_step == 200 and len(monitor.history) == 2
    with pytest.raises(MonitorError, match="not after"):
        monitor.update(150, copies)
    with pytest.raises(MonitorError, match="N >= 2"):
        MemorizationMonitor(train[:1])


def test_loss_gap_monitor_stops_once_the_opening_is_confirmed():
    train, test = _losses(5e3)
    monitor = LossGapMonitor()
    readings = [monitor.update(int(s), a, b) for s, a, b in zip(STEPS, train, test)]
    stops = [r.step for r in readings if r.should_stop]
    assert stops, "the gap opened at 5e3 and must be detected"
    assert 5e3 < stops[0] < 5e4
    assert all(not r.should_stop for r in readings if r.step <= 5e3)
    assert readings[-1].gap == pytest.approx(test[-1] - train[-1])
