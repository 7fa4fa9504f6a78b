"""The three executors of a sweep behind one interface, :class:`Executor`; :func:`make_executor` picks one.

All three are submitit's (this module only decides when to submit and keeps the job records):

* ``debug``: in this process, one job after the other (submitit's DebugExecutor);
* ``local``: subprocesses on this machine (submitit's LocalExecutor), at most K at once, the longest runs first, one
  GPU each (``CUDA_VISIBLE_DEVICES``; ``--gpus`` counted as this process counts its GPUs) when GPUs exist, and
  ``cpu_count // K`` torch threads each (unless train.num_threads is set);
* ``slurm``: job arrays submitted with sbatch (:mod:`diffmem.cluster.slurm`); with ``wait`` the executor then
  follows the jobs, and those of runs queued or running already, until each has ended, and reports them as the
  local executor does.

A run's jobs (a :class:`~diffmem.cluster.base.Task`) run in order: its evaluation starts only when its training
succeeded. A failing job does not stop the others; it is reported with its last error line. What a job did is read
from the job.json it wrote (:func:`~diffmem.cluster.base.recorded_result`), never from submitit's result pickle, also
for the jobs this process has just submitted (a debug job's return value and exception are in this process).
"""
from __future__ import annotations

import os
import shutil
import time
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path
from typing import Any, Callable

import submitit

from diffmem.cluster.base import ClusterError, ClusterOptions, JobResult, Task, recorded_result
from diffmem.cluster.runstate import ACTIVE_STATES, RunStatus, run_status
from diffmem.cluster.slurm import sbatch_scripts, submit_tasks, wait_slurm
from diffmem.jobrecords import log_error_line, one_line, read_submissions, record_submission, submitit_folder
from diffmem.outcomes import FAILED, INTERRUPTED, SUBMITTED, SUCCEEDED

NO_TIME_LIMIT_MIN = 60 * 24 * 365  # a local job without --time: one year, i.e. never signalled


class Executor(ABC):
    """Where the jobs of a sweep run. A sweep asks :attr:`job_threads` to configure the jobs, hands the tasks to
    :meth:`run` (or, for a dry run, to :meth:`scripts`) and reads back one :class:`JobResult` per job.

    ``kind`` is the name recorded in each run's submissions.json ("debug" | "local" | "slurm"); ``in_process``:
    the jobs run in this process (a progress bar shows). ``log`` receives one line per event. :meth:`run` of the
    debug and local executors returns when every job has ended; Slurm's only with ``wait`` (ignored by the others).
    """

    kind: str = ""
    in_process: bool = False

    def __init__(self, options: ClusterOptions, experiment_dir: str | Path, log: Callable[[str], None] = print,
                 wait: bool = False):
        self.options, self.experiment_dir, self.log, self.wait = options, Path(experiment_dir), log, wait

    @property
    def job_threads(self) -> int:
        """Torch threads per job, for configs that leave train.num_threads at 0; 0: torch's default."""
        return 0

    def wait_for_earlier(self, busy: list[RunStatus]) -> bool:
        """Called after the plan, before any job starts: wait for the jobs of an earlier sweep, among ``busy``
        (runs whose job is queued or running), that this executor must see end; whether it waited (then the sweep
        plans again, as those runs have moved on)."""
        return False

    def check(self) -> None:
        """Raise a :class:`ClusterError` when this cluster cannot take jobs (called only when there are some)."""

    def scripts(self, tasks: list[Task]) -> list[tuple[str, str]]:
        """(title, script) of what :meth:`run` would submit, for a dry run; [] when there is no script."""
        return []

    @abstractmethod
    def run(self, tasks: list[Task], busy: list[RunStatus]) -> list[JobResult]:
        """Run or submit every task's jobs and return one result per job; ``busy`` are the runs the sweep left
        alone because their job is queued or running."""


def _record(task: Task, job: submitit.Job, cluster: str, logs: bool = True) -> None:
    """Record a job submitted by submitit's executor in the run's submissions.json (its log paths when ``logs``)."""
    record_submission(task.run_dir, job_id=str(job.job_id), cluster=cluster, kind=task.kind, steps=task.steps,
                      stdout=str(job.paths.stdout) if logs else None, stderr=str(job.paths.stderr) if logs else None)


def _ended(task: Task, job_id: str, log: str | None = None, err_log: str | None = None,
           error: BaseException | None = None, returned: Any = None) -> JobResult:
    """The JobResult of a job that has ended, from its own record in the run's job.json (never from submitit's
    result pickle); without a record, what a debug job returned (``returned``, a JobOutcome) or raised (``error``)
    in this process, else FAILED with the last exception line of its error log, else "killed?"."""
    recorded = recorded_result(task.name, task.kind, job_id, task.run_dir, log=log, err_log=err_log)
    if recorded is not None:
        return recorded
    if returned is not None:
        return JobResult(task.name, task.kind, job_id, returned.status, returned.step, log=log)
    why = one_line(error) if error is not None else log_error_line(err_log)
    return JobResult(task.name, task.kind, job_id, FAILED, log=err_log,
                     error=why or "the job ended without reporting an end (killed, or out of memory?); see its log")


def _said(result: JobResult) -> str:
    return f"{result.name} {result.kind}: {result.status}" + (f": {result.error}" if result.error else "")


class DebugExecutor(Executor):
    """Every job in this process, one after the other. ``job.exception()`` runs a debug job without opening
    submitit's post-mortem debugger on failure, so a failing run is reported and the next one starts. A job that a
    stop signal interrupted (SIGTERM or SIGUSR2 to this process: the run saved its state) ends the sweep there, as
    Ctrl-C does: the signal was meant for the sweep, so no further run starts."""

    kind = "debug"
    in_process = True

    def run(self, tasks: list[Task], busy: list[RunStatus]) -> list[JobResult]:
        if not tasks:
            return []
        executor = submitit.DebugExecutor(folder=submitit_folder(self.experiment_dir))
        results = []
        for first in tasks:
            task: Task | None = first
            while task is not None:
                job = executor.submit(task.jobs[0].call)
                _record(task, job, self.kind, logs=False)  # a debug job writes no log files
                error = job.exception()  # runs the job in this process; nothing is read from a file
                result = _ended(task, job.job_id, error=error, returned=None if error else job.result())
                results.append(result)
                self.log(_said(result))
                if result.status == INTERRUPTED:
                    left = len(tasks) - tasks.index(first) - 1
                    self.log(f"{result.name}: stopped by a signal with its state saved; the sweep stops here "
                             f"({left} more run(s) not started): rerun the same command to continue")
                    return results
                task = task.rest() if result.status in SUCCEEDED else None
        return results


def visible_gpus() -> tuple[int, ...]:
    """Indices of the GPUs this process may use: $CUDA_VISIBLE_DEVICES when set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [s.strip() for s in env.split(",") if s.strip()]
        if not all(s.isdigit() for s in ids):
            raise ClusterError(f"CUDA_VISIBLE_DEVICES={env} names GPUs by id strings; pass --gpus with indices, "
                               "e.g. --gpus 0,1")
        return tuple(int(s) for s in ids)
    import torch

    return tuple(range(torch.cuda.device_count()))


def physical_gpus(indices: tuple[int, ...]) -> tuple[int, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` entries for a child process of the GPUs that this process calls ``indices``
    (its cuda:K, i.e. ``--gpus``): the indices themselves when this process's ``CUDA_VISIBLE_DEVICES`` is unset,
    else its entries at those positions; an index beyond what it sees is a one-line ClusterError."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return tuple(indices)
    seen = visible_gpus()
    beyond = [i for i in indices if i >= len(seen)]
    if beyond:
        sees = f"GPUs 0 to {len(seen) - 1}" if seen else "no GPU"
        raise ClusterError(f"--gpus {','.join(map(str, indices))}: this process sees {sees} (CUDA_VISIBLE_DEVICES="
                           f"{os.environ['CUDA_VISIBLE_DEVICES']}), so GPU {beyond[0]} does not exist here; pass "
                           "indices as this process counts them")
    return tuple(seen[i] for i in indices)


def local_job_threads(parallel: int) -> int:
    """The torch threads of each of ``parallel`` local jobs: the machine's cores shared among them, at least 1."""
    return max(1, (os.cpu_count() or 1) // parallel)


class LocalExecutor(Executor):
    """At most ``parallel`` submitit local jobs at once (``options.max_parallel``, default one per GPU, else one per
    CPU core), the runs with the most steps first, the GPU with the fewest jobs for each new one; a run's next job
    (its evaluation) starts when the one before it succeeded."""

    kind = "local"

    def __init__(self, options: ClusterOptions, experiment_dir: str | Path, log: Callable[[str], None] = print,
                 wait: bool = False):
        super().__init__(options, experiment_dir, log, wait)
        self.gpus = physical_gpus(options.gpus) if options.gpus is not None else visible_gpus()
        self.parallel = options.max_parallel or len(self.gpus) or os.cpu_count() or 1

    @property
    def job_threads(self) -> int:
        return local_job_threads(self.parallel)

    def wait_for_earlier(self, busy: list[RunStatus]) -> bool:
        """Wait until the local jobs of an earlier sweep that still work on runs of this one have ended (their
        processes run on this machine), so that a local sweep rerun right after Ctrl-C, while the interrupted jobs
        are still saving their state, continues those runs instead of skipping them. Jobs of other clusters are
        left alone (a Slurm sweep follows them instead)."""
        mine = [s for s in busy if s.cluster == self.kind]
        if not mine:
            return False
        self.log("waiting for the earlier job(s) still working on " + ", ".join(
            f"{s.name} (job {s.job_id})" for s in mine) + " to end")
        while any(run_status(s.path, total=s.total).state in ACTIVE_STATES for s in mine):
            time.sleep(self.options.poll_s)
        return True

    def run(self, tasks: list[Task], busy: list[RunStatus]) -> list[JobResult]:
        if not tasks:
            return []
        options, gpus = self.options, self.gpus
        executor = submitit.LocalExecutor(folder=submitit_folder(self.experiment_dir),
                                          max_num_timeout=options.max_requeues)
        timeout_min = options.time_hours * 60 if options.time_hours else NO_TIME_LIMIT_MIN
        pending = deque(sorted(tasks, key=lambda t: -t.steps))  # the longest first: the sweep ends sooner
        active: dict[Any, tuple[Task, int | None]] = {}
        load = {g: 0 for g in gpus}
        results: list[JobResult] = []
        try:
            while pending or active:
                while pending and len(active) < self.parallel:
                    task = pending.popleft()
                    gpu = min(gpus, key=lambda g: load[g]) if gpus else None
                    executor.update_parameters(timeout_min=timeout_min, signal_delay_s=options.signal_delay_s,
                                               gpus_per_node=0 if gpu is None else 1,
                                               visible_gpus=() if gpu is None else (gpu,))
                    job = executor.submit(task.jobs[0].call)
                    _record(task, job, self.kind)
                    if gpu is not None:
                        load[gpu] += 1
                    active[job] = (task, gpu)
                    self.log(f"{task.name} {task.kind}: started job {job.job_id}"
                             + (f" on GPU {gpu}" if gpu is not None else ""))
                time.sleep(options.poll_s)
                for job in [j for j in active if j.done()]:
                    task, gpu = active.pop(job)
                    if gpu is not None:
                        load[gpu] -= 1
                    result = _ended(task, job.job_id, log=str(job.paths.stdout), err_log=str(job.paths.stderr))
                    results.append(result)
                    self.log(_said(result))
                    if result.status in SUCCEEDED and (rest := task.rest()) is not None:
                        pending.appendleft(rest)
        except KeyboardInterrupt:
            for job in active:
                job.cancel(check=False)  # SIGINT: training saves state.pt and stops
            raise
        return results


def _int_or(text: str | None, default: int) -> int:
    return int(text) if text and text.strip().isdigit() else default


class SlurmExecutor(Executor):
    """One job array per kind of job (:func:`diffmem.cluster.slurm.submit_tasks`); returns at once, or with
    ``wait`` when every job, including those of runs queued or running already, has ended
    (:func:`diffmem.cluster.slurm.wait_slurm`)."""

    kind = "slurm"

    @property
    def job_threads(self) -> int:
        """The job's CPUs, not every core of its node."""
        return self.options.cpus_per_job or _int_or(dict(self.options.slurm_options).get("cpus-per-task"), 1)

    def check(self) -> None:
        if not (shutil.which("srun") and shutil.which("sbatch")):
            raise ClusterError("srun or sbatch is not on PATH, so this is not a Slurm cluster; run on a login node, "
                               "or add --dry-run to see the sbatch script")
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.exists(conf):
            raise ClusterError(f"SLURM_CONF={conf} does not exist; point it at the cluster's slurm.conf or unset it")

    def scripts(self, tasks: list[Task]) -> list[tuple[str, str]]:
        return sbatch_scripts(tasks, self.options, self.experiment_dir)

    def _followed(self, busy: list[RunStatus]) -> list[JobResult]:
        """The Slurm jobs of runs a sweep left alone because they are queued or running, as SUBMITTED results."""
        followed = []
        for s in busy:
            if s.cluster == self.kind and s.job_id:
                subs = read_submissions(s.path)
                kind = subs[-1]["kind"] if subs else "train"
                followed.append(JobResult(s.name, kind, s.job_id, SUBMITTED, log=s.log))
        return followed

    def run(self, tasks: list[Task], busy: list[RunStatus]) -> list[JobResult]:
        followed = self._followed(busy) if self.wait else []
        if not tasks and not followed:
            return []
        submitted = submit_tasks(tasks, self.options, self.experiment_dir) if tasks else []
        results = followed + submitted
        if self.wait:
            for r in results:
                self.log(f"{r.name} {r.kind}: " + (f"submitted as job {r.job_id}" if r in submitted else
                                                   f"following job {r.job_id}"))
            results = wait_slurm(results, self.experiment_dir, poll_s=self.options.poll_s, log=self.log)
        return results


EXECUTORS: dict[str, type[Executor]] = {e.kind: e for e in (DebugExecutor, LocalExecutor, SlurmExecutor)}


def make_executor(options: ClusterOptions, experiment_dir: str | Path, *, log: Callable[[str], None] = print,
                  wait: bool = False) -> Executor:
    """The executor of ``options.cluster``; ``wait``: a Slurm executor waits for its jobs to end (the debug and
    local executors always do)."""
    return EXECUTORS[options.cluster](options, experiment_dir, log=log, wait=wait)
