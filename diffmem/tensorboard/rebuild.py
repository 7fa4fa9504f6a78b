"""``diffmem tensorboard EXPERIMENT_DIR``: the TensorBoard event files of an existing folder, from its own files.

Every run folder gets ``<run>/tensorboard/`` showing its metrics.jsonl, sample grids, hyperparameters and (after
``diffmem analyze``) timescales (:func:`diffmem.tensorboard.points.run_points`); every split pair of pairs.jsonl gets
``<experiment>/pairs_tensorboard/<pair>/``. Only what differs from what the event files already show is written
(:class:`~diffmem.tensorboard.eventdir.EventDir`), so a rerun writes nothing, and the training loss that ``diffmem
train`` wrote live is kept. A run folder is written under its lock; one that another process holds (a run that is
training, whose events that process writes live) is skipped and named.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diffmem.analysis.runfiles import find_run_folders, read_pairs
from diffmem.rundir import PAIRS_FILE, PAIRS_LOCK, RunDir, RunLock, RunLocked
from diffmem.tensorboard.eventdir import EventDir, Point
from diffmem.tensorboard.live import pair_events_dir, run_events_dir
from diffmem.tensorboard.points import pair_points, run_points

_PAIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a pair id used as a folder name: no path, no dot file


@dataclass
class RebuildSummary:
    """What one ``diffmem tensorboard`` wrote: event folders brought up to date, points written, folders skipped."""

    experiment_dir: Path
    folders: int = 0
    points: int = 0
    skipped: list[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f"{self.experiment_dir}: {self.folders} TensorBoard run(s) up to date, {self.points} point(s) "
                 f"written; watch them with: tensorboard --logdir {self.experiment_dir}"]
        lines += [f"skipped {s}" for s in self.skipped]
        return "\n".join(lines)


def _sync(folder: Path, points: list[Point]) -> int:
    """Make the event folder ``folder`` show ``points``; returns how many were written."""
    events = EventDir(folder)
    try:
        return events.sync(points)
    finally:
        events.close()


def write_tensorboard(experiment_dir: str | Path, log: Callable[[str], None] = print) -> RebuildSummary:
    """Write the event files of every run folder and split pair of ``experiment_dir`` (or of the one run folder it
    is); see the module docstring. RunFolderError when it holds no run folder."""
    root = Path(experiment_dir)
    summary = RebuildSummary(root)
    for path in find_run_folders(root):
        try:
            with RunLock(RunDir(path)):
                written = _sync(run_events_dir(path), run_points(path))
        except RunLocked as e:
            summary.skipped.append(f"{path.name}: {e}")
            continue
        summary.folders += 1
        summary.points += written
        if written:
            log(f"{path.name}: {written} point(s) written")
    if (root / PAIRS_FILE).is_file():
        try:
            with RunLock(RunDir(root), name=PAIRS_LOCK):
                for pair, lines in read_pairs(root).items():
                    if not _PAIR_NAME.match(pair):
                        summary.skipped.append(f"pair {pair!r} of {PAIRS_FILE}: not a run folder name")
                        continue
                    written = _sync(pair_events_dir(root, pair), pair_points(lines))
                    summary.folders += 1
                    summary.points += written
                    if written:
                        log(f"pair {pair}: {written} point(s) written")
        except RunLocked as e:
            summary.skipped.append(f"the split pairs: {e}")
    return summary
