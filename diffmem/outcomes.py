"""What became of a job: the outcomes a sweep, its executors and job records use, as named constants.

They are plain strings, so that job records (``job.json``'s ``outcome``), submitit's result files and every
``status`` field compare and read exactly as before: ``DONE == "done"``.
"""
from __future__ import annotations

DONE = "done"  # trained to its budget (a training job; evaluated too when inline)
SKIPPED = "skipped"  # trained already: nothing to do
EVALUATED = "evaluated"  # an evaluation job evaluated every checkpoint that lacked a metrics line
INTERRUPTED = "interrupted"  # a signal stopped it with its state saved: a rerun continues
REQUEUED = "requeued"  # preempted or at its time limit: submitit requeues the job (job.json only)
FAILED = "failed"  # ended with an error (one line in ``error``)
CANCELLED = "cancelled"  # Slurm ended it (scancel) before it reported an end
SUBMITTED = "submitted"  # Slurm: queued; the sweep did not wait for it

SUCCEEDED = frozenset({DONE, SKIPPED, EVALUATED})
"""Outcomes after which a run's next job (its evaluation) may start."""
