"""The blind baseline (diffmem.analysis.blind): the MMD against a brute-force reference, its permutation p-value
and the distance-only AUC on planted exchangeable and shifted sets (their calibration by simulation), and on digits:
the source order's first N images are told from its last 1000, the shuffled split's are not."""
from __future__ import annotations

import numpy as np
import pytest

from diffmem.analysis.blind import blind_baseline, gaussian_kernel, mmd2_of_labels, nearest_distance

pytestmark = pytest.mark.unit


def test_the_mmd_of_labels_equals_the_brute_force_v_statistic():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 3)), rng.normal(size=(5, 3)) + 0.5
    pooled = np.concatenate([x, y])
    kernel = gaussian_kernel(pooled)
    d = np.sqrt(((pooled[:, None] - pooled[None]) ** 2).sum(-1))
    upper = d[np.triu_indices(len(pooled), 1)]
    h2 = np.median(upper[upper > 0] ** 2)
    k = lambda a, b: np.exp(-((a - b) ** 2).sum() / (2 * h2))  # noqa: E731
    brute = (np.mean([k(a, b) for a in x for b in x]) + np.mean([k(a, b) for a in y for b in y])
             - 2 * np.mean([k(a, b) for a in x for b in y]))
    labels = np.array([True] * 7 + [False] * 5)
    assert mmd2_of_labels(kernel, labels) == pytest.approx(brute, rel=1e-10)
    batch = np.stack([labels, labels[::-1]])  # a batch of labelings, one value each
    assert mmd2_of_labels(kernel, batch).shape == (2,)


def test_nearest_distance_is_the_brute_force_minimum():
    rng = np.random.default_rng(1)
    x, ref = rng.normal(size=(9, 4)), rng.normal(size=(13, 4))
    brute = np.sqrt(((x[:, None] - ref[None]) ** 2).sum(-1)).min(1)
    assert np.allclose(nearest_distance(x, ref, chunk=4), brute)


def test_on_exchangeable_sets_the_test_holds_its_level_and_the_interval_covers_one_half():
    """200 draws of members, non-members and reference from one population: p < 0.05 in about 5 % of them and
    DeLong's interval of the distance AUC holds 0.5 in about 95 % (binomial standard error 1.5 %)."""
    rng = np.random.default_rng(2)
    rejected = covered = 0
    draws = 200
    for k in range(draws):
        pool = rng.normal(size=(140, 6))
        b = blind_baseline(pool[:30], pool[30:90], pool[90:], permutations=199, seed=k)
        rejected += b.mmd_p < 0.05
        covered += b.auc_lo <= 0.5 <= b.auc_hi
    assert rejected / draws <= 0.10 and covered / draws >= 0.90


def test_a_train_set_drawn_near_the_reference_is_told_apart():
    """Members and reference from one cluster, non-members from a shifted one (a clustered ordering)."""
    rng = np.random.default_rng(3)
    members, reference = rng.normal(size=(40, 6)), rng.normal(size=(80, 6))
    nonmembers = rng.normal(size=(60, 6)) + 0.8
    b = blind_baseline(members, nonmembers, reference, permutations=199, seed=0)
    assert b.mmd_p < 0.01 and b.auc_lo > 0.5 and (b.m, b.n, b.reference) == (40, 60, 80)


def test_the_digits_source_order_is_told_apart_and_the_shuffled_split_is_not():
    """At N = 128 the kernel test tells the source order's first 128 digits from its last 1000 (p < 0.05); the
    distance-only score does not (its reference, the rest of the training part, is as far from both), which the
    test records rather than hides. The shuffled split's sets are told apart by neither."""
    from diffmem.config import DataConfig
    from diffmem.data import embedded_digits, make_splits

    digits = embedded_digits(8)
    pixels = digits.images.numpy() / 255.0
    for n in (64, 128):  # issue 59: a kernel two-sample test cannot tell the shuffled sets apart at N >= 64
        out = {}
        for order in ("source", "shuffled"):
            s = make_splits(digits, DataConfig(source="digits", image_size=8, n=n, n_heldout=1000, order=order))
            used = set(s.train_indices.tolist()) | set(s.heldout_indices.tolist())
            reference = np.array([i for i in range(len(digits)) if i not in used])
            out[order] = blind_baseline(pixels[s.train_indices], pixels[s.heldout_indices], pixels[reference],
                                        permutations=199, seed=0)
        assert out["source"].mmd_p < 0.05, n
        assert out["shuffled"].mmd_p > 0.05 and out["shuffled"].auc_lo <= 0.5 <= out["shuffled"].auc_hi, n
    assert out["source"].auc_lo <= 0.5 <= out["source"].auc_hi  # N = 128: the distance score does not see it


@pytest.mark.e2e
def test_analyze_writes_the_blind_baseline_of_a_real_run_to_summary_fits_and_report(tmp_path):
    import json

    from diffmem.analysis import analyze
    from diffmem.analysis.report import report_text
    from diffmem.analysis.runfiles import read_csv
    from diffmem.train import train
    from tiny_runs import SMOKE, tiny_config

    for seed in (0, 1):  # two seeds of one cell: one image set, one computation
        cfg = tiny_config("data.n=8", "eval.times=1", "eval.fid=false", "train.num_threads=1", "eval.loss_n_test=12",
                          f"train.seed={seed}", base=SMOKE)
        train(cfg, tmp_path / f"n00008_w04_s{seed}", progress=False)
    analyze(tmp_path)
    rows = read_csv(tmp_path / "summary.csv")
    assert all(0 <= r["blind_mmd_p"] <= 1 and r["blind_auc_lo"] <= r["blind_auc"] <= r["blind_auc_hi"] for r in rows)
    (one_set,) = json.loads((tmp_path / "fits.json").read_text())["blind_baseline"]["sets"]
    assert sorted(one_set["runs"]) == sorted(r["run"] for r in rows) and (one_set["m"], one_set["n"]) == (8, 12)
    assert "## Blind baseline" in report_text(tmp_path)
