"""Resolving the onsets of one run: which checkpoints to keep, when to stop training, which to evaluate afterwards.

An evaluation grid brackets each timescale only to within the gap between two evaluations (a factor 1.5-2 for a
log-spaced grid). diffmem sharpens the brackets after training instead of evaluating densely throughout:

- ``eval.checkpoint_ratio = r`` keeps model weights (``checkpoints/step_*.pt``, weights only) at extra steps between
  the evaluation steps, log-spaced so that consecutive kept steps are at most a factor ``r`` apart
  (:func:`diffmem.schedule.kept_steps`). They cost disk, not evaluation time.
- ``eval.refine_ratio = q`` (q >= r): once training has ended, diffmem evaluates kept checkpoints inside the bracket
  of tau_mem and of tau_gen, each time the one nearest the bracket's log-midpoint, until every bracket is at most a
  factor ``q`` wide or holds no unevaluated checkpoint (:func:`next_refinement`). The extra evaluations are ordinary
  lines of metrics.jsonl; readers sort by step.
- ``eval.stop_f_mem = f`` stops training at the first evaluation after which tau_mem and tau_gen are both measured
  (neither censored) and the lower end of f_mem's 95% interval is at least ``f`` (memorization has saturated):
  :func:`stop_reason`. That evaluation's record carries ``"stop"`` with the reason, and the run's ``done`` file says
  so; nothing after it is trained.

The estimators are those of the analysis (:func:`diffmem.analysis.timescales.estimate_run`), so a bracket refined here
is the bracket that ``diffmem analyze`` reports.
"""
from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

from diffmem.analysis.runfiles import latest_per_step
from diffmem.analysis.timescales import TimescaleInputError, estimate_run
from diffmem.rundir import RunDir


def stop_reason(records: Sequence[dict[str, Any]], stop_f_mem: float) -> str | None:
    """Why training can stop after the latest evaluation, or None: tau_mem and tau_gen measured and the latest
    f_mem_lo >= ``stop_f_mem`` (> 0)."""
    records = latest_per_step(records)
    if stop_f_mem <= 0 or not records:
        return None
    last = records[-1]
    if last.get("f_mem_lo") is None or last["f_mem_lo"] < stop_f_mem:
        return None
    try:
        est = estimate_run(records)
    except TimescaleInputError:
        return None
    needed = ["tau_mem"] + (["tau_gen"] if any(r.get("fid") is not None for r in records) else [])
    if not all(est[k].measured for k in needed):
        return None
    return (f"f_mem_lo {last['f_mem_lo']:.3f} >= {stop_f_mem:g} with "
            + " and ".join(f"{k} measured ({est[k].value:.4g})" for k in needed))


def brackets(records: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """The evaluations that bracket each measured onset: tau_mem's [last clean, first memorized] and, for tau_gen,
    the evaluated steps just before and after its crossing."""
    records = latest_per_step(records)
    try:
        est = estimate_run(records)
    except TimescaleInputError:
        return {}
    out = {}
    if est["tau_mem"].measured:
        out["tau_mem"] = (int(est["tau_mem"].lo), int(est["tau_mem"].hi))
    gen = est["tau_gen"]
    if gen.measured:
        steps = [int(r["step"]) for r in records if r.get("fid") is not None]
        before = [s for s in steps if s <= gen.value]
        after = [s for s in steps if s >= gen.value]
        if before and after:
            out["tau_gen"] = (before[-1], after[0])
    return out


def next_refinement(records: Sequence[dict[str, Any]], checkpoints: Sequence[int], ratio: float) -> int | None:
    """The next kept checkpoint to evaluate: inside the widest bracket wider than ``ratio`` that still holds an
    unevaluated checkpoint, the one nearest its log-midpoint; None when every bracket is resolved."""
    evaluated = {int(r["step"]) for r in records}
    best: tuple[float, int] | None = None
    for lo, hi in brackets(records).values():
        if lo <= 0 or hi / lo <= ratio:
            continue
        inside = [s for s in checkpoints if lo < s < hi and s not in evaluated]
        if not inside:
            continue
        middle = math.sqrt(lo * hi)
        pick = min(inside, key=lambda s: abs(math.log(s / middle)))
        if best is None or hi / lo > best[0]:
            best = (hi / lo, pick)
    return None if best is None else best[1]


class CheckpointEvaluator(Protocol):
    def evaluate_checkpoint(self, step: int) -> dict[str, Any]: ...


def refine_brackets(evaluator: CheckpointEvaluator, run: RunDir, ratio: float) -> list[int]:
    """Evaluate kept checkpoints of ``run`` inside the onsets' brackets until each is at most ``ratio`` wide
    (:func:`next_refinement`), with ``evaluator.evaluate_checkpoint`` (a :class:`diffmem.evaluate.Evaluator`);
    returns the steps evaluated. Safe to rerun after a crash: evaluated steps are never evaluated again."""
    done = []
    while (step := next_refinement(run.metrics(), run.checkpoint_steps(), ratio)) is not None:
        evaluator.evaluate_checkpoint(step)
        done.append(step)
    return done
