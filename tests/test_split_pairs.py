"""Split pairs (docs/split-pairs.md): the paired measures on planted generators with known answers and against a
brute-force nearest-neighbour reference, tau_bias on planted curves, the split grid, and the real CLI end to end
(sweep with two splits -> `diffmem pairs` -> kill and rerun -> `diffmem analyze`)."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from diffmem.analysis.powerlaw import load_fits
from diffmem.analysis.runfiles import read_csv, read_pairs
from diffmem.analysis.timescales import TimescaleInputError, tau_bias, tau_bias_level, tau_mem_level
from diffmem.cli import main
from diffmem.config import SweepConfig
from diffmem.data import load_images, make_splits
from diffmem.device import resolve_device
from diffmem.experiment import expand_grid
from diffmem.io import read_jsonl
from diffmem.metrics.pairs import DISTANCE_FLOOR, own_and_other_distances, paired_measures
from diffmem.paired_evaluation import PairEvaluator, evaluate_pairs
from diffmem.split_pairs import SplitPair, find_pairs
from diffmem.refine import next_bias_refinement
from diffmem.rundir import PAIRS_FILE, RunDir
from tiny_runs import TINY_GRID, sets, tiny_config

pytestmark = pytest.mark.xdist_group("split_pairs")
"""One worker runs this module, so that each module-scoped fixture (a tiny sweep trained on disk) is built once
rather than once per worker (pytest-xdist, ``--dist loadgroup`` in pyproject.toml)."""

D = 64  # dimensions of the planted population N(0, I_D)
N_TRAIN = 200  # images per planted train set
N_DRAWS = 400  # paired draws


def population(n: int, seed: int) -> torch.Tensor:
    """n images (n, 1, 8, 8) of the planted population, standard Gaussian pixels."""
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def typical_distance() -> float:
    """E ||x - y|| for x, y independent N(0, I_D): x - y ~ N(0, 2 I_D), so sqrt(2) times the chi(D) mean."""
    return math.sqrt(2.0) * stats.chi.mean(D)


TRAIN_A, TRAIN_B = population(N_TRAIN, 1), population(N_TRAIN, 2)


# --- the measures, planted --------------------------------------------------------------------------------------------

def test_a_generator_that_returns_its_own_images_is_biased_and_far_from_its_twin():
    """Each model returns slightly perturbed images of its own train set (draw i: image i of each set)."""
    pick = torch.arange(N_DRAWS) % N_TRAIN
    noise = 0.01 * population(N_DRAWS, 3)
    m = paired_measures(TRAIN_A[pick] + noise, TRAIN_B[pick] + noise, TRAIN_A, TRAIN_B, n_boot=500, seed=0)
    # d_own = ||noise|| ~ 0.01 sqrt(D) = 0.08; d_other ~ the nearest of 200 population images, several units
    assert m.bias_lo > math.log(20) and m.own_fraction == m.own_fraction_lo == 1.0
    # the pair's images are two unrelated population images: their distance is the population's typical one
    assert m.pair_distance == pytest.approx(typical_distance(), rel=0.05)
    assert m.pair_distance_lo > 0.9 * typical_distance()


def test_two_generators_drawing_from_the_held_out_population_have_no_bias():
    a, b = population(N_DRAWS, 4), population(N_DRAWS, 5)
    m = paired_measures(a, b, TRAIN_A, TRAIN_B, n_boot=1000, seed=0)
    assert m.bias_lo < 0.0 < m.bias_hi
    assert m.own_fraction_lo < 0.5 < m.own_fraction_hi
    assert m.pair_distance_lo < typical_distance() < m.pair_distance_hi
    assert m.pair_distance == pytest.approx(typical_distance(), rel=0.05)


def test_two_identical_generators_have_pair_distance_zero_and_no_bias():
    a = population(N_DRAWS, 6)
    m = paired_measures(a, a.clone(), TRAIN_A, TRAIN_B, n_boot=200, seed=0)
    assert m.pair_distance == m.pair_distance_lo == m.pair_distance_hi == 0.0
    # sample i of both models is one image: its two log ratios cancel exactly
    assert np.abs(m.biases).max() < 1e-12 and m.own.tolist() == [0.5] * N_DRAWS


def test_distances_and_measures_equal_a_brute_force_reference():
    a = population(50, 7) * 0.7 + TRAIN_A[:50] * 0.5  # samples between the population and train set A
    b = population(50, 8)
    own, other = own_and_other_distances(a, TRAIN_A, TRAIN_B)
    brute_own = torch.cdist(a.reshape(50, -1), TRAIN_A.reshape(N_TRAIN, -1)).min(1).values
    brute_other = torch.cdist(a.reshape(50, -1), TRAIN_B.reshape(N_TRAIN, -1)).min(1).values
    assert torch.allclose(own, brute_own, rtol=1e-10, atol=1e-12)
    assert torch.allclose(other, brute_other, rtol=1e-10, atol=1e-12)
    m = paired_measures(a, b, TRAIN_A, TRAIN_B, n_boot=100, seed=0)
    own_b = torch.cdist(b.reshape(50, -1), TRAIN_B.reshape(N_TRAIN, -1)).min(1).values
    other_b = torch.cdist(b.reshape(50, -1), TRAIN_A.reshape(N_TRAIN, -1)).min(1).values
    bias = 0.5 * (torch.log(brute_other / brute_own) + torch.log(other_b / own_b))
    own_frac = 0.5 * ((brute_own < brute_other).double() + (own_b < other_b).double())
    assert m.bias == pytest.approx(float(bias.mean()), rel=1e-9)
    assert m.own_fraction == pytest.approx(float(own_frac.mean()))
    assert m.pair_distance == pytest.approx(float((a - b).reshape(50, -1).norm(dim=1).mean()), rel=1e-12)
    assert 0 < m.bias_lo <= m.bias <= m.bias_hi  # a's samples lean toward set A (b's have no preference)


CONTROL = population(N_TRAIN, 9)  # a third block of the same population, trained on by neither model


def test_the_control_bias_reads_zero_for_copying_models_when_the_blocks_are_exchangeable():
    """Models that copy their own train sets are strongly biased, but the control bias (the other train set against
    a block neither model saw) stays at 0: it measures the blocks, not the models."""
    pick = torch.arange(N_DRAWS) % N_TRAIN
    noise = 0.01 * population(N_DRAWS, 3)
    m = paired_measures(TRAIN_A[pick] + noise, TRAIN_B[pick] + noise, TRAIN_A, TRAIN_B, n_boot=1000, seed=0,
                        control=CONTROL)
    assert m.bias_lo > math.log(20)
    assert m.control_bias_lo < 0.0 < m.control_bias_hi and abs(m.control_bias) < 0.05
    assert {"control_bias", "control_bias_lo", "control_bias_hi"} <= set(m.to_dict())


def test_the_control_bias_leaves_zero_when_the_control_block_comes_from_elsewhere():
    """Generators of the population, with a control block drawn from a shifted population (a clustered ordering):
    the control bias is off 0 while the bias itself reads 0."""
    a, b = population(N_DRAWS, 4), population(N_DRAWS, 5)
    m = paired_measures(a, b, TRAIN_A, TRAIN_B, n_boot=1000, seed=0, control=CONTROL + 0.5)
    assert m.bias_lo < 0.0 < m.bias_hi
    assert m.control_bias_hi < 0.0  # the samples are farther from the shifted control than from the other train set
    assert "control_bias" not in paired_measures(a, b, TRAIN_A, TRAIN_B, n_boot=10, seed=0).to_dict()


def test_the_control_bias_equals_a_brute_force_reference():
    a, b = population(50, 7) * 0.7 + TRAIN_A[:50] * 0.5, population(50, 8)
    m = paired_measures(a, b, TRAIN_A, TRAIN_B, n_boot=100, seed=0, control=CONTROL)
    flat = lambda x: x.reshape(len(x), -1)  # noqa: E731
    nearest = lambda x, t: torch.cdist(flat(x), flat(t)).min(1).values  # noqa: E731
    expected = 0.5 * (torch.log(nearest(a, TRAIN_B) / nearest(a, CONTROL))
                      + torch.log(nearest(b, TRAIN_A) / nearest(b, CONTROL)))
    assert m.control_bias == pytest.approx(float(expected.mean()), rel=1e-9)


def test_an_exact_copy_gives_a_large_finite_bias():
    m = paired_measures(TRAIN_A[:4].clone(), TRAIN_B[:4].clone(), TRAIN_A, TRAIN_B, n_boot=10, seed=0)
    assert math.isfinite(m.bias) and m.bias > -math.log(DISTANCE_FLOOR)


# --- tau_bias on planted curves ---------------------------------------------------------------------------------------

STEPS = [1, 2, 4, 8, 16, 32]


def test_tau_bias_is_where_the_interval_stays_above_zero():
    # a chance exit at step 2 does not count: the bias is established from step 8 on
    est = tau_bias(STEPS, [-0.2, 0.01, -0.1, 0.05, 0.2, 0.4])
    assert not est.censored and (est.lo, est.hi) == (4.0, 8.0) and est.value == pytest.approx(math.sqrt(32))


def test_tau_bias_censored_and_missing():
    never = tau_bias(STEPS, [-0.2, 0.1, 0.2, 0.3, 0.1, -0.01])  # not established at the last evaluation
    assert never.censored and never.value == never.lo == 32.0 and never.hi is None
    always = tau_bias(STEPS, [0.1] * 6)
    assert always.censored and always.value == always.hi == 1.0 and always.lo is None
    gaps = tau_bias(STEPS, [-0.1, None, -0.1, None, 0.2, 0.3])  # unrecorded evaluations are left out
    assert (gaps.lo, gaps.hi) == (4.0, 16.0)
    assert tau_bias(STEPS, [None] * 6).value is None


def test_tau_bias_at_a_level_is_the_crossing_of_the_bias_with_the_interval_of_its_bounds():
    """Planted bias rising 0.02 -> 0.32 over the grid, interval +-0.02: the 0.05 crossing is the log-time
    interpolation between 4 and 8, its interval runs from the last evaluation before bias_hi reaches 0.05 (step 2:
    bias_hi(4) = 0.06) to the first with bias_lo >= 0.05 (step 8)."""
    bias = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32]
    est = tau_bias_level(STEPS, bias, [b - 0.02 for b in bias], [b + 0.02 for b in bias], 0.05)
    u = (0.05 - 0.04) / (0.08 - 0.04)
    assert not est.censored and est.value == pytest.approx(4 * 2 ** u)
    assert (est.lo, est.hi) == (2.0, 8.0)
    # the same rule as f_mem's level crossing, on the same numbers
    mem = tau_mem_level(STEPS, bias, [b - 0.02 for b in bias], [b + 0.02 for b in bias], 0.05)
    assert (mem.value, mem.lo, mem.hi, mem.censored) == (est.value, est.lo, est.hi, est.censored)


def test_tau_bias_at_a_level_censored_missing_and_refused():
    flat = [0.01] * 6
    never = tau_bias_level(STEPS, flat, [0.0] * 6, [0.02] * 6, 0.05)
    assert never.censored and never.value == never.lo == 32.0 and never.hi is None
    high = [0.5] * 6
    already = tau_bias_level(STEPS, high, [0.4] * 6, [0.6] * 6, 0.05)
    assert already.censored and already.value == already.hi == 1.0 and already.lo is None
    reached = tau_bias_level(STEPS, [0.0, 0.0, 0.0, 0.0, 0.0, 0.06], [-0.1] * 6, [0.1] * 6, 0.05)
    assert reached.censored and reached.hi is None  # reached but never established: a lower bound
    gaps = tau_bias_level(STEPS, [0.0, None, 0.0, 0.1, 0.2, 0.3], [-0.01, None, -0.01, 0.09, 0.19, 0.29],
                          [0.01, None, 0.01, 0.11, 0.21, 0.31], 0.05)
    assert (gaps.lo, gaps.hi) == (4.0, 8.0)
    assert tau_bias_level(STEPS, [None] * 6, [None] * 6, [None] * 6, 0.05).value is None
    with pytest.raises(TimescaleInputError, match="must be > 0"):
        tau_bias_level(STEPS, flat, flat, flat, 0.0)


def refine_on_planted_bias(steps: list[int], onset: float, checkpoints: list[int], ratio: float) -> list[int]:
    """Run next_bias_refinement to its end on a pair whose bias is established exactly from ``onset`` on (bias_lo
    +0.1 there, -0.1 before); returns every step evaluated, the grid's first."""
    done = list(steps)
    while (step := next_bias_refinement(done, [0.1 if s >= onset else -0.1 for s in done], checkpoints,
                                        ratio)) is not None:
        assert step not in done and step in checkpoints
        done.append(step)
    return done


@pytest.mark.parametrize("onset", [3, 9, 9.5, 23, 31])
def test_bias_refinement_bisects_the_bracket_down_to_the_ratio_around_the_planted_onset(onset):
    """Grid 1..32 (factor 2), checkpoints at every step: the bracket ends at most 1.25 wide, or with no checkpoint
    left inside, and holds the onset; each evaluation is the one nearest the bracket's log-midpoint."""
    checkpoints = list(range(1, 33))
    done = refine_on_planted_bias(STEPS, onset, checkpoints, 1.25)
    final = sorted(done)
    est = tau_bias(final, [0.1 if s >= onset else -0.1 for s in final])
    assert est.lo < onset <= est.hi
    assert est.hi / est.lo <= 1.25 or not [c for c in checkpoints if est.lo < c < est.hi]
    refined = done[len(STEPS):]
    assert refined and len(refined) <= 4  # bisection in log time, not a scan
    lo, hi = 1.0, 32.0
    for step in refined:  # each pick halves the bracket of the steps before it
        before = sorted(d for d in done if d != step and done.index(d) < done.index(step))
        b = tau_bias(before, [0.1 if s >= onset else -0.1 for s in before])
        lo, hi = b.lo, b.hi
        inside = [c for c in checkpoints if lo < c < hi and c not in before]
        assert step == min(inside, key=lambda c: abs(math.log(c / math.sqrt(lo * hi))))


def test_bias_refinement_leaves_censored_resolved_and_unrefined_pairs_alone():
    every = list(range(1, 33))
    never = [-0.1] * 6
    assert next_bias_refinement(STEPS, never, every, 1.25) is None  # censored: a lower bound, no bracket
    assert next_bias_refinement(STEPS, [0.1] * 6, every, 1.25) is None  # established from the first evaluation
    assert next_bias_refinement(STEPS, [-0.1, -0.1, -0.1, 0.1, 0.1, 0.1], every, 0.0) is None  # refine_ratio 0
    assert next_bias_refinement(STEPS, [-0.1, -0.1, -0.1, 0.1, 0.1, 0.1], every, 2.0) is None  # 4 -> 8: resolved
    assert next_bias_refinement(STEPS, [-0.1, -0.1, -0.1, 0.1, 0.1, 0.1], STEPS, 1.25) is None  # nothing kept inside
    assert next_bias_refinement([], [], every, 1.25) is None
    assert next_bias_refinement(STEPS[::-1], [0.1, 0.1, 0.1, -0.1, -0.1, -0.1], every, 1.25) in (5, 6)  # any order


# --- the split grid ---------------------------------------------------------------------------------------------------

def test_split_i_trains_on_block_i_and_split_0_keeps_its_name(tmp_path):
    base = tiny_config(base=TINY_GRID)
    runs = expand_grid(base, SweepConfig(n=[8, 16], width=[8], seeds=[0], splits=[0, 1]), tmp_path)
    assert [(r.name, r.cfg.data.subset_index, r.split) for r in runs] == [
        ("n00008_w08_s0", 0, 0), ("n00008_w08_s0_split1", 1, 1),
        ("n00016_w08_s0", 0, 0), ("n00016_w08_s0_split1", 1, 1)]
    plain = expand_grid(base, SweepConfig(n=[8], width=[8], seeds=[0]), tmp_path)
    assert [(r.name, r.cfg.data.subset_index) for r in plain] == [("n00008_w08_s0", 0)]
    # the held-out pool is the end of the ordering: both blocks lie before it and do not overlap
    images = load_images(base.data)
    a, b = (make_splits(images, r.cfg.data) for r in runs[2:])
    assert a.train_range == (0, 16) and b.train_range == (16, 32) and a.heldout_range[0] >= 32


# --- end to end through the CLI ---------------------------------------------------------------------------------------

GRID = TINY_GRID + ["sweep.n=[4, 8]", "sweep.width=[8]", "sweep.splits=[0, 1]", "eval.times=3",
                    "eval.n_samples=16", "eval.n_boot=50"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny sweep of two N, each a split pair (4 runs of 20 steps, 3 evaluations each)."""
    exp = tmp_path_factory.mktemp("pairs") / "exp"
    config = exp.parent / "grid.toml"
    config.write_text("")
    assert main(["sweep", str(config), "--cluster", "debug", "--out", str(exp), "--no-progress", *sets(GRID)]) == 0
    return exp


def keys(path: Path) -> list[tuple[str, str, int]]:
    return [(r["run_a"], r["run_b"], r["step"]) for r in read_jsonl(path)]


@pytest.mark.e2e
def test_pairs_then_kill_and_rerun_then_analyze(trained, tmp_path, capsys):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    assert main(["pairs", str(exp), "--device", "cpu"]) == 0
    path = exp / PAIRS_FILE
    first = read_jsonl(path)
    steps = RunDir(exp / "n00004_w08_s0").checkpoint_steps()
    expected = [(f"n0000{n}_w08_s0", f"n0000{n}_w08_s0_split1", s) for n in (4, 8) for s in steps]
    assert keys(path) == expected and len(steps) == 3
    for line in first:
        assert line["n_samples"] == 16 and line["pair"] == line["run_a"]
        assert line["f_mem_a"] is not None and line["f_mem_b"] is not None
        for name in ("pair_distance", "bias", "own_fraction"):
            assert line[f"{name}_lo"] <= line[f"{name}_hi"]
        assert line["pair_distance"] > 0  # two models on different images do not agree exactly
    # a rerun has nothing to do
    assert main(["pairs", str(exp)]) == 0
    assert keys(path) == expected
    # a kill while appending: the last line gone and the one before cut short
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(text[:-2]) + text[-2][:25])
    capsys.readouterr()
    assert main(["pairs", str(exp)]) == 0
    assert "skipping a truncated last line" in capsys.readouterr().err
    assert keys(path) == expected
    timing = {"wall_s"}
    again = read_jsonl(path)
    assert [{k: v for k, v in r.items() if k not in timing} for r in again] == \
        [{k: v for k, v in r.items() if k not in timing} for r in first]  # same noise, same numbers
    capsys.readouterr()
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "pair n00004_w08_s0" in out and "pair n00008_w08_s0" in out
    rows = {r["run"]: r for r in read_csv(exp / "summary.csv")}
    assert rows["n00008_w08_s0"]["pair"] == rows["n00008_w08_s0_split1"]["pair"] == "n00008_w08_s0"
    lines = read_pairs(exp)["n00008_w08_s0"]
    est = tau_bias([r["step"] for r in lines], [r["bias_lo"] for r in lines])
    assert rows["n00008_w08_s0"]["tau_bias"] == pytest.approx(est.value)
    assert rows["n00008_w08_s0"]["tau_bias_censored"] == est.censored and rows["n00008_w08_s0"]["pair_evals"] == 3
    fits = json.loads((exp / "fits.json").read_text())
    assert {"tau_bias_vs_n", "tau_bias_vs_width", "tau_bias_vs_n_and_width"} <= set(fits)
    assert "tau_bias" in fits["censored_runs"]
    law = fits["tau_bias_vs_n"]  # one entry per pair (not per run), whether measured, a bound or left out
    listed = [p["run"] for p in law["points"] + law["censored"] + law["excluded"]]
    assert sorted(listed) == ["n00004_w08_s0", "n00008_w08_s0"]
    assert set(load_fits(exp)) >= {"tau_bias_vs_n", "tau_bias_vs_width"}
    # the figures and the report page of real pairs (docs/split-pairs.md: the figures and the report page)
    from diffmem.analysis.report import report_text
    from diffmem.figures import make_figures
    from diffmem.figures.checks import figure_problems

    figures = {r.name: r for r in make_figures(exp, pdf=False)}
    assert figures["pairs"].skipped is None
    for name in ("pairs", "window_w08"):
        assert figure_problems(figures[name].figure, name=name, expect_intervals=True) == []
    assert "## Split pairs" in report_text(exp) and "| n00008_w08_s0 | 8 | 8 | 0 |" in report_text(exp)


@pytest.fixture(scope="module")
def trained_kept(tmp_path_factory) -> Path:
    """One split pair (N = 4, 40 steps, 3 evaluations) that keeps weights 1.2x apart and asks for brackets refined
    to 1.25 (eval.checkpoint_ratio, eval.refine_ratio)."""
    exp = tmp_path_factory.mktemp("pairs_kept") / "exp"
    config = exp.parent / "grid.toml"
    config.write_text("")
    grid = GRID + ["sweep.n=[4]", "train.steps=40", "eval.checkpoint_ratio=1.2", "eval.refine_ratio=1.25"]
    assert main(["sweep", str(config), "--cluster", "debug", "--out", str(exp), "--no-progress", *sets(grid)]) == 0
    return exp


@pytest.mark.e2e
def test_pairs_refines_tau_bias_between_kept_checkpoints_and_a_rerun_adds_nothing(trained_kept, tmp_path,
                                                                                   monkeypatch, capsys):
    """The real runs and samplers, with the bias's interval planted to be established from step 9 on: `diffmem
    pairs` evaluates the grid, then kept checkpoints inside tau_bias's bracket until it is at most 1.25 wide (or
    holds no checkpoint); a rerun appends nothing; --no-refine evaluates the grid only."""
    onset = 9
    real_measure = PairEvaluator.measure

    def planted(self, step, n_samples):
        line = real_measure(self, step, n_samples)
        line["bias_lo"] = 0.1 if step >= onset else -0.1
        return line

    monkeypatch.setattr(PairEvaluator, "measure", planted)
    exp = tmp_path / "exp"
    shutil.copytree(trained_kept, exp)
    (pair,) = find_pairs(exp)
    grid, kept = pair.common_steps(), pair.kept_steps()
    assert len(grid) == 3 and len(kept) > 10 and pair.refine_ratio() == 1.25
    assert main(["pairs", str(exp), "--device", "cpu"]) == 0
    assert "refining tau_bias's bracket" in capsys.readouterr().out
    steps = [r["step"] for r in read_jsonl(exp / PAIRS_FILE)]
    assert steps[:3] == grid and len(steps) > 3 and set(steps[3:]) <= set(kept) - set(grid)
    final = sorted(steps)
    est = tau_bias(final, [0.1 if s >= onset else -0.1 for s in final])
    assert est.lo < onset <= est.hi
    assert est.hi / est.lo <= 1.25 or not [k for k in kept if est.lo < k < est.hi]
    assert evaluate_pairs(exp, device="cpu", log=lambda _: None) == 0  # a rerun: nothing left
    capsys.readouterr()
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    row = {r["run"]: r for r in read_csv(exp / "summary.csv")}[pair.name]
    assert (row["tau_bias_lo"], row["tau_bias_hi"]) == (est.lo, est.hi) and row["pair_evals"] == len(steps)

    plain = tmp_path / "plain"
    shutil.copytree(trained_kept, plain)
    assert main(["pairs", str(plain), "--device", "cpu", "--no-refine"]) == 0
    assert [r["step"] for r in read_jsonl(plain / PAIRS_FILE)] == grid


@pytest.mark.e2e
def test_one_model_paired_with_itself_gives_pair_distance_zero(trained):
    """Both members sampled from the same noise: the same model twice gives the same samples."""
    (pair, _) = find_pairs(trained)
    twin = SplitPair(pair.name, pair.a, pair.a, pair.cfg_a, pair.cfg_a, pair.steps_a, pair.steps_a)
    line = PairEvaluator(twin, resolve_device("cpu")).measure(pair.common_steps()[-1], 16)
    assert line["pair_distance"] == line["pair_distance_hi"] == 0.0
    assert abs(line["bias"]) < 1e-12


@pytest.mark.e2e
@pytest.mark.slow  # two fresh interpreters (torch imports): 40 s on the loaded 2-core machine
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_sigkill_during_pairs_loses_and_duplicates_nothing(trained, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    path = exp / PAIRS_FILE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "diffmem.cli", "pairs", str(exp), "--device", "cpu"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(read_jsonl(path)) < 2:
        time.sleep(0.01)
    assert proc.poll() is None, "pairs ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 2 <= len(read_jsonl(path)) < 6 and (exp / "pairs.lock").exists()  # the rerun takes the dead one's lock
    done = subprocess.run([sys.executable, "-m", "diffmem.cli", "pairs", str(exp), "--device", "cpu"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = keys(path)
    assert len(got) == len(set(got)) == 6 and not (exp / "pairs.lock").exists()


@pytest.mark.e2e
def test_pairs_refuses_a_run_whose_data_are_not_those_found(trained, tmp_path, capsys):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    config = exp / "n00004_w08_s0_split1" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dataset_sha256": "0" * 64}))
    assert main(["pairs", str(exp), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n00004_w08_s0_split1: the data found" in err[0], err
    assert all(line["pair"] != "n00004_w08_s0" for line in (read_jsonl(exp / PAIRS_FILE)
                                                             if (exp / PAIRS_FILE).exists() else []))


@pytest.mark.e2e
def test_an_experiment_without_split_pairs_is_one_line_and_nothing_written(trained, tmp_path, capsys):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("*_split1"))
    assert main(["pairs", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no split pair" in err[0] and "sweep.splits = [0, 1]" in err[0]
    assert not (exp / PAIRS_FILE).exists() and not (exp / "pairs.lock").exists()


# --- the analysis of pairs.jsonl, planted -----------------------------------------------------------------------------

def planted_pair_lines(pair: str, n: int, width: int, seed: int, tau: float, steps: list[int]) -> list[dict]:
    """pairs.jsonl lines of a pair whose bias is established from ``tau`` on, with a chance exit before it."""
    lines = []
    for k, step in enumerate(steps):
        lo = 0.05 if step >= tau or k == 1 else -0.05  # the second evaluation: a chance exit that falls back
        lines.append({"pair": pair, "run_a": pair, "run_b": pair + "_split1", "n": n, "width": width,
                      "seed_train": seed, "step": step, "bias": lo + 0.05, "bias_lo": lo, "bias_hi": lo + 0.1,
                      "n_samples": 1000})
    return lines


def test_analyze_reads_tau_bias_per_pair_and_fits_its_law(tmp_path):
    """Planted tau_bias = 20 N on a grid of evaluations 1.2x apart: the bracket holds it and the fitted exponent's
    interval holds 1."""
    from diffmem.analysis.scaling import analyze
    from diffmem.analysis.synthetic import paper_tau_gen, paper_tau_mem, write_synthetic_experiment, write_synthetic_run
    from diffmem.io import append_jsonl

    exp = tmp_path / "exp"
    planted = write_synthetic_experiment(exp, ns=[128, 256, 512, 1024], widths=[32], seeds=[0, 1],
                                         steps=lambda n, w: 3000 * n)
    for run in planted:  # each run's twin on the other block
        write_synthetic_run(exp / f"{run.name}_split1", n=run.n, width=run.width, seed=run.seed, steps=3000 * run.n,
                            tau_gen=paper_tau_gen(run.n, run.width), tau_mem=paper_tau_mem(run.n, run.width))
    grid = sorted({int(round(10 * 1.2 ** k)) for k in range(80) if 10 * 1.2 ** k <= 3_000_000})
    for run in planted:
        budget_grid = [s for s in grid if s <= 3000 * run.n]  # a pairs line beyond the runs' budget is refused
        for line in planted_pair_lines(run.name, run.n, run.width, run.seed, 20.0 * run.n, budget_grid):
            append_jsonl(exp / PAIRS_FILE, line)
    for line in planted_pair_lines("n00064_w32_s0", 64, 32, 0, 1280.0, grid):  # a pair whose runs were moved out
        append_jsonl(exp / PAIRS_FILE, line)
    with pytest.warns(UserWarning, match="pair n00064_w32_s0: its runs .* are not both in"):
        summary = analyze(exp)
    assert len(summary.pairs) == len(planted)
    for p in summary.pairs:
        est = p.tau_bias
        assert est.measured and est.lo < 20 * p.n <= est.hi and est.hi / est.lo < 1.25
    rows = {r["run"]: r for r in read_csv(exp / "summary.csv")}
    assert rows["n00128_w32_s0"]["pair"] == rows["n00128_w32_s0_split1"]["pair"] == "n00128_w32_s0"
    assert rows["n00128_w32_s0"]["tau_bias_censored"] is False
    law = json.loads((exp / "fits.json").read_text())["tau_bias_vs_n"]
    assert law["n_runs"] == 8 and law["exponent_lo"] < 1.0 < law["exponent_hi"]
    assert abs(law["exponent"] - 1.0) < 0.05


@pytest.mark.parametrize("control_opens", [False, True])
def test_a_pair_whose_control_bias_leaves_zero_is_flagged_and_enters_no_law(tmp_path, control_opens):
    """The same planted pairs with a control bias: held at 0, nothing is flagged and the law is fitted; leaving 0
    from the bias's own step (the blocks differ, as a clustered ordering makes them), every pair is flagged in
    summary.csv and left out of the law, naming the flag."""
    from diffmem.analysis.scaling import analyze
    from diffmem.analysis.synthetic import paper_tau_gen, paper_tau_mem, write_synthetic_experiment, write_synthetic_run
    from diffmem.io import append_jsonl

    exp = tmp_path / "exp"
    planted = write_synthetic_experiment(exp, ns=[128, 256, 512], widths=[32], seeds=[0],
                                         steps=lambda n, w: 3000 * n)
    grid = sorted({int(round(10 * 1.2 ** k)) for k in range(80) if 10 * 1.2 ** k <= 3_000_000})
    for run in planted:
        write_synthetic_run(exp / f"{run.name}_split1", n=run.n, width=run.width, seed=run.seed, steps=3000 * run.n,
                            tau_gen=paper_tau_gen(run.n, run.width), tau_mem=paper_tau_mem(run.n, run.width))
        for line in planted_pair_lines(run.name, run.n, run.width, run.seed, 20.0 * run.n,
                                       [s for s in grid if s <= 3000 * run.n]):
            control = line["bias"] if control_opens else 0.0  # the bias's own curve and interval, or 0 +- 0.05
            append_jsonl(exp / PAIRS_FILE, line | {"control_bias": control, "control_bias_lo": control - 0.05,
                                                   "control_bias_hi": control + 0.05})
    analyze(exp)
    rows = {r["run"]: r for r in read_csv(exp / "summary.csv")}
    law = json.loads((exp / "fits.json").read_text())["tau_bias_vs_n"]
    level_law = json.loads((exp / "fits.json").read_text())["tau_bias_at_0.05_vs_n"]
    if control_opens:  # the control bias is the bias's own curve: it reaches every level too
        assert all(str(rows[r.name]["tau_bias_flag"]).startswith("the control of tau_bias") for r in planted)
        assert law["n_runs"] == 0 and all(e["reason"].startswith("flagged, left out") for e in law["excluded"])
        assert all(str(rows[r.name]["tau_bias_at_0.05_flag"]).startswith("the control of tau_bias_at_0.05")
                   for r in planted)
        assert level_law["n_runs"] == 0
    else:
        assert all(rows[r.name]["tau_bias_flag"] in ("", None) and rows[r.name]["tau_bias_control"] is None
                   for r in planted)
        assert all(rows[r.name]["tau_bias_at_0.05_flag"] in ("", None) for r in planted)
        assert law["n_runs"] == 3 and level_law["n_runs"] == 3


def test_analyze_reads_the_bias_level_crossings_per_pair_and_fits_their_laws(tmp_path):
    """A planted bias that grows linearly in the step, bias = 0.05 step / (40 N), with a +-0.005 interval, on a grid
    of evaluations 1.2x apart: tau_bias_at_0.05 lies in its interval around 40 N and tau_bias_at_0.1 around 80 N,
    both in summary.csv; their laws in fits.json have exponents near 1 whose intervals hold 1; eval.bias_levels
    chooses the levels."""
    from diffmem.analysis.scaling import analyze
    from diffmem.analysis.synthetic import paper_tau_gen, paper_tau_mem, write_synthetic_experiment, write_synthetic_run
    from diffmem.io import append_jsonl

    exp = tmp_path / "exp"
    planted = write_synthetic_experiment(exp, ns=[128, 256, 512, 1024], widths=[32], seeds=[0, 1],
                                         steps=lambda n, w: 3000 * n)
    for run in planted:
        write_synthetic_run(exp / f"{run.name}_split1", n=run.n, width=run.width, seed=run.seed, steps=3000 * run.n,
                            tau_gen=paper_tau_gen(run.n, run.width), tau_mem=paper_tau_mem(run.n, run.width))
    grid = sorted({int(round(10 * 1.2 ** k)) for k in range(80) if 10 * 1.2 ** k <= 3_000_000})
    for run in planted:
        for step in (s for s in grid if s <= 3000 * run.n):  # a pairs line beyond the runs' budget is refused
            b = 0.05 * step / (40.0 * run.n)
            append_jsonl(exp / PAIRS_FILE, {"pair": run.name, "run_a": run.name, "run_b": run.name + "_split1",
                                            "n": run.n, "width": run.width, "seed_train": run.seed, "step": step,
                                            "bias": b, "bias_lo": b - 0.005, "bias_hi": b + 0.005,
                                            "n_samples": 1000})
    summary = analyze(exp)
    for p in summary.pairs:
        for level, at in ((0.05, 40.0), (0.1, 80.0)):
            est = p.levels[f"tau_bias_at_{level:g}"]
            assert not est.censored and est.lo <= at * p.n <= est.hi
            assert est.value == pytest.approx(at * p.n, rel=0.02)  # log-time interpolation of a line in step
    rows = {r["run"]: r for r in read_csv(exp / "summary.csv")}
    assert rows["n00256_w32_s1_split1"]["tau_bias_at_0.1"] == pytest.approx(80 * 256, rel=0.02)
    assert rows["n00256_w32_s1_split1"]["tau_bias_at_0.05_censored"] is False
    fits = json.loads((exp / "fits.json").read_text())
    for level in ("0.05", "0.1"):
        law = fits[f"tau_bias_at_{level}_vs_n"]
        assert law["n_runs"] == 8 and law["exponent_lo"] < 1.0 < law["exponent_hi"]
        assert abs(law["exponent"] - 1.0) < 0.02
    # the levels are the runs' eval.bias_levels (analysis only: changing it reads other crossings)
    for config in exp.glob("*/config.json"):
        stored = json.loads(config.read_text())
        stored["config"]["eval"]["bias_levels"] = [0.2]
        config.write_text(json.dumps(stored))
    again = analyze(exp)
    assert all(set(p.levels) == {"tau_bias_at_0.2"} for p in again.pairs)
    assert "tau_bias_at_0.2_vs_n" in json.loads((exp / "fits.json").read_text())
    assert {"tau_bias_at_0.2_vs_n", "tau_bias_at_0.2_vs_width"} <= set(load_fits(exp))  # the report reads these


def test_a_pairs_line_without_its_runs_is_refused_naming_its_line(tmp_path):
    from diffmem.io import append_jsonl
    from diffmem.rundir import RecordError

    good = planted_pair_lines("n00004_w08_s0", 4, 8, 0, 3.0, [1, 2, 4])
    for line in good + [{"pair": "n00004_w08_s0", "step": 8}]:
        append_jsonl(tmp_path / PAIRS_FILE, line)
    with pytest.raises(RecordError, match=r"pairs.jsonl line 4: 'run_a' is None, not a string"):
        read_pairs(tmp_path)



# --- where the user is told of `diffmem pairs` ------------------------------------------------------------------------

def test_a_sweep_with_split_pairs_ends_by_naming_diffmem_pairs(tmp_path, capsys):
    """docs/split-pairs.md: the paired evaluation is a second command, named by the sweep (here its dry run)."""
    config = tmp_path / "grid.toml"
    config.write_text("")
    exp = tmp_path / "my exp"
    assert main(["sweep", str(config), "--cluster", "debug", "--dry-run", "--out", str(exp), "--no-progress",
                 *sets(GRID)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("split pairs: next `diffmem pairs ") and f"`diffmem analyze '{exp}'`" in last
    assert main(["sweep", str(config), "--cluster", "debug", "--dry-run", "--out", str(exp), "--no-progress",
                 *sets([*GRID, "sweep.splits=[0]"])]) == 0
    assert "diffmem pairs" not in capsys.readouterr().out


def test_analyze_names_diffmem_pairs_while_split_pairs_lack_paired_evaluations(tmp_path, capsys):
    from diffmem.analysis.synthetic import write_synthetic_experiment, write_synthetic_run
    from diffmem.io import append_jsonl

    exp = tmp_path / "exp"
    planted = write_synthetic_experiment(exp, ns=[128, 256], widths=[32], steps=lambda n, w: 3000 * n, n_evals=8)
    for run in planted:  # each run's twin, on train block 1 as `diffmem sweep` trains it with sweep.splits = [0, 1]
        twin = write_synthetic_run(exp / f"{run.name}_split1", n=run.n, width=run.width, steps=3000 * run.n,
                                   tau_gen=run.tau_gen, tau_mem=run.tau_mem, n_evals=8)
        stored = json.loads((twin.path / "config.json").read_text())
        stored["config"]["data"]["subset_index"] = 1
        (twin.path / "config.json").write_text(json.dumps(stored))
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "diffmem pairs" in line]
    assert notes == [f"2 of 2 split pair(s) have no paired evaluation in {PAIRS_FILE} (no bias, no tau_bias): run "
                     f"`diffmem pairs {exp}`, then `diffmem analyze {exp}` again"]
    for line in planted_pair_lines(planted[0].name, 128, 32, 0, 1000.0, [100, 1000, 10000]):
        append_jsonl(exp / PAIRS_FILE, line)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    assert "1 of 2 split pair(s) have no paired evaluation" in capsys.readouterr().out
    for line in planted_pair_lines(planted[1].name, 256, 32, 0, 1000.0, [100, 1000, 10000]):
        append_jsonl(exp / PAIRS_FILE, line)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    assert "diffmem pairs" not in capsys.readouterr().out
