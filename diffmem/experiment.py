"""An experiment: a base RunConfig and a grid (``[sweep]`` n x width x seeds) of run folders under one directory."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from pathlib import Path

from diffmem.config import RunConfig, SweepConfig


def run_name(cfg: RunConfig) -> str:
    """The run folder's name for a grid point, e.g. ``n00128_w08_s0``."""
    return f"n{cfg.data.n:05d}_w{cfg.model.width:02d}_s{cfg.train.seed}"


@dataclass(frozen=True)
class PlannedRun:
    name: str
    cfg: RunConfig
    path: Path


def expand_grid(base: RunConfig, sweep: SweepConfig, experiment_dir: str | Path) -> list[PlannedRun]:
    """Every (n, width, seed) of the sweep as a run under ``experiment_dir``: the product of ``sweep.n`` and
    ``sweep.width`` plus the extra ``sweep.cells`` ([n, width], e.g. a width axis at one N of an N axis; a cell
    already in the product is one run), each for every seed; an empty list in the sweep keeps the base config's
    value. A run trains for ``sweep.run_steps(n, train.steps)`` steps (``max(min_steps, steps_per_n * n)`` when
    ``steps_per_n > 0``). Runs are ordered by width, then n (as listed; extra cells after the product, sorted), then
    seed."""
    ns = sweep.n or [base.data.n]
    widths = sweep.width or [base.model.width]
    seeds = sweep.seeds or [base.train.seed]
    grid = list(product(widths, ns))
    grid += sorted({(w, n) for n, w in sweep.cells} - set(grid))
    runs = []
    for (width, n), seed in product(grid, seeds):
        train = {"seed": seed, "steps": sweep.run_steps(n, base.train.steps)}
        cfg = base.replace(data={"n": n}, model={"width": width}, train=train)
        name = run_name(cfg)
        runs.append(PlannedRun(name, cfg, Path(experiment_dir) / name))
    return runs
