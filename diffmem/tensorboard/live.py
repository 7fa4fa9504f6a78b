"""The event files written while a run trains and evaluates (``train.tensorboard``, on by default), and never a reason
for a run to stop.

Two hooks, each one call: :func:`training_loss` after the training loop checks its loss (``diffmem.train``), and
:func:`records_appended` after a line is appended to a run's metrics.jsonl (``diffmem.evaluate``) or to an
experiment's pairs.jsonl (``diffmem.paired_evaluation``). A metrics hook makes the run's event files show what the
run folder holds (:func:`diffmem.tensorboard.points.run_points`), so the events never hold an evaluation the folder
does not, and a run resumed after a kill writes no step twice (:class:`~diffmem.tensorboard.eventdir.EventDir` reads
back what the killed process wrote). Without the ``tensorboard`` package one warning says how to install it; an
error while writing event files is one warning per folder, after which that folder's events are no longer written
by this process (``diffmem tensorboard EXP`` writes them later).
"""
from __future__ import annotations

import atexit
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

from diffmem.config import RunConfig
from diffmem.rundir import RETRAIN_PREFIX, RunDir

INSTALL_HINT = ("pip install 'diffmem[tensorboard]' (or pip install tensorboard); set train.tensorboard=false to "
                "turn them off")


class TensorBoardWarning(UserWarning):
    """TensorBoard event files of a run are not written (the package is missing, or a write failed)."""


TENSORBOARD_DIR = "tensorboard"  # <run>/tensorboard/: the run's event files
PAIRS_TENSORBOARD_DIR = "pairs_tensorboard"  # <experiment>/pairs_tensorboard/<pair>/: a split pair's event files

_lock = threading.Lock()
_writers: dict[Path, Any] = {}  # event folder -> its EventDir, or None once a write there failed


@atexit.register
def close_writers() -> None:
    """Close this process's event files when it exits (called by atexit), so no file is left for the interpreter to
    close."""
    with _lock:
        for events in _writers.values():
            if events is not None:
                events.close()
_missing_warned = [False]


def run_events_dir(run_dir: str | Path) -> Path:
    """Where the event files of a run folder go: ``<run>/tensorboard``."""
    return Path(run_dir) / TENSORBOARD_DIR


def pair_events_dir(experiment_dir: str | Path, pair: str) -> Path:
    """Where the event files of the split pair ``pair`` go: ``<experiment>/pairs_tensorboard/<pair>``."""
    return Path(experiment_dir) / PAIRS_TENSORBOARD_DIR / pair


def available() -> bool:
    """Whether the ``tensorboard`` package can be imported."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def _with_writer(folder: Path, write: Callable[[Any], Any]) -> None:
    """Call ``write(EventDir(folder))`` (one EventDir per folder and process); a missing package or any error
    becomes a warning, once, and never an exception."""
    if not available():
        if not _missing_warned[0]:
            _missing_warned[0] = True
            warnings.warn(f"TensorBoard event files are not written: the tensorboard package is not installed; "
                          f"{INSTALL_HINT}", TensorBoardWarning, stacklevel=3)
        return
    with _lock:
        try:
            if folder not in _writers:
                from diffmem.tensorboard.eventdir import EventDir
                _writers[folder] = EventDir(folder)
            if _writers[folder] is not None:
                write(_writers[folder])
        except Exception as e:  # never stop a run for its event files
            _writers[folder] = None
            warnings.warn(f"{folder}: TensorBoard event files are no longer written by this process "
                          f"({type(e).__name__}: {e}); `diffmem tensorboard` writes them again from the run folder",
                          TensorBoardWarning, stacklevel=3)


def _enabled(cfg: RunConfig, run_dir: Path) -> bool:
    """``train.tensorboard`` is on and the folder is not the scratch folder of a retraining (``.retrain.*``)."""
    return bool(cfg.train.tensorboard) and not run_dir.name.startswith(RETRAIN_PREFIX)


def training_loss(cfg: RunConfig, run: RunDir, step: int, loss: float) -> None:
    """Show the mean training loss of the steps before optimizer step ``step`` (skipped when an earlier process of
    this run already wrote a point at or after it)."""
    if not _enabled(cfg, run.path):
        return
    from diffmem.tensorboard.points import training_loss_point
    point = training_loss_point(step, loss)
    if point is not None:
        _with_writer(run_events_dir(run.path), lambda events: events.append(point))


def records_appended(cfg: RunConfig, run: RunDir, pair: str | None = None) -> None:
    """After a line was appended to ``run``'s metrics.jsonl, or with ``pair`` to the pairs.jsonl of the experiment
    ``run`` (then the experiment folder): make the event files show the folder's records."""
    if not _enabled(cfg, run.path):
        return
    if pair is None:
        from diffmem.tensorboard.points import run_points
        _with_writer(run_events_dir(run.path), lambda events: events.sync(run_points(run.path)))
        return
    from diffmem.analysis.runfiles import read_pairs
    from diffmem.tensorboard.points import pair_points
    _with_writer(pair_events_dir(run.path, pair),
                 lambda events: events.sync(pair_points(read_pairs(run.path).get(pair, []))))
