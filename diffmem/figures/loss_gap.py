"""The loss-gap figure ``loss_gap``: train (solid) and test (dashed) loss at the fixed diffusion time against the
step, per N, one panel per width, each run's tau_gap marked on its test curve."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D

from diffmem.analysis.runfiles import RunRecord
from diffmem.figures.experiment_files import ExperimentFiles
from diffmem.figures.style import FigureOutput, FigureResult, finite_points, n_colors, new_figure, readable_log_axis


def plot_loss_gap(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """Train (solid) and test (dashed) loss at the fixed diffusion time against the step, per N, one panel per width,
    panels sharing the loss axis; each run's tau_gap (where the test loss leaves the train loss) as an open circle on
    its test curve."""
    def has_loss(rec: RunRecord) -> bool:
        return bool((np.isfinite(rec.series("train_loss")) & np.isfinite(rec.series("test_loss"))).any())

    widths = [w for w in data.widths if any(has_loss(data.records[r["run"]]) for r in data.rows_of_width(w))]
    if not widths:
        return FigureResult("loss_gap", skipped="no train/test loss recorded")
    fig, axes = new_figure(len(widths), sharey=True)
    colors = n_colors(data.ns)
    any_gap = False
    for ax, w in zip(axes, widths):
        rows = data.rows_of_width(w)
        ns = sorted({r["n"] for r in rows})
        for row in rows:
            rec = data.records[row["run"]]
            steps = rec.steps
            for key, ls in (("train_loss", "-"), ("test_loss", "--")):
                y = rec.series(key)
                ok = finite_points(steps, y) & (y > 0)
                ax.plot(steps[ok], y[ok], color=colors[row["n"]], ls=ls)
            gap = row.get("tau_gap")
            test = rec.series("test_loss")
            ok = finite_points(steps, test) & (test > 0)
            if gap is not None and not row.get("tau_gap_censored") and ok.sum() >= 2:
                at = math.exp(float(np.interp(math.log(gap), np.log(steps[ok]), np.log(test[ok]))))
                ax.plot([gap], [at], marker="o", mfc="white", mec=colors[row["n"]], mew=1.2, ms=6, ls="none",
                        zorder=5)
                any_gap = True
        handles = [Line2D([], [], color=colors[n], label=f"N={n}") for n in ns]
        handles += [Line2D([], [], color="0.3", ls="-", label="train"),
                    Line2D([], [], color="0.3", ls="--", label="test (held out)")]
        if any_gap:
            handles.append(Line2D([], [], color="0.3", marker="o", mfc="white", ls="none",
                                  label=r"$\tau_\mathrm{gap}$"))
        ax.legend(handles=handles, ncols=2, loc="lower left")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(f"W = {w}")
    loss_t = next((e.get("loss_t") for rec in data.records.values() for e in rec.evaluations if e.get("loss_t")), None)
    axes[0].set_ylabel("denoising loss" + (f" at t = {loss_t:g}" if loss_t else ""))
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    readable_log_axis(axes[0].yaxis)
    return out.save(fig, "loss_gap")
