"""Disjoint train subsets, the held-out pool and a control block of one image order, and the training mean.

The split first fixes an order of the source's M images (``data.order``):

* ``"shuffled"`` (the default): a uniform random permutation of the source, drawn with numpy's PCG64 from
  ``data.order_seed``. Every image set that a comparison needs is a disjoint block of that one permutation, so
  train set, held-out pool, control and the halves of a split pair are *exchangeable by construction*: any
  difference a model-free test finds between them is chance, and any difference a signal finds is the model's.
* ``"source"``: the source's own ordering (``diffmem.data``). Kept for the paper's protocol (the official code's
  ordered CelebA subsets) and for run folders written before ``data.order`` existed. An ordering can be clustered
  (scikit-learn's digits come in blocks by writer), and then blocks of it differ in distribution.

With H = cfg.n_heldout (0: ``default_heldout(M)``), N = cfg.n and i = cfg.subset_index, in that order:

* held-out pool: the last H images (test loss and membership non-members, FID reference sets);
* training part: the first T = M - H images; the train set is its block i, positions [i*N, (i+1)*N);
* control: another block of the training part (:func:`control_block`), N images never trained on but drawn exactly
  as the train set is; the evaluation scores them as it scores the train set, so every sampling-free signal has a
  no-member control that must read its null (0 gap, AUC 0.5). None when the training part holds one block only.

Train sets of different i never overlap each other or the held-out pool, and the same config always gives the same
images. (The paper's code takes train block i from the start of the ordering and its test images from the end;
here the training part stops before the held-out pool, so the two can never share an image.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from diffmem.config import DataConfig
from diffmem.data.errors import DataError
from diffmem.data.imageset import ImageSet


@dataclass(frozen=True)
class Splits:
    """One run's images, and where each came from.

    train: uint8 (N, 1, S, S), the train set. heldout: uint8 (H, 1, S, S), the held-out pool.
    control: uint8 (N, 1, S, S), the control block (never trained on, drawn as the train set), or (0, 1, S, S).
    mean: float32 (1, S, S) in [0, 1] pixel units, the centering offset (see :func:`train_mean`).
    train_indices, heldout_indices, control_indices: int64 (N,), (H,), (N,) or (0,): each image's index in the
    source's own ordering (the order of the rows above).
    pair_indices: int64 (N,) or (0,): the train set of the other member of a split pair (block 1 for block 0 and
    block 0 for block 1; ``docs/split-pairs.md``), empty for other blocks or when the training part holds one.
    train_range, heldout_range: (start, stop) positions of the train set and the pool in the split's order.
    order, order_seed: the split's order (``data.order``) and its permutation seed.
    """

    train: torch.Tensor
    heldout: torch.Tensor
    control: torch.Tensor
    mean: torch.Tensor
    train_indices: np.ndarray
    heldout_indices: np.ndarray
    control_indices: np.ndarray
    pair_indices: np.ndarray
    train_range: tuple[int, int]
    heldout_range: tuple[int, int]
    order: str
    order_seed: int

    @property
    def order_tag(self) -> str:
        """A short name of the split's order for keys of cached statistics: "" for the source's ordering,
        "shuffled<seed>" for a permutation."""
        return "" if self.order == "source" else f"{self.order}{self.order_seed}"


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


def split_order(total: int, order: str, seed: int) -> np.ndarray:
    """int64 (total,): the source indices in the split's order, ``np.arange(total)`` for "source", a permutation
    drawn by ``numpy.random.default_rng(seed)`` (PCG64) for "shuffled"."""
    if order == "source":
        return np.arange(total, dtype=np.int64)
    if order == "shuffled":
        return np.random.default_rng(seed).permutation(total).astype(np.int64)
    raise DataError(f"data.order = {order!r} is unknown; use 'shuffled' or 'source'")


def control_block(n_subsets: int, index: int) -> int | None:
    """The block of the training part that is the control of train block ``index`` when it holds ``n_subsets``
    disjoint blocks: the last one, or the one before it when the train set is the last; None with one block only.
    Split pairs (blocks 0 and 1) share it whenever there are three blocks or more."""
    if n_subsets < 2:
        return None
    last = n_subsets - 1
    return last if index != last else last - 1


def make_splits(images: ImageSet, cfg: DataConfig) -> Splits:
    """Cut ``images`` into cfg's train set (block cfg.subset_index of size cfg.n), its control block and the
    held-out pool, in the order ``cfg.order`` says."""
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
    order = split_order(total, cfg.order, cfg.order_seed)
    start, stop = index * n, (index + 1) * n
    block = control_block(n_subsets, index)
    train_idx = order[start:stop]
    heldout_idx = order[n_training:]
    control_idx = order[block * n:(block + 1) * n] if block is not None else order[:0]
    other = 1 - index if index in (0, 1) and n_subsets >= 2 else None
    pair_idx = order[other * n:(other + 1) * n] if other is not None else order[:0]
    if cfg.order == "source":  # blocks of the source's ordering are views, not copies (a CelebA pool is large)
        c0, c1 = (block * n, (block + 1) * n) if block is not None else (0, 0)
        train, heldout, control = (images.images[a:b] for a, b in ((start, stop), (n_training, total), (c0, c1)))
    else:
        train, heldout, control = (images.images[torch.from_numpy(idx)]
                                   for idx in (train_idx, heldout_idx, control_idx))
    return Splits(train=train, heldout=heldout, control=control, mean=train_mean(train), train_indices=train_idx,
                  heldout_indices=heldout_idx, control_indices=control_idx,
                  pair_indices=pair_idx, train_range=(start, stop),
                  heldout_range=(n_training, total), order=cfg.order, order_seed=cfg.order_seed)
