"""benchmarks/level_candidates.py, the study of how a level crossing enters the interval (docs/coverage.md, "The
level crossings"): its "adopted" candidate is the coverage study's own fit on the same draws, and its other
candidates are the rule's pieces switched off."""
from __future__ import annotations

import numpy as np
import pytest

from diffmem.analysis.coverage import Setting, level_experiments, run_level_setting
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
    for xs, crossings, _ in level_experiments(s, 20, seed=5):
        rows = np.array([(e.value, e.lo, e.hi, *e.bracket) for e in crossings], dtype=float)
        value = rows[:, 0]
        assert np.all(rows[:, 1] <= rows[:, 3]) and np.all(rows[:, 4] <= rows[:, 2])
        assert np.all(rows[:, 3] <= value * (1 + 1e-12)) and np.all(value <= rows[:, 4] * (1 + 1e-12))
        width = {name: b - a for name, (a, b) in candidates.exponent_intervals(xs, rows).items()}
        assert width["step, worst case"] >= width["step alone"] - 1e-12
