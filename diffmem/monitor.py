"""Watch a training run from your own loop: memorized fraction (or loss gap) now, and whether to stop.

Memorization::

    monitor = MemorizationMonitor(train_images, threshold=1/3, stop_at=0.01)
    for step in ...:
        if step in eval_steps:
            reading = monitor.update(step, model_samples)  # samples: (n, ...) in the space of train_images
            if reading.should_stop:
                break

``should_stop`` is True when the lower end of the 95% bootstrap interval of f_mem exceeds ``stop_at``: the model
copies training images with confidence (the same test as diffmem's tau_mem estimator, with ``floor = stop_at``).
The memorization test is :func:`diffmem.metrics.memorization.memorized_fraction` (nearest / second-nearest L2
distance ratio below ``threshold``).

Loss gap (no sampling needed, an earlier and cheaper signal)::

    gap_monitor = LossGapMonitor()
    reading = gap_monitor.update(step, train_loss, test_loss)

``should_stop`` is True once the gap has opened by the rule of :func:`diffmem.analysis.timescales.tau_gap` and a
later evaluation confirmed it.

Membership AUC (no sampling either: one denoiser pass per image and noise level and draw)::

    membership = MembershipMonitor(train_images, heldout_images, diffusion, lag=None)
    reading = membership.update(step, model)  # model: the U-Net being trained (called as model(x_t, t).sample)

``should_stop`` is True once tau_auc is established: the lower end of the 95 % DeLong interval of the membership AUC
(the levels combined, as in metrics.jsonl's ``membership_auc_lo``) is above 0.5 at this update and at the previous
one; with ``lag`` (the calibration's lag ratio tau_mem / tau_auc, from ``diffmem analyze``) it waits further, until
the step ``lag x tau_auc`` at which memorization is predicted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from diffmem.analysis.timescales import Estimate, tau_auc, tau_gap
from diffmem.config import EvalConfig
from diffmem.diffusion import Diffusion
from diffmem.metrics.levels import level_reading
from diffmem.metrics.memorization import DEFAULT_THRESHOLD, memorized_fraction


class MonitorError(ValueError):
    """Bad input to a monitor; the message says what to pass."""


@dataclass(frozen=True)
class MonitorReading:
    """f_mem at one step with its 95% bootstrap interval (fractions in [0, 1]) and the stop decision."""

    step: int
    f_mem: float
    lo: float
    hi: float
    should_stop: bool
    reason: str


class MemorizationMonitor:
    """Memorized fraction of a model's samples against its training set, evaluated when you call :meth:`update`.

    Args:
        train_images: (N, ...) float tensor, the training set in the space the model generates (N >= 2).
        threshold: a sample is memorized when d1/d2 < threshold (paper: 1/3).
        stop_at: stop when the interval's lower end exceeds this fraction (default 0.01).
        n_boot, seed: bootstrap resamples and seed of the interval.
    """

    def __init__(self, train_images: torch.Tensor, threshold: float = DEFAULT_THRESHOLD, stop_at: float = 0.01,
                 n_boot: int = 1000, seed: int = 0):
        if not isinstance(train_images, torch.Tensor) or train_images.ndim < 2 or train_images.shape[0] < 2:
            raise MonitorError("train_images must be a tensor of shape (N, ...) with N >= 2 training images")
        if not 0.0 <= stop_at < 1.0:
            raise MonitorError(f"stop_at = {stop_at} must be a fraction in [0, 1), e.g. 0.01")
        self.train_images = train_images
        self.threshold = threshold
        self.stop_at = stop_at
        self.n_boot = n_boot
        self.seed = seed
        self.history: list[MonitorReading] = []

    @property
    def first_stop_step(self) -> int | None:
        """The first step whose reading said stop, or None."""
        return next((r.step for r in self.history if r.should_stop), None)

    def update(self, step: int, samples: torch.Tensor) -> MonitorReading:
        """Measure f_mem of ``samples`` ((n, ...) generated images, n >= 2) at training step ``step``."""
        if self.history and step <= self.history[-1].step:
            raise MonitorError(f"step {step} is not after the previous update's step {self.history[-1].step}")
        result = memorized_fraction(samples, self.train_images, self.threshold, self.n_boot, self.seed)
        stop = result.lo > self.stop_at
        if stop:
            reason = (f"f_mem = {result.fraction:.3f}, its 95% lower bound {result.lo:.3f} > stop_at {self.stop_at:g}: "
                      "the model copies training images; stop (or roll back to an earlier checkpoint)")
        else:
            reason = (f"f_mem = {result.fraction:.3f} [{result.lo:.3f}, {result.hi:.3f}]: lower bound <= stop_at "
                      f"{self.stop_at:g}, no memorization established")
        reading = MonitorReading(int(step), result.fraction, result.lo, result.hi, stop, reason)
        self.history.append(reading)
        return reading


@dataclass(frozen=True)
class GapReading:
    """The loss gap (test - train, in the loss's units) at one step and the stop decision."""

    step: int
    train_loss: float
    test_loss: float
    gap: float
    tau_gap: Estimate
    should_stop: bool
    reason: str


class LossGapMonitor:
    """Train/test loss gap over the evaluations so far; ``z`` and ``rtol`` as in :func:`tau_gap`."""

    def __init__(self, z: float = 3.0, rtol: float = 0.05):
        self.z = z
        self.rtol = rtol
        self.history: list[tuple[int, float, float]] = []

    def update(self, step: int, train_loss: float, test_loss: float) -> GapReading:
        """Record the losses at ``step`` (same loss, e.g. the DSM loss at a fixed diffusion time, on train and
        held-out images) and decide whether the gap has opened."""
        if self.history and step <= self.history[-1][0]:
            raise MonitorError(f"step {step} is not after the previous update's step {self.history[-1][0]}")
        self.history.append((int(step), float(train_loss), float(test_loss)))
        steps, train, test = zip(*self.history)
        estimate = tau_gap(steps, train, test, z=self.z, rtol=self.rtol)
        confirmed = estimate.measured and estimate.hi is not None and estimate.hi < step
        if confirmed:
            reason = (f"the loss gap opened at about step {estimate.value:.4g} (confirmed by a later evaluation); "
                      "memorization typically follows: stop or watch f_mem")
        elif estimate.value is None:
            reason = f"not enough evaluations yet ({estimate.rule})"
        else:
            reason = "the loss gap is within its noise band"
        return GapReading(int(step), float(train_loss), float(test_loss), float(test_loss - train_loss), estimate,
                          confirmed, reason)


@dataclass(frozen=True)
class MembershipReading:
    """The membership AUC at one step (a probability in [0, 1]) with its 95 % DeLong interval, tau_auc from the
    updates so far, and the stop decision.

    ``stop_step`` (optimizer steps): None until tau_auc is established; then tau_auc's value without a lag, or
    ``lag x tau_auc`` (the predicted memorization step) with one. ``should_stop``: established and ``step >=
    stop_step``."""

    step: int
    auc: float
    lo: float
    hi: float
    tau_auc: Estimate
    stop_step: float | None
    should_stop: bool
    reason: str


class MembershipMonitor:
    """Membership AUC of the per-image denoising losses (every train image against every held-out image), evaluated
    when you call :meth:`update`: exactly the evaluation's measure (metrics.jsonl ``membership_auc``), computed by
    the same function (:func:`diffmem.metrics.levels.level_reading`), without drawing a sample. Given the same
    images, levels, draws and seed as a run's evaluation (``eval.loss_ts``, ``eval.loss_noise_draws``,
    ``eval.seed``, the train set and the first ``eval.loss_n_test`` held-out images), it reads the same AUC.

    Args:
        train_images, heldout_images: (N, C, S, S) and (n, C, S, S) tensors in the model's centered pixel units, on
            the model's device, every one of them compared (N, n >= 2; the groups may differ in size).
        diffusion: the run's :class:`~diffmem.diffusion.Diffusion` (its noise schedule).
        loss_ts: the diffusion times of the noise levels (the evaluation's ``eval.loss_ts`` by default).
        draws, seed: noise draws averaged per image and level, and their seed (the same noise at every update).
        lag: None, or the calibration's lag ratio tau_mem / tau_auc (``diffmem analyze``'s calibration): stop at the
            step ``lag x tau_auc`` where memorization is predicted instead of as soon as tau_auc is established.
    Cost of one update: ``(N + n) x len(loss_ts) x draws`` denoiser calls (images), against thousands of network
    calls per sample for f_mem.
    """

    def __init__(self, train_images: torch.Tensor, heldout_images: torch.Tensor, diffusion: Diffusion,
                 loss_ts: Sequence[float] = EvalConfig.loss_ts, draws: int = 5, seed: int = 0,
                 lag: float | None = None):
        for name, images in (("train_images", train_images), ("heldout_images", heldout_images)):
            if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[0] < 2:
                raise MonitorError(f"{name} must be a tensor of shape (N, C, S, S) with at least 2 images")
        if not loss_ts or any(not t > 0 for t in loss_ts):
            raise MonitorError(f"loss_ts = {list(loss_ts)} must hold at least one diffusion time > 0, e.g. (0.01,)")
        if draws < 1:
            raise MonitorError(f"draws = {draws} must be at least 1")
        if lag is not None and not lag > 0:
            raise MonitorError(f"lag = {lag} must be a positive ratio tau_mem / tau_auc (or None: stop at tau_auc)")
        self.train_images, self.heldout_images = train_images, heldout_images
        self.diffusion, self.draws, self.seed, self.lag = diffusion, draws, seed, lag
        self.loss_ts = tuple(loss_ts)
        self.steps = [diffusion.step_for_time(t) for t in loss_ts]
        self.history: list[MembershipReading] = []

    @property
    def first_stop_step(self) -> int | None:
        """The first step whose reading said stop, or None."""
        return next((r.step for r in self.history if r.should_stop), None)

    def update(self, step: int, model: torch.nn.Module) -> MembershipReading:
        """Measure the membership AUC of ``model`` (the weights at optimizer step ``step``) and decide whether to
        stop; the model's train/eval mode is given back."""
        if self.history and step <= self.history[-1].step:
            raise MonitorError(f"step {step} is not after the previous update's step {self.history[-1].step}")
        reading = level_reading(model, self.diffusion, self.train_images, self.heldout_images, None, self.steps,
                                self.draws, self.seed).record(self.loss_ts)
        auc, lo, hi = reading["membership_auc"], reading["membership_auc_lo"], reading["membership_auc_hi"]
        lows = [r.lo for r in self.history] + [lo]
        estimate = tau_auc([r.step for r in self.history] + [int(step)], lows)
        established = len(lows) >= 2 and min(lows[-2:]) > 0.5
        stop_step = None
        if not established:
            reason = (f"AUC {auc:.3f} [{lo:.3f}, {hi:.3f}]: tau_auc not established (the lower end is not "
                      "above 0.5 at this and the previous update)")
        elif self.lag is None:
            stop_step = float(estimate.value)
            reason = (f"AUC {auc:.3f} [{lo:.3f}, {hi:.3f}]: tau_auc established at about step "
                      f"{stop_step:.4g}; the losses tell training images from held-out ones: stop (or watch f_mem)")
        else:
            stop_step = self.lag * float(estimate.value)
            reason = (f"AUC {auc:.3f} [{lo:.3f}, {hi:.3f}]: tau_auc established at about step "
                      f"{estimate.value:.4g}; predicted memorization step lag x tau_auc = {stop_step:.4g}")
        reading = MembershipReading(int(step), auc, lo, hi, estimate, stop_step,
                                    stop_step is not None and step >= stop_step, reason)
        self.history.append(reading)
        return reading
