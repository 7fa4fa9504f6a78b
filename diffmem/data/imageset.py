"""An image set in memory and its on-disk form: one uint8 tensor file plus a manifest JSON next to it.

On disk a prepared image set is two files written by :func:`write_prepared`:

* ``<name>.pt``: ``torch.save`` of one contiguous uint8 tensor of shape (M, 1, S, S), pixel values 0..255;
* ``<name>.json`` (:func:`manifest_path_for`): the manifest, a JSON object with at least ``source``, ``count`` (M),
  ``size`` (S) and ``sha256`` (of the tensor's raw bytes, C order).

The tensor is written first and the manifest last, each through a temporary file and ``os.replace``, so a manifest
only exists next to a complete tensor: a tensor without its manifest is an interrupted preparation.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffmem.data.errors import DataError
from diffmem.io import atomic_torch_save, atomic_write_text


@dataclass(frozen=True)
class ImageSet:
    """All images of one source in its fixed ordering.

    images: uint8 tensor (M, 1, S, S), pixel values 0..255, on the CPU.
    sha256: hex digest of ``images``' raw bytes (C order); identifies the data set in run folders.
    manifest: where the images came from (source, size, count, order rule, ...); see ``diffmem.data``.
    """

    images: torch.Tensor
    sha256: str
    manifest: dict[str, Any]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def image_size(self) -> int:
        """Side S of the square images (pixels)."""
        return int(self.images.shape[-1])

    def check_recorded(self, recorded_sha256: str | None, source: str) -> None:
        """DataError unless these are the images a run recorded (``recorded_sha256``: its config.json's
        ``dataset_sha256``; None or empty: nothing recorded, nothing to check): measures of a run against other
        images would be silently wrong."""
        if recorded_sha256 and self.sha256 and recorded_sha256 != self.sha256:
            raise DataError(f"the data found for source '{source}' differ from those the run trained on (sha256 "
                            f"{self.sha256[:12]} instead of {recorded_sha256[:12]}); use the copy of the data it "
                            "trained on")


def tensor_sha256(images: torch.Tensor) -> str:
    """SHA-256 hex digest of a CPU tensor's raw bytes in C order (the tensor is not copied when contiguous)."""
    array = images.detach().cpu().contiguous().numpy()
    return hashlib.sha256(memoryview(array).cast("B")).hexdigest()


def check_image_tensor(images: Any, where: str) -> torch.Tensor:
    """Raise DataError unless ``images`` is a uint8 tensor (M, 1, S, S) with M >= 1; return it."""
    if not isinstance(images, torch.Tensor):
        raise DataError(f"{where} holds a {type(images).__name__}, not a tensor; prepare it with `diffmem prepare`")
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 1 or images.shape[2] != images.shape[3]:
        raise DataError(f"{where} holds a {images.dtype} tensor of shape {tuple(images.shape)}; expected uint8 "
                        "(M, 1, S, S) grayscale images from `diffmem prepare`")
    if images.shape[0] == 0:
        raise DataError(f"{where} holds no images; prepare it again with `diffmem prepare`")
    return images


def manifest_path_for(tensor_path: str | Path) -> Path:
    """The manifest next to a prepared tensor: ``foo.pt`` -> ``foo.json``."""
    return Path(tensor_path).with_suffix(".json")


def read_manifest(tensor_path: str | Path) -> dict[str, Any] | None:
    """The manifest next to ``tensor_path``, or None when it is missing or not a JSON object."""
    path = manifest_path_for(tensor_path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def write_prepared(images: torch.Tensor, manifest: dict[str, Any], out: str | Path) -> Path:
    """Save ``images`` (uint8 (M, 1, S, S)) to ``out`` and ``manifest`` next to it; return ``out``.

    Order: a stale manifest of different content is removed first, then the tensor is replaced, then the manifest
    is written, so no reader ever sees a manifest that does not describe the tensor next to it.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    images = check_image_tensor(images, f"the tensor for '{out}'").contiguous()
    manifest_path = manifest_path_for(out)
    old = read_manifest(out)
    if old is not None and old.get("sha256") != manifest.get("sha256"):
        manifest_path.unlink(missing_ok=True)
    atomic_torch_save(out, images)
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
    return out


def load_prepared(path: str | Path) -> ImageSet:
    """Load a tensor written by ``diffmem prepare`` and check it against its manifest (count, size, sha256)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prepared tensor '{path}' does not exist; run `diffmem prepare celeba --root DIR` first")
    manifest = read_manifest(path)
    if manifest is None:
        raise DataError(f"'{path}' has no manifest '{manifest_path_for(path).name}' next to it (not written by "
                        "`diffmem prepare`, or its preparation was interrupted); run `diffmem prepare` again")
    try:
        images = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        raise DataError(f"cannot read prepared tensor '{path}' ({type(e).__name__}); delete it and run "
                        "`diffmem prepare` again") from None
    images = check_image_tensor(images, f"'{path}'").contiguous()
    sha = tensor_sha256(images)
    if sha != manifest.get("sha256") or len(images) != manifest.get("count"):
        raise DataError(f"'{path}' does not match its manifest (sha256 or count differ); delete both files and run "
                        "`diffmem prepare` again")
    return ImageSet(images=images, sha256=sha, manifest=manifest)
