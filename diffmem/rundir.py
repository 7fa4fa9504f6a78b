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
```

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
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem.io import WriteFailed, read_jsonl

LOCK_HEARTBEAT_S = 30.0  # seconds between two refreshes of the lock file's mtime by its holder
LOCK_STALE_S = 600.0  # a lock whose mtime is older than this (seconds) is stale, whatever its host
# every lock this process takes is younger than this module; an older lock with our pid was left by an earlier process
# that had the same pid (pid reuse, e.g. a requeued job in a fresh container)
_MODULE_LOADED_UNIX = time.time()

_STEP_FILE = re.compile(r"^step_(\d{9})\.pt$")


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

    def remove_temp_files(self) -> list[Path]:
        """Delete the temporary files that writes killed half-way left behind (``.NAME.*.tmp``, ``.NAME.tmp.png``);
        only call this while holding the run's lock. Returns the files deleted."""
        removed = []
        for folder in (self.path, self.checkpoint_dir, self.samples_dir):
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".tmp.png")):
                    p.unlink(missing_ok=True)
                    removed.append(p)
        return removed


class RunLocked(RuntimeError):
    """Another live process holds the run folder's lock."""


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is running (a zombie counts as dead)."""
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
    except OSError:
        return True  # no /proc (macOS): trust kill
    return stat[stat.rfind(")") + 2:][:1] != "Z"


class RunLock:
    """An exclusive, heartbeat-refreshed lock file for one run folder; use as ``with RunLock(run): ...``.

    ``acquire`` creates ``<run>/lock`` (creating the folder) or raises :class:`RunLocked` naming the holder's pid,
    host and start time. A stale lock (holder dead on this host, or mtime older than ``stale_s`` seconds) is taken
    over with a warning. While held, a daemon thread touches the file every ``heartbeat_s`` seconds; ``check``
    raises RunLocked if another process has taken the lock over meanwhile (e.g. after this one was frozen).
    ``release`` (also on every exit of the ``with`` block) stops the thread and deletes the file if it is still ours.
    """

    def __init__(self, run: RunDir, heartbeat_s: float = LOCK_HEARTBEAT_S, stale_s: float = LOCK_STALE_S):
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"lock heartbeat_s = {heartbeat_s} must be > 0 and below stale_s = {stale_s}")
        self.run, self.heartbeat_s, self.stale_s = run, heartbeat_s, stale_s
        self.path = run.lock_path
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
            if not _pid_alive(pid):
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
