"""Sweeps: every run of an experiment's grid (``[sweep]`` n x width x seeds) as a submitit job.

Three executors, all submitit's (this module only decides what to submit and keeps records):

* ``debug``: in this process, one run after the other (submitit's DebugExecutor);
* ``local``: subprocesses on this machine (submitit's LocalExecutor), at most K at once, one GPU each
  (``CUDA_VISIBLE_DEVICES``) when GPUs exist, and ``cpu_count // K`` torch threads each (unless
  train.num_threads is set);
* ``slurm``: one job array (submitit's SlurmExecutor) with ``%K`` parallelism, ``--signal=USR2@<delay>`` and
  ``--requeue``.

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

Uses submitit 1.5.4; ``--dry-run`` renders the sbatch script with submitit's private
``submitit.slurm.slurm._make_sbatch_string`` (the function SlurmExecutor itself calls), so pin ``submitit==1.5.4``.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from diffmem.config import RunConfig, SweepConfig, continuation_diff
from diffmem.evaluate import evaluate_run
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.rundir import RunDir
from diffmem.status import (SUBMITIT_DIR, RunStatus, one_line, read_job, record_job_end, record_job_start,
                            record_plan, record_submission, result_error, run_status)
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
        (default: submitit's 256). gpus: local: GPU indices to hand out (default every visible GPU).
    time_hours: slurm ``--time`` per job (default 24 h); local: each job's time slice, after which it is
        signalled and requeued (default: none). signal_delay_s: seconds between the preemption signal and the end
        of the time slice (an inline evaluation may have to finish before the state is saved).
    max_requeues: time-limit requeues per job before submitit gives up (preemptions do not count).
    setup: shell lines run in the sbatch script before the job (e.g. ``module load cuda``).
    slurm_options: extra ``#SBATCH --key=value`` lines, as (key, value) pairs.
    poll_s: local: seconds between checks of the running jobs.
    """

    cluster: str = "local"
    max_parallel: int | None = None
    gpus: tuple[int, ...] | None = None
    time_hours: float | None = None
    partition: str | None = None
    gpus_per_job: int = 1
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
        if self.time_hours is not None and self.time_hours <= 0:
            raise SweepError(f"--time {self.time_hours} must be > 0 hours")
        if self.time_hours is not None and self.signal_delay_s >= self.time_hours * 3600:
            raise SweepError(f"--signal-delay-s {self.signal_delay_s} must be shorter than --time "
                             f"({self.time_hours * 3600:.0f} s)")
        if self.signal_delay_s < 1 or self.max_requeues < 0 or self.gpus_per_job < 0:
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


def plan_sweep(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path, *,
               eval_separately: bool = False) -> list[SweepEntry]:
    """Every run of the grid with its state and the jobs to submit: none for done runs and runs whose job is
    queued or running; "train" (train + inline evaluation); or with ``eval_separately`` "train" then "evaluate"
    (or only "evaluate" for a trained run with unevaluated checkpoints). Refuses run folders that hold another
    configuration."""
    if not sweep.n and not sweep.width:
        raise SweepError("the experiment's [sweep] grid is empty: list the train-set sizes and/or widths, e.g. "
                         "[sweep] n = [128, 256] width = [32] (or --set 'sweep.n=[128, 256]'); for one run use "
                         "`diffmem train`")
    entries, conflicts = [], []
    for planned in expand_grid(base, sweep, experiment_dir):
        run = RunDir(planned.path)
        if run.config_path.exists():
            diffs = continuation_diff(json.loads(run.config_path.read_text()).get("config", {}), planned.cfg)
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
    ``error``, one line) or "submitted" (slurm: the sweep does not wait)."""

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
                result = JobResult(task.entry.run.name, kind, job.job_id, "failed",
                                   error=_failure_line(this, job.job_id, error, experiment_dir))
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
                    result = JobResult(task.entry.run.name, task.kind, job.job_id, "failed",
                                       error=_failure_line(task, job.job_id, error, experiment_dir),
                                       log=str(job.paths.stderr))
                results.append(result)
                log(f"{result.name} {task.kind}: {result.status}" + (f": {result.error}" if result.error else ""))
                if result.status in ("done", "skipped", "evaluated") and task.follow_up:
                    pending.appendleft(_Task(task.entry, task.follow_up[0], task.follow_up[1:]))
    except KeyboardInterrupt:
        for job in active:
            job.cancel(check=False)  # SIGINT: training saves state.pt and stops
        raise
    return results


def slurm_parameters(options: ClusterOptions, job_name: str, dependency: str | None = None) -> dict[str, Any]:
    """The SlurmExecutor parameters of a sweep's job array (submitit names; see ``sbatch --help``)."""
    extra: dict[str, Any] = {"requeue": True}
    if dependency:
        extra["kill-on-invalid-dep"] = "yes"  # an evaluation whose training failed is dropped, not left pending
    extra.update(dict(options.slurm_options))
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": int(round((options.time_hours or 24.0) * 60)),
        "signal_delay_s": options.signal_delay_s,
        "additional_parameters": extra,
        "partition": options.partition,
        "gpus_per_node": options.gpus_per_job or None,
        "cpus_per_task": options.cpus_per_job,
        "mem": None if options.mem_gb is None else f"{int(round(options.mem_gb))}GB",
        "account": options.account,
        "qos": options.qos,
        "constraint": options.constraint,
        "setup": list(options.setup) or None,
        "dependency": dependency,
    }
    if options.max_parallel is not None:
        params["array_parallelism"] = options.max_parallel
    return {k: v for k, v in params.items() if v is not None}


def render_sbatch(n_jobs: int, options: ClusterOptions, experiment_dir: str | Path, job_name: str,
                  dependency: str | None = None) -> str:
    """The sbatch script SlurmExecutor submits for ``n_jobs`` jobs (an array when n_jobs > 1), built with
    submitit's own ``_make_sbatch_string`` and submit command, without a cluster (submitit 1.5.4)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = _submitit_folder(Path(experiment_dir))
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, map_count=n_jobs if n_jobs > 1 else None,
                               **slurm_parameters(options, job_name, dependency))


def _array_dependency(jobs: list[submitit.Job]) -> str:
    """Each evaluation task waits for its own training task (``aftercorr``; ``afterok`` for a single job)."""
    first = str(jobs[0].job_id)
    return f"aftercorr:{first.split('_')[0]}" if len(jobs) > 1 else f"afterok:{first}"


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


def _run_slurm(tasks: list[_Task], cfg_for: Callable[[_Task, str], RunConfig], experiment_dir: Path,
               options: ClusterOptions) -> list[JobResult]:
    """Submit one job array per group (see :func:`_slurm_groups`) and return without waiting."""
    folder = _submitit_folder(experiment_dir)
    results, previous = [], None
    for kind, group, depends in _slurm_groups(tasks):
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=options.max_requeues)
        name = f"diffmem-{experiment_dir.name}" + ("-eval" if kind == "evaluate" else "")
        dependency = _array_dependency(previous) if depends and previous else None
        executor.update_parameters(**slurm_parameters(options, name, dependency))
        jobs = executor.submit_array([RunJob(cfg_for(t, kind), t.entry.run.path.absolute(), kind) for t in group])
        for task, job in zip(group, jobs):
            _record(_Task(task.entry, kind, ()), job, "slurm")
            results.append(JobResult(task.entry.run.name, kind, str(job.job_id), "submitted",
                                     log=str(job.paths.stdout)))
        previous = jobs
    return results


def run_sweep(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path, options: ClusterOptions, *,
              eval_separately: bool = False, dry_run: bool = False, progress: bool = True,
              log: Callable[[str], None] = print) -> SweepReport:
    """Plan the grid and run (debug, local: until every job ended) or submit (slurm: returns at once) the jobs of
    every unfinished run. ``dry_run`` only plans (and renders the slurm scripts); it writes nothing."""
    experiment_dir = Path(experiment_dir)
    entries = plan_sweep(base, sweep, experiment_dir, eval_separately=eval_separately)
    report = SweepReport(experiment_dir, options, entries, dry_run=dry_run)
    tasks = _tasks(entries)
    gpus: tuple[int, ...] = ()
    parallel = 1
    if options.cluster == "local":
        gpus = options.gpus if options.gpus is not None else visible_gpus()
        parallel = options.max_parallel or len(gpus) or os.cpu_count() or 1
    threads = max(1, (os.cpu_count() or 1) // parallel) if options.cluster == "local" else 0

    def cfg_for(task: _Task, kind: str) -> RunConfig:
        return job_config(task.entry.run.cfg, kind, eval_separately=eval_separately, threads=threads)

    if dry_run:
        if options.cluster == "slurm":
            for kind, group, depends in _slurm_groups(tasks):
                name = f"diffmem-{experiment_dir.name}" + ("-eval" if kind == "evaluate" else "")
                dependency = "aftercorr:<training array id>" if depends else None
                title = (f"sbatch script for {len(group)} {kind} job(s)"
                         + (", each after its training job" if depends else ""))
                report.scripts.append((title, render_sbatch(len(group), options, experiment_dir, name, dependency)))
        return report
    if options.cluster == "slurm" and tasks and submitit.SlurmExecutor.affinity() <= 0:
        raise SweepError("srun is not on PATH, so this is not a Slurm cluster; run on a login node, or add "
                         "--dry-run to see the sbatch script")
    record_plan(experiment_dir, {e.run.name: e.run.cfg.train.steps for e in entries})
    if not tasks:
        return report
    if options.cluster == "debug":
        report.results = _run_debug(tasks, cfg_for, experiment_dir, progress, log)
    elif options.cluster == "local":
        longest_first = sorted(tasks, key=lambda t: -t.entry.run.cfg.train.steps)
        report.results = _run_local(longest_first, cfg_for, experiment_dir, options, gpus, parallel, log)
    else:
        report.results = _run_slurm(tasks, cfg_for, experiment_dir, options)
    return report
