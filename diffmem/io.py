"""Crash-safe file writing: atomic replacement (temp file + fsync + rename) and append-only JSON lines.

A reader never sees a half-written file: every whole-file write goes to a temporary file in the same folder, is
flushed to disk, then renamed over the target; ``keep_previous`` also keeps the file it replaces under another name.
JSON-lines files are only ever appended to; a line cut short by a crash is dropped by the reader and removed by the
next append. A write that fails (disk full, read-only folder) raises :class:`WriteFailed`, a one-line OSError naming
the file, and leaves the old content in place.
"""
from __future__ import annotations

import errno
import io
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch


class WriteFailed(OSError):
    """A file could not be written (disk full, read-only folder, quota); its previous content is intact."""

    @classmethod
    def of(cls, path: str | Path, error: OSError) -> "WriteFailed":
        """The one-line error for ``error`` raised while writing ``path``, with what to do about it."""
        reason = error.strerror or type(error).__name__
        code = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
        hint = {errno.ENOSPC: "free disk space", errno.EDQUOT: "free disk quota",
                errno.EROFS: "make the file system writable", errno.EACCES: "make the folder writable",
                errno.EPERM: "make the folder writable"}.get(error.errno, "fix the cause")
        failed = cls(f"could not write {path}: {reason}{f' ({code})' if code else ''}; the file was left as it was: "
                     f"{hint}, then rerun the same command")
        failed.errno, failed.filename = error.errno, str(path)
        return failed

    def __str__(self) -> str:  # the message alone (OSError would print "[Errno N] strerror: filename")
        return str(self.args[0]) if self.args else super().__str__()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, keep_previous: str | Path | None = None) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of ``data``.

    ``keep_previous``: once ``data`` is safely on disk, the file being replaced is renamed to this path (same folder)
    instead of being deleted, so one older version always survives a damaged newest one. A crash between the two
    renames leaves only ``keep_previous``; readers fall back to it (see ``diffmem.rundir.load_resume_state``).
    Raises :class:`WriteFailed` when the folder cannot be written; ``path`` is then untouched.
    """
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise WriteFailed.of(path, e) from e
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_torch_save(path: str | Path, obj: Any, keep_previous: str | Path | None = None) -> None:
    """``torch.save`` that never leaves a truncated file at ``path`` (``keep_previous``: see atomic_write_bytes)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue(), keep_previous=keep_previous)


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line; first drop a partial last line left by a crash.

    Raises :class:`WriteFailed` when the line cannot be written (a partial line it leaves is dropped by the next
    append and skipped by :func:`read_jsonl`).
    """
    path = Path(path)
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    try:
        with open(path, "ab+") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a crash cut the last line short: remove it
                    f.seek(0)
                    content = f.read()
                    f.truncate(content.rfind(b"\n") + 1)
            f.seek(0, os.SEEK_END)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise WriteFailed.of(path, e) from e


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON lines of ``path`` ([] when it is missing); an unparsable last line is skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                warnings.warn(f"{path}: skipping a truncated last line (a crash while appending)")
            else:
                raise ValueError(f"{path}: line {i + 1} is not valid JSON; fix or remove that line") from None
    return out
