"""``load_images(cfg)``: the images of ``cfg.source`` at ``cfg.image_size``, in the source's fixed ordering.

* ``lfw_faces``, ``digits``: built in memory from installed packages (``diffmem.data.embedded``).
* ``celeba``, ``folder``: ``cfg.path`` is a tensor file written by ``prepare_celeba`` (``diffmem prepare``), or a
  root folder (a CelebA copy or an image folder, ``diffmem.data.prepare``), which is then prepared into the cache
  (``cfg.cache_dir``, $DIFFMEM_CACHE or ~/.cache/diffmem; reused while the files are unchanged) and loaded.
"""
from __future__ import annotations

from pathlib import Path

from diffmem.config import DataConfig
from diffmem.data.embedded import embedded_digits, embedded_lfw_faces
from diffmem.data.errors import DataError
from diffmem.data.imageset import ImageSet, load_prepared
from diffmem.data.prepare import prepare_celeba

EMBEDDED_SOURCES = {"lfw_faces": embedded_lfw_faces, "digits": embedded_digits}
LOCAL_SOURCES = ("celeba", "folder")


def load_images(cfg: DataConfig) -> ImageSet:
    """All images of the configured source as uint8 (M, 1, S, S) with S = cfg.image_size, plus sha256 and manifest."""
    if cfg.source in EMBEDDED_SOURCES:
        return EMBEDDED_SOURCES[cfg.source](cfg.image_size)
    if cfg.source not in LOCAL_SOURCES:
        raise DataError(f"data.source = '{cfg.source}' is unknown; choose "
                        + ", ".join([*LOCAL_SOURCES, *EMBEDDED_SOURCES]))
    if not cfg.path:
        raise DataError(f"data.source = '{cfg.source}' needs data.path: a CelebA root, an image folder or a tensor "
                        "from `diffmem prepare`")
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        path = prepare_celeba(path, size=cfg.image_size, cache_dir=cfg.cache_dir)
    image_set = load_prepared(path)
    if image_set.image_size != cfg.image_size:
        raise DataError(f"'{path}' holds {image_set.image_size}x{image_set.image_size} images but data.image_size = "
                        f"{cfg.image_size}; set data.image_size={image_set.image_size} or prepare it again with "
                        f"--size {cfg.image_size}")
    return image_set
