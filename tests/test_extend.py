"""Raising a run's budget continues it: the steps already trained are kept, the weights equal a straight run's."""
from __future__ import annotations

import json

import pytest
import torch

from diffmem.config import SweepConfig
from diffmem.rundir import RunDir
from diffmem.cluster.runstate import experiment_status
from diffmem.cluster.base import ClusterOptions
from diffmem.sweep import run_sweep
from diffmem.rundir import RunConfigMismatch
from diffmem.train import train
from tiny_runs import TINY_GRID, tiny_config

QUIET = {"progress": False, "log": lambda s: None}


def weights(run: RunDir) -> dict[str, torch.Tensor]:
    return torch.load(run.state_path, weights_only=True)["model"]


@pytest.mark.e2e
def test_a_finished_run_extended_to_twice_its_budget_equals_a_straight_run(tmp_path):
    base = ["train.num_threads=1", "eval.times=6", "train.optimizer=sgd", "train.lr=0.01"]
    short, long = tiny_config(*base, "train.steps=30"), tiny_config(*base, "train.steps=60")
    extended, straight = RunDir(tmp_path / "extended"), RunDir(tmp_path / "straight")
    assert train(short, extended.path, **QUIET).status == "done"
    before = extended.metrics()
    result = train(long, extended.path, **QUIET)
    assert result.status == "done" and result.step == 60
    train(long, straight.path, **QUIET)
    a, b = weights(extended), weights(straight)
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in extended.metrics()]
    assert extended.metrics()[:len(before)] == before  # nothing recomputed, nothing dropped
    assert steps == sorted(set(steps)) and steps[-1] == 60 and steps[len(before) - 1] == 30
    assert all(s > 30 for s in steps[len(before):])
    meta = json.loads(extended.config_path.read_text())
    assert meta["config"]["train"]["steps"] == 60
    assert [(e["from_steps"], e["to_steps"]) for e in meta["extended"]] == [(30, 60)]
    assert train(long, extended.path, **QUIET).status == "skipped"


@pytest.mark.e2e
def test_an_interrupted_run_may_grow_but_no_budget_may_shrink(tmp_path):
    base = ["train.num_threads=1", "eval.times=[10, 30]"]
    run = RunDir(tmp_path / "run")
    train(tiny_config(*base, "train.steps=30"), run.path, stop_at_step=15, **QUIET)
    assert train(tiny_config(*base, "train.steps=40"), run.path, **QUIET).step == 40
    with pytest.raises(RunConfigMismatch, match=r"train\.steps: 40 -> 35 \(a budget may grow, never shrink\)"):
        train(tiny_config(*base, "train.steps=35"), run.path, **QUIET)
    with pytest.raises(RunConfigMismatch, match=r"train\.lr"):
        train(tiny_config(*base, "train.steps=80", "train.lr=0.5"), run.path, **QUIET)


@pytest.mark.e2e
def test_a_sweep_with_a_larger_budget_extends_exactly_the_runs_that_need_it(tmp_path):
    exp = tmp_path / "exp"
    cfg = tiny_config("eval.times=2", base=TINY_GRID)
    first = SweepConfig(n=[4, 8], width=[8], steps_per_n=2, min_steps=12)  # budgets 12 and 16
    run_sweep(cfg, first, exp, ClusterOptions("debug"), progress=False, log=lambda _m: None)
    n4, n8 = RunDir(exp / "n00004_w08_s0"), RunDir(exp / "n00008_w08_s0")
    done_n4 = n4.done_path.read_text()
    larger = SweepConfig(n=[4, 8], width=[8], steps_per_n=3, min_steps=12)  # budgets 12 (same) and 24
    from diffmem.sweep import plan_sweep
    plan = {e.run.name: e for e in plan_sweep(cfg, larger, exp)}
    assert plan["n00004_w08_s0"].jobs == () and plan["n00008_w08_s0"].jobs == ("train",)
    assert plan["n00008_w08_s0"].status.state == "partial" and plan["n00008_w08_s0"].status.total == 24
    report = run_sweep(cfg, larger, exp, ClusterOptions("debug"), progress=False, log=lambda _m: None)
    assert [(r.name, r.step) for r in report.results] == [("n00008_w08_s0", 24)]
    assert n4.done_path.read_text() == done_n4 and n8.is_done()
    assert [r["step"] for r in n8.metrics()][-1] == 24
    assert [r.state for r in experiment_status(exp)] == ["done", "done"]
