"""Which images are fitted first, without a copy rule (diffmem.analysis.fit_order): the z-scores against the control
block and their leave-one-out null against a brute-force reference, the stays-fitted rule, planted fit steps read
back in their brackets, and the analysis of a real tiny run."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diffmem.analysis.fit_order import FIT_Z, fit_order, scores, stays_fitted, z_scores


@pytest.mark.unit
def test_z_scores_and_the_leave_one_out_control_equal_a_brute_force_reference():
    rng = np.random.default_rng(0)
    train, control = rng.random((3, 5)) + 0.5, rng.random((3, 7)) + 0.5
    z_train, z_control = z_scores(train, control)
    s_train, s_control = scores(train, control)
    scale = control.mean(axis=1, keepdims=True)
    assert np.allclose(s_train, (train / scale).mean(0)) and np.allclose(s_control, (control / scale).mean(0))
    assert np.allclose(z_train, (s_train - s_control.mean()) / s_control.std(ddof=1))
    for j in range(7):
        others = np.delete(s_control, j)
        assert z_control[j] == pytest.approx((s_control[j] - others.mean()) / others.std(ddof=1), rel=1e-9)


@pytest.mark.unit
def test_an_image_is_fitted_from_the_first_evaluation_it_stays_fitted():
    steps = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    fitted = np.array([[0, 1, 0, 0], [0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=bool)
    step, lo = stays_fitted(steps, fitted)
    assert step[:3].tolist() == [4.0, 1.0, 8.0] and math.isinf(step[3])  # image 2's early excursion does not count
    assert lo[0] == 2.0 and math.isnan(lo[1]) and lo[2] == 4.0


def planted_lines(fit_at, steps, n_control=40, seed=0):
    """Per evaluation the losses of training images that drop 30 % below the control's level from fit_at[i] on,
    with 2 % noise per image, and of control images at the level."""
    rng = np.random.default_rng(seed)
    lines = []
    for s in steps:
        level = np.array([[1.0], [0.5]])  # two noise levels
        train = level * (1 + 0.02 * rng.standard_normal((2, len(fit_at))))
        train = train * np.where(np.array(fit_at) <= s, 0.7, 1.0)
        control = level * (1 + 0.02 * rng.standard_normal((2, n_control)))
        lines.append({"step": int(s), "train": train, "control": control})
    return lines


@pytest.mark.unit
def test_planted_fit_steps_are_read_back_in_their_brackets_and_the_control_stays_unfitted():
    steps = np.unique(np.round(np.geomspace(1, 10_000, 30))).astype(int)
    fit_at = [5, 50, 500, 5000, math.inf, math.inf]
    order = fit_order(planted_lines(fit_at, steps))
    for i, planted in enumerate(fit_at):
        if math.isinf(planted):
            assert math.isinf(order.step[i])
            continue
        # the first evaluation at or after the planted step; a chance z <= -2 at the evaluation just before it (about
        # 2.3 % for each image) moves the fit step one evaluation earlier, which the rule cannot tell apart
        first = int(np.flatnonzero(steps >= planted)[0])
        assert order.step[i] in (steps[first], steps[first - 1])
    assert order.fitted == 4 and order.fitted_share[-1] == pytest.approx(4 / 6)
    assert order.control_rate[-1] <= 0.05  # 2 % noise: a control image is never 2 sd below the others for long
    assert FIT_Z == 2.0


@pytest.mark.unit
def test_without_a_control_block_there_is_no_fit_order():
    lines = [{"step": 1, "train": np.ones((1, 4)), "control": np.ones((1, 0))}]
    assert fit_order(lines) is None and fit_order([]) is None


@pytest.mark.e2e
def test_analyze_writes_the_fit_order_of_a_real_run(tmp_path):
    from diffmem.analysis import analyze
    from diffmem.analysis.runfiles import read_csv
    from diffmem.train import train
    from tiny_runs import SMOKE, tiny_config

    for seed in (0, 1):
        cfg = tiny_config("data.n=8", "eval.times=3", "eval.fid=false", "train.num_threads=1", "eval.loss_n_test=12",
                          f"train.seed={seed}", base=SMOKE)
        train(cfg, tmp_path / f"n00008_w04_s{seed}", progress=False)
    analyze(tmp_path)
    section = json.loads((tmp_path / "fits.json").read_text())["fit_order"]
    assert set(section["runs"]) == {"n00008_w04_s0", "n00008_w04_s1"} and section["z"] == FIT_Z
    (cell,) = section["cells"]
    assert sorted(cell["runs"]) == sorted(section["runs"]) and "family-wise" in section["interval_note"]
    rows = read_csv(tmp_path / "images" / "n00008_w04_s0_fit.csv")
    assert [r["index"] for r in rows] == list(range(8))
    manifest = json.loads((tmp_path / "n00008_w04_s0" / "images.json").read_text())
    assert [r["source_index"] for r in rows] == manifest["train"]
    from diffmem.analysis.report import report_text
    assert "## Which images are fitted first" in report_text(tmp_path)
    summary = read_csv(tmp_path / "summary.csv")
    assert all(0 <= r["fitted_share_final"] <= 1 and 0 <= r["fit_control_rate_final"] <= 1 for r in summary)
