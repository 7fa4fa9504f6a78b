"""The job records of a sweep: what was planned, what was submitted and what each job did, as JSON.

Written next to the run folders (all atomically, see :mod:`diffmem.io`); this module is their only writer and
reader::

    <experiment_dir>/sweep.json              planned runs of every `diffmem sweep` so far: name -> total steps
    <experiment_dir>/.submitit/              submitit's folder: <job id>_0_log.out / _log.err, pickled jobs, ...
    <experiment_dir>/<run>/submissions.json  every job submitted for the run (by `diffmem sweep`): job id, cluster,
                                             kind ("train" | "evaluate"), time, log paths
    <experiment_dir>/<run>/job.json          the latest job that ran the run (written by the job itself): job id,
                                             host, pid, CUDA_VISIBLE_DEVICES, started, ended, outcome (see
                                             :mod:`diffmem.outcomes`), step, error, signals (SIGTERM received)

A folder may come from someone else, so its records are data: every reader checks the types and values of what it
reads (:class:`JobRecordError`, one line naming the file, the key and what to do, for anything else), a run name is
one folder name inside the experiment (:func:`check_run_name`) and a job id is one of the ids the clusters hand out
(:func:`check_job_id`) before any path is built from it. What a job did is read from its own job.json, never from
submitit's result pickles (``<job id>_0_result.pkl``, which a folder could hold crafted to run code when unpickled).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from diffmem.io import atomic_write_json
from diffmem.outcomes import CANCELLED, DONE, EVALUATED, FAILED, INTERRUPTED, REQUEUED, SKIPPED, SUBMITTED

SWEEP_FILE = "sweep.json"
SUBMITIT_DIR = ".submitit"
SUBMISSIONS_FILE = "submissions.json"
JOB_FILE = "job.json"
JOB_KINDS = ("train", "evaluate")
JOB_OUTCOMES = (DONE, SKIPPED, EVALUATED, INTERRUPTED, REQUEUED, FAILED, CANCELLED, SUBMITTED)
# the job ids each cluster hands out: Slurm "123" or an array task "123_4", submitit's local jobs the pid of their
# controller, its debug jobs "DEBUG_<number>"
JOB_ID_PATTERNS = {"debug": re.compile(r"DEBUG_[0-9]{1,30}"), "local": re.compile(r"[0-9]{1,20}"),
                   "slurm": re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?")}
RUN_NAME = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9_.+=\-]{0,199}")
"""A run folder's name as a sweep.json may list it: one folder name, not starting with a dot (no "..", no "/")."""


class JobRecordError(ValueError):
    """A job record that cannot be read; the message says what to do."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


_ADVICE = {SWEEP_FILE: "restore it from a copy or delete it (it only lists the planned runs and their steps; the "
                       "next `diffmem sweep` writes it again)",
           SUBMISSIONS_FILE: "restore it from a copy or delete it (it only lists the run's submitted jobs; the run's "
                             "results are untouched)",
           JOB_FILE: "delete it (it only describes the run's latest job; the run's results are untouched)"}


def _damaged(path: Path, what: str) -> JobRecordError:
    """The one-line error for a record at ``path`` that holds ``what``: the file, what is wrong, what to do."""
    return JobRecordError(f"{path}: {what}; {_ADVICE.get(path.name, 'restore it from a copy or delete it')}")


def _read_json(path: Path) -> Any:
    """The JSON value of ``path``; None when there is no such file. Only a regular file is read (a folder, a pipe
    or a dangling link in its place is a JobRecordError)."""
    if not path.exists() and not path.is_symlink():
        return None
    _check(path, path.is_file(), "is not a regular file")
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:  # removed meanwhile
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _damaged(path, f"is not valid JSON ({str(e).splitlines()[0]})") from None
    _check(path, value is not None, "holds null, not a record")
    return value


def _check(path: Path, ok: bool, what: str) -> None:
    if not ok:
        raise _damaged(path, what)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, kind)


def check_run_name(name: Any, path: str | Path) -> str:
    """``name`` when it is one run folder name (see :data:`RUN_NAME`), else a JobRecordError naming ``path``."""
    path = Path(path)
    _check(path, isinstance(name, str) and RUN_NAME.fullmatch(name) is not None,
           f"key \"runs\" lists {name!r}, which is not a run folder name (one folder inside the experiment, e.g. "
           "n00128_w08_s0)")
    return name


def check_job_id(job_id: Any, cluster: str, path: str | Path, key: str = "job_id") -> str:
    """``job_id`` when it is an id that ``cluster`` hands out (:data:`JOB_ID_PATTERNS`), else a JobRecordError
    naming ``path`` and ``key``: no path or command is ever built from anything else."""
    pattern = JOB_ID_PATTERNS.get(cluster)
    _check(Path(path), isinstance(job_id, str) and pattern is not None and pattern.fullmatch(job_id) is not None,
           f"{key} {job_id!r} is not a {cluster} job id"
           + (f" ({'a number, or <array>_<task>' if cluster == 'slurm' else 'a number'})" if cluster != "debug" else ""))
    return job_id


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"`` of an exception: the ``error`` a job record stores."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def submitit_folder(experiment_dir: str | Path) -> Path:
    """The absolute folder of an experiment's submitit files (job logs, pickled jobs)."""
    return (Path(experiment_dir) / SUBMITIT_DIR).absolute()


def job_log(experiment_dir: str | Path, job_id: str, stream: str = "out") -> Path:
    """The log of job ``job_id`` (checked with :func:`check_job_id`) of a sweep, as submitit and the sbatch script
    name it: ``stream`` "out" (stdout) or "err" (stderr), inside the experiment's ``.submitit/``."""
    return submitit_folder(experiment_dir) / f"{job_id}_0_log.{stream}"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: .*)?$")


def log_tail(log: str | Path | None, n_bytes: int = 20000) -> str | None:
    """The last ``n_bytes`` of a job's log, as text; None when there is no (readable) log. Only a regular file is
    read (a folder's "log" that is a pipe or a device would block or never end)."""
    if not log or not Path(log).is_file():
        return None
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def log_error_line(err_log: str | Path | None) -> str | None:
    """The last exception line (``"ValueError: ..."``) in the tail of a job's error log; None when there is none.
    Why a job that failed before it could write its own record (e.g. its function could not be loaded) failed;
    only asked of jobs known to have ended."""
    tail = log_tail(err_log)
    if tail is None:
        return None
    for line in reversed(tail.splitlines()):
        if _EXCEPTION_LINE.match(line.strip()):
            return line.strip()[:500]
    return None


# --- the plan: <experiment_dir>/sweep.json -------------------------------------------------------------------------

def _read_plan_file(path: Path) -> dict[str, Any] | None:
    """sweep.json, checked: {"runs": {run name: total steps (an integer >= 0) or null}, ...}; None if absent."""
    plan = _read_json(path)
    if plan is None:
        return None
    _check(path, isinstance(plan, dict) and isinstance(plan.get("runs"), dict),
           'is not a plan of runs (expected {"runs": {run name: steps}})')
    for name, steps in plan["runs"].items():
        check_run_name(name, path)
        _check(path, steps is None or (_is_int(steps) and steps >= 0),
               f'key "runs" gives run {name} {steps!r} steps, not a whole number >= 0')
    return plan


def record_plan(experiment_dir: str | Path, steps_by_run: dict[str, int]) -> None:
    """Add the runs of a sweep (name -> total optimizer steps) to ``<experiment_dir>/sweep.json``."""
    path = Path(experiment_dir) / SWEEP_FILE
    plan = _read_plan_file(path) or {"runs": {}}
    plan["runs"].update(steps_by_run)
    plan["updated"] = _now()
    atomic_write_json(path, plan)


def read_plan(experiment_dir: str | Path) -> dict[str, int | None]:
    """Every run planned by a sweep of the experiment so far: name -> total optimizer steps ({} if none). A name
    is always one folder inside the experiment (:func:`check_run_name`)."""
    return dict((_read_plan_file(Path(experiment_dir) / SWEEP_FILE) or {"runs": {}})["runs"])


# --- submissions: <run>/submissions.json ----------------------------------------------------------------------------

def _check_submission(path: Path, index: int, sub: Any) -> dict[str, Any]:
    """One entry of submissions.json, checked (see :func:`record_submission`)."""
    where = f"submission {index}"
    _check(path, isinstance(sub, dict), f"{where} is not a JSON object")
    _check(path, sub.get("cluster") in JOB_ID_PATTERNS,
           f'{where}: key "cluster" is {sub.get("cluster")!r}, not one of {", ".join(JOB_ID_PATTERNS)}')
    check_job_id(sub.get("job_id"), sub["cluster"], path, f'{where}: key "job_id"')
    _check(path, sub.get("kind") in JOB_KINDS, f'{where}: key "kind" is {sub.get("kind")!r}, not train or evaluate')
    _check(path, sub.get("steps") is None or (_is_int(sub["steps"]) and sub["steps"] >= 0),
           f'{where}: key "steps" is {sub.get("steps")!r}, not a whole number >= 0')
    for key in ("submitted", "host", "stdout", "stderr"):
        _check(path, _optional(sub.get(key), str) and (key != "submitted" or sub.get(key) is not None),
               f'{where}: key "{key}" is {sub.get(key)!r}, not a string')
    return sub


def record_submission(run_dir: str | Path, *, job_id: str, cluster: str, kind: str, steps: int,
                      stdout: str | None, stderr: str | None) -> None:
    """Append one submitted job to ``<run>/submissions.json`` (written only by the submitting process)."""
    path = Path(run_dir) / SUBMISSIONS_FILE
    records = read_submissions(run_dir)
    records.append({"job_id": job_id, "cluster": cluster, "kind": kind, "steps": steps, "submitted": _now(),
                    "host": socket.gethostname(), "stdout": stdout, "stderr": stderr})
    atomic_write_json(path, {"submissions": records})


def read_submissions(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every job submitted for the run, oldest first ([] if none); each job id checked (:func:`check_job_id`)."""
    path = Path(run_dir) / SUBMISSIONS_FILE
    data = _read_json(path)
    if data is None:
        return []
    _check(path, isinstance(data, dict) and isinstance(data.get("submissions"), list),
           'is not a list of submitted jobs (expected {"submissions": [...]})')
    return [_check_submission(path, i, sub) for i, sub in enumerate(data["submissions"])]


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
    (with ``error``, one line) of :mod:`diffmem.outcomes`; ``step`` the optimizer steps done. Status and the sweep
    read what became of the job from here (:func:`job_outcome`)."""
    path = Path(run_dir) / JOB_FILE
    job = read_job(run_dir) or {}
    job.update({"ended": _now(), "outcome": outcome, "step": step, "error": error})
    atomic_write_json(path, job)


def record_job_signal(run_dir: str | Path, name: str) -> None:
    """Written by a job that received a terminating signal it does not stop for (SIGTERM inside a Slurm job, sent
    at scancel and preemption): if the job then vanishes without an end record, status calls it cancelled."""
    path = Path(run_dir) / JOB_FILE
    job = read_job(run_dir) or {}
    job["signals"] = sorted(set(job.get("signals") or []) | {name})
    atomic_write_json(path, job)


def read_job(run_dir: str | Path) -> dict[str, Any] | None:
    """The latest job's record (``<run>/job.json``), checked, or None."""
    path = Path(run_dir) / JOB_FILE
    job = _read_json(path)
    if job is None:
        return None
    _check(path, isinstance(job, dict), "is not a job record (a JSON object)")
    if job.get("job_id") is not None:
        _check(path, any(isinstance(job["job_id"], str) and p.fullmatch(job["job_id"])
                         for p in JOB_ID_PATTERNS.values()), f'key "job_id" {job["job_id"]!r} is not a job id')
    _check(path, _is_int(job.get("pid")) and job["pid"] > 0, f'key "pid" is {job.get("pid")!r}, not a process id')
    _check(path, job.get("outcome") is None or job["outcome"] in JOB_OUTCOMES,
           f'key "outcome" is {job.get("outcome")!r}, not one of {", ".join(JOB_OUTCOMES)}')
    _check(path, job.get("step") is None or (_is_int(job["step"]) and job["step"] >= 0),
           f'key "step" is {job.get("step")!r}, not a whole number >= 0')
    for key in ("host", "started"):
        _check(path, isinstance(job.get(key), str), f'key "{key}" is {job.get(key)!r}, not a string')
    for key in ("ended", "error", "kind", "cuda_visible_devices"):
        _check(path, _optional(job.get(key), str), f'key "{key}" is {job.get(key)!r}, not a string')
    signals = job.get("signals")
    _check(path, signals is None or (isinstance(signals, list) and all(isinstance(s, str) for s in signals)),
           f'key "signals" is {signals!r}, not a list of signal names')
    return job


def job_outcome(run_dir: str | Path, job_id: str | None) -> dict[str, Any] | None:
    """The run's job record when it says that job ``job_id`` (or, for a job that runs without an id such as a
    debug job, any job) ended, i.e. reported an outcome other than REQUEUED; else None. The one place a sweep and
    status learn what a job did: its ``outcome``, ``step`` and ``error``."""
    record = read_job(run_dir) or {}
    ended = record.get("outcome") not in (None, REQUEUED)
    return record if ended and record.get("job_id") in (job_id, None) else None
