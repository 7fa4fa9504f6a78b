"""Where every run of an experiment stands, read from its run folders, its job records (:mod:`diffmem.jobrecords`)
and what Slurm says of its jobs (:mod:`diffmem.cluster.slurm`). Writes nothing. ``diffmem status``
(:mod:`diffmem.status`) prints it; a sweep and its executors (:mod:`diffmem.cluster.executors`) read it to skip the
runs that are done and to wait for the jobs that are alive.

A run's state is one of:

* ``done``: trained (``done`` file) and every checkpoint has a metrics line;
* ``running`` / ``queued``: its latest job is alive (same host: its process exists; Slurm: the controller says so,
  see :func:`~diffmem.cluster.slurm.slurm_job_state`; where Slurm cannot be asked, the job has not reported an end);
* ``cancelled``: its latest Slurm job was cancelled (``scancel``) before the run was done;
* ``failed``: its latest job ended with an error (the last error line is shown; for a job Slurm ended, e.g. out of
  memory, Slurm's state and reason);
* ``partial``: trained part of the way (``state.pt`` or checkpoints), or trained but not fully evaluated;
* ``new``: nothing on disk yet.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem.analysis.runfiles import read_metrics
from diffmem.cluster.slurm import (SLURM_QUEUED, SLURM_RUNNING, UNREACHABLE, SlurmJobState, slurm_failure,
                                   slurm_job_state, slurm_log_reason)
from diffmem.eval_grid import evaluation_steps
from diffmem.jobrecords import has_submissions, job_log, log_error_line, read_job, read_plan, read_submissions
from diffmem.metrics.extractor_names import metric_label
from diffmem.outcomes import FAILED, REQUEUED
from diffmem.rundir import RunDir, not_a_folder, pid_alive

STATES = ("new", "partial", "queued", "running", "cancelled", "failed", "done")
ACTIVE_STATES = ("running", "queued")  # the states of a run whose latest job is alive


class StatusError(ValueError):
    """An experiment folder that status cannot read; the message says what to pass."""


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


def _job_activity(sub: dict[str, Any] | None, job: dict[str, Any] | None,
                  experiment_dir: Path) -> tuple[str | None, str | None]:
    """("running" | "queued" | "cancelled" | None, last error line | None) of a run's latest job."""
    if sub is None:  # a job started by hand (e.g. RunJob called in-process), or no job at all
        if job is None:
            return None, None
        if job.get("outcome") is None and job.get("host") == socket.gethostname() and pid_alive(int(job["pid"])):
            return "running", None
        return None, job.get("error") if job.get("outcome") == FAILED else None
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
        return None, (log_error_line(job_log(experiment_dir, job_id, "err"))
                      or "the job stopped without reporting an end (killed?)")
    if same_job and job.get("outcome") != REQUEUED:  # the job ended
        return None, job.get("error") if job.get("outcome") == FAILED else None
    # not started yet, or requeued and waiting to restart
    if cluster == "local":
        if here and pid_alive(int(job_id)):  # a local job id is its controller's pid (checked: digits)
            return "queued", None
        return None, log_error_line(job_log(experiment_dir, job_id, "err")) if here else None
    return None, None  # debug jobs live in the submitting process only


def _slurm_activity(job_id: str, job: dict[str, Any] | None,
                    experiment_dir: Path) -> tuple[str | None, str | None]:
    """:func:`_job_activity` of a Slurm job; ``job`` is its own record (job.json) when it has started, else None.

    The job's own end record wins; otherwise Slurm's state (controller, then sacct; see :func:`slurm_job_state`);
    where Slurm has forgotten the job (no accounting database, MinJobAge passed), its record and its error log."""
    outcome = job.get("outcome") if job else None
    if job is not None and outcome not in (None, REQUEUED):  # the job reported its end
        return None, job.get("error") if outcome == FAILED else None
    slurm = slurm_job_state(job_id)
    if slurm == UNREACHABLE:  # e.g. status read off the cluster: trust the records
        if job is not None and outcome is None and job.get("host") == socket.gethostname() \
                and not pid_alive(int(job["pid"])):
            return None, "the job stopped without reporting an end (killed?)"
        return ("running" if job is not None and outcome is None else "queued"), None
    if isinstance(slurm, SlurmJobState) and slurm.state in SLURM_RUNNING:
        return "running", None
    if isinstance(slurm, SlurmJobState) and slurm.state in SLURM_QUEUED:
        return "queued", None
    err_log = job_log(experiment_dir, job_id, "err")
    if isinstance(slurm, SlurmJobState) and slurm.state == "CANCELLED":
        return "cancelled", None
    if isinstance(slurm, SlurmJobState) and slurm.state != "COMPLETED":
        return None, slurm_failure(slurm, err_log)
    if job is not None and outcome is None:  # started, never reported an end, and Slurm no longer runs it
        if "SIGTERM" in (job.get("signals") or []):
            return "cancelled", None  # terminated by Slurm (scancel), then killed
        why = slurm_log_reason(err_log)
        return None, f"Slurm: {why}" if why else "the job stopped without reporting an end (killed?); see its log"
    # ended before it started the run (e.g. its pickled job could not be loaded): what its error log says
    return None, log_error_line(err_log) if job is None else None


def _log(sub: dict[str, Any] | None, experiment_dir: Path, stream: str) -> str | None:
    """The log ("out" or "err") of a submitted job that writes logs: always the job id's own file in the
    experiment's .submitit/, never a path read from submissions.json (which could point anywhere)."""
    if sub is None or sub.get("stdout" if stream == "out" else "stderr") is None:
        return None
    return str(job_log(experiment_dir, sub["job_id"], stream))


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
        log=_log(sub, experiment_dir, "out"), error_log=_log(sub, experiment_dir, "err"), error=error,
        unevaluated=len(unevaluated), extension=extension, lost=lost)


def experiment_status(experiment_dir: str | Path) -> list[RunStatus]:
    """Every run of an experiment folder: those planned by `diffmem sweep` (sweep.json) and every run folder on
    disk, sorted by name."""
    root = Path(experiment_dir)
    if problem := not_a_folder(root):
        raise StatusError(f"experiment folder '{root}' {problem}; pass the --out folder of `diffmem sweep`")
    planned = read_plan(root)
    for p in root.iterdir():
        if p.is_dir() and ((p / "config.json").is_file() or has_submissions(p)):
            planned.setdefault(p.name, None)
    if not planned:
        raise StatusError(f"'{root}' holds no runs (no sweep.json and no run folder); pass the --out folder of "
                          "`diffmem sweep`")
    return [run_status(root / name, total) for name, total in sorted(planned.items())]
