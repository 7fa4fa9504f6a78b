"""Frechet distance between generated and held-out images, computed by torch-fidelity.

Everything numeric goes through torch-fidelity's own FID path (its feature extraction
``extract_featuresdict_from_input_id``, features -> statistics ``fid_features_to_statistics``, statistics -> metric
``fid_statistics_to_metric``); this module picks and builds the feature extractor, wraps the image tensors, computes
the samples' features once for several reference sets and for a bootstrap over the samples (``fid_sets``), keeps the
reference statistics in its own data-only cache and names the result. Nothing here lets torch-fidelity unpickle a
file: its own caches (``torch.load(weights_only=False)``) are off, and the Inception weights are read by
:func:`load_inception_weights` with ``torch.load(weights_only=True)`` before torch-fidelity sees them.

Images are uint8 tensors (n, C, H, W) with C = 1 or 3 and pixels in 0..255. Grayscale images (C = 1) are repeated
to 3 identical uint8 channels before feature extraction, since both extractors take RGB; the Inception extractor
resizes them to 299 x 299 itself (bilinear, like TensorFlow 1.x), the offline extractor to 32 x 32.

Extractors:
- ``"inception-v3-compat"`` (asked for as ``"inception"``): torch-fidelity's port of the TF Inception-v3 used by
  the original FID. Its weights file (``INCEPTION_WEIGHTS_FILENAME``) is read from, in order, the ``weights``
  argument (``--fid-weights PATH``), ``$DIFFMEM_FID_WEIGHTS``, or ``torch.hub.get_dir()/checkpoints/``, the place
  torch-fidelity's own downloader would have put it; nothing reaches for the network. The file is read as a state
  dict of tensors only (:func:`load_inception_weights`; a missing file, or one that holds anything else, raises
  ``FIDWeightsError``) and torch-fidelity builds its extractor from those tensors. Only numbers from this extractor
  are called "FID".
- ``"diffmem-randconv-v1"`` (``OFFLINE_EXTRACTOR``): a fixed-seed random convolutional network shipped in this
  module (no file, no download), registered with torch-fidelity. Its numbers are a Frechet distance in its own
  feature space: comparable with each other, not with published FIDs; label them ``metric_label(extractor)``,
  i.e. "FD (diffmem-randconv-v1)".
- ``"diffmem-pixels"`` (``PIXEL_EXTRACTOR``): the grayscale pixels themselves (H * W features in [0, 1]); for small
  images such as the 8x8 digits, where it is a well-conditioned distance between Gaussian fits of the two sets.
- ``"auto"``: Inception when its weights are on disk, otherwise the offline extractor and a one-line warning.

Reference statistics (mean and covariance of the held-out images' features) are computed once per reference set,
extractor and device kind (cpu / cuda: the features differ in the last bits) and cached in ``cache_dir`` as one
``.npz`` file (``mu``, ``sigma`` and the entry's identity, read with ``allow_pickle=False``) under a name built from
``reference_key`` (the caller's identity of the held-out set, e.g. ``make_reference_key(dataset_sha256, 10000)`` =
"heldout:10000@<sha256[:12]>"), the image size, the device kind and the extractor; later calls read the file and never
run the extractor on the reference images. A cache file that cannot be read, or holds other arrays or another entry,
is named in a warning and computed again (it is only a cache); torch-fidelity's pickled cache files of earlier diffmem
versions (``*-stat-fid-*.pt``) are never read: the statistics are computed again, with a warning.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torch_fidelity
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3
from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import (create_feature_extractor, extract_featuresdict_from_input_id,
                                  resolve_feature_layer_for_metric)

from diffmem.config import FID_EXTRACTORS
from diffmem.io import atomic_write_bytes
from diffmem.metrics.extractor_names import INCEPTION_EXTRACTOR, OFFLINE_EXTRACTOR, PIXEL_EXTRACTOR, metric_label

INCEPTION_WEIGHTS_URL = URL_INCEPTION_V3
INCEPTION_WEIGHTS_FILENAME = os.path.basename(URL_INCEPTION_V3)  # weights-inception-2015-12-05-6726825d.pth
WEIGHTS_ENV_VAR = "DIFFMEM_FID_WEIGHTS"
EXTRACTOR_CHOICES = FID_EXTRACTORS  # "auto", "inception" and the three names of extractor_names


class FIDError(ValueError):
    """Bad input to the FID computation; the message is one line that says what to do."""


class FIDWeightsError(FIDError):
    """The Inception weights file is not on disk (and nothing will download it)."""


@dataclass(frozen=True)
class FIDResult:
    """One Frechet distance and what produced it.

    value: the distance (squared feature units; lower is better).
    extractor: resolved extractor name, "inception-v3-compat" or "diffmem-randconv-v1".
    reference: the reference set's key, e.g. "heldout:10000@0123456789ab".
    n_samples, n_reference: images in the two sets.
    """

    value: float
    extractor: str
    reference: str
    n_samples: int
    n_reference: int
    boot: tuple[float, ...] = ()  # the distance for each bootstrap resample of the samples (empty: no bootstrap)

    @property
    def label(self) -> str:
        """"FID" for Inception features, "FD (<extractor>)" otherwise."""
        return metric_label(self.extractor)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_reference_key(dataset_sha256: str, n_reference: int, start: int = 0, order: str = "") -> str:
    """Identity of a held-out reference set: "heldout:<n>@<sha256[:12]>", or "heldout:<start>+<n>@..." if start > 0,
    followed by "/<order>" when the split permuted the source (``Splits.order_tag``, e.g. "shuffled0").

    ``start`` is the set's position in the split's order (disjoint reference sets have different starts).
    """
    if not re.fullmatch(r"[0-9a-fA-F]{12,}", dataset_sha256 or ""):
        raise FIDError(f"dataset_sha256 = {dataset_sha256!r} is not a hex digest; pass the sha256 from the dataset "
                       "manifest")
    if n_reference < 2 or start < 0:
        raise FIDError(f"reference set of {n_reference} images from {start}: need n_reference >= 2 and start >= 0")
    if order and not re.fullmatch(r"[a-z]+[0-9]+", order):
        raise FIDError(f"order = {order!r} is not an order tag such as 'shuffled0'; pass Splits.order_tag")
    where = f"{start}+{n_reference}" if start else f"{n_reference}"
    return f"heldout:{where}@{dataset_sha256[:12].lower()}" + (f"/{order}" if order else "")


# --- the offline extractor ------------------------------------------------------------------------------------------

class _OfflineExtractor(FeatureExtractorBase):
    """What the offline extractors share: one feature layer ``FEATURE`` for fid / kid / prc, no compilation, and
    uint8 (B, 3, H, W) input (``DUMMY_SIZE`` px for torch-fidelity's compile probe). Subclasses set ``NAME`` (the
    registry name), ``FEATURE`` and ``features(images)``."""

    NAME = ""
    FEATURE = ""
    DUMMY_SIZE = 8

    def __init__(self, name: str, features_list: list[str], **kwargs: Any) -> None:
        # kwargs: torch-fidelity passes all its options to every extractor; none of them apply here.
        super().__init__(name, features_list)

    @classmethod
    def get_provided_features_list(cls) -> tuple[str, ...]:
        return (cls.FEATURE,)

    @classmethod
    def get_default_feature_layer_for_metric(cls, metric: str) -> str:
        if metric not in ("fid", "kid", "prc"):
            raise FIDError(f"{cls.NAME} has no class logits; it supports fid, kid and prc, not {metric}")
        return cls.FEATURE

    @staticmethod
    def can_be_compiled() -> bool:
        return False

    @classmethod
    def get_dummy_input_for_compile(cls) -> torch.Tensor:
        return torch.zeros(1, 3, cls.DUMMY_SIZE, cls.DUMMY_SIZE, dtype=torch.uint8)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> float32 (B, features)."""
        raise NotImplementedError

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.dim() == 4
                and images.shape[1] == 3):
            raise FIDError(f"{self.NAME} expects uint8 images (B, 3, H, W), got "
                           f"{getattr(images, 'dtype', type(images))} {tuple(getattr(images, 'shape', ()))}")
        features = self.features(images)
        return tuple(features for _ in self.features_list)


class RandConvFeatureExtractor(_OfflineExtractor):
    """A fixed random conv net: uint8 (B, 3, H, W) -> (B, 256) float32 features; torch-fidelity extractor.

    Pixels are mapped to [-1, 1] and resized to 32 x 32 (bilinear, antialiased). Three 3x3 convolutions
    (3 -> 32 -> 64 -> 64 channels, no bias, zero padding), each followed by the absolute value and 2x2 average
    pooling (32 -> 16 -> 8 -> 4 px), then 2x2 adaptive average pooling: 64 channels x 2 x 2 = 256 features that keep
    coarse spatial layout. The absolute value (rather than ReLU) leaves no dead features on dark-background images
    and, on sklearn's digits, made the distance most sensitive to noise, blur and brightness changes relative to
    the sampling noise between two disjoint halves.
    Weights are He-normal (std sqrt(2 / fan_in)), drawn on the CPU from a private ``torch.Generator`` seeded with
    ``SEED`` (the global RNG is untouched), so every build on every machine with the same torch version has the
    same weights. About 8 M multiply-adds per image.
    """

    NAME = OFFLINE_EXTRACTOR
    SEED = 20250523
    INPUT_SIZE = 32
    DUMMY_SIZE = INPUT_SIZE
    CHANNELS = (3, 32, 64, 64)
    FEATURE = "256"

    def __init__(self, name: str, features_list: list[str], **kwargs: Any) -> None:
        super().__init__(name, features_list)
        generator = torch.Generator(device="cpu").manual_seed(self.SEED)
        for layer, (c_in, c_out) in enumerate(zip(self.CHANNELS[:-1], self.CHANNELS[1:])):
            fan_in = c_in * 3 * 3
            weight = torch.randn(c_out, c_in, 3, 3, generator=generator, dtype=torch.float32) * (2.0 / fan_in) ** 0.5
            self.register_buffer(f"conv{layer}", weight)
        self.requires_grad_(False)
        self.eval()

    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32) / 127.5 - 1.0
        if x.shape[-2:] != (self.INPUT_SIZE, self.INPUT_SIZE):
            x = F.interpolate(x, size=(self.INPUT_SIZE, self.INPUT_SIZE), mode="bilinear", align_corners=False,
                              antialias=True)
        for layer in range(len(self.CHANNELS) - 1):
            x = F.avg_pool2d(F.conv2d(x, getattr(self, f"conv{layer}"), padding=1).abs(), 2)
        return F.adaptive_avg_pool2d(x, 2).flatten(1)


class PixelFeatureExtractor(_OfflineExtractor):
    """The pixels themselves as features: uint8 (B, 3, H, W) -> (B, H * W) float32, the channel mean in [0, 1].

    For small images (e.g. scikit-learn's 8x8 digits, 64 features) the Frechet distance of pixels is the 2-Wasserstein
    distance between Gaussian fits of the two image distributions, well conditioned with a thousand images, cheap,
    and defined without any trained network. Not comparable across image sizes.
    """

    NAME = PIXEL_EXTRACTOR
    FEATURE = "pixels"

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(torch.float32).mean(1).flatten(1) / 255.0


def _register_offline_extractor() -> None:
    """Make the offline extractors known to torch-fidelity (idempotent: torch-fidelity refuses duplicate names)."""
    for name, cls in ((OFFLINE_EXTRACTOR, RandConvFeatureExtractor), (PIXEL_EXTRACTOR, PixelFeatureExtractor)):
        if name not in FEATURE_EXTRACTORS_REGISTRY:
            torch_fidelity.register_feature_extractor(name, cls)


_register_offline_extractor()


# --- extractor choice and Inception weights -------------------------------------------------------------------------

def hub_weights_path() -> Path:
    """Where torch-fidelity's downloader keeps the Inception weights: torch.hub.get_dir()/checkpoints/<file>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_WEIGHTS_FILENAME


def _missing_weights_message() -> str:
    return (f"Inception weights not found: put {INCEPTION_WEIGHTS_FILENAME} (from {INCEPTION_WEIGHTS_URL}) at "
            f"{hub_weights_path()}, or pass --fid-weights PATH / set {WEIGHTS_ENV_VAR}=PATH, or use "
            f"--set eval.fid_extractor={OFFLINE_EXTRACTOR} for the offline extractor")


def find_inception_weights(weights: str | os.PathLike | None = None) -> Path | None:
    """The Inception weights file to use, or None when there is none on disk (nothing is downloaded).

    Order: ``weights`` (a local file, e.g. from ``--fid-weights``), ``$DIFFMEM_FID_WEIGHTS``, the torch hub cache.
    A path that is given explicitly but does not exist raises FIDWeightsError.
    """
    given_paths = ((weights, "--fid-weights / eval.fid_weights"), (os.environ.get(WEIGHTS_ENV_VAR), WEIGHTS_ENV_VAR))
    for given, source in given_paths:
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise FIDWeightsError(f"Inception weights file {path} (from {source}) does not exist; point it at "
                                      f"{INCEPTION_WEIGHTS_FILENAME} (from {INCEPTION_WEIGHTS_URL})")
            return path
    hub = hub_weights_path()
    return hub if hub.is_file() else None


def resolve_extractor(extractor: str = "auto", weights: str | os.PathLike | None = None) -> tuple[str, Path | None]:
    """(torch-fidelity extractor name, Inception weights path or None) for an ``eval.fid_extractor`` value.

    "inception" without weights raises FIDWeightsError; "auto" without weights warns once per call site and returns
    the offline extractor.
    """
    if extractor in ("inception", INCEPTION_EXTRACTOR):
        path = find_inception_weights(weights)
        if path is None:
            raise FIDWeightsError(_missing_weights_message())
        return INCEPTION_EXTRACTOR, path
    if extractor == "auto":
        path = find_inception_weights(weights)
        if path is not None:
            return INCEPTION_EXTRACTOR, path
        warnings.warn(f"Inception weights {INCEPTION_WEIGHTS_FILENAME} not found in {hub_weights_path().parent} "
                      f"(nor --fid-weights / {WEIGHTS_ENV_VAR}); reporting FD ({OFFLINE_EXTRACTOR}) instead of FID",
                      stacklevel=2)
        return OFFLINE_EXTRACTOR, None
    if extractor in (OFFLINE_EXTRACTOR, PIXEL_EXTRACTOR):
        return extractor, None
    raise FIDError(f"fid extractor '{extractor}' is unknown; choose one of: {', '.join(EXTRACTOR_CHOICES)}")


def _first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), at most 200 characters."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def load_inception_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The Inception weights file ``path`` as a state dict (parameter name -> tensor on the CPU), read with
    ``torch.load(weights_only=True)``: a file that holds anything but tensors, numbers, strings and containers (a
    pickle that would call a function), or cannot be read at all, raises a one-line FIDWeightsError naming it.
    Nothing else in diffmem or torch-fidelity opens the file."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pickle protocol")  # torch's note on a non-torch pickle
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's restricted unpickler names the callable or class a pickle asked for ("GLOBAL builtins.open ...")
        what = "holds objects other than tensors (loading it could run code)" if "GLOBAL" in str(e) else \
            "is not a torch file of plain tensors (damaged, or a pickle of something else)"
        raise FIDWeightsError(f"Inception weights file {path} {what}; it was not loaded: use "
                              f"{INCEPTION_WEIGHTS_FILENAME} from {INCEPTION_WEIGHTS_URL}") from None
    except Exception as e:  # a truncated zip, a folder ...
        reason = _first_line(e).split(". ")[0]
        raise FIDWeightsError(f"Inception weights file {path} cannot be read ({type(e).__name__}: {reason}); use "
                              f"{INCEPTION_WEIGHTS_FILENAME} from {INCEPTION_WEIGHTS_URL}") from None
    if not (isinstance(state, dict) and state
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise FIDWeightsError(f"Inception weights file {path} is not a state dict of tensors; use "
                              f"{INCEPTION_WEIGHTS_FILENAME} from {INCEPTION_WEIGHTS_URL}")
    return state


def check_extractor(extractor: str = "auto", weights: str | os.PathLike | None = None) -> str:
    """:func:`resolve_extractor`, and for Inception its weights read as :func:`load_inception_weights` does: what a
    command calls before it writes anything, so that a missing or unreadable weights file stops it at once. Returns
    the torch-fidelity extractor name."""
    name, path = resolve_extractor(extractor, weights)
    if path is not None:
        load_inception_weights(path)
    return name


def build_extractor(name: str, layer: str, weights_path: str | os.PathLike | None = None,
                    options: dict[str, Any] | None = None) -> FeatureExtractorBase:
    """torch-fidelity's extractor ``name`` (a resolved name, see :func:`resolve_extractor`) for feature ``layer``,
    with torch-fidelity's ``options`` (``cuda``, ``verbose``, ...); Inception with the tensors of ``weights_path``
    (:func:`load_inception_weights`), handed over as bytes that diffmem wrote from them, so torch-fidelity's own
    ``torch.load`` never reads the user's file."""
    options = options or {}
    if weights_path is None:
        return create_feature_extractor(name, [layer], **options)
    state = load_inception_weights(weights_path)
    buffer = io.BytesIO()
    torch.save(state, buffer)  # only tensors: what torch-fidelity unpickles from it cannot call anything
    buffer.seek(0)
    try:
        return create_feature_extractor(name, [layer], **(options | {"feature_extractor_weights_path": buffer}))
    except RuntimeError as e:  # load_state_dict: missing or unexpected keys, other shapes
        reason = _first_line(e)
        raise FIDWeightsError(f"Inception weights file {weights_path} does not hold torch-fidelity's Inception-v3 "
                              f"weights ({reason}); use {INCEPTION_WEIGHTS_FILENAME} from {INCEPTION_WEIGHTS_URL}") \
            from None


# --- the reference-statistics cache ---------------------------------------------------------------------------------

def _cache_name(key: str, n_reference: int, height: int, width: int, device_kind: str | None) -> str:
    """File-name-safe cache entry for a reference set whose features were computed on ``device_kind``; None: the
    name torch-fidelity's pickled cache files of the entry had before diffmem kept its own cache."""
    safe = re.sub(r"[^A-Za-z0-9._+-]+", "_", key).strip("_")[:80]
    identity = f"{key}|{n_reference}|{height}x{width}" + (f"|{device_kind}" if device_kind else "")
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    return f"diffmem-{safe}-n{n_reference}-{height}x{width}-" + (f"{device_kind}-" if device_kind else "") + digest


@dataclass(frozen=True)
class _CacheEntry:
    """One reference set's statistics in ``cache_dir``: ``path`` (.npz) and ``identity``, the string stored in the
    file and compared on reading (reference key, size, extractor, layer, device kind)."""

    path: Path
    identity: str
    pickled: tuple[Path, ...]  # torch-fidelity's pickle files of the same entry (never read)

    @classmethod
    def of(cls, cache_dir: Path, key: str, n_reference: int, height: int, width: int, extractor: str, layer: str,
           device_kind: str) -> "_CacheEntry":
        stem = f"{_cache_name(key, n_reference, height, width, device_kind)}-{extractor}-stat-fid-{layer}"
        old = f"{_cache_name(key, n_reference, height, width, None)}-{extractor}"
        return cls(cache_dir / f"{stem}.npz",
                   f"{key}|n={n_reference}|{height}x{width}|{extractor}|{layer}|{device_kind}",
                   (cache_dir / f"{old}-stat-fid-{layer}.pt", cache_dir / f"{old}-features-{layer}.pt"))

    def read(self) -> dict[str, np.ndarray] | None:
        """The cached {"mu", "sigma"}, or None (with a one-line warning naming the file when it exists but is
        damaged or of another entry, or when only torch-fidelity's pickled files of the entry exist)."""
        if not self.path.exists() and not self.path.is_symlink():
            old = [p for p in self.pickled if p.exists()]
            if old:
                warnings.warn(f"FD reference-statistics cache {old[0]} is a pickle of an earlier diffmem version and "
                              f"is not read (a pickle could run code); computing it again into {self.path.name} (it is "
                              "only a cache; delete the old .pt files)", stacklevel=3)
            return None
        try:
            if not self.path.is_file():  # a folder or a pipe in its place: never opened
                raise FIDError("not a regular file")
            with open(self.path, "rb") as f, np.load(f, allow_pickle=False) as stored:
                arrays = {k: stored[k] for k in ("mu", "sigma", "identity")}
            mu, sigma, identity = arrays["mu"], arrays["sigma"], str(arrays["identity"])
            problem = None
            if identity != self.identity:
                problem = f"it holds the statistics of {identity!r}"
            elif mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]) or mu.dtype.kind != "f" \
                    or sigma.dtype.kind != "f":
                problem = f"mu {mu.shape} and sigma {sigma.shape} are not a mean and its covariance"
            elif not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
                problem = "it holds values that are not finite"
        except Exception as e:  # cut short, not a zip, a missing array, an object array (a pickle) ...
            problem = _first_line(e)
        if problem is not None:
            warnings.warn(f"FD reference-statistics cache {self.path} is damaged ({problem}); computing it again "
                          "(it is only a cache)", stacklevel=3)
            return None
        return {"mu": mu, "sigma": sigma}

    def write(self, statistics: dict[str, np.ndarray]) -> None:
        """Store ``statistics`` ({"mu", "sigma"}) atomically, as plain arrays."""
        buffer = io.BytesIO()
        np.savez(buffer, mu=statistics["mu"], sigma=statistics["sigma"], identity=np.array(self.identity))
        atomic_write_bytes(self.path, buffer.getvalue())


# --- the distance ---------------------------------------------------------------------------------------------------

class _ImageTensorDataset(torch.utils.data.Dataset):
    """A uint8 (n, 3, H, W) tensor as the Dataset of single images that torch-fidelity iterates over."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


def as_rgb_uint8(images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """uint8 (n, 1 | 3, H, W) on the CPU -> (n, 3, H, W); a grayscale channel is repeated three times (a view)."""
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4 \
            or images.shape[1] not in (1, 3):
        raise FIDError(f"{what} must be a uint8 tensor (n, 1 or 3, H, W) of pixels 0..255, got "
                       f"{getattr(images, 'dtype', type(images).__name__)} {tuple(getattr(images, 'shape', ()))}")
    if images.shape[0] < 2:
        raise FIDError(f"{what} has {images.shape[0]} image(s); a covariance needs at least 2 (use thousands)")
    images = images.cpu()
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FIDError(f"device = {device!r} is not a torch device; use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise FIDError(f"device = {device!r}: FID runs on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FIDError(f"device = {device!r} but no CUDA GPU is available; use device='cpu'")
    return dev


def fid_sets(
    samples: torch.Tensor,
    references: list[torch.Tensor],
    reference_keys: list[str],
    cache_dir: str | os.PathLike,
    extractor: str = "auto",
    weights: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 200,
    n_boot: int = 0,
    seed: int = 0,
) -> list[FIDResult]:
    """Frechet distances between the features of ``samples`` and of each reference set (torch-fidelity).

    The samples' features are extracted once (torch-fidelity's ``extract_featuresdict_from_input_id``) and turned
    into statistics by ``fid_features_to_statistics``, for the samples and for each bootstrap resample; each
    reference set's statistics come from torch-fidelity's cache or are computed and cached
    (``fid_input_id_to_statistics_cached``); each distance is torch-fidelity's ``fid_statistics_to_metric``. So K
    reference sets cost one feature pass over the samples, not K.

    Args:
        samples: uint8 (n, 1 | 3, S, S) generated images, n >= 2.
        references: uint8 (m_k, 1 | 3, S, S) held-out images per set, m_k >= 2. Only read when not cached.
        reference_keys: identity of each reference set (see ``make_reference_key()``); with the extractor name it
            keys the cached statistics, so a different set must get a different key.
        cache_dir: folder of the cached reference statistics (created if missing).
        extractor: "auto" | "inception" | "inception-v3-compat" | "diffmem-randconv-v1".
        weights: local Inception weights file (else $DIFFMEM_FID_WEIGHTS, else torch's hub cache).
        device: "cpu" or "cuda[:i]" for the feature extractor.
        batch_size: images per forward pass of the extractor.
        n_boot: bootstrap resamples of the samples (drawn with replacement from the same features; seeded by
            ``seed``); each result's ``boot`` holds its distance for every resample, whose spread is the sampling
            noise of the distance. Each resample costs one statistics + matrix square root per set.
    """
    name, weights_path = resolve_extractor(extractor, weights)
    if not isinstance(n_boot, int) or n_boot < 0:
        raise FIDError(f"n_boot = {n_boot!r} must be an integer >= 0")
    if not references or len(references) != len(reference_keys):
        raise FIDError(f"got {len(references)} reference sets and {len(reference_keys)} keys; pass one key per set")
    for key in reference_keys:
        if not isinstance(key, str) or not key.strip() or "\n" in key:
            raise FIDError(f"reference_key = {key!r} must be a one-line string naming the reference set, "
                           "e.g. make_reference_key(dataset_sha256, 10000)")
    if len(set(reference_keys)) != len(reference_keys):
        raise FIDError(f"reference keys {reference_keys} repeat; each reference set needs its own key")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise FIDError(f"batch_size = {batch_size!r} must be an integer >= 1")
    samples_rgb = as_rgb_uint8(samples, "samples")
    references_rgb = [as_rgb_uint8(r, "reference") for r in references]
    for ref in references_rgb:
        if samples_rgb.shape[-2:] != ref.shape[-2:]:
            raise FIDError(f"samples are {tuple(samples_rgb.shape[-2:])} pixels but the reference images "
                           f"{tuple(ref.shape[-2:])}; compare images of the same size")
    dev = _check_device(device)
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)

    options: dict[str, Any] = dict(
        input1=_ImageTensorDataset(samples_rgb),
        cache=False,  # torch-fidelity's file caches unpickle without restriction: diffmem keeps its own (.npz)
        fid=True,
        feature_extractor=name,
        cuda=dev.type == "cuda",
        batch_size=batch_size,
        save_cpu_ram=True,  # no DataLoader worker processes
        verbose=False,
    )
    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        layer = resolve_feature_layer_for_metric("fid", **options)
        extractor_module = build_extractor(name, layer, weights_path, options)
        features = extract_featuresdict_from_input_id(1, extractor_module, **options)[layer]
        stat_samples = fid_features_to_statistics(features)
        generator = torch.Generator().manual_seed(seed)
        resamples = [torch.randint(0, features.shape[0], (features.shape[0],), generator=generator)
                     for _ in range(n_boot)]
        boot_stats = [fid_features_to_statistics(features[idx]) for idx in resamples]
        out = []
        for ref, key in zip(references_rgb, reference_keys):
            height, width = ref.shape[-2:]
            entry = _CacheEntry.of(cache_dir, key, ref.shape[0], height, width, name, layer, dev.type)
            stat_ref = entry.read()
            if stat_ref is None:
                ref_features = extract_featuresdict_from_input_id(
                    2, extractor_module, **(options | dict(input2=_ImageTensorDataset(ref))))[layer]
                stat_ref = fid_features_to_statistics(ref_features)
                entry.write(stat_ref)
            stat_ref = {k: v.astype(stat_samples[k].dtype, copy=False) for k, v in stat_ref.items()}
            value = fid_statistics_to_metric(stat_samples, stat_ref, False)[torch_fidelity.KEY_METRIC_FID]
            boot = tuple(float(fid_statistics_to_metric(b, stat_ref, False)[torch_fidelity.KEY_METRIC_FID])
                         for b in boot_stats)
            out.append(FIDResult(value=float(value), extractor=name, reference=key,
                                 n_samples=int(samples_rgb.shape[0]), n_reference=int(ref.shape[0]), boot=boot))
    return out


def fid(
    samples: torch.Tensor,
    reference: torch.Tensor,
    reference_key: str,
    cache_dir: str | os.PathLike,
    extractor: str = "auto",
    weights: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 200,
) -> FIDResult:
    """Frechet distance between the features of ``samples`` and of one ``reference`` set: ``fid_sets`` with one
    set (same arguments, singular)."""
    return fid_sets(samples, [reference], [reference_key], cache_dir, extractor, weights, device, batch_size)[0]
