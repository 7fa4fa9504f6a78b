"""Every figure of an experiment, drawn from the files on disk only (summary.csv, fits.json, metrics.jsonl,
pairs.jsonl, the runs' stored sample grids).

``make_figures(experiment_dir)``, the one entry point, writes PNG (200 dpi) and PDF files (``pdf=False``: PNG only)
into ``experiment_dir/figures/`` and returns one :class:`FigureResult` per figure, written or skipped with the reason
(e.g. width.png with a single width). One module per family of figure:

- :mod:`~diffmem.figures.window`: ``window_w{W}`` (FID/FD and f_mem against the step with each N's generalization
  window, the paper's Fig. 2) and ``collapse`` (f_mem against step / N);
- :mod:`~diffmem.figures.laws`: ``scaling`` (tau_mem and tau_gen against N with the fitted laws) and ``width``
  (against W);
- :mod:`~diffmem.figures.phase`: ``phase`` (memorizing, generalizing or learning, against training time; Fig. 3);
- :mod:`~diffmem.figures.loss_gap`: ``loss_gap`` (train and test loss against the step);
- :mod:`~diffmem.figures.pairs`: ``pairs`` (the split pairs' bias, pair distance and own fraction);
- :mod:`~diffmem.figures.signals`: ``signals_gap_w{W}``, ``signals_auc_w{W}``, ``signals_calibration`` (the
  sampling-free signals: the gap over step x noise level, the membership AUC, their timescales against tau_mem),
  only for runs that recorded the per-level losses;
- :mod:`~diffmem.figures.gallery`: ``gallery_n{N:05d}_w{W:02d}`` (stored sample grids before, inside and after the
  window);
- :mod:`~diffmem.figures.images`: ``copied_fraction``, ``first_copy`` and ``copied_images_n{N:05d}_w{W:02d}``
  (which training images are copied, and when; only for runs with copies.jsonl).

What they share: :mod:`~diffmem.figures.experiment_files` (what they read), :mod:`~diffmem.figures.style` (settings,
figure and panels, colours, axes, legend, saving; also used by the theory's figures), :mod:`~diffmem.figures.curves`
(a cell's seeds against the step) and :mod:`~diffmem.figures.checks` (mechanical readability checks of a drawn
figure, used by the tests).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib as mpl

from diffmem.analysis.runfiles import write_figure_index
from diffmem.figures.experiment_files import ExperimentFiles, PlotError, load_experiment_files
from diffmem.figures.gallery import plot_galleries
from diffmem.figures.images import plot_images
from diffmem.figures.laws import plot_scaling, plot_width
from diffmem.figures.loss_gap import plot_loss_gap
from diffmem.figures.pairs import plot_pairs
from diffmem.figures.phase import plot_phase
from diffmem.figures.signals import plot_signals
from diffmem.figures.style import STYLE, FigureOutput, FigureResult
from diffmem.figures.window import plot_collapse, plot_window

__all__ = ["ExperimentFiles", "FigureResult", "PlotError", "load_experiment_files", "make_figures"]


def make_figures(experiment_dir: str | Path, *, out_dir: str | Path | None = None,
                 phase_threshold: float | None = None,
                 phase_times: Sequence[float] | None = None, pdf: bool = True) -> list[FigureResult]:
    """Draw every figure of ``experiment_dir`` (after `diffmem analyze`) into ``out_dir`` (default
    ``experiment_dir/figures``), as PNG and, with ``pdf``, PDF (:class:`~diffmem.figures.style.FigureOutput`), and
    list them, drawn or skipped with the reason, in ``out_dir/index.json`` (diffmem.analysis.runfiles.FIGURE_INDEX,
    read by the report page); each result keeps its Figure.
    ``phase_threshold``: see :func:`diffmem.figures.phase.memorizing_at` (None: tau_mem's rule); ``phase_times``: the
    training times (steps) of the (N, p) panels."""
    data = load_experiment_files(experiment_dir)
    out_dir = data.directory / "figures" if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = FigureOutput(out_dir, pdf=pdf)
    with mpl.rc_context(STYLE):
        results = [plot_window(data, w, out) for w in data.widths]
        results.append(plot_collapse(data, out))
        results.append(plot_scaling(data, out))
        results.append(plot_width(data, out))
        results.append(plot_phase(data, out, threshold=phase_threshold, times=phase_times))
        results.append(plot_loss_gap(data, out))
        results.append(plot_pairs(data, out))
        results += plot_signals(data, out)
        results += plot_galleries(data, out)
        results += plot_images(data, out)
    write_figure_index(out_dir, ((r.name, [p.name for p in r.files], r.skipped) for r in results))
    return results
