"""Slurm: submission (the sbatch script, job arrays and their dependencies), the job states Slurm reports
(``scontrol``, then ``sacct`` where there is an accounting database) and waiting for submitted jobs.

The sbatch script is diffmem's own (:func:`render_sbatch`, the same text for ``--dry-run`` and for ``sbatch``); the
job it runs is submitit's job runner (``submitit.core.submission.submitit_main``) on the pickled job of a
:class:`~diffmem.cluster.base.Task` (``submitit.helpers.DelayedSubmission``), so the signals, requeues and result
files are submitit's. One job array per kind of job, ``%K`` parallelism, ``--signal=USR2@<delay>`` and
``--requeue``; the evaluations of an ``--eval-separately`` sweep wait, task by task, for their training
(``aftercorr``).

GPUs (:func:`job_gpus`): ``--gpus-per-job G`` when given; none when an extra ``--slurm-option`` asks for GPUs
itself (gres, gpus, gpus-per-node, ...); else from the runs' ``train.device``: ``cpu`` none, ``cuda`` one,
``auto`` one where the partition's nodes have GPUs (``sinfo``) or where that cannot be asked, none on a CPU-only
partition.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import submitit
from submitit.helpers import DelayedSubmission

from diffmem.cluster.base import ClusterError, ClusterOptions, JobResult, Task, recorded_result
from diffmem.jobrecords import job_log, log_error_line, log_tail, record_submission, submitit_folder
from diffmem.outcomes import CANCELLED, FAILED, SUBMITTED

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
    tail = log_tail(err_log)
    if tail is None:
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


# --- submission -------------------------------------------------------------------------------------------------

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
pickled job (a :class:`diffmem.sweep.RunJob`), installs the preemption handlers and stores the result; a preemption
signal that arrives before those handlers is kept for the job instead of killing it."""


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


def job_gpus(options: ClusterOptions, devices: Iterable[str]) -> int:
    """GPUs each Slurm job of runs with these ``train.device`` values asks for (``--gpus-per-node``):
    ``options.gpus_per_job`` when set; 0 when an extra slurm option requests GPUs itself (``gres=gpu:a100:1``,
    ``gpus=...``); else 0 for "cpu", 1 for "cuda" (or "cuda:N"), and for "auto" 1 unless the partition is known
    to have no GPUs."""
    if options.gpus_per_job is not None:
        return options.gpus_per_job
    if any(key.replace("_", "-") in GPU_OPTION_KEYS for key, _ in options.slurm_options):
        return 0
    devices = set(devices)
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
             ("open-mode", "append"), ("time", str(time_min)),
             ("signal", f"{submitit.JobEnvironment.USR_SIG}@{options.signal_delay_s}"),
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
    folder = submitit_folder(experiment_dir)
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
    """Submit ``script`` with sbatch; the job id. A refusal is a ClusterError with sbatch's own line."""
    path = folder / f".{uuid.uuid4().hex}_submission.sh"
    path.write_text(script)
    try:
        try:
            done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"sbatch did not answer in {SBATCH_TIMEOUT_S:.0f} s (is slurmctld up? `scontrol ping`)")
        found = re.search(r"Submitted batch job (\d+)", done.stdout) or re.search(r"job (\d+)", done.stdout)
        if done.returncode != 0 or not found:
            said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            message = said[-1] if said else f"exit code {done.returncode}"  # sbatch's last line says why
            hint = ""
            if gpus and re.search(r"gres|gpu", message, re.IGNORECASE):
                hint = (f" (each job asks for {gpus} GPU(s): on a CPU-only partition pass --gpus-per-job 0 or "
                        "--set train.device=\"cpu\")")
            raise ClusterError(f"sbatch refused {what}: {message}{hint}")
        job_id = found.group(1)
        forget_slurm_states()
        path.rename(folder / f"{job_id}_submission.sh")
        return job_id
    finally:
        path.unlink(missing_ok=True)


def _submit_array(tasks: list[Task], options: ClusterOptions, experiment_dir: Path, job_name: str, gpus: int,
                  dependency: str | None, what: str) -> list[str]:
    """Pickle the first job of each task for submitit's runner, submit one sbatch script (an array when several)
    and put each pickle where its array task will look for it; the job ids ("<array>_<task>", or "<id>" for one
    job)."""
    from submitit.core.utils import JobPaths

    folder = submitit_folder(experiment_dir)
    folder.mkdir(parents=True, exist_ok=True)
    time_min = _time_min(options)
    pickles = []
    try:
        for task in tasks:
            delayed = DelayedSubmission(task.jobs[0].call)
            delayed.set_timeout(time_min, options.max_requeues)
            path = folder / f".{uuid.uuid4().hex}.pkl"
            delayed.dump(path)
            pickles.append(path)
        script = render_sbatch(len(tasks), options, experiment_dir, job_name, dependency, gpus=gpus)
        array_id = _sbatch(script, folder, what, gpus)
        ids = [f"{array_id}_{i}" for i in range(len(tasks))] if len(tasks) > 1 else [array_id]
        for job_id, path in zip(ids, pickles):  # the runner waits up to 60 s for its pickle
            path.rename(JobPaths(folder, job_id=job_id).submitted_pickle)
        return ids
    finally:
        for path in pickles:
            path.unlink(missing_ok=True)


def _array_dependency(job_ids: list[str]) -> str:
    """Each evaluation task waits for its own training task (``aftercorr``; ``afterok`` for a single job)."""
    return f"aftercorr:{job_ids[0].split('_')[0]}" if len(job_ids) > 1 else f"afterok:{job_ids[0]}"


def _arrays(tasks: list[Task]) -> list[tuple[str, list[Task], bool]]:
    """(kind, tasks, depends on the previous array) for the arrays a Slurm sweep submits, each array running the
    first job of its tasks: training jobs; the evaluations that follow them, task by task; evaluations of runs
    trained already."""
    train = [t for t in tasks if t.kind == "train"]
    arrays = [("train", train, False)] if train else []
    then_eval = [rest for t in train if (rest := t.rest()) is not None and rest.kind == "evaluate"]
    if then_eval:
        arrays.append(("evaluate", then_eval, True))
    eval_only = [t for t in tasks if t.kind == "evaluate"]
    if eval_only:
        arrays.append(("evaluate", eval_only, False))
    return arrays


def _job_name(experiment_dir: Path, kind: str) -> str:
    return f"diffmem-{Path(experiment_dir).name}" + ("-eval" if kind == "evaluate" else "")


def sbatch_scripts(tasks: list[Task], options: ClusterOptions, experiment_dir: str | Path) -> list[tuple[str, str]]:
    """(title, sbatch script) of every array :func:`submit_tasks` would submit: what a dry run prints."""
    scripts = []
    for kind, array, depends in _arrays(tasks):
        dependency = "aftercorr:<training array id>" if depends else None
        gpus = job_gpus(options, [t.device for t in array])
        title = (f"sbatch script for {len(array)} {kind} job(s), {gpus} GPU(s) each"
                 + (", each after its training job" if depends else ""))
        scripts.append((title, render_sbatch(len(array), options, experiment_dir, _job_name(experiment_dir, kind),
                                             dependency, gpus=gpus)))
    return scripts


def submit_tasks(tasks: list[Task], options: ClusterOptions, experiment_dir: str | Path) -> list[JobResult]:
    """Submit one job array per kind of job (see :func:`_arrays`), record each job in its run folder and return
    without waiting: one SUBMITTED result per job."""
    experiment_dir = Path(experiment_dir)
    results: list[JobResult] = []
    previous: list[str] | None = None
    for kind, array, depends in _arrays(tasks):
        gpus = job_gpus(options, [t.device for t in array])
        dependency = _array_dependency(previous) if depends and previous else None
        ids = _submit_array(array, options, experiment_dir, _job_name(experiment_dir, kind), gpus, dependency,
                            f"the {len(array)} {kind} job(s)")
        for task, job_id in zip(array, ids):
            stdout, stderr = (str(job_log(experiment_dir, job_id, stream)) for stream in ("out", "err"))
            record_submission(task.run_dir, job_id=job_id, cluster="slurm", kind=kind, steps=task.steps,
                              stdout=stdout, stderr=stderr)
            results.append(JobResult(task.name, kind, job_id, SUBMITTED, log=stdout))
        previous = ids
    return results


# --- waiting ----------------------------------------------------------------------------------------------------

def _ended_slurm_job(submitted: JobResult, state: SlurmJobState | str | None, experiment_dir: Path) -> JobResult:
    """The JobResult of a Slurm job that is no longer queued or running: what the job recorded in its run's
    job.json (never submitit's result pickle), else Slurm's state and what its error log says."""
    err_log = str(job_log(experiment_dir, submitted.job_id, "err"))
    recorded = recorded_result(submitted.name, submitted.kind, submitted.job_id, experiment_dir / submitted.name,
                               log=submitted.log, err_log=err_log)
    if recorded is not None:
        return recorded
    base = {"name": submitted.name, "kind": submitted.kind, "job_id": submitted.job_id}
    if isinstance(state, SlurmJobState) and state.state == "CANCELLED":
        return JobResult(**base, status=CANCELLED, log=submitted.log)
    if isinstance(state, SlurmJobState) and state.state != "COMPLETED":
        return JobResult(**base, status=FAILED, error=slurm_failure(state, err_log), log=err_log)
    why = slurm_log_reason(err_log)
    error = f"Slurm: {why}" if why else log_error_line(err_log)
    return JobResult(**base, status=FAILED, log=err_log,
                     error=error or "the job ended without a result (killed?); see its log")


def wait_slurm(submitted: list[JobResult], experiment_dir: str | Path, *, poll_s: float = 5.0,
               log: Callable[[str], None] = print, timeout_s: float | None = None) -> list[JobResult]:
    """Follow submitted Slurm jobs until none is queued or running (a requeued job counts as queued), and return
    what became of each: its result (DONE / EVALUATED / FAILED with the error line) or, for a job Slurm ended
    without a result, CANCELLED or FAILED with Slurm's state (e.g. OUT_OF_MEMORY). Job states come from
    :func:`slurm_job_state` (``scontrol``, then ``sacct`` where there is an accounting database), so
    this needs no slurmdbd and never waits on a job that Slurm no longer runs. ``timeout_s``: stop waiting then
    (the jobs keep their SUBMITTED status)."""
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


