"""Data: image sources -> one uint8 tensor (M, 1, S, S) in a fixed ordering -> train subsets, held-out pool, centering.

Sources (``DataConfig.source``) and their fixed orderings:

* ``celeba`` / ``folder``: a local copy, prepared once by :func:`prepare_celeba` into a cached tensor + manifest;
  ordered by (partition, filename) with ``list_eval_partition.txt``, else by filename (``diffmem.data.prepare``).
* ``lfw_faces``: scikit-image's first 100 LFW faces; ``digits``: scikit-learn's 1797 digits; the packages' order
  (``diffmem.data.embedded``).

The last ``data.n_heldout`` images of the ordering are held out; 0 (the default) holds out half of them, at most
50000 (:func:`default_heldout`).

Typical use::

    images = load_images(cfg.data)           # ImageSet: uint8 (M, 1, S, S), sha256, manifest
    splits = make_splits(images, cfg.data)   # train (N, 1, S, S), heldout (H, 1, S, S), mean (1, S, S)
    x = to_model(splits.train, splits.mean)  # float32 x / 255 - mean
"""
from diffmem.data.centering import to_model, to_pixels, to_uint8
from diffmem.data.embedded import embedded_digits, embedded_lfw_faces
from diffmem.data.errors import DataError
from diffmem.data.imageset import ImageSet, load_prepared, manifest_path_for, tensor_sha256, write_prepared
from diffmem.data.prepare import default_cache_dir, find_layout, paper_transform, prepare_celeba
from diffmem.data.sources import load_images
from diffmem.data.splits import Splits, default_heldout, make_splits, train_mean

__all__ = [
    "DataError",
    "ImageSet",
    "Splits",
    "default_cache_dir",
    "default_heldout",
    "embedded_digits",
    "embedded_lfw_faces",
    "find_layout",
    "load_images",
    "load_prepared",
    "make_splits",
    "manifest_path_for",
    "paper_transform",
    "prepare_celeba",
    "tensor_sha256",
    "to_model",
    "to_pixels",
    "to_uint8",
    "train_mean",
    "write_prepared",
]
