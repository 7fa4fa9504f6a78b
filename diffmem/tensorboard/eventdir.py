"""The event files of one TensorBoard run (one folder), kept equal to a set of points without ever showing a step
twice.

A *point* is one summary value (a scalar, an image, a text, the hyperparameters) of one tag at one step (optimizer
steps). :class:`EventDir` reads back what the folder's event files already show, as TensorBoard shows it (a
``SessionLog.START`` at step s hides every earlier event at a step >= s), and writes only what differs:

* points past the last step of their tag are appended;
* a point at or before the last step of its tag (an evaluation step refined after later ones, or a value that
  changed) is written by hiding every step >= s, the earliest such step, with a ``SessionLog.START`` at s (how
  TensorBoard's Python readers drop what a crashed job wrote after its restart point; its server's reader ignores
  the first START of a run, so the folder's first file starts with one at step 0) and writing again every point
  at a step >= s, in step order (TensorBoard's Rust data server drops, per tag, every point at a step >= one that
  arrives; all readers then show each step once).

So the points of every tag reach TensorBoard in increasing step order, each step once, whatever order they come in
and however often :meth:`EventDir.sync` is called. One process writes a folder at a time (the run's lock); each
process appends to a file of its own, ``events.out.tfevents.<seconds>.diffmem``, named after all the folder's
earlier event files so that readers read them in the order they were written. Needs the ``tensorboard`` package.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

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
    return sorted(p for p in folder.iterdir() if p.is_file() and "tfevents" in p.name)


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
        start = min(step for _tag, step in changed)
        again = {key: Point(key[1], Summary.Value.FromString(content))
                 for key, content in self.shown.items() if key[1] >= start}
        again.update({key: p for key, p in wanted.items() if key[1] >= start})
        self._emit(Event(wall_time=time.time(), step=start, session_log=SessionLog(status=SessionLog.START)))
        self.shown = {key: v for key, v in self.shown.items() if key[1] < start}
        return self._write(list(again.values()))

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

    def _emit(self, event: Event) -> None:
        """Append one event to this process's event file (created at the first event) and flush it."""
        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            earlier = [int(m.group(1)) for p in event_files(self.folder) if (m := _OWN_FILE.match(p.name))]
            number = max([int(time.time()), *[n + 1 for n in earlier]])
            self._stream = open(self.folder / f"events.out.tfevents.{number:010d}.diffmem", "ab")
            self._writer = RecordWriter(self._stream)
            self._writer.write(Event(wall_time=time.time(), file_version=FILE_VERSION).SerializeToString())
            if not self._known:  # the folder's first file: TensorBoard's server takes a first START as the
                # session's start and purges only at later ones, its EventAccumulator at every one (none at 0 here)
                self._writer.write(Event(wall_time=time.time(), step=0,
                                         session_log=SessionLog(status=SessionLog.START)).SerializeToString())
        self._writer.write(event.SerializeToString())
        self._writer.flush()
        self._known = self._files()

    def close(self) -> None:
        """Close this process's event file (a later write opens a new one)."""
        if self._stream is not None:
            self._stream.close()
        self._stream, self._writer = None, None
