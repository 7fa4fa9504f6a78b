"""`diffmem sweep --cluster slurm` on a real one-node Slurm cluster that this module starts (tests/slurm_cluster.py:
slurmctld + slurmd as child processes, no slurmdbd, so no sacct): a grid run to done with status while it runs and
`analyze` after; `scontrol requeue` and a 1-minute time limit, both continuing from state.pt to the weights of a
straight run; scancel and the resubmission of what is unfinished; a failing and an out-of-memory job that no wait
hangs on; a CPU-only partition that gets no GPU request.

Skipped, with the package to install, where Slurm is absent (Debian: apt-get install slurm-wlm). Tiny CPU runs; the
lengths of the requeued and time-limited runs are measured in seconds of this machine (``step_rate``).
"""
from __future__ import annotations

import re
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from diffmem.cli import main
from diffmem.rundir import RunDir
from diffmem.cluster.base import ClusterOptions
from diffmem.cluster.slurm import forget_slurm_states, job_gpus
from diffmem.jobrecords import read_job, read_submissions
from diffmem.cluster.runstate import experiment_status, run_status
from diffmem.status import format_status
from diffmem.train import train
from slurm_cluster import start_cluster, unavailable
from tiny_runs import TINY_GRID, sets, tiny_config

REASON = unavailable()
# one xdist worker runs every test here, against the one cluster its session starts
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.xdist_group("slurm")]


# --- the cluster and helpers -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One fresh one-node cluster for the session, stopped (and checked to leave no process) at its end."""
    started = start_cluster(tmp_path_factory.mktemp("slurm") / "cluster")
    yield started
    started.stop()
    assert started.leftover_pids() == [], "the test cluster left processes running"


LIMITED = "limit"  # the experiment folder of the time-limited sweep, and so its job name "diffmem-limit"


@pytest.fixture
def slurm(cluster, monkeypatch):
    """The cluster, with every Slurm command of this test (in this process and its jobs) pointed at it; the test's
    jobs are cancelled after it (the time-limited job of ``time_limited`` runs on across tests)."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    forget_slurm_states()
    yield cluster
    cluster.cancel_all(keep=(f"diffmem-{LIMITED}",))  # a failing test leaves no job behind for the next one
    forget_slurm_states()


@pytest.fixture(scope="module")
def step_rate():
    """Optimizer steps per second of a tiny grid run here (one thread), from the difference of two short runs, each
    the fastest of 3: a rate measured low (a busy moment) makes the time-limited run end before its signal."""
    def timed(steps: int, folder: Path) -> float:
        cfg = tiny_config("data.n=8", "model.width=8", f"train.steps={steps}", "eval.inline=false", base=TINY_GRID)
        start = time.perf_counter()
        train(cfg, folder, progress=False, log=lambda _m: None)
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        short = min(timed(20, Path(tmp) / f"a{i}") for i in range(3))
        long = min(timed(100, Path(tmp) / f"b{i}") for i in range(3))
    return 80 / max(long - short, 0.05)


@pytest.fixture(scope="module")
def time_limited(cluster, step_rate, tmp_path_factory):
    """A sweep of one run that needs about 90 s of this machine's training under a 1-minute time limit, USR2 10 s
    before it. Slurm checks time limits every 30 s and signals up to 30 s early, so the first signal comes 20 to 50 s
    after the job starts; 90 s keeps the run going past 50 s even when the job trains 1.8x faster than the measured
    step rate (measured beside other tests on a loaded machine, it once came out 1.6x low and the run ended first). Submitted by the first test that asks for it, so that this minute runs
    alongside that test; checked by the time-limit test."""
    folder = tmp_path_factory.mktemp("time_limited")
    steps = max(600, int(step_rate * 90))
    config, exp = experiment(folder, LIMITED, [8]), folder / LIMITED
    argv = sweep_argv(config, exp, "--set", f"train.steps={steps}", "--time", str(1 / 60), "--signal-delay-s", "10")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(cluster.conf))
        mp.setenv("OMP_NUM_THREADS", "1")
        assert main(argv) == 0
    forget_slurm_states()
    return argv, exp / "n00008_w08_s0", steps


def experiment(tmp_path: Path, name: str, n: list[int]) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[sweep]\nn = {n}\nwidth = [8]\nseeds = [0]\n")
    return path


def sweep_argv(config: Path, exp: Path, *extra: str) -> list[str]:
    return ["sweep", str(config), "--cluster", "slurm", "--out", str(exp), "--no-progress", *sets(TINY_GRID), *extra]


def run_cfg(n: int, *extra: str):
    return tiny_config(f"data.n={n}", "model.width=8", *extra, base=TINY_GRID)


def states(exp: Path) -> dict[str, str]:
    forget_slurm_states()
    return {r.name: r.state for r in experiment_status(exp)}


def wait_for(condition, timeout: float, what: str, cluster=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + ("\n" + cluster.log_tail() if cluster else ""))


def job_log(run_dir: Path) -> str:
    """Every log of every job submitted for the run (stdout and stderr)."""
    text = []
    for sub in read_submissions(run_dir):
        for key in ("stdout", "stderr"):
            path = Path(sub[key])
            text.append(path.read_text(errors="replace") if path.exists() else "")
    return "\n".join(text)


def assert_same_run(a: Path, b: Path) -> None:
    """Same final weights and optimizer state, and the same metrics apart from timings."""
    sa, sb = (torch.load(Path(p) / "state.pt", weights_only=False) for p in (a, b))
    for key in ("model", "ema"):
        if key in sa:
            assert sa[key].keys() == sb[key].keys()
            assert all(torch.equal(sa[key][k], sb[key][k]) for k in sa[key]), f"{key} weights differ"
    ma, mb = (RunDir(p).metrics() for p in (a, b))
    strip = [[{k: v for k, v in r.items() if not k.endswith("_s")} for r in m] for m in (ma, mb)]
    assert strip[0] == strip[1] and len(ma) >= 2


def capture_main(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().out


# --- the tests ----------------------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_grid_runs_to_done_status_shows_states_and_job_ids_then_analyze(slurm, time_limited, tmp_path, capsys):
    """(time_limited: its job runs alongside, so this array gets the node's other core.)"""
    config, exp = experiment(tmp_path, "grid", [4, 8, 12]), tmp_path / "grid"
    argv = sweep_argv(config, exp)
    code, dry = capture_main(capsys, argv + ["--dry-run"])
    assert code == 0 and "0 GPU(s) each" in dry and not exp.exists()
    code, out = capture_main(capsys, argv)
    assert code == 0 and len(re.findall(r"train job \d+_\d: submitted", out)) == 3, out
    ids = {p.name: read_submissions(p)[0]["job_id"] for p in sorted(exp.iterdir()) if p.is_dir() and
           not p.name.startswith(".")}
    array = {i.split("_")[0] for i in ids.values()}
    assert len(ids) == 3 and len(array) == 1 and sorted(i.split("_")[1] for i in ids.values()) == ["0", "1", "2"]
    # the script Slurm holds is the one the dry run printed; and it asks for no GPU
    script = slurm.run("scontrol", "write", "batch_script", array.pop(), "-").stdout
    assert script.strip() and script.strip() in dry, script
    assert "gpu" not in script.lower()
    assert "gres/gpu" not in slurm.run("scontrol", "show", "job", "-o", next(iter(ids.values()))).stdout
    # while it runs: running (or queued) with the job id, in the table
    seen = wait_for(lambda: "running" in states(exp).values() and states(exp), 90, "a running run", slurm)
    assert set(seen.values()) <= {"queued", "running", "done"}
    code, table = capture_main(capsys, ["status", str(exp)])
    assert code == 0 and "running" in table and all(i in table for i in ids.values()), table
    # --wait follows the jobs already submitted (nothing new to submit) to their end
    code, out = capture_main(capsys, argv + ["--wait"])
    assert code == 0 and "done at step 20" in out, out
    rows = experiment_status(exp)
    assert [(r.name, r.state, r.step, r.job_id) for r in rows] == [(n, "done", 20, ids[n]) for n in sorted(ids)]
    code, table = capture_main(capsys, ["status", str(exp)])
    assert "3 runs: 3 done" in table and all(f"{i}_0_log.out" in table for i in ids.values())
    code, out = capture_main(capsys, ["analyze", str(exp), "--no-figures"])
    assert code == 0 and (exp / "summary.csv").is_file() and "3 run(s)" in out
    code, out = capture_main(capsys, argv)
    assert code == 0 and "0 to submit" in out


@pytest.mark.timeout(420)
def test_scontrol_requeue_and_a_time_limit_continue_from_state_to_a_straight_runs_weights(slurm, time_limited,
                                                                                          tmp_path, capsys, step_rate):
    """A run whose job is requeued with `scontrol requeue` while training, and the run of ``time_limited``, which
    reaches its 1-minute time limit: both end with the weights and metrics of the same runs trained straight."""
    lim_argv, lim_run, long = time_limited
    short = max(150, int(step_rate * 10))  # ~10 s of training: still training when the SIGKILL comes (KillWait)
    req_config, req_exp = experiment(tmp_path, "requeue", [4]), tmp_path / "requeue"
    req_argv = sweep_argv(req_config, req_exp, "--set", f"train.steps={short}")
    assert capture_main(capsys, req_argv)[0] == 0
    req_run = req_exp / "n00004_w08_s0"
    req_job = read_submissions(req_run)[0]["job_id"]
    lim_job = read_submissions(lim_run)[0]["job_id"]
    assert "TimeLimit=00:01:00" in slurm.run("scontrol", "show", "job", lim_job).stdout

    requeued = []

    def requeue_when_training():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (req_run / "checkpoints").is_dir():
            time.sleep(0.1)
        time.sleep(2.0)  # some steps past the first checkpoint
        requeued.append(slurm.run("scontrol", "requeue", req_job, check=False))

    thread = threading.Thread(target=requeue_when_training, daemon=True)
    thread.start()
    # meanwhile, the same runs uninterrupted, in this process
    train(run_cfg(4, f"train.steps={short}"), tmp_path / "straight_req", progress=False, log=lambda _m: None)
    thread.join(timeout=130)
    assert requeued and requeued[0].returncode == 0, requeued and requeued[0].stderr
    train(run_cfg(8, f"train.steps={long}"), tmp_path / "straight_lim", progress=False, log=lambda _m: None)

    code, out = capture_main(capsys, req_argv + ["--wait"])  # follows the job if it still runs
    assert code == 0 and run_status(req_run).state == "done", out
    log = job_log(req_run)
    saved = re.search(r"SIGTERM: saved state at step (\d+)", log)
    assert saved and int(saved[1]) > 1, log[-3000:]
    assert f"resuming at step {saved[1]}" in log and "DUE TO JOB REQUEUE" in log
    assert_same_run(req_run, tmp_path / "straight_req")

    code, out = capture_main(capsys, lim_argv + ["--wait"])
    log = job_log(lim_run)
    assert code == 0 and run_status(lim_run).state == "done", out
    assert len(read_submissions(lim_run)) == 1, f"{out}\n{read_submissions(lim_run)}\n{read_job(lim_run)}\n{log[-6000:]}"
    signalled = [int(s) for s in re.findall(r"SIGUSR2 at step (\d+), state saved", log)]
    assert signalled and "this job is timed-out" in log and "Requeued job" in log, log[-3000:]
    assert all(f"resuming at step {s}" in log for s in signalled if s > 0)
    assert read_job(lim_run)["outcome"] == "done" and len(read_submissions(lim_run)) == 1
    assert_same_run(lim_run, tmp_path / "straight_lim")


@pytest.mark.timeout(300)
def test_scancel_is_cancelled_nothing_done_and_the_same_command_resubmits_only_the_unfinished(slurm, tmp_path,
                                                                                             capsys, step_rate):
    steps = max(120, int(step_rate * 5))  # the cancelled job trains on for KillWait (2 s) after SIGTERM
    config, exp = experiment(tmp_path, "cancel", [4, 8, 12]), tmp_path / "cancel"
    argv = sweep_argv(config, exp, "--set", f"train.steps={steps}", "--max-parallel", "2")
    assert capture_main(capsys, argv)[0] == 0
    names = ["n00004_w08_s0", "n00008_w08_s0", "n00012_w08_s0"]
    ids = [read_submissions(exp / n)[0]["job_id"] for n in names]
    # the second run has started training (its job wrote job.json), the third waits for a slot (%2)
    wait_for(lambda: (read_job(exp / names[1]) or {}).get("job_id") == ids[1], 90, "the second job to start", slurm)
    assert states(exp)[names[2]] == "queued"
    slurm.run("scancel", ids[1], ids[2])
    wait_for(lambda: [states(exp)[n] for n in names[1:]] == ["cancelled", "cancelled"], 60, "cancelled", slurm)
    wait_for(lambda: states(exp)[names[0]] == "done", 120, "the first run to finish", slurm)
    wait_for(lambda: not set(slurm.jobs()) & set(ids), 60, "the cancelled jobs to leave the queue", slurm)
    code, table = capture_main(capsys, ["status", str(exp)])
    assert "3 runs: 2 cancelled, 1 done" in table and "rerun the same `diffmem sweep` command" in table, table
    for name in names[1:]:
        assert not RunDir(exp / name).is_done()
    # the same command again: only the two cancelled runs, continued
    code, out = capture_main(capsys, argv + ["--wait"])
    assert code == 0 and "2 to submit" in out and out.count(f"done at step {steps}") == 2, out
    assert [len(read_submissions(exp / n)) for n in names] == [1, 2, 2]
    assert states(exp) == dict.fromkeys(names, "done")


@pytest.mark.timeout(200)
def test_failed_and_out_of_memory_jobs_end_every_wait_and_status_says_why(slurm, tmp_path, capsys):
    fail_config, fail_exp = experiment(tmp_path, "fail", [80]), tmp_path / "fail"  # n = 80 > the 64 images
    oom_config, oom_exp = experiment(tmp_path, "oom", [8]), tmp_path / "oom"
    assert capture_main(capsys, sweep_argv(oom_config, oom_exp, "--mem-gb", "0.15"))[0] == 0
    start = time.monotonic()
    code, out = capture_main(capsys, sweep_argv(fail_config, fail_exp, "--wait"))
    assert code == 1 and "failed: DataError: data.n = 80 is larger than the training part" in out, out
    code, out = capture_main(capsys, sweep_argv(oom_config, oom_exp, "--mem-gb", "0.15", "--wait"))
    assert code == 1 and "exceeded its memory limit" in out and "raise --mem-gb" in out, out
    assert time.monotonic() - start < 90
    rows = {r.name: r for r in experiment_status(fail_exp) + experiment_status(oom_exp)}
    assert rows["n00080_w08_s0"].state == "failed" and "DataError" in rows["n00080_w08_s0"].error
    assert rows["n00008_w08_s0"].state == "failed" and "exceeded its memory limit" in rows["n00008_w08_s0"].error
    assert "MB >" in rows["n00008_w08_s0"].error
    table = format_status(list(experiment_status(oom_exp)), oom_exp)
    assert "n00008_w08_s0 failed: Slurm:" in table and "log: .submitit/" in table


def test_jobs_slurm_no_longer_knows_are_read_from_their_records(slurm, tmp_path):
    """Without slurmdbd a job leaves scontrol MinJobAge after it ended and sacct knows nothing: status then reads
    the run's own records instead of waiting or guessing "queued"."""
    from diffmem.jobrecords import record_job_signal, record_job_start, record_submission

    assert slurm.run("sacct", check=False).returncode != 0  # no accounting database here
    for name, signalled in (("n00004_w08_s0", True), ("n00008_w08_s0", False), ("n00012_w08_s0", None)):
        run = tmp_path / "exp" / name
        run.mkdir(parents=True)
        record_submission(run, job_id="987654", cluster="slurm", kind="train", steps=20, stdout=None, stderr=None)
        if signalled is not None:
            record_job_start(run, "train", "987654")
            if signalled:
                record_job_signal(run, "SIGTERM")
    rows = {r.name: r for r in experiment_status(tmp_path / "exp")}
    assert rows["n00004_w08_s0"].state == "cancelled"
    assert rows["n00008_w08_s0"].state == "failed" and "without reporting an end" in rows["n00008_w08_s0"].error
    assert rows["n00012_w08_s0"].state == "new"  # submitted, never started, gone: nothing to continue from


def test_a_cpu_partition_gets_no_gpu_request_unless_asked(slurm, tmp_path, capsys):
    cpu = run_cfg(8).train.device  # job_gpus reads the runs' train.device
    assert cpu == "cpu"
    auto, cuda = "auto", "cuda"
    assert job_gpus(ClusterOptions("slurm"), [auto]) == 0  # sinfo: partition "cpu" has no GPUs
    assert job_gpus(ClusterOptions("slurm", partition="nosuchpartition"), [auto]) == 1  # unknown: the default
    assert job_gpus(ClusterOptions("slurm"), [cpu]) == 0 and job_gpus(ClusterOptions("slurm"), [cuda]) == 1
    assert job_gpus(ClusterOptions("slurm", gpus_per_job=2), [cpu]) == 2
    assert job_gpus(ClusterOptions("slurm", slurm_options=(("gres", "gpu:1"),)), [cuda]) == 0
    config, exp = experiment(tmp_path, "gpu", [8]), tmp_path / "gpu"
    code, out = capture_main(capsys, sweep_argv(config, exp, "--set", 'train.device="auto"', "--dry-run"))
    assert code == 0 and "0 GPU(s) each" in out and "gpus-per-node" not in out
    # asking for a GPU on this partition: sbatch refuses, in one line that says what to pass
    code = main(sweep_argv(config, exp, "--gpus-per-job", "1"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Invalid generic resource" in err, err
    assert "--gpus-per-job 0" in err
    assert run_status(exp / "n00008_w08_s0").state == "new"
    assert not list((exp / ".submitit").glob("*.pkl"))  # nothing left half-submitted

