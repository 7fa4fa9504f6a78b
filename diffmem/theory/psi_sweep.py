"""``diffmem theory sweep``: the random-features model over psi_n x seeds -> curves, timescales, fits, figures.

Writes into the output folder (every file atomically; a rerun rewrites them all):

- ``config.json``: the resolved TheoryConfig, the Gaussian-equivalence constants, diffmem's version;
- ``curves.csv``: one row per (psi_n, seed, tau) with train_loss, test_loss, score_error, memorization_error;
- ``summary.csv``: one row per (psi_n, seed): tau_gen, tau_mem, tau_gap with intervals, the predicted tau_mem =
  psi_p / (Delta_t lambda_min), the measured and predicted lambda_min, the score-error plateau, the tau -> inf losses;
- ``spectrum.json``: the eigenvalues of U at (spectrum_t, spectrum_psi_n), Gaussian-equivalent and (when
  ``theory.spectrum_noise_draws`` > 0) from the real tanh features, with the predicted supports;
- ``fits.json``: power laws in psi_n, seeds as replicates of one psi_n, Student-t intervals
  (:func:`diffmem.analysis.powerlaw.fit_power_law`);
- ``figures/``: spectrum, loss_curves, timescales (and theory_vs_unet with ``compare``), PNG and PDF.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from diffmem import __version__
from diffmem.analysis.runfiles import write_csv, write_json
from diffmem.analysis.powerlaw import PowerLawFit, fit_power_law
from diffmem.config import TheoryConfig, validate_theory
from diffmem.device import resolve_device
from diffmem.theory.constants import gaussian_equivalence
from diffmem.theory.dynamics import evaluate_metrics, log_times
from diffmem.theory.features import METRICS, build_instance
from diffmem.theory.spectrum import (density_mass_in, lambda_min, mass_in, monte_carlo_spectrum,
                                     predicted_density, predicted_supports, predicted_tau_gen, predicted_tau_mem)
from diffmem.theory.curve_timescales import curve_timescales

SUMMARY_COLUMNS = (
    "psi_n", "n", "seed", "d", "p", "psi_p", "t", "noise",
    "tau_gen", "tau_gen_lo", "tau_gen_hi", "tau_gen_censored",
    "tau_mem", "tau_mem_lo", "tau_mem_hi", "tau_mem_censored",
    "tau_gap", "tau_gap_censored", "tau_mem_pred", "tau_gen_pred", "lambda_min_pred", "lambda_min_measured",
    "score_error_min", "train_loss_inf", "test_loss_inf", "seconds",
)
CURVE_COLUMNS = ("psi_n", "seed", "tau", *METRICS)
FIT_NAMES = ("tau_mem_vs_psi_n", "tau_gen_vs_psi_n", "tau_mem_pred_vs_psi_n", "score_error_min_vs_psi_n")


@dataclass
class TheorySummary:
    """What a sweep wrote: its folder, the per-run rows, the fits and the figures (name -> files or skip reason)."""

    out_dir: Path
    rows: list[dict[str, Any]]
    fits: dict[str, PowerLawFit]
    figures: dict[str, str]
    seconds: float

    def format(self) -> str:
        lines = [f"theory sweep: {len(self.rows)} runs in {self.seconds:.1f} s -> {self.out_dir}"]
        lines += ["  " + fit.describe() for fit in self.fits.values()]
        lines += [f"  figures/{name}: {what}" for name, what in self.figures.items()]
        return "\n".join(lines)


def _measured_lambda_min(eigenvalues: np.ndarray, p: int, n: int, d: int) -> float:
    """The smallest eigenvalue above the delta peak of the ascending ``eigenvalues``: the (p - n - d + 1)-th
    smallest (regime I) or the smallest."""
    return float(eigenvalues[max(p - n - d, 0)])


def _run_one(cfg: TheoryConfig, psi_n: float, seed: int, taus: np.ndarray,
             device: torch.device) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    start = time.perf_counter()
    d, p, n = cfg.d, round(cfg.psi_p * cfg.d), round(psi_n * cfg.d)
    inst = build_instance(d, p, n, cfg.t, seed, noise=cfg.noise, noise_draws=cfg.noise_draws,
                          test_draws=cfg.test_draws, device=device)
    with_limit = evaluate_metrics(inst.basis, inst.metrics, np.append(taus, np.inf))  # the last: tau -> inf
    curves = {k: v[:-1] for k, v in with_limit.items()}
    limit = {k: float(v[-1]) for k, v in with_limit.items()}
    est = curve_timescales(taus, curves, limit, cfg.gap_fraction)
    ge = inst.constants
    row: dict[str, Any] = {
        "psi_n": psi_n, "n": n, "seed": seed, "d": d, "p": p, "psi_p": p / d, "t": cfg.t, "noise": cfg.noise,
        "tau_mem_pred": predicted_tau_mem(ge, p / d, n / d), "tau_gen_pred": predicted_tau_gen(ge, p / d),
        "lambda_min_pred": lambda_min(ge, p / d, n / d),
        "lambda_min_measured": _measured_lambda_min(inst.spectrum, p, n, d),
        "score_error_min": float(np.min(curves["score_error"])),
        "train_loss_inf": limit["train_loss"], "test_loss_inf": limit["test_loss"],
    }
    for key, e in est.items():
        row[key] = e.value
        row[f"{key}_censored"] = e.censored
        if key != "tau_gap":
            row[f"{key}_lo"], row[f"{key}_hi"] = e.lo, e.hi
    row["seconds"] = round(time.perf_counter() - start, 3)
    curve_rows = [{"psi_n": psi_n, "seed": seed, "tau": float(tau), **{k: float(curves[k][i]) for k in METRICS}}
                  for i, tau in enumerate(taus)]
    return row, curve_rows


def _fit(rows: list[dict[str, Any]], quantity: str, value_key: str, lo_key: str | None = None,
         hi_key: str | None = None, censored_key: str | None = None) -> PowerLawFit:
    points, censored = [], []
    for r in rows:
        name = f"psi_n{r['psi_n']:g}_s{r['seed']}"
        if censored_key and r.get(censored_key):
            censored.append((name, float(r["psi_n"]), r[value_key]))
        elif r[value_key] is not None:
            points.append((name, float(r["psi_n"]), float(r[value_key]),
                           r.get(lo_key) if lo_key else None, r.get(hi_key) if hi_key else None))
    return fit_power_law(quantity, "psi_n", points, censored=censored)


def fit_theory(rows: list[dict[str, Any]]) -> dict[str, PowerLawFit]:
    """The laws in psi_n: measured tau_mem and tau_gen, the predicted tau_mem, the score-error plateau."""
    return {
        "tau_mem_vs_psi_n": _fit(rows, "tau_mem", "tau_mem", "tau_mem_lo", "tau_mem_hi", "tau_mem_censored"),
        "tau_gen_vs_psi_n": _fit(rows, "tau_gen", "tau_gen", "tau_gen_lo", "tau_gen_hi", "tau_gen_censored"),
        "tau_mem_pred_vs_psi_n": _fit(rows, "tau_mem_pred", "tau_mem_pred"),
        "score_error_min_vs_psi_n": _fit(rows, "score_error_min", "score_error_min"),
    }


def spectrum_record(cfg: TheoryConfig, device: torch.device) -> dict[str, Any]:
    """Eigenvalues of U at the spectrum's (t, psi_n), first seed: Gaussian-equivalent, optionally real features."""
    d, p, n = cfg.d, round(cfg.psi_p * cfg.d), round(cfg.spectrum_psi_n * cfg.d)
    ge = gaussian_equivalence(cfg.spectrum_t)
    inst = build_instance(d, p, n, cfg.spectrum_t, cfg.seeds[0], test_draws=10, device=device)
    supports = predicted_supports(ge, p / d, n / d)
    record: dict[str, Any] = {
        "t": cfg.spectrum_t, "psi_n": n / d, "psi_p": p / d, "d": d, "p": p, "n": n, "seed": cfg.seeds[0],
        "constants": ge.to_dict(), "supports": [s.to_dict() for s in supports],
        "eigenvalues": {"gaussian-equivalent": inst.spectrum.tolist()},
        "mass": {"gaussian-equivalent": {s.name: mass_in(inst.spectrum, s) for s in supports}},
        "noise_draws": cfg.spectrum_noise_draws,
    }
    positive = inst.spectrum[inst.spectrum > 0]
    grid = np.geomspace(positive.min() / 2, positive.max() * 2, 1200)
    rho = predicted_density(ge, p / d, n / d, grid)
    record["density"] = {"lambda": grid.tolist(), "rho": rho.tolist()}
    record["mass"]["theorem 3.1"] = {s.name: density_mass_in(grid, rho, s) for s in supports}
    if cfg.spectrum_noise_draws > 0:
        real = monte_carlo_spectrum(d, p, n, cfg.spectrum_t, cfg.seeds[0], cfg.spectrum_noise_draws, device=device)
        record["eigenvalues"]["monte-carlo"] = real.tolist()
        record["mass"]["monte-carlo"] = {s.name: mass_in(real, s) for s in supports}
    return record


def run_theory_sweep(cfg: TheoryConfig, out_dir: str | Path, *, compare: str | Path | None = None,
                     log: Callable[[str], None] | None = None) -> TheorySummary:
    """Run the sweep (see the module docstring) and write its files into ``out_dir``."""
    from diffmem.theory.figures import make_theory_figures  # matplotlib only when drawing

    validate_theory(cfg)
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    taus = log_times(cfg.tau_min, cfg.tau_max, cfg.n_tau)
    rows, curve_rows = [], []
    for psi_n in cfg.psi_n:
        for seed in cfg.seeds:
            row, curves = _run_one(cfg, psi_n, seed, taus, device)
            rows.append(row)
            curve_rows += curves
            if log:
                log(f"psi_n = {psi_n:g}, seed {seed}: tau_gen {row['tau_gen']:.3g}, tau_mem {row['tau_mem']:.3g} "
                    f"(predicted {row['tau_mem_pred']:.3g}) in {row['seconds']:.1f} s")
    fits = fit_theory(rows)
    write_json(out / "config.json", {"theory": dataclasses.asdict(cfg), "diffmem_version": __version__,
                                     "constants": gaussian_equivalence(cfg.t).to_dict()})
    write_csv(out / "curves.csv", CURVE_COLUMNS, curve_rows)
    write_csv(out / "summary.csv", SUMMARY_COLUMNS, rows)
    write_json(out / "fits.json", {name: fit.to_dict() for name, fit in fits.items()})
    write_json(out / "spectrum.json", spectrum_record(cfg, device))
    figures = make_theory_figures(out, compare=compare)
    return TheorySummary(out, rows, fits, figures, time.perf_counter() - start)
