"""diffmem.metrics.memorization against a float64 brute force (torch.cdist) and on planted copies."""
from __future__ import annotations

import math

import pytest
import torch

from diffmem.metrics.memorization import (
    MemorizationError,
    MemorizationResult,
    distance_ratio,
    memorized_fraction,
    nearest_k,
    nearest_two,
)


def _gaussian(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def _brute_force(samples: torch.Tensor, train: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dist = torch.cdist(samples.reshape(len(samples), -1).double(), train.reshape(len(train), -1).double())
    top = dist.sort(dim=1, stable=True)
    return top.values[:, 0], top.values[:, 1], top.indices[:, 0]


@pytest.mark.parametrize("sample_chunk, train_chunk", [(7, 13), (50, 37), (1, 1), (1024, 4096), (3, 2)])
def test_nearest_two_matches_brute_force_for_any_chunking(sample_chunk, train_chunk):
    samples, train = _gaussian(50, 20, seed=1), _gaussian(37, 20, seed=2)
    d1, d2, idx1 = nearest_two(samples, train, sample_chunk=sample_chunk, train_chunk=train_chunk)
    ref_d1, ref_d2, ref_idx1 = _brute_force(samples, train)
    torch.testing.assert_close(d1, ref_d1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d2, ref_d2, rtol=1e-12, atol=1e-12)
    assert torch.equal(idx1, ref_idx1)
    assert d1.dtype == d2.dtype == torch.float64 and idx1.dtype == torch.int64


@pytest.mark.parametrize("sample_chunk,train_chunk", [(1024, 4096), (7, 5), (3, 40)])
def test_nearest_k_matches_brute_force_with_and_without_self(sample_chunk, train_chunk):
    train, held = _gaussian(40, 16, 1), _gaussian(30, 16, 2)
    train[9] = train[7]  # an identical other image counts, at distance 0
    brute = torch.cdist(train.double(), train.double(), compute_mode="donot_use_mm_for_euclid_dist")
    brute.fill_diagonal_(math.inf)
    dist, index = nearest_k(train, train, 5, exclude_self=True, sample_chunk=sample_chunk, train_chunk=train_chunk)
    torch.testing.assert_close(dist, brute.sort(1).values[:, :5], rtol=1e-12, atol=0)
    assert (index != torch.arange(40)[:, None]).all()
    assert dist[7, 0] == 0 and index[7, 0] == 9 and index[9, 0] == 7
    to_held = torch.cdist(held.double(), train.double(), compute_mode="donot_use_mm_for_euclid_dist")
    dist, index = nearest_k(held, train, 3, sample_chunk=sample_chunk, train_chunk=train_chunk)
    torch.testing.assert_close(dist, to_held.sort(1).values[:, :3], rtol=1e-12, atol=0)
    torch.testing.assert_close(to_held.gather(1, index), dist, rtol=1e-12, atol=0)
    with pytest.raises(MemorizationError, match="3 nearest training images asked for, 2 available"):
        nearest_k(train[:3], train[:3], 3, exclude_self=True)
    with pytest.raises(MemorizationError, match="exclude_self needs the train images themselves"):
        nearest_k(held, train, 1, exclude_self=True)


def test_nearest_two_flattens_images_and_matches_explicit_loops():
    samples = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(3)) - 0.5
    train = torch.rand(9, 1, 4, 4, generator=torch.Generator().manual_seed(4)) - 0.5
    d1, d2, idx1 = nearest_two(samples, train, sample_chunk=4, train_chunk=5)
    for i in range(len(samples)):
        dists = sorted((float(((samples[i].double() - train[j].double()) ** 2).sum().sqrt()), j)
                       for j in range(len(train)))
        assert d1[i].item() == pytest.approx(dists[0][0], rel=1e-12)
        assert d2[i].item() == pytest.approx(dists[1][0], rel=1e-12)
        assert idx1[i].item() == dists[0][1]


def test_exact_copy_gives_zero_distance_even_far_from_the_origin():
    # An offset of 100 makes the float32 expansion ||a||^2 + ||b||^2 - 2ab lose all digits of a tiny distance;
    # the exact re-scoring must still give d1 == 0 for copies and the true distance for near-copies.
    train = 100.0 + _gaussian(40, 64, seed=5)
    samples = torch.cat([train[[3, 17]], train[[8]] + 1e-4])
    d1, d2, idx1 = nearest_two(samples, train, train_chunk=16)
    assert d1[0].item() == 0.0 and d1[1].item() == 0.0
    assert idx1.tolist() == [3, 17, 8]
    ref_d1, ref_d2, _ = _brute_force(samples, train)
    assert d1[2].item() == pytest.approx(ref_d1[2].item(), rel=1e-6)
    torch.testing.assert_close(d2, ref_d2, rtol=1e-12, atol=0.0)
    assert distance_ratio(d1, d2)[:2].tolist() == [0.0, 0.0]


def test_two_identical_train_images_give_ratio_one():
    train = _gaussian(30, 32, seed=6)
    train[21] = train[4]
    samples = torch.stack([train[4], train[4] + 0.01 * _gaussian(1, 32, seed=7)[0]])
    d1, d2, idx1 = nearest_two(samples, train, sample_chunk=1, train_chunk=8)
    assert d1[0].item() == 0.0 and d2[0].item() == 0.0
    assert d1[1].item() == d2[1].item() > 0.0
    assert idx1.tolist() == [4, 4]  # the lowest index among exact ties
    assert distance_ratio(d1, d2).tolist() == [1.0, 1.0]
    assert memorized_fraction(samples, train, n_boot=10).fraction == 0.0


def test_planted_copies_with_tiny_noise_are_all_memorized():
    train = _gaussian(200, 256, seed=8)
    samples = train[torch.arange(0, 200, 2)] + 1e-3 * _gaussian(100, 256, seed=9)
    result = memorized_fraction(samples, train, n_boot=200)
    assert result.fraction == 1.0 and result.lo == 1.0 and result.hi == 1.0
    assert torch.equal(result.idx1, torch.arange(0, 200, 2))
    assert bool(result.memorized.all())


def test_fresh_noise_is_never_memorized():
    train = _gaussian(200, 256, seed=10)
    samples = _gaussian(100, 256, seed=11)
    result = memorized_fraction(samples, train, n_boot=200)
    assert result.fraction == 0.0 and result.hi == 0.0
    assert float(result.ratios.min()) > 0.8  # high-dimensional noise: d1 and d2 nearly equal


def _mixture(n: int, n_copies: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    train = _gaussian(300, 128, seed=seed)
    copies = train[:n_copies] + 1e-3 * _gaussian(n_copies, 128, seed=seed + 1)
    fresh = _gaussian(n - n_copies, 128, seed=seed + 2)
    return torch.cat([copies, fresh]), train


def test_thirty_seventy_mixture_gives_point_three_with_a_shrinking_interval():
    small_samples, train = _mixture(100, 30, seed=12)
    small = memorized_fraction(small_samples, train, seed=0)
    big_samples, big_train = _mixture(1000, 300, seed=12)
    big = memorized_fraction(big_samples, big_train, seed=0)
    assert small.fraction == pytest.approx(0.3) and big.fraction == pytest.approx(0.3)
    for result in (small, big):
        assert result.lo <= result.fraction <= result.hi
        assert result.lo < result.fraction < result.hi
    assert (big.hi - big.lo) < 0.5 * (small.hi - small.lo)  # ~1/sqrt(n): 10x samples, ~3x narrower
    # Normal approximation of the binomial: half-width ~ 1.96 sqrt(p(1-p)/n) = 0.028 at n = 1000.
    assert 0.02 < (big.hi - big.lo) / 2 < 0.036


def test_bootstrap_is_deterministic_given_the_seed():
    samples, train = _mixture(200, 60, seed=13)
    first = memorized_fraction(samples, train, n_boot=500, seed=7)
    second = memorized_fraction(samples, train, n_boot=500, seed=7)
    assert (first.lo, first.hi) == (second.lo, second.hi)
    assert torch.equal(first.ratios, second.ratios)
    others = {(r.lo, r.hi) for r in (memorized_fraction(samples, train, n_boot=500, seed=s) for s in range(8))}
    assert len(others) > 1  # the seed does drive the resampling


def test_result_fields_and_to_dict():
    samples, train = _mixture(50, 10, seed=14)
    result = memorized_fraction(samples, train, threshold=0.25, n_boot=100)
    assert isinstance(result, MemorizationResult)
    assert result.n == 50 and result.threshold == 0.25
    assert result.ratios.shape == (50,) and result.idx1.shape == (50,)
    assert result.to_dict() == {"fraction": result.fraction, "lo": result.lo, "hi": result.hi,
                                "threshold": 0.25, "n": 50}
    with pytest.raises(Exception):
        result.fraction = 0.5  # frozen


def test_threshold_is_strict():
    train = _gaussian(20, 16, seed=15)
    samples = _gaussian(30, 16, seed=16)
    ratios = memorized_fraction(samples, train, n_boot=10).ratios
    cut = float(ratios.sort().values[9])  # the tenth-smallest ratio: exactly nine lie strictly below it
    assert memorized_fraction(samples, train, threshold=cut, n_boot=10).fraction == pytest.approx(9 / 30)


def test_bad_inputs_raise_clear_errors():
    train = _gaussian(10, 8, seed=17)
    with pytest.raises(MemorizationError, match="at least 2"):
        nearest_two(train[:3], train[:1])
    with pytest.raises(MemorizationError, match="same shape"):
        nearest_two(_gaussian(3, 9, seed=18), train)
    with pytest.raises(MemorizationError, match="NaN"):
        nearest_two(torch.full((2, 8), float("nan")), train)
    bad_train = train.clone()
    bad_train[6, 3] = float("inf")
    with pytest.raises(MemorizationError, match="NaN or inf"):
        nearest_two(train[:2], bad_train)
    with pytest.raises(MemorizationError, match="threshold"):
        memorized_fraction(train[:2], train, threshold=0.0)
    with pytest.raises(MemorizationError, match="n_boot"):
        memorized_fraction(train[:2], train, n_boot=0)
    with pytest.raises(MemorizationError, match="n >= 1"):
        nearest_two(train[:0], train)
    assert issubclass(MemorizationError, ValueError)


def test_integer_images_are_accepted():
    train = torch.randint(0, 256, (25, 1, 4, 4), generator=torch.Generator().manual_seed(19), dtype=torch.uint8)
    samples = train[[2, 11]].clone()
    d1, _, idx1 = nearest_two(samples, train)
    assert d1.tolist() == [0.0, 0.0] and idx1.tolist() == [2, 11]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_search_matches_cpu():
    samples, train = _gaussian(300, 64, seed=20), _gaussian(500, 64, seed=21)
    cpu = nearest_two(samples, train, sample_chunk=128, train_chunk=100)
    gpu = nearest_two(samples.cuda(), train.cuda(), sample_chunk=128, train_chunk=100)
    assert all(t.device.type == "cuda" for t in gpu)
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], rtol=1e-12, atol=1e-12)
    assert torch.equal(gpu[2].cpu(), cpu[2])
    streamed = nearest_two(samples.cuda(), train, sample_chunk=128, train_chunk=100)  # CPU train streamed to GPU
    assert torch.equal(streamed[2].cpu(), cpu[2])
