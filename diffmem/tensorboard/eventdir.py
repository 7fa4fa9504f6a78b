"""The event files of one TensorBoard run (one folder), kept equal to a set of points without ever showing a step
twice.

A *point* is one summary value (a scalar, an image, a text, the hyperparameters) of one tag at one step (optimizer
steps). :class:`EventDir` reads back what the folder's event files already show, as TensorBoard shows it (a
``SessionLog.START`` at step s hides every earlier event at a step >= s), and writes only what differs:

* points past the last step of their tag are appended to this process's file,
  ``events.out.tfevents.<seconds>.diffmem`` (numbered after the folder's earlier ones, so that readers read the
  files in the order they were written);
* a point at or before the last step of its tag (an evaluation step refined after later ones, or a value that
  changed) makes it write the folder again: one new file holding every point in step order, after a
  ``SessionLog.START`` at step 0, written under a temporary name and renamed, then the older files deleted. A reader
  that had read the older files drops what they showed: TensorBoard's Python readers at the START (how they drop
  what a crashed job wrote after its restart point; its server's reader ignores the first START of a run, so the
  folder's first file starts with one too), its Rust data server because a point at step s drops every earlier
  point of its tag at a step >= s. A kill between the rename and the deletions leaves a folder that reads the same.

So the points of every tag reach TensorBoard in increasing step order, each step once, whatever order they come in
and however often :meth:`EventDir.sync` is called, and the folder never holds more than one copy of a point for
long. One process writes a folder at a time (the run's lock). Files of other writers (names without ``.diffmem``)
are read but never deleted. Needs the ``tensorboard`` package.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from diffmem.io import OutsideFolder

FILE_VERSION = "brain.Event:2"  # what TensorBoard's readers expect as the first event of a file
_OWN_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.diffmem$")


@dataclass(frozen=True)
class Point:
    """One summary value (``value.tag`` is its tag) at one optimizer step."""

    step: int
    value: Summary.Value

    @property
    def tag(self) -> str:
        return self.value.tag

    def content(self) -> bytes:
        """The value as bytes (deterministic serialization): two points show the same when these are equal."""
        return self.value.SerializeToString(deterministic=True)


def event_files(folder: Path) -> list[Path]:
    """The TensorBoard event files of ``folder`` (names holding "tfevents"), in the order readers read them."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink() and "tfevents" in p.name)


def read_shown(folder: Path) -> dict[tuple[str, int], bytes]:
    """What the event files of ``folder`` show: (tag, step) -> the serialized summary value, the last one written
    for that tag and step, with every event at a step >= s written before a ``SessionLog.START`` at s left out."""
    shown: dict[tuple[str, int], bytes] = {}
    for path in event_files(folder):
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                shown = {key: v for key, v in shown.items() if key[1] < event.step}
            elif event.HasField("summary"):
                for value in event.summary.value:
                    shown[(value.tag, int(event.step))] = value.SerializeToString(deterministic=True)
    return shown


class EventDir:
    """The event files of one TensorBoard run; :meth:`sync` makes them show a given set of points.

    Reads the folder's event files when built, and again whenever they changed since its own last write (another
    process wrote there in between); only one :class:`EventDir` (one process) may write a folder at a time.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if self.folder.is_symlink():  # its deletions and writes would land in the link's target
            raise OutsideFolder(f"{self.folder} is a symbolic link; diffmem writes event files only into a real "
                                "folder of the run: replace the link by a folder (or move it out), then rerun")
        self._stream: BinaryIO | None = None
        self._writer: RecordWriter | None = None
        self._read()

    def _files(self) -> list[tuple[str, int]]:
        """(name, size in bytes) of each event file of the folder."""
        return [(p.name, p.stat().st_size) for p in event_files(self.folder)]

    def _read(self) -> None:
        """Read back what the folder's event files show (:func:`read_shown`)."""
        self.close()
        self.shown = read_shown(self.folder)
        self._known = self._files()

    def _refresh(self) -> None:
        """Read the folder again when its event files are not as this object left them."""
        if self._files() != self._known:
            self._read()

    def last_step(self, tag: str) -> int | None:
        """The last step shown for ``tag`` (None when it has no point)."""
        return max((step for t, step in self.shown if t == tag), default=None)

    def sync(self, points: Iterable[Point]) -> int:
        """Make the folder show every one of ``points`` (later ones win at the same tag and step); points it shows
        that are not among them stay. Returns the number of points written (0 when it already showed them all)."""
        self._refresh()
        wanted = {(p.tag, p.step): p for p in points}
        changed = [key for key, p in wanted.items() if self.shown.get(key) != p.content()]
        if not changed:
            return 0
        last: dict[str, int] = {}
        for tag, step in self.shown:
            last[tag] = max(step, last.get(tag, step))
        if all(step > last.get(tag, -1) for tag, step in changed):
            return self._write([wanted[key] for key in changed])
        merged = {key: Point(key[1], Summary.Value.FromString(content)) for key, content in self.shown.items()}
        merged.update(wanted)
        self._rewrite(list(merged.values()))
        return len(changed)

    def append(self, point: Point) -> bool:
        """Write ``point`` when it lies past the last step of its tag; False (nothing written) otherwise: a step
        at or before it was written already (by this process, or by the one a kill stopped before a resume)."""
        self._refresh()
        last = self.last_step(point.tag)
        if last is not None and point.step <= last:
            return False
        self._write([point])
        return True

    def _write(self, points: list[Point]) -> int:
        """Append ``points`` in step order, one event per step; returns how many were written."""
        by_step: dict[int, list[Point]] = {}
        for p in points:
            by_step.setdefault(p.step, []).append(p)
        now = time.time()
        for step in sorted(by_step):
            group = sorted(by_step[step], key=lambda p: p.tag)
            self._emit(Event(wall_time=now, step=step, summary=Summary(value=[p.value for p in group])))
            for p in group:
                self.shown[(p.tag, step)] = p.content()
        return len(points)

    def _next_name(self) -> str:
        """The name of a new file of this writer, read after every earlier one of the folder and taken by no entry
        of it (a link named like an event file included)."""
        taken = [p.name for p in self.folder.iterdir()] if self.folder.is_dir() else []
        earlier = [int(m.group(1)) for name in taken if (m := _OWN_FILE.match(name))]
        return f"events.out.tfevents.{max([int(time.time()), *[n + 1 for n in earlier]]):010d}.diffmem"

    def _create(self, name: str) -> BinaryIO:
        """A new file ``name`` of the folder, opened for append; never an existing entry, never through a link."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        return os.fdopen(os.open(self.folder / name, flags, 0o666), "ab")

    def _start(self, stream: BinaryIO, start_marker: bool) -> RecordWriter:
        """Begin an event file on ``stream``: the file version, then with ``start_marker`` a START at step 0."""
        writer = RecordWriter(stream)
        writer.write(Event(wall_time=time.time(), file_version=FILE_VERSION).SerializeToString())
        if start_marker:
            writer.write(Event(wall_time=time.time(), step=0,
                               session_log=SessionLog(status=SessionLog.START)).SerializeToString())
        return writer

    def _emit(self, event: Event) -> None:
        """Append one event to this process's event file (created at the first event) and flush it."""
        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._stream = self._create(self._next_name())
            self._writer = self._start(self._stream, start_marker=not self._known)  # the folder's first file
        self._writer.write(event.SerializeToString())
        self._writer.flush()
        self._known = self._files()

    def _rewrite(self, points: list[Point]) -> None:
        """Replace the folder's own event files by one file showing ``points`` (module docstring)."""
        self.close()
        self.folder.mkdir(parents=True, exist_ok=True)
        for leftover in self.folder.glob(".rewrite.*.tmp"):  # of a rewrite that a kill cut short
            leftover.unlink(missing_ok=True)  # a link itself, never its target
        older = [p for p in event_files(self.folder) if _OWN_FILE.match(p.name)]
        final = self.folder / self._next_name()
        temp = self.folder / f".rewrite.{final.name.split('.')[3]}.tmp"  # no "tfevents": readers skip it
        with self._create(temp.name) as stream:
            self._stream, self._writer = stream, self._start(stream, start_marker=True)
            self.shown = {}
            self._write(points)
            stream.flush()
            os.fsync(stream.fileno())
        self._stream, self._writer = None, None
        os.replace(temp, final)
        for path in older:
            path.unlink(missing_ok=True)
        self._stream = open(final, "ab")  # the file just renamed into place: a regular file of this folder
        self._writer = RecordWriter(self._stream)
        self._known = self._files()

    def close(self) -> None:
        """Close this process's event file (a later write opens a new one)."""
        if self._stream is not None:
            self._stream.close()
        self._stream, self._writer = None, None
