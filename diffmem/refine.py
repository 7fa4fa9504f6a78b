"""Resolving the onsets of one run: which checkpoints to keep, when to stop training, which to evaluate afterwards.

An evaluation grid brackets each timescale only to within the gap between two evaluations (a factor 1.5-2 for a
log-spaced grid). diffmem sharpens the brackets after training instead of evaluating densely throughout:

- ``eval.checkpoint_ratio = r`` keeps model weights (``checkpoints/step_*.pt``, weights only) at extra steps between
  the evaluation steps, log-spaced so that consecutive kept steps are at most a factor ``r`` apart
  (:func:`diffmem.eval_grid.kept_steps`). They cost disk, not evaluation time.
- ``eval.refine_ratio = q`` (q >= r): once training has ended, diffmem evaluates kept checkpoints inside the bracket
  of tau_mem, of tau_gen and of tau_auc, each time the one nearest the bracket's log-midpoint, until every bracket
  is at most a factor ``q`` wide or holds no unevaluated checkpoint (:func:`next_refinement`). The extra evaluations are ordinary
  lines of metrics.jsonl; readers sort by step.
- ``eval.refine_n_samples = M`` (> ``eval.n_samples``): refinement evaluations draw M samples. Whether memorization
  has started is a detection whose sensitivity grows with the sample count: an evaluation counts as memorized from
  about 4 copies and as clean only with none, so with n samples f_mem between about 0.5/n and 4/n is neither
  (:mod:`diffmem.analysis.timescales`). With n = 1000 that zone often holds a kept checkpoint, and the bracket
  stops shrinking; with M = 10 n samples it moves to a 10 times smaller f_mem, where f_mem usually rises more
  steeply in log time (just after an onset), so it spans less time. The bracket's clean end must then be clean
  among M samples too: when it was measured with fewer, it is re-evaluated with M before the bracket counts as
  resolved (fewer samples can only miss copies, so a memorized end needs no re-evaluation).
- Split pairs (``diffmem pairs``, :mod:`diffmem.paired_evaluation`): with ``eval.refine_ratio = q``, once both
  members have finished training, tau_bias's bracket is narrowed the same way, among the checkpoints both members
  kept (:func:`next_bias_refinement`), with the pair's own sample count: the bias's interval narrows with more
  samples, so a bracket end measured with other draws would move tau_bias by the count, not by training.
- ``eval.stop_f_mem = f`` stops training at the first evaluation after which tau_mem and tau_gen are both measured
  (neither censored) and the lower end of f_mem's 95% interval is at least ``f`` (memorization has saturated):
  :func:`stop_reason`. That evaluation's record carries ``"stop"`` with the reason, and the run's ``done`` file says
  so; nothing after it is trained.

The estimators are those of the analysis (:func:`diffmem.analysis.timescales.estimate_run`), so a bracket refined here
is the bracket that ``diffmem analyze`` reports.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from diffmem.analysis.runfiles import latest_per_step
from diffmem.analysis.timescales import TimescaleInputError, estimate_run, tau_bias
from diffmem.eval_grid import nearest_log_midpoint
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
    """The evaluations that bracket each measured onset: tau_mem's [last clean, first memorized], for tau_gen the
    evaluated steps just before and after its crossing, and tau_auc's [last at 0.5, first of those above it] (runs
    that record the membership AUC)."""
    records = latest_per_step(records)
    try:
        est = estimate_run(records)
    except TimescaleInputError:
        return {}
    out = {}
    if est["tau_mem"].measured:
        out["tau_mem"] = (int(est["tau_mem"].lo), int(est["tau_mem"].hi))
    if est["tau_gen"].measured and est["tau_gen"].bracket is not None:
        out["tau_gen"] = (int(est["tau_gen"].bracket[0]), int(est["tau_gen"].bracket[1]))
    if est["tau_auc"].measured:
        out["tau_auc"] = (int(est["tau_auc"].lo), int(est["tau_auc"].hi))
    return out


def next_refinement(records: Sequence[dict[str, Any]], checkpoints: Sequence[int], ratio: float,
                    mem_samples: int = 0) -> int | None:
    """The next kept checkpoint to evaluate: inside the widest bracket wider than ``ratio`` that still holds an
    unevaluated checkpoint, the one nearest its log-midpoint; None when every bracket is resolved.

    ``mem_samples`` > 0: inside tau_mem's bracket a checkpoint evaluated with fewer samples counts as unevaluated,
    and once that bracket is narrow enough (or holds nothing left to evaluate) its clean end is picked if it was
    measured with fewer samples."""
    latest = {int(r["step"]): int(r.get("n_samples") or 0) for r in latest_per_step(records)}
    kept = set(checkpoints)
    best: tuple[float, int] | None = None
    for name, (lo, hi) in brackets(records).items():
        if lo <= 0:
            continue
        needs = mem_samples if name == "tau_mem" else 0

        def pending(s: int) -> bool:
            return s not in latest or (needs > 0 and latest[s] < needs)

        pick = None
        inside = [s for s in checkpoints if lo < s < hi and pending(s)]
        if hi / lo > ratio and inside:
            pick = nearest_log_midpoint(inside, lo, hi)
        elif needs and lo in kept and pending(lo):
            pick = lo
        if pick is not None and (best is None or hi / lo > best[0]):
            best = (hi / lo, pick)
    return None if best is None else best[1]


def next_bias_refinement(steps: Sequence[int], bias_lo: Sequence[float | None], checkpoints: Sequence[int],
                         ratio: float) -> int | None:
    """The next checkpoint to evaluate for one split pair's tau_bias, or None when its bracket is resolved.

    ``steps``, ``bias_lo``: the pair's paired evaluations so far (optimizer steps; the lower end of the bias's 95 %
    interval, pairs.jsonl); ``checkpoints``: the steps both members kept weights for. A measured tau_bias whose
    bracket [lo, hi] is wider than a factor ``ratio`` gets the unevaluated checkpoint nearest its log-midpoint; a
    censored or missing tau_bias, a narrow bracket or one without an unevaluated checkpoint inside gets None. The
    bracket only narrows: a new evaluation inside it with the bias established becomes its upper end, otherwise its
    lower end (:func:`diffmem.analysis.timescales.tau_bias`)."""
    if ratio <= 1 or not len(steps):
        return None
    order = sorted(range(len(steps)), key=lambda i: steps[i])
    est = tau_bias([steps[i] for i in order], [bias_lo[i] for i in order])
    if not est.measured:
        return None
    lo, hi = float(est.lo), float(est.hi)
    done = {int(s) for s in steps}
    inside = [s for s in checkpoints if lo < s < hi and s not in done]
    return nearest_log_midpoint(inside, lo, hi) if hi / lo > ratio and inside else None


class CheckpointEvaluator(Protocol):
    def evaluate_checkpoint(self, step: int, n_samples: int | None = None) -> dict[str, Any]: ...


def refine_brackets(evaluator: CheckpointEvaluator, run: RunDir, ratio: float, n_samples: int = 0) -> list[int]:
    """Evaluate kept checkpoints of ``run`` inside the onsets' brackets until each is at most ``ratio`` wide
    (:func:`next_refinement`), with ``evaluator.evaluate_checkpoint`` (a :class:`diffmem.evaluate.Evaluator`), each
    with ``n_samples`` samples when > 0 (``eval.refine_n_samples``); returns the steps evaluated. Safe to rerun after
    a crash: a step evaluated with enough samples is never evaluated again."""
    done = []
    while (step := next_refinement(run.metrics(), run.checkpoint_steps(), ratio, n_samples)) is not None:
        evaluator.evaluate_checkpoint(step, n_samples or None)
        done.append(step)
    return done
