"""A run folder's image_losses.jsonl: each training image's own denoising loss per noise level at every evaluation,
and the control block's, one line per evaluation, appended (never rewritten) just before the metrics line.

One line::

    {"step": 1115, "loss_ts": [0.01, 0.025, ...], "loss_steps": [10, 25, ...], "n_train": 64, "n_control": 64,
     "encoding": "base64-float32le", "train": "<L x N float32>", "control": "<L x N_control float32>"}

``train`` holds, level by level (rows in the order of ``loss_steps``, the DDPM steps of ``eval.loss_ts``), the loss
of each training image in the train set's row order (images.json ``train``); ``control`` the same for the control
block (images.json ``control``). The losses are those of metrics.jsonl's per-level means: the DSM loss averaged over
``eval.loss_noise_draws`` draws, in the loss's own units (mean squared error per pixel of the predicted noise).
Readers take the latest line of a step (an evaluation repeated after a crash appends it again). A line is validated
as it is read (:func:`image_losses_lines`): a bad line is a one-line RecordError naming the file and line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from diffmem.io import FLOATS_ENCODING, PackedCountsError, append_jsonl, pack_floats, unpack_floats
from diffmem.rundir.folder import RunDir
from diffmem.rundir.records import is_int, record_problem, validated_lines


def append_image_losses(run: RunDir, step: int, loss_ts: Sequence[float], loss_steps: Sequence[int],
                        train: np.ndarray, control: np.ndarray) -> None:
    """Append the line of ``step``: ``train`` (L, N) and ``control`` (L, N_control) per-image losses at the
    diffusion times ``loss_ts`` (``eval.loss_ts``), i.e. the DDPM steps ``loss_steps`` (L of each)."""
    train, control = np.asarray(train), np.asarray(control)
    append_jsonl(run.image_losses_path, {
        "step": int(step), "loss_ts": [float(t) for t in loss_ts], "loss_steps": [int(s) for s in loss_steps], "n_train": int(train.shape[1]),
        "n_control": int(control.shape[1]), "encoding": FLOATS_ENCODING, "train": pack_floats(train),
        "control": pack_floats(control)})


def _problem(record: Any, budget: int | None, n_train: int | None) -> str | None:
    problem = record_problem(record, budget=budget, numbers=(), ints=("n_train", "n_control"),
                             strings=("encoding", "train", "control"))
    if problem is not None:
        return problem
    if record["encoding"] != FLOATS_ENCODING:
        return f"'encoding' is {record['encoding'][:40]!r}, not {FLOATS_ENCODING!r}"
    levels = record.get("loss_steps")  # record_problem checked it is as long as loss_ts
    if not isinstance(levels, list) or not levels or not all(is_int(s) and s >= 0 for s in levels):
        return "'loss_steps' is not a list of DDPM steps"
    if record["n_train"] < 1 or record["n_control"] < 0:
        return "'n_train' or 'n_control' is out of range"
    if n_train is not None and record["n_train"] != n_train:
        return f"'n_train' is {record['n_train']}, not the run's N = {n_train}: a line of another run"
    for key in ("train", "control"):
        try:
            unpack_floats(record[key], (len(levels), record[f"n_{key}"]))
        except PackedCountsError as e:
            return f"'{key}' cannot be read: {e}"
    return None


def image_losses_lines(path: str | Path, budget: int | None = None,
                       n_train: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every line of a run's image_losses.jsonl in file order, validated, with ``train``
    and ``control`` decoded to float64 arrays (L, N) and (L, N_control); [] when the file is missing (a folder
    written before it). Raises RecordError for the first bad line."""
    path = Path(path)
    lines = validated_lines(path, lambda r: _problem(r, budget, n_train),
                            f"`diffmem evaluate {path.parent}` evaluates a checkpoint's step again")
    out = []
    for number, record in lines:
        shape = len(record["loss_steps"])
        decoded = {key: unpack_floats(record[key], (shape, record[f"n_{key}"])) for key in ("train", "control")}
        out.append((number, {**record, **decoded}))
    return out
