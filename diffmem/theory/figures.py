"""Figures of a theory sweep, drawn from its files only (curves.csv, summary.csv, fits.json, spectrum.json).

- ``spectrum``: histogram of U's eigenvalues (log bins; Gaussian-equivalent filled, real tanh features as a line)
  with the density of the paper's Theorem 3.1 and the asymptotic delta peak, rho_1 and rho_2 supports (Fig. 4).
- ``loss_curves``: train (solid) and test (dashed) loss, score and memorization errors against tau, and the
  generalization loss against tau / tau_mem(predicted), one colour per psi_n, first seed (the paper's Fig. 5).
- ``timescales``: measured tau_mem and tau_gen and the predicted tau_mem against psi_n with the fitted laws.
- ``theory_vs_unet`` (with a U-Net experiment folder): tau_mem of both against the data size, each relative to its
  smallest size, with their fitted exponents and the slope-1 law.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter, ScalarFormatter

from diffmem.analysis.runfiles import read_csv, read_json
from diffmem.analysis.powerlaw import PowerLawFit
from diffmem.figures.laws import draw_fit
from diffmem.figures.style import STYLE, FigureOutput, n_colors, new_figure

TAU_LABEL = r"training time $\tau = k\,\eta / d^2$"


def _plain_log_x(ax, values) -> None:
    """Log x axis with ticks at ``values`` written as plain numbers (no crowded minor labels)."""
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(values)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _by_psi_n(rows: list[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    out: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(float(r["psi_n"]), []).append(r)
    return dict(sorted(out.items()))


def plot_spectrum(out_dir: Path, spectrum: dict[str, Any]) -> Path:
    fig, (ax,) = new_figure(1, size=(7.2, 3.0))
    eig = {k: np.asarray(v, dtype=float) for k, v in spectrum["eigenvalues"].items()}
    floor = 0.3 / max(v.size for v in eig.values())  # below one eigenvalue per bin
    positive = np.concatenate([v[v > 0] for v in eig.values()])
    bins = np.geomspace(positive.min() * 0.8, positive.max() * 1.25, 90)
    ge_eig = eig["gaussian-equivalent"]
    ax.hist(np.clip(ge_eig, bins[0], None), bins=bins, weights=np.full(ge_eig.size, 1 / ge_eig.size),
            color="0.55", label="Gaussian-equivalent U")
    if "monte-carlo" in eig:
        mc = eig["monte-carlo"]
        ax.hist(np.clip(mc, bins[0], None), bins=bins, weights=np.full(mc.size, 1 / mc.size), histtype="step",
                color="k", lw=0.9, label=f"tanh features, {spectrum['noise_draws']} noise draws")
    if "density" in spectrum:  # Theorem 3.1's density as a fraction per (log) bin: rho(lambda) lambda dln(lambda)
        grid, rho = np.asarray(spectrum["density"]["lambda"]), np.asarray(spectrum["density"]["rho"])
        dlog = np.log(bins[1] / bins[0])
        per_bin = rho * grid * dlog
        ax.plot(grid, np.where(per_bin >= floor, per_bin, np.nan), color="tab:orange", lw=1.1,
                label="Theorem 3.1 (saddle-point equations)")
    colors = {"delta": "tab:red", "rho_1": "tab:blue", "rho_2": "tab:green"}
    for s in spectrum["supports"]:
        key = s["name"].split()[0]
        if s["lo"] == s["hi"]:
            ax.axvline(s["lo"], color=colors["delta"], lw=1.2, ls="--",
                       label=f"{s['name']} (mass {s['weight']:.3f})")
        else:
            ax.axvspan(s["lo"], s["hi"], color=colors.get(key, "tab:orange"), alpha=0.18, lw=0,
                       label=f"{s['name']}: [{s['lo']:.3g}, {s['hi']:.3g}] (mass {s['weight']:.3f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"eigenvalue $\lambda$ of $U$")
    ax.set_ylabel("fraction of eigenvalues per bin")
    ax.set_ylim(bottom=floor)
    ax.set_title(f"$\\psi_p$ = {spectrum['psi_p']:g}, $\\psi_n$ = {spectrum['psi_n']:g}, d = {spectrum['d']}, "
                 f"t = {spectrum['t']:g}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6)
    return FigureOutput(out_dir).save(fig, "spectrum").files[0]


def plot_loss_curves(out_dir: Path, curves: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Path:
    fig, axes = new_figure(3, size=(3.4, 2.7))
    first_seed = min(int(r["seed"]) for r in rows)
    groups = _by_psi_n([r for r in curves if int(r["seed"]) == first_seed])
    summary = {float(r["psi_n"]): r for r in rows if int(r["seed"]) == first_seed}
    colors = n_colors(list(groups))
    for psi_n, part in groups.items():
        tau = np.array([r["tau"] for r in part])
        col = colors[psi_n]
        get = {k: np.array([r[k] for r in part]) for k in ("train_loss", "test_loss", "score_error",
                                                            "memorization_error")}
        axes[0].plot(tau, get["train_loss"], color=col)
        axes[0].plot(tau, get["test_loss"], color=col, ls="--")
        axes[1].plot(tau, get["score_error"], color=col)
        axes[1].plot(tau, get["memorization_error"], color=col, ls=":")
        s = summary[psi_n]
        for ax in axes[:2]:
            if s.get("tau_gen") is not None:
                ax.axvline(s["tau_gen"], color=col, lw=0.5, alpha=0.5)
            if s.get("tau_mem") is not None:
                ax.axvline(s["tau_mem"], color=col, lw=0.5, ls="--", alpha=0.5)
        axes[2].plot(tau / s["tau_mem_pred"], get["test_loss"] - get["train_loss"], color=col)
    axes[0].set_ylabel("DSM loss at time t")
    axes[0].set_ylim(top=min(3.0, axes[0].get_ylim()[1]))
    axes[1].set_ylabel("distance to exact (solid) /\nempirical (dotted) score")
    axes[1].set_yscale("log")
    axes[2].set_ylabel(r"$\mathcal{L}_\mathrm{gen}$ = test $-$ train loss")
    axes[2].set_xlabel(r"$\tau / \tau_\mathrm{mem}$, $\tau_\mathrm{mem} = \psi_p / (\Delta_t \lambda_\mathrm{min})$")
    for ax in axes[:2]:
        ax.set_xlabel(TAU_LABEL)
    for ax in axes:
        ax.set_xscale("log")
    handles = [Line2D([], [], color=colors[k], label=f"{k:g}") for k in groups]
    handles += [Line2D([], [], color="0.3", label="train"), Line2D([], [], color="0.3", ls="--", label="test")]
    axes[0].legend(handles=handles, title=r"$\psi_n$", loc="lower left")
    return FigureOutput(out_dir).save(fig, "loss_curves").files[0]


def _points(ax, rows, key, color, marker, label) -> None:
    x = np.array([float(r["psi_n"]) for r in rows if r.get(key) is not None])
    y = np.array([float(r[key]) for r in rows if r.get(key) is not None])
    ax.plot(x, y, marker, color=color, mfc="none" if marker == "s" else color, ls="none", label=label)


def plot_timescales(out_dir: Path, rows: list[dict[str, Any]], fits: dict[str, PowerLawFit]) -> Path:
    fig, (ax,) = new_figure(1, size=(3.6, 2.9))
    for key, fit_name, color, marker, label in (
            ("tau_mem", "tau_mem_vs_psi_n", "tab:red", "o", r"$\tau_\mathrm{mem}$ (half rise of $\mathcal{L}_\mathrm{gen}$)"),
            ("tau_mem_pred", "tau_mem_pred_vs_psi_n", "tab:purple", "s",
             r"$\psi_p / (\Delta_t \lambda_\mathrm{min})$"),
            ("tau_gen", "tau_gen_vs_psi_n", "tab:blue", "o", r"$\tau_\mathrm{gen}$ (score-error plateau)")):
        text = draw_fit(ax, fits.get(fit_name), color, r"\psi_n")
        _points(ax, [r for r in rows if not r.get(f"{key}_censored")], key, color, marker,
                label + (f": {text}" if text else ""))
    _plain_log_x(ax, [float(r["psi_n"]) for r in rows])
    ax.set_yscale("log")
    ax.set_xlabel(r"$\psi_n = n / d$")
    ax.set_ylabel(TAU_LABEL)
    ax.legend(loc="best", fontsize=6)
    return FigureOutput(out_dir).save(fig, "timescales").files[0]


def exponent_text(exponent: float, lo: Any, hi: Any) -> str:
    """"exponent 1.02 [0.95, 1.10]" for a legend; without the interval where the fit has none (two points, as in
    `diffmem theory sweep --quick`)."""
    known = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi))
    return f"exponent {exponent:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if known else " (no interval)")


def plot_theory_vs_unet(out_dir: Path, rows: list[dict[str, Any]], fits: dict[str, PowerLawFit],
                        unet_dir: Path) -> Path:
    unet_rows = [r for r in read_csv(unet_dir / "summary.csv")
                 if r.get("tau_mem") is not None and not r.get("tau_mem_censored")]
    unet_fits = read_json(unet_dir / "fits.json")
    fig, (ax,) = new_figure(1, size=(3.6, 2.9))
    th = [r for r in rows if not r.get("tau_mem_censored") and r.get("tau_mem") is not None]
    x0 = min(float(r["psi_n"]) for r in th)
    y0 = np.median([float(r["tau_mem"]) for r in th if float(r["psi_n"]) == x0])
    fit = fits["tau_mem_vs_psi_n"]
    ticks = {float(r["psi_n"]) / x0 for r in th}
    ax.plot([float(r["psi_n"]) / x0 for r in th], [float(r["tau_mem"]) / y0 for r in th], "o", color="tab:red",
            label="random features" + (f": {exponent_text(fit.exponent, fit.exponent_lo, fit.exponent_hi)}"
                                       if fit.fitted else ""))
    if unet_rows:
        n0 = min(int(r["n"]) for r in unet_rows)
        m0 = np.median([float(r["tau_mem"]) for r in unet_rows if int(r["n"]) == n0])
        ticks |= {int(r["n"]) / n0 for r in unet_rows}
        u = unet_fits.get("tau_mem_vs_n", {})
        label = "U-Net (diffmem analyze)"
        if isinstance(u, dict) and isinstance(u.get("exponent"), (int, float)):
            label += f": {exponent_text(u['exponent'], u.get('exponent_lo'), u.get('exponent_hi'))}"
        ax.plot([int(r["n"]) / n0 for r in unet_rows], [float(r["tau_mem"]) / m0 for r in unet_rows], "s",
                color="tab:blue", mfc="none", label=label)
    xs = np.geomspace(1, max(ax.get_xlim()[1], 2), 20)
    ax.plot(xs, xs, color="0.4", lw=0.8, ls="--", label=r"$\tau_\mathrm{mem} \propto$ size")
    _plain_log_x(ax, ticks)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(r"data size relative to the smallest ($\psi_n$ or $N$)")
    ax.set_ylabel(r"$\tau_\mathrm{mem}$ relative to the smallest size")
    ax.legend(loc="upper left", fontsize=6)
    return FigureOutput(out_dir).save(fig, "theory_vs_unet").files[0]


def make_theory_figures(sweep_dir: str | Path, *, compare: str | Path | None = None) -> dict[str, str]:
    """Draw every figure of a theory sweep folder into ``sweep_dir/figures``; returns name -> PNG path."""
    sweep_dir = Path(sweep_dir)
    out = sweep_dir / "figures"
    out.mkdir(exist_ok=True)
    rows = read_csv(sweep_dir / "summary.csv")
    curves = read_csv(sweep_dir / "curves.csv")
    fits = {k: PowerLawFit.from_dict(v) for k, v in read_json(sweep_dir / "fits.json").items()}
    spectrum = read_json(sweep_dir / "spectrum.json")
    with mpl.rc_context(STYLE):
        done = {
            "spectrum": str(plot_spectrum(out, spectrum)),
            "loss_curves": str(plot_loss_curves(out, curves, rows)),
            "timescales": str(plot_timescales(out, rows, fits)),
        }
        if compare is not None:
            done["theory_vs_unet"] = str(plot_theory_vs_unet(out, rows, fits, Path(compare)))
    return done
