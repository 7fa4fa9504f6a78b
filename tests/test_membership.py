"""Memorization without sampling (issue 42): the per-level losses, the membership AUC and its DeLong interval, tau_auc
and the sampling-free monitor, on known answers.

* :func:`delong_auc` against the O(m n) double loop (ties 1/2) and DeLong's structural components, and scikit-learn;
* the coverage of DeLong's 95 % interval on planted Gaussian scores of known AUC, by simulation (the measured table is
  in docs/analysis.md, "The membership AUC"; ``python tests/test_membership.py`` prints it with 4000 draws);
* :func:`per_image_losses` against a loop per image over the same noise stream, :func:`level_gaps` against Welch's
  statistic from scipy;
* planted denoisers: an oracle that fits its training images exactly (AUC 1, gap open at every level) and models that
  treat train and held-out images alike (AUC interval holds 0.5, gap interval holds 0), through the evaluation's
  functions and through :class:`diffmem.monitor.MembershipMonitor`;
* tau_auc on planted AUC curves; a tiny ``diffmem train`` run writes the per-level keys and one copies.jsonl line per
  metrics line, and none of them with ``eval.loss_ts = []``.
"""
from __future__ import annotations

import math
import sys
from typing import NamedTuple

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

from diffmem.analysis.timescales import tau_auc
from diffmem.config import DiffusionConfig, EvalConfig
from diffmem.diffusion import Diffusion
from diffmem.metrics.losses import level_gaps, per_image_losses
from diffmem.metrics.membership import MembershipError, combined_score, delong_auc, membership_aucs
from diffmem.monitor import MembershipMonitor, MonitorError
from diffmem.data import load_images, make_splits, to_model
from diffmem.evaluate import checkpoint_model
from diffmem.rundir import RunDir, image_losses_lines, read_images_file
from diffmem.train import train as train_run
from tiny_runs import SMOKE, tiny_config

Z95 = float(stats.norm.ppf(0.975))
LEVELS = EvalConfig().loss_ts  # the default noise levels (diffusion times) of the evaluation


# --- delong_auc against brute force ------------------------------------------------------------------------------

def brute_force_delong(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(AUC, DeLong's variance) by double loops: psi(x_i, y_j) = 1, 1/2, 0 for x_i >, =, < y_j; V10_i = mean_j psi,
    V01_j = mean_i psi; var = s10^2 / m + s01^2 / n with ddof 1."""
    m, n = len(x), len(y)
    psi = [[1.0 if xi > yj else 0.5 if xi == yj else 0.0 for yj in y] for xi in x]
    auc = sum(map(sum, psi)) / (m * n)
    v10 = [sum(row) / n for row in psi]
    v01 = [sum(psi[i][j] for i in range(m)) / m for j in range(n)]
    s10 = sum((v - auc) ** 2 for v in v10) / (m - 1)
    s01 = sum((v - auc) ** 2 for v in v01) / (n - 1)
    return auc, s10 / m + s01 / n


@pytest.mark.parametrize("m, n, values", [(5, 7, 3), (12, 9, 5), (30, 40, 8), (25, 25, 1000)])
def test_delong_auc_matches_the_double_loop_and_sklearn_with_ties(m, n, values):
    rng = np.random.default_rng(m * n)
    x = rng.integers(0, values, m) + (values > 10) * rng.normal(0.5, 1, m)  # ties when few values
    y = rng.integers(0, values, n).astype(float)
    result = delong_auc(x, y)
    auc, var = brute_force_delong(list(x), list(y))
    assert result.auc == pytest.approx(auc, abs=1e-12) and result.se == pytest.approx(math.sqrt(var), rel=1e-9)
    labels = np.r_[np.ones(m), np.zeros(n)]
    assert result.auc == pytest.approx(roc_auc_score(labels, np.r_[x, y]), abs=1e-12)
    assert result.lo == pytest.approx(max(0.0, auc - Z95 * math.sqrt(var)), abs=1e-12)
    assert result.hi == pytest.approx(min(1.0, auc + Z95 * math.sqrt(var)), abs=1e-12)
    assert (result.m, result.n) == (m, n)


def test_delong_auc_edge_cases():
    separated = delong_auc([3.0, 4.0, 5.0], [0.0, 1.0])
    assert (separated.auc, separated.se, separated.lo, separated.hi) == (1.0, 0.0, 1.0, 1.0)
    assert delong_auc([0.0, 0.0], [0.0, 0.0, 0.0]).auc == 0.5  # all tied
    one = delong_auc([1.0], [0.0, 2.0])
    assert one.auc == 0.5 and math.isnan(one.se) and (one.lo, one.hi) == (0.0, 1.0)
    with pytest.raises(MembershipError, match="members is empty"):
        delong_auc([], [1.0])
    with pytest.raises(MembershipError, match="NaN or infinite"):
        delong_auc([1.0, math.nan], [1.0])


# --- coverage of DeLong's interval on planted scores -------------------------------------------------------------

def delong_coverage(m: int, auc: float, draws: int, seed: int) -> float:
    """Share of ``draws`` planted experiments whose DeLong 95 % interval holds the true AUC: m members ~ N(delta, 1)
    and m others ~ N(0, 1), whose AUC is Phi(delta / sqrt 2)."""
    delta = math.sqrt(2.0) * float(stats.norm.ppf(auc))
    rng = np.random.default_rng(seed)
    members, others = rng.normal(delta, 1.0, (draws, m)), rng.normal(0.0, 1.0, (draws, m))
    return float(np.mean([(r := delong_auc(x, y)).lo <= auc <= r.hi for x, y in zip(members, others)]))


COVERED = [(16, 0.5), (32, 0.5), (32, 0.7), (128, 0.5), (128, 0.7), (128, 0.9)]
"""Settings whose measured coverage (4000 draws, docs/analysis.md) is 0.93 or more: 400 draws then fall in
[0.90, 0.99] (3 binomial standard errors, 0.011 each, around 0.93 .. 0.96)."""
UNDER_COVERED = {(16, 0.7): (0.88, 0.97), (16, 0.9): (0.83, 0.92), (32, 0.9): (0.86, 0.95)}
"""Settings where the normal interval of the AUC under-covers (measured 0.928, 0.880, 0.910 with 4000 draws): small
groups and a high AUC, where the AUC's distribution is skewed against its bound 1. The bands are 3 binomial standard
errors of 400 draws around those values (not tuned to pass at 0.95): a change of the estimator shows."""


@pytest.mark.parametrize("m, auc", COVERED)
def test_delong_interval_covers_a_planted_auc_95_percent_of_the_time(m, auc):
    assert 0.90 <= delong_coverage(m, auc, draws=400, seed=m * 1000 + round(auc * 100)) <= 0.99


@pytest.mark.parametrize("m, auc", sorted(UNDER_COVERED))
def test_delong_interval_under_covers_small_groups_at_a_high_auc_as_documented(m, auc):
    lo, hi = UNDER_COVERED[(m, auc)]
    assert lo <= delong_coverage(m, auc, draws=400, seed=m * 1000 + round(auc * 100)) <= hi


# --- the per-image losses and the level gaps ---------------------------------------------------------------------

class Out(NamedTuple):
    """What diffmem's U-Net returns: the predicted noise as ``.sample``."""

    sample: torch.Tensor


class TinyDenoiser(torch.nn.Module):
    """A 3x3 convolution scaled by the step, with dropout (so eval mode matters)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 1, 3, padding=1)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Out:
        return Out(self.drop(self.conv(x)) * (1 + t.view(-1, 1, 1, 1) / 1000))


@torch.no_grad()
def per_image_reference(model, diffusion: Diffusion, x0: torch.Tensor, steps, draws: int, seed: int,
                        batch_size: int) -> np.ndarray:
    """The DSM loss image by image: per level a generator from ``seed``, per draw and batch one normal draw of the
    batch's shape (the stream per_image_losses consumes), then each image through the model alone."""
    model.eval()
    ab = diffusion.alpha_bar("cpu")
    out = np.zeros((len(steps), len(x0)))
    for level, step in enumerate(steps):
        generator = torch.Generator().manual_seed(seed)
        for _ in range(draws):
            for start in range(0, len(x0), batch_size):
                noise = torch.randn(x0[start:start + batch_size].shape, generator=generator)
                for k, eps in enumerate(noise):
                    x_t = ab[step].sqrt() * x0[start + k] + (1 - ab[step]).sqrt() * eps
                    pred = model(x_t[None], torch.tensor([step])).sample[0]
                    out[level, start + k] += float((pred - eps).pow(2).mean())
    return out / draws


@pytest.mark.parametrize("batch_size", [1024, 3])
def test_per_image_losses_match_a_loop_per_image_over_the_same_noise(batch_size):
    diffusion = Diffusion(DiffusionConfig())
    x0 = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    model = TinyDenoiser().train()
    steps = [diffusion.step_for_time(t) for t in (0.01, 0.4, 1.0)]
    got = per_image_losses(model, diffusion, x0, steps, draws=3, seed=5, batch_size=batch_size)
    assert got.shape == (3, 7) and got.dtype == torch.float64
    assert model.training  # its mode is given back
    np.testing.assert_allclose(got.numpy(), per_image_reference(model, diffusion, x0, steps, 3, 5, batch_size),
                               rtol=1e-5)


def test_level_gaps_are_welch_intervals_of_test_minus_train():
    rng = np.random.default_rng(3)
    train, test = rng.gamma(2.0, 0.1, (3, 20)), rng.gamma(2.0, 0.12, (3, 13))
    gaps = level_gaps(torch.from_numpy(train), torch.from_numpy(test))
    for gap, tr, te in zip(gaps, train, test):
        welch = stats.ttest_ind(te, tr, equal_var=False)  # t = (mean_te - mean_tr) / its standard error
        diff = te.mean() - tr.mean()
        se = diff / welch.statistic
        assert (gap.train, gap.test) == pytest.approx((tr.mean(), te.mean()), rel=1e-12)
        assert (gap.gap_lo, gap.gap_hi) == pytest.approx((diff - Z95 * se, diff + Z95 * se), rel=1e-9)
    single = level_gaps(torch.tensor([[0.5]]), torch.tensor([[0.7, 0.9]]))[0]  # one train image: no variance part
    assert single.gap_hi - single.gap_lo == pytest.approx(2 * Z95 * math.sqrt(0.02 / 2))


# --- planted denoisers -------------------------------------------------------------------------------------------

class Oracle(torch.nn.Module):
    """Knows its training images: returns the exact noise (x_t - sqrt(alpha_bar) x0) / sqrt(1 - alpha_bar) for the
    training image x0 nearest to x_t / sqrt(alpha_bar), so its loss on a training image is 0 at every level."""

    def __init__(self, train: torch.Tensor, diffusion: Diffusion):
        super().__init__()
        self.train_images, self.alpha_bar = train, diffusion.alpha_bar("cpu")

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> Out:
        ab = self.alpha_bar[t].view(-1, 1, 1, 1)
        distance = (x_t[:, None] - ab.sqrt()[:, None] * self.train_images[None]).flatten(2).pow(2).sum(2)
        x0 = self.train_images[distance.argmin(1)]
        return Out((x_t - ab.sqrt() * x0) / (1 - ab).sqrt())


class Zero(torch.nn.Module):
    """Predicts no noise: the loss is the noise's mean square, whatever the image."""

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> Out:
        return Out(torch.zeros_like(x_t))


class Shrink(torch.nn.Module):
    """The linear denoiser sqrt(1 - alpha_bar) x_t (the best one for images ~ N(0, I)): its loss depends on the
    image, but not on whether it was trained on."""

    def __init__(self, diffusion: Diffusion):
        super().__init__()
        self.alpha_bar = diffusion.alpha_bar("cpu")

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> Out:
        return Out((1 - self.alpha_bar[t]).sqrt().view(-1, 1, 1, 1) * x_t)


def planted_images(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """16 training and 16 held-out images (1x16x16, pixels +-1) from one distribution: at the noisiest default level
    (t = 1, alpha_bar = e^-2) 256 pixels let the oracle tell its images apart (at 8x8 it takes the wrong one for
    some noise draws)."""
    x = torch.randint(0, 2, (32, 1, 16, 16), generator=torch.Generator().manual_seed(seed)).float() * 2 - 1
    return x[:16], x[16:]


def loss_levels(model, diffusion: Diffusion, train: torch.Tensor, test: torch.Tensor, seed: int = 0):
    """What Evaluator._loss_levels computes, through the public functions: the gaps and the AUCs at LEVELS."""
    steps = [diffusion.step_for_time(t) for t in LEVELS]
    tr, te = (per_image_losses(model, diffusion, x, steps, draws=5, seed=seed) for x in (train, test))
    return level_gaps(tr, te), *membership_aucs(tr.numpy(), te.numpy()), (tr, te)


def test_an_oracle_of_its_training_images_has_auc_1_and_an_open_gap_at_every_level():
    diffusion = Diffusion(DiffusionConfig())
    train, test = planted_images()
    gaps, aucs, combined, (tr, te) = loss_levels(Oracle(train, diffusion), diffusion, train, test)
    assert float(tr.max()) < 1e-10 < float(te.min())
    assert all(a.auc == 1.0 and a.lo == 1.0 for a in aucs) and combined.auc == 1.0 and combined.m == 16
    assert all(g.gap_lo > 0 and g.train < 1e-10 for g in gaps)
    members, others = combined_score(tr.numpy(), te.numpy())
    assert members.min() > others.max()  # the combined score separates them too


@pytest.mark.parametrize("alike", ["zero", "shrink"])
def test_a_model_that_treats_train_and_heldout_alike_has_auc_05_and_no_gap(alike):
    diffusion = Diffusion(DiffusionConfig())
    train, test = planted_images()
    model = Zero() if alike == "zero" else Shrink(diffusion)
    gaps, aucs, combined, (tr, te) = loss_levels(model, diffusion, train, test)
    if alike == "zero":  # image i of either set gets the same noise (same seed): equal losses
        assert torch.equal(tr, te) and combined.auc == 0.5 and all(a.auc == 0.5 for a in aucs)
    assert all(a.lo <= 0.5 <= a.hi for a in [*aucs, combined])
    assert all(g.gap_lo <= 0.0 <= g.gap_hi for g in gaps)


def test_membership_aucs_uses_every_member_and_every_non_member():
    rng = np.random.default_rng(0)
    tr, te = rng.random((2, 10)), rng.random((2, 6))
    per_level, combined = membership_aucs(tr, te)
    assert combined.m == 10 and combined.n == 6 and all((a.m, a.n) == (10, 6) for a in per_level)
    assert per_level[1] == delong_auc(-tr[1], -te[1])
    assert combined == delong_auc(*combined_score(tr, te))


def test_the_combined_score_is_scaled_by_the_non_members_mean_loss_per_level():
    tr, te = np.array([[1.0, 3.0], [10.0, 30.0]]), np.array([[2.0, 2.0, 2.0], [20.0, 20.0, 20.0]])
    members, others = combined_score(tr, te)
    assert np.allclose(members, [-0.5, -1.5]) and np.allclose(others, [-1.0, -1.0, -1.0])


def test_a_control_with_the_same_non_members_shares_their_scores():
    rng = np.random.default_rng(1)
    others = rng.random((3, 20))
    _, a = combined_score(rng.random((3, 5)), others)
    _, b = combined_score(rng.random((3, 9)), others)
    assert np.array_equal(a, b)


# --- tau_auc on planted AUC curves -------------------------------------------------------------------------------

STEPS = [10, 20, 40, 80, 160, 320]


def test_tau_auc_brackets_the_evaluation_from_which_the_interval_stays_above_half():
    est = tau_auc(STEPS, [0.3, 0.45, 0.48, 0.55, 0.6, 0.7])
    assert (est.value, est.lo, est.hi, est.censored) == (pytest.approx(math.sqrt(40 * 80)), 40.0, 80.0, False)


def test_tau_auc_ignores_an_early_chance_excursion():
    est = tau_auc(STEPS, [0.3, 0.52, 0.4, 0.55, 0.6, 0.7])
    assert (est.lo, est.hi, est.censored) == (40.0, 80.0, False)
    assert tau_auc(STEPS, [0.3, 0.52, None, 0.55, 0.6, 0.7]).lo == 10.0  # a missing value is dropped, not a dip


def test_tau_auc_is_censored_when_never_or_always_above_half():
    never = tau_auc(STEPS, [0.3, 0.4, 0.5, 0.45, 0.51, 0.5])  # 0.5 itself is not above
    assert (never.value, never.lo, never.hi, never.censored) == (320.0, 320.0, None, True)
    always = tau_auc(STEPS, [0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
    assert (always.value, always.lo, always.hi, always.censored) == (10.0, None, 10.0, True)
    assert tau_auc(STEPS, [None] * 6).value is None


# --- the sampling-free monitor -----------------------------------------------------------------------------------

def test_the_membership_monitor_stops_on_an_oracle_at_its_second_update_and_never_on_alike_models():
    diffusion = Diffusion(DiffusionConfig())
    train, test = planted_images()
    monitor = MembershipMonitor(train, test, diffusion, loss_ts=(0.01, 0.4), draws=2)
    first = monitor.update(100, Zero())
    assert (first.auc, first.should_stop, first.stop_step) == (0.5, False, None)
    assert first.lo <= 0.5 <= first.hi and "not above 0.5" in first.reason
    second = monitor.update(200, Oracle(train, diffusion))
    assert (second.auc, second.lo, second.should_stop) == (1.0, 1.0, False)  # above once: not yet established
    third = monitor.update(400, Oracle(train, diffusion))
    assert third.should_stop and third.tau_auc.lo == 100 and third.tau_auc.hi == 200
    assert third.stop_step == pytest.approx(math.sqrt(100 * 200)) and "established" in third.reason
    assert monitor.first_stop_step == 400
    alike = MembershipMonitor(train, test, diffusion, loss_ts=(0.01, 0.4), draws=2)
    assert not any(alike.update(step, Shrink(diffusion)).should_stop for step in (1, 2, 3))


def test_the_membership_monitor_with_a_lag_waits_for_the_predicted_memorization_step():
    diffusion = Diffusion(DiffusionConfig())
    train, test = planted_images()
    monitor = MembershipMonitor(train, test, diffusion, loss_ts=(0.01,), draws=1, lag=4.0)
    oracle = Oracle(train, diffusion)
    monitor.update(100, Zero())
    readings = [monitor.update(step, oracle) for step in (200, 400, 800, 1600)]
    predicted = 4.0 * math.sqrt(100 * 200)  # lag x tau_auc = 565.7 steps
    assert all(r.stop_step == pytest.approx(predicted) for r in readings[1:])
    assert [r.should_stop for r in readings] == [False, False, True, True]
    assert "predicted memorization step" in readings[2].reason


def test_the_membership_monitor_refuses_bad_input():
    diffusion = Diffusion(DiffusionConfig())
    train, test = planted_images()
    with pytest.raises(MonitorError, match="heldout_images"):
        MembershipMonitor(train, test[:1], diffusion)
    with pytest.raises(MonitorError, match="lag"):
        MembershipMonitor(train, test, diffusion, lag=0.0)
    with pytest.raises(MonitorError, match="loss_ts"):
        MembershipMonitor(train, test, diffusion, loss_ts=())
    monitor = MembershipMonitor(train, test, diffusion, loss_ts=(0.01,), draws=1)
    monitor.update(5, Zero())
    with pytest.raises(MonitorError, match="not after"):
        monitor.update(5, Zero())


# --- the recording, end to end -----------------------------------------------------------------------------------

@pytest.mark.e2e
def test_a_tiny_training_run_records_the_levels_and_a_copies_line_per_evaluation(tmp_path):
    level_keys = {"loss_ts", "loss_steps", "train_losses", "test_losses", "loss_gap_lo", "loss_gap_hi",
                  "membership_n", "auc", "auc_lo", "auc_hi", "membership_auc", "membership_auc_lo",
                  "membership_auc_hi", "membership_s", "nonmember_n", "control_n"}
    control_keys = {"control_losses", "control_gap_lo", "control_gap_hi", "control_auc", "control_auc_lo",
                    "control_auc_hi", "control_membership_auc", "control_membership_auc_lo", "control_membership_auc_hi"}
    losses = {}
    for name, extra in (("levels", []), ("off", ["eval.loss_ts=[]"])):
        cfg = tiny_config("data.n=8", "eval.times=2", "eval.fid=false", "train.num_threads=1", *extra, base=SMOKE)
        run = RunDir(tmp_path / name)
        train_run(cfg, run.path, progress=False)
        records, copies = run.metrics(), run.copies()
        losses[name] = [(r["train_loss"], r["test_loss"]) for r in records]
        assert len(records) == 2 and [c["step"] for c in copies] == [r["step"] for r in records]
        assert all(sum(c["nearest_n"]) == r["n_samples"] for c, r in zip(copies, records))
        if name == "off":
            assert all(not level_keys & set(r) for r in records)
            continue
        for r in records:
            assert level_keys <= set(r) and r["loss_ts"] == list(LEVELS)
            assert all(len(r[k]) == len(LEVELS) for k in ("train_losses", "auc", "loss_gap_hi"))
            assert r["membership_n"] == cfg.data.n and r["nonmember_n"] == cfg.eval.loss_n_test  # every image
            assert r["control_n"] == cfg.data.n and control_keys <= set(r)
            for side in ("", "control_"):
                assert 0 <= r[f"{side}membership_auc_lo"] <= r[f"{side}membership_auc"] <= \
                    r[f"{side}membership_auc_hi"] <= 1
            k = r["loss_steps"].index(r["loss_step"])  # eval.loss_t = 0.01 is a level: its loss is that level's
            assert (r["train_loss"], r["test_loss"]) == (r["train_losses"][k], r["test_losses"][k])
        # each image's own losses: the metrics line's level means are their means (float32 storage)
        per_image = dict((line["step"], line) for _, line in image_losses_lines(run.image_losses_path))
        assert sorted(per_image) == [r["step"] for r in records]
        for r in records:
            line = per_image[r["step"]]
            assert line["train"].shape == (len(LEVELS), cfg.data.n) and line["control"].shape == (len(LEVELS), 8)
            assert np.allclose(line["train"].mean(axis=1), r["train_losses"], rtol=1e-5)
            assert np.allclose(line["control"].mean(axis=1), r["control_losses"], rtol=1e-5)
        manifest = read_images_file(run)
        assert len(manifest.train) == 8 and len(manifest.nonmembers) == cfg.eval.loss_n_test
        assert manifest.order == "shuffled" and not set(manifest.train) & set(manifest.heldout)
    assert losses["levels"] == losses["off"]  # taken from the level, the same numbers as measured on their own


@pytest.mark.e2e
def test_the_membership_monitor_reads_exactly_the_evaluations_auc_at_the_same_checkpoint(tmp_path):
    cfg = tiny_config("data.n=8", "eval.times=2", "eval.fid=false", "train.num_threads=1", "eval.loss_n_test=12",
                      base=SMOKE)
    run = RunDir(tmp_path / "run")
    train_run(cfg, run.path, progress=False)
    splits = make_splits(load_images(cfg.data), cfg.data)
    train_x = to_model(splits.train, splits.mean)
    test_x = to_model(splits.heldout[:cfg.eval.loss_n_test], splits.mean)
    diffusion = Diffusion(cfg.diffusion)
    monitor = MembershipMonitor(train_x, test_x, diffusion, loss_ts=cfg.eval.loss_ts,
                                draws=cfg.eval.loss_noise_draws, seed=cfg.eval.seed)
    records = run.metrics()
    for record in records:
        reading = monitor.update(record["step"], checkpoint_model(run, cfg, record["step"], torch.device("cpu")))
        assert (reading.auc, reading.lo, reading.hi) == (record["membership_auc"], record["membership_auc_lo"],
                                                         record["membership_auc_hi"])


def coverage_table(draws: int = 4000) -> str:
    """The markdown table of docs/analysis.md: measured coverage of DeLong's 95 % interval per (m = n, AUC)."""
    lines = ["| m = n | AUC 0.5 | AUC 0.7 | AUC 0.9 |", "|---|---|---|---|"]
    for m in (16, 32, 128):
        cells = [f"{delong_coverage(m, auc, draws, seed=m * 1000 + round(auc * 100) + 1):.3f}"
                 for auc in (0.5, 0.7, 0.9)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(coverage_table(int(sys.argv[1]) if len(sys.argv) > 1 else 4000))
