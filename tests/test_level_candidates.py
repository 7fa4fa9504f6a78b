"""benchmarks/level_candidates.py, the study of how a level crossing enters the interval (docs/coverage.md, "The
level crossings"): its "adopted" candidate is the coverage study's own fit on the same draws, and its other
candidates are the rule's pieces switched off."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from diffmem.analysis.cellfit import RunBrackets, bracket_variances
from diffmem.analysis.coverage import Setting, level_experiments, run_level_setting
from diffmem.analysis.timescales import tau_mem_level
from scripts import load_benchmark


@pytest.fixture(scope="module")
def candidates():
    return load_benchmark("level_candidates")


def test_the_adopted_candidate_is_the_coverage_study_on_the_same_draws(candidates):
    s = Setting(1.0, 4, 3, 0.05, "paper")
    _, rows = candidates.level_row(s, 60, seed=3)
    study = run_level_setting(s, 60, seed=3)
    assert rows["adopted"] == (study.coverage, pytest.approx(study.width))
    assert rows["plain t"] == (study.coverage_previous, pytest.approx(study.width_previous))


def test_each_crossing_s_step_lies_in_its_interval_and_the_worst_case_only_widens(candidates):
    """On the study's experiments: the step a crossing is interpolated in lies within its interval, and the worst
    case, the one piece that is a pure floor, never narrows the interval it is added to."""
    s = Setting(1.0, 4, 3, 0.05, "paper")
    for xs, crossings, _ in level_experiments(s, 20, 5, candidates.read_with_curvature):
        rows = np.array([(e.value, e.lo, e.hi, *e.bracket, *curved) for e, curved in crossings], dtype=float)
        value = rows[:, 0]
        assert np.all(rows[:, 1] <= rows[:, 3]) and np.all(rows[:, 4] <= rows[:, 2])
        assert np.all(rows[:, 3] <= value * (1 + 1e-12)) and np.all(value <= rows[:, 4] * (1 + 1e-12))
        assert np.all(rows[:, 3] <= rows[:, 5]) and np.all(rows[:, 6] <= rows[:, 4])
        width = {name: b - a for name, (a, b) in candidates.exponent_intervals(xs, rows).items()}
        assert width["step, worst case"] >= width["step alone"] - 1e-12
        assert width["curvature, bias bound"] >= width["curvature"] - 1e-12
        one_signed = width["curvature, one-signed bound"]
        assert width["curvature"] - 1e-12 <= one_signed <= width["curvature, bias bound"] + 1e-12
        assert np.all(rows[:, 3] <= rows[:, 7]) and np.all(rows[:, 8] <= rows[:, 4])
        assert np.all(rows[:, 3] <= rows[:, 9]) and np.all(rows[:, 10] <= rows[:, 4])


def test_the_reader_with_curvature_sees_the_study_s_draws(candidates):
    s = Setting(1.0, 3, 1, 0.15, "suite")
    plain = [e for _, rows, _ in level_experiments(s, 5, seed=2) for e in rows]
    curved = [e for _, rows, _ in level_experiments(s, 5, 2, candidates.read_with_curvature) for e, _ in rows]
    assert [e.to_dict() for e in plain] == [e.to_dict() for e in curved]


def _crossing(steps, f, level):
    lo = np.clip(f - 1e-3, 0, 1).tolist()
    return tau_mem_level(steps.tolist(), f.tolist(), lo, lo, level)


def test_the_curvature_bracket_is_the_value_where_f_is_linear_in_log_time(candidates):
    steps = 1000.0 * 1.5 ** np.arange(8)
    f = 0.02 + 0.03 * np.log(steps / 1000.0)
    crossing = _crossing(steps, f, 0.1)
    assert candidates.curvature_bracket(steps, f, crossing) == pytest.approx((crossing.value, crossing.value))
    assert candidates.pooled_curvature_bracket(steps, f, crossing) == pytest.approx((crossing.value, crossing.value))
    assert crossing.value == pytest.approx(1000.0 * math.exp(0.08 / 0.03))


@pytest.mark.parametrize("ratio", [1.1, 1.5])
def test_the_curvature_bracket_holds_a_power_law_s_crossing_on_its_later_side(candidates, ratio):
    """f = 0.1 (s / tau)^2 is convex in log time: the interpolation crosses early and the truth lies after it,
    inside the bracket, which lies inside the step; a finer grid gives a narrower bracket. The pooled bracket lies on
    the same side and reaches (almost) as far."""
    steps = 1000.0 * ratio ** np.arange(40)
    for tau in (3100.0, 4700.0, 9000.0):
        f = 0.1 * (steps / tau) ** 2
        crossing = _crossing(steps, f, 0.1)
        lo, hi = candidates.curvature_bracket(steps, f, crossing)
        assert crossing.bracket[0] <= lo == pytest.approx(crossing.value) and hi <= crossing.bracket[1]
        assert lo < tau <= hi
        assert math.log(hi / lo) < 0.1 * math.log(ratio) * (1 + 4 * (ratio > 1.2))
        # the pooled reading is an estimate of f'' in the step, not the larger of two: it reaches at least 90 % of
        # the way to the truth (on the 1.1x grid 95-100 %: f'' grows within the step, which first order neglects)
        lo, hi = candidates.pooled_curvature_bracket(steps, f, crossing)
        assert crossing.bracket[0] <= lo == pytest.approx(crossing.value) and hi <= crossing.bracket[1]
        assert math.log(hi / lo) >= 0.9 * math.log(tau / lo)
        assert math.log(hi / lo) < 0.1 * math.log(ratio) * (1 + 4 * (ratio > 1.2))


def test_the_one_signed_bias_is_the_range_over_every_corner_of_the_runs_brackets(candidates):
    """Brute force: the slope's bias is linear in the runs' errors, so its extremes over the box of their brackets
    lie at its corners; every corner is tried."""
    rng = np.random.default_rng(4)
    cell_of = np.array([0, 0, 1, 2, 2, 2])
    value = rng.uniform(3.0, 4.0, cell_of.size)
    lo = value - rng.uniform(0.0, 0.1, cell_of.size)
    hi = value + rng.uniform(0.0, 0.1, cell_of.size)
    hi[3] = lo[3] = value[3]  # a run whose bracket has no width: no error
    runs = RunBrackets(cell_of, value, lo, hi, bracket_variances(10.0 ** lo, 10.0 ** hi))
    slope_row = np.array([-0.6, 0.1, 0.5])
    sums = []
    for corner in itertools.product((0, 1), repeat=cell_of.size):
        error = np.where(np.array(corner) == 1, value - lo, value - hi)
        sums.append(slope_row @ (np.bincount(cell_of, weights=error) / np.bincount(cell_of)))
    assert candidates.one_signed_bias(slope_row, runs, 3) == pytest.approx((min(sums), max(sums)))


def test_the_exact_error_diagnosis_reads_the_study_s_draws_and_shifts_by_the_planted_curve_s_own_error(candidates):
    """``--exact-error``: the same experiments as the study; the pooled slot's bracket runs from the crossing to the
    crossing times tau / (the crossing read from the noise-free planted curve on the same steps)."""
    from diffmem.analysis.coverage import measured_crossing, planted_f_mem_curve

    seen = []

    def reader(rng, steps, tau):
        out = candidates.read_with_exact_error(rng, steps, tau)
        if out is not None:
            exact = planted_f_mem_curve(steps, tau)
            seen.append((out, tau / measured_crossing(steps, exact, exact, exact).value))
        return out

    s = Setting(1.0, 3, 1, 0.15, "paper")
    plain = [e for _, rows, _ in level_experiments(s, 5, seed=2) for e in rows]
    read = [e for _, rows, _ in level_experiments(s, 5, 2, reader) for e, _ in rows]
    assert [e.to_dict() for e in plain] == [e.to_dict() for e in read]
    for (est, ends), shift in seen[-len(read):]:
        lo, hi = ends[2:4]
        assert lo <= hi and est.value in (pytest.approx(lo), pytest.approx(hi))
        assert hi / lo == pytest.approx(max(shift, 1 / shift))


def test_the_pooled_reading_holds_where_the_triples_agree_within_their_noise_and_gives_the_step_elsewhere(candidates):
    """A curve linear in log time: both triples read no curvature, the bracket is the crossing itself. A power law
    known almost exactly on 3x steps: its curvature grows ninefold from one triple to the next, so the first-order
    reading does not hold and the bracket is the whole step. The same law on a 1.1x grid with intervals of +-0.01:
    the triples' difference is within their noise, and the bracket is the pooled one."""
    steps = 1000.0 * 1.5 ** np.arange(12)
    f = 0.02 + 0.03 * np.log(steps / 1000.0)
    crossing = _crossing(steps, f, 0.1)
    assert candidates.pooled_where_it_holds(steps, f, f - 1e-3, f + 1e-3, crossing) == pytest.approx(
        (crossing.value, crossing.value))
    for ratio, half, expect_step in ((3.0, 1e-6, True), (1.1, 1e-2, False)):
        steps = 1000.0 * ratio ** np.arange(40 if ratio < 2 else 8)
        f = 0.1 * (steps / 4700.0) ** 2
        crossing = _crossing(steps, f, 0.1)
        got = candidates.pooled_where_it_holds(steps, f, f - half, f + half, crossing)
        if expect_step:
            assert got == crossing.bracket
        else:
            assert got == candidates.pooled_curvature_bracket(steps, f, crossing) != crossing.bracket
