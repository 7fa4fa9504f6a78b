"""The phase figure ``phase``: which (N, W) memorize, generalize or still learn, against training time (the paper's
Fig. 3).

A run is memorizing at tau from its onset tau_mem on (most seeds), or, with a threshold, when its f_mem(tau)
(log-time interpolation between evaluations, averaged over seeds) exceeds it; generalizing when not memorizing and
tau >= tau_gen; still learning before tau_gen; "not memorizing" when tau_gen is unknown or only a lower bound. With
several N and model sizes, the (N, p) plane at a few training times; with one of them, bars along the training step.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from diffmem.analysis.runfiles import RunRecord
from diffmem.figures.experiment_files import ExperimentFiles, median_of
from diffmem.figures.style import FigureOutput, FigureResult, finite_points, new_figure, readable_log_axis, tick_text


def f_mem_at(record: RunRecord, step: float) -> float | None:
    """f_mem of a run at ``step`` by linear interpolation in log step; None outside the evaluated steps."""
    steps, f = record.steps, record.series("f_mem")
    ok = finite_points(steps, f)
    if not ok.any() or step < steps[ok][0] or step > steps[ok][-1]:
        return None
    return float(np.interp(math.log(step), np.log(steps[ok]), f[ok]))


def _phase_times(data: ExperimentFiles) -> list[float]:
    last = max((r["steps"] for r in data.rows if r["steps"]), default=None)
    if not last:
        return []
    gens = [r["tau_gen"] for r in data.rows if r["tau_gen"]]
    mems = [r["tau_mem"] for r in data.rows if r["tau_mem"] and not r.get("tau_mem_censored")]
    start = min(gens) if gens else (min(mems) / 3 if mems else last / 100)
    start = min(max(start, 1.0), last)
    return [float(t) for t in np.geomspace(start, last, 4)]


PHASE_STYLE = {
    "memorizing": dict(color="#c0392b", marker="s"),
    "generalizing": dict(color="#2471a3", marker="s"),
    "learning (before tau_gen)": dict(color="#aeb6bf", marker="s"),
    "not memorizing (tau_gen unconfirmed)": dict(color="#7fb3d5", marker="s"),
    "not trained that long": dict(color="0.6", marker="s", mfc="none"),
}
PHASE_LEGEND_LABELS = {"learning (before tau_gen)": r"learning (before $\tau_\mathrm{gen}$)",
                       "not memorizing (tau_gen unconfirmed)": r"not memorizing ($\tau_\mathrm{gen}$ unconfirmed)"}
"""How the legend writes a class of :data:`PHASE_STYLE` whose plain key names a timescale (the rest as they are)."""


def classify_phase(tau: float, last_step: float | None, memorizing: bool, tau_gen: float | None,
                   tau_gen_is_bound: bool = False) -> str:
    """The phase-diagram class of one (N, W) at training time ``tau`` (steps; keys of :data:`PHASE_STYLE`).

    ``last_step``: the last evaluated step (None: none); ``memorizing``: whether the cell memorizes at ``tau``
    (:func:`memorizing_at`); ``tau_gen_is_bound``: tau_gen is only a lower bound (plateau not confirmed), so
    "generalizing" is not claimed.
    """
    if last_step is None or tau > last_step:
        return "not trained that long"
    if memorizing:
        return "memorizing"
    if tau_gen is not None and tau < tau_gen:
        return "learning (before tau_gen)"
    if tau_gen is None or tau_gen_is_bound:
        return "not memorizing (tau_gen unconfirmed)"
    return "generalizing"


def memorizing_at(data: ExperimentFiles, rows: Sequence[dict[str, Any]], tau: float,
                  threshold: float | None = None) -> bool:
    """Whether the seeds ``rows`` of one (N, W) memorize at step ``tau``.

    ``threshold`` None (the default): tau_mem's own rule (diffmem.analysis.timescales.tau_mem), i.e. more than half
    of the seeds have an onset tau_mem <= tau (an onset only known as a lower bound counts as not yet). A number: the
    seeds' mean f_mem(tau) (:func:`f_mem_at`) exceeds it."""
    if threshold is not None:
        fs = [f for r in rows if (f := f_mem_at(data.records[r["run"]], tau)) is not None]
        return bool(fs) and float(np.mean(fs)) > threshold
    onsets = [r["tau_mem"] <= tau for r in rows if r["tau_mem"] is not None
              and not (r.get("tau_mem_censored") and r.get("tau_mem_hi") is None)]
    return sum(onsets) > len(rows) / 2


def _cell_phase(data: ExperimentFiles, rows: Sequence[dict[str, Any]], tau: float, threshold: float | None) -> str:
    measured = [r["tau_gen"] for r in rows if r["tau_gen"] is not None and not r.get("tau_gen_censored")]
    bounds = [r["tau_gen"] for r in rows if r["tau_gen"] is not None and r.get("tau_gen_censored")]
    tau_gen = median_of(measured) if measured else median_of(bounds)
    last = min((r["steps"] for r in rows if r["steps"]), default=None)
    return classify_phase(tau, last, memorizing_at(data, rows, tau, threshold), tau_gen,
                          tau_gen_is_bound=not measured and bool(bounds))


def _phase_legend(fig: Figure, seen: set[str], threshold: float | None) -> None:
    handles = [Line2D([], [], ls="none", ms=7, marker="s", mec=PHASE_STYLE[k]["color"],
                      mfc=PHASE_STYLE[k].get("mfc", PHASE_STYLE[k]["color"]),
                      label=PHASE_LEGEND_LABELS.get(k, k))
               for k in PHASE_STYLE if k in seen]
    rule = (r"memorizing: from the onset $\tau_\mathrm{mem}$ on (most seeds)" if threshold is None
            else f"memorizing: $f_\\mathrm{{mem}}(\\tau) > {threshold:g}$")
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), title=rule)


def plot_phase(data: ExperimentFiles, out: FigureOutput, *, threshold: float | None = None,
               times: Sequence[float] | None = None) -> FigureResult:
    """Which (N, W) memorize, generalize or still learn, against training time.

    With several N and several parameter counts p: the (N, p) plane at a few training times tau (the paper's
    Fig. 3). With one p (an N sweep) or one N (a width sweep) that plane is a single row, so the figure is the
    (tau, N) or (tau, W) plane instead: one bar per N (or W) along the training step, coloured by phase. One N and
    one width: skipped. ``threshold``: see :func:`memorizing_at`."""
    with_p = [r for r in data.rows if r["params"]]
    if not with_p:
        return FigureResult("phase", skipped="no parameter counts (params) in the runs' config.json")
    if not any(np.isfinite(data.records[r["run"]].series("f_mem")).any() for r in with_p):
        return FigureResult("phase", skipped="no f_mem recorded")
    ns = sorted({r["n"] for r in with_p})
    ps = sorted({r["params"] for r in with_p})
    if len(ns) < 2 and len(ps) < 2:
        return FigureResult("phase", skipped=f"one N ({ns[0]}) and one model size: no phase diagram")
    if len(ns) >= 2 and len(ps) >= 2:
        return _phase_plane(data, with_p, out, threshold, times)
    return _phase_strips(data, with_p, out, threshold, by_n=len(ns) >= 2)


def _phase_plane(data: ExperimentFiles, with_p: Sequence[dict[str, Any]], out: FigureOutput, threshold: float | None,
                 times: Sequence[float] | None) -> FigureResult:
    times = list(times) if times is not None else _phase_times(data)
    if not times:
        return FigureResult("phase", skipped="no evaluated steps")
    fig, axes = new_figure(len(times), size=(2.4, 2.4), sharey=True)
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in with_p:
        groups.setdefault((r["n"], r["params"]), []).append(r)
    seen = set()
    for ax, tau in zip(axes, times):
        for (n, p), rows in sorted(groups.items()):
            label = _cell_phase(data, rows, tau, threshold)
            seen.add(label)
            style = PHASE_STYLE[label]
            ax.plot([n], [p], ls="none", ms=9, mec=style["color"], mfc=style.get("mfc", style["color"]),
                    marker=style["marker"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"$\\tau$ = {tick_text(float(f'{tau:.3g}'))} steps")
        ax.set_xlabel("training set size $N$")
        ax.margins(0.15)
    axes[0].set_ylabel("parameters $p$")
    _phase_legend(fig, seen, threshold)
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis, sorted({n for n, _ in groups}))
        readable_log_axis(ax.yaxis, sorted({p for _, p in groups}))
    return out.save(fig, "phase")


def _phase_strips(data: ExperimentFiles, with_p: Sequence[dict[str, Any]], out: FigureOutput, threshold: float | None,
                  *, by_n: bool) -> FigureResult:
    key = "n" if by_n else "width"
    values = sorted({r[key] for r in with_p})
    first = min(float(data.records[r["run"]].steps[0]) for r in with_p if len(data.records[r["run"]].steps))
    last = max(r["steps"] for r in with_p if r["steps"])
    grid = np.geomspace(max(first, 1.0), last, 300)
    edges = np.sqrt(grid[:-1] * grid[1:])
    edges = np.concatenate([[grid[0]], edges, [grid[-1]]])
    fig, (ax,) = new_figure(1, size=(5.0, 0.9 + 0.3 * len(values)))
    seen = set()
    for i, v in enumerate(values):
        rows = [r for r in with_p if r[key] == v]
        labels = [_cell_phase(data, rows, float(t), threshold) for t in grid]
        start = 0
        for j in range(1, len(grid) + 1):
            if j == len(grid) or labels[j] != labels[start]:
                style = PHASE_STYLE[labels[start]]
                ax.broken_barh([(edges[start], edges[j] - edges[start])], (i - 0.35, 0.7),
                               facecolors=style.get("mfc", style["color"]), edgecolors=style["color"], lw=0.6)
                seen.add(labels[start])
                start = j
    ax.set_yticks(range(len(values)), [str(v) for v in values])
    ax.set_ylim(-0.6, len(values) - 0.4)
    ax.grid(axis="y", visible=False)
    ax.set_xscale("log")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel(r"training time $\tau$ (steps)")
    if by_n:
        (p,) = {r["params"] for r in with_p}
        ax.set_ylabel("$N$ (images)")
        ax.set_title(f"phase against training time (one model: p = {tick_text(p)} parameters)")
    else:
        (n,) = {r["n"] for r in with_p}
        ax.set_ylabel("width $W$")
        ax.set_title(f"phase against training time (one training set: N = {n})")
    _phase_legend(fig, seen, threshold)
    fig.canvas.draw()
    readable_log_axis(ax.xaxis)
    return out.save(fig, "phase")
