"""The records of the append-only files, validated as they are read: ``<run>/metrics.jsonl`` (one line per evaluation)
and ``<experiment>/pairs.jsonl`` (one line per split pair and step).

A folder may come from someone else or be damaged, so every recorded line (:func:`diffmem.io.read_jsonl_numbered`:
a last line without its newline is not recorded) is checked before anything uses it: a JSON object; ``step`` an
integer with 0 <= step <= the run's budget (``train.steps``, optimizer steps); every number finite (no NaN or
infinity, in lists too); the measures numbers or null, fractions in [0, 1]; ``n_samples`` an integer of at least
the run's ``eval.n_samples`` (an evaluation never draws fewer); a pairs line's ids strings and N, W, seed integers.
A bad line is never used and never skipped silently: it is a one-line :class:`RecordError` naming the file, the
line and what is wrong, and saying what to do (the command stops with exit code 2 and changes nothing).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from diffmem.io import read_jsonl_numbered

METRICS_NUMBERS = ("f_mem", "f_mem_lo", "f_mem_hi", "mem_threshold", "fid", "fid_std", "fid_boot_std", "train_loss",
                   "test_loss", "loss_t", "images_seen", "train_s", "wall_s", "sample_s", "nn_s", "fid_s", "loss_s")
"""Keys of a metrics.jsonl line that hold a number or null."""
PAIRS_NUMBERS = ("bias", "bias_lo", "bias_hi", "pair_distance", "pair_distance_lo", "pair_distance_hi",
                 "own_fraction", "own_fraction_lo", "own_fraction_hi", "f_mem_a", "f_mem_b", "wall_s")
"""Keys of a pairs.jsonl line that hold a number or null."""
FRACTIONS = ("f_mem", "f_mem_lo", "f_mem_hi", "own_fraction", "own_fraction_lo", "own_fraction_hi", "f_mem_a",
             "f_mem_b")
"""Keys that hold a fraction in [0, 1] (or null)."""


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
    samples = record.get("n_samples")
    if samples is not None and (not is_int(samples) or samples < 1):
        return f"'n_samples' is {samples!r}, not a positive integer"
    if samples is not None and min_samples is not None and samples < min_samples:
        return (f"'n_samples' is {samples}, fewer than the run's eval.n_samples = {min_samples} (an evaluation never "
                "draws fewer): a line of another run")
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
