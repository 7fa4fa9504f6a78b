"""The job records of a sweep and ``diffmem status EXPERIMENT_DIR``: where every run of an experiment stands.

Records written next to the run folders (all atomically, see :mod:`diffmem.io`)::

    <experiment_dir>/sweep.json              planned runs of every `diffmem sweep` so far: name -> total steps
    <experiment_dir>/.submitit/              submitit's folder: <job id>_0_log.out / _log.err / _result.pkl, ...
    <experiment_dir>/<run>/submissions.json  every job submitted for the run (by `diffmem sweep`): job id, cluster,
                                             kind ("train" | "evaluate"), time, log paths
    <experiment_dir>/<run>/job.json          the latest job that ran the run (written by the job itself): job id,
                                             host, pid, CUDA_VISIBLE_DEVICES, started, ended, outcome, step, error,
                                             signals (SIGTERM received)

A run's state is one of:

* ``done``: trained (``done`` file) and every checkpoint has a metrics line;
* ``running`` / ``queued``: its latest job is alive (same host: its process exists; Slurm: the controller says so,
  see :func:`slurm_job_state`; where Slurm cannot be asked, the job has not reported an end);
* ``cancelled``: its latest Slurm job was cancelled (``scancel``) before the run was done;
* ``failed``: its latest job ended with an error (the last error line is shown; for a job Slurm ended, e.g. out of
  memory, Slurm's state and reason);
* ``partial``: trained part of the way (``state.pt`` or checkpoints), or trained but not fully evaluated;
* ``new``: nothing on disk yet.
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem.analysis.runfiles import read_metrics
from diffmem.io import atomic_write_json
from diffmem.metrics.fid import metric_label
from diffmem.rundir import RunDir, pid_alive
from diffmem.schedule import evaluation_steps

SWEEP_FILE = "sweep.json"
SUBMITIT_DIR = ".submitit"
SUBMISSIONS_FILE = "submissions.json"
JOB_FILE = "job.json"

STATES = ("new", "partial", "queued", "running", "cancelled", "failed", "done")
# Slurm job states in which a job still holds or waits for its run
SLURM_QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING",
                          "SUSPENDED"})
SLURM_RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"})
SLURM_ACTIVE = SLURM_QUEUED | SLURM_RUNNING
# Slurm job states of a job that Slurm ended before the job could report it, with what to do about it
SLURM_FAILURES = {
    "OUT_OF_MEMORY": "the job exceeded its memory (raise --mem-gb)",
    "TIMEOUT": "the job reached its time limit and was not requeued (raise --time or --max-requeues)",
    "NODE_FAIL": "its node failed",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "the job reached its deadline",
    "PREEMPTED": "the job was preempted and not requeued",
    "FAILED": "the job's script failed",
}
SLURM_QUERY_TIMEOUT_S = 20.0


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
    lost: bool = False  # finished, but an evaluation step lost its metrics line and checkpoint (train writes it again)

    @property
    def needs_training(self) -> bool:
        return not RunDir(self.path).is_done() or self.extension or self.lost

    @property
    def needs_evaluation(self) -> bool:
        return self.unevaluated > 0


# --- what Slurm says about a job --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmJobState:
    """One job as Slurm reports it: ``state`` e.g. "RUNNING" (the first word of Slurm's JobState), ``reason``
    Slurm's Reason ("None" when it gives none), ``exit_code`` "code:signal", ``source`` "scontrol" | "sacct"."""

    state: str
    reason: str = "None"
    exit_code: str = ""
    source: str = "scontrol"

    @property
    def active(self) -> bool:
        return self.state in SLURM_ACTIVE


UNREACHABLE = "unreachable"
"""What :func:`slurm_job_state` returns when Slurm cannot be asked (no Slurm commands, or no controller answers)."""

_CONTROLLER_CACHE: dict[str, tuple[float, dict[str, SlurmJobState] | str]] = {}
_CACHE_S = 1.0


def slurm_command(argv: list[str]) -> subprocess.CompletedProcess | None:
    """Run a Slurm client command (never waits more than SLURM_QUERY_TIMEOUT_S); None when it cannot run."""
    if shutil.which(argv[0]) is None:
        return None
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):  # Slurm's commands would retry reading it for a minute
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _parse_scontrol_jobs(text: str) -> dict[str, SlurmJobState]:
    """``scontrol show job -o`` (one line per job or array task) -> {job id: state}; an array task is listed under
    ``<array job id>_<task id>``, and so is each task of a pending array's range record (``ArrayTaskId=0-2%1``)."""
    jobs: dict[str, SlurmJobState] = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "JobId" not in fields or "JobState" not in fields:
            continue
        state = SlurmJobState(fields["JobState"].split()[0].upper(), fields.get("Reason", "None"),
                              fields.get("ExitCode", ""), "scontrol")
        jobs[fields["JobId"]] = state
        array_id, tasks = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if array_id and tasks:
            for part in tasks.split("%")[0].split(","):
                low, _, high = part.partition("-")
                if low.isdigit() and (not high or high.isdigit()):
                    for task in range(int(low), int(high or low) + 1):
                        jobs[f"{array_id}_{task}"] = state
    return jobs


def forget_slurm_states() -> None:
    """Drop the cached controller answer (after a submission, so that the new jobs are seen)."""
    _CONTROLLER_CACHE.clear()


def _controller_jobs(fresh: bool = False) -> dict[str, SlurmJobState] | str:
    """Every job the Slurm controller holds in memory (queued, running, and ended ones for MinJobAge seconds),
    from one ``scontrol show job`` call (cached for a second, per $SLURM_CONF, unless ``fresh``); UNREACHABLE when
    it cannot answer."""
    key = os.environ.get("SLURM_CONF", "")
    now = time.monotonic()
    cached = _CONTROLLER_CACHE.get(key)
    if cached and now - cached[0] < _CACHE_S and not fresh:
        return cached[1]
    done = slurm_command(["scontrol", "show", "job", "-o"])
    if done is None or done.returncode != 0:
        answer: dict[str, SlurmJobState] | str = UNREACHABLE
    else:
        answer = _parse_scontrol_jobs(done.stdout)
    _CONTROLLER_CACHE[key] = (now, answer)
    return answer


def _sacct_state(job_id: str) -> SlurmJobState | None:
    """The job's state in Slurm's accounting database; None without one (no slurmdbd: sacct says "accounting
    storage is disabled") or when it does not know the job."""
    done = slurm_command(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Reason", "-j", job_id])
    if done is None or done.returncode != 0:
        return None
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0] == job_id and parts[1].strip():
            return SlurmJobState(parts[1].split()[0].upper(), parts[3] if len(parts) > 3 else "None",
                                 parts[2] if len(parts) > 2 else "", "sacct")
    return None


def slurm_job_state(job_id: str, fresh: bool = False) -> SlurmJobState | str | None:
    """What Slurm says about a job (``"1234"`` or an array task ``"1234_5"``): the controller's record
    (``scontrol show job``, which works without slurmdbd), else the accounting database (``sacct``, where there is
    one); None when neither knows the job (ended more than MinJobAge ago on a cluster without accounting), and
    UNREACHABLE when Slurm cannot be asked. Never blocks longer than the query timeouts. The controller's answer
    is shared for a second between calls unless ``fresh``."""
    jobs = _controller_jobs(fresh)
    if jobs == UNREACHABLE:
        return UNREACHABLE
    assert isinstance(jobs, dict)
    if job_id in jobs:
        return jobs[job_id]
    return _sacct_state(job_id)


# lines that Slurm (slurmstepd, srun) writes into a job's error log when it ends the job, and what they mean
_SLURM_LOG_LINES = (
    (re.compile(r"exceeded memory limit \((\d+) > (\d+)\)", re.IGNORECASE),
     lambda m: f"the job exceeded its memory limit ({int(m[1]) / 2**20:.0f} MB > {int(m[2]) / 2**20:.0f} MB): raise "
               "--mem-gb"),
    (re.compile(r"Exceeded job memory limit|oom[-_ ]kill|Out Of Memory", re.IGNORECASE),
     lambda m: "the job exceeded its memory limit: raise --mem-gb"),
    (re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT"),
     lambda m: "the job reached its time limit before it was requeued: raise --time or --signal-delay-s"),
    (re.compile(r"CANCELLED AT \S+ DUE TO NODE FAILURE"), lambda m: "its node failed"),
)


def slurm_log_reason(err_log: str | Path | None) -> str | None:
    """Why Slurm ended a job, from the lines slurmstepd writes at the end of its error log (out of memory, time
    limit, node failure); None when the log says nothing of the kind."""
    if not err_log:
        return None
    try:
        with open(err_log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 20000))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = tail.splitlines()[::-1]
    for pattern, describe in _SLURM_LOG_LINES:  # the most specific line first
        for line in lines:
            found = pattern.search(line)
            if found:
                return describe(found)
    return None


def slurm_failure(state: SlurmJobState, err_log: str | Path | None = None) -> str:
    """One line for a job that Slurm ended with ``state`` (e.g. OUT_OF_MEMORY), with what its error log says."""
    why = slurm_log_reason(err_log) or SLURM_FAILURES.get(state.state, "")
    reason = f", reason {state.reason}" if state.reason not in ("None", "", "(null)") else ""
    code = f", exit code {state.exit_code}" if state.exit_code not in ("", "0:0") else ""
    return f"Slurm: {state.state}{reason}{code}" + (f": {why}" if why else "")


def slurm_err_log(experiment_dir: str | Path, job_id: str) -> Path:
    """The error log of a sweep's Slurm job (the sbatch script's --error)."""
    return Path(experiment_dir) / SUBMITIT_DIR / f"{job_id}_0_log.err"


def read_result(experiment_dir: Path, job_id: str) -> tuple[str, Any] | None:
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


def result_error(experiment_dir: Path, job_id: str) -> str | None:
    """The last line of the traceback submitit stored for a failed job, or None."""
    result = read_result(experiment_dir, job_id)
    if result is None or result[0] != "error":
        return None
    value = result[1]
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "the job failed (no traceback)"


def _job_activity(sub: dict[str, Any] | None, job: dict[str, Any] | None,
                  experiment_dir: Path) -> tuple[str | None, str | None]:
    """("running" | "queued" | "cancelled" | None, last error line | None) of a run's latest job."""
    if sub is None:  # a job started by hand (e.g. RunJob called in-process), or no job at all
        if job is None:
            return None, None
        if job.get("outcome") is None and job.get("host") == socket.gethostname() and pid_alive(int(job["pid"])):
            return "running", None
        return None, job.get("error") if job.get("outcome") == "failed" else None
    cluster, job_id = sub["cluster"], sub["job_id"]
    same_job = job is not None and (job.get("job_id") == job_id or
                                    (job.get("job_id") is None and job.get("started", "") >= sub["submitted"]))
    if cluster == "slurm":
        return _slurm_activity(job_id, job if same_job else None, experiment_dir)
    here = sub.get("host") == socket.gethostname()
    if same_job and job.get("outcome") is None:  # started, no end reported
        if job.get("host") == socket.gethostname():
            if pid_alive(int(job["pid"])):
                return "running", None
        else:
            return "running", None  # another machine: trust the record
        return None, result_error(experiment_dir, job_id) or "the job stopped without reporting an end (killed?)"
    if same_job and job.get("outcome") != "requeued":  # the job ended
        return None, job.get("error") if job.get("outcome") == "failed" else None
    # not started yet, or requeued and waiting to restart
    if cluster == "local":
        if here and job_id.isdigit() and pid_alive(int(job_id)):  # a local job id is its controller's pid
            return "queued", None
        return None, result_error(experiment_dir, job_id)
    return None, None  # debug jobs live in the submitting process only


def _slurm_activity(job_id: str, job: dict[str, Any] | None,
                    experiment_dir: Path) -> tuple[str | None, str | None]:
    """:func:`_job_activity` of a Slurm job; ``job`` is its own record (job.json) when it has started, else None.

    The job's own end record wins; otherwise Slurm's state (controller, then sacct; see :func:`slurm_job_state`);
    where Slurm has forgotten the job (no accounting database, MinJobAge passed), its result file and record."""
    outcome = job.get("outcome") if job else None
    if job is not None and outcome not in (None, "requeued"):  # the job reported its end
        return None, job.get("error") if outcome == "failed" else None
    slurm = slurm_job_state(job_id)
    if slurm == UNREACHABLE:  # e.g. status read off the cluster: trust the records
        error = result_error(experiment_dir, job_id)
        if error:
            return None, error
        if job is not None and outcome is None and job.get("host") == socket.gethostname() \
                and not pid_alive(int(job["pid"])):
            return None, "the job stopped without reporting an end (killed?)"
        return ("running" if job is not None and outcome is None else "queued"), None
    if isinstance(slurm, SlurmJobState) and slurm.state in SLURM_RUNNING:
        return "running", None
    if isinstance(slurm, SlurmJobState) and slurm.state in SLURM_QUEUED:
        return "queued", None
    error = result_error(experiment_dir, job_id)
    if error:
        return None, error
    if isinstance(slurm, SlurmJobState) and slurm.state == "CANCELLED":
        return "cancelled", None
    if isinstance(slurm, SlurmJobState) and slurm.state != "COMPLETED":
        return None, slurm_failure(slurm, slurm_err_log(experiment_dir, job_id))
    if job is not None and outcome is None:  # started, never reported an end, and Slurm no longer runs it
        if "SIGTERM" in (job.get("signals") or []):
            return "cancelled", None  # terminated by Slurm (scancel), then killed
        why = slurm_log_reason(slurm_err_log(experiment_dir, job_id))
        return None, f"Slurm: {why}" if why else "the job stopped without reporting an end (killed?); see its log"
    return None, None


def run_status(run_dir: str | Path, total: int | None = None) -> RunStatus:
    """The state of one run folder (which need not exist yet: then it is "new")."""
    run = RunDir(run_dir)
    experiment_dir = run.path.parent
    stored = run.read_config()  # a damaged config.json is a one-line ConfigFileError naming it
    subs = read_submissions(run.path) if run.path.is_dir() else []
    sub = subs[-1] if subs else None
    stored_total = stored.config.train.steps if stored else None
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
    planned = set(evaluation_steps(stored.config.eval.times, stored_total)) if stored else set(checkpoints)
    unevaluated = (planned & set(checkpoints)) - metric_steps
    extension = stored_total is not None and total is not None and total > stored_total
    # a finished run whose evaluation step lost both its metrics line and its checkpoint: `diffmem train` writes
    # the checkpoint again, so the run is not done
    lost = bool(stored and run.is_done() and set(run.unevaluated(stored.scheduled_steps(), run.trained_step()))
                - set(checkpoints))
    done = run.is_done() and not extension and not lost
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
        unevaluated=len(unevaluated), extension=extension, lost=lost)


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
    if counts["cancelled"]:
        lines.append(f"{counts['cancelled']} cancelled run(s): rerun the same `diffmem sweep` command to continue "
                     "them from their state.pt")
    for r in rows:
        if r.state == "failed":
            where = f" (log: {_relative(r.error_log, root)})" if r.error_log else ""
            lines.append(f"{r.name} failed: {r.error}{where}")
    return "\n".join(lines)
