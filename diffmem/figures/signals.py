"""The figures of the sampling-free signals (diffmem.analysis.signals), drawn only for runs that recorded the
per-level losses (``loss_ts`` in metrics.jsonl; :func:`plot_signals` returns nothing otherwise):

- ``signals_gap_w{W}``: per N (the cell's lowest seed with the keys), the loss gap test / train - 1 over the
  training step (x, log) and the noise level t (y, log) as a colour map, tau_gen and tau_mem as vertical lines and
  each level's measured tau_gap(t) as a white circle (fits.json ``calibration``);
- ``signals_auc_w{W}``: per N, the membership AUC of the levels combined against the step, each seed with its 95 %
  (DeLong) band, tau_auc as a circle on its curve, tau_mem as a dashed line, chance (0.5) dotted;
- ``signals_calibration``: tau_auc and tau_gap_first against tau_mem per run with their intervals, log-log, with
  the identity line (no lag) and the line of a lag of 10.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.colors import SymLogNorm
from matplotlib.lines import Line2D

from diffmem.analysis.runfiles import RunRecord, read_json
from diffmem.analysis.signals import has_signals, level_series, recorded_levels
from diffmem.figures.experiment_files import ExperimentFiles
from diffmem.figures.style import (FigureOutput, FigureResult, finite_points, legend_by_n, mark_interval, n_colors,
                                   new_figure, readable_log_axis)

TAU_GEN = r"$\tau_\mathrm{gen}$"
TAU_MEM = r"$\tau_\mathrm{mem}$"


def log_edges(centres: np.ndarray) -> np.ndarray:
    """Cell edges around increasing positive ``centres`` (shape (m,) -> (m + 1,)): geometric midpoints, the ends
    extended by the neighbouring ratio (one centre: a factor sqrt 2 either side)."""
    c = np.asarray(centres, dtype=float)
    if c.size == 1:
        return np.array([c[0] / math.sqrt(2), c[0] * math.sqrt(2)])
    mids = np.sqrt(c[:-1] * c[1:])
    return np.concatenate([[c[0] ** 2 / mids[0]], mids, [c[-1] ** 2 / mids[-1]]])


def gap_matrix(record: RunRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps (m,), levels (k,), test / train - 1 (k, m), NaN where not recorded) of a run's evaluations with
    per-level losses at steps > 0."""
    evals = [e for e in record.evaluations if e.get("loss_ts") and float(e["step"]) > 0]
    levels = np.array(recorded_levels(evals))
    steps = np.array([float(e["step"]) for e in evals])
    ratio = np.full((levels.size, steps.size), np.nan)
    for k, t in enumerate(levels):
        train = np.array([np.nan if v is None else v for v in level_series(evals, "train_losses", t)], dtype=float)
        test = np.array([np.nan if v is None else v for v in level_series(evals, "test_losses", t)], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio[k] = np.where(train > 0, test / train - 1.0, np.nan)
    return steps, levels, ratio


def _calibration_runs(data: ExperimentFiles) -> dict[str, dict[str, Any]]:
    path = data.directory / "fits.json"
    calibration = (read_json(path).get("calibration") or {}) if path.is_file() else {}
    return {r["run"]: r for r in calibration.get("runs", [])}


def _first_seeds(data: ExperimentFiles, width: int) -> list[dict[str, Any]]:
    """Per N at ``width``, the summary row of the lowest seed that recorded the keys."""
    out = {}
    for row in sorted(data.rows_of_width(width), key=lambda r: (r["n"], r["seed"])):
        if row["n"] not in out and has_signals(data.records[row["run"]].evaluations):
            out[row["n"]] = row
    return [out[n] for n in sorted(out)]


def _mark_timescales(ax: Any, row: dict[str, Any]) -> None:
    for key, ls in (("tau_gen", "-"), ("tau_mem", "--")):
        if row.get(key) is not None and not row.get(f"{key}_censored"):
            ax.axvline(row[key], color="0.15", ls=ls, lw=1.0)


GAP_LINEAR = 0.01
"""The relative gap below which the gap map's colour scale is linear (symmetric log above it)."""


def plot_gap_map(data: ExperimentFiles, width: int, out: FigureOutput) -> FigureResult:
    """``signals_gap_w{W}`` (module docstring)."""
    name = f"signals_gap_w{width:02d}"
    rows = _first_seeds(data, width)
    maps = [(row, *gap_matrix(data.records[row["run"]])) for row in rows]
    maps = [m for m in maps if m[1].size and m[2].size and np.isfinite(m[3]).any()]
    if not maps:
        return FigureResult(name, skipped=f"no run at W = {width} recorded the per-level losses")
    runs = _calibration_runs(data)
    fig, axes = new_figure(len(maps), sharey=True, size=(3.0, 2.6))
    # the colour range: every value, on a symmetric log scale that is linear within +-GAP_LINEAR, so that the gaps
    # where the signals open (a few per cent to tens of per cent) show as clearly as the large ones of a copying model
    limit = float(np.nanmax(np.abs(np.concatenate([m[3].ravel() for m in maps])))) or 1.0
    norm = SymLogNorm(linthresh=GAP_LINEAR, linscale=0.5, vmin=-max(limit, GAP_LINEAR), vmax=max(limit, GAP_LINEAR),
                      base=10)
    mesh = None
    for ax, (row, steps, levels, ratio) in zip(axes, maps):
        mesh = ax.pcolormesh(log_edges(steps), log_edges(levels), np.ma.masked_invalid(ratio), cmap="RdBu_r",
                             norm=norm, shading="flat")
        _mark_timescales(ax, row)
        entry = runs.get(row["run"], {})
        for t, est in zip(entry.get("loss_ts", []), entry.get("tau_gap_t", [])):
            if est.get("value") is not None and not est.get("censored"):
                ax.plot([est["value"]], [t], marker="o", mfc="white", mec="black", ms=5, ls="none", zorder=5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(f"N = {row['n']}, seed {row['seed']}")
    axes[0].set_ylabel("noise level t (diffusion time)")
    fig.colorbar(mesh, ax=axes, label="test / train loss - 1")
    handles = [Line2D([], [], color="0.15", ls="-", label=TAU_GEN),
               Line2D([], [], color="0.15", ls="--", label=TAU_MEM),
               Line2D([], [], color="black", marker="o", mfc="white", ls="none", label=r"$\tau_\mathrm{gap}(t)$")]
    axes[0].legend(handles=handles, loc="lower left", fontsize=6)
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    readable_log_axis(axes[0].yaxis, [float(t) for m in maps for t in m[2]])
    return out.save(fig, name)


def _auc_runs(data: ExperimentFiles, width: int) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(data.rows_of_width(width), key=lambda r: (r["n"], r["seed"])):
        rec = data.records[row["run"]]
        if np.isfinite(rec.series("membership_auc")).any():
            out.setdefault(row["n"], []).append(row)
    return out


def plot_auc(data: ExperimentFiles, width: int, out: FigureOutput) -> FigureResult:
    """``signals_auc_w{W}`` (module docstring)."""
    name = f"signals_auc_w{width:02d}"
    by_n = _auc_runs(data, width)
    if not by_n:
        return FigureResult(name, skipped=f"no run at W = {width} recorded the membership AUC")
    colors = n_colors(data.ns)
    fig, axes = new_figure(len(by_n), sharey=True, size=(3.0, 2.6))
    for ax, (n, rows) in zip(axes, sorted(by_n.items())):
        for row in rows:
            rec = data.records[row["run"]]
            steps, auc = rec.steps, rec.series("membership_auc")
            lo, hi = rec.series("membership_auc_lo"), rec.series("membership_auc_hi")
            ok = finite_points(steps, auc)
            ax.plot(steps[ok], auc[ok], color=colors[n], lw=0.9)
            band = ok & np.isfinite(lo) & np.isfinite(hi)
            if band.any():
                mark_interval(ax.fill_between(steps[band], lo[band], hi[band], color=colors[n], alpha=0.18, lw=0))
            tau = row.get("tau_auc")
            if tau is not None and not row.get("tau_auc_censored") and ok.sum() >= 2:
                at = float(np.interp(math.log(tau), np.log(steps[ok]), auc[ok]))
                ax.plot([tau], [at], marker="o", mfc="white", mec=colors[n], mew=1.2, ms=6, ls="none", zorder=5)
            if row.get("tau_mem") is not None and not row.get("tau_mem_censored"):
                ax.axvline(row["tau_mem"], color=colors[n], ls="--", lw=0.9)
        ax.axhline(0.5, color="0.4", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training step")
        ax.set_title(f"N = {n}")
    axes[0].set_ylabel("membership AUC")
    extra = [Line2D([], [], color="0.3", marker="o", mfc="white", ls="none", label=r"$\tau_\mathrm{auc}$"),
             Line2D([], [], color="0.3", ls="--", label=TAU_MEM)]
    legend_by_n(axes[0], sorted(by_n), colors, extra=extra, loc="upper left", fontsize=6)
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    return out.save(fig, name)


def _point(row: dict[str, Any], key: str) -> tuple[float, float, float] | None:
    """(value, lower error, upper error) of a measured summary.csv timescale; None when not measured."""
    value = row.get(key)
    if value is None or row.get(f"{key}_censored") or value <= 0:
        return None
    lo = row.get(f"{key}_lo") if row.get(f"{key}_lo") is not None else value
    hi = row.get(f"{key}_hi") if row.get(f"{key}_hi") is not None else value
    return value, value - lo, hi - value


def plot_calibration(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """``signals_calibration`` (module docstring)."""
    name = "signals_calibration"
    colors = n_colors(data.ns)
    fig, axes = new_figure(1, size=(3.6, 3.0))
    ax = axes[0]
    drawn, values = set(), []
    base_width = min(data.widths) if data.widths else None
    flagged = False
    for row in data.rows:
        mem = _point(row, "tau_mem")
        if mem is None:
            continue
        for key, marker in (("tau_auc", "o"), ("tau_gap_first", "s")):
            sig = _point(row, key)
            if sig is None:
                continue
            other_width = row["width"] != base_width  # another width: thin dashed bars, so N's colour is not W's
            bars = ax.errorbar([mem[0]], [sig[0]], xerr=[[mem[1]], [mem[2]]], yerr=[[sig[1]], [sig[2]]],
                               color=colors[row["n"]], marker=marker, ms=4, ls="none", lw=0.6 if other_width else 0.8,
                               mfc="white" if key == "tau_gap_first" else colors[row["n"]])
            mark_interval(*bars[1], *bars[2])
            if other_width:
                for collection in bars[2]:
                    collection.set_linestyle((0, (2, 1.5)))
            if row.get(f"{key}_flag"):  # its control left its null: crossed out, it enters no law
                ax.plot([mem[0]], [sig[0]], marker="x", color="black", ms=6, ls="none", zorder=6)
                flagged = True
            drawn.add(row["n"])
            values += [mem[0] - mem[1], mem[0] + mem[2], sig[0] - sig[1], sig[0] + sig[2]]
    if not drawn:
        return FigureResult(name, skipped="no run has tau_mem and a sampling-free timescale both measured")
    positive = [v for v in values if v > 0]
    lo, hi = min(positive) / 1.5, max(positive) * 1.5
    line = np.array([lo, hi])
    ax.plot(line, line, color="0.3", lw=0.9)
    ax.plot(line, line / 10, color="0.3", lw=0.9, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(r"$\tau_\mathrm{mem}$ (steps, onset of copies)")
    ax.set_ylabel("sampling-free timescale (steps)")
    extra = [Line2D([], [], color="0.3", marker="o", ls="none", label=r"$\tau_\mathrm{auc}$"),
             Line2D([], [], color="0.3", marker="s", mfc="white", ls="none",
                    label=r"$\tau_\mathrm{gap}$ (first level)"),
             Line2D([], [], color="0.3", lw=0.9, label="no lag"), Line2D([], [], color="0.3", ls=":", label="lag 10")]
    if len(data.widths) > 1:
        extra += [Line2D([], [], color="0.3", lw=0.8, label=f"W = {base_width}"),
                  Line2D([], [], color="0.3", lw=0.6, ls=(0, (2, 1.5)),
                         label="W = " + ", ".join(str(w) for w in data.widths if w != base_width))]
    if flagged:
        extra.append(Line2D([], [], color="black", marker="x", ls="none", label="control off its null"))
    legend_by_n(ax, sorted(drawn), colors, extra=extra, loc="upper left", fontsize=6)
    fig.canvas.draw()
    readable_log_axis(ax.xaxis)
    readable_log_axis(ax.yaxis)
    return out.save(fig, name)


def plot_signals(data: ExperimentFiles, out: FigureOutput) -> list[FigureResult]:
    """Every figure of the module docstring, drawn or skipped with the reason; [] when no run recorded the
    per-level losses or the membership AUC (older folders: nothing to draw, nothing to say)."""
    if not any(has_signals(rec.evaluations) for rec in data.records.values()):
        return []
    results = [plot_gap_map(data, w, out) for w in data.widths]
    results += [plot_auc(data, w, out) for w in data.widths]
    results.append(plot_calibration(data, out))
    return results
