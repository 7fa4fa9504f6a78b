"""What the figures of an experiment read, from its files only: summary.csv, fits.json, each run's metrics.jsonl
and pairs.jsonl (:func:`load_experiment_files` -> :class:`ExperimentFiles`), and the questions every figure asks of
them (the widths with several N, the median over a cell's seeds)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from diffmem.analysis.powerlaw import FitSet, load_fits
from diffmem.analysis.runfiles import (PairRecord, RunRecord, find_run_folders, pair_records, read_csv, read_pairs,
                                       read_run)


class PlotError(ValueError):
    """The experiment folder lacks what the figures need; the message says what to run."""


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


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (e.g. a timescale over the seeds of a cell); None when none is."""
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def widths_with_several_n(data: ExperimentFiles) -> list[int]:
    """The widths at which at least two N were run (what a figure against N or step / N needs)."""
    return [w for w in data.widths if len({r["n"] for r in data.rows_of_width(w)}) >= 2]
