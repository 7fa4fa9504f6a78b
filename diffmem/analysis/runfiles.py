"""Reading run folders (config.json + metrics.jsonl + done); reading and writing the analysis files (atomically).

The run folder is the contract between training/evaluation and analysis::

    <experiment_dir>/<run>/config.json     {"config": {"data": {"n": ...}, "model": {"width": ...},
                                             "train": {"steps": ..., "seed": ...}, "eval": {...}}, "params": ...}
    <experiment_dir>/<run>/metrics.jsonl   one JSON object per evaluation (step, f_mem, f_mem_lo, f_mem_hi, fid,
                                           fid_extractor, train_loss, test_loss, ...; null = switched off)
    <experiment_dir>/<run>/done            present when the run finished
    <experiment_dir>/pairs.jsonl           one JSON object per (split pair, step): pair, run_a, run_b, n, width,
                                           seed_train, step, bias, bias_lo, bias_hi, ... (`diffmem pairs`)

An experiment folder holds run folders; a run folder on its own is an experiment of one run.
"""
from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from diffmem.config import RunConfig
from diffmem.io import atomic_write_text
from diffmem.rundir import PAIRS_FILE, ConfigFileError, RunDir, metrics_lines, not_a_folder, pairs_lines


class RunFolderError(ValueError):
    """A run or experiment folder that does not follow the contract; the message says which file and what to do."""


class MetricsLineWarning(UserWarning):
    """A record of metrics.jsonl could not be used and was skipped."""


@dataclass(frozen=True)
class RunCost:
    """What a run cost, from its metrics.jsonl: ``train_s`` the seconds spent in training steps (the largest
    cumulative ``train_s`` recorded: resumes carry it on, evaluations are not in it) and ``eval_s`` the seconds of
    every evaluation line (the sum of ``wall_s``, refinement and re-evaluations included). None where no line
    records it (metrics written before diffmem recorded them)."""

    train_s: float | None
    eval_s: float | None

    @property
    def total_s(self) -> float | None:
        """train_s + eval_s (None unless both are known): the run's compute time in seconds on its threads."""
        return None if self.train_s is None or self.eval_s is None else self.train_s + self.eval_s


@dataclass(frozen=True)
class RunRecord:
    """One run folder as read from disk.

    ``evaluations`` are the metrics.jsonl records sorted by step, one per step (a re-evaluated step keeps its last
    record). ``planned_steps`` is train.steps from the config; ``params`` the parameter count (None if absent);
    ``config`` the whole config it was trained with.
    """

    name: str
    path: Path
    n: int
    width: int
    seed: int
    params: int | None
    batch: int  # the effective batch, min(train.batch_size, n) (images per optimizer step)
    planned_steps: int | None
    mem_threshold: float | None
    mem_levels: tuple[float, ...]  # eval.mem_levels: the f_mem levels whose crossing steps are read (analysis only)
    done: bool
    evaluations: tuple[dict[str, Any], ...]
    config: RunConfig  # the run's validated config (what it was: data source, image size, model, optimizer, ...)
    cost: RunCost = RunCost(None, None)  # seconds of training and of evaluation, from metrics.jsonl

    @property
    def state(self) -> str:
        """"done" (finished), "partial" (evaluations but no done file) or "empty" (no evaluation yet)."""
        if self.done:
            return "done"
        return "partial" if self.evaluations else "empty"

    @property
    def steps(self) -> np.ndarray:
        """Evaluated optimizer steps, increasing (float array, shape (n_evals,))."""
        return np.array([float(e["step"]) for e in self.evaluations], dtype=float)

    def series(self, key: str) -> np.ndarray:
        """The metric ``key`` per evaluation as floats, NaN where null or absent (shape (n_evals,))."""
        return column(self.evaluations, key)

    def last_value(self, key: str) -> Any:
        """The last non-null value of ``key`` over the evaluations, or None."""
        for e in reversed(self.evaluations):
            if e.get(key) is not None:
                return e[key]
        return None


def column(records: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    """``key`` of each record as floats, NaN where null, absent or not a number (shape (len(records),))."""
    out = []
    for e in records:
        v = e.get(key)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan)
    return np.array(out, dtype=float)


@dataclass(frozen=True)
class PairRecord:
    """One split pair as read from ``pairs.jsonl`` (:func:`read_pairs`): its id ``pair`` (the split-0 run's name),
    its two runs, N, W and training seed, and its lines sorted by step, one per step. ``steps`` and ``series`` read
    like a :class:`RunRecord`'s, so the figures draw a pair's measures (bias, pair_distance, own_fraction, each with
    ``_lo`` / ``_hi``) with the helpers that draw a run's metrics."""

    pair: str
    run_a: str
    run_b: str
    n: int
    width: int
    seed: int
    lines: tuple[dict[str, Any], ...]

    @property
    def steps(self) -> np.ndarray:
        """Paired evaluation steps (optimizer steps), increasing (float array, shape (n_lines,))."""
        return np.array([float(e["step"]) for e in self.lines], dtype=float)

    def series(self, key: str) -> np.ndarray:
        """The measure ``key`` per paired evaluation as floats, NaN where null or absent (shape (n_lines,))."""
        return column(self.lines, key)


def pair_records(lines_by_pair: dict[str, list[dict[str, Any]]]) -> dict[str, PairRecord]:
    """:class:`PairRecord` per pair id from :func:`read_pairs`'s lines (run names, N, W, seed from the first line)."""
    out = {}
    for pair, lines in lines_by_pair.items():
        first = lines[0]
        out[pair] = PairRecord(pair, str(first.get("run_a", pair)), str(first.get("run_b", "")), int(first["n"]),
                               int(first["width"]), int(first["seed_train"]), tuple(lines))
    return out


def is_run_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def find_run_folders(experiment_dir: str | Path) -> list[Path]:
    """Run folders of an experiment, sorted by name; the folder itself when it is a run folder."""
    root = Path(experiment_dir)
    if problem := not_a_folder(root):
        raise RunFolderError(f"experiment folder '{root}' {problem}; pass the folder that holds the run folders")
    if is_run_folder(root):
        return [root]
    runs = sorted(p for p in root.iterdir() if p.is_dir() and is_run_folder(p))
    if not runs:
        raise RunFolderError(f"'{root}' holds no run folder (a subfolder with config.json); pass an experiment "
                             "folder written by `diffmem train` or `diffmem sweep`")
    return runs


def read_metrics(path: str | Path, budget: int | None = None,
                 min_samples: int | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file, sorted by step, one per step (the last record of a step wins).

    Every line is validated (:func:`diffmem.rundir.metrics_lines`; ``budget``: the run's train.steps, ``min_samples``
    its eval.n_samples): a bad line is a one-line RecordError naming the file and line, never skipped; a last line
    without its newline (a write cut short) is not recorded and is skipped with a warning. A missing file gives an
    empty list.
    """
    return latest_per_step(read_metrics_lines(path, budget, min_samples))


def read_metrics_lines(path: str | Path, budget: int | None = None,
                       min_samples: int | None = None) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file in file order, evaluations of a step again (refinement) included; the
    reading rules of :func:`read_metrics`."""
    return [record for _, record in metrics_lines(path, budget, min_samples)]


def run_cost(lines: Sequence[dict[str, Any]]) -> RunCost:
    """The :class:`RunCost` of a run's metrics lines (:func:`read_metrics_lines`)."""
    def numbers(key: str) -> list[float]:
        return [float(r[key]) for r in lines if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)
                and math.isfinite(r[key])]

    train, wall = numbers("train_s"), numbers("wall_s")
    return RunCost(max(train) if train else None, sum(wall) if wall else None)


def latest_per_step(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics records sorted by step, one per step: the last record of a step wins (a step evaluated again, or
    refinement lines appended after later steps)."""
    by_step = {float(r["step"]): r for r in records}
    return [by_step[k] for k in sorted(by_step)]


def read_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder (config.json through :func:`diffmem.rundir.read_config`, metrics.jsonl, done). A run
    marked done without any evaluation is read with a warning (its metrics.jsonl is missing or empty)."""
    run_dir = Path(run_dir)
    try:
        stored = RunDir(run_dir).read_config()
    except ConfigFileError as e:
        raise RunFolderError(str(e)) from None
    if stored is None:
        raise RunFolderError(f"'{run_dir}' has no config.json; it is not a run folder")
    cfg, meta = stored.config, stored.meta
    params = meta.get("params")
    batch = meta.get("batch_size")
    done = (run_dir / "done").exists()
    lines = read_metrics_lines(run_dir / "metrics.jsonl", cfg.train.steps, cfg.eval.n_samples)
    evaluations = tuple(latest_per_step(lines))
    if done and not evaluations:
        warnings.warn(f"run {run_dir.name} is marked done but has no evaluations ({run_dir / 'metrics.jsonl'} is "
                      "missing or empty); rerun `diffmem train` with the command that trained it to evaluate its "
                      "checkpoints again", MetricsLineWarning, stacklevel=2)
    return RunRecord(
        name=run_dir.name,
        path=run_dir,
        n=cfg.data.n,
        batch=int(batch) if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else cfg.batch_size,
        width=cfg.model.width,
        seed=cfg.train.seed,
        params=int(params) if isinstance(params, (int, float)) and not isinstance(params, bool) else None,
        planned_steps=cfg.train.steps,
        mem_threshold=cfg.eval.mem_threshold,
        mem_levels=cfg.eval.mem_levels,
        done=done,
        evaluations=evaluations,
        config=cfg,
        cost=run_cost(lines),
    )


def read_experiment(experiment_dir: str | Path) -> list[RunRecord]:
    """Every run of an experiment folder (or the one run when the folder is a run folder)."""
    return [read_run(p) for p in find_run_folders(experiment_dir)]


def read_pairs(experiment_dir: str | Path, budgets: dict[str, int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The lines of ``<experiment_dir>/pairs.jsonl`` (``diffmem pairs``) per split pair (its ``pair`` id), each
    pair's lines sorted by step, one per step (the last line of a step wins); {} when the file is missing. Every
    line is validated (:func:`diffmem.rundir.pairs_lines`; ``budgets``: train.steps by run name): a bad line is a
    one-line RecordError naming the file and line, never skipped."""
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for _, record in pairs_lines(Path(experiment_dir) / PAIRS_FILE, budgets):
        by_pair.setdefault(record["pair"], []).append(record)
    return {pair: latest_per_step(records) for pair, records in sorted(by_pair.items())}


# --- summary.csv and fits.json --------------------------------------------------------------------------------------

def _format_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"
    return str(value)


def write_csv(path: str | Path, columns: Iterable[str], rows: Iterable[dict[str, Any]]) -> Path:
    """Write rows (dicts keyed by column) as CSV: empty cell = null, booleans as true/false. Atomic."""
    columns = list(columns)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_format_cell(row.get(c)) for c in columns])
    atomic_write_text(path, buffer.getvalue())
    return Path(path)


def _parse_cell(text: str) -> Any:
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, cells typed back (int, float, bool, str; None for empty)."""
    path = Path(path)
    if not path.is_file():
        raise RunFolderError(f"'{path}' does not exist; run `diffmem analyze` on the experiment folder first")
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (NaN/inf become null). Atomic."""
    atomic_write_text(path, json.dumps(_json_safe(obj), indent=2) + "\n")
    return Path(path)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise RunFolderError(f"'{path}' does not exist; run `diffmem analyze` on the experiment folder first")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path} is not valid JSON ({e}); rerun `diffmem analyze`") from None


# --- figures/index.json ---------------------------------------------------------------------------------------------

FIGURE_INDEX = "index.json"
"""The file in ``<experiment>/figures/`` that lists the figures of the last drawing: one entry per figure,
``{"name": ..., "files": [file names in figures/], "skipped": reason or null}`` (written by diffmem.figures, read by
diffmem.analysis.report)."""


def write_figure_index(figures_dir: str | Path, entries: Iterable[tuple[str, Sequence[str], str | None]]) -> Path:
    """Write :data:`FIGURE_INDEX` in ``figures_dir`` from (name, file names, skipped reason or None) per figure;
    atomic."""
    return write_json(Path(figures_dir) / FIGURE_INDEX,
                      [{"name": name, "files": list(files), "skipped": skipped} for name, files, skipped in entries])


def read_figure_index(figures_dir: str | Path) -> list[dict[str, Any]] | None:
    """The entries of :data:`FIGURE_INDEX` in ``figures_dir``; None when no figures were drawn there."""
    path = Path(figures_dir) / FIGURE_INDEX
    if not path.is_file():
        return None
    entries = read_json(path)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e for e in entries):
        raise RunFolderError(f"{path} is not a figure index; rerun `diffmem analyze`")
    return entries


def quality_se(record: dict[str, Any]) -> float | None:
    """The standard error of one evaluation's FID (FD): its bootstrap over samples (``fid_boot_std``) when recorded,
    else the spread over its K reference sets divided by sqrt K (``fid_std``), else None. (Here, not in
    :mod:`diffmem.analysis.timescales`, so that TensorBoard's reader of run folders imports no scipy.)"""
    if record.get("fid_boot_std") is not None:
        return float(record["fid_boot_std"])
    if record.get("fid_std") is not None and record.get("fid_sets"):
        return float(record["fid_std"]) / float(np.sqrt(len(record["fid_sets"])))
    return None
