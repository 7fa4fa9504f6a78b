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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from diffmem.analysis.timescales import Estimate, tau_gap
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
