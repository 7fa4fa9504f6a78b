"""The sampling-free readings of one checkpoint at the noise levels ``eval.loss_ts``, and their no-member control.

Three groups of images are scored with the same per-image denoising losses (:func:`diffmem.metrics.losses.
per_image_losses`: the same noise draws, level by level):

* the **members**: the N training images;
* the **non-members**: the held-out images the evaluation scores (``eval.loss_n_test`` of the held-out pool);
* the **control**: N images never trained on but drawn exactly as the train set was (``diffmem.data.splits``).

The signals compare members with non-members: per level the mean losses and the 95 % interval of their gap (Welch,
:func:`~diffmem.metrics.losses.level_gaps`), and the membership AUC per level and for the levels combined
(DeLong, :mod:`diffmem.metrics.membership`) on every member against every non-member. The **control** is the same
computation with the control images in the members' place: it must read its null (a gap of 0, an AUC of 0.5)
whatever the model does, because the model saw neither group; where it does not, the signal measures how the image
sets were drawn, not memorization.

:func:`level_reading` is the one implementation: the evaluation (metrics.jsonl) and
:class:`diffmem.monitor.MembershipMonitor` both call it, so the two give the same AUC at the same checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from diffmem.diffusion import Diffusion
from diffmem.metrics.losses import level_gaps, per_image_losses
from diffmem.metrics.membership import membership_aucs


@dataclass(frozen=True)
class LevelReading:
    """Per-image losses of one checkpoint, (levels, images) float64 CPU tensors: ``train`` (L, N), ``nonmembers``
    (L, n) and ``control`` (L, N_control), N_control = 0 without a control block; ``steps``: the DDPM step of each
    level."""

    steps: tuple[int, ...]
    train: torch.Tensor
    nonmembers: torch.Tensor
    control: torch.Tensor

    def record(self, loss_ts: Sequence[float]) -> dict[str, Any]:
        """The metrics line's keys of the levels: the signals (``train_losses``, ``test_losses``, ``loss_gap_lo/hi``,
        ``auc``/``auc_lo``/``auc_hi`` per level, ``membership_auc``/``_lo``/``_hi`` combined, ``membership_n``,
        ``nonmember_n``) and, with a control block, the same with the control in the members' place
        (``control_losses``, ``control_gap_lo/hi``, ``control_auc``/``_lo``/``_hi``, ``control_membership_auc``/
        ``_lo``/``_hi``, ``control_n``)."""
        out: dict[str, Any] = {"loss_ts": list(loss_ts), "loss_steps": list(self.steps)}
        signal = _comparison(self.train, self.nonmembers)
        renamed = {"losses": "train_losses", "heldout_losses": "test_losses", "gap_lo": "loss_gap_lo",
                   "gap_hi": "loss_gap_hi"}
        out |= {renamed.get(key, key): value for key, value in signal.items()}
        out |= {"membership_n": int(self.train.shape[1]), "nonmember_n": int(self.nonmembers.shape[1]),
                "control_n": int(self.control.shape[1])}
        if self.control.shape[1] >= 2:  # the same keys, "control_" before each, the control in the members' place
            control = _comparison(self.control, self.nonmembers)
            out |= {f"control_{key}": value for key, value in control.items() if key != "heldout_losses"}
        return out


def _comparison(members: torch.Tensor, nonmembers: torch.Tensor) -> dict[str, Any]:
    """One group against the non-members, per level and combined: the mean losses of both groups, the interval of
    the gap, the AUC per level and of the levels combined (the metrics line's key names, without a prefix; the
    train set's gap interval and AUCs are ``loss_gap_lo`` ... ``membership_auc_hi``)."""
    gaps = level_gaps(members, nonmembers)
    aucs, combined = membership_aucs(members.numpy(), nonmembers.numpy())
    return {"losses": [g.train for g in gaps], "heldout_losses": [g.test for g in gaps],
            "gap_lo": [g.gap_lo for g in gaps], "gap_hi": [g.gap_hi for g in gaps],
            "auc": [a.auc for a in aucs], "auc_lo": [a.lo for a in aucs], "auc_hi": [a.hi for a in aucs],
            "membership_auc": combined.auc, "membership_auc_lo": combined.lo, "membership_auc_hi": combined.hi}


def level_reading(model: torch.nn.Module, diffusion: Diffusion, train_x: torch.Tensor, nonmember_x: torch.Tensor,
                  control_x: torch.Tensor | None, steps: Sequence[int], draws: int, seed: int) -> LevelReading:
    """The per-image losses of ``model`` on the members ``train_x`` (N, C, S, S), the non-members ``nonmember_x``
    (n, C, S, S) and the control ``control_x`` (N_c, C, S, S) or None, in centered pixel units on the model's device,
    at the DDPM steps ``steps``, each the mean of ``draws`` noise draws from ``seed``."""
    def losses(x: torch.Tensor | None) -> torch.Tensor:
        if x is None or len(x) == 0:
            return torch.zeros((len(steps), 0), dtype=torch.float64)
        return per_image_losses(model, diffusion, x, steps, draws, seed)
    return LevelReading(tuple(int(s) for s in steps), losses(train_x), losses(nonmember_x), losses(control_x))
