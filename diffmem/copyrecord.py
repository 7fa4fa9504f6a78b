"""The writer of a run's copies.jsonl: one line per evaluation with the counts of every training image
(:meth:`diffmem.metrics.memorization.CopyCounts.record`, packed) and, for the images first copied at that step, the
strip of one copy each (``samples/first_copies_step_*.png``, :func:`diffmem.samplegrid.write_first_copies`). The
evaluation (:mod:`diffmem.evaluate`) and the planted runs of the tests (:mod:`diffmem.analysis.synthetic`) both
write through it; :func:`diffmem.rundir.records.copies_lines` reads the lines back.
"""
from __future__ import annotations

from typing import Any

import torch

from diffmem.data import to_pixels
from diffmem.io import append_jsonl
from diffmem.metrics.memorization import MemorizationResult, copy_counts, first_copies
from diffmem.rundir import RunDir
from diffmem.samplegrid import FIRST_COPY_TILES, write_first_copies


def append_copies(run: RunDir, mem: MemorizationResult, samples: torch.Tensor, mean: torch.Tensor, step: int,
                  seed: int, n_train: int) -> dict[str, Any]:
    """Append the copies.jsonl line of an evaluation at ``step`` (optimizer steps) whose ``samples`` (n, C, S, S;
    centered pixels, ``mean`` the data's) gave ``mem`` (its threshold and counts), and write the strip of its first
    copies: the training images it copies that no evaluation at an earlier step copied (at most
    :data:`FIRST_COPY_TILES`, in index order, the line's ``first_copies``), one copy each
    (``samples/first_copies_step_*.png``), for the galleries. Returns the line."""
    line = copy_counts(mem).record(step, mem.n, seed, mem.threshold, n_train)
    earlier = {i for old in run.copies() if old["step"] < step for i in old["copied_idx"]}
    images, picks = first_copies(mem, earlier, FIRST_COPY_TILES)
    if images:
        pixels = to_pixels(samples[torch.tensor(picks, device=samples.device)], mean.to(samples.device))
        write_first_copies(run.first_copies_path(step), pixels)
        line["first_copies"] = images
    append_jsonl(run.copies_path, line)
    return line
