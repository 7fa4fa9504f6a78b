"""The run folder: the on-disk contract between training, evaluation and analysis (see docs/run-folder.md).

```
<run>/config.json                  resolved RunConfig + version + git sha + dataset sha256 + parameter count
<run>/state.pt                     latest full training state, atomically replaced
<run>/checkpoints/step_XXXXXXXXX.pt  model weights at each evaluation step
<run>/metrics.jsonl                one JSON object per evaluation, appended
<run>/samples/step_XXXXXXXXX.png   sample grid of that evaluation
<run>/done                         written last
<run>/state.prev.pt                the state.pt before the latest one (resume falls back to it if state.pt is damaged)
<run>/state.damaged.pt             a damaged state.pt set aside by such a fallback (for inspection; never read)
<run>/lock                         held while a process trains or evaluates the run: JSON {pid, host, started,
                                   started_unix, token}; its mtime is the holder's heartbeat
<run>/checkpoints/step_XXXXXXXXX.damaged.pt  a damaged checkpoint set aside when training wrote it again (never read)
<experiment>/pairs.jsonl           one JSON object per (split pair, evaluation step), appended (`diffmem pairs`)
<experiment>/pairs.lock            held while `diffmem pairs` appends to it
```

:func:`read_config` is the one reader of config.json: every damaged, empty, wrong-typed or newer-version file becomes a
one-line :class:`ConfigFileError` naming the file and the way out, and the config in it is validated like any other
(:func:`diffmem.config.validate`).

:class:`RunLock` keeps two processes off one run folder. Its holder refreshes the lock file's mtime (the heartbeat)
every ``heartbeat_s`` seconds from a background thread, so a lock is stale, and is taken over, when its holder is a
dead process on this host or when its heartbeat is older than ``stale_s`` (a job requeued on another node while the
old one is gone).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem import __version__
from diffmem.config import SECTIONS, ConfigError, RunConfig, config_from_dict
from diffmem.io import WriteFailed, read_jsonl
from diffmem.schedule import evaluation_steps

LOCK_HEARTBEAT_S = 30.0  # seconds between two refreshes of the lock file's mtime by its holder
LOCK_STALE_S = 600.0  # a lock whose mtime is older than this (seconds) is stale, whatever its host
# every lock this process takes is younger than this module; an older lock with our pid was left by an earlier process
# that had the same pid (pid reuse, e.g. a requeued job in a fresh container)
_MODULE_LOADED_UNIX = time.time()

PAIRS_FILE = "pairs.jsonl"  # <experiment>/pairs.jsonl: one line per (split pair, step), `diffmem pairs`, appended
PAIRS_LOCK = "pairs.lock"  # <experiment>/pairs.lock: held while `diffmem pairs` appends to it
_STEP_FILE = re.compile(r"^step_(\d{9})\.pt$")
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

    def checkpoint_steps(self) -> list[int]:
        """Steps that have a saved checkpoint, ascending."""
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.checkpoint_dir.iterdir() if (m := _STEP_FILE.match(p.name)))

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def evaluated_steps(self) -> set[int]:
        return {int(r["step"]) for r in self.metrics()}

    def is_done(self) -> bool:
        return self.done_path.exists()

    def read_config(self) -> StoredConfig | None:
        """This run's config.json, read and validated (:func:`read_config`); None for a new run folder."""
        return read_config(self)

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
        """Delete the temporary files that writes killed half-way left behind (``.NAME.*.tmp``, ``.NAME.tmp.png``)
        and the scratch folders of a retraining killed half-way (``.retrain.*``); only call this while holding the
        run's lock. Returns the paths deleted."""
        removed = []
        for folder in (self.path, self.checkpoint_dir, self.samples_dir):
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".tmp.png")):
                    p.unlink(missing_ok=True)
                    removed.append(p)
                elif folder == self.path and p.name.startswith(RETRAIN_PREFIX) and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        return removed


class RunLocked(RuntimeError):
    """Another live process holds the run folder's lock."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs: ``pid`` > 0, it exists and, where /proc tells, it is not a
    zombie (an ended job whose parent has not reaped it yet). Lock holders and local jobs are checked with it."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS) or it just ended: trust kill
        return True
    return stat[stat.rfind(")") + 2:][:1] != "Z"  # the state letter follows the command name in parentheses


class RunLock:
    """An exclusive, heartbeat-refreshed lock file for one run folder; use as ``with RunLock(run): ...``.

    ``acquire`` creates ``<run>/lock`` (creating the folder) or raises :class:`RunLocked` naming the holder's pid,
    host and start time. A stale lock (holder dead on this host, or mtime older than ``stale_s`` seconds) is taken
    over with a warning. While held, a daemon thread touches the file every ``heartbeat_s`` seconds; ``check``
    raises RunLocked if another process has taken the lock over meanwhile (e.g. after this one was frozen).
    ``release`` (also on every exit of the ``with`` block) stops the thread and deletes the file if it is still ours.
    ``name``: the lock file in the folder (``<experiment>/pairs.lock`` guards an experiment's pairs.jsonl).
    """

    def __init__(self, run: RunDir, heartbeat_s: float = LOCK_HEARTBEAT_S, stale_s: float = LOCK_STALE_S,
                 name: str = "lock"):
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"lock heartbeat_s = {heartbeat_s} must be > 0 and below stale_s = {stale_s}")
        self.run, self.heartbeat_s, self.stale_s = run, heartbeat_s, stale_s
        self.path = run.path / name  # "lock": the run's lock_path; another name locks another file of the folder
        self.token: str | None = None
        self.lost: str | None = None  # why the lock was lost, set by the heartbeat thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading a lock file ------------------------------------------------------------------------------------
    def holder(self) -> dict[str, Any] | None:
        """The lock file's content, {} when it exists but is unreadable (cut short), None when there is no lock."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        try:
            info = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return info if isinstance(info, dict) else {}

    def _stale_reason(self, info: dict[str, Any]) -> str | None:
        """Why the lock described by ``info`` is stale, or None when its holder may be alive."""
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return "it is gone"
        if age > self.stale_s:
            return f"its heartbeat is {age:.0f} s old (> {self.stale_s:.0f} s)"
        if not info:
            # unreadable: a holder killed while writing it (it writes the content before linking the file in)
            return None if age < self.heartbeat_s else "it is empty or damaged"
        if info.get("host") == socket.gethostname():
            try:
                pid = int(info.get("pid", -1))
            except (TypeError, ValueError):
                return f"its pid {info.get('pid')!r} is not a number"
            if pid == os.getpid():
                if float(info.get("started_unix", 0.0)) < _MODULE_LOADED_UNIX:
                    return f"it was left by an earlier process with this process's pid {pid}"
                return None  # held by this very process (another RunLock on the same folder)
            if not pid_alive(pid):
                return f"its process {pid} on this host is dead"
        return None

    @staticmethod
    def describe(info: dict[str, Any]) -> str:
        return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {info.get('started', '?')}"
                if info else "an unreadable lock")

    # -- acquiring and releasing ----------------------------------------------------------------------------------
    def acquire(self) -> "RunLock":
        if self.token is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        try:
            self.run.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteFailed.of(self.run.path, e) from e
        token = uuid.uuid4().hex
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "started_unix": time.time(), "token": token}
        for _attempt in range(5):
            try:
                created = self._create(info)
            except OSError as e:
                raise WriteFailed.of(self.path, e) from e
            if created:
                if (self.holder() or {}).get("token") == token:
                    self.token, self.lost = token, None
                    self._start_heartbeat()
                    return self
                continue  # somebody replaced it between our create and our read: look again
            current = self.holder()
            if current is None:
                continue  # released meanwhile
            reason = self._stale_reason(current)
            if reason is None:
                raise RunLocked(f"{self.run.path} is in use by {self.describe(current)} (lock file {self.path}); "
                                "wait for that process to end, or delete the lock file if it is gone")
            if self.holder() == current:  # still the same stale lock: remove it and try again
                warnings.warn(f"{self.path}: taking over the stale lock of {self.describe(current)}: {reason}")
                self.path.unlink(missing_ok=True)
        raise RunLocked(f"{self.run.path}: could not take its lock file {self.path} (other processes keep taking "
                        "it); make sure only one job works on this run")

    def _create(self, info: dict[str, Any]) -> bool:
        """Put a complete lock file in place unless one exists (write a temp file, then hard-link it in)."""
        tmp = self.path.with_name(f".{self.path.name}.{info['token']}.locktmp")  # not one of remove_temp_files
        tmp.write_text(json.dumps(info) + "\n")
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive create, then write
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(info) + "\n")
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lock heartbeat {self.run.path.name}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.refresh()

    def refresh(self) -> None:
        """Touch the lock file (the heartbeat); note in ``lost`` if another process holds it now."""
        current = self.holder()
        if current is None or (current and current.get("token") != self.token):
            self.lost = f"the lock file {self.path} now belongs to {self.describe(current or {})}"
            return
        try:
            os.utime(self.path)
        except OSError:
            pass  # a transient file-system error; the next beat tries again

    def check(self) -> None:
        """Raise RunLocked when another process has taken this run's lock over (this one was presumed dead)."""
        if self.lost is not None:
            raise RunLocked(f"{self.run.path}: {self.lost}; stopping so that only one process writes this run")

    def release(self) -> None:
        if self.token is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if (self.holder() or {}).get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self.token = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
