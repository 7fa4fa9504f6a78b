"""The job records of a sweep and ``diffmem status EXPERIMENT_DIR``: where every run of an experiment stands.

Records written next to the run folders (all atomically, see :mod:`diffmem.io`)::

    <experiment_dir>/sweep.json              planned runs of every `diffmem sweep` so far: name -> total steps
    <experiment_dir>/.submitit/              submitit's folder: <job id>_0_log.out / _log.err / _result.pkl, ...
    <experiment_dir>/<run>/submissions.json  every job submitted for the run (by `diffmem sweep`): job id, cluster,
                                             kind ("train" | "evaluate"), time, log paths
    <experiment_dir>/<run>/job.json          the latest job that ran the run (written by the job itself): job id,
                                             host, pid, CUDA_VISIBLE_DEVICES, started, ended, outcome, step, error

A run's state is one of:

* ``done``: trained (``done`` file) and every checkpoint has a metrics line;
* ``running`` / ``queued``: its latest job is alive (same host: its process exists; Slurm: ``sacct`` says so, or,
  without ``sacct``, the job has not reported an end);
* ``failed``: its latest job ended with an error (the last error line is shown);
* ``partial``: trained part of the way (``state.pt`` or checkpoints), or trained but not fully evaluated;
* ``new``: nothing on disk yet.
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem.analysis.runfiles import read_metrics
from diffmem.io import atomic_write_json
from diffmem.metrics.fid import metric_label
from diffmem.rundir import RunDir
from diffmem.schedule import evaluation_steps

SWEEP_FILE = "sweep.json"
SUBMITIT_DIR = ".submitit"
SUBMISSIONS_FILE = "submissions.json"
JOB_FILE = "job.json"

STATES = ("new", "partial", "queued", "running", "failed", "done")
# Slurm job states (sacct) in which a job still holds or waits for its run
_SLURM_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING", "SUSPENDED"}
_SLURM_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


class StatusError(ValueError):
    """An experiment folder that status cannot read; the message says what to pass."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise StatusError(f"{path} is not valid JSON ({e}); delete it (it only records jobs, not results)") from None


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"`` of an exception."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


# --- records written by `diffmem sweep` and by the jobs -----------------------------------------------------------

def record_plan(experiment_dir: str | Path, steps_by_run: dict[str, int]) -> None:
    """Add the runs of a sweep (name -> total optimizer steps) to ``<experiment_dir>/sweep.json``."""
    path = Path(experiment_dir) / SWEEP_FILE
    plan = _read_json(path) or {"runs": {}}
    plan["runs"].update(steps_by_run)
    plan["updated"] = _now()
    atomic_write_json(path, plan)


def record_submission(run_dir: str | Path, *, job_id: str, cluster: str, kind: str, steps: int,
                      stdout: str | None, stderr: str | None) -> None:
    """Append one submitted job to ``<run>/submissions.json`` (written only by the submitting process)."""
    path = Path(run_dir) / SUBMISSIONS_FILE
    records = read_submissions(run_dir)
    records.append({"job_id": job_id, "cluster": cluster, "kind": kind, "steps": steps, "submitted": _now(),
                    "host": socket.gethostname(), "stdout": stdout, "stderr": stderr})
    atomic_write_json(path, {"submissions": records})


def read_submissions(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every job submitted for the run, oldest first ([] if none)."""
    data = _read_json(Path(run_dir) / SUBMISSIONS_FILE)
    return list(data["submissions"]) if data else []


def record_job_start(run_dir: str | Path, kind: str, job_id: str | None) -> None:
    """Written by a job when it starts working on the run: ``<run>/job.json`` describes this job from now on."""
    atomic_write_json(Path(run_dir) / JOB_FILE, {
        "job_id": job_id, "kind": kind, "host": socket.gethostname(), "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "started": _now(),
        "ended": None, "outcome": None, "step": None, "error": None})


def record_job_end(run_dir: str | Path, outcome: str, step: int | None = None, error: str | None = None) -> None:
    """Written by a job when it stops: outcome "done" | "skipped" | "evaluated" | "interrupted" | "requeued" |
    "failed" (with ``error``, one line)."""
    path = Path(run_dir) / JOB_FILE
    job = _read_json(path) or {}
    job.update({"ended": _now(), "outcome": outcome, "step": step, "error": error})
    atomic_write_json(path, job)


def read_job(run_dir: str | Path) -> dict[str, Any] | None:
    """The latest job's record (``<run>/job.json``), or None."""
    return _read_json(Path(run_dir) / JOB_FILE)


# --- the state of one run ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunStatus:
    """Where one run stands. Steps are optimizer steps; ``step`` is the last step saved on disk (a checkpoint or
    the end), ``total`` the planned train.steps (None if unknown)."""

    name: str
    path: Path
    state: str  # one of STATES
    step: int
    total: int | None
    evaluated: int  # checkpoints with a metrics line
    checkpoints: int  # checkpoints saved
    f_mem: float | None  # memorized fraction at the last evaluation
    fid: float | None  # FID (or FD of another extractor, see fid_label) at the last evaluation
    fid_label: str | None  # "FID" or "FD (<extractor>)"
    job_id: str | None  # latest submitted job
    cluster: str | None
    log: str | None  # its stdout log
    error_log: str | None  # its stderr log
    error: str | None  # the last error line when failed
    unevaluated: int = 0  # checkpoints of evaluation steps without a metrics line
    extension: bool = False  # the planned budget exceeds the one the folder was trained with (train to extend)

    @property
    def needs_training(self) -> bool:
        return not RunDir(self.path).is_done() or self.extension

    @property
    def needs_evaluation(self) -> bool:
        return self.unevaluated > 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _slurm_state(job_id: str, experiment_dir: Path) -> str | None:
    """Slurm's state of a job (e.g. "RUNNING"), via submitit's sacct watcher; None where sacct is absent."""
    if shutil.which("sacct") is None:
        return None
    import submitit

    state = submitit.SlurmJob(folder=experiment_dir / SUBMITIT_DIR, job_id=job_id).state.upper()
    return None if state == "UNKNOWN" else state.split()[0]


def result_error(experiment_dir: Path, job_id: str) -> str | None:
    """The last line of the traceback submitit stored for a failed job, or None."""
    import submitit.core.utils as submitit_utils

    path = submitit_utils.JobPaths(experiment_dir / SUBMITIT_DIR, job_id=job_id).result_pickle
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            outcome, value = pickle.load(f)
    except Exception:  # a result written by another submitit version or cut short: not an error of the run
        return None
    if outcome != "error":
        return None
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "the job failed (no traceback)"


def _job_activity(sub: dict[str, Any] | None, job: dict[str, Any] | None,
                  experiment_dir: Path) -> tuple[str | None, str | None]:
    """("running" | "queued" | None, last error line | None) of a run's latest job."""
    if sub is None:  # a job started by hand (e.g. RunJob called in-process), or no job at all
        if job is None:
            return None, None
        if job.get("outcome") is None and job.get("host") == socket.gethostname() and _pid_alive(int(job["pid"])):
            return "running", None
        return None, job.get("error") if job.get("outcome") == "failed" else None
    cluster, job_id = sub["cluster"], sub["job_id"]
    same_job = job is not None and (job.get("job_id") == job_id or
                                    (job.get("job_id") is None and job.get("started", "") >= sub["submitted"]))
    here = sub.get("host") == socket.gethostname()
    if same_job and job.get("outcome") is None:  # started, no end reported
        if job.get("host") == socket.gethostname():
            if _pid_alive(int(job["pid"])):
                return "running", None
        elif cluster == "slurm":
            state = _slurm_state(job_id, experiment_dir)
            if state is None or state in _SLURM_RUNNING:
                return "running", None
            if state in _SLURM_QUEUED:
                return "queued", None
        else:
            return "running", None  # another machine: trust the record
        return None, result_error(experiment_dir, job_id) or "the job stopped without reporting an end (killed?)"
    if same_job and job.get("outcome") != "requeued":  # the job ended
        return None, job.get("error") if job.get("outcome") == "failed" else None
    # not started yet, or requeued and waiting to restart
    if cluster == "local":
        if here and job_id.isdigit() and _pid_alive(int(job_id)):  # a local job id is its controller's pid
            return "queued", None
        return None, result_error(experiment_dir, job_id)
    if cluster == "slurm":
        error = result_error(experiment_dir, job_id)
        if error:
            return None, error
        state = _slurm_state(job_id, experiment_dir)
        if state is None or state in _SLURM_QUEUED:
            return "queued", None
        if state in _SLURM_RUNNING:
            return "running", None
        return None, None
    return None, None  # debug jobs live in the submitting process only


def run_status(run_dir: str | Path, total: int | None = None) -> RunStatus:
    """The state of one run folder (which need not exist yet: then it is "new")."""
    run = RunDir(run_dir)
    experiment_dir = run.path.parent
    meta = _read_json(run.config_path) if run.config_path.exists() else None
    subs = read_submissions(run.path) if run.path.is_dir() else []
    sub = subs[-1] if subs else None
    stored_total = meta["config"]["train"]["steps"] if meta else None
    if stored_total is not None:  # a larger planned budget (a sweep with more steps) is an extension to train
        total = max(total, stored_total) if total is not None else stored_total
    elif total is None and sub:
        total = sub.get("steps")
    checkpoints = run.checkpoint_steps()
    metrics = read_metrics(run.metrics_path)
    metric_steps = {int(r["step"]) for r in metrics}
    # checkpoints with a metrics line; a folder whose checkpoints were removed (e.g. results/) counts its lines
    evaluated = len(metric_steps & set(checkpoints)) if checkpoints else len(metric_steps)
    # checkpoints of evaluation steps without a metrics line (kept checkpoints between evaluations do not count)
    planned = set(evaluation_steps(meta["config"]["eval"]["times"], stored_total)) if meta else set(checkpoints)
    unevaluated = (planned & set(checkpoints)) - metric_steps
    extension = stored_total is not None and total is not None and total > stored_total
    done = run.is_done() and not extension
    step = total if done and total is not None else (checkpoints[-1] if checkpoints else 0)
    activity, error = _job_activity(sub, read_job(run.path) if run.path.is_dir() else None, experiment_dir)
    if done and not unevaluated:
        state, error = "done", None
    elif activity:
        state, error = activity, None
    elif error:
        state = "failed"
    elif run.failed_path.exists():
        state, error = "failed", (run.failed_path.read_text().strip().splitlines() or ["failed"])[0]
    elif run.is_done() or checkpoints or run.state_path.exists():
        state = "partial"
    else:
        state = "new"
    last = metrics[-1] if metrics else {}
    extractor = last.get("fid_extractor")
    return RunStatus(
        name=run.path.name, path=run.path, state=state, step=step, total=total, evaluated=evaluated,
        checkpoints=len(checkpoints), f_mem=last.get("f_mem"), fid=last.get("fid"),
        fid_label=metric_label(extractor) if extractor else None,
        job_id=sub["job_id"] if sub else None, cluster=sub["cluster"] if sub else None,
        log=sub.get("stdout") if sub else None, error_log=sub.get("stderr") if sub else None, error=error,
        unevaluated=len(unevaluated), extension=extension)


def experiment_status(experiment_dir: str | Path) -> list[RunStatus]:
    """Every run of an experiment folder: those planned by `diffmem sweep` (sweep.json) and every run folder on
    disk, sorted by name."""
    root = Path(experiment_dir)
    if not root.is_dir():
        raise StatusError(f"experiment folder '{root}' does not exist; pass the --out folder of `diffmem sweep`")
    planned: dict[str, int] = dict((_read_json(root / SWEEP_FILE) or {}).get("runs", {}))
    for p in root.iterdir():
        if p.is_dir() and ((p / "config.json").is_file() or (p / SUBMISSIONS_FILE).is_file()):
            planned.setdefault(p.name, None)
    if not planned:
        raise StatusError(f"'{root}' holds no runs (no sweep.json and no run folder); pass the --out folder of "
                          "`diffmem sweep`")
    return [run_status(root / name, total) for name, total in sorted(planned.items())]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _relative(path: str | None, root: Path) -> str:
    if not path:
        return "-"
    try:
        return str(Path(path).relative_to(root.absolute()))
    except ValueError:
        return path


def format_status(rows: list[RunStatus], experiment_dir: str | Path) -> str:
    """The status table (one line per run), a count per state, and the error line of every failed run."""
    root = Path(experiment_dir)
    header = ["run", "state", "step/total", "evals", "f_mem", "FID/FD", "job", "log"]
    table = [header]
    for r in rows:
        total = "?" if r.total is None else str(r.total)
        fid = _fmt(r.fid, ".2f") + ("" if r.fid is None or r.fid_label == "FID" else "*")
        table.append([r.name, r.state, f"{r.step}/{total}", f"{r.evaluated}/{r.checkpoints}" if r.checkpoints else str(r.evaluated), _fmt(r.f_mem, ".3f"),
                      fid, r.job_id or "-", _relative(r.log, root)])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts = {s: sum(r.state == s for r in rows) for s in STATES}
    lines.append("")
    lines.append(f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    labels = sorted({r.fid_label for r in rows if r.fid_label and r.fid_label != "FID"})
    if labels:
        lines.append("* " + ", ".join(labels) + ": a Frechet distance of other features, not Inception FID")
    for r in rows:
        if r.state == "failed":
            where = f" (log: {_relative(r.error_log, root)})" if r.error_log else ""
            lines.append(f"{r.name} failed: {r.error}{where}")
    return "\n".join(lines)
