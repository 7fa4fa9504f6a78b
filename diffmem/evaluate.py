"""One checkpoint -> samples -> metrics -> one line appended to the run's metrics.jsonl.

At each evaluation step diffmem draws ``eval.n_samples`` DDIM samples with a fixed seed, measures the memorized
fraction f_mem against the train set (``diffmem.metrics.memorization``), FID or an offline FD against the held-out
images (``diffmem.metrics.fid``), and the train/test denoising loss at a fixed diffusion time
(``diffmem.metrics.losses``), and at the diffusion times ``eval.loss_ts`` the per-level losses, their gap's interval
and the membership AUC of the per-image losses (``diffmem.metrics.membership``). Which training images the samples
copied goes to the run's copies.jsonl, one line per evaluation, appended just before the metrics line (a crash
between the two repeats the evaluation, and readers take the latest line of a step). The same checkpoint always gives
the same numbers on the same device.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from diffmem.acceleration import deterministic_algorithms
from diffmem.config import ConfigError, EvalConfig, RunConfig
from diffmem.data import Splits, default_cache_dir, load_images, make_splits, to_model, to_pixels, to_uint8
from diffmem.device import resolve_device
from diffmem.diffusion import Diffusion
from diffmem.io import append_jsonl, refuse_unappendable
from diffmem.metrics.fid import fid_sets, make_reference_key
from diffmem.metrics.levels import level_reading
from diffmem.metrics.losses import loss_gap
from diffmem.copyrecord import CopyHistory, append_copies
from diffmem.metrics.memorization import median_neighbour_distance, memorized_fraction
from diffmem.model import build_from_config
from diffmem.refine import refine_brackets
from diffmem.rundir import RunDir, RunLock, append_image_losses
from diffmem.samplegrid import GRID_PAIRS, write_sample_grid
from diffmem.tensorboard import live as tensorboard_live
from diffmem.eval_grid import evaluation_steps


class CheckpointDamaged(RuntimeError):
    """A checkpoint file cannot be read."""


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The model weights (state dict) of one ``checkpoints/step_XXXXXXXXX.pt``; CheckpointDamaged when it is
    missing, truncated or corrupt (the message names the file; :func:`damaged_checkpoint_advice` says what to do)."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        weights = state["model"]
    except FileNotFoundError:
        raise CheckpointDamaged(f"checkpoint {path} is missing") from None
    except Exception as e:  # torch raises several types for a damaged zip
        detail = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else "unreadable"
        raise CheckpointDamaged(f"checkpoint {path} is damaged ({type(e).__name__}: {detail})") from None
    return weights


def damaged_checkpoint_advice(run: RunDir, cfg: RunConfig, step: int) -> str:
    """What to do about the missing or damaged checkpoint of ``step``: an evaluation step is written again by
    rerunning ``diffmem train`` (:func:`diffmem.train.rewrite_checkpoints`); a kept checkpoint between evaluations
    (``eval.checkpoint_ratio``) only sharpens a bracket and is set aside by hand."""
    stored = run.read_config()
    if stored is not None and step in stored.scheduled_steps():
        then = "and evaluates it" if cfg.eval.inline else f"then run `diffmem evaluate {run.path}`"
        return (f"rerun `diffmem train` with the command that trained this run: it trains the weights of step {step} "
                f"again from the run's seed (a damaged file is set aside as {run.step_name(step)}.damaged.pt), writes "
                f"the checkpoint again {then}")
    return (f"it is a kept checkpoint between evaluations: move it aside (e.g. to {run.step_name(step)}.damaged.pt) "
            "and rerun; the refinement then uses the kept checkpoints around it")


def checkpoint_model(run: RunDir, cfg: RunConfig, step: int, device: torch.device) -> torch.nn.Module:
    """The U-Net of ``cfg`` with the weights of ``run``'s checkpoint of ``step``, on ``device``; a missing or damaged
    checkpoint is a one-line CheckpointDamaged naming the file and what to do. Building the model draws from torch's
    global RNG (callers that must not move it fork it)."""
    model = build_from_config(cfg.model, cfg.data.image_size).to(device)
    try:
        weights = load_checkpoint(run.checkpoint_path(step), device)
    except CheckpointDamaged as e:
        raise CheckpointDamaged(f"{e}; {damaged_checkpoint_advice(run, cfg, step)}") from None
    model.load_state_dict(weights)
    return model


def draw_samples(diffusion: Diffusion, model: torch.nn.Module, e: EvalConfig, n: int, shape: tuple[int, ...],
                 device: torch.device, clip_sample: bool | None = None) -> torch.Tensor:
    """``n`` samples (n, *shape) of ``model`` in its centered pixel units, on ``device``, with the evaluation's
    sampler (``e.sampler``, ``e.sampler_steps``, ``e.sampler_schedule``, ``e.batch_size``) from the initial noise of
    seed ``e.seed``: the same seed, n, shape and batch size give the same noise for any model (the memorization
    evaluation's draw, and the paired draw of split pairs). ``clip_sample``: default ``e.clip_sample``."""
    generator = torch.Generator(device="cpu").manual_seed(e.seed)
    return diffusion.sample(model, n, shape, generator, kind=e.sampler, steps=e.sampler_steps,
                            clip_sample=e.clip_sample if clip_sample is None else clip_sample,
                            batch_size=e.batch_size, device=device, schedule=e.sampler_schedule)


def reference_set_size(cfg: RunConfig, splits: Splits) -> int:
    """Images in each of the ``eval.fid_reference_sets`` disjoint FID reference sets cut from the held-out pool:
    ``eval.fid_n_reference``, or fewer when the pool is smaller. Raises ConfigError when a set would hold fewer
    than 2 images (train calls this before writing anything)."""
    e = cfg.eval
    n_ref = min(e.fid_n_reference, len(splits.heldout) // e.fid_reference_sets)
    if e.fid and n_ref < 2:
        raise ConfigError(f"eval.fid_reference_sets = {e.fid_reference_sets} disjoint FID reference sets need at least "
                          f"2 images each, but the held-out pool has {len(splits.heldout)}; lower "
                          "eval.fid_reference_sets or raise data.n_heldout")
    return n_ref


class Evaluator:
    """Everything one run's evaluations share (train/test tensors, FID reference), built once per process.

    ``train_x``: the centred train set (N, C, S, S) already on ``device`` (training passes its own, so the set is not
    held twice); None builds it from ``splits``.
    """

    def __init__(self, cfg: RunConfig, run: RunDir, splits: Splits, dataset_sha256: str, diffusion: Diffusion,
                 device: torch.device, log: Callable[[str], None] = print, train_x: torch.Tensor | None = None):
        self.cfg, self.run, self.splits, self.diffusion, self.device, self.log = cfg, run, splits, diffusion, device, log
        e = cfg.eval
        self.train_x = to_model(splits.train, splits.mean).to(device) if train_x is None else train_x
        self.test_x = to_model(splits.heldout[:e.loss_n_test], splits.mean).to(device)
        self.control_x = to_model(splits.control, splits.mean).to(device) if len(splits.control) else None
        self.loss_step = diffusion.step_for_time(e.loss_t)
        self.loss_steps = [diffusion.step_for_time(t) for t in e.loss_ts]
        # K disjoint blocks of the held-out pool, each of n_ref images; set k is images [start + k n_ref,
        # start + (k + 1) n_ref) of the source's ordering, and its key names exactly that range
        n_ref = reference_set_size(cfg, splits)
        self.fid_references = [splits.heldout[k * n_ref:(k + 1) * n_ref] for k in range(e.fid_reference_sets)]
        self.fid_reference_keys = [make_reference_key(dataset_sha256, n_ref, start=splits.heldout_range[0] + k * n_ref,
                                                      order=splits.order_tag)
                                   for k in range(e.fid_reference_sets)]
        self.fid_cache = default_cache_dir(cfg.data.cache_dir) / "fid_stats"
        self.fid_extractor = self._run_fid_extractor()
        self.shape = tuple(splits.train.shape[1:])
        self.batch_size = cfg.batch_size
        self.copy_history: CopyHistory | None = None  # read at the first evaluation, then kept by append_copies
        self.distance_scale: float | None = None  # D of the fixed-distance copy rules (median_neighbour_distance)

    def _run_fid_extractor(self) -> str:
        """``eval.fid_extractor``, except that "auto" sticks to the extractor of the run's earlier evaluations, so
        that one run's FID column never mixes feature spaces (e.g. after Inception weights appear on resume)."""
        if self.cfg.eval.fid_extractor != "auto":
            return self.cfg.eval.fid_extractor
        used = [r["fid_extractor"] for r in self.run.metrics() if r.get("fid_extractor")]
        return used[-1] if used else "auto"

    def evaluate(self, model: torch.nn.Module, step: int, train_s: float | None = None,
                 annotate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 n_samples: int | None = None) -> dict[str, Any]:
        """Measure ``model`` (the weights at training step ``step``), append the record, return it.

        ``annotate(record)`` may return extra keys that are added to the record before it is appended (the training
        loop's early stop). ``n_samples`` (>= ``eval.n_samples``; default ``eval.n_samples``) samples are drawn:
        f_mem counts all of them (``n_samples`` in the record), the FID uses the first ``eval.n_samples``
        (``fid_n_samples``), because the FID's bias depends on the sample count and one quality curve must stay
        one estimator. With ``eval.fid_clip_sample`` set and different from ``eval.clip_sample`` the FID gets its own
        draw of ``eval.n_samples`` from the same seed with that clipping (``fid_clip_sample`` in the record): f_mem
        from the official unclipped sampler, the FD from a clipped one."""
        e = self.cfg.eval
        n_draw = e.n_samples if n_samples is None else n_samples
        if n_draw < e.n_samples:
            raise ValueError(f"n_samples = {n_draw} is below eval.n_samples = {e.n_samples}")
        fork_devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork_devices):  # evaluation never moves the training RNG
            t0 = time.perf_counter()
            samples = draw_samples(self.diffusion, model, e, n_draw, self.shape, self.device)
            t1 = time.perf_counter()
            mem = memorized_fraction(samples, self.train_x, threshold=e.mem_threshold, n_boot=e.n_boot, seed=e.seed)
            t2 = time.perf_counter()
            fid_value = fid_std = fid_boot_std = fid_values = fid_extractor = fid_reference = None
            if e.fid:
                fid_samples = samples[:e.n_samples]
                if e.fid_clip_sample is not None and e.fid_clip_sample != e.clip_sample:
                    # the FD's own draw: the same seed, so the same initial noise, with the other clipping
                    fid_samples = draw_samples(self.diffusion, model, e, e.n_samples, self.shape, self.device,
                                               clip_sample=e.fid_clip_sample)
                results = fid_sets(to_uint8(fid_samples, self.splits.mean.to(samples.device)).cpu(),
                                   self.fid_references, self.fid_reference_keys, cache_dir=self.fid_cache,
                                   extractor=self.fid_extractor, weights=e.fid_weights, device=str(self.device),
                                   n_boot=e.fid_boot, seed=e.seed)
                fid_values = [r.value for r in results]
                fid_value = statistics.fmean(fid_values)
                fid_std = statistics.stdev(fid_values) if len(fid_values) > 1 else None
                if e.fid_boot > 1:  # the mean over the sets, per resample of the samples
                    fid_boot_std = statistics.stdev(statistics.fmean(v) for v in zip(*(r.boot for r in results)))
                fid_extractor, fid_reference = results[0].extractor, ",".join(r.reference for r in results)
                self.fid_extractor = fid_extractor
            t3 = time.perf_counter()
            levels = self._loss_levels(model, step) if e.loss_ts else {}
            t4 = time.perf_counter()
            if self.loss_step in self.loss_steps:  # eval.loss_t is one of the levels: the same draws, not redone
                k = self.loss_steps.index(self.loss_step)
                train_loss, test_loss = levels["train_losses"][k], levels["test_losses"][k]
            else:
                train_loss, test_loss = loss_gap(model, self.diffusion, self.train_x, self.test_x, self.loss_step,
                                                 draws=e.loss_noise_draws, seed=e.seed)
            t5 = time.perf_counter()
            self._save_grid(samples, mem.idx1, mem.ratios < e.mem_threshold, step)
        record = {
            "step": step,
            "images_seen": step * self.batch_size,
            "n_samples": n_draw,
            "fid_n_samples": e.n_samples if e.fid else None,
            "sampler": e.sampler,
            "sampler_steps": e.sampler_steps,
            "sampler_schedule": e.sampler_schedule,
            "clip_sample": e.clip_sample,
            "fid_clip_sample": (e.clip_sample if e.fid_clip_sample is None else e.fid_clip_sample) if e.fid else None,
            "seed": e.seed,
            "f_mem": mem.fraction,
            "f_mem_lo": mem.lo,
            "f_mem_hi": mem.hi,
            "mem_threshold": e.mem_threshold,
            "fid": fid_value,
            "fid_std": fid_std,
            "fid_boot_std": fid_boot_std,
            "fid_sets": fid_values,
            "fid_extractor": fid_extractor,
            "fid_reference": fid_reference,
            "train_loss": train_loss,
            "test_loss": test_loss,
            "loss_t": e.loss_t,
            "loss_step": self.loss_step,
            "train_s": train_s,
            "sample_s": round(t1 - t0, 3),
            "nn_s": round(t2 - t1, 3),
            "fid_s": round(t3 - t2, 3),
            "loss_s": round(t5 - t4, 3),
            **levels,
            **({"membership_s": round(t4 - t3, 3)} if levels else {}),
            "wall_s": round(time.perf_counter() - t0, 3),
        }
        if annotate is not None:
            record |= annotate(record)
        if self.copy_history is None:
            self.copy_history = CopyHistory(self.run)
        if e.copy_distances and self.distance_scale is None:  # once per process: the train set does not change
            self.distance_scale = median_neighbour_distance(self.train_x)
        append_copies(self.run, mem, samples, self.splits.mean, step, e.seed, len(self.train_x), self.copy_history,
                      (self.distance_scale, tuple(e.copy_distances)) if e.copy_distances else None)
        append_jsonl(self.run.metrics_path, record)
        tensorboard_live.records_appended(self.cfg, self.run)
        fid_text = "off" if fid_value is None else f"{fid_value:.2f}"
        self.log(f"{self.run.path.name} step {step}: f_mem {mem.fraction:.3f} [{mem.lo:.3f}, {mem.hi:.3f}]  "
                 f"fd {fid_text}  loss train {train_loss:.4f} test {test_loss:.4f}  ({record['wall_s']:.1f} s)")
        return record

    def _loss_levels(self, model: torch.nn.Module, step: int) -> dict[str, Any]:
        """The metrics line's keys of the noise levels ``eval.loss_ts`` (:meth:`diffmem.metrics.levels.LevelReading.
        record`): per level the mean train and held-out loss and the 95 % interval of their gap, the membership AUC
        of every train image against every scored held-out image (DeLong), and the same with the control block in
        the train set's place (the no-member control). Each training and control image's own losses go to
        image_losses.jsonl (appended here, before the metrics line)."""
        e = self.cfg.eval
        reading = level_reading(model, self.diffusion, self.train_x, self.test_x, self.control_x, self.loss_steps,
                                e.loss_noise_draws, e.seed)
        append_image_losses(self.run, step, e.loss_ts, reading.steps, reading.train.numpy(), reading.control.numpy())
        return reading.record(e.loss_ts)

    def fill_missing(self, kept: bool = False) -> list[int]:
        """Evaluate every saved checkpoint of the evaluation grid that has no metrics line yet, and with ``kept``
        also every kept checkpoint between them (``eval.checkpoint_ratio``); returns the steps evaluated.

        Leaves every RNG as it found it (a resumed training run stays bit-identical). A damaged checkpoint is a
        one-line CheckpointDamaged naming the file.
        """
        saved = set(self.run.checkpoint_steps())
        planned = saved if kept else saved & set(evaluation_steps(self.cfg.eval.times, self.cfg.train.steps))
        missing = sorted(planned - self.run.evaluated_steps())
        for step in missing:
            self.evaluate_checkpoint(step)
        return missing

    def evaluate_checkpoint(self, step: int, n_samples: int | None = None) -> dict[str, Any]:
        """Evaluate the saved weights of ``step`` (``checkpoints/step_*.pt``) with ``n_samples`` samples (see
        :meth:`evaluate`); every RNG is left as it was."""
        fork_devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork_devices):  # building the model draws initial weights
            model = checkpoint_model(self.run, self.cfg, step, self.device)
            return self.evaluate(model, step, n_samples=n_samples)

    def _save_grid(self, samples: torch.Tensor, idx1: torch.Tensor, memorized: torch.Tensor, step: int) -> None:
        """Save ``samples/step_XXXXXXXXX.png`` (diffmem.samplegrid): the first samples above their nearest training
        images; memorized samples framed in red, others in grey."""
        k = min(GRID_PAIRS, len(samples))
        shown = to_pixels(samples[:k], self.splits.mean.to(samples.device))
        nearest = to_pixels(self.train_x[idx1[:k].to(self.train_x.device)], self.splits.mean.to(self.device))
        write_sample_grid(self.run.samples_path(step), shown, nearest, memorized[:k])


def _open_run(run_dir: str | Path) -> tuple[RunDir, RunConfig]:
    """A run folder and the config stored in it (:func:`diffmem.rundir.read_config`); FileNotFoundError when it is
    not a run folder, ConfigFileError when its config.json cannot be read."""
    run = RunDir(run_dir)
    stored = run.read_config()
    if stored is None:
        raise FileNotFoundError(f"{run.path} is not a run folder (no config.json); pass the folder `diffmem train` "
                                "wrote")
    return run, stored.config


def lost_evaluations(run: RunDir) -> list[int]:
    """Evaluation steps up to where ``run`` is known to have trained (:meth:`RunDir.trained_step`) that have neither
    a metrics line nor a checkpoint: their evaluation is lost until ``diffmem train`` writes the checkpoint again."""
    pending = run.unevaluated(run.read_config().scheduled_steps(), run.trained_step())
    return [s for s in pending if not run.checkpoint_path(s).exists()]


@contextmanager
def _locked_evaluator(run: RunDir, cfg: RunConfig, device: str, log: Callable[[str], None]) -> Iterator[Evaluator]:
    """An Evaluator of ``run`` with ``cfg``, while holding the run's lock (never two processes appending to one
    metrics.jsonl), under the run's train.deterministic as inline evaluation is (the same kernels on a GPU).
    DataError when the data found are not those the run trained on (config.json's dataset_sha256): its memorization
    and losses would be measured against other images."""
    images = load_images(cfg.data)
    images.check_recorded(run.recorded_dataset_sha256(), cfg.data.source)
    splits = make_splits(images, cfg.data)
    dev = resolve_device(device)
    with RunLock(run), deterministic_algorithms(cfg.train.deterministic, dev):
        yield Evaluator(cfg, run, splits, images.sha256, Diffusion(cfg.diffusion), dev, log=log)


def evaluate_again(run_dir: str | Path, step: int, seed: int, device: str = "auto",
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Evaluate the saved checkpoint of ``step`` once more with sampling seed ``seed`` (fresh samples, the run's
    other settings); the line is appended to metrics.jsonl with its ``seed`` and returned. Readers that take the
    latest line per step see it, so use it where a second opinion on one checkpoint is wanted (the demo's advice
    check), not on the grid of a run that is analyzed."""
    run, cfg = _open_run(run_dir)
    with _locked_evaluator(run, cfg.replace(eval={"seed": seed}), device, log) as evaluator:
        return evaluator.evaluate_checkpoint(step)


def evaluate_run(run_dir: str | Path, device: str = "auto", fid_weights: str | None = None,
                 log: Callable[[str], None] = print, kept: bool = False,
                 refine_n_samples: int | None = None) -> list[int]:
    """``diffmem evaluate RUN_DIR``: evaluate every checkpoint of the run's evaluation grid that has no metrics line
    yet; with ``kept`` (``--kept``) also every kept checkpoint between them, which densifies the curves after
    training. A finished run with ``eval.refine_ratio`` then has its brackets refined (:mod:`diffmem.refine`).

    ``fid_weights`` replaces the Inception weights path stored in the run's config (it may differ per machine).
    ``refine_n_samples`` (``--refine-n-samples``) replaces ``eval.refine_n_samples`` for this refinement only: the
    run's config.json is not changed, and every metrics line records its own ``n_samples``.
    """
    run, cfg = _open_run(run_dir)
    for path in (run.metrics_path, run.copies_path, run.image_losses_path):  # a link is refused before any work
        refuse_unappendable(path)
    lost = lost_evaluations(run)
    if lost:
        raise CheckpointDamaged(f"{run.path}: evaluation step(s) {', '.join(map(str, lost))} have neither a metrics "
                                f"line nor a checkpoint; {damaged_checkpoint_advice(run, cfg, lost[0])}")
    if fid_weights:
        cfg = cfg.replace(eval={"fid_weights": fid_weights})
    if refine_n_samples is not None:
        if not cfg.eval.refine_ratio:
            raise ConfigError(f"{run.path} was trained without eval.refine_ratio: it keeps no checkpoints to refine, "
                             "so --refine-n-samples has nothing to do")
        cfg = cfg.replace(eval={"refine_n_samples": refine_n_samples})
    with _locked_evaluator(run, cfg, device, log) as evaluator:
        done = evaluator.fill_missing(kept=kept)
        if cfg.eval.refine_ratio and run.is_done():
            done += refine_brackets(evaluator, run, cfg.eval.refine_ratio, cfg.eval.refine_n_samples)
    if not done:
        log(f"{run.path}: every checkpoint already has a metrics line")
    return done
