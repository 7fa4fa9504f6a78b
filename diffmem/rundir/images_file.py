"""A run folder's images.json: which images of the source the run trained on and which it compared them with.

Written next to config.json when a run starts (and when a run folder that predates it is continued), so that a reader
can check any claim about the image sets without re-deriving the split. Every list holds indices into the source's
own ordering (``diffmem.data``; for a prepared tensor, its rows), as JSON integers::

    {"format": 1,
     "dataset_sha256": "...",        the source's images, as config.json records them
     "source_count": 1797,           M, the source's image count: every index is in [0, M)
     "order": "shuffled",            data.order: "shuffled" (a seeded permutation) | "source"
     "order_seed": 0,                data.order_seed
     "train": [...],                 the N training images, in the train set's row order
     "nonmembers": [...],            the held-out images the evaluation scores (test loss, membership AUC)
     "control": [...],               the control block: never trained on, drawn as the train set ([] if none)
     "heldout": [...],               the whole held-out pool; FID reference set k is its block k
     "pair_other": [...]}            the train set of the other member of a split pair ([] if none)

Read as data (JSON only) and validated in full (:func:`read_images_file`): a damaged or edited file is a one-line
:class:`ImagesFileError` naming the file and what is wrong. ``diffmem train`` refuses to continue a run whose
images.json names other images than its config gives (:func:`check_images_file`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from diffmem.io import atomic_write_json
from diffmem.rundir.folder import RunDir

IMAGES_FORMAT = 1
INDEX_LISTS = ("train", "nonmembers", "control", "heldout", "pair_other")
MAX_IMAGES_FILE_BYTES = 64 * 2 ** 20  # 5 lists of at most a few 100k indices of 7 digits: far below


class ImagesFileError(ValueError):
    """A run folder's images.json that cannot be used; the one-line message names the file and the problem."""


@dataclass(frozen=True)
class ImageManifest:
    """The image sets of one run as source indices (see the module docstring for each field)."""

    dataset_sha256: str
    source_count: int
    order: str
    order_seed: int
    train: tuple[int, ...]
    nonmembers: tuple[int, ...]
    control: tuple[int, ...]
    heldout: tuple[int, ...]
    pair_other: tuple[int, ...]

    @classmethod
    def of_splits(cls, splits: Any, dataset_sha256: str, source_count: int, n_nonmembers: int) -> ImageManifest:
        """The manifest of a :class:`diffmem.data.Splits` whose evaluation scores the first ``n_nonmembers`` images
        of the held-out pool."""
        def ints(a: Any) -> tuple[int, ...]:
            return tuple(int(i) for i in a)
        return cls(dataset_sha256=dataset_sha256, source_count=int(source_count), order=splits.order,
                   order_seed=int(splits.order_seed), train=ints(splits.train_indices),
                   nonmembers=ints(splits.heldout_indices[:n_nonmembers]), control=ints(splits.control_indices),
                   heldout=ints(splits.heldout_indices), pair_other=ints(splits.pair_indices))

    def to_dict(self) -> dict[str, Any]:
        return {"format": IMAGES_FORMAT, "dataset_sha256": self.dataset_sha256, "source_count": self.source_count,
                "order": self.order, "order_seed": self.order_seed,
                **{name: list(getattr(self, name)) for name in INDEX_LISTS}}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ImageManifest:
        """Validate ``d`` (parsed JSON) and build the manifest; ImagesFileError naming ``where`` and the key."""
        def fail(what: str) -> ImagesFileError:
            return ImagesFileError(f"{where}: {what}; restore the file from a copy, or delete it and rerun "
                                   "`diffmem train` with the run's command to write it again from config.json")
        if not isinstance(d, dict):
            raise fail(f"it is {type(d).__name__} JSON, not an object")
        if d.get("format") != IMAGES_FORMAT:
            raise fail(f"'format' is {d.get('format')!r}, not {IMAGES_FORMAT}")
        count = d.get("source_count")
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise fail(f"'source_count' is {count!r}, not a positive integer")
        if not isinstance(d.get("dataset_sha256"), str):
            raise fail("'dataset_sha256' is not a string")
        if d.get("order") not in ("shuffled", "source"):
            raise fail(f"'order' is {d.get('order')!r}, not 'shuffled' or 'source'")
        seed = d.get("order_seed")
        if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            raise fail(f"'order_seed' is {seed!r}, not an integer >= 0")
        lists = {}
        for name in INDEX_LISTS:
            values = d.get(name)
            if not isinstance(values, list):
                raise fail(f"'{name}' is not a list of image indices")
            bad = [v for v in values if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < count)]
            if bad:
                raise fail(f"'{name}' holds {str(bad[0])[:40]!r}, not an image index in [0, {count})")
            if len(set(values)) != len(values):
                raise fail(f"'{name}' repeats an image")
            lists[name] = tuple(values)
        if len(lists["train"]) < 2:
            raise fail("'train' holds fewer than 2 images")
        for a, b in (("train", "heldout"), ("train", "control"), ("control", "heldout"), ("train", "pair_other"),
                     ("pair_other", "heldout")):
            if set(lists[a]) & set(lists[b]):
                raise fail(f"'{a}' and '{b}' share an image")
        if not set(lists["nonmembers"]) <= set(lists["heldout"]):
            raise fail("'nonmembers' holds an image outside 'heldout'")
        return cls(dataset_sha256=d["dataset_sha256"], source_count=count, order=d["order"], order_seed=seed,
                   **lists)


def read_images_file(run: RunDir) -> ImageManifest | None:
    """The validated images.json of ``run``; None when the folder has none (written before diffmem recorded it).
    Only a regular file of at most ``MAX_IMAGES_FILE_BYTES`` is read (a link, a pipe or a huge file is an error
    naming it, not a hang)."""
    path = run.images_path
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise ImagesFileError(f"{path} is not a regular file; move it out of the run folder and rerun `diffmem "
                              "train` with the run's command to write it again")
    if path.stat().st_size > MAX_IMAGES_FILE_BYTES:
        raise ImagesFileError(f"{path} is larger than {MAX_IMAGES_FILE_BYTES // 2 ** 20} MiB, more than any run's "
                              "images.json; restore it from a copy")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ImagesFileError(f"{path} is not valid JSON ({type(e).__name__}); restore it from a copy, or delete it "
                              "and rerun `diffmem train` with the run's command") from None
    return ImageManifest.from_dict(data, str(path))


def check_images_file(run: RunDir, expected: ImageManifest) -> bool:
    """True when ``run``'s images.json holds ``expected``; False when the folder has none (write it then);
    ImagesFileError when it names other images (the config or the data no longer give the images the run used)."""
    recorded = read_images_file(run)
    if recorded is None:
        return False
    if recorded != expected:
        differ = [name for name in ("dataset_sha256", "source_count", "order", "order_seed", *INDEX_LISTS)
                  if getattr(recorded, name) != getattr(expected, name)]
        raise ImagesFileError(f"{run.images_path} names other images than this config and data give "
                              f"({', '.join(differ)} differ): the run trained on the recorded ones; use the data and config it was "
                              "trained with")
    return True


def write_images_file(run: RunDir, manifest: ImageManifest) -> None:
    """Write ``<run>/images.json`` atomically."""
    atomic_write_json(run.images_path, manifest.to_dict())
