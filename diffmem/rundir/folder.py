"""One run folder's paths and simple queries (:class:`RunDir`), and the one reader of its config.json
(:func:`read_config`, :class:`StoredConfig`). The folder's layout: :mod:`diffmem.rundir`.

:func:`read_config` turns every damaged, empty, wrong-typed or newer-version file into a one-line
:class:`ConfigFileError` naming the file and the way out, and validates the config in it like any other
(:func:`diffmem.config.validate`).
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem import __version__
from diffmem.config import SECTIONS, ConfigError, RunConfig, config_from_dict
from diffmem.rundir.records import copies_lines, metrics_lines
from diffmem.eval_grid import evaluation_steps
from diffmem.io import is_temp_name

PAIRS_FILE = "pairs.jsonl"  # <experiment>/pairs.jsonl: one line per (split pair, step), `diffmem pairs`, appended
PAIRS_LOCK = "pairs.lock"  # <experiment>/pairs.lock: held while `diffmem pairs` appends to it
_STEP_FILE = re.compile(r"^step_(\d{9})\.pt$")
TEMP_TARGETS = {
    "run": re.compile(r"config\.json|state\.pt|state\.prev\.pt|images\.json|done|failed|lock|job\.json|"
                      r"submissions\.json"),
    "checkpoints": re.compile(r"step_\d{9}(\.damaged)?\.pt"),
    "samples": re.compile(r"(first_copies_)?step_\d{9}\.png"),
}
"""The files diffmem writes atomically in a run folder, its checkpoints/ and its samples/: the only ones whose
temporary files (:func:`diffmem.io.is_temp_name`) a rerun cleans up."""
RETRAIN_PREFIX = ".retrain."  # scratch folders in a run folder where training writes lost checkpoints again
RESTORE = ("restore it from a copy (it is the run's only record of its settings; the run's other files are "
           "untouched)")


class ConfigFileError(ValueError):
    """A run folder's config.json that cannot be read; the one-line message names the file and the way out."""


class FolderError(ValueError):
    """A path given as a folder (a run or experiment folder) that is something else."""


def require_folder(path: str | Path, flag: str = "--out") -> None:
    """Raise FolderError when ``path`` exists and is not a folder (a file given as ``flag``); a missing path is
    fine (the command creates it)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FolderError(f"{flag} {path} is a file, not a folder; pass a folder (a new one, or the folder to "
                          "continue)")


def not_a_folder(path: str | Path) -> str | None:
    """Why a folder to read is not there, for its error line: "does not exist" or "is a file, not a folder"; None
    when ``path`` is a folder."""
    path = Path(path)
    if path.is_dir():
        return None
    return "is a file, not a folder" if path.exists() else "does not exist"


def _version_tuple(version: Any) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version) if isinstance(version, str) else None
    return tuple(int(g or 0) for g in match.groups()) if match else None


def written_by_newer(version: Any) -> bool:
    """True when ``version`` (a config.json's ``diffmem_version``) is newer than this diffmem."""
    mine, theirs = _version_tuple(__version__), _version_tuple(version)
    return mine is not None and theirs is not None and theirs > mine


@dataclass(frozen=True)
class StoredConfig:
    """A run folder's config.json as :func:`read_config` read it: the whole file and its validated config."""

    path: Path
    meta: dict[str, Any]  # the whole file: config, diffmem_version, dataset_sha256, params, extended, ...
    config: RunConfig  # its config, with the keys it predates filled (LEGACY_VALUES) and validated

    @property
    def raw(self) -> dict[str, Any]:
        """The ``config`` object as written (without the keys filled for an older diffmem)."""
        return self.meta["config"]

    def budgets(self) -> list[int]:
        """train.steps of every budget the run has had, oldest first (optimizer steps): the ``from_steps`` of its
        ``extended`` history, then the current budget."""
        history = self.meta.get("extended", [])
        earlier = [e.get("from_steps") for e in history if isinstance(e, dict)] if isinstance(history, list) else []
        return [b for b in earlier if isinstance(b, int) and not isinstance(b, bool)] + [self.config.train.steps]

    def scheduled_steps(self) -> list[int]:
        """The evaluation steps the run certainly checkpointed (and, inline, evaluated) once trained past them,
        ascending: its evaluation grid. For a run whose budget grew, a step of an earlier budget's grid counts only
        when every later budget's grid has it too, because the step at which a budget grew is not recorded."""
        budgets, times = self.budgets(), self.config.eval.times
        out: set[int] = set()
        for i, budget in enumerate(budgets):
            later = [set(evaluation_steps(times, b)) for b in budgets[i + 1:]]
            lower = budgets[i - 1] if i else 0
            out.update(s for s in evaluation_steps(times, budget) if s > lower and all(s in g for g in later))
        return sorted(out)


def read_config(run: RunDir) -> StoredConfig | None:
    """The config.json of ``run`` read and validated; None when there is none (a new run folder).

    Raises ConfigFileError, one line naming the file and the way out, for a file that is empty, cut short, not JSON,
    not an object with a ``config`` object holding every section, or whose config does not read or validate (then
    naming the key; a file written by a newer diffmem says so and asks for an upgrade instead).
    """
    path = run.config_path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path} is damaged (not UTF-8 text); {RESTORE}") from None
    if not text.strip():
        raise ConfigFileError(f"{path} is empty; {RESTORE}")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigFileError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}: cut short or "
                              f"damaged); {RESTORE}") from None
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        raise ConfigFileError(f"{path} is not a diffmem run config (a JSON object with a 'config' object, as "
                              f"`diffmem train` writes it); {RESTORE}")
    missing = [name for name in SECTIONS if not isinstance(config.get(name), dict)]
    if missing:
        raise ConfigFileError(f"{path} lacks the [{missing[0]}] section of its config; {RESTORE}")
    version = meta.get("diffmem_version")
    try:
        cfg = config_from_dict(config)
    except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as e:  # ConfigError is a ValueError
        detail = str(e).split("; ")[0] if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
        if written_by_newer(version):
            raise ConfigFileError(f"{path} was written by diffmem {version}, newer than this diffmem {__version__}, "
                                  f"which cannot read it ({detail}); upgrade diffmem to work with this run") from None
        raise ConfigFileError(f"{path}: {detail}; this diffmem cannot use the run with that: restore the file from a "
                              "copy, or move the run folder out of the experiment folder") from None
    return StoredConfig(path, meta, cfg)


@dataclass(frozen=True)
class RunDir:
    """Paths and simple queries of one run folder."""

    path: Path

    def __init__(self, path: str | Path):
        object.__setattr__(self, "path", Path(path))

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def state_path(self) -> Path:
        return self.path / "state.pt"

    @property
    def state_prev_path(self) -> Path:
        return self.path / "state.prev.pt"

    @property
    def lock_path(self) -> Path:
        return self.path / "lock"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def copies_path(self) -> Path:
        """copies.jsonl: one line per evaluation, which training images its samples landed on and copied."""
        return self.path / "copies.jsonl"

    @property
    def images_path(self) -> Path:
        """images.json: the source indices of the run's train set, non-members, control and held-out pool."""
        return self.path / "images.json"

    @property
    def image_losses_path(self) -> Path:
        """image_losses.jsonl: per evaluation, each training and control image's loss per noise level."""
        return self.path / "image_losses.jsonl"

    @property
    def samples_dir(self) -> Path:
        return self.path / "samples"

    @property
    def done_path(self) -> Path:
        return self.path / "done"

    @property
    def failed_path(self) -> Path:
        """Written when training stops on an error that a rerun would repeat (a NaN loss); holds the message."""
        return self.path / "failed"

    @staticmethod
    def step_name(step: int) -> str:
        return f"step_{step:09d}"

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoint_dir / f"{self.step_name(step)}.pt"

    def samples_path(self, step: int) -> Path:
        return self.samples_dir / f"{self.step_name(step)}.png"

    def first_copies_path(self, step: int) -> Path:
        """The strip of the copies of the training images first copied at ``step`` (copies.jsonl ``first_copies``)."""
        return self.samples_dir / f"first_copies_{self.step_name(step)}.png"

    def checkpoint_steps(self) -> list[int]:
        """Steps that have a saved checkpoint, ascending."""
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.checkpoint_dir.iterdir() if (m := _STEP_FILE.match(p.name)))

    def metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl in file order, each validated against this run's config.json (its budget
        and eval.n_samples; :func:`diffmem.rundir.records.metrics_lines`): a bad line is a one-line RecordError."""
        stored = self.read_config() if self.config_path.exists() else None
        budget = stored.config.train.steps if stored else None
        samples = stored.config.eval.n_samples if stored else None
        return [record for _, record in metrics_lines(self.metrics_path, budget, samples)]

    def copies(self) -> list[dict[str, Any]]:
        """The records of copies.jsonl in file order ([] for a folder written before it), each validated against
        this run's config.json (budget, N, eval.n_samples; :func:`diffmem.rundir.records.copies_lines`): a bad line
        is a one-line RecordError."""
        stored = self.read_config() if self.config_path.exists() else None
        if stored is None:
            return [record for _, record in copies_lines(self.copies_path)]
        cfg = stored.config
        return [record for _, record in copies_lines(self.copies_path, cfg.train.steps, cfg.data.n, cfg.eval.n_samples)]

    def evaluated_steps(self) -> set[int]:
        return {r["step"] for r in self.metrics()}

    def is_done(self) -> bool:
        return self.done_path.exists()

    def read_config(self) -> StoredConfig | None:
        """This run's config.json, read and validated (:func:`read_config`); None for a new run folder."""
        return read_config(self)

    def recorded_dataset_sha256(self) -> str | None:
        """The sha256 of the images this run trained on, as its config.json records it; None for a new run folder
        or a config.json without it (what :meth:`diffmem.data.ImageSet.check_recorded` compares the data found to)."""
        stored = self.read_config()
        return stored.meta.get("dataset_sha256") if stored else None

    def done_step(self) -> int | None:
        """The step at which training ended (optimizer steps), from the ``steps N`` line of ``done``; None when
        there is no ``done`` or no such line."""
        try:
            text = self.done_path.read_text()
        except (OSError, UnicodeDecodeError):
            return None
        match = re.search(r"^steps (\d+)$", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def trained_step(self) -> int:
        """The last optimizer step the run is known to have reached, without reading its state: the ``steps`` line
        of ``done``, else its last checkpoint or metrics line (0 for none)."""
        step = self.done_step()
        return step if step is not None else max([*self.checkpoint_steps(), *self.evaluated_steps(), 0])

    def unevaluated(self, scheduled: list[int], upto: int) -> list[int]:
        """The steps of ``scheduled`` up to step ``upto`` (optimizer steps) that have no metrics line."""
        evaluated = self.evaluated_steps()
        return [s for s in scheduled if s <= upto and s not in evaluated]

    def remove_temp_files(self) -> list[Path]:
        """Delete the temporary files that writes killed half-way left behind and the scratch folders of a
        retraining killed half-way (``.retrain.*``, real folders only); only call this while holding the run's lock.
        Only diffmem's own temporary files go, by name (``.<file>.<8 characters>.tmp`` of a file diffmem writes in
        that folder, :data:`TEMP_TARGETS`), so that a ``checkpoints/`` or ``samples/`` linked to a shared disk loses
        nothing of anyone else's. Returns the paths deleted."""
        removed = []
        for folder, targets in ((self.path, TEMP_TARGETS["run"]), (self.checkpoint_dir, TEMP_TARGETS["checkpoints"]),
                                (self.samples_dir, TEMP_TARGETS["samples"])):
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                if is_temp_name(p.name, targets) and (p.is_symlink() or p.is_file()):
                    p.unlink(missing_ok=True)  # a link itself, never its target
                    removed.append(p)
                elif (folder == self.path and p.name.startswith(RETRAIN_PREFIX) and p.is_dir()
                      and not p.is_symlink()):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        return removed
