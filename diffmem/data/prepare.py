"""Local image copies (CelebA, or any folder of images) -> one cached uint8 tensor + manifest.

Layouts read by :func:`prepare_celeba` (``ROOT`` is the ``root`` argument):

* source ``"celeba"``: ``ROOT/img_align_celeba/*.jpg`` or torchvision's ``ROOT/celeba/img_align_celeba/*.jpg``
  (or ``ROOT`` itself named ``img_align_celeba``), with an optional ``list_eval_partition.txt`` next to the
  ``img_align_celeba`` folder (lines ``000001.jpg 0``; partitions 0 = train, 1 = valid, 2 = test);
* source ``"folder"``: ``ROOT/*.jpg|*.jpeg|*.png`` (not recursive, suffixes in any case).

The fixed ordering: with a partition file, sorted by (partition, filename), so partition 0 comes first, then 1,
then 2; without one, sorted by filename (Python string order; CelebA's zero-padded names make this numeric order,
the order of the paper's code). For the real CelebA both rules give the same order, 000001.jpg ... 202599.jpg.

The transform is the paper's (torchvision on the PIL image): convert to RGB, ``Resize(size)`` of the short side
(bilinear, antialiased), ``CenterCrop(size)``, ``Grayscale(1)`` (ITU-R 601-2 luma), kept as uint8 0..255.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
import torchvision.transforms as T
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor
from tqdm import tqdm

from diffmem.data.errors import DataError
from diffmem.data.imageset import read_manifest, tensor_sha256, write_prepared

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CELEBA_IMAGE_DIR = "img_align_celeba"
PARTITION_FILE = "list_eval_partition.txt"
PREPARE_VERSION = 1  # bump when the transform or the file format changes: it invalidates every cached tensor
TRANSFORM_RULE = ("PIL RGB -> torchvision Resize(size) of the short side (bilinear, antialiased) -> CenterCrop(size) "
                  "-> Grayscale(1) (ITU-R 601-2 luma) -> uint8 0..255")
ORDER_BY_PARTITION = "sorted by (partition, filename) from list_eval_partition.txt: partition 0, then 1, then 2"
ORDER_BY_NAME = "sorted by filename (Python string order)"
EXPECTED_LAYOUT = ("expected torchvision's CelebA layout ROOT/celeba/img_align_celeba/000001.jpg (+ ROOT/celeba/"
                   "list_eval_partition.txt), ROOT/img_align_celeba/*.jpg, or a folder of .jpg/.png images")
MAX_SKIPPED_LISTED = 1000  # skipped file names kept in the manifest


@dataclass(frozen=True)
class Layout:
    """Where a local copy's images are. source: "celeba" | "folder"; partition_file: None when absent."""

    source: str
    image_dir: Path
    partition_file: Path | None


@dataclass(frozen=True)
class ImageFile:
    """One image file of a layout; mtime_ns and n_bytes feed the cache key."""

    name: str
    mtime_ns: int
    n_bytes: int


def paper_transform(size: int) -> T.Compose:
    """The paper's transform on a PIL RGB image: Resize(size) short side, CenterCrop(size), Grayscale(1)."""
    return T.Compose([
        T.Resize(size, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
        T.CenterCrop(size),
        T.Grayscale(num_output_channels=1),
    ])


def read_image(path: Path) -> Image.Image:
    """Decode one image file fully into an RGB PIL image; DataError naming the file when it cannot be decoded."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise DataError(f"cannot read image '{path}' ({reason}); replace or delete it, or pass skip_bad=True "
                        "(--skip-bad) to skip unreadable images") from None


def _has_images(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES) for e in entries)


def find_layout(root: str | Path) -> Layout:
    """Which of the supported layouts ``root`` is (see the module docstring); DataError when none."""
    root = Path(root).expanduser()
    if not root.exists():
        raise DataError(f"image root '{root}' does not exist; {EXPECTED_LAYOUT}")
    if not root.is_dir():
        raise DataError(f"image root '{root}' is a file, not a folder (unpack archives first); {EXPECTED_LAYOUT}")
    candidates = [root / CELEBA_IMAGE_DIR, root / "celeba" / CELEBA_IMAGE_DIR]
    if root.name == CELEBA_IMAGE_DIR:
        candidates.append(root)
    image_dir = next((folder for folder in candidates if folder.is_dir()), None)
    if image_dir is not None:
        if not _has_images(image_dir):
            raise DataError(f"no .jpg/.png images in '{image_dir}'; {EXPECTED_LAYOUT}")
        partition_file = image_dir.parent / PARTITION_FILE
        return Layout("celeba", image_dir, partition_file if partition_file.is_file() else None)
    if _has_images(root):
        return Layout("folder", root, None)
    raise DataError(f"'{root}' holds neither {CELEBA_IMAGE_DIR}/ nor celeba/{CELEBA_IMAGE_DIR}/ nor .jpg/.png "
                    f"images; {EXPECTED_LAYOUT}")


def list_image_files(image_dir: Path) -> list[ImageFile]:
    """The image files directly in ``image_dir``, sorted by name."""
    files = []
    with os.scandir(image_dir) as entries:
        for entry in entries:
            if entry.is_file() and entry.name.lower().endswith(IMAGE_SUFFIXES):
                st = entry.stat()
                files.append(ImageFile(entry.name, st.st_mtime_ns, st.st_size))
    return sorted(files, key=lambda f: f.name)


def read_partitions(path: Path) -> dict[str, int]:
    """Parse list_eval_partition.txt: filename -> partition (0 train, 1 valid, 2 test)."""
    partitions = {}
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
            raise DataError(f"{path}:{line_number}: expected '<filename> <0|1|2>', got {line.strip()!r}; fix the "
                            f"line or remove {PARTITION_FILE} to order the images by filename")
        partitions[fields[0]] = int(fields[1])
    return partitions


def order_files(files: list[ImageFile], partitions: dict[str, int] | None, partition_file: Path | None
                ) -> list[ImageFile]:
    """The fixed ordering: by (partition, filename) with partitions, else by filename. With partitions, every image
    must be listed and every listed image present (DataError naming how many are not and the first)."""
    if partitions is None:
        return sorted(files, key=lambda f: f.name)
    unlisted = [f.name for f in files if f.name not in partitions]
    if unlisted:
        raise DataError(f"{len(unlisted)} images are not listed in '{partition_file}' (first: {unlisted[0]}); add "
                        f"them or remove {PARTITION_FILE} to order the images by filename")
    present = {f.name for f in files}
    missing = sorted(name for name in partitions if name not in present)
    if missing:
        raise DataError(f"{len(missing)} images listed in '{partition_file}' are missing from "
                        f"'{partition_file.parent}' (first: {missing[0]}); restore them (unpack the whole archive), "
                        f"or remove {PARTITION_FILE} to use the images present ordered by filename")
    return sorted(files, key=lambda f: (partitions[f.name], f.name))


def cache_key(root: Path, layout: Layout, files: list[ImageFile], size: int) -> str:
    """16 hex digits identifying (root, size, transform version, file names, mtimes, byte sizes, partition file).

    Built from file metadata only, so deciding whether a cached tensor is current never decodes an image.
    """
    digest = hashlib.sha256()
    partition_stat = None
    if layout.partition_file is not None:
        st = layout.partition_file.stat()
        partition_stat = [st.st_mtime_ns, st.st_size]
    header = {"version": PREPARE_VERSION, "root": str(root), "image_dir": str(layout.image_dir), "size": size,
              "count": len(files), "partition_file": partition_stat}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for f in files:
        digest.update(f"\n{f.name}\t{f.mtime_ns}\t{f.n_bytes}".encode())
    return digest.hexdigest()[:16]


def default_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` if given, else $DIFFMEM_CACHE, else ~/.cache/diffmem."""
    chosen = cache_dir or os.environ.get("DIFFMEM_CACHE") or Path.home() / ".cache" / "diffmem"
    return Path(chosen).expanduser()


def _reusable(out: Path, key: str, skip_bad: bool) -> bool:
    manifest = read_manifest(out)
    if manifest is None or manifest.get("cache_key") != key or not out.is_file():
        return False
    if manifest.get("n_skipped", 0) and not skip_bad:
        first = (manifest.get("skipped_files") or ["?"])[0]
        raise DataError(f"'{out}' was prepared with skip_bad and skipped {manifest['n_skipped']} unreadable images "
                        f"(first: {first}); pass skip_bad=True (--skip-bad) to use it, or fix the images and delete it")
    return True


def transform_images(layout: Layout, files: list[ImageFile], size: int, skip_bad: bool
                     ) -> tuple[torch.Tensor, list[ImageFile], list[str]]:
    """Stream ``files`` through :func:`paper_transform` into one preallocated uint8 tensor (K, 1, size, size).

    Returns (images, the K files read, in order, the names skipped as unreadable); memory: M * size**2 bytes plus
    one decoded image. Unreadable images raise DataError unless skip_bad.
    """
    transform = paper_transform(size)
    images = torch.empty((len(files), 1, size, size), dtype=torch.uint8)
    kept: list[ImageFile] = []
    skipped: list[str] = []
    for f in tqdm(files, desc=f"prepare {layout.source} {size}px", unit="img", mininterval=1.0):
        try:
            pil = read_image(layout.image_dir / f.name)
        except DataError:
            if not skip_bad:
                raise
            skipped.append(f.name)
            continue
        images[len(kept)] = pil_to_tensor(transform(pil))  # (1, size, size) uint8
        kept.append(f)
    if not kept:
        raise DataError(f"none of the {len(files)} images in '{layout.image_dir}' could be read; check the files")
    if skipped:
        images = images[: len(kept)].clone()  # a slice would save the whole preallocated storage
    return images, kept, skipped


def prepare_celeba(root: str | Path, size: int = 32, out: str | Path | None = None, skip_bad: bool = False,
                   cache_dir: str | Path | None = None) -> Path:
    """Transform a local CelebA copy (or image folder) into one uint8 tensor (M, 1, size, size) + manifest.

    root: a folder in one of the layouts of this module's docstring. size: output side S in pixels.
    out: the tensor file (its manifest goes next to it as ``out.with_suffix('.json')``); default
    ``<cache_dir>/<source>_<size>_<key>.pt`` with cache_dir = the argument, $DIFFMEM_CACHE or ~/.cache/diffmem, and
    key from :func:`cache_key`. When ``out`` already holds a tensor with the same key it is returned as it is.
    skip_bad: skip images that cannot be decoded (counted and listed in the manifest) instead of raising DataError.

    Images stream one at a time into a preallocated tensor (memory: M * S * S bytes plus one decoded image); the
    tensor is written first and the manifest last, both atomically, and only after every image was read.
    Returns the tensor's path.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DataError(f"size = {size!r} must be a positive integer number of pixels (e.g. 32)")
    root = Path(root).expanduser().resolve()
    layout = find_layout(root)
    files = list_image_files(layout.image_dir)
    partitions = read_partitions(layout.partition_file) if layout.partition_file is not None else None
    files = order_files(files, partitions, layout.partition_file)
    key = cache_key(root, layout, files, size)
    if out is None:
        out = default_cache_dir(cache_dir) / f"{layout.source}_{size}_{key}.pt"
    out = Path(out).expanduser()
    if out.suffix == ".json" or out.is_dir():
        raise DataError(f"out = '{out}' must be a tensor file path like celeba32.pt (its manifest goes next to it)")
    if _reusable(out, key, skip_bad):
        return out

    images, kept, skipped = transform_images(layout, files, size, skip_bad)
    partition_counts = None
    if partitions is not None:
        partition_counts = {str(p): sum(partitions[f.name] == p for f in kept) for p in (0, 1, 2)}
    manifest: dict[str, Any] = {
        "format": "diffmem-images-v1",
        "source": layout.source,
        "root": str(root),
        "image_dir": str(layout.image_dir),
        "partition_file": str(layout.partition_file) if layout.partition_file is not None else None,
        "count": len(kept),
        "size": size,
        "shape": list(images.shape),
        "dtype": "uint8",
        "sha256": tensor_sha256(images),
        "order": ORDER_BY_PARTITION if partitions is not None else ORDER_BY_NAME,
        "partition_counts": partition_counts,
        "transform": TRANSFORM_RULE,
        "n_skipped": len(skipped),
        "skipped_files": skipped[:MAX_SKIPPED_LISTED],
        "cache_key": key,
        "prepare_version": PREPARE_VERSION,
        "torchvision": torchvision.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": [f.name for f in kept],
    }
    return write_prepared(images, manifest, out)
