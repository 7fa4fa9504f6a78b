"""The laws: timescales against N and against the width W, with the fitted power laws (diffmem.analysis.powerlaw).

- ``scaling`` (:func:`plot_scaling`): tau_mem (its onset and each level crossing) and tau_gen against N (log-log),
  per width, with the fitted law and its 95 % band; censored runs as open triangles (pointing up: lower bound).
- ``width`` (:func:`plot_width`): tau_gen and tau_mem / N against W (only with several widths), per N, with each
  N's fitted law and a 1/W guide.

Every law drawn is one over comparable runs (a law in N at one width, a law in W at one N: fits.json's ``by_width``
and ``by_n``), never one over runs that differ in the other setting.

:func:`draw_fit` also draws the theory's fitted laws (diffmem.theory.figures).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from diffmem.analysis.powerlaw import PowerLawFit
from diffmem.figures.experiment_files import ExperimentFiles, widths_with_several_n
from diffmem.figures.style import (FigureOutput, FigureResult, mark_interval, n_colors, new_figure, readable_log_axis,
                                   width_colors)


def _draw_taus(ax, rows: Sequence[dict[str, Any]], key: str, x_of, color, marker: str, scale_of=lambda r: 1.0) -> int:
    """Measured taus with their intervals (filled), lower bounds as open up-triangles, upper bounds open down. Where
    a cell (same N and W) holds several seeds, each seed is drawn small and faint and the cell's geometric mean over
    its measured seeds (summary.csv's ``{key}_seed_gmean``) as a large diamond."""
    drawn = 0
    seeded = any((r.get("seeds_in_cell") or 1) > 1 for r in rows)
    style = dict(ms=3.5, alpha=0.5) if seeded else {}
    means = {}
    for r in rows:
        value = r[key]
        if value is None:
            continue
        scale = scale_of(r)
        x, y = x_of(r), value / scale
        lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
        censored = r.get(f"{key}_censored")
        if censored and hi is None:
            ax.plot([x], [y], marker="^", mfc="none", mec=color, ls="none", ms=6)
        elif censored:
            ax.plot([x], [y], marker="v", mfc="none", mec=color, ls="none", ms=6)
        else:
            yerr = None
            if lo is not None and hi is not None:
                yerr = [[max(y - lo / scale, 0.0)], [max(hi / scale - y, 0.0)]]
            container = ax.errorbar([x], [y], yerr=yerr, color=color, marker=marker, ls="none", capsize=2,
                                    elinewidth=0.8, **style)
            if yerr is not None:
                mark_interval(*container.lines[2])
        if seeded and r.get(f"{key}_seed_gmean") is not None:
            means[x] = r[f"{key}_seed_gmean"] / scale
        drawn += 1
    if means:
        xs = sorted(means)
        ax.plot(xs, [means[x] for x in xs], marker="D", ms=6, mfc=color, mec="black", mew=0.6, ls="none", zorder=5)
    return drawn


def draw_fit(ax, fit: PowerLawFit | None, color, label_x: str, *, scale: float = 1.0) -> str | None:
    """The fitted law over its x range (extended by 20%), divided by ``scale`` (e.g. N for tau_mem / N), with the
    95 % interval of the law as a band (Student t on the cell means, diffmem.analysis.powerlaw) when it has one (at
    least 3 distinct x); returns a legend text."""
    if fit is None or not fit.fitted:
        return None
    x_min, x_max = fit.x_range
    xs = np.geomspace(x_min / 1.2, x_max * 1.2, 200)
    value, lo, hi = fit.predict(xs)
    ax.plot(xs, value / scale, color=color, lw=1.0)
    if fit.exponent_lo is None:
        return f"fit $\\propto {label_x}^{{{fit.exponent:.2f}}}$ (2 values: no interval)"
    mark_interval(ax.fill_between(xs, lo / scale, hi / scale, color=color, alpha=0.15, lw=0))
    return f"fit $\\propto {label_x}^{{{fit.exponent:.2f}}}$ [{fit.exponent_lo:.2f}, {fit.exponent_hi:.2f}]"


def draw_reference(ax, xs: Sequence[float], ys: Sequence[float], exponent: float, label: str) -> Line2D | None:
    """A reference law y ~ x^exponent (grey dashes) through the centroid (geometric means) of the points (xs, ys),
    over their x range extended by 20 %; returns its legend handle (None, nothing drawn, with fewer than two distinct
    x)."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    ok = (xs > 0) & (ys > 0) & np.isfinite(xs) & np.isfinite(ys)
    if len(set(xs[ok])) < 2:
        return None
    handle = Line2D([], [], color="0.45", ls="--", lw=0.9, label=label)
    lx, ly = np.log(xs[ok]).mean(), np.log(ys[ok]).mean()
    grid = np.geomspace(xs[ok].min() / 1.2, xs[ok].max() * 1.2, 20)
    ax.plot(grid, np.exp(ly + exponent * (np.log(grid) - lx)), color="0.45", ls="--", lw=0.9, zorder=1)
    return handle


def _limit_to_points(ax, ys: Sequence[float], factor: float = 2.5) -> None:
    """Log y limits from the points (with their intervals) widened by ``factor`` each way, so that a wide fit band
    cannot squeeze them into a line."""
    ys = [y for y in ys if y is not None and y > 0 and math.isfinite(y)]
    if ys:
        ax.set_ylim(min(ys) / factor, max(ys) * factor)


def gof_text(fit: PowerLawFit | None) -> str | None:
    """A short legend line on whether one power law fits the points (diffmem.analysis.goodness.GoodnessOfFit)."""
    if fit is None or not fit.fitted or fit.gof is None:
        return None
    g = fit.gof
    parts = []
    if g.p_value is not None:
        parts.append(f"lack of fit p = {g.p_value:.2g}")
    if g.line_through_intervals is False:
        parts.append("no line through all intervals" + (f" (fits without {' or '.join(g.restoring)})"
                                                          if g.restoring else ""))
    parts += [f"{label} off the law (p = {p:.1g})" for label, _, p in g.outliers]
    if not parts:
        parts.append("one power law consistent with all points" if g.p_value is not None or g.line_through_intervals
                     else "fit not testable: one run per N")
    return "; ".join(parts)


def _present(data: ExperimentFiles, panels: Sequence[tuple]) -> list[tuple]:
    """The panels (tuples whose first item is a summary.csv column) with at least one value in that column."""
    return [panel for panel in panels if any(r[panel[0]] is not None for r in data.rows)]


def _group_fit(data: ExperimentFiles, name: str, key: str) -> PowerLawFit | None:
    if data.fits is None:
        return None
    return data.fits[name].groups.get(key)


def _band_entry() -> Line2D:
    """The legend entry that explains a fitted law's band and the runs' bars."""
    return Line2D([], [], color="0.5", lw=5, alpha=0.3, label="band: 95 % interval of the fitted law; bars: of each run")


def _finish_law_panel(ax, handles: list, rows: Sequence[dict[str, Any]], key: str, xlabel: str, ylabel: str,
                      ys: Sequence[float | None], factor: float) -> None:
    """The end of a panel of a timescale (summary.csv column ``key``) against N or W, shared by the scaling and width
    figures: a legend entry for censored lower bounds among ``rows``, log axes, the labels, the y range fitted to
    ``ys`` (:func:`_limit_to_points`) and the legend below the panel."""
    if any(r.get(f"{key}_censored") and r.get(f"{key}_hi") is None for r in rows if r[key] is not None):
        handles.append(Line2D([], [], color="0.3", marker="^", mfc="none", ls="none", label="censored (lower bound)"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _limit_to_points(ax, ys, factor=factor)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=6)


def _save_law_figure(fig: Figure, axes: Sequence[Any], xs: Sequence[float], out: FigureOutput,
                     name: str) -> FigureResult:
    """Readable log ticks (x at ``xs``, the grid's N or W) on every panel once the layout is drawn, then save."""
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis, xs)
        readable_log_axis(ax.yaxis)
    return out.save(fig, name)


PAPER_EXPONENT_N = {"tau_mem": 1.0, "tau_gen": 0.0}
"""The paper's laws against N: tau_mem ~ N (also each level crossing), tau_gen independent of N."""


def plot_scaling(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """tau_mem (its onset, then each level crossing tau_mem_at_L of summary.csv) and tau_gen against N per width
    that has at least two N, with the fitted laws, their 95 % bands, goodness of fit and the paper's slope (1 for
    tau_mem, 0 for tau_gen) through the points' centroid for reference."""
    widths = widths_with_several_n(data)
    if not widths:
        return FigureResult("scaling", skipped=f"only one N per width (N={', '.join(map(str, data.ns))}): nothing "
                                               "to plot against N")
    levels = sorted({k for r in data.rows for k in r if k.startswith("tau_mem_at_")
                     and not k.endswith(("_lo", "_hi", "_censored"))}, key=lambda k: float(k[len("tau_mem_at_"):]))
    level_panels = tuple((k, f"{k}_vs_n", rf"$\tau_\mathrm{{mem}}$ at $f_\mathrm{{mem}}$ = {k[len('tau_mem_at_'):]} "
                          "(steps)") for k in levels)
    panels = _present(data, (("tau_mem", "tau_mem_vs_n", r"$\tau_\mathrm{mem}$, onset (steps)"),) + level_panels
                      + (("tau_gen", "tau_gen_vs_n", r"$\tau_\mathrm{gen}$ (steps)"),))
    if not panels:
        return FigureResult("scaling", skipped="no tau_mem and no tau_gen in summary.csv")
    fig, axes = new_figure(len(panels), size=(3.4, 3.4))
    colors = width_colors(data.widths)
    rows_used = [r for r in data.rows if r["width"] in widths]
    ns = sorted({r["n"] for r in rows_used})
    seeded = any((r.get("seeds_in_cell") or 1) > 1 for r in rows_used)
    for ax, (key, fit_name, label) in zip(axes, panels):
        handles = []
        for w in widths:
            rows = data.rows_of_width(w)
            if not _draw_taus(ax, rows, key, lambda r: r["n"], colors[w], "o"):
                continue
            fit = _group_fit(data, fit_name, str(w))
            text = draw_fit(ax, fit, colors[w], "N")
            handles.append(Line2D([], [], color=colors[w], marker="o",
                                  label=f"W={w}" + (f": {text}" if text else "")))
            gof = gof_text(fit)
            if gof:
                handles.append(Line2D([], [], ls="none", label=f"  {gof}"))
        measured = [r for r in rows_used if r[key] is not None and not r.get(f"{key}_censored")]
        exponent = PAPER_EXPONENT_N["tau_gen" if key == "tau_gen" else "tau_mem"]
        reference = draw_reference(ax, [r["n"] for r in measured], [r[key] for r in measured], exponent,
                                   f"paper: slope {exponent:g} (through the points' centroid)")
        handles += [reference] if reference else []
        if any(h.get_label().startswith("W=") and "[" in h.get_label() for h in handles):
            handles.append(_band_entry())
        if seeded and any(r.get(f"{key}_seed_gmean") is not None for r in rows_used):
            handles.append(Line2D([], [], color="0.3", marker="D", mec="black", ls="none",
                                  label="mean over seeds (faint: each seed)"))
        _finish_law_panel(ax, handles, rows_used, key, r"training set size $N$ (images)", label,
                          [v for r in rows_used for v in (r[key], r.get(f"{key}_lo"), r.get(f"{key}_hi"))], 2.5)
    return _save_law_figure(fig, axes, ns, out, "scaling")


# --- width ----------------------------------------------------------------------------------------------------------

PAPER_EXPONENT_W = {"tau_gen": -1.0, "tau_mem": -1.0}
"""The paper's laws against the width W: tau_gen ~ 1/W and tau_mem / N ~ 1/W."""


def plot_width(data: ExperimentFiles, out: FigureOutput) -> FigureResult:
    """tau_gen and tau_mem / N against W, per N, when several widths exist: the points with their 95 % intervals,
    each N's fitted law (tau_gen_vs_width and tau_mem_vs_width of that N, the latter divided by N: laws over runs of
    one N only) with its band, and the paper's 1/W through the points' centroid."""
    if len(data.widths) < 2:
        return FigureResult("width", skipped=f"only one width ({data.widths[0]}): nothing to plot against W")
    panels = _present(data, (("tau_gen", r"$\tau_\mathrm{gen}$ (steps)", lambda r: 1.0, "tau_gen_vs_width"),
                             ("tau_mem", r"$\tau_\mathrm{mem} / N$ (steps per image)",
                              lambda r: float(r["n"]), "tau_mem_vs_width")))
    if not panels:
        return FigureResult("width", skipped="no tau_gen and no tau_mem in summary.csv")
    fig, axes = new_figure(len(panels), size=(3.4, 3.2))
    colors = n_colors(data.ns)
    for ax, (key, label, scale, fit_name) in zip(axes, panels):
        handles, xs, ys, all_ys = [], [], [], []
        for n in data.ns:
            rows = [r for r in data.rows if r["n"] == n]
            _draw_taus(ax, rows, key, lambda r: r["width"], colors[n], "o", scale_of=scale)
            for r in rows:
                if r[key] is None:
                    continue
                all_ys += [v / scale(r) for v in (r[key], r.get(f"{key}_lo"), r.get(f"{key}_hi")) if v is not None]
                if not r.get(f"{key}_censored"):
                    xs.append(r["width"])
                    ys.append(r[key] / scale(r))
            if len({r["width"] for r in rows}) >= 2:
                text = draw_fit(ax, _group_fit(data, fit_name, str(n)), colors[n], "W", scale=scale(rows[0]))
                if text:
                    handles.append(Line2D([], [], color=colors[n], label=f"N={n}: {text}"))
        handles = [Line2D([], [], color=colors[n], marker="o", ls="none", label=f"N={n}") for n in data.ns] + handles
        if any("[" in h.get_label() for h in handles):
            handles.append(_band_entry())
        reference = draw_reference(ax, xs, ys, PAPER_EXPONENT_W[key],
                                   r"paper: $\propto 1/W$ (through the points' centroid)")
        handles += [reference] if reference else []
        _finish_law_panel(ax, handles, data.rows, key, "base width $W$ (channels)", label, all_ys, 1.6)
    return _save_law_figure(fig, axes, data.widths, out, "width")
