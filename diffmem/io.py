"""Crash-safe file writing: atomic replacement (temp file + fsync + rename) and append-only JSON lines.

A reader never sees a half-written file: every whole-file write goes to a temporary file in the same folder, is
flushed to disk, then renamed over the target. JSON-lines files are only ever appended to; a line cut short by a crash
is dropped by the reader and removed by the next append.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of ``data``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    """``torch.save`` that never leaves a truncated file at ``path``."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line; first drop a partial last line left by a crash."""
    path = Path(path)
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
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
