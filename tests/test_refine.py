"""Sharper brackets: kept checkpoints, refinement on planted onsets, the early stop rule, and their wiring in a run."""
from __future__ import annotations

import math

import numpy as np
import pytest

import diffmem.refine
import diffmem.train
from diffmem.analysis.timescales import binomial_interval, estimate_run
from diffmem.refine import brackets, next_refinement, stop_reason
from diffmem.rundir import RunDir
from diffmem.eval_grid import evaluation_steps, kept_steps
from diffmem.train import train
from tiny_runs import tiny_config


@pytest.mark.parametrize("ratio", [1.1, 1.25, 1.5])
def test_kept_steps_fill_every_gap_to_the_ratio(ratio):
    grid = evaluation_steps(16, 100000)
    keep = kept_steps(grid, ratio)
    union = sorted(set(grid) | set(keep))
    assert not set(keep) & set(grid)
    # integer steps cannot split the first gaps (1 -> 2 -> 3 ...); every gap of 4 steps or more holds the ratio
    assert all(b / a <= ratio + 1e-9 or b - a <= 1 or a < 4 for a, b in zip(union[:-1], union[1:]))
    assert kept_steps(grid, 0) == []


def _record(step: int, tau_mem: float, tau_gen: float, n: int = 400) -> dict:
    """A planted evaluation: f_mem jumps from 0 to 0.5 at tau_mem; FID falls to its plateau of 10 at tau_gen and
    rises again after 4 tau_gen."""
    f = 0.5 if step >= tau_mem else 0.0
    lo, hi = binomial_interval(np.array([f]), n)
    fid = 10 * (1 + 3 * max(0.0, math.log10(tau_gen / step)) + 0.3 * max(0.0, math.log10(step / (4 * tau_gen))))
    return {"step": step, "f_mem": f, "f_mem_lo": float(lo[0]), "f_mem_hi": float(hi[0]), "n_samples": n,
            "fid": fid, "train_loss": 0.1, "test_loss": 0.1}


@pytest.mark.parametrize("tau_mem,tau_gen", [(3000.0, 500.0), (12345.0, 2222.0)])
def test_refinement_shrinks_both_brackets_to_the_ratio_around_the_planted_onsets(tau_mem, tau_gen):
    grid = evaluation_steps(14, 40000)  # about 1.9x apart
    keep = kept_steps(grid, 1.2)
    records = [_record(s, tau_mem, tau_gen) for s in grid]
    wide = brackets(records)
    assert wide["tau_mem"][1] / wide["tau_mem"][0] > 1.5
    evaluated = 0
    while (step := next_refinement(records, sorted(set(grid) | set(keep)), 1.25)) is not None:
        assert step in keep
        records.append(_record(step, tau_mem, tau_gen))
        evaluated += 1
    final = brackets(records)
    for name, tau in (("tau_mem", tau_mem), ("tau_gen", tau_gen)):
        lo, hi = final[name]
        assert hi / lo <= 1.25 and lo <= tau * 1.02 and hi >= tau / 1.02, (name, lo, hi)
    assert evaluated <= 12  # bisection: a few evaluations per bracket, not every kept checkpoint
    est = estimate_run(sorted(records, key=lambda r: r["step"]))
    assert est["tau_mem"].hi / est["tau_mem"].lo <= 1.25


def test_stop_rule_needs_both_onsets_and_saturation():
    grid = evaluation_steps(14, 40000)
    records = [_record(s, 3000.0, 500.0) for s in grid if s <= 2000]
    assert stop_reason(records, 0.3) is None  # not memorized yet
    records += [_record(s, 3000.0, 500.0) for s in grid if 2000 < s <= 6000]
    reason = stop_reason(records, 0.3)
    assert reason and "tau_mem measured" in reason and "tau_gen measured" in reason
    assert stop_reason(records, 0.9) is None  # f_mem_lo 0.45 < 0.9: not saturated
    assert stop_reason(records, 0.0) is None  # off


@pytest.mark.e2e
def test_a_run_keeps_checkpoints_refines_after_training_and_resumes_refinement(tmp_path, monkeypatch):
    cfg = tiny_config("eval.times=[5, 60]", "eval.checkpoint_ratio=1.5", "eval.refine_ratio=1.5")
    planted = {"tau_mem": (5, 60)}  # a bracket the evaluations cannot resolve: refinement must fill it
    monkeypatch.setattr(diffmem.refine, "brackets", lambda records: planted)
    run = RunDir(tmp_path / "run")
    keep = kept_steps([5, 60], 1.5)
    # a crash during refinement: the first refinement evaluation fails once
    calls = []
    real = diffmem.evaluate.Evaluator.evaluate_checkpoint

    def crash_once(self, step, n_samples=None):
        calls.append(step)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, step, n_samples)

    monkeypatch.setattr(diffmem.evaluate.Evaluator, "evaluate_checkpoint", crash_once)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run.path, progress=False, log=lambda s: None)
    assert not run.is_done() and set(keep) <= set(run.checkpoint_steps())
    result = train(cfg, run.path, progress=False, log=lambda s: None)
    assert result.status == "done" and run.is_done()
    steps = [r["step"] for r in run.metrics()]
    assert sorted(steps) == sorted(set([5, 60] + keep)) and len(steps) == len(set(steps))


@pytest.mark.e2e
def test_an_early_stop_ends_training_says_so_and_survives_a_crash_before_done(tmp_path, monkeypatch):
    cfg = tiny_config("eval.times=[10, 20, 40, 60]", "eval.stop_f_mem=0.5")
    monkeypatch.setattr(diffmem.train, "stop_reason",
                        lambda records, f: "planted" if max(r["step"] for r in records) >= 20 else None)
    run = RunDir(tmp_path / "run")
    result = train(cfg, run.path, progress=False, log=lambda s: None)
    assert result.status == "done" and result.step == 20
    records = run.metrics()
    assert [r["step"] for r in records] == [10, 20] and records[-1]["stop"] == "planted"
    assert "stopped early: planted" in run.done_path.read_text()
    run.done_path.unlink()  # as if the process died after the stop's metrics line, before `done`
    again = train(cfg, run.path, progress=False, log=lambda s: None)
    assert again.step == 20 and [r["step"] for r in run.metrics()] == [10, 20]


@pytest.mark.e2e
def test_a_stop_rule_met_at_the_last_step_is_not_an_early_stop(tmp_path, monkeypatch):
    # the budget ends at 60 anyway: the record and done file must not claim an early stop (an extension continues)
    cfg = tiny_config("eval.times=[10, 20, 40, 60]", "eval.stop_f_mem=0.5")
    monkeypatch.setattr(diffmem.train, "stop_reason",
                        lambda records, f: "planted" if max(r["step"] for r in records) >= 60 else None)
    run = RunDir(tmp_path / "run")
    assert train(cfg, run.path, progress=False, log=lambda s: None).step == 60
    assert not any(r.get("stop") for r in run.metrics()) and "stopped early" not in run.done_path.read_text()


@pytest.mark.e2e
def test_evaluate_kept_densifies_a_finished_run_with_every_kept_checkpoint(tmp_path):
    from diffmem.cli import main
    cfg = tiny_config("eval.times=[5, 60]", "eval.checkpoint_ratio=1.5", "train.num_threads=1")
    run = RunDir(tmp_path / "run")
    train(cfg, run.path, progress=False, log=lambda s: None)
    keep = kept_steps([5, 60], 1.5)
    assert sorted(r["step"] for r in run.metrics()) == [5, 60] and set(keep) <= set(run.checkpoint_steps())
    assert main(["evaluate", str(run.path)]) == 0  # the grid is evaluated: nothing to do without --kept
    assert sorted(r["step"] for r in run.metrics()) == [5, 60]
    assert main(["evaluate", str(run.path), "--kept"]) == 0
    assert sorted(r["step"] for r in run.metrics()) == sorted([5, 60] + keep)


def _counted(step: int, n: int, t0: float, power: float, scale: float) -> dict:
    """A planted evaluation of ``n`` samples whose f_mem rises from 0 at ``t0`` as 0.3 ((t - t0) / (scale t0))^power;
    the copies are the expected count, rounded, with the binomial interval the analysis uses."""
    f = 0.0 if step <= t0 else min(0.5, 0.3 * ((step - t0) / (scale * t0)) ** power)
    k = round(n * f)
    lo, hi = binomial_interval(np.array([k / n]), n)
    return {"step": step, "f_mem": k / n, "f_mem_lo": float(lo[0]), "f_mem_hi": float(hi[0]), "n_samples": n,
            "fid": 10.0, "train_loss": 0.1, "test_loss": 0.1}


def _refined(grid, checkpoints, t0, power, scale, mem_samples):
    records = [_counted(s, 1000, t0, power, scale) for s in grid]
    while (step := next_refinement(records, checkpoints, 1.25, mem_samples)) is not None:
        records.append(_counted(step, mem_samples or 1000, t0, power, scale))
    return records


@pytest.mark.parametrize("t0,power,scale", [(3000.0, 3, 3), (5000.0, 2, 2)])
def test_more_samples_resolve_an_onset_that_ambiguous_evaluations_hide(t0, power, scale):
    grid = evaluation_steps(14, 40000)
    checkpoints = sorted(set(grid) | set(kept_steps(grid, 1.2)))
    # 1000 samples: the evaluations with 1-3 copies are neither clean nor memorized, the bracket stays above 1.25
    lo, hi = brackets(_refined(grid, checkpoints, t0, power, scale, 0))["tau_mem"]
    assert hi / lo > 1.25
    # 10000 samples per refinement evaluation: the same onset resolved to one gap of kept checkpoints
    records = _refined(grid, checkpoints, t0, power, scale, 10000)
    lo, hi = brackets(records)["tau_mem"]
    assert hi / lo <= 1.25 and lo <= t0 * 1.2 and hi > t0
    latest = {r["step"]: r for r in records}  # appended in order: the last line of a step wins
    assert latest[lo]["n_samples"] == 10000 and latest[lo]["f_mem_hi"] == 0  # clean among 10000, not only 1000
    est = estimate_run(sorted(latest.values(), key=lambda r: r["step"]))
    assert (est["tau_mem"].lo, est["tau_mem"].hi) == (lo, hi)


def test_more_samples_leave_a_bracket_open_when_a_kept_checkpoint_is_still_ambiguous():
    grid = evaluation_steps(14, 40000)
    checkpoints = sorted(set(grid) | set(kept_steps(grid, 1.2)))
    records = _refined(grid, checkpoints, 5000.0, 3, 2, 10000)
    latest = {r["step"]: r for r in records}
    lo, hi = brackets(records)["tau_mem"]
    assert (lo, hi) == (4993, 7189) and hi / lo > 1.25  # no kept checkpoint left inside to evaluate
    assert latest[5991]["n_samples"] == 10000 and round(latest[5991]["f_mem"] * 10000) == 3  # 3 copies: neither
    assert next_refinement(records, checkpoints, 1.25, 10000) is None


def _copies(step: int, k: int, n: int) -> dict:
    """An evaluation in which ``k`` of ``n`` samples copy a training image."""
    lo, hi = binomial_interval(np.array([k / n]), n)
    return {"step": step, "f_mem": k / n, "f_mem_lo": float(lo[0]), "f_mem_hi": float(hi[0]), "n_samples": n,
            "fid": 10.0, "train_loss": 0.1, "test_loss": 0.1}


def test_a_narrow_bracket_whose_clean_end_had_fewer_samples_is_measured_again():
    steps = [500, 1000, 1150, 1300]
    records = [_copies(500, 0, 1000), _copies(1000, 0, 1000), _copies(1150, 0, 1000), _copies(1300, 7, 1000)]
    assert brackets(records)["tau_mem"] == (1150, 1300)  # 1.13x: resolved by the ratio alone
    assert next_refinement(records, steps, 1.25) is None
    assert next_refinement(records, steps, 1.25, mem_samples=10000) == 1150
    records.append(_copies(1150, 4, 10000))  # 4 copies among 10000: memorized after all
    assert brackets(records)["tau_mem"] == (1000, 1150)
    assert next_refinement(records, steps, 1.25, mem_samples=10000) == 1000
    records.append(_copies(1000, 0, 10000))  # clean among 10000 too: resolved
    assert next_refinement(records, steps, 1.25, mem_samples=10000) is None


@pytest.mark.e2e
def test_evaluate_refines_a_finished_run_with_more_samples_and_leaves_its_config(tmp_path, monkeypatch, capsys):
    from diffmem.cli import main
    cfg = tiny_config("eval.times=[5, 60]", "eval.checkpoint_ratio=1.5", "eval.refine_ratio=1.5",
                      "train.num_threads=1")
    planted = {"tau_mem": (5, 60)}
    monkeypatch.setattr(diffmem.refine, "brackets", lambda records: planted)
    run = RunDir(tmp_path / "run")
    train(cfg, run.path, progress=False, log=lambda s: None)
    config_text = run.config_path.read_text()
    before = len(run.metrics())
    assert main(["evaluate", str(run.path), "--refine-n-samples", "40"]) == 0
    added = run.metrics()[before:]
    # every checkpoint inside the planted bracket, and its clean end 5, measured again with 40 samples
    assert sorted(r["step"] for r in added) == sorted([5] + [s for s in run.checkpoint_steps() if 5 < s < 60])
    assert all(r["n_samples"] == 40 and r["fid_n_samples"] == 16 for r in added)
    assert run.config_path.read_text() == config_text
    assert main(["evaluate", str(run.path), "--refine-n-samples", "40"]) == 0  # nothing left: a rerun adds nothing
    assert len(run.metrics()) == before + len(added)
    capsys.readouterr()
    assert main(["evaluate", str(run.path), "--refine-n-samples", "8"]) != 0  # fewer than eval.n_samples = 16
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refine_n_samples" in err[0]


@pytest.mark.e2e
def test_refine_n_samples_needs_a_run_that_keeps_checkpoints(tmp_path, capsys):
    from diffmem.cli import main
    run = RunDir(tmp_path / "run")
    train(tiny_config("eval.times=[5, 60]", "train.num_threads=1"), run.path, progress=False, log=lambda s: None)
    capsys.readouterr()
    assert main(["evaluate", str(run.path), "--refine-n-samples", "40"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refine_ratio" in err[0]
