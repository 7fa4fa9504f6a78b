"""Sweeps: every run of an experiment's grid (``[sweep]`` n x width x seeds x splits) as a submitit job.

Three executors, all submitit's (this module only decides what to submit and keeps records):

* ``debug``: in this process, one run after the other (submitit's DebugExecutor);
* ``local``: subprocesses on this machine (submitit's LocalExecutor), at most K at once, one GPU each
  (``CUDA_VISIBLE_DEVICES``) when GPUs exist, and ``cpu_count // K`` torch threads each (unless
  train.num_threads is set);
* ``slurm``: one job array per kind of job, ``%K`` parallelism, ``--signal=USR2@<delay>`` and ``--requeue``; the
  sbatch script is diffmem's own (:func:`render_sbatch`, the same text for ``--dry-run`` and for ``sbatch``), and
  the job it runs is submitit's job runner (``submitit.core.submission.submitit_main``) on a pickled
  :class:`RunJob` (``submitit.helpers.DelayedSubmission``), so the signals, requeues and result files are
  submitit's. With ``wait`` the sweep then follows the jobs through ``scontrol`` (or ``sacct`` where there is an
  accounting database) until each has ended, and reports them as the local executor does.

Each job is a :class:`RunJob`: the idempotent train (+ evaluate) of one run folder, a
``submitit.helpers.Checkpointable``. Preemption or a time limit requeues it, and the requeued job continues from the
run's ``state.pt`` (bit-exact, see :func:`diffmem.train.train`). Runs that are done are skipped, runs whose job is
still queued or running are left alone, so resubmitting a sweep only submits unfinished runs. A failing run does not
stop the others; it is reported, with its last error line, by the sweep and by ``diffmem status``.

How the signals cooperate. submitit's job runner installs handlers before calling the job: the preemption signal
(USR2, or ``$SUBMITIT_PREEMPT_SIGNAL``) checkpoints and requeues, SIGTERM is ignored (Slurm sends it at preemption
and cancellation before the kill). While training, :func:`diffmem.train.train` replaces them with its own
(SIGTERM / SIGUSR2 / SIGINT save ``state.pt`` and return "interrupted") and restores them when it returns.
:class:`RunJob` reads which signals interrupted it (``TrainResult.signals``) and then acts as submitit would have:

* the preemption signal: raise it again, so submitit's handler calls :meth:`RunJob.checkpoint` and requeues
  (local: exit code 144, the controller restarts the job; Slurm: ``scontrol requeue``);
* SIGTERM alone, inside a submitit job: ignore it as submitit does and continue training from ``state.pt``;
* SIGINT: stop (KeyboardInterrupt), nothing is requeued.

Job logs go to ``<experiment_dir>/.submitit/``; job ids and log paths are recorded in each run folder
(see :mod:`diffmem.status`).

GPUs on Slurm (:func:`job_gpus`): ``--gpus-per-job G`` when given; none when an extra ``--slurm-option`` asks for
GPUs itself (gres, gpus, gpus-per-node, ...); else from the runs' ``train.device``: ``cpu`` none, ``cuda`` one,
``auto`` one where the partition's nodes have GPUs (``sinfo``) or where that cannot be asked, none on a CPU-only
partition.

Only submitit's public names are used (``submitit.helpers``, ``submitit.core.utils.JobPaths``,
``submitit.core.submission.submitit_main``, the executors and ``JobEnvironment``); the versions tested against a
real Slurm cluster are listed in docs/cluster.md.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from diffmem.config import RunConfig, SweepConfig, continuation_diff
from diffmem.data import default_heldout, load_images
from diffmem.evaluate import evaluate_run
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.rundir import RunDir
from diffmem.status import (SUBMITIT_DIR, UNREACHABLE, RunStatus, SlurmJobState, forget_slurm_states, one_line,
                            read_job, read_result, read_submissions, record_job_end, record_job_signal,
                            record_job_start, record_plan, record_submission, result_error, run_status,
                            slurm_command, slurm_failure, slurm_job_state, slurm_log_reason)
from diffmem.train import TrainResult, train

CLUSTERS = ("debug", "local", "slurm")
KINDS = ("train", "evaluate")
NO_TIME_LIMIT_MIN = 60 * 24 * 365  # a local job without --time: one year, i.e. never signalled


class SweepError(ValueError):
    """A sweep that cannot be planned or submitted; the message says what to change."""


# --- one job ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobOutcome:
    """What a :class:`RunJob` returns: ``status`` "done" | "skipped" (was done) | "evaluated" | "interrupted";
    ``step`` the optimizer steps completed."""

    name: str
    kind: str
    status: str
    step: int | None


def _print(message: str) -> None:
    print(message, flush=True)


def _preemption_signal() -> signal.Signals:
    """The signal submitit treats as preemption / time limit (USR2 unless $SUBMITIT_PREEMPT_SIGNAL says otherwise)."""
    return getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)


def _has_python_handler(sig: int) -> bool:
    return callable(signal.getsignal(sig))


def _current_job_id() -> str | None:
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:  # not inside a submitit job (debug executor, or called directly)
        return None


class RunJob(Checkpointable):
    """The job of one run folder: ``kind="train"`` trains it (continuing a partial run, skipping a finished one)
    and then evaluates every checkpoint that lacks a metrics line when ``cfg.eval.inline``; ``kind="evaluate"``
    only evaluates. Idempotent, so a requeue is a rerun."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path, kind: str = "train", progress: bool = False):
        if kind not in KINDS:
            raise SweepError(f"job kind '{kind}' is unknown; choose one of {', '.join(KINDS)}")
        self.cfg, self.run_dir, self.kind, self.progress = cfg, Path(run_dir), kind, progress
        self.step: int | None = None  # steps done when the job last stopped

    def __call__(self) -> JobOutcome:
        run = RunDir(self.run_dir)
        record_job_start(run.path, self.kind, _current_job_id())
        early = os.environ.pop(EARLY_SIGNAL_ENV, None)
        preempt = _preemption_signal()
        if early == preempt.name and _has_python_handler(preempt):  # see JOB_RUNNER
            _print(f"{run.path.name}: {early} arrived while the job was starting; handing over to submitit to requeue")
            signal.raise_signal(preempt)
        try:
            if self.kind == "evaluate":
                evaluate_run(run.path, device=self.cfg.train.device, log=_print)
                outcome = JobOutcome(run.path.name, self.kind, "evaluated", None)
            else:
                result = self._train(run)
                self.step = result.step
                if result.status != "interrupted" and self.cfg.eval.inline and \
                        set(run.checkpoint_steps()) - run.evaluated_steps():
                    evaluate_run(run.path, device=self.cfg.train.device, log=_print)
                outcome = JobOutcome(run.path.name, self.kind, result.status, result.step)
        except KeyboardInterrupt:
            record_job_end(run.path, "interrupted", step=self.step)
            raise
        except Exception as e:
            record_job_end(run.path, "failed", step=self.step, error=one_line(e))
            raise
        record_job_end(run.path, outcome.status, step=outcome.step)
        return outcome

    def _train(self, run: RunDir) -> TrainResult:
        """train(), acting on the signals that interrupted it as submitit's handlers would (module docstring)."""
        preempt = _preemption_signal()
        while True:
            result = train(self.cfg, run.path, progress=self.progress, log=_print)
            self.step = result.step
            if result.status != "interrupted":
                return result
            if preempt.name in result.signals:
                if _has_python_handler(preempt):  # submitit's: checkpoint() and requeue, then exit this process
                    _print(f"{run.path.name}: {preempt.name} at step {result.step}, state saved; handing over to "
                           "submitit to requeue")
                    signal.raise_signal(preempt)
                return result
            if signal.SIGINT.name in result.signals:
                raise KeyboardInterrupt
            if signal.SIGTERM.name in result.signals and _has_python_handler(signal.SIGTERM):
                record_job_signal(run.path, signal.SIGTERM.name)
                _print(f"{run.path.name}: SIGTERM at step {result.step}; inside a submitit job it is ignored (the "
                       f"preemption signal is {preempt.name}): continuing from state.pt")
                continue
            return result

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Called by submitit on preemption / time limit: requeue this same job. Its state is the run folder
        (``state.pt``, checkpoints, metrics), so the requeued job resumes where this one stopped."""
        record_job_end(self.run_dir, "requeued", step=self.step)
        return super().checkpoint(*args, **kwargs)


# --- options and the plan -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterOptions:
    """Where and how the jobs run.

    max_parallel: local: jobs at once (default one per GPU, else one per CPU core); slurm: the array's ``%K``
        (default 256). gpus: local: GPU indices to hand out (default every visible GPU).
    gpus_per_job: slurm: GPUs per job; None: from the runs' train.device (see :func:`job_gpus`).
    time_hours: slurm ``--time`` per job (default 24 h); local: each job's time slice, after which it is
        signalled and requeued (default: none). signal_delay_s: seconds between the preemption signal and the end
        of the time slice (an inline evaluation may have to finish before the state is saved).
    max_requeues: time-limit requeues per job before submitit gives up (preemptions do not count).
    setup: shell lines run in the sbatch script before the job (e.g. ``module load cuda``).
    slurm_options: extra ``#SBATCH --key=value`` lines, as (key, value) pairs.
    poll_s: local and slurm with wait: seconds between checks of the running jobs.
    """

    cluster: str = "local"
    max_parallel: int | None = None
    gpus: tuple[int, ...] | None = None
    time_hours: float | None = None
    partition: str | None = None
    gpus_per_job: int | None = None
    cpus_per_job: int | None = None
    mem_gb: float | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    signal_delay_s: int = 300
    max_requeues: int = 20
    setup: tuple[str, ...] = ()
    slurm_options: tuple[tuple[str, str], ...] = ()
    poll_s: float = 1.0

    def __post_init__(self):
        if self.cluster not in CLUSTERS:
            raise SweepError(f"--cluster {self.cluster} is unknown; choose one of {', '.join(CLUSTERS)}")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise SweepError(f"--max-parallel {self.max_parallel} must be >= 1")
        if self.time_hours is not None and not (math.isfinite(self.time_hours) and self.time_hours > 0):
            raise SweepError(f"--time {self.time_hours} must be a finite number > 0 (hours)")  # NaN fails too
        if self.mem_gb is not None and not (math.isfinite(self.mem_gb) and self.mem_gb >= 0):
            raise SweepError(f"--mem-gb {self.mem_gb} must be a finite number >= 0 (GB; 0: Slurm's whole node)")
        if self.time_hours is not None and self.signal_delay_s >= self.time_hours * 3600:
            raise SweepError(f"--signal-delay-s {self.signal_delay_s} must be shorter than --time "
                             f"({self.time_hours * 3600:.0f} s)")
        if self.signal_delay_s < 1 or self.max_requeues < 0 or (self.gpus_per_job or 0) < 0:
            raise SweepError("--signal-delay-s must be >= 1, --max-requeues and --gpus-per-job >= 0")
        if self.poll_s <= 0:
            raise SweepError(f"poll_s = {self.poll_s} must be > 0 seconds")


@dataclass(frozen=True)
class SweepEntry:
    """One run of the grid: its state now and the jobs (kinds, in order) a sweep submits for it."""

    run: PlannedRun
    status: RunStatus
    jobs: tuple[str, ...]

    @property
    def note(self) -> str:
        if self.jobs:
            return " + ".join(self.jobs)
        if self.status.state in ("running", "queued"):
            return f"skip ({self.status.state} as job {self.status.job_id})"
        return "skip (done)"


def check_split_sizes(base: RunConfig, sweep: SweepConfig) -> None:
    """Raise SweepError (one line) when the source's training part cannot hold ``sweep.splits``' disjoint train
    blocks for the grid's largest N: split i trains on images [i N, (i + 1) N) of the training part (the images
    before the held-out pool, :func:`diffmem.data.make_splits`), so the largest split k needs (k + 1) N of them.
    Reads the source's images only when a split other than 0 is asked for."""
    top = max(sweep.splits)
    if top == 0:
        return
    images = load_images(base.data)
    total = len(images)
    n_heldout = base.data.n_heldout or default_heldout(total)
    n_training = total - n_heldout
    n = max([*(sweep.n or [base.data.n]), *(cell[0] for cell in sweep.cells)])
    if (top + 1) * n > n_training:
        raise SweepError(f"sweep.splits = {sweep.splits} needs {top + 1} disjoint train blocks of N = {n} "
                         f"({(top + 1) * n} images) beside the held-out pool of {n_heldout}, but source "
                         f"'{base.data.source}' has {total} images ({n_training} for training); lower the largest N, "
                         "the splits or data.n_heldout")


def plan_sweep(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path, *,
               eval_separately: bool = False) -> list[SweepEntry]:
    """Every run of the grid with its state and the jobs to submit: none for done runs and runs whose job is
    queued or running; "train" (train + inline evaluation); or with ``eval_separately`` "train" then "evaluate"
    (or only "evaluate" for a trained run with unevaluated checkpoints). Refuses run folders that hold another
    configuration, and split blocks that the source cannot hold (:func:`check_split_sizes`)."""
    if not sweep.n and not sweep.width:
        raise SweepError("the experiment's [sweep] grid is empty: list the train-set sizes and/or widths, e.g. "
                         "[sweep] n = [128, 256] width = [32] (or --set 'sweep.n=[128, 256]'); for one run use "
                         "`diffmem train`")
    check_split_sizes(base, sweep)
    entries, conflicts = [], []
    for planned in expand_grid(base, sweep, experiment_dir):
        run = RunDir(planned.path)
        stored = run.read_config()  # a damaged config.json is a one-line ConfigFileError naming it
        if stored is not None:
            diffs = continuation_diff(stored.raw, planned.cfg)
            if diffs:
                conflicts.append(f"{planned.name} ({'; '.join(diffs[:3])})")
        status = run_status(planned.path, total=planned.cfg.train.steps)
        if status.state in ("done", "running", "queued"):
            jobs: tuple[str, ...] = ()
        elif eval_separately:
            jobs = ("train", "evaluate") if status.needs_training else ("evaluate",)
        else:
            jobs = ("train",)
        entries.append(SweepEntry(planned, status, jobs))
    if conflicts:
        raise SweepError(f"{len(conflicts)} run folder(s) under {experiment_dir} hold a different config: "
                         f"{conflicts[0]}; use another --out folder or the config they were trained with")
    return entries


def local_job_threads(parallel: int) -> int:
    """The torch threads of each of ``parallel`` local jobs: the machine's cores shared among them, at least 1."""
    return max(1, (os.cpu_count() or 1) // parallel)


def job_config(cfg: RunConfig, kind: str, *, eval_separately: bool, threads: int = 0) -> RunConfig:
    """The config a job runs with: eval.inline off for training jobs of ``eval_separately`` sweeps, and
    ``threads`` torch threads when > 0 and the config leaves train.num_threads at 0 (execution keys only, so the
    run folder's config is unchanged)."""
    if kind == "train" and eval_separately:
        cfg = cfg.replace(eval={"inline": False})
    if threads > 0 and cfg.train.num_threads == 0:
        cfg = cfg.replace(train={"num_threads": threads})
    return cfg


# --- results and report ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobResult:
    """One submitted job as the sweep saw it: ``status`` is a :class:`JobOutcome` status, "failed" (with
    ``error``, one line), "interrupted" (a SIGINT stopped the job with its state saved: a rerun continues),
    "cancelled" (slurm: scancel) or "submitted" (slurm, when the sweep does not wait)."""

    name: str
    kind: str
    job_id: str
    status: str
    step: int | None = None
    error: str | None = None
    log: str | None = None


@dataclass
class SweepReport:
    """What a sweep planned, submitted and (debug / local) saw finish; ``scripts`` are the sbatch scripts of a
    slurm dry run."""

    experiment_dir: Path
    options: ClusterOptions
    entries: list[SweepEntry]
    results: list[JobResult] = field(default_factory=list)
    scripts: list[tuple[str, str]] = field(default_factory=list)  # (title, sbatch script)
    dry_run: bool = False

    @property
    def failed(self) -> list[JobResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def cancelled(self) -> list[JobResult]:
        return [r for r in self.results if r.status == "cancelled"]

    def format(self) -> str:
        todo = [e for e in self.entries if e.jobs]
        states = {}
        for e in self.entries:
            states[e.status.state] = states.get(e.status.state, 0) + 1
        lines = [f"{self.experiment_dir}: {len(self.entries)} runs ("
                 + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + f"), {len(todo)} to submit"
                 + (f" to {self.options.cluster}" if todo else "")]
        if self.dry_run:
            rows = [["run", "state", "step/total", "jobs", "folder"]]
            for e in self.entries:
                total = "?" if e.status.total is None else str(e.status.total)
                rows.append([e.run.name, e.status.state, f"{e.status.step}/{total}", e.note, str(e.run.path)])
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
            for title, script in self.scripts:
                lines += ["", f"# {title}", script.rstrip()]
            return "\n".join(lines)
        for r in self.results:
            detail = f" at step {r.step}" if r.step is not None else ""
            if r.status == "failed":
                detail = f": {r.error}" + (f" (log: {r.log})" if r.log else "")
            lines.append(f"  {r.name} {r.kind} job {r.job_id}: {r.status}{detail}")
        if self.failed:
            lines.append(f"{len(self.failed)} job(s) failed; fix the cause and rerun the same command (finished runs "
                         "are skipped)")
        if self.cancelled:
            lines.append(f"{len(self.cancelled)} job(s) cancelled; rerun the same command to continue them")
        lines.append(f"watch with: diffmem status {self.experiment_dir}")
        return "\n".join(lines)


# --- executors --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Task:
    entry: SweepEntry
    kind: str
    follow_up: tuple[str, ...]  # kinds to submit after this one succeeds


def _tasks(entries: list[SweepEntry]) -> list[_Task]:
    """The first job of every run to submit, each carrying the jobs that follow it."""
    return [_Task(e, e.jobs[0], e.jobs[1:]) for e in entries if e.jobs]


def visible_gpus() -> tuple[int, ...]:
    """Indices of the GPUs this process may use: $CUDA_VISIBLE_DEVICES when set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [s.strip() for s in env.split(",") if s.strip()]
        if not all(s.isdigit() for s in ids):
            raise SweepError(f"CUDA_VISIBLE_DEVICES={env} names GPUs by id strings; pass --gpus with indices, "
                             "e.g. --gpus 0,1")
        return tuple(int(s) for s in ids)
    import torch

    return tuple(range(torch.cuda.device_count()))


def _submitit_folder(experiment_dir: Path) -> Path:
    return (experiment_dir / SUBMITIT_DIR).absolute()


def _record(task: _Task, job: submitit.Job, cluster: str) -> None:
    logs = cluster != "debug"  # the debug executor runs in this process and writes no log files
    record_submission(task.entry.run.path, job_id=str(job.job_id), cluster=cluster, kind=task.kind,
                      steps=task.entry.run.cfg.train.steps,
                      stdout=str(job.paths.stdout) if logs else None, stderr=str(job.paths.stderr) if logs else None)


def _failure_line(task: _Task, job_id: str, error: BaseException, experiment_dir: Path) -> str:
    """The one line that says why a job failed: the job's own record, else the end of submitit's traceback."""
    record = read_job(task.entry.run.path) or {}
    if record.get("outcome") == "failed" and record.get("job_id") in (job_id, None) and record.get("error"):
        return record["error"]
    if isinstance(error, submitit.core.utils.UncompletedJobError):
        return "the job ended without a result (killed, or out of memory?); see its log"
    return result_error(experiment_dir, job_id) or one_line(error)


def _interrupted_record(run_dir: Path, job_id: str) -> dict[str, Any] | None:
    """The run's job record when it says that job ``job_id`` was stopped by a SIGINT (state saved, a rerun
    continues), else None."""
    record = read_job(run_dir) or {}
    return record if record.get("outcome") == "interrupted" and record.get("job_id") in (job_id, None) else None


def _errored(task: _Task, job_id: str, error: BaseException, experiment_dir: Path, log: str | None = None) -> JobResult:
    """The JobResult of a job that raised: "interrupted" when its own record says a SIGINT stopped it, else
    "failed" with the one line that says why."""
    if (record := _interrupted_record(task.entry.run.path, job_id)) is not None:
        return JobResult(task.entry.run.name, task.kind, job_id, "interrupted", record.get("step"), log=log)
    return JobResult(task.entry.run.name, task.kind, job_id, "failed",
                     error=_failure_line(task, job_id, error, experiment_dir), log=log)


def _run_debug(tasks: list[_Task], cfg_for: Callable[[_Task, str], RunConfig], experiment_dir: Path,
               progress: bool, log: Callable[[str], None]) -> list[JobResult]:
    """Every job in this process, one after the other. ``job.exception()`` runs a debug job without opening
    submitit's post-mortem debugger on failure, so a failing run is reported and the next one starts."""
    executor = submitit.DebugExecutor(folder=_submitit_folder(experiment_dir))
    results = []
    for task in tasks:
        for kind in (task.kind, *task.follow_up):
            this = _Task(task.entry, kind, ())
            job = executor.submit(RunJob(cfg_for(task, kind), task.entry.run.path.absolute(), kind, progress))
            _record(this, job, "debug")
            error = job.exception()
            if error is None:
                outcome: JobOutcome = job.result()
                result = JobResult(outcome.name, kind, job.job_id, outcome.status, outcome.step)
            else:
                result = _errored(this, job.job_id, error, experiment_dir)
            results.append(result)
            log(f"{result.name} {kind}: {result.status}" + (f": {result.error}" if result.error else ""))
            if result.status not in ("done", "skipped", "evaluated"):
                break
    return results


def _run_local(tasks: list[_Task], cfg_for: Callable[[_Task, str], RunConfig], experiment_dir: Path,
               options: ClusterOptions, gpus: tuple[int, ...], parallel: int,
               log: Callable[[str], None]) -> list[JobResult]:
    """At most ``parallel`` submitit local jobs at once, the GPU with the fewest jobs for each new one; a run's
    follow-up job (its evaluation) starts when its training job succeeded."""
    executor = submitit.LocalExecutor(folder=_submitit_folder(experiment_dir), max_num_timeout=options.max_requeues)
    timeout_min = options.time_hours * 60 if options.time_hours else NO_TIME_LIMIT_MIN
    pending = deque(tasks)
    active: dict[Any, tuple[_Task, int | None]] = {}
    load = {g: 0 for g in gpus}
    results: list[JobResult] = []
    try:
        while pending or active:
            while pending and len(active) < parallel:
                task = pending.popleft()
                gpu = min(gpus, key=lambda g: load[g]) if gpus else None
                executor.update_parameters(timeout_min=timeout_min, signal_delay_s=options.signal_delay_s,
                                           gpus_per_node=0 if gpu is None else 1,
                                           visible_gpus=() if gpu is None else (gpu,))
                job = executor.submit(RunJob(cfg_for(task, task.kind), task.entry.run.path.absolute(), task.kind))
                _record(task, job, "local")
                if gpu is not None:
                    load[gpu] += 1
                active[job] = (task, gpu)
                log(f"{task.entry.run.name} {task.kind}: started job {job.job_id}"
                    + (f" on GPU {gpu}" if gpu is not None else ""))
            time.sleep(options.poll_s)
            for job in [j for j in active if j.done()]:
                task, gpu = active.pop(job)
                if gpu is not None:
                    load[gpu] -= 1
                error = job.exception()
                if error is None:
                    outcome: JobOutcome = job.result()
                    result = JobResult(outcome.name, task.kind, job.job_id, outcome.status, outcome.step,
                                       log=str(job.paths.stdout))
                else:
                    result = _errored(task, job.job_id, error, experiment_dir, log=str(job.paths.stderr))
                results.append(result)
                log(f"{result.name} {task.kind}: {result.status}" + (f": {result.error}" if result.error else ""))
                if result.status in ("done", "skipped", "evaluated") and task.follow_up:
                    pending.appendleft(_Task(task.entry, task.follow_up[0], task.follow_up[1:]))
    except KeyboardInterrupt:
        for job in active:
            job.cancel(check=False)  # SIGINT: training saves state.pt and stops
        raise
    return results


# --- slurm ------------------------------------------------------------------------------------------------------------

DEFAULT_TIME_HOURS = 24.0
DEFAULT_ARRAY_PARALLELISM = 256
SBATCH_TIMEOUT_S = 120.0
GPU_OPTION_KEYS = frozenset({"gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "tres-per-job",
                             "tres-per-node", "tres-per-task"})
"""Extra --slurm-option keys that request GPUs themselves; with one of them the sweep adds no GPU request."""
EARLY_SIGNAL_ENV = "DIFFMEM_EARLY_SIGNAL"
JOB_RUNNER = f"""
import os, signal
# Slurm may send the time-limit signal as the job starts (up to a minute early): until the handlers of
# submitit are in place, only note it; RunJob then hands it to them
preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
signal.signal(preempt, lambda sig, frame: os.environ.__setitem__("{EARLY_SIGNAL_ENV}", signal.Signals(sig).name))
from submitit.core.submission import submitit_main
submitit_main()
"""
"""What each job's srun runs (``python -u -c JOB_RUNNER <folder>``): submitit's job runner, which loads the task's
pickled RunJob, installs the preemption handlers and stores the result; a preemption signal that arrives before
those handlers is kept for :class:`RunJob` instead of killing the job."""


def partition_has_gpus(partition: str | None) -> bool | None:
    """Whether the nodes of ``partition`` (default: the cluster's default partition) have GPUs (a "gpu" generic
    resource in ``sinfo``); None when Slurm cannot be asked or does not know the partition."""
    done = slurm_command(["sinfo", "-h", "-o", "%P|%G"])
    if done is None or done.returncode != 0:
        return None
    gres = []
    for line in done.stdout.splitlines():
        name, _, resources = line.strip().partition("|")
        if (partition is None and name.endswith("*")) or (partition is not None and name.rstrip("*") == partition):
            gres.append(resources)
    if not gres:
        return None
    return any("gpu" in g.lower() for g in gres)


def job_gpus(options: ClusterOptions, cfgs: list[RunConfig]) -> int:
    """GPUs each Slurm job of these runs asks for (``--gpus-per-node``): ``options.gpus_per_job`` when set; 0 when
    an extra slurm option requests GPUs itself (``gres=gpu:a100:1``, ``gpus=...``); else from ``train.device``:
    0 for "cpu", 1 for "cuda" (or "cuda:N"), and for "auto" 1 unless the partition is known to have no GPUs."""
    if options.gpus_per_job is not None:
        return options.gpus_per_job
    if any(key.replace("_", "-") in GPU_OPTION_KEYS for key, _ in options.slurm_options):
        return 0
    devices = {cfg.train.device for cfg in cfgs}
    if devices and devices <= {"cpu"}:
        return 0
    if any(d.startswith("cuda") for d in devices):
        return 1
    return 0 if partition_has_gpus(options.partition) is False else 1


def _time_min(options: ClusterOptions) -> int:
    """The job time limit in whole minutes (Slurm's smallest is one)."""
    return max(1, round((options.time_hours or DEFAULT_TIME_HOURS) * 60))


def _mem(gb: float) -> str:
    return f"{int(gb)}G" if float(gb).is_integer() else f"{max(1, round(gb * 1024))}M"


def sbatch_options(n_jobs: int, options: ClusterOptions, folder: Path, job_name: str, gpus: int,
                   dependency: str | None = None) -> list[tuple[str, str | None]]:
    """The ``#SBATCH`` options of a sweep's job (array when n_jobs > 1), in script order; value None: a flag."""
    log = "%A_%a" if n_jobs > 1 else "%j"
    time_min = _time_min(options)
    opts: list[tuple[str, str | None]] = [("job-name", job_name)]
    if n_jobs > 1:
        parallel = min(n_jobs, options.max_parallel or DEFAULT_ARRAY_PARALLELISM)
        opts.append(("array", f"0-{n_jobs - 1}%{parallel}"))
    opts += [("output", f"{folder}/{log}_0_log.out"), ("error", f"{folder}/{log}_0_log.err"),
             ("open-mode", "append"), ("time", str(time_min)), ("signal", f"{submitit.JobEnvironment.USR_SIG}@{options.signal_delay_s}"),
             ("requeue", None), ("nodes", "1"), ("ntasks-per-node", "1")]
    for key, value in (("partition", options.partition), ("account", options.account), ("qos", options.qos),
                       ("constraint", options.constraint)):
        if value:
            opts.append((key, value))
    if gpus:
        opts.append(("gpus-per-node", str(gpus)))
    if options.cpus_per_job:
        opts.append(("cpus-per-task", str(options.cpus_per_job)))
    if options.mem_gb is not None:
        opts.append(("mem", _mem(options.mem_gb)))
    if dependency:
        opts += [("dependency", dependency), ("kill-on-invalid-dep", "yes")]  # an evaluation whose training failed
    extra = dict(options.slurm_options)                                       # is dropped, not left pending
    opts = [(k, extra.pop(k)) if k in extra else (k, v) for k, v in opts]  # an extra option replaces ours
    opts += list(extra.items())
    return opts


def render_sbatch(n_jobs: int, options: ClusterOptions, experiment_dir: str | Path, job_name: str,
                  dependency: str | None = None, *, gpus: int | None = None) -> str:
    """The sbatch script of ``n_jobs`` jobs of a sweep (an array when n_jobs > 1): what ``--dry-run`` prints and
    what is submitted. ``gpus`` per job (default ``options.gpus_per_job``, else 1). Each job runs submitit's job
    runner on the pickled task ``<folder>/<job id>_submitted.pkl``, through srun so that Slurm's USR2 reaches it."""
    folder = _submitit_folder(Path(experiment_dir))
    if gpus is None:
        gpus = 1 if options.gpus_per_job is None else options.gpus_per_job
    lines = ["#!/bin/bash", f"# diffmem sweep: {n_jobs} job(s) of {Path(experiment_dir).absolute()}"]
    for key, value in sbatch_options(n_jobs, options, folder, job_name, gpus, dependency):
        lines.append(f"#SBATCH --{key}" if value in (None, "") else f"#SBATCH --{key}={value}")
    if options.setup:
        lines += ["", "# setup", *options.setup]
    log = "%A_%a" if n_jobs > 1 else "%j"
    srun = ["srun", "--unbuffered", "--output", f"{folder}/{log}_0_log.out", "--error", f"{folder}/{log}_0_log.err"]
    python = [sys.executable, "-u", "-c", JOB_RUNNER, str(folder)]
    lines += ["", "# the job: submitit's runner loads this task's pickled RunJob and runs it",
              "export SUBMITIT_EXECUTOR=slurm", " ".join(shlex.quote(a) for a in srun + python), ""]
    return "\n".join(lines)


def _sbatch(script: str, folder: Path, what: str, gpus: int) -> str:
    """Submit ``script`` with sbatch; the job id. A refusal is a SweepError with sbatch's own line."""
    path = folder / f".{uuid.uuid4().hex}_submission.sh"
    path.write_text(script)
    try:
        try:
            done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise SweepError(f"sbatch did not answer in {SBATCH_TIMEOUT_S:.0f} s (is slurmctld up? `scontrol ping`)")
        found = re.search(r"Submitted batch job (\d+)", done.stdout) or re.search(r"job (\d+)", done.stdout)
        if done.returncode != 0 or not found:
            said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            message = said[-1] if said else f"exit code {done.returncode}"  # sbatch's last line says why
            hint = ""
            if gpus and re.search(r"gres|gpu", message, re.IGNORECASE):
                hint = (f" (each job asks for {gpus} GPU(s): on a CPU-only partition pass --gpus-per-job 0 or "
                        "--set train.device=\"cpu\")")
            raise SweepError(f"sbatch refused {what}: {message}{hint}")
        job_id = found.group(1)
        forget_slurm_states()
        path.rename(folder / f"{job_id}_submission.sh")
        return job_id
    finally:
        path.unlink(missing_ok=True)


def _submit_slurm_group(jobs: list[RunJob], options: ClusterOptions, experiment_dir: Path, job_name: str,
                        gpus: int, dependency: str | None, what: str) -> list[str]:
    """Pickle each job for submitit's runner, submit one sbatch script (an array when several) and put each pickle
    where its task will look for it; the job ids ("<array>_<task>", or "<id>" for one job)."""
    from submitit.core.utils import JobPaths

    folder = _submitit_folder(experiment_dir)
    folder.mkdir(parents=True, exist_ok=True)
    time_min = _time_min(options)
    pickles = []
    try:
        for job in jobs:
            delayed = DelayedSubmission(job)
            delayed.set_timeout(time_min, options.max_requeues)
            path = folder / f".{uuid.uuid4().hex}.pkl"
            delayed.dump(path)
            pickles.append(path)
        script = render_sbatch(len(jobs), options, experiment_dir, job_name, dependency, gpus=gpus)
        array_id = _sbatch(script, folder, what, gpus)
        ids = [f"{array_id}_{i}" for i in range(len(jobs))] if len(jobs) > 1 else [array_id]
        for job_id, path in zip(ids, pickles):  # the runner waits up to 60 s for its pickle
            path.rename(JobPaths(folder, job_id=job_id).submitted_pickle)
        return ids
    finally:
        for path in pickles:
            path.unlink(missing_ok=True)


def _array_dependency(job_ids: list[str]) -> str:
    """Each evaluation task waits for its own training task (``aftercorr``; ``afterok`` for a single job)."""
    return f"aftercorr:{job_ids[0].split('_')[0]}" if len(job_ids) > 1 else f"afterok:{job_ids[0]}"


def _slurm_groups(tasks: list[_Task]) -> list[tuple[str, list[_Task], bool]]:
    """(kind, tasks, depends on the previous group) for the arrays a slurm sweep submits: training jobs; the
    evaluations that follow them, task by task; evaluations of runs trained already."""
    train = [t for t in tasks if t.kind == "train"]
    groups = [("train", train, False)] if train else []
    then_eval = [_Task(t.entry, "evaluate", ()) for t in train if "evaluate" in t.follow_up]
    if then_eval:
        groups.append(("evaluate", then_eval, True))
    eval_only = [t for t in tasks if t.kind == "evaluate"]
    if eval_only:
        groups.append(("evaluate", eval_only, False))
    return groups


def _slurm_job_name(experiment_dir: Path, kind: str) -> str:
    return f"diffmem-{experiment_dir.name}" + ("-eval" if kind == "evaluate" else "")


def _run_slurm(tasks: list[_Task], cfg_for: Callable[[_Task, str], RunConfig], experiment_dir: Path,
               options: ClusterOptions) -> list[JobResult]:
    """Submit one job array per group (see :func:`_slurm_groups`) and return without waiting."""
    folder = _submitit_folder(experiment_dir)
    results: list[JobResult] = []
    previous: list[str] | None = None
    for kind, group, depends in _slurm_groups(tasks):
        cfgs = [cfg_for(t, kind) for t in group]
        gpus = job_gpus(options, cfgs)
        dependency = _array_dependency(previous) if depends and previous else None
        jobs = [RunJob(cfg, t.entry.run.path.absolute(), kind) for cfg, t in zip(cfgs, group)]
        ids = _submit_slurm_group(jobs, options, experiment_dir, _slurm_job_name(experiment_dir, kind), gpus,
                                  dependency, f"the {len(group)} {kind} job(s)")
        for task, job_id in zip(group, ids):
            stdout, stderr = (str(folder / f"{job_id}_0_log.{ext}") for ext in ("out", "err"))
            record_submission(task.entry.run.path, job_id=job_id, cluster="slurm", kind=kind,
                              steps=task.entry.run.cfg.train.steps, stdout=stdout, stderr=stderr)
            results.append(JobResult(task.entry.run.name, kind, job_id, "submitted", log=stdout))
        previous = ids
    return results


def _ended_slurm_job(submitted: JobResult, state: SlurmJobState | str | None, experiment_dir: Path) -> JobResult:
    """The JobResult of a Slurm job that is no longer queued or running: its stored result, else Slurm's state."""
    result = read_result(experiment_dir, submitted.job_id)
    err_log = submitted.log[:-len(".out")] + ".err" if submitted.log and submitted.log.endswith(".out") else None
    base = {"name": submitted.name, "kind": submitted.kind, "job_id": submitted.job_id}
    if result is not None and result[0] == "success" and isinstance(result[1], JobOutcome):
        return JobResult(**base, status=result[1].status, step=result[1].step, log=submitted.log)
    if result is not None and result[0] == "error":
        if (record := _interrupted_record(experiment_dir / submitted.name, submitted.job_id)) is not None:
            return JobResult(**base, status="interrupted", step=record.get("step"), log=submitted.log)
        record = read_job(experiment_dir / submitted.name) or {}
        error = record.get("error") if record.get("job_id") == submitted.job_id and record.get("outcome") == "failed" \
            else result_error(experiment_dir, submitted.job_id)
        return JobResult(**base, status="failed", error=error, log=err_log)
    if isinstance(state, SlurmJobState) and state.state == "CANCELLED":
        return JobResult(**base, status="cancelled", log=submitted.log)
    if isinstance(state, SlurmJobState) and state.state != "COMPLETED":
        return JobResult(**base, status="failed", error=slurm_failure(state, err_log), log=err_log)
    why = slurm_log_reason(err_log)
    return JobResult(**base, status="failed", log=err_log,
                     error=f"Slurm: {why}" if why else "the job ended without a result (killed?); see its log")


def wait_slurm(submitted: list[JobResult], experiment_dir: str | Path, *, poll_s: float = 5.0,
               log: Callable[[str], None] = print, timeout_s: float | None = None) -> list[JobResult]:
    """Follow submitted Slurm jobs until none is queued or running (a requeued job counts as queued), and return
    what became of each: its result (done / evaluated / failed with the error line) or, for a job Slurm ended
    without a result, "cancelled" or "failed" with Slurm's state (e.g. OUT_OF_MEMORY). Job states come from
    :func:`diffmem.status.slurm_job_state` (``scontrol``, then ``sacct`` where there is an accounting database), so
    this needs no slurmdbd and never waits on a job that Slurm no longer runs. ``timeout_s``: stop waiting then
    (the jobs keep their "submitted" status)."""
    experiment_dir = Path(experiment_dir)
    pending = {r.job_id: r for r in submitted}
    final: dict[str, JobResult] = {}
    seen: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        for job_id, job in list(pending.items()):
            state = slurm_job_state(job_id, fresh=True)
            if state == UNREACHABLE:
                if seen.get(job_id) != UNREACHABLE:
                    log(f"{job.name} {job.kind} job {job_id}: Slurm does not answer; still waiting")
                    seen[job_id] = UNREACHABLE
                continue
            if isinstance(state, SlurmJobState) and state.active:
                if seen.get(job_id) != state.state:
                    log(f"{job.name} {job.kind} job {job_id}: {state.state.lower()}")
                    seen[job_id] = state.state
                continue
            result = _ended_slurm_job(job, state, experiment_dir)
            final[job_id] = result
            del pending[job_id]
            log(f"{result.name} {result.kind} job {job_id}: {result.status}"
                + (f": {result.error}" if result.error else ""))
        if pending:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(poll_s)
    return [final.get(r.job_id, r) for r in submitted]


def run_sweep(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path, options: ClusterOptions, *,
              eval_separately: bool = False, dry_run: bool = False, progress: bool = True,
              log: Callable[[str], None] = print, wait: bool = False) -> SweepReport:
    """Plan the grid and run (debug, local: until every job ended) or submit (slurm: returns at once, or with
    ``wait`` when every job has ended, see :func:`wait_slurm`) the jobs of every unfinished run. ``dry_run`` only
    plans (and renders the slurm scripts); it writes nothing."""
    experiment_dir = Path(experiment_dir)
    entries = plan_sweep(base, sweep, experiment_dir, eval_separately=eval_separately)
    if options.cluster == "local" and not dry_run and _wait_for_earlier_local_jobs(entries, options.poll_s, log):
        entries = plan_sweep(base, sweep, experiment_dir, eval_separately=eval_separately)
    report = SweepReport(experiment_dir, options, entries, dry_run=dry_run)
    tasks = _tasks(entries)
    gpus: tuple[int, ...] = ()
    parallel = 1
    if options.cluster == "local":
        gpus = options.gpus if options.gpus is not None else visible_gpus()
        parallel = options.max_parallel or len(gpus) or os.cpu_count() or 1
    threads = 0
    if options.cluster == "local":
        threads = local_job_threads(parallel)
    elif options.cluster == "slurm":  # the job's CPUs, not every core of its node
        threads = options.cpus_per_job or _int_or(dict(options.slurm_options).get("cpus-per-task"), 1)

    def cfg_for(task: _Task, kind: str) -> RunConfig:
        return job_config(task.entry.run.cfg, kind, eval_separately=eval_separately, threads=threads)

    if dry_run:
        if options.cluster == "slurm":
            for kind, group, depends in _slurm_groups(tasks):
                dependency = "aftercorr:<training array id>" if depends else None
                gpus = job_gpus(options, [cfg_for(t, kind) for t in group])
                title = (f"sbatch script for {len(group)} {kind} job(s), {gpus} GPU(s) each"
                         + (", each after its training job" if depends else ""))
                report.scripts.append((title, render_sbatch(len(group), options, experiment_dir,
                                                            _slurm_job_name(experiment_dir, kind), dependency,
                                                            gpus=gpus)))
        return report
    if options.cluster == "slurm" and tasks and not (shutil.which("srun") and shutil.which("sbatch")):
        raise SweepError("srun or sbatch is not on PATH, so this is not a Slurm cluster; run on a login node, or "
                         "add --dry-run to see the sbatch script")
    conf = os.environ.get("SLURM_CONF")
    if options.cluster == "slurm" and tasks and conf and not os.path.exists(conf):
        raise SweepError(f"SLURM_CONF={conf} does not exist; point it at the cluster's slurm.conf or unset it")
    record_plan(experiment_dir, {e.run.name: e.run.cfg.train.steps for e in entries})
    if options.cluster == "slurm" and wait:  # also follow the jobs of runs that are queued or running already
        report.results = _followed_slurm_jobs(entries)
    if not tasks and not report.results:
        return report
    if options.cluster == "debug":
        report.results = _run_debug(tasks, cfg_for, experiment_dir, progress, log)
    elif options.cluster == "local":
        longest_first = sorted(tasks, key=lambda t: -t.entry.run.cfg.train.steps)
        report.results = _run_local(longest_first, cfg_for, experiment_dir, options, gpus, parallel, log)
    else:
        submitted = _run_slurm(tasks, cfg_for, experiment_dir, options) if tasks else []
        report.results += submitted
        if wait:
            for r in report.results:
                log(f"{r.name} {r.kind}: " + (f"submitted as job {r.job_id}" if r in submitted else
                                              f"following job {r.job_id}"))
            report.results = wait_slurm(report.results, experiment_dir, poll_s=options.poll_s, log=log)
    return report


def _wait_for_earlier_local_jobs(entries: list[SweepEntry], poll_s: float, log: Callable[[str], None]) -> bool:
    """Wait until the local jobs of an earlier sweep that still work on runs of this one have ended (their
    processes run on this machine), so that a local sweep rerun right after Ctrl-C, while the interrupted jobs are
    still saving their state, continues those runs instead of skipping them; returns whether it waited. Jobs of
    other clusters are left alone (a Slurm sweep follows them instead)."""
    busy = [e for e in entries if not e.jobs and e.status.state in ("running", "queued")
            and e.status.cluster == "local"]
    if not busy:
        return False
    log("waiting for the earlier job(s) still working on " + ", ".join(
        f"{e.run.name} (job {e.status.job_id})" for e in busy) + " to end")
    while any(run_status(e.run.path, total=e.run.cfg.train.steps).state in ("running", "queued") for e in busy):
        time.sleep(poll_s)
    return True


def _followed_slurm_jobs(entries: list[SweepEntry]) -> list[JobResult]:
    """The Slurm jobs of runs that a sweep skips because they are queued or running, as "submitted" results."""
    followed = []
    for e in entries:
        if not e.jobs and e.status.state in ("queued", "running") and e.status.cluster == "slurm" and e.status.job_id:
            subs = read_submissions(e.run.path)
            kind = subs[-1]["kind"] if subs else "train"
            followed.append(JobResult(e.run.name, kind, e.status.job_id, "submitted", log=e.status.log))
    return followed


def _int_or(text: str | None, default: int) -> int:
    return int(text) if text and text.strip().isdigit() else default
