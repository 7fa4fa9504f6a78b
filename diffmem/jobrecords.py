"""The job records of a sweep: what was planned, what was submitted, what each job did, and what submitit stored.

Written next to the run folders (all atomically, see :mod:`diffmem.io`); this module is their only writer and
reader::

    <experiment_dir>/sweep.json              planned runs of every `diffmem sweep` so far: name -> total steps
    <experiment_dir>/.submitit/              submitit's folder: <job id>_0_log.out / _log.err / _result.pkl, ...
    <experiment_dir>/<run>/submissions.json  every job submitted for the run (by `diffmem sweep`): job id, cluster,
                                             kind ("train" | "evaluate"), time, log paths
    <experiment_dir>/<run>/job.json          the latest job that ran the run (written by the job itself): job id,
                                             host, pid, CUDA_VISIBLE_DEVICES, started, ended, outcome (see
                                             :mod:`diffmem.outcomes`), step, error, signals (SIGTERM received)
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
import socket
from pathlib import Path
from typing import Any

from diffmem.io import atomic_write_json

SWEEP_FILE = "sweep.json"
SUBMITIT_DIR = ".submitit"
SUBMISSIONS_FILE = "submissions.json"
JOB_FILE = "job.json"


class JobRecordError(ValueError):
    """A job record that cannot be read; the message says what to do."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise JobRecordError(f"{path} is not valid JSON ({e}); delete it (it only records jobs, not results)") \
            from None


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"`` of an exception: the ``error`` a job record stores."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def submitit_folder(experiment_dir: str | Path) -> Path:
    """The absolute folder of an experiment's submitit files (job logs, pickled jobs, results)."""
    return (Path(experiment_dir) / SUBMITIT_DIR).absolute()


# --- the plan: <experiment_dir>/sweep.json -------------------------------------------------------------------------

def record_plan(experiment_dir: str | Path, steps_by_run: dict[str, int]) -> None:
    """Add the runs of a sweep (name -> total optimizer steps) to ``<experiment_dir>/sweep.json``."""
    path = Path(experiment_dir) / SWEEP_FILE
    plan = _read_json(path) or {"runs": {}}
    plan["runs"].update(steps_by_run)
    plan["updated"] = _now()
    atomic_write_json(path, plan)


def read_plan(experiment_dir: str | Path) -> dict[str, int | None]:
    """Every run planned by a sweep of the experiment so far: name -> total optimizer steps ({} if none)."""
    return dict((_read_json(Path(experiment_dir) / SWEEP_FILE) or {}).get("runs", {}))


# --- submissions: <run>/submissions.json ----------------------------------------------------------------------------

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


def has_submissions(run_dir: str | Path) -> bool:
    """Whether a sweep ever submitted a job for the run folder."""
    return (Path(run_dir) / SUBMISSIONS_FILE).is_file()


# --- the latest job: <run>/job.json ----------------------------------------------------------------------------------

def record_job_start(run_dir: str | Path, kind: str, job_id: str | None) -> None:
    """Written by a job when it starts working on the run: ``<run>/job.json`` describes this job from now on."""
    atomic_write_json(Path(run_dir) / JOB_FILE, {
        "job_id": job_id, "kind": kind, "host": socket.gethostname(), "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "started": _now(),
        "ended": None, "outcome": None, "step": None, "error": None})


def record_job_end(run_dir: str | Path, outcome: str, step: int | None = None, error: str | None = None) -> None:
    """Written by a job when it stops: ``outcome`` DONE | SKIPPED | EVALUATED | INTERRUPTED | REQUEUED | FAILED
    (with ``error``, one line) of :mod:`diffmem.outcomes`; ``step`` the optimizer steps done."""
    path = Path(run_dir) / JOB_FILE
    job = _read_json(path) or {}
    job.update({"ended": _now(), "outcome": outcome, "step": step, "error": error})
    atomic_write_json(path, job)


def record_job_signal(run_dir: str | Path, name: str) -> None:
    """Written by a job that received a terminating signal it does not stop for (SIGTERM inside a Slurm job, sent
    at scancel and preemption): if the job then vanishes without an end record, status calls it cancelled."""
    path = Path(run_dir) / JOB_FILE
    job = _read_json(path) or {}
    job["signals"] = sorted(set(job.get("signals") or []) | {name})
    atomic_write_json(path, job)


def read_job(run_dir: str | Path) -> dict[str, Any] | None:
    """The latest job's record (``<run>/job.json``), or None."""
    return _read_json(Path(run_dir) / JOB_FILE)


def job_ended_with(run_dir: str | Path, job_id: str, outcome: str) -> dict[str, Any] | None:
    """The run's job record when it says that job ``job_id`` (or a job that ran without an id) ended with
    ``outcome``, else None."""
    record = read_job(run_dir) or {}
    return record if record.get("outcome") == outcome and record.get("job_id") in (job_id, None) else None


# --- what submitit stored: <experiment_dir>/.submitit/<job id>_0_result.pkl ----------------------------------------

def read_result(experiment_dir: str | Path, job_id: str) -> tuple[str, Any] | None:
    """What submitit's job runner stored when the job's function returned: ("success", its return value) or
    ("error", the traceback text); None when there is no (readable) result file."""
    import submitit.core.utils as submitit_utils

    path = submitit_utils.JobPaths(Path(experiment_dir) / SUBMITIT_DIR, job_id=job_id).result_pickle
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            outcome, value = pickle.load(f)
    except Exception:  # a result written by another submitit version or cut short: not an error of the run
        return None
    return outcome, value


def result_error(experiment_dir: str | Path, job_id: str) -> str | None:
    """The last line of the traceback submitit stored for a failed job, or None."""
    result = read_result(experiment_dir, job_id)
    if result is None or result[0] != "error":
        return None
    value = result[1]
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "the job failed (no traceback)"

