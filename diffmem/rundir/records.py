"""The records of the append-only files, validated as they are read: ``<run>/metrics.jsonl`` (one line per evaluation),
``<run>/copies.jsonl`` (one line per evaluation: which training images its samples copied) and
``<experiment>/pairs.jsonl`` (one line per split pair and step).

A folder may come from someone else or be damaged, so every recorded line (:func:`diffmem.io.read_jsonl_numbered`:
a last line without its newline is not recorded) is checked before anything uses it: a JSON object; ``step`` an
integer with 0 <= step <= the run's budget (``train.steps``, optimizer steps); every number finite (no NaN or
infinity, in lists too); the measures numbers or null, fractions in [0, 1], distances, spreads, losses, counts and
seconds not below 0 (:data:`NONNEGATIVE`); ``n_samples`` an integer of at least
the run's ``eval.n_samples`` (an evaluation never draws fewer); the per-level lists of a metrics line (``loss_ts``
and the lists beside it) lists of numbers as long as ``loss_ts``, the AUCs in [0, 1]; a copies line's packed counts
unpacked to exactly ``n_train`` values, its index lists increasing, inside the train set, their counts positive and
summing to at most its ``n_samples`` (the nearest counts to exactly that), no image copied by more samples than it
is nearest to; a pairs line's ids strings and N, W, seed integers.
A bad line is never used and never skipped silently: it is a one-line :class:`RecordError` naming the file, the
line and what is wrong, and saying what to do (the command stops with exit code 2 and changes nothing).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from diffmem.io import COUNTS_ENCODING, PackedCountsError, read_jsonl_numbered, unpack_counts

METRICS_NUMBERS = ("f_mem", "f_mem_lo", "f_mem_hi", "mem_threshold", "fid", "fid_std", "fid_boot_std", "train_loss",
                   "test_loss", "loss_t", "images_seen", "train_s", "wall_s", "sample_s", "nn_s", "fid_s", "loss_s",
                   "membership_auc", "membership_auc_lo", "membership_auc_hi", "membership_s",
                   "control_membership_auc", "control_membership_auc_lo", "control_membership_auc_hi")
"""Keys of a metrics.jsonl line that hold a number or null."""
LEVEL_LISTS = ("loss_steps", "train_losses", "test_losses", "loss_gap_lo", "loss_gap_hi", "auc", "auc_lo", "auc_hi",
               "control_losses", "control_gap_lo", "control_gap_hi", "control_auc", "control_auc_lo", "control_auc_hi")
"""Keys of a metrics.jsonl line that hold one number per noise level of its ``loss_ts`` (absent or null: none)."""
COPIES_LISTS = (("nearest_idx", "nearest_n"), ("copied_idx", "copied_n"))
"""The (indices, counts) list pairs of a copies.jsonl line once unpacked (:func:`unpacked_copies`)."""
PAIRS_NUMBERS = ("bias", "bias_lo", "bias_hi", "control_bias", "control_bias_lo", "control_bias_hi", "pair_distance",
                 "pair_distance_lo", "pair_distance_hi", "own_fraction", "own_fraction_lo", "own_fraction_hi", "f_mem_a", "f_mem_b", "wall_s")
"""Keys of a pairs.jsonl line that hold a number or null."""
FRACTIONS = ("f_mem", "f_mem_lo", "f_mem_hi", "own_fraction", "own_fraction_lo", "own_fraction_hi", "f_mem_a",
             "f_mem_b", "membership_auc", "membership_auc_lo", "membership_auc_hi", "auc", "auc_lo", "auc_hi",
             "control_membership_auc", "control_membership_auc_lo", "control_membership_auc_hi", "control_auc",
             "control_auc_lo", "control_auc_hi")
"""Keys that hold a fraction in [0, 1] (or null)."""


NONNEGATIVE = ("fid", "fid_std", "fid_boot_std", "train_loss", "test_loss", "images_seen", "train_s", "wall_s",
               "sample_s", "nn_s", "fid_s", "loss_s", "membership_s")
"""Keys of a metrics.jsonl line that cannot be negative (a distance, its spread, a loss, a count, seconds): a negative
one would be taken as a standard error or a loss by the analysis."""


class RecordError(ValueError):
    """A line of metrics.jsonl or pairs.jsonl that cannot be used; the one-line message names the file and line."""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _non_finite(value: Any, key: str) -> str | None:
    """The key path of the first NaN or infinity in ``value`` (lists and objects searched), None when none."""
    if isinstance(value, float) and not math.isfinite(value):
        return key
    if isinstance(value, list):
        return next((k for i, v in enumerate(value) if (k := _non_finite(v, f"{key}[{i}]"))), None)
    if isinstance(value, dict):
        return next((k for name, v in value.items() if (k := _non_finite(v, f"{key}.{name}"))), None)
    return None


def record_problem(record: Any, *, budget: int | None = None, min_samples: int | None = None,
                   numbers: tuple[str, ...] = METRICS_NUMBERS, ints: tuple[str, ...] = (),
                   strings: tuple[str, ...] = ()) -> str | None:
    """What is wrong with one record (a phrase naming the key), None when it can be used. ``budget``: the largest
    valid step (optimizer steps; None: not checked); ``min_samples``: the least valid ``n_samples``."""
    if not isinstance(record, dict):
        return f"it is {type(record).__name__} JSON, not an object"
    step = record.get("step")
    if "step" not in record:
        return "it has no 'step'"
    if not is_int(step):
        return f"'step' is {step!r}, not an integer"
    if step < 0:
        return f"'step' is {step}, below 0"
    if budget is not None and step > budget:
        return f"'step' is {step}, beyond the run's budget of {budget} steps (train.steps): a line of another run"
    for key in strings:
        if not isinstance(record.get(key), str):
            return f"'{key}' is {record.get(key)!r}, not a string"
    for key in ints:
        if not is_int(record.get(key)):
            return f"'{key}' is {record.get(key)!r}, not an integer"
    for key in record:
        if (where := _non_finite(record[key], key)) is not None:
            return f"'{where}' is not a finite number (NaN or infinity)"
    for key in numbers:
        value = record.get(key)
        if value is not None and not is_number(value):
            return f"'{key}' is {value!r}, not a number or null"
        if key in FRACTIONS and value is not None and not 0 <= value <= 1:
            return f"'{key}' is {value}, outside [0, 1]"
        if key in NONNEGATIVE and value is not None and value < 0:
            return f"'{key}' is {value}, below 0"
    if (problem := _levels_problem(record)) is not None:
        return problem
    samples = record.get("n_samples")
    if samples is not None and (not is_int(samples) or samples < 1):
        return f"'n_samples' is {samples!r}, not a positive integer"
    if samples is not None and min_samples is not None and samples < min_samples:
        return (f"'n_samples' is {samples}, fewer than the run's eval.n_samples = {min_samples} (an evaluation never "
                "draws fewer): a line of another run")
    return None


def _levels_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the per-level lists of a metrics line (``loss_ts`` and :data:`LEVEL_LISTS`), or None."""
    levels = record.get("loss_ts")
    if levels is None:
        given = [k for k in LEVEL_LISTS if record.get(k) is not None]
        return f"'{given[0]}' is given without 'loss_ts'" if given else None
    if not isinstance(levels, list) or not levels or not all(is_number(v) and v > 0 for v in levels):
        return f"'loss_ts' is {levels!r}, not a list of diffusion times > 0"
    for key in LEVEL_LISTS:
        value = record.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) != len(levels) or not all(is_number(v) for v in value):
            return f"'{key}' is {value!r}, not a list of {len(levels)} numbers (one per 'loss_ts' level)"
        if key in FRACTIONS and not all(0 <= v <= 1 for v in value):
            return f"'{key}' holds a value outside [0, 1]"
    for key, least in (("membership_n", 1), ("nonmember_n", 1), ("control_n", 0)):
        n = record.get(key)
        if n is not None and (not is_int(n) or n < least):
            return f"'{key}' is {n!r}, not an integer >= {least}"
    return None


def unpacked_copies(record: dict[str, Any]) -> dict[str, Any]:
    """A copies.jsonl line with its counts as the sparse lists ``nearest_idx``, ``nearest_n``, ``copied_idx``,
    ``copied_n`` (increasing indices into the train set, positive counts): a packed line (``encoding``,
    ``nearest``, ``copied``: dense arrays, :func:`diffmem.io.pack_counts`) is unpacked, a line of plain lists (the
    first format) is returned as it is. Raises PackedCountsError or KeyError when it cannot be unpacked."""
    if "encoding" not in record:
        return record
    if record["encoding"] != COUNTS_ENCODING:
        raise PackedCountsError(f"'encoding' is {record['encoding']!r}, not {COUNTS_ENCODING!r}")
    out = {k: v for k, v in record.items() if k not in ("encoding", "nearest", "copied")}
    for key in ("nearest", "copied"):
        counts = unpack_counts(record.get(key), record["n_train"])
        idx = np.flatnonzero(counts)
        out[f"{key}_idx"], out[f"{key}_n"] = idx.tolist(), counts[idx].tolist()
    return out


def copies_problem(record: Any, *, budget: int | None = None, n_train: int | None = None,
                   min_samples: int | None = None) -> str | None:
    """What is wrong with one copies.jsonl line (a phrase naming the key), None when it can be used; ``n_train``:
    the run's train-set size N (None: not checked)."""
    problem = record_problem(record, budget=budget, min_samples=min_samples, numbers=("mem_threshold",),
                             ints=("n_samples", "n_train"))
    if problem is not None:
        return problem
    if record["n_train"] < 1:
        return f"'n_train' is {record['n_train']}, not a positive integer"
    if n_train is not None and record["n_train"] != n_train:
        return f"'n_train' is {record['n_train']}, not the run's N = {n_train}: a line of another run"
    try:
        record = unpacked_copies(record)
    except PackedCountsError as e:
        return f"its counts cannot be unpacked: {e}"
    counted = {}
    for idx_key, n_key in COPIES_LISTS:
        idx, counts = record.get(idx_key), record.get(n_key)
        for key, value in ((idx_key, idx), (n_key, counts)):
            if not isinstance(value, list) or not all(is_int(v) for v in value):
                return f"'{key}' is not a list of integers"
        if len(idx) != len(counts):
            return f"'{idx_key}' and '{n_key}' differ in length ({len(idx)} and {len(counts)})"
        if any(b <= a for a, b in zip(idx, idx[1:])) or (idx and (idx[0] < 0 or idx[-1] >= record["n_train"])):
            return f"'{idx_key}' is not increasing indices in [0, n_train = {record['n_train']})"
        if any(c < 1 for c in counts):
            return f"'{n_key}' holds a count below 1"
        counted[n_key] = dict(zip(idx, counts))
    if sum(counted["nearest_n"].values()) != record["n_samples"]:
        return f"'nearest_n' sums to {sum(counted['nearest_n'].values())}, not n_samples = {record['n_samples']}"
    if any(c > counted["nearest_n"].get(i, 0) for i, c in counted["copied_n"].items()):
        return "an image of 'copied_idx' is copied by more samples than it is nearest to"
    if (problem := _within_problem(record, counted["nearest_n"])) is not None:
        return problem
    first = record.get("first_copies")
    if first is not None and (not isinstance(first, list) or not all(is_int(i) for i in first)
                              or any(b <= a for a, b in zip(first, first[1:]))
                              or any(i not in counted["copied_n"] for i in first)):
        return "'first_copies' is not increasing indices of copied images"
    return None


def within_counts(record: dict[str, Any]) -> list[np.ndarray]:
    """The (n_train,) counts of each fixed-distance copy rule of a copies.jsonl line (``copied_within``, one per
    fraction of ``copy_distances``), [] for a line without them (written before them or with the key off)."""
    return [unpack_counts(text, record["n_train"]) for text in record.get("copied_within") or []]


def _within_problem(record: dict[str, Any], nearest: dict[int, int]) -> str | None:
    """What is wrong with a copies line's fixed-distance rules (``distance_scale``, ``copy_distances``,
    ``copied_within``), None when they can be used or are absent."""
    if record.get("copied_within") is None:
        return None
    scale, fractions, packed = record.get("distance_scale"), record.get("copy_distances"), record["copied_within"]
    if not is_number(scale) or not scale > 0:
        return f"'distance_scale' is {scale!r}, not a distance > 0"
    if (not isinstance(fractions, list) or not all(is_number(f) and f > 0 for f in fractions)
            or any(b <= a for a, b in zip(fractions, fractions[1:]))):
        return "'copy_distances' is not a list of increasing fractions > 0"
    if not isinstance(packed, list) or len(packed) != len(fractions):
        return f"'copied_within' is not a list of {len(fractions)} packed arrays (one per 'copy_distances')"
    try:
        counts = within_counts(record)
    except PackedCountsError as e:
        return f"'copied_within' cannot be unpacked: {e}"
    ceiling = np.zeros(record["n_train"], np.int64)
    ceiling[list(nearest)] = list(nearest.values())
    previous = np.zeros_like(ceiling)
    for array in counts:
        if (array > ceiling).any() or (array < previous).any():
            return "'copied_within' counts an image more often than it is nearest, or less at a wider distance"
        previous = array
    return None


def validated_lines(path: Path, problem_of: Callable[[Any], str | None],
                    measured_again_by: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every recorded line of ``path`` in file order, [] when it is missing; raises
    :class:`RecordError` for the first line whose ``problem_of(record)`` is not None, naming the file, the line, the
    problem, and ``measured_again_by`` (the command that measures a removed line's step again)."""
    out = []
    for number, record in read_jsonl_numbered(path):
        problem = problem_of(record)
        if problem is not None:
            raise RecordError(f"{path} line {number}: {problem}; diffmem uses no line it cannot trust: correct that "
                              f"line or move it out of the file ({measured_again_by}), or restore the file from a "
                              "copy")
        out.append((number, record))
    return out


def metrics_lines(path: str | Path, budget: int | None = None,
                  min_samples: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every line of a run's metrics.jsonl, in file order, each validated
    (:func:`record_problem`); [] when the file is missing. Raises :class:`RecordError` for the first bad line."""
    path = Path(path)
    return validated_lines(path, lambda r: record_problem(r, budget=budget, min_samples=min_samples),
                           f"`diffmem evaluate {path.parent}` evaluates a checkpoint's step again")


def copies_lines(path: str | Path, budget: int | None = None, n_train: int | None = None,
                 min_samples: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every line of a run's copies.jsonl, in file order, each validated
    (:func:`copies_problem`) and with its counts as sparse lists (:func:`unpacked_copies`); [] when the file is
    missing (a folder written before it). Raises :class:`RecordError` for the first bad line."""
    path = Path(path)
    lines = validated_lines(path, lambda r: copies_problem(r, budget=budget, n_train=n_train, min_samples=min_samples),
                            f"`diffmem evaluate {path.parent}` evaluates a checkpoint's step again")
    return [(number, unpacked_copies(record)) for number, record in lines]


def pairs_lines(path: str | Path, budgets: dict[str, int] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every line of an experiment's pairs.jsonl, in file order, each validated
    (:func:`record_problem` with the pair's ids and N, W, seed; ``budgets``: train.steps by run name, the step
    checked against both runs' where known); [] when the file is missing. Raises :class:`RecordError` for the first
    bad line."""
    path = Path(path)
    budgets = budgets or {}

    def problem_of(record: Any) -> str | None:
        problem = record_problem(record, numbers=PAIRS_NUMBERS, ints=("n", "width", "seed_train"),
                                 strings=("pair", "run_a", "run_b"))
        if problem is None:
            known = [budgets[r] for r in (record["run_a"], record["run_b"]) if r in budgets]
            problem = record_problem(record, budget=min(known) if known else None, numbers=PAIRS_NUMBERS)
        return problem

    return validated_lines(path, problem_of, f"`diffmem pairs {path.parent}` measures a missing step again")
