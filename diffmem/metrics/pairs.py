"""Split pairs: two models trained on disjoint train sets A and B, sampled from the same initial noise.

Inputs are one pixel space for everything: samples and train images as float tensors (n, C, S, S) whose L2
distance is the memorization test's (``diffmem.metrics.memorization``: pixel values x / 255, flattened; the models'
centering offsets are added back first, which leaves distances within one model unchanged). Sample i of model A and
sample i of model B come from the same initial noise (one *draw*).

Per draw i, with ``d(x, T)`` the distance from x to its nearest image of the set T (``nearest_two``'s d1):

* pair distance ``||a_i - b_i||``: 0 for two models that map the noise to the same image (both generalize, Kadkhodaie
  et al. 2024), the distance between two images of the data population when they map it to unrelated images, and
  large when each copies its own train set;
* bias of a sample x of model M: ``ln(d(x, other train set) / d(x, M's own train set))``, dimensionless; 0 on average
  for a model without preference for its own images (its own train set is as far as an unseen one), > 0 when its
  samples sit nearer its own images. Both distances are floored at :data:`DISTANCE_FLOOR` so that an exact copy
  gives a large finite value. The draw's bias is the mean of its two samples' biases;
* own: 1 when the sample is strictly nearer its own train set than the other's, else 0; the draw's value is the
  mean over its two samples (0, 0.5 or 1). Its mean, ``own_fraction``, is 0.5 for no preference and 1 for copies.

* control bias (with a control block C, trained on by neither model): ``ln(d(x, other train set) / d(x, C))`` for
  a sample x of model M, the bias's log ratio with the model's own train set replaced by images it never saw but
  drawn as its train set was. Neither set was trained on, so it must read 0 whatever the models do; away from 0 the
  blocks differ in distribution and the bias measures the split as much as memorization.

Each measure is the mean over the n draws, with a 95% percentile-bootstrap interval that resamples draws (the two
samples of a draw share their noise, so they stay together): ``diffmem.metrics.memorization.bootstrap_interval``,
the same helper and seed convention as f_mem's interval. The three intervals use one seed, hence the same resamples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diffmem.metrics.memorization import MemorizationError, bootstrap_interval, nearest_two

DISTANCE_FLOOR = 1e-12  # pixel units: the smallest distance the bias's log ratio uses (an exact copy has d = 0)


@dataclass(frozen=True, eq=False)
class PairMeasures:
    """The paired measures of n draws and their 95% bootstrap intervals (see the module docstring).

    pair_distance*: mean L2 distance between paired samples, pixel units (x / 255). bias*: mean log ratio, no unit.
    own_fraction*: fraction of samples nearer their own train set, in [0, 1]. n_samples: draws n (each model drew n
    samples). Per draw, shape (n,) float64: ``pair_distances``, ``biases`` (the mean of the draw's two samples),
    ``own`` (0, 0.5 or 1).
    """

    pair_distance: float
    pair_distance_lo: float
    pair_distance_hi: float
    bias: float
    bias_lo: float
    bias_hi: float
    own_fraction: float
    own_fraction_lo: float
    own_fraction_hi: float
    n_samples: int
    pair_distances: np.ndarray
    biases: np.ndarray
    own: np.ndarray
    control_bias: float | None = None
    control_bias_lo: float | None = None
    control_bias_hi: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The scalars: each measure with its _lo / _hi (the control bias's only with a control block), and
        n_samples."""
        out: dict[str, Any] = {}
        names = ("pair_distance", "bias", "own_fraction") + (("control_bias",) if self.control_bias is not None else ())
        for name in names:
            out.update({name: getattr(self, name), f"{name}_lo": getattr(self, f"{name}_lo"),
                        f"{name}_hi": getattr(self, f"{name}_hi")})
        out["n_samples"] = self.n_samples
        return out


def own_and_other_distances(samples: torch.Tensor, own_train: torch.Tensor,
                            other_train: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_own, d_other): each sample's distance to its nearest image of ``own_train`` and of ``other_train``, (n,)
    float64 on the samples' device, in the inputs' units. ``samples`` (n, ...), the train sets (N, ...) with N >= 2
    and the same values per image; the exact search of :func:`diffmem.metrics.memorization.nearest_two`."""
    d_own = nearest_two(samples, own_train)[0]
    d_other = nearest_two(samples, other_train)[0]
    return d_own, d_other


def log_ratio(d_other: torch.Tensor, d_own: torch.Tensor) -> torch.Tensor:
    """Per sample ``ln(d_other / d_own)``, both floored at :data:`DISTANCE_FLOOR` (float64, shape of the inputs)."""
    return torch.log(d_other.clamp_min(DISTANCE_FLOOR)) - torch.log(d_own.clamp_min(DISTANCE_FLOOR))


def paired_measures(samples_a: torch.Tensor, samples_b: torch.Tensor, train_a: torch.Tensor, train_b: torch.Tensor,
                    *, n_boot: int = 1000, seed: int = 0, control: torch.Tensor | None = None) -> PairMeasures:
    """Pair distance, bias and own fraction of two models' samples drawn from the same noise (module docstring),
    and with ``control`` the control bias.

    Args:
        samples_a, samples_b: (n, C, S, S) float, row i of both from the same initial noise; pixel units.
        train_a, train_b: (N_a, C, S, S) and (N_b, C, S, S), the train sets of model A and model B, same units.
        n_boot: bootstrap resamples of the draws (>= 1). seed: the bootstrap's numpy seed.
        control: None, or (N_c, C, S, S) images trained on by neither model (N_c >= 2), same units.
    """
    if samples_a.shape != samples_b.shape:
        raise MemorizationError(f"paired samples must have one shape, got {tuple(samples_a.shape)} and "
                                f"{tuple(samples_b.shape)}; draw both from the same noise")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise MemorizationError(f"n_boot = {n_boot!r} must be an integer >= 1")
    own_a, other_a = own_and_other_distances(samples_a, train_a, train_b)
    own_b, other_b = own_and_other_distances(samples_b, train_b, train_a)
    diff = (samples_a.reshape(len(samples_a), -1).to(torch.float64)
            - samples_b.reshape(len(samples_b), -1).to(device=samples_a.device, dtype=torch.float64))
    distances = diff.square().sum(1).sqrt().cpu().numpy()
    biases = (0.5 * (log_ratio(other_a, own_a) + log_ratio(other_b, own_b))).cpu().numpy()
    own = (0.5 * ((own_a < other_a).double() + (own_b < other_b).double())).cpu().numpy()
    measured = [("pair_distance", distances), ("bias", biases), ("own_fraction", own)]
    if control is not None:  # each model's other train set against the control: both unseen by that model
        to_control_a = nearest_two(samples_a, control)[0]
        to_control_b = nearest_two(samples_b, control)[0]
        controls = 0.5 * (log_ratio(other_a, to_control_a) + log_ratio(other_b, to_control_b))
        measured.append(("control_bias", controls.cpu().numpy()))
    values = {}
    for name, per_draw in measured:
        lo, hi = bootstrap_interval(per_draw, n_boot, seed)
        mean = float(per_draw.mean())
        values.update({name: mean, f"{name}_lo": lo, f"{name}_hi": hi})
    if not all(math.isfinite(v) for v in values.values()):
        raise MemorizationError("a paired measure is not finite; check the samples for NaN or inf")
    return PairMeasures(**values, n_samples=int(distances.shape[0]), pair_distances=distances, biases=biases,
                        own=own)
