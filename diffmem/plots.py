"""Every figure of an experiment, drawn from the files on disk only (summary.csv, fits.json, metrics.jsonl).

``make_figures(experiment_dir)`` writes PNG (200 dpi) and PDF files into ``experiment_dir/figures/`` and returns one
:class:`FigureResult` per figure, written or skipped with the reason (e.g. width.png with a single width):

- ``window_w{W}``: FID/FD (top) and f_mem with its 95% interval (bottom) against the training step, one colour per N,
  the generalization window [tau_gen, tau_mem] of each N shaded (the paper's Fig. 2).
- ``collapse``: f_mem against step / N, one panel per width.
- ``scaling``: tau_mem and tau_gen against N (log-log), per width, with the fitted law and its bootstrap band;
  censored runs as open triangles (pointing up: lower bound).
- ``width``: tau_gen and tau_mem / N against W (only with several widths), with a 1/W guide.
- ``phase``: the (N, p) plane at a few training times tau: a run is memorizing at tau when its f_mem(tau) (log-time
  interpolation between evaluations, averaged over seeds) exceeds ``phase_threshold``; generalizing when not
  memorizing and tau >= tau_gen; still learning before tau_gen; "not memorizing" when tau_gen is unknown or only a
  lower bound (the paper's Fig. 3).
- ``loss_gap``: train (solid) and test (dashed) loss at the fixed diffusion time against the step, per N.

The quality axis is labelled with :func:`diffmem.metrics.fid.metric_label`: "FID" only for Inception features,
"FD (<extractor>)" otherwise. Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot state).

Public drawing helpers, shared with the theory's figures (:mod:`diffmem.theory.figures`): ``STYLE``,
:func:`new_figure`, :func:`save_figure`, :func:`draw_fit`, :func:`n_colors`.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import matplotlib as mpl
import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from diffmem.analysis.runfiles import RunRecord, find_run_folders, read_csv, read_run
from diffmem.analysis.powerlaw import FitSet, PowerLawFit, load_fits
from diffmem.io import atomic_write_bytes
from diffmem.metrics.fid import metric_label

STYLE = {
    "font.size": 8, "axes.labelsize": 9, "axes.titlesize": 9, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "lines.linewidth": 1.2, "lines.markersize": 4, "axes.grid": True, "grid.alpha": 0.25,
    "legend.frameon": False, "savefig.dpi": 200, "pdf.fonttype": 42,
}
"""matplotlib settings for paper-sized figures (single column about 3.4 in wide)."""

PANEL = (3.4, 2.6)  # inches per panel


class PlotError(ValueError):
    """The experiment folder lacks what the figures need; the message says what to run."""


@dataclass(frozen=True)
class FigureResult:
    """One figure: the files written (PNG and PDF), or why it was skipped (``files`` empty)."""

    name: str
    files: tuple[Path, ...] = ()
    skipped: str | None = None


@dataclass(frozen=True)
class ExperimentFiles:
    """What the figures read: summary rows (typed), fits (None when fits.json is absent) and each run's metrics."""

    directory: Path
    rows: tuple[dict[str, Any], ...]
    fits: dict[str, FitSet] | None
    records: dict[str, RunRecord]

    @property
    def widths(self) -> list[int]:
        return sorted({r["width"] for r in self.rows})

    @property
    def ns(self) -> list[int]:
        return sorted({r["n"] for r in self.rows})

    def rows_of_width(self, width: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["width"] == width]


def load_experiment_files(experiment_dir: str | Path) -> ExperimentFiles:
    """Read summary.csv, fits.json (if present) and the metrics of every run listed in the summary."""
    directory = Path(experiment_dir)
    summary = directory / "summary.csv"
    if not summary.is_file():
        raise PlotError(f"'{summary}' does not exist; run `diffmem analyze {directory}` first")
    rows = tuple(read_csv(summary))
    fits = load_fits(directory / "fits.json") if (directory / "fits.json").is_file() else None
    folders = {p.name: p for p in find_run_folders(directory)}
    records = {}
    for row in rows:
        if row["run"] not in folders:
            raise PlotError(f"summary.csv lists run '{row['run']}' but {directory} has no such run folder; rerun "
                            "`diffmem analyze`")
        records[row["run"]] = read_run(folders[row["run"]])
    return ExperimentFiles(directory, rows, fits, records)


# --- helpers --------------------------------------------------------------------------------------------------------

def n_colors(ns: Sequence[int]) -> dict[int, Any]:
    """One viridis colour per N, evenly spaced by rank (dark = small N)."""
    cmap = colormaps["viridis"]
    ns = sorted(set(ns))
    return {n: cmap(0.9 * i / max(len(ns) - 1, 1)) for i, n in enumerate(ns)}


def _w_colors(widths: Sequence[int]) -> dict[int, Any]:
    cmap = colormaps["tab10"]
    return {w: cmap(i % 10) for i, w in enumerate(sorted(set(widths)))}


def _quality_label(records: Sequence[RunRecord]) -> str:
    extractors = sorted({e for r in records if (e := r.last_value("fid_extractor")) is not None})
    if len(extractors) == 1:
        return metric_label(extractors[0])
    return "FID / FD (mixed extractors: " + ", ".join(extractors) + ")" if extractors else "FID"


def new_figure(n_panels: int, *, rows: int = 1, size: tuple[float, float] = PANEL, sharex: bool = False,
               sharey: bool = False) -> tuple[Figure, list[Any]]:
    """A figure of ``n_panels`` axes on ``rows`` rows (``size``: inches per panel), unused grid cells hidden; drawn
    off-screen (Agg), so it works without a display. Returns (figure, the n_panels axes)."""
    cols = math.ceil(n_panels / rows)
    fig = Figure(figsize=(size[0] * cols, size[1] * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=sharex, sharey=sharey).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def save_figure(fig: Figure, out_dir: Path, name: str) -> FigureResult:
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``, each atomically."""
    files = []
    for fmt in ("png", "pdf"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt)
        path = out_dir / f"{name}.{fmt}"
        atomic_write_bytes(path, buffer.getvalue())
        files.append(path)
    return FigureResult(name, tuple(files))


def _finite(x: np.ndarray, *ys: np.ndarray) -> np.ndarray:
    ok = np.isfinite(x) & (x > 0)
    for y in ys:
        ok &= np.isfinite(y)
    return ok


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def _window_of(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, bool]:
    """Median tau_gen and tau_mem over the seeds of one (N, W); True when a tau_mem is only a lower bound."""
    gen = _median([r["tau_gen"] for r in rows if not r.get("tau_gen_censored")])
    mem = _median([r["tau_mem"] for r in rows])
    return gen, mem, any(r.get("tau_mem_censored") for r in rows)


def _legend_by_n(ax, ns: Sequence[int], colors: dict[int, Any], title: str = "N") -> None:
    handles = [Line2D([], [], color=colors[n], label=str(n)) for n in ns]
    ax.legend(handles=handles, title=title, ncols=2 if len(ns) > 5 else 1, loc="best")


# --- 1. window ------------------------------------------------------------------------------------------------------

def plot_window(data: ExperimentFiles, width: int, out_dir: Path) -> FigureResult:
    """FID/FD and f_mem against the step for every N at one width, and a strip with each N's window shaded."""
    name = f"window_w{width:02d}"
    rows = data.rows_of_width(width)
    records = [data.records[r["run"]] for r in rows]
    has_fid = any(np.isfinite(rec.series("fid")).any() for rec in records)
    has_mem = any(np.isfinite(rec.series("f_mem")).any() for rec in records)
    if not (has_fid or has_mem):
        return FigureResult(name, skipped=f"no FID and no f_mem recorded at W={width}")
    ns = sorted({r["n"] for r in rows})
    colors = n_colors(ns)
    heights = [2.0] * (int(has_fid) + int(has_mem)) + [0.25 + 0.12 * len(ns)]
    fig = Figure(figsize=(4.2, sum(heights) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}).ravel().tolist()
    ax_fid = axes[0] if has_fid else None
    ax_mem = axes[len(heights) - 2] if has_mem else None
    ax_win = axes[-1]
    for row, rec in zip(rows, records):
        c = colors[row["n"]]
        steps = rec.steps
        if ax_fid is not None:
            fid = rec.series("fid")
            ok = _finite(steps, fid)
            ax_fid.plot(steps[ok], fid[ok], color=c, marker=".", ms=2.5)
        if ax_mem is not None:
            f, lo, hi = rec.series("f_mem"), rec.series("f_mem_lo"), rec.series("f_mem_hi")
            ok = _finite(steps, f)
            ax_mem.plot(steps[ok], f[ok], color=c, marker=".", ms=2.5)
            band = ok & np.isfinite(lo) & np.isfinite(hi)
            if band.any():
                ax_mem.fill_between(steps[band], lo[band], hi[band], color=c, alpha=0.15, lw=0)
    any_bound = any_empty = False
    for i, n in enumerate(ns):
        gen, mem, mem_bound = _window_of([r for r in rows if r["n"] == n])
        if gen is not None and mem is not None and gen < mem:
            ax_win.fill_betweenx([i - 0.35, i + 0.35], gen, mem, color=colors[n], alpha=0.6, lw=0,
                                 hatch="///" if mem_bound else None)
            any_bound |= mem_bound
        elif gen is not None and mem is not None:
            ax_win.plot([mem], [i], marker="|", color=colors[n], ms=8)  # no window: tau_mem <= tau_gen
            any_empty = True
    ax_win.set_yticks(range(len(ns)), [str(n) for n in ns])
    ax_win.set_ylim(-0.6, len(ns) - 0.4)
    ax_win.set_ylabel("N")
    ax_win.grid(axis="y", visible=False)
    notes = ["hatched: $\\tau_\\mathrm{mem}$ only a lower bound"] * any_bound
    notes += ["| = $\\tau_\\mathrm{mem}$ before $\\tau_\\mathrm{gen}$: no window"] * any_empty
    ax_win.set_title("window [$\\tau_\\mathrm{gen}$, $\\tau_\\mathrm{mem}$] per N"
                     + (" (" + "; ".join(notes) + ")" if notes else ""), fontsize=6.5, loc="left")
    ax_win.set_xscale("log")
    if ax_fid is not None:
        ax_fid.set_yscale("log")
        ax_fid.set_ylabel(_quality_label(records))
        ax_fid.set_title(f"W = {width}")
        _legend_by_n(ax_fid, ns, colors)
    if ax_mem is not None:
        ax_mem.set_ylabel(r"$f_\mathrm{mem}$")
        ax_mem.set_ylim(-0.02, 1.02)
        if ax_fid is None:
            ax_mem.set_title(f"W = {width}")
            _legend_by_n(ax_mem, ns, colors)
    ax_win.set_xlabel("training step")
    return save_figure(fig, out_dir, name)


# --- 2. collapse ----------------------------------------------------------------------------------------------------

def plot_collapse(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """f_mem against step / N, one panel per width."""
    widths = [w for w in data.widths
              if any(np.isfinite(data.records[r["run"]].series("f_mem")).any() for r in data.rows_of_width(w))]
    if not widths:
        return FigureResult("collapse", skipped="no f_mem recorded")
    fig, axes = new_figure(len(widths), sharey=True)
    for ax, w in zip(axes, widths):
        rows = data.rows_of_width(w)
        ns = sorted({r["n"] for r in rows})
        colors = n_colors(ns)
        for row in rows:
            rec = data.records[row["run"]]
            x, f = rec.steps / row["n"], rec.series("f_mem")
            ok = _finite(x, f)
            ax.plot(x[ok], f[ok], color=colors[row["n"]], marker=".", ms=2.5)
        ax.set_xscale("log")
        ax.set_xlabel(r"training step / $N$")
        ax.set_title(f"W = {w}")
        _legend_by_n(ax, ns, colors)
    axes[0].set_ylabel(r"$f_\mathrm{mem}$")
    return save_figure(fig, out_dir, "collapse")


# --- 3. scaling -----------------------------------------------------------------------------------------------------

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
            ax.errorbar([x], [y], yerr=yerr, color=color, marker=marker, ls="none", capsize=2, elinewidth=0.8,
                        **style)
        if seeded and r.get(f"{key}_seed_gmean") is not None:
            means[x] = r[f"{key}_seed_gmean"] / scale
        drawn += 1
    if means:
        xs = sorted(means)
        ax.plot(xs, [means[x] for x in xs], marker="D", ms=6, mfc=color, mec="black", mew=0.6, ls="none", zorder=5)
    return drawn


def draw_fit(ax, fit: PowerLawFit | None, color, label_x: str) -> str | None:
    """The fitted law over its x range (extended by 20%) with the 95 % interval of the law as a band (Student t on
    the cell means, diffmem.analysis.powerlaw); returns a legend text."""
    if fit is None or not fit.fitted:
        return None
    x_min, x_max = fit.x_range
    xs = np.geomspace(x_min / 1.2, x_max * 1.2, 60)
    value, lo, hi = fit.predict(xs)
    ax.plot(xs, value, color=color, lw=1.0)
    if fit.exponent_lo is None:
        return f"$\\propto {label_x}^{{{fit.exponent:.2f}}}$ (no interval: 2 values)"
    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
    return (f"$\\propto {label_x}^{{{fit.exponent:.2f}}}$ [{fit.exponent_lo:.2f}, {fit.exponent_hi:.2f}]")


def gof_text(fit: PowerLawFit | None) -> str | None:
    """A short legend line on whether one power law fits the points (diffmem.analysis.powerlaw.GoodnessOfFit)."""
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


def plot_scaling(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """tau_mem (its onset, then each level crossing tau_mem_at_L of summary.csv) and tau_gen against N per width,
    with the fitted laws, their 95 % bands and goodness of fit."""
    levels = sorted({k for r in data.rows for k in r if k.startswith("tau_mem_at_")
                     and not k.endswith(("_lo", "_hi", "_censored"))}, key=lambda k: float(k[len("tau_mem_at_"):]))
    level_panels = tuple((k, f"{k}_vs_n", rf"step where $f_\mathrm{{mem}}$ reaches {k[len('tau_mem_at_'):]} (steps)")
                         for k in levels)
    panels = _present(data, (("tau_mem", "tau_mem_vs_n", r"$\tau_\mathrm{mem}$, onset (steps)"),) + level_panels
                      + (("tau_gen", "tau_gen_vs_n", r"$\tau_\mathrm{gen}$ (steps)"),))
    if not panels:
        return FigureResult("scaling", skipped="no tau_mem and no tau_gen in summary.csv")
    fig, axes = new_figure(len(panels))
    colors = _w_colors(data.widths)
    for ax, (key, fit_name, label) in zip(axes, panels):
        handles = []
        for w in data.widths:
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
        if any((r.get("seeds_in_cell") or 1) > 1 for r in data.rows):
            handles.append(Line2D([], [], color="0.3", marker="D", mec="black", ls="none",
                                  label="mean over seeds (faint: each seed)"))
        if any(r.get(f"{key}_censored") and r.get(f"{key}_hi") is None for r in data.rows if r[key] is not None):
            handles.append(Line2D([], [], color="0.3", marker="^", mfc="none", ls="none",
                                            label="censored (lower bound)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(data.ns, [str(n) for n in data.ns])  # the measured N, not overlapping minor labels
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(r"training set size $N$")
        ax.set_ylabel(label)
        ax.legend(handles=handles, loc="best")
    return save_figure(fig, out_dir, "scaling")


# --- 4. width -------------------------------------------------------------------------------------------------------

def plot_width(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """tau_gen and tau_mem / N against W, per N, when several widths exist."""
    if len(data.widths) < 2:
        return FigureResult("width", skipped=f"only one width ({data.widths[0]}): nothing to plot against W")
    panels = _present(data, (("tau_gen", r"$\tau_\mathrm{gen}$ (steps)", lambda r: 1.0),
                             ("tau_mem", r"$\tau_\mathrm{mem} / N$ (steps per image)", lambda r: float(r["n"]))))
    if not panels:
        return FigureResult("width", skipped="no tau_gen and no tau_mem in summary.csv")
    fig, axes = new_figure(len(panels))
    colors = n_colors(data.ns)
    for ax, (key, label, scale) in zip(axes, panels):
        ys = []
        for n in data.ns:
            rows = [r for r in data.rows if r["n"] == n]
            _draw_taus(ax, rows, key, lambda r: r["width"], colors[n], "o", scale_of=scale)
            ys += [r[key] / scale(r) for r in rows if r[key] is not None]
        handles = [Line2D([], [], color=colors[n], marker="o", ls="none", label=f"N={n}") for n in data.ns]
        fit = data.fits["tau_gen_vs_width"].pooled if (key == "tau_gen" and data.fits is not None) else None
        text = draw_fit(ax, fit, "0.2", "W")
        if text:
            handles.append(Line2D([], [], color="0.2", label=f"fit: {text}"))
        w_arr = np.array(data.widths, dtype=float)
        anchor = math.exp(np.mean(np.log(ys))) * math.exp(np.mean(np.log(w_arr)))
        ax.plot(w_arr, anchor / w_arr, color="0.5", ls="--", lw=0.8)
        handles.append(Line2D([], [], color="0.5", ls="--", label=r"$\propto 1/W$ (paper)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(data.widths, [str(w) for w in data.widths])
        ax.minorticks_off()
        ax.set_xlabel("base width $W$")
        ax.set_ylabel(label)
        ax.legend(handles=handles, loc="best")
    return save_figure(fig, out_dir, "width")


# --- 5. phase -------------------------------------------------------------------------------------------------------

def f_mem_at(record: RunRecord, step: float) -> float | None:
    """f_mem of a run at ``step`` by linear interpolation in log step; None outside the evaluated steps."""
    steps, f = record.steps, record.series("f_mem")
    ok = _finite(steps, f)
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


def classify_phase(f_mem: float | None, tau: float, tau_gen: float | None, threshold: float,
                   tau_gen_is_bound: bool = False) -> str:
    """The phase-diagram class of one (N, W) at training time ``tau`` (keys of :data:`PHASE_STYLE`).

    ``tau_gen_is_bound``: tau_gen is only a lower bound (plateau not confirmed): "generalizing" is then not claimed.
    """
    if f_mem is None:
        return "not trained that long"
    if f_mem > threshold:
        return "memorizing"
    if tau_gen is not None and tau < tau_gen:
        return "learning (before tau_gen)"
    if tau_gen is None or tau_gen_is_bound:
        return "not memorizing (tau_gen unconfirmed)"
    return "generalizing"


def plot_phase(data: ExperimentFiles, out_dir: Path, *, threshold: float = 0.01,
               times: Sequence[float] | None = None) -> FigureResult:
    """The (N, p) plane at a few training times: which (N, p) memorize, generalize or still learn."""
    with_p = [r for r in data.rows if r["params"]]
    if not with_p:
        return FigureResult("phase", skipped="no parameter counts (params) in the runs' config.json")
    if not any(np.isfinite(data.records[r["run"]].series("f_mem")).any() for r in with_p):
        return FigureResult("phase", skipped="no f_mem recorded")
    times = list(times) if times is not None else _phase_times(data)
    if not times:
        return FigureResult("phase", skipped="no evaluated steps")
    fig, axes = new_figure(len(times), size=(2.3, 2.3), sharey=True)
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in with_p:
        groups.setdefault((r["n"], r["params"]), []).append(r)
    seen = set()
    for ax, tau in zip(axes, times):
        for (n, p), rows in sorted(groups.items()):
            fs = [f for r in rows if (f := f_mem_at(data.records[r["run"]], tau)) is not None]
            f = float(np.mean(fs)) if fs else None
            measured = [r["tau_gen"] for r in rows if r["tau_gen"] is not None and not r.get("tau_gen_censored")]
            bounds = [r["tau_gen"] for r in rows if r["tau_gen"] is not None and r.get("tau_gen_censored")]
            tau_gen = _median(measured) if measured else _median(bounds)
            label = classify_phase(f, tau, tau_gen, threshold, tau_gen_is_bound=not measured and bool(bounds))
            seen.add(label)
            style = PHASE_STYLE[label]
            ax.plot([n], [p], ls="none", ms=9, mec=style["color"], mfc=style.get("mfc", style["color"]),
                    marker=style["marker"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"$\\tau$ = {tau:.3g} steps")
        ax.set_xlabel("$N$")
        ax.margins(0.15)
    axes[0].set_ylabel("parameters $p$")
    handles = [Line2D([], [], ls="none", ms=7, marker="s", mec=PHASE_STYLE[k]["color"],
                                mfc=PHASE_STYLE[k].get("mfc", PHASE_STYLE[k]["color"]), label=k)
               for k in PHASE_STYLE if k in seen]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3),
               title=f"memorizing: $f_\\mathrm{{mem}}(\\tau) > {threshold:g}$")
    return save_figure(fig, out_dir, "phase")


# --- 6. loss gap ----------------------------------------------------------------------------------------------------

def plot_loss_gap(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """Train and test loss at the fixed diffusion time against the step, per N, one panel per width."""
    def has_loss(rec: RunRecord) -> bool:
        return bool((np.isfinite(rec.series("train_loss")) & np.isfinite(rec.series("test_loss"))).any())

    widths = [w for w in data.widths if any(has_loss(data.records[r["run"]]) for r in data.rows_of_width(w))]
    if not widths:
        return FigureResult("loss_gap", skipped="no train/test loss recorded")
    fig, axes = new_figure(len(widths))
    for ax, w in zip(axes, widths):
        rows = data.rows_of_width(w)
        ns = sorted({r["n"] for r in rows})
        colors = n_colors(ns)
        for row in rows:
            rec = data.records[row["run"]]
            steps = rec.steps
            for key, ls in (("train_loss", "-"), ("test_loss", "--")):
                y = rec.series(key)
                ok = _finite(steps, y) & (y > 0)
                ax.plot(steps[ok], y[ok], color=colors[row["n"]], ls=ls)
            if row.get("tau_gap") is not None and not row.get("tau_gap_censored"):
                ax.axvline(row["tau_gap"], color=colors[row["n"]], lw=0.6, ls=":")
        handles = [Line2D([], [], color=colors[n], label=f"N={n}") for n in ns]
        handles += [Line2D([], [], color="0.3", ls="-", label="train"),
                    Line2D([], [], color="0.3", ls="--", label="test"),
                    Line2D([], [], color="0.3", ls=":", label=r"$\tau_\mathrm{gap}$")]
        ax.legend(handles=handles, ncols=2, loc="best")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(f"W = {w}")
    loss_t = next((e.get("loss_t") for rec in data.records.values() for e in rec.evaluations if e.get("loss_t")), None)
    axes[0].set_ylabel("DSM loss" + (f" at t = {loss_t:g}" if loss_t else ""))
    return save_figure(fig, out_dir, "loss_gap")


# --- all ------------------------------------------------------------------------------------------------------------

def make_figures(experiment_dir: str | Path, *, out_dir: str | Path | None = None, phase_threshold: float = 0.01,
                 phase_times: Sequence[float] | None = None) -> list[FigureResult]:
    """Draw every figure of ``experiment_dir`` (after `diffmem analyze`) into ``out_dir`` (default
    ``experiment_dir/figures``)."""
    data = load_experiment_files(experiment_dir)
    out_dir = data.directory / "figures" if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with mpl.rc_context(STYLE):
        results = [plot_window(data, w, out_dir) for w in data.widths]
        results.append(plot_collapse(data, out_dir))
        results.append(plot_scaling(data, out_dir))
        results.append(plot_width(data, out_dir))
        results.append(plot_phase(data, out_dir, threshold=phase_threshold, times=phase_times))
        results.append(plot_loss_gap(data, out_dir))
    return results
