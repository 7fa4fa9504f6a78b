"""``diffmem demo``: the embedded CPU experiment end to end -- train a small N sweep, analyze it, print a report.

Every run is an ordinary run folder under the experiment folder, so an interrupted demo continues where it stopped
when rerun, and ``diffmem analyze`` / the notebook read its output like any other experiment.
"""
from __future__ import annotations

import time
from pathlib import Path

from tqdm.auto import tqdm

from diffmem.analysis.advise import advise
from diffmem.analysis.scaling import analyze
from diffmem.config import RunConfig, SweepConfig
from diffmem.experiment import expand_grid
from diffmem.train import train

# --quick: the same experiment, smaller in every direction, so the test suite can run the demo end to end.
QUICK = {"ns": [4, 8, 16, 32], "steps_per_n": 40, "times": 6, "n_samples": 32, "sampler_steps": 10}


def quick_version(base: RunConfig, sweep: SweepConfig) -> tuple[RunConfig, SweepConfig]:
    """The --quick variant of an experiment: fewer steps, samples and evaluations (see ``QUICK``)."""
    cfg = base.replace(eval={"times": QUICK["times"], "n_samples": QUICK["n_samples"],
                             "sampler_steps": QUICK["sampler_steps"]})
    ns = [n for n in QUICK["ns"] if n + cfg.data.n_heldout <= 100] if cfg.data.source == "lfw_faces" else QUICK["ns"]
    return cfg, SweepConfig(n=ns, width=sweep.width[:1], seeds=sweep.seeds[:1], steps_per_n=QUICK["steps_per_n"])


def run_demo(base: RunConfig, sweep: SweepConfig, out: str | Path, *, quick: bool = False,
             progress: bool = True) -> int:
    """Train every run of the demo grid into ``out``, analyze it, print the report. Returns an exit code."""
    if quick:
        base, sweep = quick_version(base, sweep)
    out = Path(out)
    runs = expand_grid(base, sweep, out)
    start = time.perf_counter()
    total_steps = sum(r.cfg.train.steps for r in runs)
    print(f"diffmem demo: {len(runs)} runs ({', '.join(r.name for r in runs)}), {total_steps} training steps in all, "
          f"into {out}")
    quiet = lambda _msg: None  # noqa: E731 - per-evaluation lines would drown the progress bars
    with tqdm(total=len(runs), desc="demo runs", unit="run", disable=not progress, position=0) as overall:
        for planned in runs:
            train(planned.cfg, planned.path, progress=progress, log=quiet if progress else print)
            overall.update(1)
    summary = analyze(out)
    largest = max(runs, key=lambda r: r.cfg.data.n).cfg
    advice = advise(largest.data.n, largest.model.width, out / "fits.json")
    print(report(summary, advice, time.perf_counter() - start))
    return 0


def report(summary, advice, seconds: float) -> str:
    """The demo's closing text: the table of timescales, the fitted law, the advice, where the files are."""
    def est(e) -> str:
        if e.value is None:
            return "-"
        if e.censored:  # hi None: not reached by the last step; lo None: reached before the first evaluation
            return f"> {e.value:.0f} (not reached)" if e.hi is None else f"< {e.value:.0f}"
        ci = f" [{e.lo:.0f}, {e.hi:.0f}]" if e.lo is not None and e.hi is not None else ""
        return f"{e.value:.0f}{ci}"

    lines = ["", "N      W    steps     tau_gen [95% CI]           tau_mem [95% CI]           final f_mem"]
    for r in sorted(summary.runs, key=lambda r: (r.width, r.n)):
        final = "-" if r.final_f_mem is None else f"{r.final_f_mem:.2f}"
        lines.append(f"{r.n:<6} {r.width:<4} {r.steps or 0:<9} {est(r.tau_gen):<26} {est(r.tau_mem):<26} {final}")
    fit = summary.fits["tau_mem_vs_n"].pooled
    lines += ["", f"tau_mem vs N: {fit.describe()}  (paper: exponent 1)",
              f"tau_gen vs N: {summary.fits['tau_gen_vs_n'].pooled.describe()}  (paper: flat, exponent 0)",
              "", advice.format(), "",
              f"summary: {summary.summary_csv}", f"fits:    {summary.fits_json}",
              f"figures: {summary.experiment_dir / 'figures'}", f"took {seconds / 60:.1f} min"]
    return "\n".join(lines)
