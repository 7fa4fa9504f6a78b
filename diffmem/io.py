"""Crash-safe file writing: atomic replacement (temp file + fsync + rename) and append-only JSON lines, and the
packed integer arrays that JSON lines carry (:func:`pack_counts`, :func:`unpack_counts`).

A reader never sees a half-written file: every whole-file write goes to a temporary file in the same folder, is
flushed to disk, then renamed over the target; ``keep_previous`` also keeps the file it replaces under another name.
JSON-lines files are only ever appended to, never through a symbolic link; a line is recorded once its newline is
written: a last line without one (cut short by a crash) is skipped by the reader and moved aside to
``<file>.torn-<time>`` by the next append, never deleted. A write that fails (disk full, read-only folder) raises :class:`WriteFailed`, a one-line OSError naming
the file, and leaves the old content in place.
"""
from __future__ import annotations

import base64
import binascii
import errno
import io
import json
import os
import re
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np


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
    import torch  # here, not at the top: the commands that only read run folders (status, analyze) never load torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue(), keep_previous=keep_previous)


class OutsideFolder(OSError):
    """A path that a command would write, replace or delete leads outside the folder it was given (through a
    symbolic link); the one-line message names the link and what to do."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


def contained(root: str | Path, path: str | Path) -> Path:
    """``path`` when it lies under ``root`` with no symbolic link between them (the subfolders on the way and the
    entry itself, which may not exist yet); :class:`OutsideFolder` otherwise. Every writer that writes, replaces or
    deletes inside a folder that may come from someone else (a run folder, an experiment folder) asks this first, so
    that no command changes anything outside the folder it was given, whatever links the folder holds. A dangling
    link counts as a link."""
    root, path = Path(root), Path(path)
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise OutsideFolder(f"{path} is not inside {root}; diffmem writes only inside the folder it was given") from None
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            raise OutsideFolder(f"{current} is a symbolic link; diffmem writes, replaces and deletes only inside "
                                f"{root}, never through a link: replace the link by a real folder or file (copy its "
                                "target there), or move it out, then rerun")
    return path


def is_temp_name(name: str, targets: re.Pattern[str]) -> bool:
    """Whether ``name`` is a temporary file that :func:`atomic_write_bytes` made for a file whose name ``targets``
    matches (``.<target>.<8 random characters>.tmp``): a write killed half-way leaves it, and only such files may be
    cleaned up, never another ``.*.tmp`` of a shared folder."""
    match = re.fullmatch(r"\.(.+)\.[A-Za-z0-9_]{8}\.tmp", name)
    return bool(match and targets.fullmatch(match.group(1)))


TORN_SUFFIX = ".torn-"
"""A line without its final newline moved aside by :func:`append_jsonl` goes to ``<file>.torn-<UTC time>`` next to
the file (``metrics.jsonl.torn-20260101T120000Z``)."""


class NotAppendable(OSError):
    """An append-only file that diffmem refuses to append to (a symbolic link, or not a regular file)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


def refuse_unappendable(path: str | Path) -> None:
    """Raise :class:`NotAppendable` when ``path`` is a symbolic link or exists as something other than a regular
    file: appends write only to a regular file inside its folder, never through a link to somewhere else."""
    path = Path(path)
    if path.is_symlink():
        raise NotAppendable(f"{path} is a symbolic link (to {os.readlink(path)}); diffmem appends only to a regular "
                            "file inside the folder, never through a link: replace the link with a copy of the "
                            "file it points to, then rerun")
    if path.exists() and not path.is_file():
        raise NotAppendable(f"{path} is not a regular file; move it aside, then rerun")


def torn_path(path: Path) -> Path:
    """A free ``<path>.torn-<UTC time>`` name for the torn last line of ``path``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate, k = path.with_name(f"{path.name}{TORN_SUFFIX}{stamp}"), 1
    while candidate.exists() or candidate.is_symlink():
        k += 1
        candidate = path.with_name(f"{path.name}{TORN_SUFFIX}{stamp}-{k}")
    return candidate


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line.

    A last line without its final newline (a write cut short, or a file edited by hand) was never recorded (see
    :func:`read_jsonl_numbered`): before appending, it is moved aside to :func:`torn_path` (written atomically
    first, then cut from the file) with a warning naming the file, the line and where it went; nothing is deleted.
    Refuses a symbolic link or a non-regular file (:class:`NotAppendable`, see :func:`refuse_unappendable`; the file
    is opened with O_NOFOLLOW, so a link planted in between is refused too). Raises :class:`WriteFailed` when the
    line cannot be written (a partial line it leaves is moved aside by the next append and skipped by the reader).
    """
    path = Path(path)
    refuse_unappendable(path)
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_unappendable(path)
        raise WriteFailed.of(path, e) from e
    try:
        with os.fdopen(fd, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a last line without its newline: move it aside, never delete it
                    f.seek(0)
                    content = f.read()
                    keep, number = content.rfind(b"\n") + 1, content.count(b"\n") + 1
                    aside = torn_path(path)
                    atomic_write_bytes(aside, content[keep:])
                    f.truncate(keep)
                    warnings.warn(f"{path}: line {number} had no newline at its end (a write cut "
                                  f"short) and was never counted as recorded; moved it to {aside.name}")
            f.seek(0, os.SEEK_END)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise WriteFailed.of(path, e) from e


def read_jsonl_numbered(path: str | Path) -> list[tuple[int, Any]]:
    """(line number from 1, parsed JSON value) of every recorded line of ``path`` ([] when it is missing).

    A line is recorded once its newline is written: a last line without one (a write cut short) is not recorded,
    even when it parses, and is skipped with a warning naming the file and line (:func:`append_jsonl` moves it
    aside before the next append). Blank lines are skipped; any other line that is not valid JSON is a one-line
    ValueError naming the file and line.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; restore it from a copy") from None
    lines = text.split("\n")  # the last element is "" when the file ends with a newline, else the torn line
    out = []
    for i, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError:
            raise ValueError(f"{path}: line {i} is not valid JSON; correct that line or move it out of the file "
                             "(it is not used), then rerun") from None
    if lines[-1].strip():
        warnings.warn(f"{path}: skipping a truncated last line (line {len(lines)}, no newline at its end: a write cut "
                      f"short); it is not counted as recorded, and the next append moves it aside to "
                      f"{path.name}{TORN_SUFFIX}*")
    return out


def read_jsonl(path: str | Path) -> list[Any]:
    """The parsed recorded lines of ``path``, in file order (:func:`read_jsonl_numbered` without line numbers)."""
    return [record for _, record in read_jsonl_numbered(path)]


COUNTS_ENCODING = "zlib-base64-uint32le"
"""How :func:`pack_counts` writes an array: little-endian uint32, zlib-compressed, base64 text."""


class PackedCountsError(ValueError):
    """A packed array that cannot be read back (not base64, not zlib, not the expected length)."""


def pack_counts(counts: np.ndarray) -> str:
    """A (n,) array of non-negative integers below 2**32 as JSON-safe text (:data:`COUNTS_ENCODING`). A dense
    array of counts that are mostly 0 compresses well: 32768 counts of 10000 samples take about 9 kB."""
    values = np.asarray(counts)
    if values.ndim != 1 or (values.size and (values.min() < 0 or values.max() >= 2 ** 32)):
        raise ValueError("pack_counts takes a 1-d array of integers in [0, 2**32)")
    return base64.b64encode(zlib.compress(values.astype("<u4").tobytes(), 6)).decode("ascii")


def unpack_counts(text: object, length: int) -> np.ndarray:
    """The (length,) int64 array that :func:`pack_counts` wrote; :class:`PackedCountsError` when ``text`` is not
    such an array of exactly ``length`` values. The text may come from someone else: it is decompressed to at most
    the expected size (no decompression bomb), never evaluated."""
    if not isinstance(text, str):
        raise PackedCountsError(f"it is {type(text).__name__}, not packed text")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        unzip = zlib.decompressobj()
        data = unzip.decompress(raw, 4 * length + 1)
    except (binascii.Error, UnicodeEncodeError, zlib.error) as e:
        raise PackedCountsError(f"it is not {COUNTS_ENCODING} text ({type(e).__name__})") from None
    if len(data) != 4 * length or not unzip.eof or unzip.unused_data:
        raise PackedCountsError(f"it does not hold exactly {length} uint32 values")
    return np.frombuffer(data, dtype="<u4").astype(np.int64)


FLOATS_ENCODING = "base64-float32le"
"""How :func:`pack_floats` writes an array: little-endian float32 in C order, base64 text."""


def pack_floats(values: np.ndarray) -> str:
    """A float array as JSON-safe text (:data:`FLOATS_ENCODING`; the shape is the reader's to know): 4 bytes a value
    plus a third for base64, against about 20 characters as JSON numbers. Finite values only."""
    array = np.ascontiguousarray(np.asarray(values, dtype="<f4"))
    if not np.isfinite(array).all():
        raise ValueError("pack_floats takes finite values only")
    return base64.b64encode(array.tobytes()).decode("ascii")


def unpack_floats(text: object, shape: tuple[int, ...]) -> np.ndarray:
    """The float64 array of ``shape`` that :func:`pack_floats` wrote; :class:`PackedCountsError` when ``text`` is not
    exactly that many finite float32 values (read as data, never evaluated)."""
    if not isinstance(text, str):
        raise PackedCountsError(f"it is {type(text).__name__}, not packed text")
    count = int(np.prod(shape, dtype=np.int64))
    if len(text) != 4 * ((4 * count + 2) // 3):
        raise PackedCountsError(f"it does not hold exactly {count} float32 values")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise PackedCountsError(f"it is not {FLOATS_ENCODING} text ({type(e).__name__})") from None
    if len(raw) != 4 * count:
        raise PackedCountsError(f"it does not hold exactly {count} float32 values")
    values = np.frombuffer(raw, dtype="<f4").astype(np.float64).reshape(shape)
    if not np.isfinite(values).all():
        raise PackedCountsError("it holds NaN or infinite values")
    return values
