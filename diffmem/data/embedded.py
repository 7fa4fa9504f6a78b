"""Real image sets shipped inside installed packages: nothing is downloaded.

* ``lfw_faces``: scikit-image ``skimage.data.lfw_subset()``, its FIRST 100 images (the faces; images 100..199 are
  non-faces), 25x25 grayscale floats in [0, 1]; order = the package's order.
* ``digits``: scikit-learn ``load_digits()``, all 1797 8x8 images with values 0..16 (divided by 16 to [0, 1]);
  order = the package's order.

Both are resized to ``size`` x ``size`` with torchvision ``Resize`` on float tensors (bilinear, antialias=True; the
images are square, so no crop is needed), clamped to [0, 1] and rounded to uint8 0..255.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as TF

from diffmem.data.errors import DataError
from diffmem.data.imageset import ImageSet, tensor_sha256

LFW_FACES_COUNT = 100
RESIZE_RULE = "torchvision Resize to (size, size) on float [0,1] (bilinear, antialias=True) -> clamp -> round to uint8"


def resize_to_uint8(images01: np.ndarray, size: int) -> torch.Tensor:
    """(M, H, W) floats in [0, 1] -> uint8 (M, 1, size, size), bilinear antialiased resize, rounded."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DataError(f"image size = {size!r} must be a positive integer number of pixels (e.g. 32)")
    x = torch.from_numpy(np.ascontiguousarray(images01, dtype=np.float32)).unsqueeze(1)
    if x.shape[-2:] != (size, size):
        x = TF.resize(x, [size, size], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    return (x.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).contiguous()


def _image_set(images: torch.Tensor, manifest: dict[str, Any]) -> ImageSet:
    sha = tensor_sha256(images)
    manifest = {**manifest, "count": len(images), "size": int(images.shape[-1]), "shape": list(images.shape),
                "dtype": "uint8", "sha256": sha, "transform": RESIZE_RULE}
    return ImageSet(images=images, sha256=sha, manifest=manifest)


def embedded_lfw_faces(size: int) -> ImageSet:
    """The 100 LFW faces of scikit-image, resized to uint8 (100, 1, size, size)."""
    import skimage
    from skimage.data import lfw_subset

    faces = lfw_subset()[:LFW_FACES_COUNT]  # (100, 25, 25) float64 in [0, 1]
    return _image_set(resize_to_uint8(faces, size), {
        "source": "lfw_faces",
        "package": f"scikit-image {skimage.__version__}",
        "origin": "skimage.data.lfw_subset()[:100] (the faces), 25x25 floats in [0, 1]",
        "order": "the package's order",
    })


def embedded_digits(size: int) -> ImageSet:
    """The 1797 scikit-learn digits (values 0..16 divided by 16), resized to uint8 (1797, 1, size, size)."""
    import sklearn
    from sklearn.datasets import load_digits

    digits = load_digits().images / 16.0  # (1797, 8, 8) float64 in [0, 1]
    return _image_set(resize_to_uint8(digits, size), {
        "source": "digits",
        "package": f"scikit-learn {sklearn.__version__}",
        "origin": "sklearn.datasets.load_digits().images / 16, 8x8",
        "order": "the package's order",
    })
