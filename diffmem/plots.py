"""Every figure of an experiment, drawn from the files on disk only (summary.csv, fits.json, metrics.jsonl).

``make_figures(experiment_dir)`` writes PNG (200 dpi) and PDF files into ``experiment_dir/figures/`` and returns one
:class:`FigureResult` per figure, written or skipped with the reason (e.g. width.png with a single width):

- ``window_w{W}``: FID/FD (top) and f_mem with its 95% interval (bottom) against the training step, one colour per N,
  the generalization window [tau_gen, tau_mem] of each N shaded (the paper's Fig. 2). Where a cell (N, W) has several
  seeds, each seed's curve is thin and the cell's mean bold, with the 95 % t interval of the mean over seeds. Cells
  with split pairs also show tau_bias (with its bracket) and tau_gap in the window strip.
- ``collapse``: f_mem against step / N, one panel per width (seeds as in the window figure).
- ``scaling``: tau_mem and tau_gen against N (log-log), per width, with the fitted law and its bootstrap band;
  censored runs as open triangles (pointing up: lower bound).
- ``width``: tau_gen and tau_mem / N against W (only with several widths), with a 1/W guide.
- ``phase``: the (N, p) plane at a few training times tau: a run is memorizing at tau when its f_mem(tau) (log-time
  interpolation between evaluations, averaged over seeds) exceeds ``phase_threshold``; generalizing when not
  memorizing and tau >= tau_gen; still learning before tau_gen; "not memorizing" when tau_gen is unknown or only a
  lower bound (the paper's Fig. 3).
- ``loss_gap``: train (solid) and test (dashed) loss at the fixed diffusion time against the step, per N.
- ``pairs`` (only with split pairs, ``pairs.jsonl``): per pair, against the step, the bias ln(d_other / d_own)
  with its 95 % band and a line at 0, the pair distance with its band and the own fraction (0.5: no preference),
  one column per width, one colour per N (seeds as in the window figure); each pair's tau_bias on its bias curve
  with its bracket, and its members' tau_gen and tau_mem on the same curve for comparison.
- ``gallery_n{N:05d}_w{W:02d}``: per cell, one run's stored sample grids (samples above their nearest training
  images, copies framed in red) before tau_gen, inside the window and after tau_mem, upscaled without smoothing.

The quality axis is labelled with :func:`diffmem.metrics.fid.metric_label`: "FID" only for Inception features,
"FD (<extractor>)" otherwise. Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot state).

Public drawing helpers, shared with the theory's figures (:mod:`diffmem.theory.figures`): ``STYLE``,
:func:`new_figure`, :func:`save_figure`, :func:`draw_fit`, :func:`n_colors`.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib as mpl
import matplotlib.image
import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator
from scipy import stats

from diffmem.analysis.runfiles import (PairRecord, RunRecord, find_run_folders, pair_records, read_csv, read_pairs,
                                       read_run, write_figure_index)
from diffmem.analysis.powerlaw import FitSet, PowerLawFit, load_fits
from diffmem.analysis.scaling import level_keys, level_of
from diffmem.figure_checks import INTERVAL_GID
from diffmem.io import atomic_write_bytes
from diffmem.metrics.fid import metric_label
from diffmem.rundir import PAIRS_FILE

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
    """One figure: the files written (PNG and PDF), or why it was skipped (``files`` empty, one line).

    ``figure``: the matplotlib Figure that was written (None when skipped), for checks such as
    :func:`diffmem.figure_checks.figure_problems`; not compared and not shown in the repr."""

    name: str
    files: tuple[Path, ...] = ()
    skipped: str | None = None
    figure: Figure | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ExperimentFiles:
    """What the figures read: summary rows (typed), fits (None when fits.json is absent), each run's metrics and
    the split pairs of pairs.jsonl whose two runs are both in the summary (by pair id; empty without pairs)."""

    directory: Path
    rows: tuple[dict[str, Any], ...]
    fits: dict[str, FitSet] | None
    records: dict[str, RunRecord]
    pairs: dict[str, PairRecord] = field(default_factory=dict)

    @property
    def widths(self) -> list[int]:
        return sorted({r["width"] for r in self.rows})

    @property
    def ns(self) -> list[int]:
        return sorted({r["n"] for r in self.rows})

    def rows_of_width(self, width: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["width"] == width]


def load_experiment_files(experiment_dir: str | Path) -> ExperimentFiles:
    """Read summary.csv, fits.json (if present), the metrics of every run listed in the summary and pairs.jsonl (if
    present)."""
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
    pairs = {k: p for k, p in pair_records(read_pairs(directory)).items()
             if p.run_a in records and p.run_b in records}
    return ExperimentFiles(directory, rows, fits, records, pairs)


# --- helpers --------------------------------------------------------------------------------------------------------

def n_colors(ns: Sequence[int]) -> dict[int, Any]:
    """One viridis colour per N, evenly spaced by rank (dark = small N). Every figure of an experiment passes all of
    its N (:attr:`ExperimentFiles.ns`), so one N has one colour in every figure."""
    cmap = colormaps["viridis"]
    ns = sorted(set(ns))
    return {n: cmap(0.9 * i / max(len(ns) - 1, 1)) for i, n in enumerate(ns)}


def _w_colors(widths: Sequence[int]) -> dict[int, Any]:
    """One tab10 colour per width W, by rank; every figure passes all widths of the experiment."""
    cmap = colormaps["tab10"]
    return {w: cmap(i % 10) for i, w in enumerate(sorted(set(widths)))}


def _quality_label(records: Sequence[RunRecord]) -> str:
    extractors = sorted({e for r in records if (e := r.last_value("fid_extractor")) is not None})
    if len(extractors) == 1:
        return metric_label(extractors[0])
    return "FID / FD (mixed extractors: " + ", ".join(extractors) + ")" if extractors else "FID"


def _mark_interval(*artists: Any) -> None:
    """Mark artists that draw an interval (error bars, 95 % bands) for diffmem.figure_checks."""
    for artist in artists:
        artist.set_gid(INTERVAL_GID)


def tick_text(value: float) -> str:
    """A tick label: plain digits between 0.01 and 99 999 ("0.05", "300", "20000"), else "m x 10^k" in mathtext."""
    if value == 0:
        return "0"
    if 1e-2 <= abs(value) < 1e5:
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)) + 1e-9)
    mantissa = value / 10 ** exponent
    if abs(mantissa - round(mantissa)) < 1e-6 and round(mantissa) == 1:
        return f"$10^{{{exponent}}}$"
    return f"${mantissa:.2g}\\times10^{{{exponent}}}$"


def readable_log_axis(axis: Any, values: Sequence[float] | None = None) -> None:
    """Ticks of a log axis that can be read: at least two labelled ticks and no crowding, set from the axis's final
    view interval (call after the data and the limits are set).

    ``values`` (e.g. the measured N): label exactly these (thinned to at least 1/8 of the span apart, in log), minor
    ticks unlabelled. Otherwise, by the decades spanned: from 3 on, powers of 10 (every k-th when more than 7);
    from 0.9 on, 1, 2 and 5 times powers of 10; below, evenly spaced round numbers (matplotlib's MaxNLocator, which
    is nearly even in log over less than a decade)."""
    lo, hi = sorted(axis.get_view_interval())
    axis.set_minor_formatter(NullFormatter())
    if values is not None and len(set(values)) >= 2:
        vals = sorted(set(float(v) for v in values if lo <= v <= hi))
        span = math.log10(vals[-1] / vals[0]) if vals[0] > 0 else 0.0
        kept = [vals[0]]
        for v in vals[1:]:
            if math.log10(v / kept[-1]) >= span / 8:
                kept.append(v)
        axis.set_major_locator(FixedLocator(kept))
        axis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
        axis.set_minor_locator(NullLocator())
        return
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    if decades >= 3:
        step = max(1, math.ceil(decades / 7))
        major = LogLocator(base=10.0 ** step, subs=(1.0,))
    elif decades >= 0.9:
        major = LogLocator(base=10.0, subs=(1.0, 2.0, 5.0))
    else:
        major = MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10])
    axis.set_major_locator(major)
    axis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
    axis.set_minor_locator(LogLocator(base=10.0, subs="auto") if decades >= 0.9 else NullLocator())


F_MEM_LINTHRESH = 1e-3
"""f_mem axes are symlog, linear below 1e-3 (where the onset of tau_mem lies: a few copies among 1e3-1e4 samples)."""


def f_mem_axis(ax: Any) -> None:
    """A symlog f_mem y axis from 0 to 1, linear below :data:`F_MEM_LINTHRESH`, ticks 0, 0.001, 0.01, 0.1, 1."""
    ax.set_yscale("symlog", linthresh=F_MEM_LINTHRESH, linscale=0.4)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_locator(FixedLocator([0, 1e-3, 1e-2, 1e-1, 1]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylabel(r"$f_\mathrm{mem}$ (fraction copied)")


BIAS_LINTHRESH = 1e-5
"""The bias axis is symlog, linear within +-1e-5: the paired design resolves biases of 1e-5 and less early in
training, and the bias grows over decades from there (results/digits_pairs), which a linear axis flattens to 0."""


def bias_axis(ax: Any, max_ticks: int = 7) -> None:
    """A symlog axis for a split pair's bias (drawn already), linear within +-:data:`BIAS_LINTHRESH`: ticks at 0 and
    at signed powers of ten over the drawn range, every k-th decade so that at most ``max_ticks`` are labelled (a
    panel 2 inches high holds about 7), written as mathematics."""
    ax.set_yscale("symlog", linthresh=BIAS_LINTHRESH, linscale=1.0)
    lo, hi = ax.get_ylim()
    first = int(math.floor(math.log10(BIAS_LINTHRESH)))
    ups = list(range(first, int(math.ceil(math.log10(hi))) + 1)) if hi > BIAS_LINTHRESH else []
    downs = list(range(first, int(math.ceil(math.log10(-lo))) + 1)) if lo < -BIAS_LINTHRESH else []
    step = max(1, math.ceil((len(ups) + len(downs)) / max(max_ticks - 1, 1)))
    ticks = [0.0] + [10.0 ** k for k in ups[::-1][::step]] + [-(10.0 ** k) for k in downs[::-1][::step]]
    ax.yaxis.set_major_locator(FixedLocator(sorted(t for t in ticks if lo <= t <= hi)))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: "0" if v == 0 else ("$-" if v < 0 else "$") + f"10^{{{round(math.log10(abs(v)))}}}$"))
    ax.yaxis.set_minor_locator(NullLocator())


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
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``, each atomically (the PDF without a creation
    date, so that redrawing unchanged data leaves the file unchanged); the result keeps ``fig``."""
    files = []
    for fmt in ("png", "pdf"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, metadata={"CreationDate": None} if fmt == "pdf" else None)
        path = out_dir / f"{name}.{fmt}"
        atomic_write_bytes(path, buffer.getvalue())
        files.append(path)
    return FigureResult(name, tuple(files), figure=fig)


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


def _envelope(rows: Sequence[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """The union of the 95 % intervals of ``key`` over the seeds of one cell (None when no seed has both ends)."""
    pairs = [(r[f"{key}_lo"], r[f"{key}_hi"]) for r in rows
             if r.get(f"{key}_lo") is not None and r.get(f"{key}_hi") is not None and not r.get(f"{key}_censored")]
    if not pairs:
        return None
    return min(p[0] for p in pairs), max(p[1] for p in pairs)


def _legend_by_n(ax, ns: Sequence[int], colors: dict[int, Any], title: str = "N", extra: Sequence[Any] = (),
                 **kwargs) -> None:
    """A legend with one line per N in its colour, then ``extra`` handles (what thin lines, bold lines and bands are).
    With extras the legend has two columns, over which a title would float: each N is then labelled ``N=32``."""
    handles = [Line2D([], [], color=colors[n], label=f"{title}={n}" if extra else str(n)) for n in ns] + list(extra)
    kwargs = {"loc": "best", "ncols": 2 if len(handles) > 5 else 1, **kwargs}
    ax.legend(handles=handles, title=None if extra else title, **kwargs)


def _several_n(data: "ExperimentFiles") -> list[int]:
    """The widths at which at least two N were run (what a figure against N or step / N needs)."""
    return [w for w in data.widths if len({r["n"] for r in data.rows_of_width(w)}) >= 2]


# --- 1. window ------------------------------------------------------------------------------------------------------

def _quality_band(rec: RunRecord) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95 % band of the quality metric per evaluation, +-1.96 standard errors (``fid_boot_std``, else
    ``fid_std``); None when the run recorded neither."""
    fid = rec.series("fid")
    se = rec.series("fid_boot_std")
    se = np.where(np.isfinite(se), se, rec.series("fid_std"))
    if not np.isfinite(se).any():
        return None
    return fid - 1.96 * se, fid + 1.96 * se


@dataclass(frozen=True)
class SeedMean:
    """One metric averaged over the seeds of a cell (same N and W).

    ``steps`` (optimizer steps, shape (m,)): every evaluated step of the seeds inside the range that all of them
    cover; each seed's curve is interpolated there linearly in log step (exact at its own evaluations). ``mean``
    (shape (m,)): the arithmetic mean over the seeds; ``lo``/``hi``: its 95 % Student-t interval over the seeds,
    mean -+ t(0.975, k - 1) * sd / sqrt(k) (None with one seed); ``seeds``: k."""

    steps: np.ndarray
    mean: np.ndarray
    lo: np.ndarray | None
    hi: np.ndarray | None
    seeds: int


def mean_over_seeds(records: Sequence[RunRecord], key: str) -> SeedMean | None:
    """:class:`SeedMean` of the metric ``key`` (a metrics.jsonl column) over ``records``, the seeds of one cell; None
    when no seed has a value or the seeds' step ranges do not overlap."""
    curves = []
    for rec in records:
        steps, y = rec.steps, rec.series(key)
        ok = _finite(steps, y)
        if ok.any():
            curves.append((steps[ok], y[ok]))
    if not curves:
        return None
    start, end = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
    grid = np.unique(np.concatenate([s[(s >= start) & (s <= end)] for s, _ in curves]))
    if not len(grid):
        return None
    values = np.array([np.interp(np.log(grid), np.log(s), y) for s, y in curves])  # (seeds, steps)
    mean = values.mean(axis=0)
    k = len(curves)
    if k < 2:
        return SeedMean(grid, mean, None, None, 1)
    half = stats.t.ppf(0.975, k - 1) * values.std(axis=0, ddof=1) / math.sqrt(k)
    return SeedMean(grid, mean, mean - half, mean + half, k)


SEED_STYLE = dict(lw=0.6, alpha=0.55)
"""Each seed's curve where a cell has several seeds (thin, faint)."""

CELL_MEAN_STYLE = dict(lw=2.0)
"""The cell's mean over seeds (bold)."""


def _run_band(rec: RunRecord | PairRecord, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95 % band of one run's (or split pair's) ``key`` per evaluation: the quality metric's
    :func:`_quality_band`, else the recorded ``{key}_lo`` / ``{key}_hi`` (f_mem's bootstrap interval, a pair's
    measures'); None when not recorded."""
    if key == "fid":
        return _quality_band(rec)
    lo, hi = rec.series(f"{key}_lo"), rec.series(f"{key}_hi")
    return (lo, hi) if (np.isfinite(lo) & np.isfinite(hi)).any() else None


def _clip_band(key: str, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fraction bands (f_mem, own_fraction) inside [0, 1]; quality bands (log axis) no lower than half the curve;
    others as they are."""
    if key in ("f_mem", "own_fraction"):
        return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    if key == "fid":
        return np.maximum(lo, y * 0.5), hi
    return lo, hi


MIN_SEEDS_FOR_MEAN_BAND = 3
"""Seeds a cell needs for the band of its mean: with 2 the 95 % t interval is 12.7 standard errors wide and says
only that two seeds cannot place the mean, so each seed keeps its own band instead."""


def _draw_own_band(ax, rec: RunRecord | PairRecord, key: str, color, per_x: float, alpha: float) -> bool:
    """One run's (or pair's) 95 % band of ``key`` (:func:`_run_band`) against step / ``per_x``; False when none."""
    x, y = rec.steps / per_x, rec.series(key)
    band = _run_band(rec, key)
    if band is None:
        return False
    keep = _finite(x, y) & np.isfinite(band[0]) & np.isfinite(band[1])
    if not keep.any():
        return False
    lo, hi = _clip_band(key, y[keep], band[0][keep], band[1][keep])
    _mark_interval(ax.fill_between(x[keep], lo, hi, color=color, alpha=alpha, lw=0))
    return True


def draw_cell_curves(ax, records: Sequence[RunRecord | PairRecord], key: str, color, *,
                     per_x: float = 1.0) -> tuple[set[str], bool]:
    """The metric ``key`` of one cell (the seeds of one N and W: runs, or split pairs) against step / ``per_x``.

    One seed: its curve with dots and its own 95 % band (:func:`_run_band`). Several seeds: each seed thin
    (:data:`SEED_STYLE`) and their mean bold (:data:`CELL_MEAN_STYLE`); the band is the 95 % t interval of the mean
    over seeds (:func:`mean_over_seeds`) from :data:`MIN_SEEDS_FOR_MEAN_BAND` seeds on, each seed's own band below.
    Returns the kinds of band drawn (a subset of {"run", "each seed", "mean"}) and whether the cell has several
    seeds."""
    drawn = [rec for rec in records if _finite(rec.steps, rec.series(key)).any()]
    if len(drawn) == 1:
        rec = drawn[0]
        x, y = rec.steps / per_x, rec.series(key)
        ok = _finite(x, y)
        ax.plot(x[ok], y[ok], color=color, marker=".", ms=2.5)
        return ({"run"} if _draw_own_band(ax, rec, key, color, per_x, 0.25) else set()), False
    for rec in drawn:
        x, y = rec.steps / per_x, rec.series(key)
        ok = _finite(x, y)
        ax.plot(x[ok], y[ok], color=color, **SEED_STYLE)
    cell = mean_over_seeds(drawn, key)
    if cell is None:
        return set(), len(drawn) > 1
    ax.plot(cell.steps / per_x, cell.mean, color=color, **CELL_MEAN_STYLE)
    if cell.seeds < MIN_SEEDS_FOR_MEAN_BAND:
        own = [_draw_own_band(ax, rec, key, color, per_x, 0.15) for rec in drawn]
        return ({"each seed"} if any(own) else set()), True
    lo, hi = _clip_band(key, cell.mean, cell.lo, cell.hi)
    _mark_interval(ax.fill_between(cell.steps / per_x, lo, hi, color=color, alpha=0.25, lw=0))
    return {"mean"}, True


def _curve_legend_extras(bands: set[str], seeded: bool, band_label: str = "95 % interval") -> list[Line2D]:
    """Legend entries for what :func:`draw_cell_curves` drew: with seeds the thin and bold lines, then each kind of
    band in ``bands`` ("run": ``band_label``; "each seed"; "mean": of the mean over seeds)."""
    extra = []
    if seeded:
        extra += [Line2D([], [], color="0.3", **SEED_STYLE, label="each seed"),
                  Line2D([], [], color="0.3", **CELL_MEAN_STYLE, label="mean over seeds")]
    texts = {"run": band_label, "each seed": f"{band_label} of each seed (fewer than {MIN_SEEDS_FOR_MEAN_BAND} seeds)",
             "mean": "95 % interval of the mean (t, over seeds)"}
    extra += [Line2D([], [], color="0.5", lw=5, alpha=0.3, label=texts[k]) for k in ("run", "each seed", "mean")
              if k in bands]
    return extra


def _mark_tau_bias(ax, pair_rows: Sequence[dict[str, Any]], y: float, color) -> str:
    """tau_bias of one cell's split pairs (summary rows, one per pair) at height ``y`` of the window strip: the
    median of the measured ones as a diamond with the union of their brackets as a whisker; when all are censored,
    the median bound as an open triangle pointing where tau_bias lies ('>' lower bound, '<' upper bound). Returns
    what was drawn: "measured" or "bound"."""
    measured = [r for r in pair_rows if not r.get("tau_bias_censored")]
    if measured:
        value = _median([r["tau_bias"] for r in measured])
        env = _envelope(measured, "tau_bias")
        xerr = None if env is None else [[max(value - env[0], 0)], [max(env[1] - value, 0)]]
        container = ax.errorbar([value], [y], xerr=xerr, color="0.15", marker="D", mfc=color, mec="black", ms=4.5,
                                ls="none", capsize=2, elinewidth=0.8, zorder=5)
        if xerr is not None:
            _mark_interval(*container.lines[2])
        return "measured"
    lower = [r["tau_bias"] for r in pair_rows if r.get("tau_bias_hi") is None]
    bounds = lower or [r["tau_bias"] for r in pair_rows]
    ax.plot([_median(bounds)], [y], marker=">" if lower else "<", mfc="none", mec=color, ms=5, ls="none", zorder=5)
    return "bound"


def plot_window(data: ExperimentFiles, width: int, out_dir: Path) -> FigureResult:
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
                _mark_interval(*container.lines[2])
        pair_rows = list({r["pair"]: r for r in cell if r.get("pair") and r.get("tau_bias") is not None}.values())
        if pair_rows:  # only cells with split pairs: the window figure of an experiment without pairs is unchanged
            bias_marks.add(_mark_tau_bias(ax_win, pair_rows, i - 0.2, colors[n]))
            gap = _median([r.get("tau_gap") for r in cell if r.get("pair") and not r.get("tau_gap_censored")])
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
        ax_fid.set_ylabel(_quality_label(records) + "\n(lower is better)")  # two lines: "FD (<extractor>)" is long
        ax_fid.set_title(f"W = {width}")
        _legend_by_n(ax_fid, ns, colors, extra=_curve_legend_extras(fid_band, seeded))
    if ax_mem is not None:
        f_mem_axis(ax_mem)
        if ax_fid is None:
            ax_mem.set_title(f"W = {width}")
            _legend_by_n(ax_mem, ns, colors, extra=_curve_legend_extras(mem_band, seeded))
        elif mem_band:
            ax_mem.legend(handles=_curve_legend_extras(mem_band, False), loc="upper left")  # the bands only
    ax_win.set_xlabel("training step")
    fig.canvas.draw()  # final limits before choosing ticks
    readable_log_axis(ax_win.xaxis)
    if ax_fid is not None:
        readable_log_axis(ax_fid.yaxis)
    return save_figure(fig, out_dir, name)


# --- 2. collapse ----------------------------------------------------------------------------------------------------

def plot_collapse(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """f_mem (symlog, with its 95 % band) against step / N, one panel per width that has at least two N (several seeds:
    each thin, their mean bold, as in :func:`plot_window`); the x axis starts at half the earliest onset interval's lower end (tau_mem_lo / N), where the curves leave 0."""
    with_mem = [w for w in _several_n(data)
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
                ok = _finite(rec.steps, rec.series("f_mem"))
                if ok.any():
                    ends.append(float(rec.steps[ok][-1] / n))
                if row.get("tau_mem_lo") is not None and not row.get("tau_mem_censored"):
                    starts.append(row["tau_mem_lo"] / n)
        ax.set_xscale("log")
        if starts and ends and min(starts) / 2 < max(ends):
            ax.set_xlim(min(starts) / 2, max(ends) * 1.2)
        ax.set_xlabel(r"training step / $N$ (steps per training image)")
        ax.set_title(f"W = {w}")
        _legend_by_n(ax, ns, colors, extra=_curve_legend_extras(band, seeded), loc="upper center",
                     bbox_to_anchor=(0.5, -0.24), ncols=2 if seeded else 3)
    f_mem_axis(axes[0])
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
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
            container = ax.errorbar([x], [y], yerr=yerr, color=color, marker=marker, ls="none", capsize=2,
                                    elinewidth=0.8, **style)
            if yerr is not None:
                _mark_interval(*container.lines[2])
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
    _mark_interval(ax.fill_between(xs, lo / scale, hi / scale, color=color, alpha=0.15, lw=0))
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


def _save_law_figure(fig: Figure, axes: Sequence[Any], xs: Sequence[float], out_dir: Path, name: str) -> FigureResult:
    """Readable log ticks (x at ``xs``, the grid's N or W) on every panel once the layout is drawn, then save."""
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis, xs)
        readable_log_axis(ax.yaxis)
    return save_figure(fig, out_dir, name)


PAPER_EXPONENT_N = {"tau_mem": 1.0, "tau_gen": 0.0}
"""The paper's laws against N: tau_mem ~ N (also each level crossing), tau_gen independent of N."""


def plot_scaling(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """tau_mem (its onset, then each level crossing tau_mem_at_L of summary.csv) and tau_gen against N per width
    that has at least two N, with the fitted laws, their 95 % bands, goodness of fit and the paper's slope (1 for
    tau_mem, 0 for tau_gen) through the points' centroid for reference."""
    widths = _several_n(data)
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
    colors = _w_colors(data.widths)
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
    return _save_law_figure(fig, axes, ns, out_dir, "scaling")


# --- 4. width -------------------------------------------------------------------------------------------------------

PAPER_EXPONENT_W = {"tau_gen": -1.0, "tau_mem": -1.0}
"""The paper's laws against the width W: tau_gen ~ 1/W and tau_mem / N ~ 1/W."""


def plot_width(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """tau_gen and tau_mem / N against W, per N, when several widths exist: the points with their 95 % intervals,
    the fitted laws (tau_gen pooled over N, tau_mem per N divided by N) with their bands and the paper's 1/W through
    the points' centroid."""
    if len(data.widths) < 2:
        return FigureResult("width", skipped=f"only one width ({data.widths[0]}): nothing to plot against W")
    panels = _present(data, (("tau_gen", r"$\tau_\mathrm{gen}$ (steps)", lambda r: 1.0),
                             ("tau_mem", r"$\tau_\mathrm{mem} / N$ (steps per image)",
                              lambda r: float(r["n"]))))
    if not panels:
        return FigureResult("width", skipped="no tau_gen and no tau_mem in summary.csv")
    fig, axes = new_figure(len(panels), size=(3.4, 3.2))
    colors = n_colors(data.ns)
    for ax, (key, label, scale) in zip(axes, panels):
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
            if key == "tau_mem" and data.fits is not None and len({r["width"] for r in rows}) >= 2:
                text = draw_fit(ax, data.fits["tau_mem_vs_width"].groups.get(str(n)), colors[n], "W", scale=n)
                if text:
                    handles.append(Line2D([], [], color=colors[n], label=f"N={n}: {text}"))
        handles = [Line2D([], [], color=colors[n], marker="o", ls="none", label=f"N={n}") for n in data.ns] + handles
        fit = data.fits["tau_gen_vs_width"].pooled if (key == "tau_gen" and data.fits is not None) else None
        text = draw_fit(ax, fit, "0.2", "W")
        if text:
            handles.append(Line2D([], [], color="0.2", label=text + (" (all N)" if len(data.ns) > 1 else "")))
        if any("[" in h.get_label() for h in handles):
            handles.append(_band_entry())
        reference = draw_reference(ax, xs, ys, PAPER_EXPONENT_W[key],
                                   r"paper: $\propto 1/W$ (through the points' centroid)")
        handles += [reference] if reference else []
        _finish_law_panel(ax, handles, data.rows, key, "base width $W$ (channels)", label, all_ys, 1.6)
    return _save_law_figure(fig, axes, data.widths, out_dir, "width")


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
    tau_gen = _median(measured) if measured else _median(bounds)
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


def plot_phase(data: ExperimentFiles, out_dir: Path, *, threshold: float | None = None,
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
        return _phase_plane(data, with_p, out_dir, threshold, times)
    return _phase_strips(data, with_p, out_dir, threshold, by_n=len(ns) >= 2)


def _phase_plane(data: ExperimentFiles, with_p: Sequence[dict[str, Any]], out_dir: Path, threshold: float | None,
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
    return save_figure(fig, out_dir, "phase")


def _phase_strips(data: ExperimentFiles, with_p: Sequence[dict[str, Any]], out_dir: Path, threshold: float | None,
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
    return save_figure(fig, out_dir, "phase")


# --- 6. loss gap ----------------------------------------------------------------------------------------------------

def plot_loss_gap(data: ExperimentFiles, out_dir: Path) -> FigureResult:
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
                ok = _finite(steps, y) & (y > 0)
                ax.plot(steps[ok], y[ok], color=colors[row["n"]], ls=ls)
            gap = row.get("tau_gap")
            test = rec.series("test_loss")
            ok = _finite(steps, test) & (test > 0)
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
    return save_figure(fig, out_dir, "loss_gap")


# --- 7. split pairs ------------------------------------------------------------------------------------------------

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
    ok = _finite(steps, y)
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
            _mark_interval(*container.lines[2])
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


def plot_pairs(data: ExperimentFiles, out_dir: Path) -> FigureResult:
    """The split pairs' measures (pairs.jsonl) against the step: bias with its 95 % band and a line at 0, pair
    distance with its band, own fraction with a line at 0.5; rows sharing the step axis, one column per width, one
    colour per N, a cell with several seeds drawn as in :func:`plot_window` (:func:`draw_cell_curves`). Each pair's
    tau_bias with its bracket, and its members' tau_gen and tau_mem, are marked on its bias curve
    (:func:`_mark_pair_timescales`). Skipped without pairs.jsonl."""
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
    extra = _curve_legend_extras(band, seeded)
    if bias_levels:
        extra.append(Line2D([], [], color="0.35", ls="--", lw=0.7,
                            label="bias levels " + ", ".join(f"{v:g}" for v in bias_levels)
                            + r" (their crossings $\tau_\mathrm{bias}$ at L: summary.csv)"))
    names = {"tau_bias": r"$\tau_\mathrm{bias}$ (bar: bracket)", "tau_gen": r"$\tau_\mathrm{gen}$ of each run",
             "tau_mem": r"$\tau_\mathrm{mem}$ of each run"}
    extra += [Line2D([], [], ls="none", color="0.3", mec="0.3", mfc="0.3" if k == "tau_bias" else "white",
                     label=names[k], **{a: v for a, v in PAIR_MARKERS[k].items() if a not in ("mec", "mfc")})
              for k in PAIR_MARKERS if k in marks]
    if "bound" in marks:
        extra.append(Line2D([], [], ls="none", marker=">", mfc="none", mec="0.3",
                            label=r"$\tau_\mathrm{bias}$ censored (points where it lies)"))
    _legend_by_n(fig, sorted({p.n for p in pairs}), colors, extra=extra, loc="outside lower center",
                 ncols=2 if cols == 1 else 3, fontsize=6)
    fig.canvas.draw()
    for ax in axes[-cols:]:
        readable_log_axis(ax.xaxis)
    return save_figure(fig, out_dir, "pairs")


# --- 8. memorization gallery ---------------------------------------------------------------------------------------

GALLERY_PHASES = ("before tau_gen", "inside the window", "after tau_mem")
"""The three checkpoints of a gallery (keys of :func:`gallery_steps`)."""

GALLERY_WIDTH_PX = 1200
"""A gallery panel is upscaled by the integer factor that brings the stored grid nearest this width (pixels)."""


def grid_steps(record: RunRecord) -> list[int]:
    """The steps (optimizer steps, increasing) at which the run folder holds a stored sample grid
    ``samples/step_XXXXXXXXX.png`` (diffmem.samplegrid)."""
    folder = record.path / "samples"
    steps = []
    for path in folder.glob("step_*.png") if folder.is_dir() else ():
        digits = path.stem[len("step_"):]
        if digits.isdigit():
            steps.append(int(digits))
    return sorted(steps)


def _nearest_in_log(steps: Sequence[int], target: float) -> int | None:
    return min(steps, key=lambda s: abs(math.log(s / target))) if steps else None


def usable_timescales(row: dict[str, Any]) -> str | None:
    """Why a summary row's timescales cannot place a gallery's checkpoints (None: they can): tau_gen and tau_mem must
    both be measured, not censored."""
    for key in ("tau_gen", "tau_mem"):
        if row.get(key) is None:
            return f"no {key}"
        if row.get(f"{key}_censored"):
            bound = "lower" if row.get(f"{key}_hi") is None else "upper"
            return f"{key} is censored (only a {bound} bound, {row[key]:.4g} steps)"
    return None


def gallery_steps(steps: Sequence[int], row: dict[str, Any]) -> dict[str, int | None]:
    """The stored grid shown for each of :data:`GALLERY_PHASES` (None: no stored grid in that range), from a
    summary row whose tau_gen and tau_mem are measured (:func:`usable_timescales`); ``steps``: the grids' steps.

    - before tau_gen: among the grids before tau_gen's interval (step < ``tau_gen_lo``), the one nearest in log step
      to the log-middle of [first grid, tau_gen_lo] (a model still learning, not an untrained one);
    - inside the window: among the grids in [tau_gen, tau_mem], the one nearest the window's log-middle
      sqrt(tau_gen * tau_mem) (None when tau_mem <= tau_gen: no window);
    - after tau_mem: the last grid, if it lies at or after ``tau_mem_hi`` (the first evaluation with detectable
      copies), so that it shows memorization at its most developed."""
    steps = sorted(steps)
    gen, mem = row["tau_gen"], row["tau_mem"]
    gen_lo = row.get("tau_gen_lo") or gen
    mem_hi = row.get("tau_mem_hi") or mem
    before = [s for s in steps if s < gen_lo]
    inside = [s for s in steps if gen <= s <= mem]
    return {
        "before tau_gen": _nearest_in_log(before, math.sqrt(before[0] * gen_lo)) if before else None,
        "inside the window": _nearest_in_log(inside, math.sqrt(gen * mem)) if inside and gen < mem else None,
        "after tau_mem": steps[-1] if steps and steps[-1] >= mem_hi else None,
    }


def _evaluation_at(record: RunRecord, step: int) -> dict[str, Any]:
    return next((e for e in record.evaluations if int(e["step"]) == step), {})


GALLERY_TITLES = {"before tau_gen": r"before $\tau_\mathrm{gen}$", "inside the window": "inside the window",
                  "after tau_mem": r"after $\tau_\mathrm{mem}$"}


def _panel_title(phase: str, step: int, evaluation: dict[str, Any]) -> str:
    f, lo, hi = (evaluation.get(k) for k in ("f_mem", "f_mem_lo", "f_mem_hi"))
    text = f"{GALLERY_TITLES[phase]}: step {step}"
    if f is not None:
        text += f", $f_\\mathrm{{mem}}$ = {f:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None
                                                    else "")
        if evaluation.get("n_samples"):
            text += f" of {evaluation['n_samples']} samples"
    return text


def plot_gallery(data: ExperimentFiles, n: int, width: int, out_dir: Path) -> FigureResult:
    """The memorization gallery of one cell (N, W): the stored sample grids of one of its runs at the three
    checkpoints of :func:`gallery_steps`, one panel each (titled with its step and f_mem with its 95 % interval),
    upscaled by an integer factor without smoothing (nearest neighbour). The run is the cell's lowest seed that has
    stored grids and measured tau_gen and tau_mem; skipped with a reason when none has."""
    name = f"gallery_n{n:05d}_w{width:02d}"
    rows = sorted((r for r in data.rows if r["n"] == n and r["width"] == width), key=lambda r: r["seed"])
    reasons = []
    for row in rows:
        record = data.records[row["run"]]
        steps = grid_steps(record)
        why = "no stored sample grids (samples/step_*.png)" if not steps else usable_timescales(row)
        if why is None:
            chosen = gallery_steps(steps, row)
            if any(chosen.values()):
                return _draw_gallery(record, row, chosen, out_dir, name)
            why = "no stored grid before tau_gen, inside the window or after tau_mem"
        reasons.append(f"{row['run']}: {why}")
    return FigureResult(name, skipped="; ".join(reasons))


def _draw_gallery(record: RunRecord, row: dict[str, Any], chosen: dict[str, int | None], out_dir: Path,
                  name: str) -> FigureResult:
    images = {phase: mpl.image.imread(record.path / "samples" / f"step_{step:09d}.png")
              for phase, step in chosen.items() if step is not None}
    height, grid_width = next(iter(images.values())).shape[:2]
    scale = max(1, round(GALLERY_WIDTH_PX / grid_width))
    fig_width = 7.0
    panel_height = fig_width * height / grid_width + 0.35
    fig = Figure(figsize=(fig_width, len(chosen) * panel_height + 0.7), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(chosen), 1, squeeze=False).ravel().tolist()
    for ax, (phase, step) in zip(axes, chosen.items()):
        ax.set_axis_off()
        if step is None:
            ax.text(0.5, 0.5, f"{phase}: no stored sample grid in that range", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="0.3")
            continue
        big = np.repeat(np.repeat(images[phase], scale, axis=0), scale, axis=1)
        ax.imshow(big, interpolation="nearest")
        ax.set_title(_panel_title(phase, step, _evaluation_at(record, step)), fontsize=8, loc="left")
    threshold = record.mem_threshold if record.mem_threshold is not None else 1 / 3
    fig.suptitle(f"{record.name}: N = {row['n']}, W = {row['width']}; $\\tau_\\mathrm{{gen}}$ = {row['tau_gen']:.0f}, "
                 f"$\\tau_\\mathrm{{mem}}$ = {row['tau_mem']:.0f} steps\n"
                 f"rows of samples, each above its nearest training image; red frame: a copy "
                 f"($d_1/d_2 < {threshold:.2g}$)", fontsize=8)
    return save_figure(fig, out_dir, name)


def plot_galleries(data: ExperimentFiles, out_dir: Path) -> list[FigureResult]:
    """One :func:`plot_gallery` per cell (N, W); one skipped result named ``gallery`` when no run of the experiment
    has stored sample grids."""
    if not any(grid_steps(rec) for rec in data.records.values()):
        return [FigureResult("gallery", skipped="no run has stored sample grids (samples/step_*.png)")]
    cells = sorted({(r["n"], r["width"]) for r in data.rows}, key=lambda c: (c[1], c[0]))
    return [plot_gallery(data, n, w, out_dir) for n, w in cells]


# --- all ------------------------------------------------------------------------------------------------------------

def make_figures(experiment_dir: str | Path, *, out_dir: str | Path | None = None,
                 phase_threshold: float | None = None,
                 phase_times: Sequence[float] | None = None) -> list[FigureResult]:
    """Draw every figure of ``experiment_dir`` (after `diffmem analyze`) into ``out_dir`` (default
    ``experiment_dir/figures``) and list them, drawn or skipped with the reason, in ``out_dir/index.json``
    (diffmem.analysis.runfiles.FIGURE_INDEX, read by the report page); each result keeps its Figure. ``phase_threshold``: see :func:`memorizing_at`
    (None: tau_mem's rule); ``phase_times``: the training times (steps) of the (N, p) panels."""
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
        results.append(plot_pairs(data, out_dir))
        results += plot_galleries(data, out_dir)
    write_figure_index(out_dir, ((r.name, [p.name for p in r.files], r.skipped) for r in results))
    return results
