"""Sweeps through submitit: debug and local executors on a 2x2 grid of tiny runs, a failing grid point, preemption
with requeue and exact resume, the slurm sbatch script (dry run, and submitted to a stand-in sbatch), status.
A real Slurm cluster: tests/test_slurm.py."""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from diffmem.cli import main
from diffmem.config import SweepConfig
from diffmem.rundir import RunDir
from diffmem.cluster.base import ClusterOptions
from diffmem.cluster.slurm import render_sbatch
from diffmem.jobrecords import SUBMITIT_DIR, read_job, read_submissions, record_submission
from diffmem.cluster.runstate import experiment_status, run_status
from diffmem.status import format_status
from diffmem.sweep import RunJob, plan_sweep, run_sweep
from diffmem.train import train
from tiny_runs import TINY_GRID, sets, tiny_config

PAPER_GRID = Path(__file__).resolve().parent.parent / "experiments" / "paper_celeba32.toml"


def tiny(*extra):
    return tiny_config(*extra, base=TINY_GRID)


def model_weights(run_dir):
    return torch.load(Path(run_dir) / "state.pt", weights_only=False)["model"]


@pytest.mark.e2e
def test_debug_sweep_trains_a_2x2_grid_then_skips_it(tmp_path, capsys):
    exp = tmp_path / "exp"
    sweep = SweepConfig(n=[4, 8], width=[8, 16], seeds=[0])
    cfg = tiny("eval.fid=true", "eval.times=1")  # FID (here the offline FD) once per run, at the end
    report = run_sweep(cfg, sweep, exp, ClusterOptions("debug"), progress=False, log=lambda _m: None)
    names = ["n00004_w08_s0", "n00008_w08_s0", "n00004_w16_s0", "n00008_w16_s0"]
    assert [(r.name, r.kind, r.status, r.step) for r in report.results] == [(n, "train", "done", 20) for n in names]
    for name in names:
        run = RunDir(exp / name)
        assert run.is_done() and [r["step"] for r in run.metrics()] == [20]
        (sub,) = read_submissions(run.path)
        assert sub["cluster"] == "debug" and sub["job_id"].startswith("DEBUG_") and sub["steps"] == 20
        assert read_job(run.path)["outcome"] == "done"
    rows = experiment_status(exp)
    assert [r.state for r in rows] == ["done"] * 4
    assert all(r.step == r.total == 20 and r.f_mem is not None and r.fid is not None for r in rows)
    assert rows[0].fid_label == "FD (diffmem-randconv-v1)"
    # resubmitting submits nothing
    again = run_sweep(cfg, sweep, exp, ClusterOptions("debug"), progress=False, log=lambda _m: None)
    assert again.results == [] and all(e.note == "skip (done)" for e in again.entries)
    assert all(len(read_submissions(exp / n)) == 1 for n in names)
    capsys.readouterr()
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "4 runs: 4 done" in out and "n00008_w16_s0" in out and "FD (diffmem-randconv-v1)" in out


def _preempt_once_training(run: RunDir, sent: list, stop: threading.Event) -> None:
    """Send SIGUSR2 (Slurm's preemption signal, and what submitit's local controller sends signal_delay_s before
    a job's time limit) to the job of ``run`` once it has saved its first checkpoint."""
    while not stop.is_set():
        job = read_job(run.path)
        if job and job.get("outcome") is None and run.checkpoint_steps():
            os.kill(job["pid"], signal.SIGUSR2)
            sent.append(job["pid"])
            return
        time.sleep(0.02)


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs POSIX signals")
def test_local_sweep_one_gpu_per_job_failures_reported_preempted_job_resumes_exactly(tmp_path):
    """One local sweep of a 2x2 grid, 3 jobs at a time on 2 GPUs (n = 80 does not fit the data: those two runs
    fail), in which the job of n00008_w08_s0 is preempted mid-training, requeued by submitit, and ends with the
    weights of an uninterrupted run."""
    cfg = tiny("train.steps=40")
    exp = tmp_path / "exp"
    sweep = SweepConfig(n=[8, 80], width=[8, 16], seeds=[0])
    preempted = RunDir(exp / "n00008_w08_s0")
    sent: list[int] = []
    lines: list[str] = []
    stop = threading.Event()
    sender = threading.Thread(target=_preempt_once_training, args=(preempted, sent, stop), daemon=True)
    sender.start()
    try:
        report = run_sweep(cfg, sweep, exp, ClusterOptions("local", max_parallel=3, gpus=(0, 1), poll_s=0.2),
                           progress=False, log=lines.append)
    finally:
        stop.set()
        sender.join()
    by_name = {r.name: r for r in report.results}
    assert {n: (r.status, r.step) for n, r in by_name.items()} == {
        "n00008_w08_s0": ("done", 40), "n00008_w16_s0": ("done", 40),
        "n00080_w08_s0": ("failed", None), "n00080_w16_s0": ("failed", None)}
    for name in ("n00080_w08_s0", "n00080_w16_s0"):
        assert "DataError: data.n = 80 is larger than the training part" in by_name[name].error
        assert Path(by_name[name].log).is_file() and Path(by_name[name].log).parent == exp / SUBMITIT_DIR
    # each job saw exactly the GPU the sweep gave it, the least loaded one: the two first jobs got different GPUs
    started = [line.split() for line in lines if " started job " in line]
    assert len(started) == 4 and [words[-1] for words in started[:2]] == ["0", "1"]
    for words in started:
        assert read_job(exp / words[0])["cuda_visible_devices"] == words[-1]
    for name in ("n00008_w08_s0", "n00008_w16_s0"):
        assert RunDir(exp / name).is_done() and [r["step"] for r in RunDir(exp / name).metrics()] == [1, 40]
    # the preemption: one submission (the requeue is submitit's), a second process that resumed from state.pt
    assert sent, "the run finished before it could be preempted"
    (sub,) = read_submissions(preempted.path)
    log = Path(sub["stdout"]).read_text() + Path(sub["stderr"]).read_text()
    assert "SIGUSR2" in log and "handing over to submitit" in log and "Requeued job" in log
    assert "resuming at step" in log
    job = read_job(preempted.path)
    assert job["outcome"] == "done" and job["pid"] != sent[0] and job["job_id"] == sub["job_id"]
    train(cfg.replace(data={"n": 8}, model={"width": 8}), tmp_path / "straight", progress=False, log=lambda _m: None)
    a, b = model_weights(tmp_path / "straight"), model_weights(preempted.path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # status: done and failed runs, with the error line
    rows = {r.name: r for r in experiment_status(exp)}
    assert rows["n00008_w08_s0"].state == "done" and rows["n00080_w16_s0"].state == "failed"
    assert "data.n = 80" in rows["n00080_w16_s0"].error and rows["n00080_w16_s0"].job_id == \
        read_submissions(exp / "n00080_w16_s0")[0]["job_id"]
    text = format_status(list(rows.values()), exp)
    assert "n00080_w08_s0 failed: DataError: data.n = 80" in text and "4 runs: 2 failed, 2 done" in text
    # resubmission plans only the unfinished runs
    plan = plan_sweep(cfg, sweep, exp)
    assert sorted(e.run.name for e in plan if e.jobs) == ["n00080_w08_s0", "n00080_w16_s0"]


def _signal_when_training(run: RunDir, sig: int) -> threading.Thread:
    """A thread that sends ``sig`` to this process once ``run`` has saved its first checkpoint."""
    def send():
        while not run.checkpoint_steps():
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.e2e
def test_a_local_job_stopped_by_sigint_alone_is_reported_interrupted_and_a_rerun_finishes(tmp_path):
    # Ctrl-C reached the job's process but not the sweep's (e.g. `kill -INT` on the job): the job saved its state
    # and raised KeyboardInterrupt, so submitit has no result; the sweep must say "interrupted", not "failed"
    cfg = tiny("train.steps=80", "eval.times=2")
    sweep = SweepConfig(n=[8], width=[8], seeds=[0])
    exp = tmp_path / "exp"
    run = RunDir(exp / "n00008_w08_s0")

    def interrupt_the_job():
        while not run.checkpoint_steps() or not (read_job(run.path) or {}).get("pid"):
            time.sleep(0.02)
        os.kill(read_job(run.path)["pid"], signal.SIGINT)

    sender = threading.Thread(target=interrupt_the_job, daemon=True)
    sender.start()
    report = run_sweep(cfg, sweep, exp, ClusterOptions("local", max_parallel=1, poll_s=0.2), progress=False,
                       log=lambda _m: None)
    sender.join()
    (result,) = report.results
    assert result.status == "interrupted" and result.error is None and 1 <= result.step < 80
    assert read_job(run.path)["outcome"] == "interrupted" and not run.is_done()
    again = run_sweep(cfg, sweep, exp, ClusterOptions("local", max_parallel=1, poll_s=0.2), progress=False,
                      log=lambda _m: None)
    assert [r.status for r in again.results] == ["done"] and run.is_done()


@pytest.mark.e2e
def test_a_local_sweep_waits_for_an_earlier_job_still_working_on_a_run_then_trains_it(tmp_path):
    # Ctrl-C then an immediate rerun: the interrupted job may still be saving its state. The rerun must wait for it,
    # then continue the run, not skip it as "running" and report the experiment finished.
    cfg = tiny("train.steps=20")
    sweep = SweepConfig(n=[8], width=[8], seeds=[0])
    exp = tmp_path / "exp"
    run = RunDir(exp / "n00008_w08_s0")
    run.path.mkdir(parents=True)
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    threading.Thread(target=earlier.wait, daemon=True).start()  # reaped when it ends, as init does for a job
    record_submission(run.path, job_id=str(earlier.pid), cluster="local", kind="train", steps=20, stdout=None,
                      stderr=None)
    (run.path / "job.json").write_text(json.dumps({
        "job_id": str(earlier.pid), "kind": "train", "host": socket.gethostname(), "pid": earlier.pid,
        "cuda_visible_devices": None, "started": "2026-01-01T00:00:00+00:00", "ended": None, "outcome": None,
        "step": None, "error": None}))
    assert experiment_status(exp)[0].state == "running"
    lines: list[str] = []
    report = run_sweep(cfg, sweep, exp, ClusterOptions("local", max_parallel=1, poll_s=0.2), progress=False,
                       log=lines.append)
    assert any("waiting for the earlier job(s)" in line and str(earlier.pid) in line for line in lines), lines
    assert earlier.poll() is not None  # it had ended before the sweep went on
    assert [r.status for r in report.results] == ["done"] and run.is_done()


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs POSIX signals")
def test_inside_a_job_sigterm_is_ignored_as_submitit_does_and_training_goes_on(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # what submitit's job runner installs: ignore SIGTERM
    try:
        sender = _signal_when_training(run, signal.SIGTERM)
        outcome = RunJob(tiny("data.n=8", "train.steps=40"), run.path)()
        sender.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (outcome.status, outcome.step) == ("done", 40) and run.is_done()
    out = capsys.readouterr().out
    assert "SIGTERM at step" in out and "continuing from state.pt" in out and "resuming at step" in out
    assert read_job(run.path)["outcome"] == "done"


def test_sigint_stops_a_job_with_its_state_saved_and_nothing_requeued(tmp_path):
    run = RunDir(tmp_path / "run")
    sender = _signal_when_training(run, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        RunJob(tiny("data.n=8", "train.steps=40"), run.path)()
    sender.join()
    job = read_job(run.path)
    assert job["outcome"] == "interrupted" and 1 <= job["step"] < 40
    assert run.state_path.exists() and not run.is_done()
    assert run_status(run.path).state == "partial"


def test_slurm_dry_run_prints_the_job_array_script_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no_cluster.conf"))  # sinfo cannot answer: no cluster here
    exp = tmp_path / "paper"
    argv = ["sweep", str(PAPER_GRID), "--cluster", "slurm", "--dry-run", "--out", str(exp), "--max-parallel", "4",
            "--partition", "gpu", "--time", "48", "--signal-delay-s", "600", "--setup", "module load cuda"]
    assert main(argv + ["--slurm-option", "gres=gpu:a100:1"]) == 0
    out = capsys.readouterr().out
    assert out.count(" new ") == 9 and str(exp / "n32768_w32_s0") in out
    for line in ["#SBATCH --array=0-8%4", "#SBATCH --signal=USR2@600", "#SBATCH --time=2880",
                 "#SBATCH --partition=gpu", "#SBATCH --requeue", "#SBATCH --gres=gpu:a100:1",
                 f"#SBATCH --output={exp / SUBMITIT_DIR}/%A_%a_0_log.out", "module load cuda",
                 "submitit_main()", f"' {exp / SUBMITIT_DIR}", "0 GPU(s) each"]:
        assert line in out
    assert "--gpus-per-node" not in out  # the explicit gres is the GPU request
    # without one: train.device = auto asks for a GPU where the partition cannot be asked; cpu asks for none
    assert main(argv) == 0
    assert "#SBATCH --gpus-per-node=1" in capsys.readouterr().out
    assert main(argv + ["--set", 'train.device="cpu"']) == 0
    assert "--gpus-per-node" not in capsys.readouterr().out
    assert main(argv + ["--set", 'train.device="cpu"', "--gpus-per-job", "2"]) == 0
    assert "#SBATCH --gpus-per-node=2" in capsys.readouterr().out
    assert not exp.exists()
    # finished runs leave the array: two done runs -> 7 tasks
    for name in ("n00128_w32_s0", "n00256_w32_s0"):
        (exp / name).mkdir(parents=True)
        (exp / name / "done").write_text("steps 2000000\n")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-6%4" in out and out.count("skip (done)") == 2


def test_slurm_submission_matches_the_dry_run_and_records_job_ids(tmp_path, monkeypatch):
    """Submit through submitit's SlurmExecutor to a stand-in ``sbatch`` on PATH (no cluster here) that keeps the
    script and answers as sbatch does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = tmp_path / "submitted"
    scripts.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for name in ("scontrol", "sacct", "sinfo"):  # no controller to ask, as off a cluster
        (bin_dir / name).write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2; exit 1\n")
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{scripts}/count" 2>/dev/null || echo 4241); n=$((n+1)); echo $n > "{scripts}/count"\n'
        f'cp "$1" "{scripts}/$n.sh"; echo "Submitted batch job $n"\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    exp = tmp_path / "exp"
    sweep = SweepConfig(n=[4, 8], width=[8], seeds=[0])
    options = ClusterOptions("slurm", max_parallel=1, partition="gpu", time_hours=2)
    report = run_sweep(tiny(), sweep, exp, options, eval_separately=True, progress=False)
    assert [(r.name, r.kind, r.job_id, r.status) for r in report.results] == [
        ("n00004_w08_s0", "train", "4242_0", "submitted"), ("n00008_w08_s0", "train", "4242_1", "submitted"),
        ("n00004_w08_s0", "evaluate", "4243_0", "submitted"), ("n00008_w08_s0", "evaluate", "4243_1", "submitted")]
    train_script = (scripts / "4242.sh").read_text()
    assert train_script == render_sbatch(2, options, exp, "diffmem-exp", gpus=0)  # train.device = cpu: no GPU
    assert "#SBATCH --array=0-1%1" in train_script and "#SBATCH --signal=USR2@300" in train_script
    eval_script = (scripts / "4243.sh").read_text()
    assert "#SBATCH --dependency=aftercorr:4242" in eval_script and "#SBATCH --kill-on-invalid-dep=yes" in eval_script
    subs = read_submissions(exp / "n00008_w08_s0")
    assert [(s["job_id"], s["kind"], s["cluster"]) for s in subs] == [("4242_1", "train", "slurm"),
                                                                      ("4243_1", "evaluate", "slurm")]
    assert subs[0]["stdout"] == str(exp / SUBMITIT_DIR / "4242_1_0_log.out")
    assert json.loads((exp / "sweep.json").read_text())["runs"] == {"n00004_w08_s0": 20, "n00008_w08_s0": 20}
    rows = experiment_status(exp)  # Slurm cannot be asked: submitted jobs that have not started are queued
    assert [(r.name, r.state, r.job_id) for r in rows] == [("n00004_w08_s0", "queued", "4243_0"),
                                                           ("n00008_w08_s0", "queued", "4243_1")]
    # resubmitting while they are queued submits nothing
    assert run_sweep(tiny(), sweep, exp, options, eval_separately=True).results == []


@pytest.mark.parametrize("argv, message", [
    (["sweep", "CONFIG", "--cluster", "slurm", "--out", "OUT"], "srun"),
    (["sweep", "CONFIG", "--cluster", "local", "--out", "OUT", "--max-parallel", "0"], "--max-parallel"),
    (["sweep", "CONFIG", "--cluster", "local", "--out", "OUT", "--gpus", "a,b"], "--gpus"),
    (["status", "OUT"], "does not exist"),
])
def test_bad_sweep_input_is_one_line_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no srun (nor any Slurm command)
    config = tmp_path / "c.toml"
    config.write_text("[sweep]\nn = [4]\n")
    argv = [str(config) if a == "CONFIG" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    argv += sets(TINY_GRID) if argv[0] == "sweep" else []
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith(f"diffmem {argv[0]}: error:")
