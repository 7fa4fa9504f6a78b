"""Membership inference from one denoiser pass per image: how well the per-image denoising loss tells training images
from held-out ones, as the area under the ROC curve (AUC) with DeLong's 95 % interval.

The score of an image is minus its loss (a training image the model has fitted has a low loss). The AUC is the
probability that a random training image scores above a random held-out one, ties counted one half (the
Mann-Whitney U statistic divided by m n): 0.5 when the model treats both alike, 1 when it fits every training image
better than any held-out one. Its variance is DeLong, DeLong and Clarke-Pearson's (Biometrics 1988) nonparametric
estimate from the structural components ``V10_i`` (the share of held-out images that training image i beats) and
``V01_j`` (the share of training images that beat held-out image j): ``var = s10^2 / m + s01^2 / n``, computed with
midranks (Sun and Xu 2014) in O((m + n) log(m + n)). The interval is ``auc +/- z se``, clipped to [0, 1]; its
coverage on planted scores is checked by simulation in the tests. scikit-learn's ``roc_auc_score`` gives the same
point value but no interval, hence this module.

:func:`combined_score` merges several noise levels into one score per image: each level's losses are divided by the
non-members' mean loss at that level (so every level weighs alike whatever its scale) and averaged over levels.
:func:`membership_aucs` gives both from per-image losses: each level's AUC and the combined one, the evaluation's and
the sampling-free monitor's reading (``diffmem.monitor.MembershipMonitor``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


class MembershipError(ValueError):
    """Scores that cannot give an AUC; the message says what to pass."""


@dataclass(frozen=True)
class AucResult:
    """The AUC of telling ``m`` members from ``n`` non-members, its DeLong standard error and 95 % interval."""

    auc: float
    se: float
    lo: float
    hi: float
    m: int
    n: int


def _scores(values: np.ndarray | list[float], what: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise MembershipError(f"{what} is empty; pass at least one score per group")
    if not np.isfinite(x).all():
        raise MembershipError(f"{what} holds NaN or infinite scores; check the per-image losses")
    return x


def delong_auc(members: np.ndarray | list[float], others: np.ndarray | list[float], level: float = 0.95) -> AucResult:
    """AUC of ``members`` (m,) against ``others`` (n,) scores (higher = more likely a member), with DeLong's standard
    error and the normal interval at ``level``; with one image in a group the variance is not estimable and the
    interval is [0, 1]."""
    x, y = _scores(members, "members"), _scores(others, "others")
    m, n = x.size, y.size
    ranks = stats.rankdata(np.concatenate([x, y]))  # midranks: ties share their mean rank
    v10 = (ranks[:m] - stats.rankdata(x)) / n  # per member: share of others it beats (ties 1/2)
    v01 = 1.0 - (ranks[m:] - stats.rankdata(y)) / m  # per other: share of members that beat it
    auc = float(v10.mean())
    if m < 2 or n < 2:
        return AucResult(auc, float("nan"), 0.0, 1.0, m, n)
    se = float(np.sqrt(v10.var(ddof=1) / m + v01.var(ddof=1) / n))
    half = float(stats.norm.ppf(0.5 + level / 2)) * se
    return AucResult(auc, se, max(0.0, auc - half), min(1.0, auc + half), m, n)


def combined_score(train_losses: np.ndarray, test_losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores (minus the level-normalised mean loss) of the members (levels, m) and non-members (levels, n): each
    level divided by the non-members' mean loss at that level, then averaged over the levels. The non-members set
    the scale, so a signal and its control (the same non-members against other images) share one scale."""
    tr, te = np.atleast_2d(np.asarray(train_losses, float)), np.atleast_2d(np.asarray(test_losses, float))
    scale = te.mean(axis=1, keepdims=True)
    scale = np.where(scale > 0, scale, 1.0)
    return -(tr / scale).mean(axis=0), -(te / scale).mean(axis=0)


def membership_aucs(train_losses: np.ndarray, test_losses: np.ndarray,
                    level: float = 0.95) -> tuple[list[AucResult], AucResult]:
    """The AUC (with DeLong's interval at ``level``) of each noise level and of the levels combined
    (:func:`combined_score`), from the per-image losses of every member (levels, m) against every non-member
    (levels, n) (the lower loss, the likelier a member). The groups may differ in size: DeLong's variance has a
    term for each."""
    tr, te = np.atleast_2d(np.asarray(train_losses, float)), np.atleast_2d(np.asarray(test_losses, float))
    per_level = [delong_auc(-tr[k], -te[k], level) for k in range(len(tr))]
    return per_level, delong_auc(*combined_score(tr, te), level)
