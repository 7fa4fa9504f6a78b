"""Estimators of one run (tau_mem, tau_gen, tau_gap) on curves with known answers, and the training-loop monitors."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from diffmem.analysis.runfiles import read_run
from diffmem.analysis.timescales import (Estimate, TimescaleInputError, binomial_interval, estimate_run,
                                         quality_se, smoothed_quality, tau_gap, tau_gen, tau_mem,
                                         tau_mem_level)
from diffmem.metrics.memorization import bootstrap_interval
from diffmem.monitor import LossGapMonitor, MemorizationMonitor, MonitorError

ROOT = Path(__file__).resolve().parents[1]
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


# --- tau_mem_at_L: the step at which f_mem rises to a fixed level ---------------------------------------------------

def test_tau_mem_level_interpolates_in_log_time_and_brackets_with_the_interval():
    steps = [100, 200, 400, 800, 1600]
    f = [0.0, 0.005, 0.02, 0.15, 0.4]
    lo = [0.0, 0.001, 0.012, 0.12, 0.36]
    hi = [0.0, 0.011, 0.03, 0.18, 0.44]
    at_1pc = tau_mem_level(steps, f, lo, hi, 0.01)
    # f_mem 0.005 -> 0.02 between 200 and 400: u = (0.01 - 0.005) / (0.02 - 0.005) = 1/3, 200 * 2^(1/3) = 252.0
    assert at_1pc.value == pytest.approx(200 * 2 ** (1 / 3)) and at_1pc.measured
    # early end: f_mem_hi first reaches 0.01 at 200 (0.011), so 100 is the last step it excludes the level;
    # late end: f_mem_lo first reaches 0.01 at 400 (0.012)
    assert (at_1pc.lo, at_1pc.hi) == (100.0, 400.0)
    # its bracket, what the fits take: the two evaluations it is interpolated between (the grid's resolution)
    assert at_1pc.bracket == (200.0, 400.0) and at_1pc.fit_bracket == (200.0, 400.0)
    at_10pc = tau_mem_level(steps, f, lo, hi, 0.1)
    # 0.02 -> 0.15 between 400 and 800: u = 0.08 / 0.13, 400 * 2^(8/13) = 612.8; f_mem_hi and f_mem_lo both first
    # reach 0.1 at 800, so the interval is [400, 800]
    assert at_10pc.value == pytest.approx(400 * 2 ** (8 / 13)) and at_10pc.value == pytest.approx(612.8, abs=0.1)
    assert (at_10pc.lo, at_10pc.hi) == (400.0, 800.0)


def test_tau_mem_level_is_censored_both_ways():
    never = tau_mem_level([10, 100, 1000], [0.0, 0.002, 0.005], [0.0, 0.0, 0.001], [0.0, 0.006, 0.011], 0.01)
    assert never.censored and never.value == never.lo == 1000 and never.hi is None  # lower bound: the last step
    assert never.bracket is None and never.fit_bracket == (1000, None)
    above = tau_mem_level([10, 100, 1000], [0.2, 0.3, 0.4], [0.15, 0.25, 0.35], [0.25, 0.35, 0.45], 0.1)
    assert above.censored and above.lo is None and above.value == above.hi == 10  # upper bound: the first step
    # f_mem reached 0.01 at 1000 but its lower end did not: not established, a lower bound at the last step that
    # still excluded the level (100: f_mem_hi 0.009)
    unsure = tau_mem_level([10, 100, 1000], [0.0, 0.004, 0.012], [0.0, 0.001, 0.006], [0.0, 0.009, 0.02], 0.01)
    assert unsure.censored and unsure.value == unsure.lo == 100 and unsure.hi is None
    assert tau_mem_level([1, 2], [None, None], None, None, 0.01).value is None
    with pytest.raises(TimescaleInputError, match=r"\(0, 1\)"):
        tau_mem_level([1, 2], [0.0, 0.1], [0.0, 0.05], [0.0, 0.15], 1.0)


def test_tau_mem_level_of_a_non_monotone_f_mem_keeps_the_first_crossing_with_an_honest_interval():
    # 0.012 at 200 (not significant), back to 0.004, significant at 800: the value is the first crossing, the
    # interval runs from the last step that excluded the level (100) to the first that established it (800)
    est = tau_mem_level([100, 200, 400, 800], [0.0, 0.012, 0.004, 0.03], [0.0, 0.003, 0.0, 0.02],
                        [0.0, 0.02, 0.01, 0.04], 0.01)
    assert est.value == pytest.approx(100 * 2 ** (0.01 / 0.012)) and (est.lo, est.hi) == (100.0, 800.0)


def test_the_level_crossing_does_not_move_with_the_sample_count_where_the_onset_does():
    """One planted f_mem curve, logistic in log time (f = 1/2 at 1e5, width 0.5 in ln steps), observed with 1000 and
    with 10000 binomial samples per evaluation: it crosses 0.01 at 1e5 * exp(0.5 ln(0.01 / 0.99)) = 10050 steps."""
    steps = np.round(np.geomspace(1e3, 1e5, 41))
    f_true = 1 / (1 + np.exp(-(np.log(steps) - np.log(1e5)) / 0.5))
    crossing = 1e5 * math.exp(0.5 * math.log(0.01 / 0.99))
    assert crossing == pytest.approx(10050, abs=1)
    onset_ratios = []
    for seed in range(6):
        onsets, levels = {}, {}
        for n in (1000, 10000):
            f = np.random.default_rng(seed).binomial(n, f_true) / n
            lo, hi = binomial_interval(f, n)
            onsets[n] = tau_mem(steps, f, lo, hi)
            levels[n] = tau_mem_level(steps, f, None, None, 0.01, n_samples=n)  # interval from the binomial law
            assert levels[n].measured and levels[n].lo <= crossing <= levels[n].hi  # both hold the planted step
        assert abs(math.log(levels[1000].value / levels[10000].value)) < math.log(1.25)
        assert onsets[10000].value < onsets[1000].value  # the onset: more samples detect copies earlier
        onset_ratios.append(onsets[1000].value / onsets[10000].value)
    # f_mem ~ 4/n at detection, 0.004 vs 0.0004: about 6300 vs 2000 steps on this curve (ratios 1.3 to 3.5 here)
    assert np.median(onset_ratios) > 2.5


def test_estimate_run_reports_a_crossing_per_level_and_keeps_its_keys():
    records = [{"step": s, "f_mem": f, "f_mem_lo": None, "f_mem_hi": None, "n_samples": 1000, "fid": None,
                "train_loss": None, "test_loss": None}
               for s, f in ((100, 0.0), (200, 0.005), (400, 0.02), (800, 0.15), (1600, 0.4))]
    est = estimate_run(records)
    assert set(est) == {"tau_mem", "tau_gen", "tau_gap", "tau_auc", "tau_mem_at_0.01", "tau_mem_at_0.1"}
    assert est["tau_mem_at_0.01"].value == pytest.approx(200 * 2 ** (1 / 3))
    assert est["tau_mem_at_0.1"].value == pytest.approx(400 * 2 ** (8 / 13))
    assert set(estimate_run(records, mem_levels=())) == {"tau_mem", "tau_gen", "tau_gap", "tau_auc"}
    assert set(estimate_run(records, mem_levels=[0.001])) >= {"tau_mem_at_0.001"}


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


def _u_curve(rise: float = 0.3, rise_from: float = 3e4) -> np.ndarray:
    """The clean fall of ``_fid_curve(1e4)`` to its minimum 30 at 1e4, flat, then rising by ``rise`` x 30 linearly in
    log time from ``rise_from`` to the last step (quality worsens as copies appear)."""
    up = np.clip(np.log10(STEPS / rise_from) / np.log10(STEPS[-1] / rise_from), 0.0, 1.0)
    return _fid_curve(1e4) * (1 + rise * up)


def test_tau_gen_of_a_u_shaped_curve_is_where_the_fall_enters_the_band_of_the_minimum():
    se = np.full(STEPS.size, 0.3)  # 1% of the minimum: band = max(0.05 * 30, 3 * 0.3) = 1.5
    u_shape = tau_gen(STEPS, _u_curve(), se=se)
    assert _u_curve()[-1] == pytest.approx(39.0)  # rises 30% above the minimum by the end
    # the fall 30 (1 + 5 log10(1e4 / s)) reaches 31.5 at 1e4 / 10^0.01 = 9772 steps
    assert u_shape.value == pytest.approx(1e4 / 10 ** 0.01, rel=1e-6) and u_shape.measured
    assert u_shape.level == pytest.approx(31.5) and u_shape.noise == pytest.approx(0.3)
    no_rise = tau_gen(STEPS, _u_curve(rise=0.0), se=se)
    assert (u_shape.value, u_shape.lo, u_shape.hi, u_shape.level) == (no_rise.value, no_rise.lo, no_rise.hi,
                                                                      no_rise.level)
    # with noise of the stated se: every seed reads the same bracket of evaluations, and the band stays
    # max(0.05 m, 3 se) however far the curve rises afterwards
    for seed in range(20):
        fid = _u_curve() + 0.3 * np.random.default_rng(seed).standard_normal(STEPS.size)
        est = tau_gen(STEPS, fid, se=se)
        m = smoothed_quality(fid).min()
        assert 7017 < est.value <= 10000 and est.measured
        assert est.level - m == pytest.approx(max(0.05 * m, 0.9))


@pytest.mark.parametrize("slope, expected, censored", [(0.1, 10 ** 5.6, False), (0.2, 10 ** 5.85, True)])
def test_tau_gen_of_a_curve_still_falling_at_its_end_is_never_early(slope, expected, censored):
    """After 1e4 the FID keeps falling by ``slope`` x 30 per decade to the last step 1e6: the band is 5% of the final
    level, so tau_gen is where the slow fall enters it (or a lower bound there), never at the knee 1e4 where the curve
    is still 1 / (1 - 2 slope) = 1.25 or 1.67 times its final level."""
    fid = _fid_curve(1e4) * (1 - slope * np.maximum(0.0, np.log10(STEPS / 1e4)))
    est = tau_gen(STEPS, fid, se=np.full(STEPS.size, 0.1))
    final = 30 * (1 - 2 * slope)
    assert est.level == pytest.approx(1.05 * final)
    # 30 (1 - slope x) = 1.05 final at x = (1 - 1.05 (1 - 2 slope)) / slope decades after 1e4: 1.6 for slope 0.1,
    # 1.85 for slope 0.2; the curve is linear in log time there, so the interpolation is exact
    assert (1 - 1.05 * (1 - 2 * slope)) / slope == pytest.approx(math.log10(expected) - 4)
    assert est.value == pytest.approx(expected, rel=1e-6) and est.censored == censored and est.value > 3e5
    if censored:  # enters the band between the last two evaluations: fewer than 3 on the plateau, a lower bound
        assert est.lo == est.value and est.hi is None and "still fall" in est.rule


@pytest.mark.parametrize("se, band", [(1.0, "z * se"), (0.2, "rtol * m")])
def test_tau_gen_of_a_noisy_flat_plateau_uses_the_larger_of_rtol_m_and_z_se(se, band):
    """A fall to a flat plateau of 30 at 1e4 with Gaussian noise of the stated se: the band is max(0.05 m, 3 se)
    (3.0 for se 1.0, 0.05 m ~ 1.5 for se 0.2), and tau_gen lies at the plateau's start: in the evaluation bracket
    (7017, 10000] for at least 19 of 20 seeds, never more than one evaluation off (m, the lowest running median, lies
    about 1.5 se below the plateau, and the running median at 1e4 is the larger of two plateau values)."""
    in_bracket = 0
    for seed in range(20):
        fid = _fid_curve(1e4) + se * np.random.default_rng(seed).standard_normal(STEPS.size)
        est = tau_gen(STEPS, fid, se=np.full(STEPS.size, se))
        m = smoothed_quality(fid).min()
        expected = 3 * se if band == "z * se" else 0.05 * m
        assert est.level - m == pytest.approx(expected) and expected == pytest.approx(max(0.05 * m, 3 * se))
        assert est.noise == pytest.approx(se) and 7017 < est.value <= 14251 and est.measured
        in_bracket += est.value <= 10000
    assert in_bracket >= 19


def test_tau_gen_ignores_a_single_lucky_dip_during_the_fall():
    fid = _fid_curve(1e4)
    i = int(np.searchsorted(STEPS, 1e4))
    dipped = fid.copy()
    dipped[i - 3] = 30.0  # at 3455 steps the curve is at 99; one evaluation reads the plateau's value
    se = np.full(STEPS.size, 0.3)
    # the raw curve would enter the band at that dip (between steps 2424 and 3455); the running median of 3 does not
    # (a dip just one evaluation before the plateau would: the evaluation between it and the plateau is then the
    # odd one out of its three and takes their value)
    assert tau_gen(STEPS, dipped, se=se).value == pytest.approx(tau_gen(STEPS, fid, se=se).value)
    assert tau_gen(STEPS, dipped, se=se).value == pytest.approx(1e4 / 10 ** 0.01, rel=1e-6)


STEP_SCAN = ROOT / "results" / "demo_step_scan" / "n00032_w08_s0"  # the FD at every 4th step, 960-1120


def _step_scan() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    evaluations = read_run(STEP_SCAN).evaluations
    return (np.array([e["step"] for e in evaluations], dtype=float), np.array([e["fid"] for e in evaluations]),
            np.array([quality_se(e) for e in evaluations]))


def test_tau_gen_of_the_step_scan_swings_is_stable_and_documented():
    """results/demo_step_scan: FD 0.90-1.58 between neighbouring steps 4 apart, each value +-0.03 (fid_boot_std):
    the whole scan lies on the plateau (the grid run's tau_gen ~ 570), its first value 1.137 a swing above it."""
    steps, fid, se = _step_scan()
    assert (fid.min(), fid.max()) == (pytest.approx(0.901, abs=1e-3), pytest.approx(1.576, abs=1e-3))
    est = tau_gen(steps, fid, se=se)
    # m = the lowest running median (0.931, steps 1040-1044), sigma = median se on the plateau (0.032): band 0.097
    assert smoothed_quality(fid).min() == pytest.approx(0.931, abs=1e-3)
    assert est.noise == pytest.approx(0.032, abs=1e-3) and est.level == pytest.approx(1.028, abs=1e-3)
    # the running median enters the band between 964 (1.049) and 968 (0.987): 965.3, interval [962.2, 983.7]
    assert est.value == pytest.approx(965.3, abs=0.1) and est.measured
    assert est.lo == pytest.approx(962.2, abs=0.1) and est.hi == pytest.approx(983.7, abs=0.1)
    # stable: every other evaluation, the other half, or the scan without its first two steps read the same start
    for part in (slice(0, None, 2), slice(1, None, 2), slice(2, None), slice(0, None, 3)):
        sub = tau_gen(steps[part], fid[part], se=se[part])
        assert steps[part][0] <= sub.value <= 968, part  # measured, or an upper bound at its first evaluation


def test_tau_gen_with_swings_larger_than_the_band_is_read_at_the_end_of_the_fall():
    """A fall (4.4 at step 800 to 1.1 at step 900, linear in log time) onto a plateau that swings as the step scan
    does (its 41 values over their median, repeated), evaluated every 4 steps from 800 to 1120, se 0.03; for each of
    the 41 phases of the swings tau_gen lies between 895 and 985 steps: at the end of the fall, where the running
    median first comes within 3 se of its lowest value, never at the swings' deepest dip (1040 in the scan)."""
    _, scan, _ = _step_scan()
    pattern = scan / np.median(scan)
    steps = np.arange(800, 1121, 4, dtype=float)
    base = np.where(steps < 900, 1.1 * (1 + 3 * np.log10(900 / steps) / np.log10(900 / 800)), 1.1)
    values = [tau_gen(steps, base * np.resize(np.roll(pattern, k), steps.size), se=np.full(steps.size, 0.03)).value
              for k in range(pattern.size)]
    assert 895 <= min(values) and max(values) <= 985
    assert np.median(values) == pytest.approx(918, abs=5)


def test_tau_gen_of_the_committed_n128_run_is_no_longer_read_on_the_fall():
    """results/cpu_digits/n00128_w08_s0: FD 1.10 at step 406 and 0.81 at 700; the neighbour-difference noise (0.090)
    put the band at 1.13 and tau_gen at 396, where the FD was 36% above its minimum. The sampling error (fid_boot_std
    0.014 on the plateau) and 5% of the running median's minimum 0.875 give a band edge of 0.919."""
    records = read_run(ROOT / "results" / "cpu_digits" / "n00128_w08_s0").evaluations
    est = estimate_run(records)["tau_gen"]
    assert est.level == pytest.approx(0.919, abs=1e-3) and est.noise == pytest.approx(0.0142, abs=1e-4)
    assert est.value == pytest.approx(522.4, abs=0.5) and est.measured
    assert est.bracket == (487, 584)  # FD 0.946 -> 0.875: the evaluations it is interpolated between
    assert est.lo == pytest.approx(481.1, abs=0.5) and est.hi == 584
    assert est.level < 1.15 * min(r["fid"] for r in records)  # within 15% of the lowest FD (0.809), not 36%


def test_tau_gen_is_read_from_the_whole_curve_even_after_tau_mem():
    """Copies from 3000 steps on while the FD still falls until 1e4: tau_gen (9772) is reported after tau_mem, not
    capped at it; the window [tau_gen, tau_mem] is then empty."""
    records = [{"step": float(s), "f_mem": 0.3 if s >= 3000 else 0.0, "f_mem_lo": 0.25 if s >= 3000 else 0.0,
                "f_mem_hi": 0.35 if s >= 3000 else 0.0, "fid": float(f), "fid_boot_std": 0.3}
               for s, f in zip(STEPS, _fid_curve(1e4))]
    est = estimate_run(records, mem_levels=())
    assert est["tau_mem"].hi == pytest.approx(STEPS[np.searchsorted(STEPS, 3000)])
    assert est["tau_gen"].value == pytest.approx(1e4 / 10 ** 0.01, rel=1e-6)
    assert est["tau_gen"].lo > est["tau_mem"].hi and est["tau_gen"].measured


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
