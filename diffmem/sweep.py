"""Sweeps: every run of an experiment's grid (``[sweep]`` n x width x seeds x splits) as a job for an executor.

This module plans the grid (:func:`plan_sweep`), turns each unfinished run into the jobs of a :class:`RunJob` and
hands them to the executor of ``--cluster`` (debug, local or slurm: :mod:`diffmem.cluster.executors`, chosen once by
:func:`diffmem.cluster.executors.make_executor`), then reports what became of them (:class:`SweepReport`).

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

Outside a submitit job (``--cluster debug``: the jobs run in the sweep's own process, with no submitit handler), a
SIGTERM or SIGUSR2 stops the run in progress with its state saved and ends the sweep there, as SIGINT does: the
debug executor starts no further run (:class:`diffmem.cluster.executors.DebugExecutor`).

Job logs go to ``<experiment_dir>/.submitit/``; job ids and log paths are recorded in each run folder
(see :mod:`diffmem.jobrecords`). :class:`RunJob` and :class:`JobOutcome` stay in this module: submitit pickles them
by their module path into ``.submitit/`` (queued and requeued jobs, results), so moving them would break the jobs of
a running experiment.

Only submitit's public names are used (``submitit.helpers``, ``submitit.core.utils.JobPaths``,
``submitit.core.submission.submitit_main``, the executors and ``JobEnvironment``); the versions tested against a
real Slurm cluster are listed in docs/cluster.md.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from diffmem.cluster.base import ClusterOptions, Job, JobResult, Task
from diffmem.cluster.executors import make_executor
from diffmem.cluster.runstate import ACTIVE_STATES, RunStatus, run_status
from diffmem.cluster.slurm import EARLY_SIGNAL_ENV
from diffmem.config import RunConfig, SweepConfig, continuation_diff
from diffmem.data import default_heldout, load_images
from diffmem.evaluate import evaluate_run
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.jobrecords import one_line, record_job_end, record_job_signal, record_job_start, record_plan
from diffmem.outcomes import CANCELLED, EVALUATED, FAILED, INTERRUPTED, REQUEUED
from diffmem.rundir import RunDir
from diffmem.train import TrainResult, train

KINDS = ("train", "evaluate")


class SweepError(ValueError):
    """A sweep that cannot be planned or submitted; the message says what to change."""


# --- one job ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobOutcome:
    """What a :class:`RunJob` returns: ``status`` DONE | SKIPPED (was done) | EVALUATED | INTERRUPTED of
    :mod:`diffmem.outcomes`; ``step`` the optimizer steps completed. Its home stays this module: submitit's result
    files of running experiments hold it pickled as ``diffmem.sweep.JobOutcome``."""

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
                outcome = JobOutcome(run.path.name, self.kind, EVALUATED, None)
            else:
                result = self._train(run)
                self.step = result.step
                if result.status != INTERRUPTED and self.cfg.eval.inline and \
                        set(run.checkpoint_steps()) - run.evaluated_steps():
                    evaluate_run(run.path, device=self.cfg.train.device, log=_print)
                outcome = JobOutcome(run.path.name, self.kind, result.status, result.step)
        except KeyboardInterrupt:
            record_job_end(run.path, INTERRUPTED, step=self.step)
            raise
        except Exception as e:
            record_job_end(run.path, FAILED, step=self.step, error=one_line(e))
            raise
        record_job_end(run.path, outcome.status, step=outcome.step)
        return outcome

    def _train(self, run: RunDir) -> TrainResult:
        """train(), acting on the signals that interrupted it as submitit's handlers would (module docstring)."""
        preempt = _preemption_signal()
        while True:
            result = train(self.cfg, run.path, progress=self.progress, log=_print)
            self.step = result.step
            if result.status != INTERRUPTED:
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
        record_job_end(self.run_dir, REQUEUED, step=self.step)
        return super().checkpoint(*args, **kwargs)


# --- options and the plan -----------------------------------------------------------------------------------------

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
        return [r for r in self.results if r.status == FAILED]

    @property
    def interrupted(self) -> list[JobResult]:
        return [r for r in self.results if r.status == INTERRUPTED]

    @property
    def cancelled(self) -> list[JobResult]:
        return [r for r in self.results if r.status == CANCELLED]

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
            if r.status == FAILED:
                detail = f": {r.error}" + (f" (log: {r.log})" if r.log else "")
            lines.append(f"  {r.name} {r.kind} job {r.job_id}: {r.status}{detail}")
        if self.failed:
            lines.append(f"{len(self.failed)} job(s) failed; fix the cause and rerun the same command (finished runs "
                         "are skipped)")
        if self.cancelled:
            lines.append(f"{len(self.cancelled)} job(s) cancelled; rerun the same command to continue them")
        if self.interrupted:
            lines.append(f"{len(self.interrupted)} job(s) stopped by a signal with their state saved; rerun the same "
                         "command to continue")
        lines.append(f"watch with: diffmem status {self.experiment_dir}")
        return "\n".join(lines)


def _tasks(entries: list[SweepEntry], *, eval_separately: bool, threads: int, progress: bool) -> list[Task]:
    """The jobs of every run to submit, as executor tasks: a :class:`RunJob` per kind, configured by
    :func:`job_config` with ``threads`` torch threads; ``progress``: the training jobs show a progress bar."""
    tasks = []
    for e in entries:
        if not e.jobs:
            continue
        path = e.run.path.absolute()
        jobs = tuple(Job(kind, RunJob(job_config(e.run.cfg, kind, eval_separately=eval_separately, threads=threads),
                                      path, kind, progress)) for kind in e.jobs)
        tasks.append(Task(e.run.name, path, e.run.cfg.train.steps, e.run.cfg.train.device, jobs))
    return tasks


def _busy(entries: list[SweepEntry]) -> list[RunStatus]:
    """The runs a sweep leaves alone because their job is queued or running."""
    return [e.status for e in entries if not e.jobs and e.status.state in ACTIVE_STATES]


def run_sweep(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path, options: ClusterOptions, *,
              eval_separately: bool = False, dry_run: bool = False, progress: bool = True,
              log: Callable[[str], None] = print, wait: bool = False) -> SweepReport:
    """Plan the grid and hand the jobs of every unfinished run to the executor of ``options.cluster``
    (:func:`diffmem.cluster.executors.make_executor`): debug and local run them until every job ended; slurm
    submits them and returns at once, or with ``wait`` when every job has ended. ``dry_run`` only plans (and
    renders the slurm scripts); it writes nothing. ``progress``: a progress bar for jobs run in this process."""
    experiment_dir = Path(experiment_dir)
    entries = plan_sweep(base, sweep, experiment_dir, eval_separately=eval_separately)
    executor = make_executor(options, experiment_dir, log=log, wait=wait)
    if not dry_run and executor.wait_for_earlier(_busy(entries)):
        entries = plan_sweep(base, sweep, experiment_dir, eval_separately=eval_separately)
    report = SweepReport(experiment_dir, options, entries, dry_run=dry_run)
    tasks = _tasks(entries, eval_separately=eval_separately, threads=executor.job_threads,
                   progress=progress and executor.in_process)
    if dry_run:
        report.scripts = executor.scripts(tasks)
        return report
    if tasks:
        executor.check()
    record_plan(experiment_dir, {e.run.name: e.run.cfg.train.steps for e in entries})
    report.results = executor.run(tasks, _busy(entries))
    return report
