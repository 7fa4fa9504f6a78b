"""benchmarks/width_where_brackets_set.py: the coverage study's draws in the rows above issue #39's width target,
fitted by the analysis's own fits and split by whether the brackets set the interval (docs/coverage.md)."""
from __future__ import annotations

import numpy as np
import pytest

from diffmem.analysis.coverage import JointSetting, Setting, run_joint_setting, run_level_setting
from scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("width_where_brackets_set")


def test_the_level_draws_are_the_level_study_s_fits(bench):
    s = Setting(1.0, 4, 3, 0.05, "suite")
    draws = bench.level_draws(s, 40, seed=3)
    study = run_level_setting(s, 40, seed=3)
    assert len(draws) == 40
    assert float(np.median([d.width for d in draws])) == pytest.approx(study.width)
    assert float(np.median([d.plain_width for d in draws])) == pytest.approx(study.width_previous)
    assert np.mean([d.covered for d in draws]) == pytest.approx(study.coverage)
    assert np.mean([d.plain_covered for d in draws]) == pytest.approx(study.coverage_previous)


def test_the_joint_draws_are_the_joint_study_s_fits(bench):
    s = JointSetting((1.0, -1.0), "cross", 1, 0.05, "suite")
    draws = bench.joint_draws(s, 1, 40, seed=3)
    study = run_joint_setting(s, 40, seed=3)
    assert float(np.median([d.width for d in draws])) == pytest.approx(study.width[1])
    assert float(np.median([d.plain_width for d in draws])) == pytest.approx(study.width_previous[1])
    assert np.mean([d.covered for d in draws]) == pytest.approx(study.coverage[1])
    assert np.mean([d.plain_covered for d in draws]) == pytest.approx(study.coverage_previous[1])


def test_the_line_splits_the_draws_by_the_flag(bench):
    Draw = bench.Draw
    draws = [Draw(True, 2.0, 1.0, True, False), Draw(True, 4.0, 1.0, True, True), Draw(False, 1.0, 1.0, False, False),
             Draw(True, 3.0, 1.0, True, False)]
    text = bench.line("x", draws)
    assert text == ("x: set by the brackets in 75.0 % of 4 draws; median width against the plain t's 2.50x (set by "
                    "the brackets 3.00x, otherwise 1.00x); coverage, the fit's / the plain t's: set by the brackets "
                    "100.0 % / 33.3 %, otherwise 0.0 % / 0.0 %")
    alone = bench.line("y", [Draw(False, 1.0, 2.0, True, True)])
    assert alone.endswith("(set by the brackets -, otherwise 0.50x); coverage, the fit's / the plain t's: set by the "
                          "brackets -, otherwise 100.0 % / 100.0 %")
