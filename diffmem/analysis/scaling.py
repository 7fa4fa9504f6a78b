"""Across runs: per-run timescales -> summary.csv, power-law fits -> fits.json (`diffmem analyze`).

Fit (docs/analysis.md copies this): a law ``tau = prefactor * x ** exponent`` is fitted by ordinary least squares of
``log10 tau`` on ``log10 x`` over the runs whose tau is a measurement (not censored, not missing). Its confidence
interval is a seeded bootstrap over runs: ``n_boot`` (2000) resamples of the runs with replacement, each refitted
(resamples with a single distinct x are dropped). In each resample a run's tau is drawn log-uniformly within its own
interval [tau_lo, tau_hi] (the bracket of evaluations it was measured between), one uniform draw per distinct x
shared by its runs: seeds of one N share the evaluation grid and so its error, and the coarseness of the grid then
widens the interval instead of averaging away over seeds. ``exponent_lo``/``exponent_hi`` and
``prefactor_lo``/``prefactor_hi`` are the 2.5% and 97.5% percentiles, and a prediction's interval at any x is the
same percentiles of the refitted laws evaluated at x. Censored runs (bounds, not measurements) are listed with their
bound and left out; runs without the quantity are listed with the reason; a law with fewer than 2 distinct x values
is reported as not fittable (null exponent with a reason). With fewer than 3 distinct x values the bootstrap interval
is degenerate and the fit says so in ``ci_note``.

fits.json holds ``tau_mem_vs_n`` and ``tau_gen_vs_n`` (pooled over widths, plus ``by_width``), ``tau_gen_vs_width``
(pooled over N, plus ``by_n``) and ``tau_mem_vs_n_over_width`` (x = N / W, all runs).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from diffmem import __version__
from diffmem.analysis import timescales
from diffmem.analysis.powerlaw import FitSet, PowerLawFit, fit_power_law
from diffmem.analysis.runfiles import RunRecord, read_experiment, write_csv, write_json
from diffmem.analysis.timescales import Estimate, TimescaleInputError

SUMMARY_COLUMNS: tuple[str, ...] = (
    "run", "n", "width", "params", "seed", "steps",
    "tau_gen", "tau_gen_lo", "tau_gen_hi",
    "tau_mem", "tau_mem_lo", "tau_mem_hi", "tau_mem_censored",
    "tau_gap", "min_fid", "final_f_mem",
    # extras after the contract's columns
    "state", "fid_extractor", "tau_gen_censored", "tau_gap_censored", "n_evals", "planned_steps",
    "batch", "tau_mem_epochs", "tau_mem_epochs_lo", "tau_mem_epochs_hi", "tau_gen_epochs",
    "fid_first", "fid_plateau_noise", "fid_noise_to_fall", "tau_gen_bracket_lo", "tau_gen_bracket_hi",
)
"""Columns of summary.csv, in order. ``steps`` is the last evaluated step (an integer); ``planned_steps`` is
train.steps; ``batch`` the effective batch; ``*_epochs`` the same timescale in passes over the train set
(steps x batch / n). Quality's resolution: ``fid_first`` is the FID / FD at the first evaluation,
``fid_plateau_noise`` the plateau's noise sigma of the tau_gen rule (the scatter between neighbouring evaluations,
or the metric's own standard error when larger), ``fid_noise_to_fall`` = fid_plateau_noise / (fid_first - min_fid):
how large that noise is against the curve's fall to its plateau (small: tau_gen is well resolved).
``tau_gen_bracket_lo/hi``: the evaluated steps just before and after tau_gen's crossing, the part of its interval
that only more evaluations narrow (the interval [tau_gen_lo, tau_gen_hi] holds it and also carries the FID's
noise); tau_mem's interval is its bracket of evaluations already."""


# --- one run --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSummary:
    """One row of summary.csv with the estimates behind it."""

    run: str
    n: int
    width: int
    params: int | None
    seed: int
    batch: int
    steps: int | None
    state: str
    n_evals: int
    planned_steps: int | None
    fid_extractor: str | None
    min_fid: float | None
    final_f_mem: float | None
    fid_first: float | None
    tau_gen: Estimate
    tau_mem: Estimate
    tau_gap: Estimate
    tau_gen_bracket: tuple[int, int] | None = None  # evaluated steps around tau_gen's crossing

    def row(self) -> dict[str, Any]:
        """The summary.csv row (keys = :data:`SUMMARY_COLUMNS`)."""
        return {
            "run": self.run, "n": self.n, "width": self.width, "params": self.params, "seed": self.seed,
            "steps": self.steps,
            "tau_gen": self.tau_gen.value, "tau_gen_lo": self.tau_gen.lo, "tau_gen_hi": self.tau_gen.hi,
            "tau_mem": self.tau_mem.value, "tau_mem_lo": self.tau_mem.lo, "tau_mem_hi": self.tau_mem.hi,
            "tau_mem_censored": self.tau_mem.censored,
            "tau_gap": self.tau_gap.value, "min_fid": self.min_fid, "final_f_mem": self.final_f_mem,
            "state": self.state, "fid_extractor": self.fid_extractor,
            "tau_gen_censored": self.tau_gen.censored, "tau_gap_censored": self.tau_gap.censored,
            "n_evals": self.n_evals, "planned_steps": self.planned_steps,
            "batch": self.batch, "tau_mem_epochs": self.tau_mem_epochs.value, "tau_mem_epochs_lo": self.tau_mem_epochs.lo,
            "tau_mem_epochs_hi": self.tau_mem_epochs.hi, "tau_gen_epochs": self.tau_gen_epochs.value,
            "fid_first": self.fid_first, "fid_plateau_noise": self.tau_gen.noise,
            "fid_noise_to_fall": self.fid_noise_to_fall,
            "tau_gen_bracket_lo": self.tau_gen_bracket[0] if self.tau_gen_bracket else None,
            "tau_gen_bracket_hi": self.tau_gen_bracket[1] if self.tau_gen_bracket else None,
        }

    @property
    def fid_noise_to_fall(self) -> float | None:
        """The plateau's noise over the quality curve's fall from the first evaluation to its lowest value."""
        if self.tau_gen.noise is None or self.fid_first is None or self.min_fid is None:
            return None
        fall = self.fid_first - self.min_fid
        return self.tau_gen.noise / fall if fall > 0 else None

    def _in_epochs(self, est: Estimate) -> Estimate:
        """The same estimate in epochs (passes over the train set): steps x batch / n."""
        f = self.batch / self.n
        scale = lambda v: None if v is None else v * f  # noqa: E731
        return Estimate(scale(est.value), scale(est.lo), scale(est.hi), est.censored, f"{est.rule}; x batch / n",
                        est.level, est.noise)

    @property
    def tau_mem_epochs(self) -> Estimate:
        return self._in_epochs(self.tau_mem)

    @property
    def tau_gen_epochs(self) -> Estimate:
        return self._in_epochs(self.tau_gen)


def summarize_run(record: RunRecord) -> RunSummary:
    """Estimate tau_gen, tau_mem and tau_gap of one run from its metrics (rules: :mod:`diffmem.analysis.timescales`)."""
    steps = record.steps
    f_mem = record.series("f_mem")
    fid = record.series("fid")
    try:
        estimates = timescales.estimate_run(record.evaluations)
    except TimescaleInputError as e:  # bad per-run data: missing estimates with a warning, not a failed analysis
        warnings.warn(f"run {record.name}: timescales not estimated: {e}", stacklevel=2)
        estimates = {name: Estimate(None, None, None, False, str(e)) for name in ("tau_mem", "tau_gen", "tau_gap")}
    tau_mem, tau_gen, tau_gap = estimates["tau_mem"], estimates["tau_gen"], estimates["tau_gap"]
    finite_fid = fid[np.isfinite(fid)]
    finite_f = f_mem[np.isfinite(f_mem)]
    return RunSummary(
        run=record.name, n=record.n, width=record.width, params=record.params, seed=record.seed, batch=record.batch,
        steps=int(steps[-1]) if steps.size else None, state=record.state, n_evals=int(steps.size),
        planned_steps=record.planned_steps, fid_extractor=record.last_value("fid_extractor"),
        min_fid=float(finite_fid.min()) if finite_fid.size else None,
        final_f_mem=float(finite_f[-1]) if finite_f.size else None,
        fid_first=float(finite_fid[0]) if finite_fid.size else None,
        tau_gen=tau_gen, tau_mem=tau_mem, tau_gap=tau_gap,
        tau_gen_bracket=timescales.evaluation_bracket(record.evaluations, tau_gen),
    )


# --- power-law fits -------------------------------------------------------------------------------------------------

def _split(runs: Sequence[RunSummary], quantity: str, x_of) -> tuple[list, list, list]:
    points, censored, excluded = [], [], []
    for r in runs:
        est: Estimate = getattr(r, quantity)
        x = x_of(r)
        if est.value is None:
            excluded.append((r.run, est.rule))
        elif est.censored and est.hi is None:
            censored.append((r.run, x, est.value))
        elif est.censored:  # an upper bound: the event happened before the first evaluation
            excluded.append((r.run, f"upper bound only: {est.rule}"))
        else:
            points.append((r.run, x, est.value, est.lo, est.hi))
    return points, censored, excluded


def _fit(runs, quantity, x_name, x_of, n_boot, seed) -> PowerLawFit:
    points, censored, excluded = _split(runs, quantity, x_of)
    return fit_power_law(quantity, x_name, points, censored=censored, excluded=excluded, n_boot=n_boot, seed=seed)


def fit_all(runs: Sequence[RunSummary], *, n_boot: int = 2000, seed: int = 0) -> dict[str, FitSet]:
    """The four laws of fits.json (see the module docstring), each pooled and per group."""
    def by(key: str, quantity: str, x_name: str, x_of) -> dict[str, PowerLawFit]:
        values = sorted({getattr(r, key) for r in runs})
        return {str(v): _fit([r for r in runs if getattr(r, key) == v], quantity, x_name, x_of, n_boot, seed)
                for v in values}

    n_of, w_of = (lambda r: float(r.n)), (lambda r: float(r.width))
    return {
        "tau_mem_vs_n": FitSet(_fit(runs, "tau_mem", "n", n_of, n_boot, seed),
                               by("width", "tau_mem", "n", n_of), "width"),
        "tau_gen_vs_n": FitSet(_fit(runs, "tau_gen", "n", n_of, n_boot, seed),
                               by("width", "tau_gen", "n", n_of), "width"),
        "tau_gen_vs_width": FitSet(_fit(runs, "tau_gen", "width", w_of, n_boot, seed),
                                   by("n", "tau_gen", "width", w_of), "n"),
        "tau_mem_vs_n_over_width": FitSet(_fit(runs, "tau_mem", "n_over_width", lambda r: r.n / r.width,
                                               n_boot, seed)),
        "tau_mem_epochs_vs_n": FitSet(_fit(runs, "tau_mem_epochs", "n", n_of, n_boot, seed),
                                      by("width", "tau_mem_epochs", "n", n_of), "width"),
        "tau_mem_vs_width": FitSet(_fit(runs, "tau_mem", "width", w_of, n_boot, seed),
                                   by("n", "tau_mem", "width", w_of), "n"),
    }


# --- the whole experiment -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    """What `diffmem analyze` produced: per-run rows, fits and the files written."""

    experiment_dir: Path
    runs: tuple[RunSummary, ...]
    fits: dict[str, FitSet]
    summary_csv: Path
    fits_json: Path
    figures: tuple[Any, ...] = ()  # diffmem.plots.FigureResult per figure (written or skipped with a reason)

    def format(self) -> str:
        """Human text: one line per run, one per fitted law, the files written."""
        lines = [f"{len(self.runs)} run(s) in {self.experiment_dir}"]
        for r in self.runs:
            def show(e: Estimate) -> str:
                if e.value is None:
                    return "-"
                text = f"{e.value:.3g}"
                return (">" + text if e.hi is None else "<" + text) if e.censored else text
            steps = str(r.steps) if r.steps is not None else "-"
            lines.append(f"  {r.run:<24} N={r.n:<6} W={r.width:<4} {r.state:<7} steps={steps:<9} "
                         f"tau_gen={show(r.tau_gen):<9} tau_mem={show(r.tau_mem):<9} tau_gap={show(r.tau_gap)}")
        for name, fs in self.fits.items():
            lines.append(f"  {name}: {fs.pooled.describe()}")
        lines.append(f"wrote {self.summary_csv} and {self.fits_json}")
        for fig in self.figures:
            if fig.skipped:
                lines.append(f"  skipped {fig.name}: {fig.skipped}")
            else:
                lines.append(f"  figure {fig.name}: " + ", ".join(p.name for p in fig.files))
        return "\n".join(lines)


def analyze(experiment_dir: str | Path, *, figures: bool = True, n_boot: int = 2000, seed: int = 0) -> Summary:
    """Read every run folder of ``experiment_dir`` (or the run folder itself), write summary.csv and fits.json
    there (atomically) and, with ``figures``, the figures into ``experiment_dir/figures`` (see diffmem.plots).

    Works on partial experiments (runs still training are summarized from the evaluations they have).
    """
    experiment_dir = Path(experiment_dir)
    runs = tuple(summarize_run(r) for r in read_experiment(experiment_dir))
    fits = fit_all(runs, n_boot=n_boot, seed=seed)
    summary_csv = write_csv(experiment_dir / "summary.csv", SUMMARY_COLUMNS, (r.row() for r in runs))
    censored = {q: [r.run for r in runs if getattr(r, q).censored] for q in ("tau_mem", "tau_gen")}
    fits_json = write_json(experiment_dir / "fits.json", {
        "diffmem_version": __version__,
        "method": "log10-log10 least squares over measured runs; CI: seeded bootstrap over runs (percentiles)",
        "n_boot": n_boot, "seed": seed, "ci": 0.95,
        "censored_runs": censored,
        **{name: fs.to_dict() for name, fs in fits.items()},
    })
    figure_results: tuple[Any, ...] = ()
    if figures:
        from diffmem import plots  # plots reads the files just written; imported here to keep analysis light

        figure_results = tuple(plots.make_figures(experiment_dir))
    return Summary(experiment_dir, runs, fits, summary_csv, fits_json, figure_results)
