"""``diffmem demo``: the embedded CPU experiment end to end -- train a small N sweep, analyze it, advise when to stop
training the largest N, and check that advice by training a run to the advised step.

The grid runs through the same local executor as ``diffmem sweep --cluster local`` (one submitit job per run, one
core each), so every run is an ordinary run folder under the experiment folder: an interrupted demo continues where
it stopped when rerun, and ``diffmem analyze`` / ``diffmem status`` / the notebook read its output like any other
experiment.

The advice check. The advice for the largest N comes from the laws fitted across the grid (fits.json); when their
95% intervals cannot place the window (it is "unresolved"), the demo says so and also gives the advice of the largest
run's own measured timescales (:func:`diffmem.analysis.advise.advise_measured`). The first advice whose window is
open is a step ``stop`` with tau_gen_hi < stop < tau_mem_lo, and the range of checkpoints to keep, from tau_gen_hi
to ``stop``. The demo then follows it as a user would: it trains that run's config again, with a budget of exactly
``stop`` steps, evaluations at tau_gen_hi and at ``stop`` and checkpoints kept between them as in the grid
(``eval.checkpoint_ratio``; none when the grid keeps none), into ``advice_check/<run name>`` (not a run of the grid:
``diffmem analyze`` does not read it). It evaluates every kept checkpoint, takes the one with the best FID / FD, and
evaluates that one again with fresh samples (``eval.seed`` + 1), so that choosing the best of a few does not flatter the number reported. Training
is deterministic with the grid's thread count, so these are the grid run's own models. The advice holds when no
kept checkpoint copies a training image (f_mem = 0 among each evaluation's samples and among the fresh ones) and
the fresh FID / FD lies within the plateau band of the full run (at or below the band's upper edge,
``Estimate.level`` of its tau_gen). The model at ``stop`` itself is printed too.

``report.txt`` in the experiment folder holds the printed report; it names files relative to that folder only.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from diffmem.analysis.advise import Advice, advise, advise_measured
from diffmem.analysis.powerlaw import PowerLawFit
from diffmem.analysis.scaling import RunSummary, Summary
from diffmem.analysis.timescales import Estimate
from diffmem.cluster.base import ClusterOptions
from diffmem.cluster.executors import local_job_threads
from diffmem.config import RunConfig, SweepConfig
from diffmem.evaluate import evaluate_again, evaluate_run
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.io import atomic_write_text
from diffmem.metrics.extractor_names import metric_label
from diffmem.outcomes import INTERRUPTED, SUCCEEDED
from diffmem.results import write_results
from diffmem.rundir import RunDir
from diffmem.sweep import job_config, run_sweep
from diffmem.train import train

# --quick: the same grid with fewer steps, samples and evaluations, and the per-level losses (the loss gap and the
# membership AUC) on fewer held-out images and noise draws, so the test suite can run the demo end to end.
QUICK = {"steps_per_n": 5, "min_steps": 0, "times": 6, "n_samples": 32, "sampler_steps": 10, "loss_n_test": 64,
         "loss_noise_draws": 1}

CHECK_DIR = "advice_check"  # advice checks live here, inside the experiment folder but outside its grid


def quick_version(base: RunConfig, sweep: SweepConfig) -> tuple[RunConfig, SweepConfig]:
    """The --quick variant of an experiment: fewer steps, samples, evaluations and held-out images for the losses, no
    early stop or refinement (see ``QUICK``)."""
    cfg = base.replace(eval={"times": QUICK["times"], "n_samples": QUICK["n_samples"],
                             "sampler_steps": QUICK["sampler_steps"], "loss_n_test": QUICK["loss_n_test"],
                             "loss_noise_draws": QUICK["loss_noise_draws"], "fid_boot": 0, "checkpoint_ratio": 0.0,
                             "refine_ratio": 0.0, "stop_f_mem": 0.0})
    return cfg, dataclasses.replace(sweep, width=sweep.width[:1], seeds=sweep.seeds[:1],
                                    steps_per_n=QUICK["steps_per_n"], min_steps=QUICK["min_steps"])


# --- the advice check ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdviceCheck:
    """The advice followed: a run trained to the advised step, its checkpoints in the kept range evaluated, the best
    one evaluated again with fresh samples.

    run: its folder relative to the experiment folder. step: the advised stop (optimizer steps). kept: (step, f_mem,
    quality) of every evaluated checkpoint from the range's first step to ``step``, ascending, each with
    ``n_samples`` samples. chosen: the kept step with the best quality. fresh_f_mem / fresh_quality: that checkpoint
    with ``n_samples`` fresh samples (seed ``fresh_seed``). plateau_level: the upper edge of the full run's plateau
    band (same units as quality, ``metric``), None when the run has none.
    """

    run: str
    step: int
    kept: tuple[tuple[int, float, float | None], ...]
    n_samples: int
    chosen: int
    fresh_seed: int
    fresh_f_mem: float
    fresh_quality: float | None
    plateau_level: float | None
    metric: str

    @property
    def no_copies(self) -> bool:
        return self.fresh_f_mem == 0 and all(f == 0 for _, f, _ in self.kept)

    @property
    def on_plateau(self) -> bool:
        return (self.fresh_quality is not None and self.plateau_level is not None
                and self.fresh_quality <= self.plateau_level)

    @property
    def passed(self) -> bool:
        return self.no_copies and self.on_plateau

    def format(self) -> str:
        def q(value: float | None) -> str:
            return "-" if value is None else f"{value:.4g}"

        copies = sum(round(f * self.n_samples) for _, f, _ in self.kept)
        fresh_copies = round(self.fresh_f_mem * self.n_samples)
        level = "unknown" if self.plateau_level is None else f"<= {self.plateau_level:.4g}"
        at_stop = next((quality for s, _, quality in self.kept if s == self.step), None)
        verdict = ("advice verified: no kept checkpoint copies, and the one kept is on the plateau" if self.passed
                   else "advice NOT verified: " + " and ".join(
                       w for w, bad in (("it copies training images", not self.no_copies),
                                        ("its quality is off the plateau", not self.on_plateau)) if bad))
        first = self.kept[0][0] if self.kept else self.step
        return "\n".join([
            f"Check: the same run trained to step {self.step} and stopped there, keeping checkpoints from step "
            f"{first} ({self.run}):",
            f"  {self.metric} of the kept checkpoints: "
            + ", ".join(f"{s} {q(quality)}" for s, _, quality in self.kept),
            f"  copies among their samples: {copies} ({len(self.kept)} x {self.n_samples} samples; required: 0)",
            f"  the model at step {self.step} itself: {self.metric} = {q(at_stop)}",
            f"  kept: step {self.chosen} (best {self.metric}); with fresh samples (seed {self.fresh_seed}): "
            f"f_mem = {self.fresh_f_mem:.3f} ({fresh_copies} of {self.n_samples}; required: 0), "
            f"{self.metric} = {q(self.fresh_quality)}; plateau band of the full run: {level}",
            f"  {verdict}"])


def check_advice(advice: Advice, planned: PlannedRun, experiment_dir: str | Path, plateau: Estimate,
                 threads: int = 0, log=lambda _msg: None) -> AdviceCheck:
    """Follow ``advice`` with ``planned``'s config into ``experiment_dir/advice_check/<run name>`` (see the module
    docstring) and compare with ``plateau`` (the full run's tau_gen estimate, whose ``level`` is its plateau band's
    upper edge). ``threads``: the torch threads of the grid's jobs (0: the config's), so that the check trains the
    grid run's own models. Idempotent: a finished check is read back."""
    if advice.stop_step is None:
        raise ValueError("the advice recommends no step; nothing to check")
    step = max(1, round(advice.stop_step))
    first = min(step, max(1, math.ceil(advice.keep_from))) if advice.keep_from is not None else step
    ratio = planned.cfg.eval.checkpoint_ratio if first < step else 0.0  # the grid's spacing; 0: the two ends only
    cfg = planned.cfg.replace(train={"steps": step},
                              eval={"times": sorted({first, step}), "checkpoint_ratio": ratio,
                                    "refine_ratio": 0.0, "refine_n_samples": 0, "stop_f_mem": 0.0})
    cfg = job_config(cfg, "train", eval_separately=False, threads=threads)
    relative = Path(CHECK_DIR) / planned.name
    path = Path(experiment_dir) / relative
    train(cfg, path, progress=False, log=log)
    evaluate_run(path, kept=True, log=log)
    seed = cfg.eval.seed
    records = [r for r in RunDir(path).metrics() if first <= r["step"] <= step]  # every line: both seeds
    kept = sorted({r["step"]: r for r in records if r.get("seed", seed) == seed}.values(), key=lambda r: r["step"])
    chosen = min(kept, key=lambda r: (math.inf if r.get("fid") is None else r["fid"], r["step"]))["step"]
    fresh = next((r for r in records if r["step"] == chosen and r.get("seed") == seed + 1), None)
    if fresh is None:
        fresh = evaluate_again(path, chosen, seed=seed + 1, log=log)
    return AdviceCheck(run=relative.as_posix(), step=step,
                       kept=tuple((int(r["step"]), float(r["f_mem"]), r.get("fid")) for r in kept),
                       n_samples=int(fresh["n_samples"]), chosen=int(chosen), fresh_seed=seed + 1,
                       fresh_f_mem=float(fresh["f_mem"]), fresh_quality=fresh.get("fid"),
                       plateau_level=plateau.level, metric=metric_label(fresh.get("fid_extractor") or "auto"))


# --- the demo -------------------------------------------------------------------------------------------------------

def run_demo(base: RunConfig, sweep: SweepConfig, out: str | Path, *, quick: bool = False, jobs: int | None = None,
             progress: bool = True) -> int:
    """Train every run of the demo grid into ``out`` (``jobs`` at once, default one per CPU core), analyze it,
    advise for the largest N and check the advice, print the report and write it to ``out/report.txt``.
    Returns an exit code: 0, 130 when interrupted (rerun to continue), 1 when a run failed."""
    if quick:
        base, sweep = quick_version(base, sweep)
    out = Path(out)
    runs = expand_grid(base, sweep, out)
    jobs = min(jobs or os.cpu_count() or 1, len(runs))
    start = time.perf_counter()
    total_steps = sum(r.cfg.train.steps for r in runs)
    print(f"diffmem demo: {len(runs)} runs ({', '.join(r.name for r in runs)}), at most {total_steps} training "
          f"steps in all, {jobs} at a time, into {out}", flush=True)
    try:
        sweep_report = run_sweep(base, sweep, out, ClusterOptions(cluster="local", max_parallel=jobs),
                                 progress=progress, log=lambda msg: print(f"  {msg}", flush=True))
    except KeyboardInterrupt:
        print(f"diffmem demo: interrupted; rerun the same command to continue ({out})", flush=True)
        return 130
    failed = [r for r in sweep_report.results if r.status not in SUCCEEDED]
    if failed:
        for r in failed:
            print(f"diffmem demo: {r.name} {r.status}" + (f": {r.error}" if r.error else ""))
        return 130 if all(r.status == INTERRUPTED for r in failed) else 1
    summary = write_results(out)
    largest = max(runs, key=lambda r: r.cfg.data.n)
    n, width = largest.cfg.data.n, largest.cfg.model.width
    row = next(r for r in summary.runs if r.run == largest.name)
    advices = [dataclasses.replace(advise(n, width, out / "fits.json"), laws="the laws fitted in fits.json")]
    if advices[0].window != "open":  # the laws cannot place the window: fall back to what the run itself measured
        advices.append(advise_measured(n, width, row.tau_gen, row.tau_mem, largest.name))
    checked = next((a for a in advices if a.window == "open"), None)
    check = None
    if checked is not None:
        print(f"  checking the advice: training {largest.name} to step {round(checked.stop_step)}", flush=True)
        check = check_advice(checked, largest, out, row.tau_gen, threads=local_job_threads(jobs))
    text = report(summary, advices, check, time.perf_counter() - start)
    atomic_write_text(out / "report.txt", text + "\n")
    print(text)
    print(f"\nfiles in {out}: report.txt, summary.csv, fits.json, figures/")
    return 0


def _estimate(e: Estimate) -> str:
    """A timescale for the report's table: value [lo, hi] in whole steps, or a bound."""
    if e.value is None:
        return "-"
    if e.censored:  # hi None: not reached by the last step; lo None: reached before the first evaluation
        return f"> {e.value:.0f} (not reached)" if e.hi is None else f"< {e.value:.0f}"
    ci = f" [{e.lo:.0f}, {e.hi:.0f}]" if e.lo is not None and e.hi is not None else ""
    return f"{e.value:.0f}{ci}"


def _row(r: RunSummary) -> str:
    final = "-" if r.final_f_mem is None else f"{r.final_f_mem:.2f}"
    steps = "-" if r.steps is None else str(int(r.steps))
    return (f"{r.n:<6} {r.width:<4} {r.batch:<6} {steps:<7} {_estimate(r.tau_gen):<24} {_estimate(r.tau_mem):<24} "
            f"{_estimate(r.tau_mem_epochs):<24} {final}")


UNRESOLVED_WIDTH = 1.0
"""A law whose exponent interval is wider than this cannot tell the paper's exponents 0 and 1 apart."""


def law_line(label: str, fit: PowerLawFit, paper: str) -> str:
    """One line of the report for a fitted law: the fit beside the paper's exponent when its interval can tell 0 from
    1, else in words that the grid does not resolve it, with the numbers and where the law is measured."""
    if fit.fitted and fit.exponent_lo is not None and fit.exponent_hi - fit.exponent_lo <= UNRESOLVED_WIDTH:
        return f"{label}: {fit.describe()}  ({paper})"
    lo, hi = fit.x_range if fit.points else (None, None)
    grid = f"{fit.x_name} = {lo:g}..{hi:g}" if lo is not None else "this grid"
    numbers = (f"exponent {fit.exponent:.2f}, 95% interval "
               + (f"[{fit.exponent_lo:.2f}, {fit.exponent_hi:.2f}]" if fit.exponent_lo is not None else "none")
               if fit.fitted else f"not fitted: {fit.reason}")
    return (f"{label}: not resolved by {grid} ({numbers}: it cannot tell an exponent of 0 from the paper's 1); "
            "the CPU reference experiment measures it (results/cpu_digits_2/README.md)")


def report(summary: Summary, advices: Sequence[Advice], check: AdviceCheck | None, seconds: float) -> str:
    """The demo's closing text: timescales per run, the fitted laws, the advice (from the fitted laws, then, when
    those cannot place the window, from the largest run's own measurement) and the check of the first advice whose
    window is open. Run names and files are relative to the experiment folder; steps are whole numbers."""
    lines = ["N      W    batch  steps   tau_gen [95% CI]         tau_mem [95% CI]         "
             "tau_mem in epochs        final f_mem"]
    lines += [_row(r) for r in sorted(summary.runs, key=lambda r: (r.width, r.n))]
    lines += ["", "steps: the last evaluated step; tau in optimizer steps unless marked epochs (passes over the train "
                  "set = steps x batch / N)", ""]
    paper = {"tau_mem_vs_n": "paper: exponent 1", "tau_mem_epochs_vs_n": "paper, full batch: exponent 1",
             "tau_gen_vs_n": "paper: flat, exponent 0"}
    for name, label in (("tau_mem_vs_n", "tau_mem vs N"), ("tau_mem_epochs_vs_n", "tau_mem (epochs) vs N"),
                        ("tau_gen_vs_n", "tau_gen vs N")):
        laws = summary.fits[name].laws() if name in summary.fits else []
        lines += [law_line(label if len(laws) == 1 else f"{label} ({runs})", fit, paper[name]) for runs, fit in laws]
    for advice in advices:
        lines += ["", advice.format()]
    lines.append("")
    if check is not None:
        lines.append(check.format())
    else:
        lines.append("Check: not run; no advice has an open window (a check needs tau_gen_hi < stop < tau_mem_lo)")
    lines += ["", f"took {seconds / 60:.1f} min"]
    return "\n".join(lines)
