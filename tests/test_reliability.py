"""Reliability: the run lock, damaged state and checkpoint files, divergence, failed writes, and a SIGKILL campaign.

The campaign kills a real `diffmem train` process at seeded random moments (some while a checkpoint or state file is
being written, some right after a metrics line was appended), reruns the same command each time, and checks that the
run ends exactly as an uninterrupted one: every evaluation step once in metrics.jsonl, identical numbers (timing keys
aside) and bit-identical weights. 5 kills run by default; 20 kills with --runslow.
"""
from __future__ import annotations

import errno
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import diffmem.io
from diffmem.cli import main
from diffmem.config import load_config
from diffmem.diffusion import Diffusion
from diffmem.evaluate import CheckpointDamaged, evaluate_run
from diffmem.io import WriteFailed, atomic_torch_save
from diffmem.rundir import RunDir, RunLock, RunLocked
from diffmem.eval_grid import evaluation_steps
from diffmem.rundir import StateDamaged
from diffmem.train import TrainingDiverged, train
from diffmem.cluster.runstate import run_status
from tiny_runs import TINY, sets, tiny_config



def timing_free(records):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def one_line_error(capsys, verb: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"diffmem {verb}: error:"), err
    return err


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text("")
    return path


# --- the run lock ------------------------------------------------------------------------------------------------

HOLD_LOCK = ("import sys; from diffmem.rundir import RunDir, RunLock; RunLock(RunDir(sys.argv[1])).acquire(); "
             "print('held', flush=True); sys.stdin.read()")


@pytest.mark.e2e
def test_a_second_process_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=rf"in use by pid {holder.pid} on host {socket.gethostname()} since "):
            train(tiny_config("eval.inline=false", "train.steps=3"), run, progress=False)
        config = write_config(tmp_path)
        assert main(["train", str(config), "--out", str(run), "--no-progress", *sets(TINY)]) == 2
        assert f"pid {holder.pid}" in one_line_error(capsys, "train")
        assert not RunDir(run).config_path.exists()  # the refused process wrote nothing
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead (SIGKILL: it could not release): its lock is stale and taken over
    assert RunDir(run).lock_path.exists()
    with pytest.warns(UserWarning, match=rf"stale lock of pid {holder.pid}.*dead"):
        assert train(tiny_config("eval.inline=false", "train.steps=3"), run, progress=False).status == "done"
    assert not RunDir(run).lock_path.exists()


def write_foreign_lock(run: RunDir, host: str, pid: int, age_s: float, started_unix: float | None = None) -> None:
    run.path.mkdir(parents=True, exist_ok=True)
    info = {"pid": pid, "host": host, "started": "2026-01-01T00:00:00+00:00", "token": "f" * 32}
    if started_unix is not None:
        info["started_unix"] = started_unix
    run.lock_path.write_text(json.dumps(info))
    past = time.time() - age_s
    os.utime(run.lock_path, (past, past))


def test_a_lock_from_another_host_is_stale_only_when_its_heartbeat_is_old(tmp_path):
    run = RunDir(tmp_path / "run")
    write_foreign_lock(run, "node-17", pid=4242, age_s=60)  # heartbeat a minute ago: the holder may be alive
    with pytest.raises(RunLocked, match=r"pid 4242 on host node-17 since 2026-01-01"):
        RunLock(run).acquire()
    write_foreign_lock(run, "node-17", pid=4242, age_s=11 * 60)  # a requeued job on another node: old job gone
    with pytest.warns(UserWarning, match=r"heartbeat is 6\d\d s old"):
        lock = RunLock(run).acquire()
    try:
        assert json.loads(run.lock_path.read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not run.lock_path.exists()


def test_a_lock_left_by_an_earlier_process_with_our_pid_is_stale(tmp_path):
    run = RunDir(tmp_path / "run")
    write_foreign_lock(run, socket.gethostname(), pid=os.getpid(), age_s=5, started_unix=0.0)
    with pytest.warns(UserWarning, match="earlier process"):
        with RunLock(run):
            assert json.loads(run.lock_path.read_text())["token"] != "f" * 32
    with RunLock(run):  # while this process holds it, a second lock of the same process is refused
        with pytest.raises(RunLocked):
            RunLock(run).acquire()


def test_the_heartbeat_refreshes_the_lock_and_notices_a_takeover(tmp_path):
    run = RunDir(tmp_path / "run")
    lock = RunLock(run, heartbeat_s=0.05, stale_s=5).acquire()
    try:
        past = time.time() - 100
        os.utime(run.lock_path, (past, past))
        time.sleep(0.3)
        assert time.time() - run.lock_path.stat().st_mtime < 2
        lock.check()
        write_foreign_lock(run, "node-3", pid=7, age_s=0)  # somebody else took it over (we were presumed dead)
        time.sleep(0.3)
        with pytest.raises(RunLocked, match="now belongs to pid 7 on host node-3"):
            lock.check()
    finally:
        lock.release()
    assert run.lock_path.exists()  # not ours any more: left alone


@pytest.mark.e2e
def test_the_lock_is_released_on_every_way_out_of_train(tmp_path, monkeypatch):
    cfg = tiny_config("eval.inline=false")
    run = RunDir(tmp_path / "run")
    assert train(cfg, run.path, progress=False, stop_at_step=5).status == "interrupted"
    assert not run.lock_path.exists()
    monkeypatch.setattr(Diffusion, "loss", lambda self, model, x0, generator=None, **kw: torch.tensor(
        float("nan"), requires_grad=True))
    with pytest.raises(TrainingDiverged):
        train(cfg, run.path, progress=False)
    assert not run.lock_path.exists()
    monkeypatch.undo()
    assert train(cfg, run.path, progress=False).status == "done"
    assert not run.lock_path.exists()
    assert evaluate_run(run.path, device="cpu", log=lambda _: None) == run.checkpoint_steps()
    assert not run.lock_path.exists()


# --- damaged state and checkpoint files ---------------------------------------------------------------------------

def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.e2e
def test_a_damaged_state_falls_back_to_the_previous_one_and_ends_bit_identical(tmp_path):
    cfg = tiny_config("eval.inline=false")
    train(cfg, tmp_path / "straight", progress=False)
    run = RunDir(tmp_path / "cut")
    train(cfg, run.path, progress=False, stop_at_step=23)
    assert torch.load(run.state_prev_path, weights_only=False)["step"] < 23  # the state before the last one
    truncate(run.state_path)
    with pytest.warns(UserWarning, match=r"state\.pt is damaged.*resuming from the previous state .*state\.prev\.pt"):
        assert train(cfg, run.path, progress=False).status == "done"
    assert_same_weights(weights(tmp_path / "straight" / "state.pt"), weights(run.state_path))
    assert (run.path / "state.damaged.pt").exists()  # kept for inspection, out of the way of the next saves


@pytest.mark.e2e
def test_no_readable_state_stops_with_one_line_naming_the_file(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    config = write_config(tmp_path)
    argv = ["train", str(config), "--out", str(run.path), "--no-progress", *sets(TINY + ["eval.inline=false"])]
    train(tiny_config("eval.inline=false"), run.path, progress=False, stop_at_step=23)
    truncate(run.state_path)
    run.state_prev_path.write_bytes(b"not a zip")
    with pytest.raises(StateDamaged, match=r"cannot resume .*state\.pt is damaged"):
        train(tiny_config("eval.inline=false"), run.path, progress=False)
    assert main(argv) == 2
    err = one_line_error(capsys, "train")
    assert str(run.state_path) in err and "damaged" in err and "state.prev.pt" in err
    # checkpoints without any state: refused too, never a silent restart from step 0
    run.state_path.unlink()
    run.state_prev_path.unlink()
    assert main(argv) == 2
    assert "has checkpoints but neither state.pt nor state.prev.pt" in one_line_error(capsys, "train")
    assert not run.is_done()


@pytest.mark.e2e
def test_a_damaged_checkpoint_is_a_one_line_error_naming_it(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    train(tiny_config("eval.inline=false"), run.path, progress=False)
    damaged = run.checkpoint_path(run.checkpoint_steps()[1])
    truncate(damaged)
    with pytest.raises(CheckpointDamaged, match=str(damaged)):
        evaluate_run(run.path, device="cpu", log=lambda _: None)
    assert main(["evaluate", str(run.path)]) == 2
    assert str(damaged) in one_line_error(capsys, "evaluate")
    assert [r["step"] for r in run.metrics()] == run.checkpoint_steps()[:1]  # the good one before it was kept
    assert not run.lock_path.exists()


# --- divergence ---------------------------------------------------------------------------------------------------

@pytest.mark.e2e
def test_a_nan_loss_names_its_step_keeps_the_last_good_state_and_marks_nothing_done(tmp_path, monkeypatch):
    cfg = tiny_config()
    run = RunDir(tmp_path / "run")
    real_loss, calls = Diffusion.loss, []

    def loss_that_turns_nan_at_step_37(self, model, x0, generator=None, **kw):
        value = real_loss(self, model, x0, generator=generator, **kw)
        if kw:  # an evaluation's fixed-time loss, not a training step
            return value
        calls.append(1)
        return value * float("nan") if len(calls) >= 37 else value

    monkeypatch.setattr(Diffusion, "loss", loss_that_turns_nan_at_step_37)
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 37; .*state\.pt keeps the last good state"):
        train(cfg, run.path, progress=False)
    good = max(s for s in evaluation_steps(cfg.eval.times, cfg.train.steps) if s < 37)
    state = torch.load(run.state_path, weights_only=False)
    assert state["step"] == good and all(torch.isfinite(v).all() for v in state["model"].values())
    assert not run.is_done() and not run.lock_path.exists()
    assert max(run.evaluated_steps()) == good
    status = run_status(run.path)
    assert status.state == "failed" and "step 37" in status.error  # `diffmem status` marks it failed


@pytest.mark.e2e
def test_a_huge_sgd_learning_rate_diverges_with_a_one_line_error(tmp_path, capsys):
    config = write_config(tmp_path)
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--no-progress",
                 *sets(TINY + ["train.optimizer=sgd", "train.lr=1e6", "eval.inline=false"])]) == 2
    err = one_line_error(capsys, "train")
    assert "training diverged" in err and " at step " in err
    assert not RunDir(out).is_done()
    state = torch.load(RunDir(out).state_path, weights_only=False)
    assert all(torch.isfinite(v).all() for v in state["model"].values())


# --- failed writes ------------------------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell which file is being synced")
def test_disk_full_while_saving_state_is_one_line_and_keeps_the_previous_state(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path)
    run = RunDir(tmp_path / "run")
    argv = ["train", str(config), "--out", str(run.path), "--no-progress", *sets(TINY + ["eval.inline=false"])]
    train(tiny_config("eval.inline=false"), run.path, progress=False, stop_at_step=23)
    before = run.state_path.read_bytes()
    real_fsync = os.fsync

    def fsync_on_a_full_disk_for_state_files(fd):
        """The disk fills up while the new state.pt is being written (its temp file ``.state.pt.*.tmp``)."""
        if ".state.pt." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(diffmem.io.os, "fsync", fsync_on_a_full_disk_for_state_files)
    assert main(argv) == 2
    err = one_line_error(capsys, "train")
    assert f"could not write {run.state_path}: No space left on device (ENOSPC)" in err and "free disk" in err
    monkeypatch.setattr(diffmem.io.os, "fsync", real_fsync)
    assert run.state_path.read_bytes() == before and not run.is_done() and not run.lock_path.exists()
    assert not [p for p in run.path.rglob(".*") if p.name.endswith(".tmp")]  # no half-written temp files
    assert main(argv) == 0 and run.is_done()  # space freed: the same command finishes the run


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_a_read_only_run_folder_is_one_line_and_keeps_the_state(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    train(tiny_config("eval.inline=false"), run.path, progress=False, stop_at_step=23)
    before = run.state_path.read_bytes()
    run.path.chmod(0o555)
    try:
        config = write_config(tmp_path)
        assert main(["train", str(config), "--out", str(run.path), "--no-progress",
                     *sets(TINY + ["eval.inline=false"])]) == 2
        assert "make the folder writable" in one_line_error(capsys, "train")
    finally:
        run.path.chmod(0o755)
    assert run.state_path.read_bytes() == before


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "state.pt"
    atomic_torch_save(target, {"step": 1})
    real_replace = os.replace

    def replace_on_a_read_only_file_system(src, dst):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(diffmem.io.os, "replace", replace_on_a_read_only_file_system)
    with pytest.raises(WriteFailed, match=r"could not write .*state\.pt: Read-only file system \(EROFS\)"):
        atomic_torch_save(target, {"step": 2}, keep_previous=tmp_path / "state.prev.pt")
    monkeypatch.setattr(diffmem.io.os, "replace", real_replace)
    assert torch.load(target)["step"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


# --- a step evaluated before a crash is not evaluated again ------------------------------------------------------

@pytest.mark.e2e
def test_a_resume_from_an_older_state_does_not_evaluate_a_step_twice(tmp_path):
    cfg = tiny_config()
    train(cfg, tmp_path / "straight", progress=False)
    run = RunDir(tmp_path / "cut")
    steps = evaluation_steps(cfg.eval.times, cfg.train.steps)
    before, at = steps[-3], steps[-2]
    train(cfg, run.path, progress=False, stop_at_step=before + 2)
    older = run.state_path.read_bytes()
    train(cfg, run.path, progress=False, stop_at_step=at + 1)  # evaluates step `at`
    # as if the state written at step `at` had been lost: resume from the older state, retrain through `at`
    run.state_path.write_bytes(older)
    run.state_prev_path.unlink()
    assert train(cfg, run.path, progress=False).status == "done"
    assert [r["step"] for r in run.metrics()] == steps
    assert timing_free(run.metrics()) == timing_free(RunDir(tmp_path / "straight").metrics())
    assert_same_weights(weights(tmp_path / "straight" / "state.pt"), weights(run.state_path))


@pytest.mark.e2e
def test_a_metrics_line_cut_short_by_a_crash_is_evaluated_again_once(tmp_path):
    cfg = tiny_config()
    train(cfg, tmp_path / "straight", progress=False)
    run = RunDir(tmp_path / "cut")
    steps = evaluation_steps(cfg.eval.times, cfg.train.steps)
    train(cfg, run.path, progress=False, stop_at_step=steps[-2] + 1)
    text = run.metrics_path.read_text()
    cut = text[: len(text) - len(text.splitlines()[-1]) // 2 - 1]
    run.metrics_path.write_text(cut)  # killed mid-append
    with pytest.warns(UserWarning, match="truncated last line"), pytest.warns(UserWarning, match="moved it to"):
        assert train(cfg, run.path, progress=False).status == "done"
    (aside,) = run.path.glob("metrics.jsonl.torn-*")  # the cut line is kept aside, never deleted
    assert aside.read_text() == cut[cut.rfind("\n") + 1:]
    assert [r["step"] for r in run.metrics()] == steps
    assert timing_free(run.metrics()) == timing_free(RunDir(tmp_path / "straight").metrics())


# --- the SIGKILL campaign -----------------------------------------------------------------------------------------

# the same thread count in the killed subprocess and in this process, whatever an earlier test left it at: float
# reductions (training and the FD's features) depend on it; one thread, as the other worker of the suite runs beside
CAMPAIGN = [o for o in TINY if not o.startswith(("train.steps=", "eval.times="))] + ["train.num_threads=1"]


def _temp_files(run: RunDir) -> set[str]:
    names = set()
    for folder in (run.path, run.checkpoint_dir):
        try:
            names |= {e.name for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(".tmp")}
        except FileNotFoundError:
            pass
    return names


def _lock_pid(run: RunDir) -> int | None:
    try:
        return json.loads(run.lock_path.read_text()).get("pid")
    except (OSError, ValueError):
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


KILL_MOMENTS = ("now", "checkpoint", "state", "append")


def _kill_at(proc: subprocess.Popen, run: RunDir, moment: str, delay_s: float, limit_s: float) -> str | None:
    """Wait until ``proc`` holds the run's lock, then ``delay_s`` more, then SIGKILL it at ``moment``: "now",
    "checkpoint" / "state" (as soon as the temp file of a checkpoint / state.pt write appears, i.e. mid-write) or
    "append" (right after metrics.jsonl grew; a checkpoint or state write missed by the polling ends its wait there
    too). Returns what the kill hit, or None when the process ended first."""
    deadline = time.time() + 120
    while _lock_pid(run) != proc.pid:
        if proc.poll() is not None or time.time() > deadline:
            return None
        time.sleep(0.002)
    time.sleep(delay_s)
    old_temps, old_size = _temp_files(run), _size(run.metrics_path)
    hit, give_up = "at a random moment", time.time() + limit_s
    while moment != "now" and time.time() < give_up and proc.poll() is None:
        new = _temp_files(run) - old_temps
        if moment in ("checkpoint", "state") and (
                written := [n for n in new if n.startswith(".state.pt.") == (moment == "state")]):
            hit = f"while writing {written[0].split('.')[1]}"
            break
        if _size(run.metrics_path) > old_size:
            # For "checkpoint" / "state": the write was too quick to see (a loaded machine polls late), so kill now
            # rather than let the wait run on: it keeps at most one more evaluation, which the delays count on.
            hit = "right after a metrics append" if moment == "append" else f"after a {moment} write too quick to see"
            break
        time.sleep(0.001)
    if proc.poll() is not None:
        return None
    proc.kill()
    proc.wait()
    return hit


def run_kill_campaign(tmp_path: Path, kills: int, steps: int, times: int, seed: int) -> list[str]:
    """Train the CAMPAIGN config (``steps`` steps, ``times`` evaluations) once straight in this process and once as
    a `diffmem train` subprocess killed ``kills`` times (seeded moments), rerunning the same command after each kill
    and to the end; assert that both runs ended identically. Returns what each kill hit."""
    overrides = CAMPAIGN + [f"train.steps={steps}", f"eval.times={times}"]
    cfg, _ = load_config(None, overrides)
    t0 = time.perf_counter()
    train(cfg, tmp_path / "straight", progress=False, log=lambda _: None)
    straight_s = time.perf_counter() - t0
    run = RunDir(tmp_path / "killed")
    command = [sys.executable, "-m", "diffmem.cli", "train", str(write_config(tmp_path)), "--out", str(run.path),
               "--no-progress", *sets(overrides)]
    rng = random.Random(seed)
    hits: list[str] = []
    for _ in range(3 * kills):
        if len(hits) == kills or run.is_done():
            break
        # Every kill must land before the run ends, whatever the subprocess's speed against the straight run's.
        # A kill keeps at most the progress up to the last state.pt, written at each evaluation: the random delay
        # is a third of the remaining work shared among the kills still to land, and a wait for a moment lasts at
        # most one evaluation interval (one always passes in it) and keeps at most one more evaluation, so a
        # moment is only drawn while more evaluations remain than kills.
        evaluated = len(run.evaluated_steps())
        to_land, left = kills - len(hits), times - evaluated
        delay_s = rng.uniform(0, straight_s * left / times / (3 * to_land))
        moment = rng.choice(KILL_MOMENTS) if left > to_land else "now"
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            hit = _kill_at(proc, run, moment, delay_s, limit_s=1.5 * straight_s / times)
        finally:
            if proc.poll() is None:
                proc.kill()
            _, stderr = proc.communicate()
        if hit is None:
            assert proc.returncode == 0, stderr.decode()[-2000:]
        else:
            hits.append(hit)
    final = subprocess.run(command, capture_output=True, text=True)
    assert final.returncode == 0, final.stderr[-2000:]
    assert run.is_done() and not run.lock_path.exists() and not _temp_files(run)
    expected_steps = evaluation_steps(cfg.eval.times, cfg.train.steps)
    assert [r["step"] for r in run.metrics()] == expected_steps  # every evaluation step exactly once, in order
    assert timing_free(run.metrics()) == timing_free(RunDir(tmp_path / "straight").metrics())
    assert_same_weights(weights(tmp_path / "straight" / "state.pt"), weights(run.state_path))
    for step in expected_steps:
        assert_same_weights(weights(RunDir(tmp_path / "straight").checkpoint_path(step)),
                            weights(run.checkpoint_path(step)))
    return hits


@pytest.mark.e2e
def test_a_run_killed_5_times_ends_like_an_uninterrupted_one(tmp_path):
    hits = run_kill_campaign(tmp_path, kills=5, steps=80, times=6, seed=0)
    assert len(hits) >= 4, hits  # the run may finish before the last kill lands


@pytest.mark.slow
def test_a_run_killed_20_times_ends_like_an_uninterrupted_one(tmp_path):
    hits = run_kill_campaign(tmp_path, kills=20, steps=300, times=14, seed=1)
    assert len(hits) >= 16, hits
    assert {"while writing state", "right after a metrics append"} <= set(hits), hits
    assert any(h.startswith("while writing step_") for h in hits), hits
