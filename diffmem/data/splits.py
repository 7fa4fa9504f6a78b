"""Disjoint train subsets and the held-out pool of one image ordering, and the training mean.

With M images in the source's fixed ordering, H = cfg.n_heldout (0: ``default_heldout(M)``), N = cfg.n and
i = cfg.subset_index:

* held-out pool: the last H images, ordering indices [M - H, M) (test loss, FID reference);
* training part: the first T = M - H images; the train set is its block [i*N, (i+1)*N).

So train sets of different i never overlap each other or the held-out pool, and the same config always gives the
same images. (The paper's code takes train block i from the start of the ordering and its test images from the end;
here the training part stops before the held-out pool, so the two can never share an image.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from diffmem.config import DataConfig
from diffmem.data.errors import DataError
from diffmem.data.imageset import ImageSet


@dataclass(frozen=True)
class Splits:
    """One run's images.

    train: uint8 (N, 1, S, S), the train set. heldout: uint8 (H, 1, S, S), the held-out pool.
    mean: float32 (1, S, S) in [0, 1] pixel units, the centering offset (see :func:`train_mean`).
    train_range, heldout_range: (start, stop) indices into the source's ordering.
    """

    train: torch.Tensor
    heldout: torch.Tensor
    mean: torch.Tensor
    train_range: tuple[int, int]
    heldout_range: tuple[int, int]


def train_mean(train: torch.Tensor) -> torch.Tensor:
    """The centering offset of a train set (uint8 (N, 1, S, S)) as float32 (1, S, S) in [0, 1] units.

    Like the paper's official code (tbonnair/Why-Diffusion-Models-Don-t-Memorize, ``loader.load_CelebA_pt``:
    ``mean = torch.mean(train_images, axis=[0, 2, 3])``, no standardization), this is ONE scalar per channel, the
    mean over all train images and all pixels, not a per-pixel mean image; it is broadcast to (1, S, S) so that
    ``x / 255 - mean`` works on any (..., 1, S, S) batch.
    """
    channel_mean = train.to(torch.float64).mean(dim=(0, 2, 3)) / 255.0  # (C,)
    return channel_mean.to(torch.float32)[:, None, None].expand(train.shape[1:]).contiguous()


MAX_DEFAULT_HELDOUT = 50000  # CelebA: five FID reference sets of 10000 images, as the paper evaluates


def default_heldout(total: int) -> int:
    """The held-out pool of a source of ``total`` images when ``data.n_heldout = 0``: half of them, at most
    ``MAX_DEFAULT_HELDOUT``. CelebA (202599) -> 50000, digits (1797) -> 898, lfw_faces (100) -> 50."""
    return min(MAX_DEFAULT_HELDOUT, total // 2)


def make_splits(images: ImageSet, cfg: DataConfig) -> Splits:
    """Cut ``images`` into cfg's train set (block cfg.subset_index of size cfg.n) and the held-out pool."""
    total, n, index = len(images), cfg.n, cfg.subset_index
    n_heldout = cfg.n_heldout or default_heldout(total)
    source = images.manifest.get("source", cfg.source)
    if n_heldout < 1 or n_heldout >= total:
        raise DataError(f"data.n_heldout = {n_heldout} must be in [1, {total - 1}]: source '{source}' has {total} "
                        "images and the held-out pool must leave some for training; lower data.n_heldout")
    n_training = total - n_heldout
    if n < 1 or n > n_training:
        chosen = "" if cfg.n_heldout else " (chosen by the source: set data.n_heldout to change it)"
        raise DataError(f"data.n = {n} is larger than the training part of source '{source}' ({n_training} images "
                        f"= {total} - data.n_heldout {n_heldout}{chosen}); lower data.n or data.n_heldout")
    n_subsets = n_training // n
    if not 0 <= index < n_subsets:
        raise DataError(f"data.subset_index = {index} is out of range: {n_training} training images hold "
                        f"{n_subsets} disjoint subsets of data.n = {n}, so use 0..{n_subsets - 1}")
    start, stop = index * n, (index + 1) * n
    train = images.images[start:stop]
    return Splits(train=train, heldout=images.images[n_training:], mean=train_mean(train),
                  train_range=(start, stop), heldout_range=(n_training, total))
