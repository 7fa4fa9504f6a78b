"""diffmem.metrics.fid: the offline extractor, torch-fidelity's distance against a scipy brute force, the reference
cache, and the choice of extractor without network access."""
from __future__ import annotations

import socket
import warnings

import numpy as np
import pytest
import scipy.linalg
import torch
import torch_fidelity.feature_extractor_inceptionv3 as tf_inception
from sklearn.datasets import load_digits

from diffmem.metrics import fid as fidmod
from diffmem.metrics.fid import (
    INCEPTION_EXTRACTOR,
    INCEPTION_WEIGHTS_FILENAME,
    OFFLINE_EXTRACTOR,
    FIDError,
    FIDResult,
    FIDWeightsError,
    RandConvFeatureExtractor,
    as_rgb_uint8,
    fid,
    make_reference_key,
    metric_label,
    resolve_extractor,
)


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    """sklearn's 1797 handwritten digits as uint8 (n, 1, 16, 16) images (8x8 upsampled by pixel repetition)."""
    images = torch.tensor(load_digits().images)  # values 0..16
    images = (images * (255 / 16)).round().to(torch.uint8)[:, None]
    return images.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)


@pytest.fixture
def no_inception_weights(tmp_path, monkeypatch):
    """An empty torch hub, no $DIFFMEM_FID_WEIGHTS, and every way of downloading made to fail the test."""
    hub = tmp_path / "hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    monkeypatch.delenv(fidmod.WEIGHTS_ENV_VAR, raising=False)

    def no_network(*args, **kwargs):
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    return hub


def _noisy(images: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    noise = sigma * torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
    return (images.to(torch.float32) + noise).clamp(0, 255).round().to(torch.uint8)


def _features(images: torch.Tensor) -> np.ndarray:
    extractor = RandConvFeatureExtractor(OFFLINE_EXTRACTOR, [RandConvFeatureExtractor.FEATURE])
    with torch.no_grad():
        (features,) = extractor(as_rgb_uint8(images).contiguous())
    return features.double().numpy()


def _frechet_brute_force(a: np.ndarray, b: np.ndarray) -> float:
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = scipy.linalg.sqrtm(cov_a @ cov_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * covmean))


def test_offline_extractor_is_deterministic_and_leaves_the_global_rng_alone(digits):
    state = torch.random.get_rng_state()
    first, second = _features(digits[:64]), _features(digits[:64])
    assert torch.equal(torch.random.get_rng_state(), state)
    assert np.array_equal(first, second)
    assert first.shape == (64, 256) and np.isfinite(first).all() and first.std(0).min() > 0
    a = RandConvFeatureExtractor(OFFLINE_EXTRACTOR, ["256"])
    b = RandConvFeatureExtractor(OFFLINE_EXTRACTOR, ["256"])
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))


def test_distance_of_a_set_to_itself_is_zero(digits, tmp_path):
    images = digits[:200]
    result = fid(images, images, "self", tmp_path, extractor=OFFLINE_EXTRACTOR)
    assert abs(result.value) < 1e-6  # float64 eigenvalue round-off; typical values are 0.1 .. 10


def test_distance_grows_with_noise(digits, tmp_path):
    reference = digits[:200]
    values = [fid(_noisy(reference, sigma, seed=1), reference, "digits:200", tmp_path,
                  extractor=OFFLINE_EXTRACTOR).value for sigma in (15, 40, 90)]
    assert 0 < values[0] < values[1] < values[2]


def test_value_matches_a_scipy_brute_force_frechet_distance(digits, tmp_path):
    # More images than feature dims (256), so both covariances are full rank and sqrtm is well conditioned.
    samples, reference = _noisy(digits[:300], 25, seed=2), digits[700:1100]
    result = fid(samples, reference, "digits:700+400", tmp_path, extractor=OFFLINE_EXTRACTOR, batch_size=64)
    expected = _frechet_brute_force(_features(samples), _features(reference))
    assert result.value == pytest.approx(expected, rel=1e-4)
    assert result == FIDResult(result.value, OFFLINE_EXTRACTOR, "digits:700+400", 300, 400)


def test_grayscale_is_repeated_to_three_channels(digits, tmp_path):
    gray = digits[:100]
    rgb = gray.repeat(1, 3, 1, 1)
    reference = digits[500:650]
    a = fid(gray, reference, "digits:500+150", tmp_path, extractor=OFFLINE_EXTRACTOR).value
    b = fid(rgb, reference.repeat(1, 3, 1, 1), "digits:500+150:rgb", tmp_path, extractor=OFFLINE_EXTRACTOR).value
    assert a == pytest.approx(b, rel=1e-9)
    assert as_rgb_uint8(gray).shape == (100, 3, 16, 16)


def test_reference_statistics_are_cached_and_reused(digits, tmp_path, monkeypatch):
    images_seen = []
    original_forward = RandConvFeatureExtractor.forward

    def counting_forward(self, images):
        images_seen.append(images.shape[0])
        return original_forward(self, images)

    monkeypatch.setattr(RandConvFeatureExtractor, "forward", counting_forward)
    reference = digits[1000:1150]
    first = fid(digits[:100], reference, "digits:1000+150@abc", tmp_path, extractor=OFFLINE_EXTRACTOR)
    assert sum(images_seen) == 100 + 150
    cached = sorted(p.name for p in tmp_path.glob("*stat-fid*"))
    assert len(cached) == 1 and OFFLINE_EXTRACTOR in cached[0]

    images_seen.clear()
    second = fid(digits[:100], reference, "digits:1000+150@abc", tmp_path, extractor=OFFLINE_EXTRACTOR)
    assert sum(images_seen) == 100  # only the samples; the reference statistics came from the file
    assert second.value == first.value

    images_seen.clear()
    fid(digits[:100], reference, "another-key", tmp_path, extractor=OFFLINE_EXTRACTOR)
    assert sum(images_seen) == 100 + 150  # a different key is a different cache entry


def test_inception_without_weights_raises_and_never_downloads(digits, tmp_path, no_inception_weights):
    with pytest.raises(FIDWeightsError, match=INCEPTION_WEIGHTS_FILENAME) as info:
        fid(digits[:10], digits[10:20], "k", tmp_path, extractor="inception")
    message = str(info.value)
    assert "\n" not in message and "--fid-weights" in message and fidmod.WEIGHTS_ENV_VAR in message
    assert str(no_inception_weights / "checkpoints") in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(FIDWeightsError, match="does not exist"):
        resolve_extractor("inception", weights=tmp_path / "missing.pth")


def test_auto_without_weights_falls_back_with_one_warning(digits, tmp_path, no_inception_weights):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fid(digits[:80], digits[100:180], "digits:100+80", tmp_path, extractor="auto")
    messages = [str(w.message) for w in caught if INCEPTION_WEIGHTS_FILENAME in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert result.extractor == OFFLINE_EXTRACTOR
    assert result.label == f"FD ({OFFLINE_EXTRACTOR})"


def test_weights_on_disk_select_inception(tmp_path, monkeypatch, no_inception_weights):
    # Resolution only: the file is found, so "auto" picks Inception (the network model itself is not run here).
    local = tmp_path / INCEPTION_WEIGHTS_FILENAME
    local.write_bytes(b"placeholder, never loaded by this test")
    assert resolve_extractor("auto", weights=local) == (INCEPTION_EXTRACTOR, local)
    monkeypatch.setenv(fidmod.WEIGHTS_ENV_VAR, str(local))
    assert resolve_extractor("inception") == (INCEPTION_EXTRACTOR, local)
    monkeypatch.delenv(fidmod.WEIGHTS_ENV_VAR)
    hub_file = no_inception_weights / "checkpoints" / INCEPTION_WEIGHTS_FILENAME
    hub_file.parent.mkdir(parents=True)
    hub_file.write_bytes(b"placeholder")
    assert resolve_extractor("auto") == (INCEPTION_EXTRACTOR, hub_file)


def test_metric_label_only_calls_inception_fid():
    assert metric_label("inception") == "FID"
    assert metric_label(INCEPTION_EXTRACTOR) == "FID"
    assert metric_label(OFFLINE_EXTRACTOR) == "FD (diffmem-randconv-v1)"


def test_reference_key_format():
    sha = "0123456789abcdef" * 4
    assert make_reference_key(sha, 10000) == "heldout:10000@0123456789ab"
    assert make_reference_key(sha, 10000, start=20000) == "heldout:20000+10000@0123456789ab"
    with pytest.raises(FIDError, match="sha256"):
        make_reference_key("not-a-digest", 10)


def test_bad_inputs_raise_clear_errors(digits, tmp_path):
    with pytest.raises(FIDError, match="uint8"):
        fid(digits[:10].float(), digits[:10], "k", tmp_path, extractor=OFFLINE_EXTRACTOR)
    with pytest.raises(FIDError, match="at least 2"):
        fid(digits[:1], digits[:10], "k", tmp_path, extractor=OFFLINE_EXTRACTOR)
    with pytest.raises(FIDError, match="same size"):
        fid(digits[:10, :, :8, :8], digits[:10], "k", tmp_path, extractor=OFFLINE_EXTRACTOR)
    with pytest.raises(FIDError, match="unknown"):
        fid(digits[:10], digits[:10], "k", tmp_path, extractor="vgg")
    with pytest.raises(FIDError, match="reference_key"):
        fid(digits[:10], digits[:10], "", tmp_path, extractor=OFFLINE_EXTRACTOR)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_matches_cpu(digits, tmp_path):
    samples, reference = _noisy(digits[:300], 25, seed=3), digits[700:1100]
    cpu = fid(samples, reference, "gpu-check", tmp_path / "cpu", extractor=OFFLINE_EXTRACTOR, device="cpu")
    gpu = fid(samples, reference, "gpu-check", tmp_path / "gpu", extractor=OFFLINE_EXTRACTOR, device="cuda")
    assert gpu.value == pytest.approx(cpu.value, rel=1e-3)
