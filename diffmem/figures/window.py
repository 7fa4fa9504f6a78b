"""The generalization window and its collapse.

- ``window_w{W}`` (:func:`plot_window`): FID/FD and f_mem against the step, one colour per N, and a strip with each
  N's window [tau_gen, tau_mem] (the paper's Fig. 2); with split pairs, tau_bias and tau_gap in the strip.
- ``collapse`` (:func:`plot_collapse`): f_mem against step / N, one panel per width.

The quality axis is labelled with :func:`diffmem.metrics.extractor_names.metric_label` (:func:`quality_label`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from diffmem.analysis.runfiles import RunRecord
from diffmem.figures.curves import curve_legend_extras, draw_cell_curves
from diffmem.figures.experiment_files import ExperimentFiles, median_of, widths_with_several_n
from diffmem.figures.style import (FigureOutput, FigureResult, f_mem_axis, finite_points, legend_by_n, mark_interval,
                                   n_colors, new_figure, readable_log_axis)
from diffmem.metrics.extractor_names import metric_label


def quality_label(records: Sequence[RunRecord]) -> str:
    """The name of the quality metric of ``records`` for an axis: "FID" (Inception features, or none recorded),
    "FD (<extractor>)" for one other extractor, and a "mixed" label naming each when the runs used several."""
    extractors = sorted({e for r in records if (e := r.last_value("fid_extractor")) is not None})
    if len(extractors) == 1:
        return metric_label(extractors[0])
    return "FID / FD (mixed extractors: " + ", ".join(extractors) + ")" if extractors else "FID"


def _window_of(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, bool]:
    """Median tau_gen and tau_mem over the seeds of one (N, W); True when a tau_mem is only a lower bound."""
    gen = median_of([r["tau_gen"] for r in rows if not r.get("tau_gen_censored")])
    mem = median_of([r["tau_mem"] for r in rows])
    return gen, mem, any(r.get("tau_mem_censored") for r in rows)


def _envelope(rows: Sequence[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """The union of the 95 % intervals of ``key`` over the seeds of one cell (None when no seed has both ends)."""
    pairs = [(r[f"{key}_lo"], r[f"{key}_hi"]) for r in rows
             if r.get(f"{key}_lo") is not None and r.get(f"{key}_hi") is not None and not r.get(f"{key}_censored")]
    if not pairs:
        return None
    return min(p[0] for p in pairs), max(p[1] for p in pairs)


def _mark_tau_bias(ax, pair_rows: Sequence[dict[str, Any]], y: float, color) -> str:
    """tau_bias of one cell's split pairs (summary rows, one per pair) at height ``y`` of the window strip: the
    median of the measured ones as a diamond with the union of their brackets as a whisker; when all are censored,
    the median bound as an open triangle pointing where tau_bias lies ('>' lower bound, '<' upper bound). Returns
    what was drawn: "measured" or "bound"."""
    measured = [r for r in pair_rows if not r.get("tau_bias_censored")]
    if measured:
        value = median_of([r["tau_bias"] for r in measured])
        env = _envelope(measured, "tau_bias")
        xerr = None if env is None else [[max(value - env[0], 0)], [max(env[1] - value, 0)]]
        container = ax.errorbar([value], [y], xerr=xerr, color="0.15", marker="D", mfc=color, mec="black", ms=4.5,
                                ls="none", capsize=2, elinewidth=0.8, zorder=5)
        if xerr is not None:
            mark_interval(*container.lines[2])
        return "measured"
    lower = [r["tau_bias"] for r in pair_rows if r.get("tau_bias_hi") is None]
    bounds = lower or [r["tau_bias"] for r in pair_rows]
    ax.plot([median_of(bounds)], [y], marker=">" if lower else "<", mfc="none", mec=color, ms=5, ls="none", zorder=5)
    return "bound"


def plot_window(data: ExperimentFiles, width: int, out: FigureOutput) -> FigureResult:
    """FID/FD (with its 95 % sampling band where recorded) and f_mem (symlog, with its 95 % bootstrap band) against the
    step for every N at one width, and a strip with each N's window [tau_gen, tau_mem] and their 95 % intervals. A cell
    with several seeds draws each seed thin and their mean bold with its 95 % interval over seeds
    (:func:`draw_cell_curves`)."""
    name = f"window_w{width:02d}"
    rows = data.rows_of_width(width)
    records = [data.records[r["run"]] for r in rows]
    has_fid = any(np.isfinite(rec.series("fid")).any() for rec in records)
    has_mem = any(np.isfinite(rec.series("f_mem")).any() for rec in records)
    if not (has_fid or has_mem):
        return FigureResult(name, skipped=f"no FID and no f_mem recorded at W={width}")
    ns = sorted({r["n"] for r in rows})
    colors = n_colors(data.ns)
    heights = [2.0] * (int(has_fid) + int(has_mem)) + [0.35 + 0.15 * len(ns)]
    fig = Figure(figsize=(4.2, sum(heights) + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}).ravel().tolist()
    ax_fid = axes[0] if has_fid else None
    ax_mem = axes[len(heights) - 2] if has_mem else None
    ax_win = axes[-1]
    fid_band: set[str] = set()
    mem_band: set[str] = set()
    seeded = False
    for n in ns:
        cell = [data.records[r["run"]] for r in rows if r["n"] == n]
        if ax_fid is not None:
            band, many = draw_cell_curves(ax_fid, cell, "fid", colors[n])
            fid_band, seeded = fid_band | band, seeded or many
        if ax_mem is not None:
            band, many = draw_cell_curves(ax_mem, cell, "f_mem", colors[n])
            mem_band, seeded = mem_band | band, seeded or many
    any_bound = any_empty = any_gap = False
    bias_marks: set[str] = set()
    for i, n in enumerate(ns):
        cell = [r for r in rows if r["n"] == n]
        gen, mem, mem_bound = _window_of(cell)
        if gen is not None and mem is not None and gen < mem:
            ax_win.fill_betweenx([i - 0.3, i + 0.3], gen, mem, color=colors[n], alpha=0.6, lw=0,
                                 hatch="///" if mem_bound else None)
            any_bound |= mem_bound
        elif gen is not None and mem is not None:
            ax_win.plot([mem], [i], marker="|", color=colors[n], ms=8)  # no window: tau_mem <= tau_gen
            any_empty = True
        for key, value in (("tau_gen", gen), ("tau_mem", mem)):
            env = _envelope(cell, key)
            if value is not None and env is not None:
                container = ax_win.errorbar([value], [i], xerr=[[max(value - env[0], 0)], [max(env[1] - value, 0)]],
                                            color="0.15", ls="none", capsize=2, elinewidth=0.8, marker="none")
                mark_interval(*container.lines[2])
        pair_rows = list({r["pair"]: r for r in cell if r.get("pair") and r.get("tau_bias") is not None}.values())
        if pair_rows:  # only cells with split pairs: the window figure of an experiment without pairs is unchanged
            bias_marks.add(_mark_tau_bias(ax_win, pair_rows, i - 0.2, colors[n]))
            gap = median_of([r.get("tau_gap") for r in cell if r.get("pair") and not r.get("tau_gap_censored")])
            if gap is not None:
                ax_win.plot([gap], [i + 0.2], marker="o", mfc="white", mec="0.15", ms=4, ls="none", zorder=5)
                any_gap = True
    ax_win.set_yticks(range(len(ns)), [str(n) for n in ns])
    ax_win.set_ylim(-0.6, len(ns) - 0.4)
    ax_win.set_ylabel("N")
    ax_win.grid(axis="y", visible=False)
    notes = ["hatched: $\\tau_\\mathrm{mem}$ only a lower bound"] * any_bound
    notes += ["| = $\\tau_\\mathrm{mem}$ before $\\tau_\\mathrm{gen}$: no window"] * any_empty
    pair_notes = [r"diamond: $\tau_\mathrm{bias}$ of the split pairs (median, 95 % bracket)"] * (
        "measured" in bias_marks)
    pair_notes += [r"open triangle: $\tau_\mathrm{bias}$ only a bound ($>$: not reached)"] * ("bound" in bias_marks)
    pair_notes += [r"circle: $\tau_\mathrm{gap}$ of their runs"] * any_gap
    ax_win.set_title("window [$\\tau_\\mathrm{gen}$, $\\tau_\\mathrm{mem}$] per N (median over seeds)\nblack "
                     "whiskers: 95 % intervals" + ("\n" + "; ".join(notes) if notes else "")
                     + "".join("\n" + note for note in pair_notes), fontsize=6.5,
                     loc="left")
    ax_win.set_xscale("log")
    if ax_fid is not None:
        ax_fid.set_yscale("log")
        ax_fid.set_ylabel(quality_label(records) + "\n(lower is better)")  # two lines: "FD (<extractor>)" is long
        ax_fid.set_title(f"W = {width}")
        legend_by_n(ax_fid, ns, colors, extra=curve_legend_extras(fid_band, seeded))
    if ax_mem is not None:
        f_mem_axis(ax_mem)
        if ax_fid is None:
            ax_mem.set_title(f"W = {width}")
            legend_by_n(ax_mem, ns, colors, extra=curve_legend_extras(mem_band, seeded))
        elif mem_band:
            ax_mem.legend(handles=curve_legend_extras(mem_band, False), loc="upper left")  # the bands only
    ax_win.set_xlabel("training step")
    fig.canvas.draw()  # final limits before choosing ticks
    readable_log_axis(ax_win.xaxis)
    if ax_fid is not None:
        readable_log_axis(ax_fid.yaxis)
    return out.save(fig, name)


# --- collapse -------------------------------------------------------------------------------------------------------

def plot_collapse(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """f_mem (symlog, with its 95 % band) against step / N, one panel per width that has at least two N (several seeds:
    each thin, their mean bold, as in :func:`plot_window`); the x axis starts at half the earliest onset interval's
    lower end (tau_mem_lo / N), where the curves leave 0."""
    with_mem = [w for w in widths_with_several_n(data)
                if any(np.isfinite(data.records[r["run"]].series("f_mem")).any() for r in data.rows_of_width(w))]
    if not with_mem:
        if not any(np.isfinite(rec.series("f_mem")).any() for rec in data.records.values()):
            return FigureResult("collapse", skipped="no f_mem recorded")
        return FigureResult("collapse", skipped=f"only one N per width (N={', '.join(map(str, data.ns))}): nothing "
                                                "to collapse")
    fig, axes = new_figure(len(with_mem), size=(3.4, 3.4), sharey=True)  # the legend lies below the axes
    colors = n_colors(data.ns)
    for ax, w in zip(axes, with_mem):
        rows = data.rows_of_width(w)
        ns = sorted({r["n"] for r in rows})
        starts, ends = [], []
        band: set[str] = set()
        seeded = False
        for n in ns:
            cell = [r for r in rows if r["n"] == n]
            drawn, many = draw_cell_curves(ax, [data.records[r["run"]] for r in cell], "f_mem", colors[n], per_x=n)
            band, seeded = band | drawn, seeded or many
            for row in cell:
                rec = data.records[row["run"]]
                ok = finite_points(rec.steps, rec.series("f_mem"))
                if ok.any():
                    ends.append(float(rec.steps[ok][-1] / n))
                if row.get("tau_mem_lo") is not None and not row.get("tau_mem_censored"):
                    starts.append(row["tau_mem_lo"] / n)
        ax.set_xscale("log")
        if starts and ends and min(starts) / 2 < max(ends):
            ax.set_xlim(min(starts) / 2, max(ends) * 1.2)
        ax.set_xlabel(r"training step / $N$ (steps per training image)")
        ax.set_title(f"W = {w}")
        legend_by_n(ax, ns, colors, extra=curve_legend_extras(band, seeded), loc="upper center",
                     bbox_to_anchor=(0.5, -0.24), ncols=2 if seeded else 3)
    f_mem_axis(axes[0])
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    return out.save(fig, "collapse")
