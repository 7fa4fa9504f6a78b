"""The split pairs of an experiment folder, read from its files: which runs pair up (:func:`find_pairs`), what
``pairs.jsonl`` holds for them (:func:`recorded_lines`), and the lines that point a user at `diffmem pairs`.

A *split pair* is two runs of one experiment with the same N, W and seed and everything else equal, trained on the
disjoint train blocks 0 and 1 (``sweep.splits = [0, 1]``: run ``n00016_w08_s0`` and run ``n00016_w08_s0_split1``).
Their paired evaluation, which samples both models, is :mod:`diffmem.paired_evaluation`; this module reads only
config.json, the checkpoints' names and pairs.jsonl, so that `diffmem analyze` can say which pairs are not evaluated
yet without loading torch.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from diffmem.analysis.runfiles import find_run_folders
from diffmem.config import RunConfig, config_diff
from diffmem.rundir import PAIRS_FILE, RunDir, pairs_lines

PAIR_SPLITS = (0, 1)  # the training blocks (data.subset_index) of a pair's two members
MAY_DIFFER_IN_A_PAIR = ("data.subset_index", "train.steps")  # train.steps: a budget may have grown in one member


class PairError(ValueError):
    """An experiment folder whose split pairs cannot be evaluated; the message says what to do."""


@dataclass(frozen=True)
class SplitPair:
    """Two runs of one (N, W, seed) on training blocks 0 (``a``) and 1 (``b``); ``name`` is the pair's id, the name
    of its split-0 run (e.g. ``n00016_w08_s0``)."""

    name: str
    a: RunDir
    b: RunDir
    cfg_a: RunConfig
    cfg_b: RunConfig
    steps_a: tuple[int, ...]  # each member's evaluation grid (optimizer steps), as its config.json schedules it
    steps_b: tuple[int, ...]

    def common_steps(self) -> list[int]:
        """Evaluation steps of both grids that both members have a checkpoint for, ascending."""
        return sorted(set(self.steps_a) & set(self.steps_b) & set(self.kept_steps()))

    def kept_steps(self) -> list[int]:
        """Every step both members have a checkpoint for: the evaluation grid's and the kept ones between
        (``eval.checkpoint_ratio``), ascending."""
        return sorted(set(self.a.checkpoint_steps()) & set(self.b.checkpoint_steps()))

    def refine_ratio(self) -> float:
        """The factor down to which tau_bias's bracket is refined (the runs' ``eval.refine_ratio``; 0: not refined);
        0 until both members have finished training, since later evaluations can still move the bracket."""
        return self.cfg_a.eval.refine_ratio if self.a.is_done() and self.b.is_done() else 0.0


def find_pairs(experiment_dir: str | Path) -> list[SplitPair]:
    """The split pairs of an experiment folder, ordered by their split-0 run's name: for every (N, W, seed), the run
    on block 0 and the run on block 1. PairError when there is none, or when two runs claim one member."""
    members: dict[tuple[int, int, int, int], tuple[RunDir, Any]] = {}
    for path in find_run_folders(experiment_dir):
        run = RunDir(path)
        stored = run.read_config()
        cfg = stored.config
        if cfg.data.subset_index not in PAIR_SPLITS:
            continue
        key = (cfg.data.n, cfg.model.width, cfg.train.seed, cfg.data.subset_index)
        if key in members:
            raise PairError(f"{members[key][0].path.name} and {path.name} both train N = {key[0]}, W = {key[1]}, "
                            f"seed {key[2]} on block {key[3]}; keep one experiment per folder")
        members[key] = (run, stored)
    pairs = []
    for (n, width, seed, split), (run_a, stored_a) in sorted(members.items(), key=lambda kv: kv[1][0].path.name):
        if split != PAIR_SPLITS[0] or (n, width, seed, PAIR_SPLITS[1]) not in members:
            continue
        run_b, stored_b = members[(n, width, seed, PAIR_SPLITS[1])]
        differ = [d for d in config_diff(stored_a.config.to_dict(), stored_b.config.to_dict())
                  if d.split(":")[0] not in MAY_DIFFER_IN_A_PAIR]
        if differ:
            raise PairError(f"{run_a.path.name} and {run_b.path.name} differ in {differ[0]}: a split pair differs "
                            "only in its train block; train them with one experiment file and sweep.splits")
        pairs.append(SplitPair(run_a.path.name, run_a, run_b, stored_a.config, stored_b.config,
                               tuple(stored_a.scheduled_steps()), tuple(stored_b.scheduled_steps())))
    if not pairs:
        raise PairError(f"{experiment_dir} holds no split pair (two runs of one N, W and seed on train blocks 0 and "
                        "1); train one with `diffmem sweep` and sweep.splits = [0, 1]")
    return pairs


def recorded_lines(path: str | Path, budgets: dict[str, int] | None = None) -> dict[tuple[str, str],
                                                                                  list[dict[str, Any]]]:
    """The lines of a pairs.jsonl by (run_a, run_b), in file order, each validated (``budgets``: train.steps by run
    name; :func:`diffmem.rundir.pairs_lines`: a bad line is a one-line RecordError); none when it is missing. A last
    line without its newline (cut by a crash) is not counted, and the next append moves it aside."""
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _, r in pairs_lines(path, budgets):
        lines.setdefault((r["run_a"], r["run_b"]), []).append(r)
    return lines


def sweep_pairs_hint(splits: Sequence[int], experiment_dir: str | Path) -> str | None:
    """The line `diffmem sweep` ends with when its grid trains split pairs (``sweep.splits`` holds blocks 0 and 1):
    their paired evaluation is a second command, which the sweep does not run (it may return while the runs are
    queued, and the pairs can be evaluated while they train). None for a grid without pairs."""
    if not set(PAIR_SPLITS) <= set(splits):
        return None
    folder = shlex.quote(str(experiment_dir))
    return (f"split pairs: next `diffmem pairs {folder}` (both members of each pair sampled from the same noise -> "
            f"{PAIRS_FILE}; it can run while they train, rerun it once they are done for the new steps and "
            f"tau_bias's refinement), then `diffmem analyze {folder}`")


def unevaluated_pairs_note(experiment_dir: str | Path) -> str | None:
    """One line for `diffmem analyze` when the experiment folder holds split pairs (:func:`find_pairs`) some of which
    have no line in pairs.jsonl: how many, and the command that evaluates them. None when every pair has paired
    evaluations or the folder holds no split pair."""
    experiment = Path(experiment_dir)
    try:
        pairs = find_pairs(experiment)
    except PairError:
        return None
    recorded = recorded_lines(experiment / PAIRS_FILE)
    missing = [p for p in pairs if (p.a.path.name, p.b.path.name) not in recorded]
    if not missing:
        return None
    folder = shlex.quote(str(experiment))
    return (f"{len(missing)} of {len(pairs)} split pair(s) have no paired evaluation in {PAIRS_FILE} (no bias, no "
            f"tau_bias): run `diffmem pairs {folder}`, then `diffmem analyze {folder}` again")
