"""The lock that keeps two processes off one run folder (:class:`RunLock`), and whether a process of this machine
still runs (:func:`pid_alive`).

The holder refreshes the lock file's mtime (the heartbeat) every ``heartbeat_s`` seconds from a background thread, so
a lock is stale, and is taken over, when its holder is a dead process on this host or when its heartbeat is older than
``stale_s`` (a job requeued on another node while the old one is gone).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from diffmem.io import WriteFailed
from diffmem.rundir.folder import RunDir

LOCK_HEARTBEAT_S = 30.0  # seconds between two refreshes of the lock file's mtime by its holder
LOCK_STALE_S = 600.0  # a lock whose mtime is older than this (seconds) is stale, whatever its host
# every lock this process takes is younger than this module; an older lock with our pid was left by an earlier process
# that had the same pid (pid reuse, e.g. a requeued job in a fresh container)
_MODULE_LOADED_UNIX = time.time()


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
