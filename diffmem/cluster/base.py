"""What every executor shares: the options of a cluster, the tasks it is handed and the results it gives back."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from diffmem.jobrecords import job_outcome
from diffmem.outcomes import FAILED, INTERRUPTED

CLUSTERS = ("debug", "local", "slurm")  # each hands out the job ids of diffmem.jobrecords.JOB_ID_PATTERNS


class ClusterError(ValueError):
    """Options a cluster cannot take, or a cluster that refuses the jobs; the message says what to change."""


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how the jobs run.

    max_parallel: local: jobs at once (default one per GPU, else one per CPU core); slurm: the array's ``%K``
        (default 256). gpus: local: GPU indices to hand out (default every visible GPU).
    gpus_per_job: slurm: GPUs per job; None: from the runs' train.device (see :func:`diffmem.cluster.slurm.job_gpus`).
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
            raise ClusterError(f"--cluster {self.cluster} is unknown; choose one of {', '.join(CLUSTERS)}")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ClusterError(f"--max-parallel {self.max_parallel} must be >= 1")
        if self.time_hours is not None and not (math.isfinite(self.time_hours) and self.time_hours > 0):
            raise ClusterError(f"--time {self.time_hours} must be a finite number > 0 (hours)")  # NaN fails too
        if self.mem_gb is not None and not (math.isfinite(self.mem_gb) and self.mem_gb >= 0):
            raise ClusterError(f"--mem-gb {self.mem_gb} must be a finite number >= 0 (GB; 0: Slurm's whole node)")
        if self.time_hours is not None and self.signal_delay_s >= self.time_hours * 3600:
            raise ClusterError(f"--signal-delay-s {self.signal_delay_s} must be shorter than --time "
                             f"({self.time_hours * 3600:.0f} s)")
        if self.signal_delay_s < 1 or self.max_requeues < 0 or (self.gpus_per_job or 0) < 0:
            raise ClusterError("--signal-delay-s must be >= 1, --max-requeues and --gpus-per-job >= 0")
        if self.poll_s <= 0:
            raise ClusterError(f"poll_s = {self.poll_s} must be > 0 seconds")


@dataclass(frozen=True)
class Job:
    """One job of a run folder: its ``kind`` ("train" | "evaluate") and ``call``, the picklable callable that does
    it (submitit pickles it for local and Slurm jobs) and returns an object with ``status`` (an outcome of
    :mod:`diffmem.outcomes`) and ``step`` (optimizer steps done, or None)."""

    kind: str
    call: Callable[[], Any]


@dataclass(frozen=True)
class Task:
    """The jobs of one run folder, in order: the first runs now, each next one only after the one before it
    succeeded (:data:`diffmem.outcomes.SUCCEEDED`)."""

    name: str  # the run folder's name
    run_dir: Path  # the run folder, absolute
    steps: int  # planned optimizer steps (recorded with each submission; the local executor runs the most first)
    device: str  # its train.device (Slurm: whether its jobs ask for a GPU)
    jobs: tuple[Job, ...]

    @property
    def kind(self) -> str:
        """The kind of the job that runs now."""
        return self.jobs[0].kind

    def rest(self) -> Task | None:
        """The task of the jobs after the first, or None when there are none."""
        return replace(self, jobs=self.jobs[1:]) if len(self.jobs) > 1 else None


@dataclass(frozen=True)
class JobResult:
    """One submitted job as the sweep saw it: ``status`` an outcome of :mod:`diffmem.outcomes`: what the job
    returned (DONE, SKIPPED, EVALUATED, INTERRUPTED: a SIGINT stopped the job with its state saved, a rerun
    continues), FAILED (with ``error``, one line), CANCELLED (Slurm: scancel) or SUBMITTED (Slurm, when the sweep
    does not wait); ``step`` optimizer steps done; ``log`` its log file."""

    name: str
    kind: str
    job_id: str
    status: str
    step: int | None = None
    error: str | None = None
    log: str | None = None


def recorded_result(name: str, kind: str, job_id: str, run_dir: str | Path, log: str | None = None,
                    err_log: str | None = None) -> JobResult | None:
    """What became of job ``job_id`` of run ``name`` as the job itself recorded it in the run's job.json
    (:func:`diffmem.jobrecords.job_outcome`): its outcome and step, or FAILED with its error line (``log`` then
    ``err_log``, as for INTERRUPTED); None when the job reported no end (killed, out of memory, or it failed before
    it could write its record). Never reads submitit's result pickles."""
    record = job_outcome(run_dir, job_id)
    if record is None:
        return None
    outcome = record["outcome"]
    if outcome == FAILED:
        return JobResult(name, kind, job_id, FAILED, error=record.get("error") or "the job failed (no error line "
                         "recorded); see its log", log=err_log)
    return JobResult(name, kind, job_id, outcome, record.get("step"), log=err_log if outcome == INTERRUPTED else log)
