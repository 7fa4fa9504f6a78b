"""What every figure shares: the matplotlib settings (:data:`STYLE`), the figure and its panels (:func:`new_figure`,
drawn off-screen on the Agg canvas, no pyplot state), the colours of N and W, the readable log, f_mem and bias axes,
the legend by N, the interval mark that :mod:`diffmem.figures.checks` looks for, and the writing of a figure as PNG
and PDF (:class:`FigureOutput`, one :class:`FigureResult` per figure).

Used by every figure module of :mod:`diffmem.figures` and by the theory's figures (:mod:`diffmem.theory.figures`).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

from diffmem.figures.checks import INTERVAL_GID
from diffmem.io import OutsideFolder, atomic_write_bytes

STYLE = {
    "font.size": 8, "axes.labelsize": 9, "axes.titlesize": 9, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "lines.linewidth": 1.2, "lines.markersize": 4, "axes.grid": True, "grid.alpha": 0.25,
    "legend.frameon": False, "savefig.dpi": 200, "pdf.fonttype": 42,
}
"""matplotlib settings for paper-sized figures (single column about 3.4 in wide)."""

PANEL = (3.4, 2.6)  # inches per panel


@dataclass(frozen=True)
class FigureResult:
    """One figure: the files written (PNG, and PDF unless left out), or why it was skipped (``files`` empty, one line).

    ``figure``: the matplotlib Figure that was written (None when skipped), for checks such as
    :func:`diffmem.figures.checks.figure_problems`; not compared and not shown in the repr."""

    name: str
    files: tuple[Path, ...] = ()
    skipped: str | None = None
    figure: Figure | None = field(default=None, compare=False, repr=False)


def n_colors(ns: Sequence[int]) -> dict[int, Any]:
    """One viridis colour per N, evenly spaced by rank (dark = small N). Every figure of an experiment passes all of
    its N (:attr:`diffmem.figures.experiment_files.ExperimentFiles.ns`), so one N has one colour in every figure."""
    cmap = colormaps["viridis"]
    ns = sorted(set(ns))
    return {n: cmap(0.9 * i / max(len(ns) - 1, 1)) for i, n in enumerate(ns)}


def width_colors(widths: Sequence[int]) -> dict[int, Any]:
    """One tab10 colour per width W, by rank; every figure passes all widths of the experiment."""
    cmap = colormaps["tab10"]
    return {w: cmap(i % 10) for i, w in enumerate(sorted(set(widths)))}


def mark_interval(*artists: Any) -> None:
    """Mark artists that draw an interval (error bars, 95 % bands) for diffmem.figures.checks."""
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


@dataclass(frozen=True)
class FigureOutput:
    """Where figures are written and in which formats: ``directory/name.png`` always (200 dpi; report.md shows it),
    and ``directory/name.pdf`` unless ``pdf`` is False (Type 42 fonts, for papers; about half of `diffmem analyze`'s
    time: docs/performance.md)."""

    directory: Path
    pdf: bool = True

    def save(self, fig: Figure, name: str) -> FigureResult:
        """Write ``fig`` as PNG and, with ``pdf``, PDF, each atomically (the PDF without a creation date, so that
        redrawing unchanged data leaves the file unchanged); without ``pdf``, an older ``name.pdf`` is removed, so
        that no PDF in ``directory`` is older than its PNG. The result keeps ``fig``."""
        if self.directory.is_symlink():  # writing and deleting there would change the link's target
            raise OutsideFolder(f"{self.directory} is a symbolic link; diffmem draws figures only into a real folder "
                                "of the analysis: replace the link by a folder (or move it out), then rerun")
        files = []
        for fmt in ("png", "pdf") if self.pdf else ("png",):
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, metadata={"CreationDate": None} if fmt == "pdf" else None)
            path = self.directory / f"{name}.{fmt}"
            atomic_write_bytes(path, buffer.getvalue())
            files.append(path)
        if not self.pdf:
            (self.directory / f"{name}.pdf").unlink(missing_ok=True)
        return FigureResult(name, tuple(files), figure=fig)


def finite_points(x: np.ndarray, *ys: np.ndarray) -> np.ndarray:
    """The mask (shape of ``x``) of the points that can be drawn against a log x axis: x finite and positive, every
    y in ``ys`` (same shape) finite."""
    ok = np.isfinite(x) & (x > 0)
    for y in ys:
        ok &= np.isfinite(y)
    return ok


def legend_by_n(ax, ns: Sequence[int], colors: dict[int, Any], title: str = "N", extra: Sequence[Any] = (),
                **kwargs) -> None:
    """A legend with one line per N in its colour, then ``extra`` handles (what thin lines, bold lines and bands are).
    With extras the legend has two columns, over which a title would float: each N is then labelled ``N=32``."""
    handles = [Line2D([], [], color=colors[n], label=f"{title}={n}" if extra else str(n)) for n in ns] + list(extra)
    kwargs = {"loc": "best", "ncols": 2 if len(handles) > 5 else 1, **kwargs}
    ax.legend(handles=handles, title=None if extra else title, **kwargs)
