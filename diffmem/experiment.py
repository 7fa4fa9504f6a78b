"""An experiment: a base RunConfig and a grid (``[sweep]`` n x width x seeds x splits) of run folders under one
directory."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from pathlib import Path

from diffmem.config import RunConfig, SweepConfig


def run_name(cfg: RunConfig, split: int = 0) -> str:
    """The run folder's name for a grid point, e.g. ``n00128_w08_s0``; a run of split i > 0 (``sweep.splits``) adds
    ``_split<i>``, e.g. ``n00128_w08_s0_split1``, so split 0 keeps the name of a grid without splits."""
    return f"n{cfg.data.n:05d}_w{cfg.model.width:02d}_s{cfg.train.seed}" + (f"_split{split}" if split else "")


@dataclass(frozen=True)
class PlannedRun:
    name: str
    cfg: RunConfig
    path: Path
    split: int = 0  # the training block of sweep.splits (data.subset_index)


def expand_grid(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path) -> list[PlannedRun]:
    """Every (n, width, seed, split) of the sweep as a run under ``experiment_dir``: the product of ``sweep.n`` and
    ``sweep.width`` plus the extra ``sweep.cells`` ([n, width], e.g. a width axis at one N of an N axis; a cell
    already in the product is one run), each for every seed and every split; an empty list in the sweep keeps the
    base config's value. Split i trains on block i of the training images (``data.subset_index = i``; the default
    ``splits = [0]`` keeps the base config's block). A run trains for ``sweep.run_steps(n, train.steps)`` steps
    (``max(min_steps, steps_per_n * n)`` when ``steps_per_n > 0``). Runs are ordered by width, then n (as listed;
    extra cells after the product, sorted), then seed, then split."""
    ns = sweep.n or [base.data.n]
    widths = sweep.width or [base.model.width]
    seeds = sweep.seeds or [base.train.seed]
    grid = list(product(widths, ns))
    grid += sorted({(w, n) for n, w in sweep.cells} - set(grid))
    runs = []
    for (width, n), seed, split in product(grid, seeds, sweep.splits):
        train = {"seed": seed, "steps": sweep.run_steps(n, base.train.steps)}
        data = {"n": n, "subset_index": base.data.subset_index + split}  # validate_sweep: 0 + split when split > 0
        cfg = base.replace(data=data, model={"width": width}, train=train)
        name = run_name(cfg, split)
        runs.append(PlannedRun(name, cfg, Path(experiment_dir) / name, split))
    return runs
