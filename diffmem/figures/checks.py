"""Mechanical readability checks of a drawn matplotlib figure (what a referee would see at a glance).

:func:`figure_problems` draws the figure on its canvas (Agg, off-screen) and returns one line per problem found:

- two tick labels of one axis overlap (their window extents, in display pixels, intersect), major and minor labels
  together, counting only the labels drawn (non-empty text, inside the axes along that axis);
- a log (or symlog) axis with fewer than two labelled ticks, so that its scale cannot be read (an axis whose tick
  labels are switched off, as on the inner panels of shared axes, is exempt);
- an axis that shows tick labels but has no axis label;
- an axis label or title that sticks out of the figure (cut off in the file);
- a text that writes a code name of the suite (``tau_gen``, ``f_mem_lo``, ...) in plain letters instead of as
  mathematics (``$\\tau_\\mathrm{gen}$``), as a legend entry copied from a dictionary key would;
- ``expect_intervals`` and no interval drawn: diffmem.figures marks every interval it draws (error bars, 95 % bands)
  with the artist gid :data:`INTERVAL_GID`; a marked artist counts when it is visible.

Used by tests/test_figures.py on every figure of `diffmem analyze`; also usable on any Figure, e.g.
``figure_problems(result.figure)`` for a :class:`diffmem.figures.FigureResult`.
"""
from __future__ import annotations

import re
from typing import Any

from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.text import Text

INTERVAL_GID = "interval"
"""The gid that diffmem.figures gives every artist that draws an interval (error bar or band)."""


def drawn_tick_labels(axis: Any, renderer: Any) -> list[Any]:
    """The tick labels (major and minor) of ``axis`` that the last draw showed: visible, non-empty, centred inside the
    axes along that axis (1 px tolerance)."""
    ax = axis.axes
    box = ax.get_window_extent(renderer)
    horizontal = axis.axis_name == "x"
    lo, hi = (box.x0, box.x1) if horizontal else (box.y0, box.y1)
    labels = []
    for label in axis.get_ticklabels(which="both"):
        if not label.get_visible() or not label.get_text().strip():
            continue
        extent = label.get_window_extent(renderer)
        centre = (extent.x0 + extent.x1) / 2 if horizontal else (extent.y0 + extent.y1) / 2
        if lo - 1 <= centre <= hi + 1:
            labels.append(label)
    return labels


def _overlaps(labels: list[Any], renderer: Any) -> list[tuple[str, str]]:
    boxes = [(label.get_text(), label.get_window_extent(renderer)) for label in labels]
    pairs = []
    for i, (text_a, a) in enumerate(boxes):
        for text_b, b in boxes[i + 1:]:
            if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1:
                pairs.append((text_a, text_b))
    return pairs


def _inside(text: Any, fig: Figure, renderer: Any) -> bool:
    box, page = text.get_window_extent(renderer), fig.bbox
    return box.x0 >= page.x0 - 1 and box.y0 >= page.y0 - 1 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1


CODE_NAME = re.compile(r"\b(?:tau_[a-z]+|f_mem\w*)\b")
"""Names from the suite's files (summary.csv columns, metric keys) that a figure should write as mathematics."""


def code_names(text: str) -> list[str]:
    """The code names (:data:`CODE_NAME`) that ``text`` writes outside its mathtext ``$...$`` segments."""
    plain = re.split(r"(?<!\\)\$", text)[::2]  # even pieces lie outside $...$
    return [m for piece in plain for m in CODE_NAME.findall(piece)]


def _interval_artists(fig: Figure) -> list[Artist]:
    return [a for a in fig.findobj(lambda a: a.get_gid() == INTERVAL_GID) if a.get_visible()]


def figure_problems(fig: Figure, *, expect_intervals: bool = False, name: str = "figure") -> list[str]:
    """Draw ``fig`` and return its readability problems, one line each (empty: none found); ``name`` prefixes each
    line."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for k, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        where = f"{name}, axes {k}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        for axis in (ax.xaxis, ax.yaxis):
            labels = drawn_tick_labels(axis, renderer)
            texts = [label.get_text() for label in labels]
            for a, b in _overlaps(labels, renderer):
                problems.append(f"{where}: {axis.axis_name} tick labels {a!r} and {b!r} overlap")
            switched_off = not any(label.get_visible() for label in axis.get_ticklabels(which="both"))
            if axis.get_scale() in ("log", "symlog") and len(labels) < 2 and not switched_off:
                problems.append(f"{where}: {axis.get_scale()} {axis.axis_name} axis has {len(labels)} labelled "
                                f"tick(s) {texts}; its scale cannot be read")
            if labels and not axis.get_label().get_text().strip():
                problems.append(f"{where}: {axis.axis_name} axis shows ticks {texts[:3]} but has no label")
        titles = [getattr(ax, a, None) for a in ("title", "_left_title", "_right_title")]  # matplotlib keeps 3
        for text in [ax.xaxis.get_label(), ax.yaxis.get_label()] + [t for t in titles if t is not None]:
            if text.get_visible() and text.get_text().strip() and not _inside(text, fig, renderer):
                problems.append(f"{where}: {text.get_text()!r} is cut off by the figure's edge")
    seen = set()
    for text in fig.findobj(Text):
        content = text.get_text()
        if text.get_visible() and content not in seen and (names := code_names(content)):
            seen.add(content)
            problems.append(f"{name}: {content!r} writes {', '.join(names)} in plain letters, not as mathematics")
    if expect_intervals and not _interval_artists(fig):
        problems.append(f"{name}: its data has intervals but none is drawn")
    return problems
