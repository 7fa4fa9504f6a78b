"""``diffmem demo``: the embedded CPU experiment end to end -- train a small N sweep, analyze it, print a report.

Every run is an ordinary run folder under the experiment folder, so an interrupted demo continues where it stopped
when rerun, and ``diffmem analyze`` / the notebook read its output like any other experiment.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
from tqdm.auto import tqdm

from diffmem.analysis.advise import advise
from diffmem.analysis.scaling import analyze
from diffmem.config import RunConfig, SweepConfig
from diffmem.experiment import PlannedRun, expand_grid
from diffmem.train import train

# --quick: the same grid with fewer steps, samples and evaluations, so the test suite can run the demo end to end.
QUICK = {"steps_per_n": 40, "times": 6, "n_samples": 32, "sampler_steps": 10}


def quick_version(base: RunConfig, sweep: SweepConfig) -> tuple[RunConfig, SweepConfig]:
    """The --quick variant of an experiment: fewer steps, samples and evaluations (see ``QUICK``)."""
    cfg = base.replace(eval={"times": QUICK["times"], "n_samples": QUICK["n_samples"],
                             "sampler_steps": QUICK["sampler_steps"]})
    return cfg, SweepConfig(n=sweep.n, width=sweep.width[:1], seeds=sweep.seeds[:1], steps_per_n=QUICK["steps_per_n"])


_progress_row = 0  # in a worker process: the terminal row of its progress bars, set once by _init_worker


def _init_worker(rows, lock) -> None:
    """Run once in each worker process: take the next free progress-bar row (1, 2, ...) and tqdm's shared lock."""
    global _progress_row
    with rows.get_lock():
        rows.value += 1
        _progress_row = rows.value
    tqdm.set_lock(lock)


def _train_quietly(planned: PlannedRun, progress: bool) -> tuple[str, str, int]:
    """Train one run in a worker process with one CPU thread, its progress bar on the worker's own row; returns
    (name, status, steps)."""
    torch.set_num_threads(1)
    result = train(planned.cfg, planned.path, progress=progress, progress_position=_progress_row,
                   log=lambda _msg: None)
    return planned.name, result.status, result.step


def train_runs(runs: list[PlannedRun], jobs: int, progress: bool) -> bool:
    """Train every run, each with its own progress bar below the overall one: in this process when ``jobs == 1``,
    else in ``jobs`` worker processes of one thread each (on a small CPU, parallel 1-thread runs beat one multi-threaded run), the longest
    runs first so that the workers finish together. Returns False when interrupted (Ctrl-C / SIGTERM): the runs
    started have saved their state, and rerunning the demo continues them."""
    order = sorted(runs, key=lambda r: -r.cfg.train.steps)
    with tqdm(total=len(runs), desc="demo runs", unit="run", disable=not progress, position=0) as overall:
        if jobs <= 1:
            for planned in order:
                result = train(planned.cfg, planned.path, progress=progress, log=lambda _msg: None)
                if result.status == "interrupted":
                    return False
                overall.update(1)
            return True
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                                   initargs=(ctx.Value("i", 0), ctx.RLock()))
        # hand out one run per free worker (never queue ahead), so that an interrupt starts no further run
        waiting = list(order)
        running = {pool.submit(_train_quietly, waiting.pop(0), progress) for _ in range(min(jobs, len(waiting)))}
        try:
            while running:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    name, status, steps = future.result()
                    if status == "interrupted":  # a worker was signalled: let the others save, start nothing
                        pool.shutdown(wait=True)
                        return False
                    overall.write(f"  {name}: {status} at step {steps}")
                    overall.update(1)
                    if waiting:
                        running.add(pool.submit(_train_quietly, waiting.pop(0), progress))
        except KeyboardInterrupt:  # the workers got the same Ctrl-C and save their state
            pool.shutdown(wait=True)
            return False
        pool.shutdown(wait=True)
    return True


def run_demo(base: RunConfig, sweep: SweepConfig, out: str | Path, *, quick: bool = False, jobs: int | None = None,
             progress: bool = True) -> int:
    """Train every run of the demo grid into ``out``, analyze it, print the report. Returns an exit code.

    ``jobs``: parallel worker processes (default: one per CPU core, at most one per run).
    """
    if quick:
        base, sweep = quick_version(base, sweep)
    out = Path(out)
    runs = expand_grid(base, sweep, out)
    jobs = min(jobs or os.cpu_count() or 1, len(runs))
    start = time.perf_counter()
    total_steps = sum(r.cfg.train.steps for r in runs)
    print(f"diffmem demo: {len(runs)} runs ({', '.join(r.name for r in runs)}), {total_steps} training steps in all, "
          f"{jobs} at a time, into {out}")
    if not train_runs(runs, jobs, progress):
        print(f"diffmem demo: interrupted; rerun the same command to continue ({out})")
        return 130
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
        lines.append(f"{r.n:<6} {r.width:<4} {int(r.steps or 0):<9} {est(r.tau_gen):<26} {est(r.tau_mem):<26} {final}")
    fit = summary.fits["tau_mem_vs_n"].pooled
    lines += ["", f"tau_mem vs N: {fit.describe()}  (paper: exponent 1)",
              f"tau_gen vs N: {summary.fits['tau_gen_vs_n'].pooled.describe()}  (paper: flat, exponent 0)",
              "", advice.format(), "",
              f"summary: {summary.summary_csv}", f"fits:    {summary.fits_json}",
              f"figures: {summary.experiment_dir / 'figures'}", f"took {seconds / 60:.1f} min"]
    return "\n".join(lines)
