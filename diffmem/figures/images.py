"""The figures of which training images are copied, and when (issue 43), drawn from the analysis's files only:
fits.json's ``images`` section, ``images/<run>.csv`` (:mod:`diffmem.analysis.images`) and, for the gallery, the
run's train set rebuilt from its config. Nothing is drawn for an experiment without copies.jsonl.

- ``copied_fraction``: the fraction of the training set copied by an evaluation's samples against the step, per N
  the mean over the cell's seeds with its 95 % bootstrap band, one panel per width;
- ``first_copy``: each training image's first-copy step against the descriptor with the largest mean |rho| over
  the cells (every seed of every cell of the width, one panel per width, log step axis); images never copied are
  drawn as open markers at the right edge;
- ``copied_images_n{N:05d}_w{W:02d}``: per cell, the first and the last training images to be copied by its lowest
  seed, each with its first-copy step, beside its first copy (the strip ``samples/first_copies_step_*.png`` of that
  step, :func:`first_copy_tiles`); runs written before the strips show the training images alone.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from diffmem.analysis.images import DENSITY_K, IMAGES_DIR, train_pixels
from diffmem.analysis.runfiles import read_csv, read_json
from diffmem.figures.experiment_files import ExperimentFiles
from diffmem.rundir import RunDir
from diffmem.figures.style import (FigureOutput, FigureResult, finite_points, legend_by_n, mark_interval, n_colors,
                                   new_figure, readable_log_axis)

AXIS_LABELS = {"nn_train_distance": "distance to the nearest\nother training image",
               "nn_heldout_distance": "distance to the nearest\nheld-out image",
               "knn_distance": f"mean distance to the {DENSITY_K}\nnearest training images"}
"""The descriptor axis's label, on two lines (a panel is 2.6 inches high)."""
GALLERY_IMAGES = 8
"""Training images per row of a gallery of copied images (the first and the last to be copied)."""
NEVER_FACTOR = 1.8
"""Images never copied are drawn at this factor times the last evaluated step of the panel."""


def images_section(data: ExperimentFiles) -> dict[str, Any] | None:
    """fits.json's ``images`` section of the experiment (None: no run has copies.jsonl, or no fits.json)."""
    path = data.directory / "fits.json"
    section = read_json(path).get("images") if path.is_file() else None
    return section if isinstance(section, dict) else None


def _tables(data: ExperimentFiles, section: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    folder = data.directory / section.get("folder", IMAGES_DIR)
    return {run: read_csv(folder / f"{run}.csv") for run in section.get("runs", {})
            if run in data.records and (folder / f"{run}.csv").is_file()}


def plot_copied_fraction(data: ExperimentFiles, section: dict[str, Any], out: FigureOutput) -> FigureResult:
    """The copied fraction of the training set against the step: one panel per width, per N the cell's mean over
    seeds with its 95 % band (fits.json's ``images.cells[].copied_fraction``)."""
    cells = [c for c in section.get("cells", []) if c.get("copied_fraction", {}).get("step")]
    if not cells:
        return FigureResult("copied_fraction", skipped="no base evaluation in copies.jsonl")
    widths = sorted({c["width"] for c in cells})
    fig, axes = new_figure(len(widths), sharey=True)
    colors = n_colors(data.ns)
    for ax, w in zip(axes, widths):
        ns = []
        for cell in sorted((c for c in cells if c["width"] == w), key=lambda c: c["n"]):
            curve = cell["copied_fraction"]
            steps = np.asarray(curve["step"], float)
            mean = np.asarray(curve["mean"], float)
            lo = np.array([np.nan if v is None else v for v in curve["lo"]], float)
            hi = np.array([np.nan if v is None else v for v in curve["hi"]], float)
            ok = finite_points(steps, mean)
            if not ok.any():
                continue
            ns.append(cell["n"])
            ax.plot(steps[ok], mean[ok], color=colors[cell["n"]], marker=".")
            band = ok & np.isfinite(lo) & np.isfinite(hi)
            mark_interval(ax.fill_between(steps[band], lo[band], hi[band], color=colors[cell["n"]], alpha=0.25,
                                          lw=0))
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("training step")
        ax.set_title(f"W = {w}")
        if ns:
            legend_by_n(ax, ns, colors, loc="upper left")
    axes[0].set_ylabel("fraction of the training set copied")
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    return out.save(fig, "copied_fraction")


def strongest_descriptor(section: dict[str, Any]) -> str | None:
    """The descriptor with the largest mean |rho| (pooled per cell) over the cells where it is defined; None when
    no correlation is."""
    scores = {}
    for name in section.get("descriptors", []):
        values = [abs(c["correlations"][name]["rho"]) for c in section.get("cells", [])
                  if c.get("correlations", {}).get(name, {}).get("rho") is not None]
        if values:
            scores[name] = float(np.mean(values))
    return max(scores, key=scores.get) if scores else None


def plot_first_copy(data: ExperimentFiles, section: dict[str, Any], tables: dict[str, list[dict[str, Any]]],
                    out: FigureOutput) -> FigureResult:
    """First-copy step (log) against the strongest descriptor (:func:`strongest_descriptor`), every image of every
    seed, coloured by N, one panel per width; never-copied images as open markers at :data:`NEVER_FACTOR` times the
    panel's last evaluated step."""
    name = strongest_descriptor(section)
    if name is None:
        return FigureResult("first_copy", skipped="no rank correlation is defined (no image copied, or no "
                                                  "descriptors)")
    runs = [r for r in tables if any(row.get(name) is not None for row in tables[r])]
    widths = sorted({data.records[r].width for r in runs})
    if not widths:
        return FigureResult("first_copy", skipped=f"no images/<run>.csv holds {name}")
    fig, axes = new_figure(len(widths), sharey=False)
    colors = n_colors(data.ns)
    for ax, w in zip(axes, widths):
        chosen = [r for r in runs if data.records[r].width == w]
        last = max(float(max(data.records[r].steps, default=1.0)) for r in chosen)
        never_x = last * NEVER_FACTOR
        ns = sorted({data.records[r].n for r in chosen})
        for run in chosen:
            color = colors[data.records[run].n]
            rows = [row for row in tables[run] if row.get(name) is not None]
            copied = [(row["first_copy_step"], row[name]) for row in rows if row["first_copy_step"] is not None]
            never = [row[name] for row in rows if row["first_copy_step"] is None]
            if copied:
                x, y = np.array(copied, float).T
                ax.plot(x, y, ls="none", marker="o", ms=3, color=color, alpha=0.6)
            if never:
                ax.plot(np.full(len(never), never_x), never, ls="none", marker="o", ms=4, mfc="none", mec=color)
        ax.axvline(np.sqrt(last * never_x), color="0.5", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(right=never_x * 1.3)
        ax.set_xlabel("first-copy step (right of dots: never)")
        ax.set_title(f"W = {w}")
        extra = [Line2D([], [], ls="none", marker="o", mfc="none", mec="0.3", label="never copied")]
        legend_by_n(ax, ns, colors, extra=extra, loc="best")
        ax.set_ylabel(AXIS_LABELS.get(name, name))
    fig.canvas.draw()
    for ax in axes:
        readable_log_axis(ax.xaxis)
    return out.save(fig, "first_copy")


def gallery_order(table: Sequence[dict[str, Any]], k: int = GALLERY_IMAGES) -> tuple[list[dict], list[dict]]:
    """The first ``k`` and the last ``k`` training images to be copied (rows of ``images/<run>.csv``, by first-copy
    step then index; never-copied images left out); the last are the ``k`` latest, latest last, and do not repeat
    the first."""
    copied = sorted((r for r in table if r.get("first_copy_step") is not None),
                    key=lambda r: (r["first_copy_step"], r["index"]))
    first = copied[:k]
    return first, copied[max(len(first), len(copied) - k):]


def plot_copied_images(data: ExperimentFiles, n: int, width: int, tables: dict[str, list[dict[str, Any]]],
                       out: FigureOutput) -> FigureResult:
    """The gallery of one cell: the first and the last training images to be copied by its lowest seed with
    copies (:func:`gallery_order`) whose training images can be loaded as it trained on them, each captioned with
    its first-copy step; skipped, saying why, when no seed copied two or none of those can be loaded."""
    from diffmem.data import DataError  # here, not at the top: torch loads only when a gallery is drawn

    name = f"copied_images_n{n:05d}_w{width:02d}"
    runs = sorted((r for r in tables if data.records[r].n == n and data.records[r].width == width),
                  key=lambda r: data.records[r].seed)
    unloadable = []
    for run in runs:
        first, last = gallery_order(tables[run])
        if len(first) + len(last) < 2:
            continue
        folder = RunDir(data.records[run].path)
        try:
            pixels = train_pixels(data.records[run].config, folder.recorded_dataset_sha256())
        except (DataError, OSError) as e:  # the next seed may have been trained on the data found here
            unloadable.append(f"{run}: the training images cannot be loaded ({e})")
            continue
        copies = first_copy_tiles(folder, first + last, pixels.shape[-1])
        return _draw_gallery(name, run, pixels, [("first copied", first), ("last copied", last)], copies, out)
    return FigureResult(name, skipped="; ".join(unloadable) or "no seed copied two training images")


def first_copy_tiles(run: RunDir, rows: Sequence[dict[str, Any]], size: int) -> dict[int, np.ndarray]:
    """The stored first copy of each image of ``rows`` (images/<run>.csv rows), by image index: its tile (S, S, 3)
    uint8 from the strip of its first-copy step (``samples/first_copies_step_*.png``, the latest copies.jsonl line of
    that step naming it in ``first_copies``). Images of runs written before the strips, or whose strip is missing or
    damaged, have none."""
    from diffmem.samplegrid import read_first_copies  # here, not at the top: it loads torch (see plot_copied_images)

    lines: dict[int, dict[str, Any]] = {}
    for line in run.copies():
        lines[int(line["step"])] = line  # the latest line of each step, as the strip was written last
    out = {}
    for row in rows:
        line = lines.get(int(row["first_copy_step"])) if row.get("first_copy_step") is not None else None
        listed = line.get("first_copies") or [] if line else []
        if int(row["index"]) not in listed:
            continue
        strip = read_first_copies(run.first_copies_path(int(line["step"])), len(listed), size)
        if strip is not None:
            out[int(row["index"])] = strip[listed.index(int(row["index"]))].permute(1, 2, 0).numpy()
    return out


def _draw_gallery(name: str, run: str, pixels: Any, rows: list[tuple[str, list[dict[str, Any]]]],
                  copies: dict[int, np.ndarray], out: FigureOutput) -> FigureResult:
    rows = [(label, chosen) for label, chosen in rows if chosen]
    cols = max(len(chosen) for _, chosen in rows)
    fig = Figure(figsize=(0.85 * cols + 0.4, 1.15 * len(rows) + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    subfigs = np.atleast_1d(fig.subfigures(len(rows), 1))
    for sub, (label, chosen) in zip(subfigs, rows):
        sub.suptitle(label, fontsize=8, x=0.02, ha="left")
        axes = np.atleast_1d(sub.subplots(1, cols))
        for ax in axes:
            ax.set_axis_off()
        for ax, row in zip(axes, chosen):
            image = pixels[int(row["index"])].numpy()
            image = np.repeat(image, 3, axis=0) if image.shape[0] == 1 else image
            image = image.transpose(1, 2, 0).astype(np.uint8)
            copy = copies.get(int(row["index"]))
            if copy is not None:  # the training image, a white column, its first copy
                image = np.concatenate([image, np.full((image.shape[0], 1, 3), 255, np.uint8), copy], axis=1)
            ax.imshow(image, vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(f"#{row['index']}\nstep {row['first_copy_step']}", fontsize=6)
    caption = ("each training image (left) beside its first copy (right)" if copies else
               "the images, not their copies: this run stored no first copies")
    fig.suptitle(f"{run}: training images in the order they are first copied; {caption}", fontsize=8)
    return out.save(fig, name)


def plot_images(data: ExperimentFiles, out: FigureOutput) -> list[FigureResult]:
    """Every figure of this module; [] when the experiment has no copies (fits.json without ``images``)."""
    section = images_section(data)
    if section is None:
        return []
    tables = _tables(data, section)
    results = [plot_copied_fraction(data, section, out), plot_first_copy(data, section, tables, out)]
    cells = sorted({(data.records[r].n, data.records[r].width) for r in tables}, key=lambda c: (c[1], c[0]))
    return results + [plot_copied_images(data, n, w, tables, out) for n, w in cells]
