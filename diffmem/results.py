"""An experiment's results, all of them, from the files on disk: the analysis (summary.csv and fits.json:
:func:`diffmem.analysis.scaling.analyze`), then the figures drawn from those files
(:func:`diffmem.figures.make_figures`), then the report page that links them
(:func:`diffmem.analysis.report.write_report`). ``diffmem analyze`` and the demo call it; the analysis itself never
draws.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from diffmem.analysis.report import write_report
from diffmem.analysis.scaling import Summary, analyze
from diffmem.figures import make_figures


def write_results(experiment_dir: str | Path, *, figures: bool = True, out_dir: str | Path | None = None,
                  n_samples: int | None = None, pdf: bool = True) -> Summary:
    """Analyze ``experiment_dir`` into ``out_dir`` (default: the experiment folder; see :func:`analyze` for
    ``n_samples``), draw its figures into ``experiment_dir/figures`` when ``figures`` and no other ``out_dir`` is
    given (as PNG and, with ``pdf``, PDF), and write ``report.md`` next to summary.csv. Returns the analysis's
    Summary with the figures (written or skipped, each with its reason) and the report's path."""
    experiment_dir = Path(experiment_dir)
    target = experiment_dir if out_dir is None else Path(out_dir)
    summary = analyze(experiment_dir, out_dir=out_dir, n_samples=n_samples)
    drawn = tuple(make_figures(experiment_dir, pdf=pdf)) if figures and target == experiment_dir else ()
    return dataclasses.replace(summary, figures=drawn, report=write_report(experiment_dir, target))
