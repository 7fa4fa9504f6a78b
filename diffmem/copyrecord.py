"""The writer of a run's copies.jsonl: one line per evaluation with the counts of every training image
(:meth:`diffmem.metrics.memorization.CopyCounts.record`, packed) and, for the images first copied at that step, the
strip of one copy each (``samples/first_copies_step_*.png``, :func:`diffmem.samplegrid.write_first_copies`), with
the history of which images each step copied (:class:`CopyHistory`). The evaluation (:mod:`diffmem.evaluate`) and
the planted runs of the tests (:mod:`diffmem.analysis.synthetic`) both write through it;
:func:`diffmem.rundir.records.copies_lines` reads the lines back.
"""
from __future__ import annotations

from typing import Any

import torch

from diffmem.data import to_pixels
from diffmem.io import append_jsonl, pack_counts
from diffmem.metrics.memorization import MemorizationResult, copied_within, copy_counts, first_copies
from diffmem.rundir import RunDir
from diffmem.samplegrid import FIRST_COPY_TILES, write_first_copies


class CopyHistory:
    """Which training images each evaluated step of a run copied, read from its copies.jsonl once and then kept up
    to date by :func:`append_copies`: an evaluation asks which images were copied *before* its step (refinement adds
    steps between old ones), and re-reading the whole file at every evaluation would cost O(evaluations^2) in all
    (0.64 s per read at the end of the paper's largest run, 2.1 MB: ``python benchmarks/copies_size.py``). Valid
    while its holder is the run's only writer (the evaluation holds the run's lock)."""

    def __init__(self, run: RunDir):
        self._copied: dict[int, set[int]] = {}
        for line in run.copies():
            self.add(int(line["step"]), line["copied_idx"])

    def add(self, step: int, copied: list[int]) -> None:
        self._copied.setdefault(step, set()).update(int(i) for i in copied)

    def before(self, step: int) -> set[int]:
        """The images copied by any evaluation at a step below ``step`` (optimizer steps)."""
        return set().union(*(images for s, images in self._copied.items() if s < step))


def append_copies(run: RunDir, mem: MemorizationResult, samples: torch.Tensor, mean: torch.Tensor, step: int,
                  seed: int, n_train: int, history: CopyHistory | None = None,
                  distance_rules: tuple[float, tuple[float, ...]] | None = None) -> dict[str, Any]:
    """Append the copies.jsonl line of an evaluation at ``step`` (optimizer steps) whose ``samples`` (n, C, S, S;
    centered pixels, ``mean`` the data's) gave ``mem`` (its threshold and counts), and write the strip of its first
    copies: the training images it copies that no evaluation at an earlier step copied (at most
    :data:`FIRST_COPY_TILES`, in index order, the line's ``first_copies``), one copy each
    (``samples/first_copies_step_*.png``), for the galleries. ``history``: the run's :class:`CopyHistory`, kept up
    to date here (None: copies.jsonl is read). ``distance_rules``: (D, fractions), also record per fixed-distance rule
    d1 < f x D the counts of every training image (``distance_scale``, ``copy_distances``, ``copied_within``: one
    packed array per fraction). Returns the line."""
    counts = copy_counts(mem)
    line = counts.record(step, mem.n, seed, mem.threshold, n_train)
    if distance_rules is not None and distance_rules[1]:
        scale, fractions = distance_rules
        line |= {"distance_scale": scale, "copy_distances": list(fractions),
                 "copied_within": [pack_counts(copied_within(mem, n_train, f * scale)) for f in fractions]}
    history = CopyHistory(run) if history is None else history
    images, picks = first_copies(mem, history.before(step), FIRST_COPY_TILES)
    if images:
        pixels = to_pixels(samples[torch.tensor(picks, device=samples.device)], mean.to(samples.device))
        write_first_copies(run.first_copies_path(step), pixels)
        line["first_copies"] = images
    append_jsonl(run.copies_path, line)
    history.add(step, counts.copied_idx)
    return line
