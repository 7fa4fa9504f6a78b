"""The steps of a run: where it is evaluated (the evaluation grid) and where its weights are kept.

Steps are optimizer steps, counted from 1; the last step of a run's budget is always evaluated.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np


def paper_grid() -> list[int]:
    """The steps at which the official code samples its checkpoints (Experiments/src/Generation/generate.py): 10
    points log-spaced in [251, 1e4] rounded down to multiples of 250, 90 in [1e4, 1e6] and 20 in [1e6, 1e7] rounded
    down to multiples of 5000, merged, and every other one of them kept: 250, 750, 1750, ... 8855000 (45 steps).
    The paper's figures show these points. A new list at each call (computed once)."""
    return list(_paper_grid_steps())


@lru_cache(maxsize=1)
def _paper_grid_steps() -> tuple[int, ...]:
    """:func:`paper_grid`'s steps."""
    def floor_to(a: np.ndarray, mod: int) -> np.ndarray:
        return np.unique(a - a % mod)

    grid = np.unique(np.hstack((floor_to(np.logspace(np.log10(251), 4, 10), 250),
                                floor_to(np.logspace(4, 6, 90), 5000),
                                floor_to(np.logspace(6, 7, 20), 5000))))[::2]
    return tuple(int(s) for s in grid)


def evaluation_steps(times: int | list[int] | str, total_steps: int) -> list[int]:
    """The training steps at which a run is checkpointed and evaluated, ascending, unique, in [1, total_steps].

    ``"paper"``: the points of :func:`paper_grid` up to total_steps, plus total_steps. An int ``k`` gives k steps
    log-spaced between 1 and total_steps, rounded to integers (duplicates after rounding are merged, so small runs get
    fewer); the last step is always included. A list is used as given.
    """
    if times == "paper":
        steps = sorted({s for s in paper_grid() if s <= total_steps} | {total_steps})
    elif isinstance(times, int):
        if times == 1:
            return [total_steps]
        grid = np.unique(np.round(np.logspace(0, np.log10(total_steps), times)).astype(int))
        steps = sorted(set(grid.tolist()) | {total_steps})
    else:
        steps = sorted(set(int(s) for s in times))
    return [s for s in steps if 1 <= s <= total_steps]


def kept_steps(eval_steps: Sequence[int], ratio: float) -> list[int]:
    """Extra checkpoint steps between consecutive evaluation steps (ascending, none of them an evaluation step), so
    that consecutive steps of the union are at most a factor ``ratio`` apart, or 1 step apart where integers do not
    allow that; [] when ``ratio`` is 0. Greedy from each evaluation step: the next kept step is floor(step * ratio),
    the fewest steps that keep every gap within the ratio."""
    if not ratio:
        return []
    steps = sorted(set(int(s) for s in eval_steps))
    out: set[int] = set()
    for a, b in zip(steps[:-1], steps[1:]):
        s = a
        while b / s > ratio and b - s > 1:
            s = max(s + 1, math.floor(s * ratio))
            if s >= b:
                break
            out.add(s)
    return sorted(out)


def nearest_log_midpoint(steps: Sequence[int], lo: float, hi: float) -> int:
    """The step of ``steps`` (non-empty) nearest the bracket's log-midpoint sqrt(lo * hi): the evaluation that halves
    the bracket in log time, whichever way it falls."""
    middle = math.sqrt(lo * hi)
    return min(steps, key=lambda s: abs(math.log(s / middle)))
