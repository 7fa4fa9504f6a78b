"""The executors behind one interface (diffmem.cluster.executors): the choice by cluster, the order in which a run's
jobs run, the local executor's longest-first order, and the dry run of each. The jobs here are stand-ins (no
training): a callable that returns what a RunJob returns, an object with ``status`` and ``step``, and (for jobs in
another process, whose outcome the executor reads from the run's job.json) records it as a RunJob does."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from diffmem.cluster.base import ClusterOptions, Job, Task
from diffmem.cluster.executors import (DebugExecutor, LocalExecutor, SlurmExecutor, local_job_threads,
                                       make_executor)
from diffmem.jobrecords import read_submissions, record_job_end, record_job_start
from diffmem.outcomes import DONE, EVALUATED, FAILED


def returns(status: str, step: int | None = None):
    """A picklable stand-in job that returns ``status``."""
    return functools.partial(SimpleNamespace, status=status, step=step)


def _record_and_return(run_dir: Path, status: str, step: int | None) -> SimpleNamespace:
    import submitit

    record_job_start(run_dir, "train", submitit.JobEnvironment().job_id)
    record_job_end(run_dir, status, step=step)
    return SimpleNamespace(status=status, step=step)


def records(run_dir: Path, status: str, step: int | None = None):
    """A picklable stand-in job that records ``status`` in ``run_dir``/job.json, as a RunJob does, and returns it."""
    return functools.partial(_record_and_return, run_dir, status, step)


FAILS = functools.partial(int, "not a number")  # a picklable stand-in job that raises ValueError


def task(root: Path, name: str, *jobs: tuple[str, object], steps: int = 10, device: str = "cpu") -> Task:
    run_dir = (root / name).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    return Task(name, run_dir, steps, device, tuple(Job(kind, call) for kind, call in jobs))


def test_make_executor_picks_the_executor_of_the_cluster(tmp_path):
    debug = make_executor(ClusterOptions("debug"), tmp_path)
    local = make_executor(ClusterOptions("local", max_parallel=2, gpus=()), tmp_path)
    slurm = make_executor(ClusterOptions("slurm", cpus_per_job=3), tmp_path, wait=True)
    assert (type(debug), type(local), type(slurm)) == (DebugExecutor, LocalExecutor, SlurmExecutor)
    assert [e.kind for e in (debug, local, slurm)] == ["debug", "local", "slurm"]
    assert debug.in_process and not local.in_process and not slurm.in_process
    assert debug.job_threads == 0 and local.job_threads == local_job_threads(2) and slurm.job_threads == 3
    assert slurm.wait and make_executor(ClusterOptions("slurm", slurm_options=(("cpus-per-task", "5"),)),
                                        tmp_path).job_threads == 5


def test_the_debug_executor_runs_a_runs_jobs_in_order_and_stops_at_its_first_failure(tmp_path):
    exp = tmp_path / "exp"
    lines: list[str] = []
    tasks = [task(exp, "a", ("train", returns(DONE, 20)), ("evaluate", returns(EVALUATED))),
             task(exp, "b", ("train", FAILS), ("evaluate", returns(EVALUATED)))]
    results = DebugExecutor(ClusterOptions("debug"), exp, log=lines.append).run(tasks, busy=[])
    assert [(r.name, r.kind, r.status, r.step) for r in results] == [
        ("a", "train", DONE, 20), ("a", "evaluate", EVALUATED, None), ("b", "train", FAILED, None)]
    assert results[-1].error.startswith("ValueError: invalid literal")  # b's evaluation never ran
    assert [s["kind"] for s in read_submissions(exp / "a")] == ["train", "evaluate"]
    assert [s["kind"] for s in read_submissions(exp / "b")] == ["train"]
    assert read_submissions(exp / "a")[0]["stdout"] is None  # a debug job writes no log files
    assert lines == ["a train: done", "a evaluate: evaluated", f"b train: failed: {results[-1].error}"]


@pytest.mark.e2e
def test_the_local_executor_runs_the_longest_runs_first(tmp_path, monkeypatch):
    tests = str(Path(__file__).resolve().parent)  # the jobs' processes import the stand-ins from here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p))
    exp = tmp_path / "exp"
    lines: list[str] = []
    tasks = [task(exp, f"s{steps}", ("train", records((exp / f"s{steps}").absolute(), DONE, steps)), steps=steps)
             for steps in (10, 30, 20)]
    executor = LocalExecutor(ClusterOptions("local", max_parallel=1, gpus=(), poll_s=0.1), exp, log=lines.append)
    results = executor.run(tasks, busy=[])
    assert [r.name for r in results] == ["s30", "s20", "s10"]
    assert [r.status for r in results] == [DONE] * 3 and [r.step for r in results] == [30, 20, 10]
    assert [line.split()[0] for line in lines if "started job" in line] == ["s30", "s20", "s10"]
    assert all(Path(r.log).parent == exp / ".submitit" for r in results)


def test_only_slurm_has_a_dry_run_script_one_array_per_kind_of_job(tmp_path):
    exp = tmp_path / "exp"
    tasks = [task(exp, "a", ("train", FAILS), ("evaluate", FAILS)), task(exp, "b", ("train", FAILS)),
             task(exp, "c", ("evaluate", FAILS), device="cuda")]
    for cluster in ("debug", "local"):
        assert make_executor(ClusterOptions(cluster, gpus=()), exp).scripts(tasks) == []
    scripts = make_executor(ClusterOptions("slurm"), exp).scripts(tasks)
    assert [title for title, _ in scripts] == [
        "sbatch script for 2 train job(s), 0 GPU(s) each",
        "sbatch script for 1 evaluate job(s), 0 GPU(s) each, each after its training job",
        "sbatch script for 1 evaluate job(s), 1 GPU(s) each"]
    assert "#SBATCH --array=0-1%2" in scripts[0][1] and "#SBATCH --dependency=aftercorr:" in scripts[1][1]
    assert "#SBATCH --gpus-per-node=1" in scripts[2][1]
    assert not exp.joinpath(".submitit").exists()  # a dry run writes nothing


def test_a_slurm_executor_with_nothing_to_submit_or_follow_submits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: a submission would fail
    assert make_executor(ClusterOptions("slurm"), tmp_path, wait=True).run([], busy=[]) == []
    with pytest.raises(ValueError, match="srun or sbatch is not on PATH"):
        make_executor(ClusterOptions("slurm"), tmp_path).check()
