"""``diffmem pairs EXPERIMENT_DIR``: the paired evaluation of split pairs -> ``<experiment>/pairs.jsonl``.

The pairs (two runs of one N, W and seed on the disjoint train blocks 0 and 1) are found by
:func:`diffmem.split_pairs.find_pairs`. At every evaluation step of the runs' grid that both have a checkpoint for
and that pairs.jsonl does not hold yet, both checkpoints are loaded, both models sample ``n_samples`` images from the
same initial noise (the memorization evaluation's seed and sampler, :func:`diffmem.evaluate.draw_samples`), and the
measures of :mod:`diffmem.metrics.pairs` are appended as one JSON line per (pair, step), in pixel units x / 255 (each
model's centering offset added back, so the distances are the memorization test's).

With ``eval.refine_ratio`` set in the runs' config, once both members have finished training (their ``done`` file),
tau_bias's bracket is then narrowed among the checkpoints both members kept, each time at the one nearest the
bracket's log-midpoint, until it is at most that factor wide (:func:`diffmem.refine.next_bias_refinement`): the
bracket that ``diffmem analyze`` reports, as refinement does for tau_mem and tau_gen in a run.

The file is only appended (``diffmem.io.append_jsonl``, under the lock ``<experiment>/pairs.lock``): a rerun after a
kill continues with the first (pair, step) not recorded, and never writes a (pair, step) twice. A step recorded once
is never computed again (a rerun with another ``--n-samples`` only adds the steps still missing). The runs may still
be training: only their checkpoints are read (written atomically), never their locks.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from diffmem.analysis.runfiles import latest_per_step
from diffmem.data import DataError, ImageSet, load_images, make_splits
from diffmem.device import resolve_device
from diffmem.diffusion import Diffusion
from diffmem.evaluate import checkpoint_model, draw_samples
from diffmem.io import append_jsonl, refuse_unappendable
from diffmem.metrics.pairs import paired_measures
from diffmem.tensorboard import live as tensorboard_live
from diffmem.refine import next_bias_refinement
from diffmem.rundir import PAIRS_FILE, PAIRS_LOCK, RunDir, RunLock
from diffmem.split_pairs import PairError, SplitPair, find_pairs, recorded_lines

MIN_PAIR_SAMPLES = 2
"""The fewest draws per model and step `diffmem pairs` accepts: a bootstrap interval needs two draws to have width."""


def _f_mem_at(run: RunDir, step: int) -> float | None:
    """The run's f_mem at ``step`` from its metrics.jsonl (the last line of that step), None when not evaluated."""
    by_step = {r["step"]: r for r in latest_per_step(run.metrics())}
    return by_step.get(step, {}).get("f_mem")


class PairEvaluator:
    """Everything the evaluations of one pair share: both train sets in pixel units x / 255 (N, C, S, S) on the
    device, both centering offsets, the diffusion."""

    def __init__(self, pair: SplitPair, device: torch.device, images: ImageSet | None = None):
        """``images``: the source's images when already loaded (``load_images(pair.cfg_a.data)``). DataError when
        they are not the data either run trained on (its config.json's dataset_sha256)."""
        self.pair, self.device = pair, device
        images = load_images(pair.cfg_a.data) if images is None else images
        for run in (pair.a, pair.b):
            try:
                images.check_recorded(run.recorded_dataset_sha256(), pair.cfg_a.data.source)
            except DataError as e:
                raise DataError(f"{run.path.name}: {e}") from None
        self.splits = [make_splits(images, cfg.data) for cfg in (pair.cfg_a, pair.cfg_b)]
        self.trains = [s.train.to(device=device, dtype=torch.float32) / 255.0 for s in self.splits]
        # the control bias needs a block that neither member trained on (three blocks or more: docs/split-pairs.md)
        control = self.splits[0].control
        shared = len(control) >= 2 and np.array_equal(self.splits[0].control_indices, self.splits[1].control_indices)
        self.control = control.to(device=device, dtype=torch.float32) / 255.0 if shared else None
        self.diffusion = Diffusion(pair.cfg_a.diffusion)

    def measure(self, step: int, n_samples: int) -> dict[str, Any]:
        """The JSON line of ``step``: both checkpoints sampled from the same noise, the paired measures."""
        t0 = time.perf_counter()
        e = self.pair.cfg_a.eval
        pixels = []
        for run, cfg, splits in zip((self.pair.a, self.pair.b), (self.pair.cfg_a, self.pair.cfg_b), self.splits):
            model = checkpoint_model(run, cfg, step, self.device)
            with torch.no_grad():
                samples = draw_samples(self.diffusion, model, e, n_samples, tuple(splits.train.shape[1:]),
                                       self.device)
            pixels.append(samples + splits.mean.to(self.device))  # centered -> x / 255, unclamped
        measures = paired_measures(pixels[0], pixels[1], self.trains[0], self.trains[1], n_boot=e.n_boot,
                                   seed=e.seed, control=self.control)
        cfg = self.pair.cfg_a
        return {
            "pair": self.pair.name, "run_a": self.pair.a.path.name, "run_b": self.pair.b.path.name,
            "split_a": self.pair.cfg_a.data.subset_index, "split_b": self.pair.cfg_b.data.subset_index,
            "n": cfg.data.n, "width": cfg.model.width, "seed_train": cfg.train.seed, "step": step,
            **measures.to_dict(),
            "f_mem_a": _f_mem_at(self.pair.a, step), "f_mem_b": _f_mem_at(self.pair.b, step),
            "seed": e.seed, "sampler": e.sampler, "sampler_steps": e.sampler_steps,
            "sampler_schedule": e.sampler_schedule, "clip_sample": e.clip_sample, "n_boot": e.n_boot,
            "wall_s": round(time.perf_counter() - t0, 3),
        }


def evaluate_pairs(experiment_dir: str | Path, device: str = "auto", n_samples: int | None = None,
                   refine: bool = True, log: Callable[[str], None] = print) -> int:
    """Append the line of every (pair, step) that pairs.jsonl lacks, then, with ``refine``, the refinements of each
    finished pair's tau_bias bracket (module docstring); returns how many lines were appended. ``n_samples``: draws
    per step (default: the runs' ``eval.n_samples``)."""
    if n_samples is not None and n_samples < MIN_PAIR_SAMPLES:
        raise PairError(f"--n-samples {n_samples} is too few: the paired measures need at least {MIN_PAIR_SAMPLES} "
                        "draws (the bootstrap interval of one draw has width 0, so any nonzero bias would count as "
                        "established); pass --n-samples 2 or more, or leave it out for the runs' eval.n_samples")
    experiment = Path(experiment_dir)
    pairs = find_pairs(experiment)
    path = experiment / PAIRS_FILE
    refuse_unappendable(path)  # a symbolic link is refused before any work, not at the first append
    dev = resolve_device(device)
    appended = 0
    sources: dict[tuple[Any, ...], ImageSet] = {}  # one load per source and image size
    with RunLock(RunDir(experiment), name=PAIRS_LOCK):
        recorded = recorded_lines(path, {p.path.name: c.train.steps for pair in pairs
                                         for p, c in ((pair.a, pair.cfg_a), (pair.b, pair.cfg_b))})
        for pair in pairs:
            lines = recorded.get((pair.a.path.name, pair.b.path.name), [])
            done = {int(r["step"]) for r in lines}
            count = n_samples or pair.cfg_a.eval.n_samples
            evaluator = None

            def measure(step: int, why: str = "") -> None:
                nonlocal evaluator, appended
                if evaluator is None:
                    data = pair.cfg_a.data
                    key = (data.source, data.path, data.image_size, data.cache_dir)
                    if key not in sources:
                        sources[key] = load_images(data)
                    evaluator = PairEvaluator(pair, dev, sources[key])
                line = evaluator.measure(step, count)
                append_jsonl(path, line)
                tensorboard_live.records_appended(pair.cfg_a, RunDir(experiment), pair=pair.name)
                lines.append(line)
                appended += 1
                log(f"{pair.name} step {step}{why}: pair distance {line['pair_distance']:.4g}, bias "
                    f"{line['bias']:.3g} [{line['bias_lo']:.3g}, {line['bias_hi']:.3g}], own "
                    f"{line['own_fraction']:.3f} ({line['wall_s']:.1f} s)")

            for step in pair.common_steps():
                if step not in done:
                    measure(step)
            ratio = pair.refine_ratio() if refine else 0.0
            while (step := next_bias_refinement([int(r["step"]) for r in lines], [r.get("bias_lo") for r in lines],
                                                pair.kept_steps(), ratio)) is not None:
                measure(step, " (refining tau_bias's bracket)")
    if not appended:
        log(f"{path}: every step that both members of each pair have reached is recorded")
    return appended
