"""The training loop: one run folder, log-spaced evaluation steps, full-state checkpoints, auto-resume.

``train(cfg, run_dir)`` is idempotent: a finished run (``done`` exists) is skipped, a partial one continues from
``state.pt`` and ends with exactly the weights an uninterrupted run would have (all RNG states are saved). Steps are
optimizer steps; images seen = steps x batch, with batch = min(train.batch_size, data.n). SIGTERM, SIGUSR2 (Slurm
preemption) and SIGINT save ``state.pt`` and return with status "interrupted".

Crash safety: a process holds the run's :class:`~diffmem.rundir.RunLock` while it trains, so a second process on the
same folder stops with :class:`~diffmem.rundir.RunLocked`. ``state.pt`` is replaced atomically and its previous version
is kept as ``state.prev.pt``; resume falls back to that one when ``state.pt`` is damaged (:func:`diffmem.rundir.load_resume_state`).
At each evaluation step the checkpoint is written first, then the state, then the metrics line, and a step that already
has a metrics line is never evaluated again, so a run killed at any moment and rerun ends with every evaluation step in
``metrics.jsonl`` exactly once and with the weights of an uninterrupted run. A NaN / inf loss or weight stops the run
with :class:`TrainingDiverged` before anything non-finite is saved.
"""
from __future__ import annotations

import contextlib
import datetime
import shutil
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from diffmem.config import RunConfig
from diffmem.data import load_images, make_splits, to_model
from diffmem.device import resolve_device
from diffmem.diffusion import Diffusion
from diffmem.evaluate import CheckpointDamaged, Evaluator, load_checkpoint, reference_set_size
from diffmem.metrics.fid import check_extractor
from diffmem.io import atomic_torch_save, atomic_write_text, refuse_unappendable
from diffmem.acceleration import autocast, deterministic_algorithms, evaluation_copy, memory_format, step_model
from diffmem.model import build_from_config, count_parameters
from diffmem.outcomes import DONE, INTERRUPTED, SKIPPED
from diffmem.tensorboard import live as tensorboard_live
from diffmem.refine import refine_brackets, stop_reason
from diffmem.eval_grid import evaluation_steps, kept_steps
from diffmem.rundir import (RETRAIN_PREFIX, START_AGAIN, ImageManifest, RunDir, RunLock, StateDamaged, Trajectory,
                            TrajectoryNotReplayable, capture_rng, check_images_file, check_same_config,
                            continue_as_recorded, extend_budget, extends_budget, load_resume_state,
                            prepare_run_folder, record_reseed, require_folder, resume_rng, write_images_file)


class TrainingDiverged(RuntimeError):
    """The training loss (or a weight) became NaN or infinite."""


LOSS_CHECK_EVERY = 100  # optimizer steps between two checks of the training loss for NaN / inf


@dataclass(frozen=True)
class TrainResult:
    status: str  # DONE | SKIPPED (was already done) | INTERRUPTED (state saved, rerun to continue): diffmem.outcomes
    step: int  # optimizer steps completed
    run_dir: Path
    signals: tuple[str, ...] = ()  # names of the signals that interrupted it, in arrival order ("SIGUSR2", ...)


def build_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum)
    return torch.optim.Adam(params, lr=t.lr)


def training_step(model: torch.nn.Module, diffusion: Diffusion, optimizer: torch.optim.Optimizer,
                  batcher: EpochBatcher, train_x: torch.Tensor, generator: torch.Generator,
                  precision: str = "fp32") -> torch.Tensor:
    """One optimizer step on the next batch; returns the detached loss, left on the device (no host sync).

    ``precision``: "fp32", or "bf16" for the U-Net forward under autocast (:mod:`diffmem.acceleration`).
    """
    idx = batcher.next()
    x0 = train_x if idx is None else train_x[idx]
    with autocast(train_x.device, precision):
        loss = diffusion.loss(model, x0, generator=generator)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


class EpochBatcher:
    """Batches of indices that run through a fresh random permutation of the train set each epoch.

    With batch == n every step uses the whole train set (no gather). ``state_dict`` makes a resume exact.
    """

    def __init__(self, n: int, batch: int, generator: torch.Generator):
        self.n, self.batch, self.generator = n, batch, generator
        self.perm: torch.Tensor | None = None
        self.pos = 0

    def next(self) -> torch.Tensor | None:
        """Indices (batch,) on the generator's device, or None for "all images"."""
        if self.batch >= self.n:
            return None
        if self.perm is None or self.pos + self.batch > self.n:
            self.perm = torch.randperm(self.n, generator=self.generator, device=self.generator.device)
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state_dict(self) -> dict[str, Any]:
        return {"perm": None if self.perm is None else self.perm.cpu(), "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        perm = state["perm"]
        self.perm = None if perm is None else perm.to(self.generator.device)
        self.pos = int(state["pos"])


@contextlib.contextmanager
def _stop_on_signals(flag: list[str]):
    """While active, SIGTERM / SIGUSR2 / SIGINT record their name in ``flag`` instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else [])
    previous = {s: signal.getsignal(s) for s in sigs}

    def handler(signum, _frame):
        flag.append(signal.Signals(signum).name)

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def checkpoints_to_rewrite(run: RunDir, steps: list[int]) -> list[int]:
    """Those of ``steps`` (optimizer steps) whose checkpoint file is missing or cannot be read
    (:func:`load_checkpoint`, on the CPU)."""
    out = []
    for step in steps:
        try:
            load_checkpoint(run.checkpoint_path(step))
        except CheckpointDamaged:
            out.append(step)
    return out


def has_work(cfg: RunConfig, run: RunDir) -> bool:
    """Whether ``diffmem train`` has anything to do in ``run``: False only for a finished run (``done``) whose
    budget does not grow and whose evaluation steps up to where it stopped all have a metrics line, or (with
    ``eval.inline`` off, where evaluation is ``diffmem evaluate``'s) a readable checkpoint."""
    stored = run.read_config()
    if not run.is_done() or stored is None or extends_budget(cfg, run):
        return True
    pending = run.unevaluated(stored.scheduled_steps(), run.trained_step())
    return bool(pending) and (cfg.eval.inline or bool(checkpoints_to_rewrite(run, pending)))


def rewrite_checkpoints(cfg: RunConfig, run: RunDir, steps: list[int], model: torch.nn.Module, step: int,
                        device: torch.device, trajectory: Trajectory, *, progress: bool,
                        log: Callable[[str], None]) -> bool:
    """Write again the checkpoints of evaluation ``steps`` (at most ``step``, the step of the state just loaded into
    ``model``) whose files are missing or damaged; a damaged file is first set aside as ``step_*.damaged.pt``.

    The weights of ``step`` come from the state; earlier ones from training the run again from step 0 in a scratch
    folder inside the run folder (``.retrain.*``, removed afterwards): with the run's seed and the same number of
    torch threads the weights are bit-identical to the first pass (the trajectory depends neither on the budget nor
    on evaluations). That needs a replayable ``trajectory`` (the run's so far, continued by this process): otherwise
    TrajectoryNotReplayable, one line, before anything is written, rather than another trajectory's weights. Returns
    False, having written nothing more, when a signal interrupted that training."""
    earlier = [s for s in steps if s < step]
    if earlier and trajectory.not_replayable:
        raise TrajectoryNotReplayable(
            f"{run.path}: the checkpoint(s) of step(s) {', '.join(map(str, earlier))} are lost and training again "
            f"from step 0 would write another trajectory's weights ({trajectory.not_replayable}); restore them from a "
            f"copy, or {START_AGAIN}")
    for s in steps:
        path = run.checkpoint_path(s)
        if path.exists():
            path.replace(path.with_name(f"{run.step_name(s)}.damaged.pt"))
            log(f"{run.path}: {path.name} is damaged; set aside as {run.step_name(s)}.damaged.pt")
    if step in steps:
        atomic_torch_save(run.checkpoint_path(step), {"step": step, "model": model.state_dict()})
    if earlier:
        log(f"{run.path}: training again from step 0 to step {earlier[-1]} to write the checkpoint(s) of step(s) "
            f"{', '.join(map(str, earlier))} again")
        scratch = Path(tempfile.mkdtemp(prefix=RETRAIN_PREFIX, dir=run.path))
        replay = cfg.replace(train={"steps": earlier[-1]},
                             eval={"times": earlier, "inline": False, "checkpoint_ratio": 0.0, "refine_ratio": 0.0,
                                   "refine_n_samples": 0, "stop_f_mem": 0.0})
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                result = train(replay, scratch, progress=progress, log=lambda _m: None)
            if result.status != DONE:
                return False
            run.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            for s in earlier:
                RunDir(scratch).checkpoint_path(s).replace(run.checkpoint_path(s))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    log(f"{run.path}: wrote the checkpoint(s) of step(s) {', '.join(map(str, steps))} again")
    return True


def train(cfg: RunConfig, run_dir: str | Path, *, progress: bool = True, stop_at_step: int | None = None,
          log: Callable[[str], None] = print, progress_position: int = 0) -> TrainResult:
    """Train (or continue, or skip) the run in ``run_dir``; evaluate inline at each evaluation step when
    ``cfg.eval.inline``.

    ``progress_position``: the terminal row of this run's progress bar (parallel runs each get their own).
    ``stop_at_step`` stops after that many optimizer steps as a preemption would (state saved, status
    "interrupted"); it exists so that tests and benchmarks can cut a run at a chosen point. Raises RunLocked when
    another live process works on ``run_dir``, StateDamaged when its state files are unreadable, TrainingDiverged on
    a NaN / inf loss; the lock is released on every return and every exception. A finished run is skipped unless
    an evaluation step up to where it stopped lost its metrics line (then evaluated again) or its checkpoint
    (then written again: :func:`rewrite_checkpoints`). A command that fails before training leaves the folder as it
    found it: config.json is written, a budget raised and ``done`` deleted only once the run's state has been read.
    An existing run folder keeps the ``model.init`` it recorded, whatever ``cfg`` says (:func:`continue_as_recorded`).
    """
    run = RunDir(run_dir)
    require_folder(run.path)
    for path in (run.metrics_path, run.copies_path, run.image_losses_path):  # a link is refused before any work
        refuse_unappendable(path)
    check_same_config(cfg, run)
    run.metrics()  # every recorded line validated (a RecordError names a bad one) before anything is written
    if not has_work(cfg, run):
        log(f"{run.path}: already done, skipping")
        return TrainResult(SKIPPED, cfg.train.steps, run.path)
    device = resolve_device(cfg.train.device)
    if cfg.train.num_threads > 0:
        torch.set_num_threads(cfg.train.num_threads)
    if cfg.eval.inline and cfg.eval.fid and (cfg.eval.fid_extractor != "auto" or cfg.eval.fid_weights):
        check_extractor(cfg.eval.fid_extractor, cfg.eval.fid_weights)  # fail before anything is written
    images = load_images(cfg.data)
    splits = make_splits(images, cfg.data)
    if cfg.eval.inline:
        reference_set_size(cfg, splits)  # fail before anything is written
    created = [p for p in (run.path, *run.path.parents) if not p.exists()]  # folders the lock will create
    try:
        with RunLock(run) as lock:
            check_same_config(cfg, run, images.sha256)
            cfg = continue_as_recorded(cfg, run, log)
            manifest = ImageManifest.of_splits(splits, images.sha256, len(images), cfg.eval.loss_n_test)
            has_manifest = check_images_file(run, manifest)  # other images than recorded: an error, nothing written
            if not has_work(cfg, run):  # another process finished it while this one loaded data
                log(f"{run.path}: already done, skipping")
                return TrainResult(SKIPPED, cfg.train.steps, run.path)
            try:
                with deterministic_algorithms(cfg.train.deterministic, device):
                    return _train_locked(cfg, run, lock, images, splits, device,
                                         manifest=None if has_manifest else manifest, progress=progress,
                                         stop_at_step=stop_at_step, log=log, progress_position=progress_position)
            except TrainingDiverged as e:  # `diffmem status` shows the run as failed, with this line
                atomic_write_text(run.failed_path, f"{e}\n")
                raise
    except BaseException:
        for folder in created:  # a new folder that a failure left empty goes again
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _train_locked(cfg: RunConfig, run: RunDir, lock: RunLock, images, splits, device: torch.device, *,
                  manifest: ImageManifest | None, progress: bool, stop_at_step: int | None, log: Callable[[str], None],
                  progress_position: int = 0) -> TrainResult:
    """The body of :func:`train`, run while holding the run's lock."""
    diffusion = Diffusion(cfg.diffusion)
    torch.manual_seed(cfg.train.seed)
    model = build_from_config(cfg.model, cfg.data.image_size).to(device)
    state = load_resume_state(run)  # before anything is written: a run that cannot resume stays as it was
    if state is None and run.is_done():
        raise StateDamaged(f"{run.path} is marked done but has neither {run.state_path.name} nor "
                           f"{run.state_prev_path.name} to continue from; restore them from a copy, or {START_AGAIN}")
    if extends_budget(cfg, run):
        extend_budget(cfg, run, log)
    for leftover in run.remove_temp_files():
        log(f"{run.path}: removed {leftover.name}, left by a write that was cut short")
    run.failed_path.unlink(missing_ok=True)
    prepare_run_folder(cfg, run, images.sha256, images.manifest, count_parameters(model), device)
    if manifest is not None:  # images.json next to config.json (a folder that predates it gets it now)
        write_images_file(run, manifest)

    optimizer = build_optimizer(cfg, model.parameters())
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.train.seed)
    train_x = to_model(splits.train, splits.mean).to(device)
    batcher = EpochBatcher(len(train_x), cfg.batch_size, generator)
    stepper = step_model(model, channels_last=cfg.train.channels_last, compile=cfg.train.compile)
    train_x = train_x.contiguous(memory_format=memory_format(cfg.train.channels_last))
    step, train_s_before = 0, 0.0
    resumed = state is not None
    trajectory = Trajectory.segment(device, deterministic=cfg.train.deterministic, compile=cfg.train.compile,
                                    channels_last=cfg.train.channels_last)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batcher.load_state_dict(state["batcher"])
        step = int(state["step"])
        saved = Trajectory.saved(state, trajectory)
        trajectory = saved.continued_by(trajectory)
        reseeded = resume_rng(state, generator, device)
        train_s_before = float(state.get("train_s", 0.0))
        log(f"{run.path}: resuming at step {step}")
        del state

    # evaluation steps up to the state's step that lost both their metrics line and their checkpoint (or whose
    # checkpoint is damaged): write the checkpoints again, then evaluate them (inline) as any unevaluated one
    lost = checkpoints_to_rewrite(run, run.unevaluated(run.read_config().scheduled_steps(), step))
    if lost and not rewrite_checkpoints(cfg, run, lost, model, step, device, trajectory, progress=progress, log=log):
        log(f"{run.path}: interrupted while writing lost checkpoints again; rerun the same command to continue")
        return TrainResult(INTERRUPTED, step, run.path)
    if resumed and reseeded is not None:  # recorded once training goes on from the state
        warnings.warn(f"{run.path}: the state of step {step} was saved on {saved.device} and this process trains "
                      f"on {device.type}, whose generators cannot take its random number states: batch order, "
                      f"noise and dropout go on from generators re-seeded with {reseeded} (derived from the saved "
                      f"state), so the run keeps the statistics of an uninterrupted run but not its bits "
                      f"(recorded in config.json under \"reseeded\"); to keep the bits, resume on {saved.device}")
        record_reseed(run, step, saved.device, device.type, reseeded)

    evaluator = None
    if cfg.eval.inline:
        evaluator = Evaluator(cfg, run, splits, images.sha256, diffusion, device, log=log, train_x=train_x)
        evaluator.fill_missing()
    evaluated = run.evaluated_steps()

    segment_start, eval_seconds = time.perf_counter(), 0.0
    saved_step: list[int | None] = [step if resumed else None]  # step of the last good state on disk

    def train_seconds() -> float:
        """Wall seconds spent training (evaluations excluded), summed over every process of this run."""
        return train_s_before + time.perf_counter() - segment_start - eval_seconds

    def diverged(what: str, at_step: int) -> TrainingDiverged:
        kept = (f"{run.state_path} keeps the last good state (step {saved_step[0]})" if saved_step[0] is not None
                else "no state was saved")
        return TrainingDiverged(f"training diverged: {what} at step {at_step}; {kept}; lower train.lr or use "
                                "--set train.optimizer=adam")

    def save_state() -> None:
        """Write state.pt (keeping the previous one as state.prev.pt); refuses non-finite weights."""
        finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()
        if not bool(finite):
            raise diverged("a weight became NaN or infinite", step)
        atomic_torch_save(run.state_path, {
            "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "batcher": batcher.state_dict(), "rng": capture_rng(generator, device), "train_s": train_seconds(),
            "trajectory": trajectory.to_dict(),
        }, keep_previous=run.state_prev_path)
        saved_step[0] = step

    if saved_step[0] is None:  # a new run: its step-0 state marks the folder as started (see load_resume_state)
        save_state()

    all_eval_steps = evaluation_steps(cfg.eval.times, cfg.train.steps)
    eval_steps = [s for s in all_eval_steps if s > step]
    keep = set(kept_steps(all_eval_steps, cfg.eval.checkpoint_ratio))
    stopped = next((r["stop"] for r in run.metrics() if r.get("stop")), None)  # an early stop a crash left behind
    if stopped:
        eval_steps = []
    stop: list[str] = []
    model.train()
    # losses of the steps since the last check, (LOSS_CHECK_EVERY,) on the device: no host sync per step
    window = torch.zeros(LOSS_CHECK_EVERY, device=device)
    window_n, bar = 0, tqdm(total=cfg.train.steps, initial=step, disable=not progress, desc=run.path.name,
                            unit="step", dynamic_ncols=True, leave=False, position=progress_position)

    def check_losses() -> None:
        """Raise TrainingDiverged naming the first step whose loss was NaN / inf since the last check."""
        nonlocal window_n
        if window_n == 0:
            return
        losses = window[:window_n]
        mean_loss = losses.mean().item()
        if not np.isfinite(mean_loss):
            first_bad = int((~torch.isfinite(losses)).nonzero()[0, 0]) if not torch.isfinite(losses).all() else 0
            bad_value = losses[first_bad].item()
            raise diverged(f"the loss became {bad_value}", step - window_n + first_bad + 1)
        bar.set_postfix(loss=f"{mean_loss:.4f}")
        tensorboard_live.training_loss(cfg, run, step, mean_loss)
        window_n = 0
        lock.check()

    with _stop_on_signals(stop), bar:
        while step < cfg.train.steps and not stopped:
            window[window_n] = training_step(stepper, diffusion, optimizer, batcher, train_x, generator,
                                             cfg.train.precision)
            step += 1
            window_n += 1
            bar.update(1)
            at_eval = bool(eval_steps) and step == eval_steps[0]
            if at_eval or window_n == LOSS_CHECK_EVERY or step in keep:
                check_losses()
            if step in keep:  # weights only, for refining a bracket after training (diffmem.refine)
                atomic_torch_save(run.checkpoint_path(step), {"step": step, "model": model.state_dict()})
            if at_eval:
                eval_steps.pop(0)
                atomic_torch_save(run.checkpoint_path(step), {"step": step, "model": model.state_dict()})
                save_state()
                if evaluator is not None and step not in evaluated:  # a rerun may have evaluated it already
                    e0 = time.perf_counter()
                    early = step < cfg.train.steps  # at the last step of the budget training ends anyway
                    # a contiguous fp32 copy: the numbers `diffmem evaluate` gets from the checkpoint just written
                    record = evaluator.evaluate(evaluation_copy(model), step, train_s=round(train_seconds(), 3),
                                                annotate=lambda r: _stop_annotation(run, r, cfg.eval.stop_f_mem)
                                                if early else {})
                    evaluated.add(step)
                    eval_seconds += time.perf_counter() - e0
                    model.train()
                    stopped = record.get("stop")
                    if stopped:
                        log(f"{run.path}: stopping early at step {step}: {stopped}")
                        break
            if stop or (stop_at_step is not None and step >= stop_at_step and step < cfg.train.steps):
                check_losses()
                save_state()
                why = stop[0] if stop else f"stop_at_step={stop_at_step}"
                log(f"{run.path}: {why}: saved state at step {step}; rerun the same command to continue")
                return TrainResult(INTERRUPTED, step, run.path, signals=tuple(stop))
    check_losses()
    save_state()
    if evaluator is not None and cfg.eval.refine_ratio:
        for refined in refine_brackets(evaluator, run, cfg.eval.refine_ratio, cfg.eval.refine_n_samples):
            log(f"{run.path}: refined a bracket with the kept checkpoint of step {refined}")
    atomic_write_text(run.done_path, datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                      + f"\nsteps {step}\ntrain_s {train_seconds():.1f}\n"
                      + (f"stopped early: {stopped}\n" if stopped else ""))
    log(f"{run.path}: done, {step} steps" + (" (stopped early)" if stopped else ""))
    return TrainResult(DONE, step, run.path)


def _stop_annotation(run: RunDir, record: dict[str, Any], stop_f_mem: float) -> dict[str, Any]:
    """``{"stop": reason}`` for the record of an evaluation after which training stops (:func:`stop_reason`)."""
    reason = stop_reason(run.metrics() + [record], stop_f_mem) if stop_f_mem > 0 else None
    return {"stop": reason} if reason else {}


