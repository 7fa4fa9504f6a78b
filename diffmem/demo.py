"""``diffmem demo``: the embedded CPU experiment end to end -- train a small N sweep, analyze it, advise when to stop
training the largest N, and check that advice by training a run to the advised step.

The grid runs through the same local executor as ``diffmem sweep --cluster local`` (one submitit job per run, one
core each), so every run is an ordinary run folder under the experiment folder: an interrupted demo continues where
it stopped when rerun, and ``diffmem analyze`` / ``diffmem status`` / the notebook read its output like any other
experiment.

The advice check. The advice for the largest N comes from the laws fitted across the grid (fits.json); when their
95% intervals cannot place the window (it is "unresolved"), the demo says so and also gives the advice of the largest
run's own measured timescales (:func:`diffmem.analysis.advise.advise_measured`). The first advice whose window is
open is a step ``stop`` with tau_gen_hi < stop < tau_mem_lo. The demo then trains that run's config again,
with a budget of exactly ``stop`` steps and one evaluation at the end, into ``advice_check/<run name>`` (not a run of
the grid: ``diffmem analyze`` does not read it). Training is deterministic, so this is the grid run's own model at
step ``stop``, as a user who followed the advice would have it. The advice holds when that model copies no training
image (f_mem = 0 among the evaluation's samples) and its FID / FD lies within the plateau band of the full run
(at or below the band's upper edge, ``Estimate.level`` of its tau_gen).

``report.txt`` in the experiment folder holds the printed report; it names files relative to that folder only.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from diffmem.analysis.advise import Advice, advise, advise_measured
from diffmem.analysis.runfiles import read_metrics
from diffmem.analysis.scaling import RunSummary, Summary, analyze
from diffmem.analysis.timescales import Estimate
from diffmem.config import RunConfig, SweepConfig
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.io import atomic_write_text
from diffmem.metrics.fid import metric_label
from diffmem.sweep import ClusterOptions, run_sweep
from diffmem.train import train

# --quick: the same grid with fewer steps, samples and evaluations, so the test suite can run the demo end to end.
QUICK = {"steps_per_n": 10, "min_steps": 0, "times": 6, "n_samples": 32, "sampler_steps": 10}

CHECK_DIR = "advice_check"  # advice checks live here, inside the experiment folder but outside its grid


def quick_version(base: RunConfig, sweep: SweepConfig) -> tuple[RunConfig, SweepConfig]:
    """The --quick variant of an experiment: fewer steps, samples and evaluations, no early stop or refinement
    (see ``QUICK``)."""
    cfg = base.replace(eval={"times": QUICK["times"], "n_samples": QUICK["n_samples"],
                             "sampler_steps": QUICK["sampler_steps"], "fid_boot": 0, "checkpoint_ratio": 0.0,
                             "refine_ratio": 0.0, "stop_f_mem": 0.0})
    return cfg, dataclasses.replace(sweep, width=sweep.width[:1], seeds=sweep.seeds[:1],
                                    steps_per_n=QUICK["steps_per_n"], min_steps=QUICK["min_steps"])


# --- the advice check -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdviceCheck:
    """A run trained to the advised step and evaluated there.

    run: its folder relative to the experiment folder. step: the advised step (optimizer steps). f_mem: the
    fraction of its ``n_samples`` samples that copy a training image. quality: its FID / FD (``metric``).
    plateau_level: the upper edge of the full run's plateau band (same units), None when the run has none.
    """

    run: str
    step: int
    f_mem: float
    n_samples: int
    quality: float | None
    plateau_level: float | None
    metric: str

    @property
    def no_copies(self) -> bool:
        return self.f_mem == 0

    @property
    def on_plateau(self) -> bool:
        return self.quality is not None and self.plateau_level is not None and self.quality <= self.plateau_level

    @property
    def passed(self) -> bool:
        return self.no_copies and self.on_plateau

    def format(self) -> str:
        copies = round(self.f_mem * self.n_samples)
        quality = "-" if self.quality is None else f"{self.quality:.4g}"
        level = "unknown" if self.plateau_level is None else f"<= {self.plateau_level:.4g}"
        verdict = ("advice verified: stopped there, the model generalizes" if self.passed else
                   "advice NOT verified: " + " and ".join(
                       w for w, bad in (("it copies training images", not self.no_copies),
                                        ("its quality is off the plateau", not self.on_plateau)) if bad))
        return "\n".join([
            f"Check: the same run trained to step {self.step} and stopped there ({self.run}):",
            f"  f_mem = {self.f_mem:.3f} ({copies} of {self.n_samples} samples copy a training image; required: 0)",
            f"  {self.metric} = {quality}; plateau band of the full run: {level}",
            f"  {verdict}"])


def check_advice(advice: Advice, planned: PlannedRun, experiment_dir: str | Path, plateau: Estimate,
                 log=lambda _msg: None) -> AdviceCheck:
    """Train ``planned``'s config to ``advice.stop_step`` (rounded to a step) into
    ``experiment_dir/advice_check/<run name>``, evaluate it once there, and compare with ``plateau`` (the full run's
    tau_gen estimate, whose ``level`` is its plateau band's upper edge). Idempotent: a finished check is read back."""
    if advice.stop_step is None:
        raise ValueError("the advice recommends no step; nothing to check")
    step = max(1, round(advice.stop_step))
    cfg = planned.cfg.replace(train={"steps": step},
                              eval={"times": 1, "checkpoint_ratio": 0.0, "refine_ratio": 0.0, "stop_f_mem": 0.0})
    relative = Path(CHECK_DIR) / planned.name
    path = Path(experiment_dir) / relative
    train(cfg, path, progress=False, log=log)
    record = next(r for r in read_metrics(path / "metrics.jsonl") if r["step"] == step)
    return AdviceCheck(run=relative.as_posix(), step=step, f_mem=float(record["f_mem"]),
                       n_samples=int(record["n_samples"]), quality=record.get("fid"),
                       plateau_level=plateau.level, metric=metric_label(record.get("fid_extractor") or "auto"))


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
    failed = [r for r in sweep_report.results if r.status not in ("done", "skipped", "evaluated")]
    if failed:
        for r in failed:
            print(f"diffmem demo: {r.name} {r.status}" + (f": {r.error}" if r.error else ""))
        return 130 if all(r.status == "interrupted" for r in failed) else 1
    summary = analyze(out)
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
        check = check_advice(checked, largest, out, row.tau_gen)
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
        if name in summary.fits:
            lines.append(f"{label}: {summary.fits[name].pooled.describe()}  ({paper[name]})")
    for advice in advices:
        lines += ["", advice.format()]
    lines.append("")
    if check is not None:
        lines.append(check.format())
    else:
        lines.append("Check: not run; no advice has an open window (a check needs tau_gen_hi < stop < tau_mem_lo)")
    lines += ["", f"took {seconds / 60:.1f} min"]
    return "\n".join(lines)
