"""The split-pairs figure ``pairs`` (only with split pairs, ``pairs.jsonl``): per pair, against the step, the bias
ln(d_other / d_own) with its 95 % band and a line at 0, the pair distance with its band and the own fraction (0.5: no
preference), one column per width, one colour per N (seeds as in the window figure); each pair's tau_bias on its
bias curve with its bracket, and its members' tau_gen and tau_mem on the same curve for comparison
(docs/split-pairs.md)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.lines import Line2D

from diffmem.analysis.runfiles import PairRecord
from diffmem.analysis.scaling import level_keys, level_of
from diffmem.figures.curves import curve_legend_extras, draw_cell_curves
from diffmem.figures.experiment_files import ExperimentFiles
from diffmem.figures.style import (FigureOutput, FigureResult, bias_axis, finite_points, legend_by_n, mark_interval,
                                   n_colors, new_figure, readable_log_axis)
from diffmem.rundir import PAIRS_FILE


PAIR_PANELS = (
    ("bias", "bias $\\ln(d_\\mathrm{other}/d_\\mathrm{own})$\n(0: no preference)", 0.0),
    ("pair_distance", "pair distance $\\|a_i - b_i\\|$\n(pixel values / 255)", None),
    ("own_fraction", "own fraction\n(0.5: no preference)", 0.5),
)
"""The rows of the pairs figure: pairs.jsonl key, axis label, reference line (None: none)."""

PAIR_MARKERS = {"tau_bias": dict(marker="D", ms=5.5, mec="black", mew=0.6),
                "tau_gen": dict(marker="s", ms=5, mfc="white", mew=1.0),
                "tau_mem": dict(marker="^", ms=5.5, mfc="white", mew=1.0)}
"""How the pairs figure marks a timescale on a pair's bias curve (the colour is the pair's N)."""


def _value_at(record: PairRecord, key: str, step: float) -> float | None:
    """``key`` of a pair at ``step`` (optimizer steps), interpolated linearly in log step between its paired
    evaluations (held at the ends); None when the pair has no value of ``key``."""
    steps, y = record.steps, record.series(key)
    ok = finite_points(steps, y)
    if not ok.any() or step <= 0:
        return None
    return float(np.interp(math.log(step), np.log(steps[ok]), y[ok]))


def _mark_pair_timescales(ax, record: PairRecord, rows: dict[str, dict[str, Any]], color) -> set[str]:
    """On ``record``'s bias curve: its tau_bias (summary.csv row of its split-0 run) with its bracket as a
    horizontal whisker (a censored one as an open triangle pointing where it lies), and each member's measured
    tau_gen and tau_mem. Returns the kinds of mark drawn (keys of :data:`PAIR_MARKERS`, "bound")."""
    drawn = set()
    row_a = rows.get(record.run_a, {})
    value = row_a.get("tau_bias")
    y = _value_at(record, "bias", value) if value is not None else None
    if y is not None and row_a.get("tau_bias_censored"):
        lower = row_a.get("tau_bias_hi") is None
        ax.plot([value], [y], marker=">" if lower else "<", mfc="none", mec=color, ms=6, ls="none", zorder=6)
        drawn.add("bound")
    elif y is not None:
        lo, hi = row_a.get("tau_bias_lo"), row_a.get("tau_bias_hi")
        xerr = [[max(value - lo, 0)], [max(hi - value, 0)]] if lo is not None and hi is not None else None
        container = ax.errorbar([value], [y], xerr=xerr, color=color, ls="none", capsize=2.5, elinewidth=1.0,
                                mfc=color, zorder=6, **PAIR_MARKERS["tau_bias"])
        if xerr is not None:
            mark_interval(*container.lines[2])
        drawn.add("tau_bias")
    for run in (record.run_a, record.run_b):
        row = rows.get(run, {})
        for key in ("tau_gen", "tau_mem"):
            if row.get(key) is None or row.get(f"{key}_censored"):
                continue
            at = _value_at(record, "bias", row[key])
            if at is not None:
                ax.plot([row[key]], [at], ls="none", mec=color, zorder=5, **PAIR_MARKERS[key])
                drawn.add(key)
    return drawn


def plot_pairs(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """The split pairs' measures (pairs.jsonl) against the step: bias with its 95 % band and a line at 0, pair
    distance with its band, own fraction with a line at 0.5; rows sharing the step axis, one column per width, one
    colour per N, a cell with several seeds drawn as in :func:`diffmem.figures.window.plot_window`
    (:func:`draw_cell_curves`). Each pair's tau_bias with its bracket, and its members' tau_gen and tau_mem, are
    marked on its bias curve (:func:`_mark_pair_timescales`). Skipped without pairs.jsonl."""
    if not data.pairs:
        if (data.directory / PAIRS_FILE).is_file():
            return FigureResult("pairs", skipped=f"{PAIRS_FILE} holds no pair whose two runs are both in summary.csv")
        return FigureResult("pairs", skipped=f"no {PAIRS_FILE}: no split pairs (`sweep.splits = [0, 1]`, then "
                                             "`diffmem pairs`)")
    pairs = list(data.pairs.values())
    widths = sorted({p.width for p in pairs})
    cols = len(widths)
    fig, axes = new_figure(len(PAIR_PANELS) * cols, rows=len(PAIR_PANELS), size=(4.0, 2.1), sharex=True)
    colors = n_colors(data.ns)
    rows = {r["run"]: r for r in data.rows}
    band: set[str] = set()
    seeded = False
    marks: set[str] = set()
    bias_levels = [level_of(k) for k in level_keys(data.rows, "tau_bias")]
    for c, w in enumerate(widths):
        column = [axes[k * cols + c] for k in range(len(PAIR_PANELS))]
        of_width = [p for p in pairs if p.width == w]
        ns = sorted({p.n for p in of_width})
        for ax, (key, label, reference) in zip(column, PAIR_PANELS):
            if reference is not None:
                ax.axhline(reference, color="0.35", ls=":", lw=0.9, zorder=1)
            for n in ns:
                drew, many = draw_cell_curves(ax, [p for p in of_width if p.n == n], key, colors[n])
                band, seeded = band | drew, seeded or many
            ax.set_ylabel(label)
            if key == "bias":
                for level in bias_levels:
                    ax.axhline(level, color="0.35", ls="--", lw=0.7, zorder=1)
                for p in of_width:  # the control bias: the other train set against a block neither model saw
                    control = p.series("control_bias")
                    if np.isfinite(control).any():
                        ax.plot(p.steps, control, color=colors[p.n], ls=(0, (1, 1.5)), lw=0.9, zorder=2)
                        marks.add("control")
                bias_axis(ax)
            elif key == "pair_distance" and all((p.series(key)[np.isfinite(p.series(key))] > 0).all()
                                                for p in of_width):
                ax.set_yscale("log")
        for p in of_width:
            marks |= _mark_pair_timescales(column[0], p, rows, colors[p.n])
        column[-1].set_ylim(0, 1)
        column[-1].set_xscale("log")
        column[-1].set_xlabel("training step")
        column[0].set_title(f"W = {w}: split pairs (blocks 0 and 1)")
    extra = curve_legend_extras(band, seeded)
    if bias_levels:
        extra.append(Line2D([], [], color="0.35", ls="--", lw=0.7,
                            label="bias levels " + ", ".join(f"{v:g}" for v in bias_levels)
                            + r" ($\tau_\mathrm{bias}$ at L: summary.csv)"))
    names = {"tau_bias": r"$\tau_\mathrm{bias}$ (bar: bracket)", "tau_gen": r"$\tau_\mathrm{gen}$ of each run",
             "tau_mem": r"$\tau_\mathrm{mem}$ of each run"}
    extra += [Line2D([], [], ls="none", color="0.3", mec="0.3", mfc="0.3" if k == "tau_bias" else "white",
                     label=names[k], **{a: v for a, v in PAIR_MARKERS[k].items() if a not in ("mec", "mfc")})
              for k in PAIR_MARKERS if k in marks]
    if "control" in marks:  # first: a short label, so the legend's long ones stay in one column
        extra.insert(0, Line2D([], [], color="0.3", ls=(0, (1, 1.5)), lw=0.9, label="control bias (must read 0)"))
    if "bound" in marks:
        extra.append(Line2D([], [], ls="none", marker=">", mfc="none", mec="0.3",
                            label=r"$\tau_\mathrm{bias}$ censored (points where it lies)"))
    legend_by_n(fig, sorted({p.n for p in pairs}), colors, extra=extra, loc="outside lower center",
                 ncols=2 if cols == 1 else 3, fontsize=6)
    fig.canvas.draw()
    for ax in axes[-cols:]:
        readable_log_axis(ax.xaxis)
    return out.save(fig, "pairs")
