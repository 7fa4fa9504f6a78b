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
from diffmem.schedule import evaluation_steps, kept_steps
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


def test_a_run_keeps_checkpoints_refines_after_training_and_resumes_refinement(tmp_path, monkeypatch):
    cfg = tiny_config("eval.times=[5, 60]", "eval.checkpoint_ratio=1.5", "eval.refine_ratio=1.5")
    planted = {"tau_mem": (5, 60)}  # a bracket the evaluations cannot resolve: refinement must fill it
    monkeypatch.setattr(diffmem.refine, "brackets", lambda records: planted)
    run = RunDir(tmp_path / "run")
    keep = kept_steps([5, 60], 1.5)
    # a crash during refinement: the first refinement evaluation fails once
    calls = []
    real = diffmem.evaluate.Evaluator.evaluate_checkpoint

    def crash_once(self, step):
        calls.append(step)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, step)

    monkeypatch.setattr(diffmem.evaluate.Evaluator, "evaluate_checkpoint", crash_once)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run.path, progress=False, log=lambda s: None)
    assert not run.is_done() and set(keep) <= set(run.checkpoint_steps())
    result = train(cfg, run.path, progress=False, log=lambda s: None)
    assert result.status == "done" and run.is_done()
    steps = [r["step"] for r in run.metrics()]
    assert sorted(steps) == sorted(set([5, 60] + keep)) and len(steps) == len(set(steps))


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


def test_a_stop_rule_met_at_the_last_step_is_not_an_early_stop(tmp_path, monkeypatch):
    # the budget ends at 60 anyway: the record and done file must not claim an early stop (an extension continues)
    cfg = tiny_config("eval.times=[10, 20, 40, 60]", "eval.stop_f_mem=0.5")
    monkeypatch.setattr(diffmem.train, "stop_reason",
                        lambda records, f: "planted" if max(r["step"] for r in records) >= 60 else None)
    run = RunDir(tmp_path / "run")
    assert train(cfg, run.path, progress=False, log=lambda s: None).step == 60
    assert not any(r.get("stop") for r in run.metrics()) and "stopped early" not in run.done_path.read_text()


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
