"""Tests of diffmem.data: preparation of local copies, embedded sources, splits and centering."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

import diffmem.data.prepare as prepare_module
from diffmem.config import DataConfig
from diffmem.data import (DataError, ImageSet, Splits, default_heldout, embedded_digits, embedded_lfw_faces,
                          load_images, load_prepared, make_splits, manifest_path_for, prepare_celeba, tensor_sha256,
                          to_model, to_pixels, to_uint8)
from diffmem.data.splits import control_block


def torchvision_reference(path: Path, size: int) -> torch.Tensor:
    """The paper's transform applied by torchvision directly on the PIL image: uint8 (1, size, size)."""
    image = Image.open(path).convert("RGB")
    pipeline = T.Compose([T.Resize(size), T.CenterCrop(size), T.Grayscale(1)])
    return pil_to_tensor(pipeline(image))


def image_dir_of(root: Path) -> Path:
    nested = root / "celeba" / "img_align_celeba"
    return nested if nested.is_dir() else root / "img_align_celeba"


def partition_table(root: Path) -> dict[str, int]:
    text = (image_dir_of(root).parent / "list_eval_partition.txt").read_text()
    return {name: int(p) for name, p in (line.split() for line in text.splitlines())}


def load_with_manifest(path: Path) -> tuple[torch.Tensor, dict]:
    images = torch.load(path, weights_only=True)
    return images, json.loads(manifest_path_for(path).read_text())


# --- the transform ----------------------------------------------------------------------------------------------

def test_transform_on_a_known_image_resizes_short_side_crops_center_and_grays(tmp_path):
    # Portrait 64 wide x 128 high: red top quarter, orange middle half, blue bottom quarter.
    pixels = np.zeros((128, 64, 3), dtype=np.uint8)
    pixels[:32] = (255, 0, 0)
    pixels[32:96] = (200, 100, 50)
    pixels[96:] = (0, 0, 255)
    folder = tmp_path / "known"
    folder.mkdir()
    Image.fromarray(pixels).save(folder / "known.png")

    images, manifest = load_with_manifest(prepare_celeba(folder, size=32, out=tmp_path / "known.pt"))

    assert images.shape == (1, 1, 32, 32) and images.dtype == torch.uint8
    # Short side 64 -> 32 makes it 32x64; the center crop keeps rows 16..48 = the orange middle half.
    orange_luma = round(0.299 * 200 + 0.587 * 100 + 0.114 * 50)  # 124
    interior = images[0, 0, 3:29].int()
    assert (interior - orange_luma).abs().max() <= 1
    assert torch.equal(images[0], torchvision_reference(folder / "known.png", 32))
    assert manifest["source"] == "folder"


def test_prepared_images_equal_torchvision_on_each_pil_image(celeba_root, tmp_path):
    root = celeba_root(n=12)  # covers every fake size, including landscape and smaller than 32
    images, manifest = load_with_manifest(prepare_celeba(root, size=32, out=tmp_path / "c.pt"))
    image_dir = image_dir_of(root)
    for k, name in enumerate(manifest["files"]):
        assert torch.equal(images[k], torchvision_reference(image_dir / name, 32)), name


# --- ordering and layouts ---------------------------------------------------------------------------------------

def test_order_with_partition_file_is_partition_then_filename(celeba_root, tmp_path):
    root = celeba_root(n=20)
    table = partition_table(root)
    _, manifest = load_with_manifest(prepare_celeba(root, size=16, out=tmp_path / "c.pt"))
    assert manifest["files"] == sorted(table, key=lambda name: (table[name], name))
    assert manifest["files"] != sorted(table)  # the fixture's partitions are not in filename order
    assert manifest["partition_counts"] == {str(p): sum(v == p for v in table.values()) for p in (0, 1, 2)}
    assert "partition" in manifest["order"]


def test_order_without_partition_file_is_filename(celeba_root, tmp_path):
    root = celeba_root(n=15, with_partition=False)
    _, manifest = load_with_manifest(prepare_celeba(root, size=16, out=tmp_path / "c.pt"))
    assert manifest["files"] == [f"{k:06d}.jpg" for k in range(1, 16)]
    assert manifest["partition_counts"] is None and manifest["partition_file"] is None


def test_nested_and_flat_layouts_give_the_same_tensor(celeba_root, tmp_path):
    nested = prepare_celeba(celeba_root(n=10, nested=True), size=16, out=tmp_path / "nested.pt")
    flat = prepare_celeba(celeba_root(n=10, nested=False), size=16, out=tmp_path / "flat.pt")
    (a, ma), (b, mb) = load_with_manifest(nested), load_with_manifest(flat)
    assert torch.equal(a, b) and ma["sha256"] == mb["sha256"] and ma["source"] == mb["source"] == "celeba"


def test_root_may_be_the_img_align_celeba_folder_itself(celeba_root, tmp_path):
    root = celeba_root(n=8)
    _, manifest = load_with_manifest(prepare_celeba(image_dir_of(root), size=16, out=tmp_path / "c.pt"))
    assert manifest["source"] == "celeba" and manifest["partition_counts"] is not None


def test_folder_source_reads_jpg_and_png_sorted_by_name_and_ignores_other_files(tmp_path):
    folder = tmp_path / "faces"
    (folder / "subdir").mkdir(parents=True)
    rng = np.random.default_rng(1)
    names = ["b.png", "a.jpg", "c.JPG", "d.jpeg"]
    for name in names:
        Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(folder / name)
    Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(folder / "subdir" / "e.png")
    (folder / "notes.txt").write_text("not an image")

    images, manifest = load_with_manifest(prepare_celeba(folder, size=8, out=tmp_path / "f.pt"))
    assert manifest["source"] == "folder"
    assert manifest["files"] == sorted(names)
    assert images.shape == (4, 1, 8, 8)
    assert torch.equal(images[0], torchvision_reference(folder / "a.jpg", 8))


# --- cache and manifest -----------------------------------------------------------------------------------------

def test_default_output_goes_to_the_cache_and_a_second_call_reuses_it(celeba_root, isolated_diffmem_cache,
                                                                      monkeypatch):
    root = celeba_root(n=10)
    first = prepare_celeba(root, size=16)
    assert first.parent == isolated_diffmem_cache and first.name.startswith("celeba_16_")
    mtime = first.stat().st_mtime_ns

    def no_reading(path):
        raise AssertionError(f"the cached tensor should be reused, but {path} was read")

    with monkeypatch.context() as patch:
        patch.setattr(prepare_module, "read_image", no_reading)
        assert prepare_celeba(root, size=16) == first
    assert first.stat().st_mtime_ns == mtime

    # A changed file (new mtime) or another size is a new cache entry.
    touched = image_dir_of(root) / "000003.jpg"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    assert prepare_celeba(root, size=16, cache_dir=isolated_diffmem_cache) != first
    other_size = prepare_celeba(root, size=8)
    assert other_size != first and other_size.parent == isolated_diffmem_cache


def test_cache_dir_argument_wins_over_the_environment(celeba_root, tmp_path):
    out = prepare_celeba(celeba_root(n=4), size=8, cache_dir=tmp_path / "mine")
    assert out.parent == tmp_path / "mine" and manifest_path_for(out).is_file()


def test_manifest_describes_the_tensor(celeba_root, tmp_path):
    root = celeba_root(n=9)
    out = prepare_celeba(root, size=16, out=tmp_path / "sub" / "celeba16.pt")
    images, manifest = load_with_manifest(out)
    assert manifest_path_for(out) == tmp_path / "sub" / "celeba16.json"
    assert manifest["sha256"] == hashlib.sha256(images.numpy().tobytes()).hexdigest() == tensor_sha256(images)
    assert manifest["source"] == "celeba" and manifest["root"] == str(root.resolve())
    assert manifest["count"] == 9 and manifest["size"] == 16 and manifest["shape"] == [9, 1, 16, 16]
    assert manifest["n_skipped"] == 0 and sum(manifest["partition_counts"].values()) == 9
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    loaded = load_prepared(out)
    assert isinstance(loaded, ImageSet) and loaded.sha256 == manifest["sha256"] and len(loaded) == 9


def test_a_failed_save_leaves_no_file_behind(celeba_root, tmp_path, monkeypatch):
    def failing_save(obj, f):
        f.write(b"partial") if hasattr(f, "write") else Path(f).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        prepare_celeba(celeba_root(n=3), size=8, out=tmp_path / "out" / "c.pt")
    assert list((tmp_path / "out").iterdir()) == []


# --- errors -----------------------------------------------------------------------------------------------------

def corrupt(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def test_corrupt_jpeg_is_a_one_line_error_naming_the_file_and_nothing_is_written(celeba_root,
                                                                               isolated_diffmem_cache):
    root = celeba_root(n=8)
    corrupt(image_dir_of(root) / "000004.jpg")
    with pytest.raises(DataError, match=r"000004\.jpg.*skip_bad") as info:
        prepare_celeba(root, size=16)
    assert "\n" not in str(info.value)
    assert list(isolated_diffmem_cache.iterdir()) == []


def test_garbage_file_with_an_image_suffix_is_an_error(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "bad.png").write_bytes(b"this is not a png")
    with pytest.raises(DataError, match=r"bad\.png"):
        prepare_celeba(folder, size=8, out=tmp_path / "f.pt")


def test_skip_bad_skips_and_counts_unreadable_images(celeba_root, tmp_path):
    root = celeba_root(n=8, with_partition=False)
    corrupt(image_dir_of(root) / "000002.jpg")
    (image_dir_of(root) / "000005.jpg").write_bytes(b"garbage")
    out = prepare_celeba(root, size=16, skip_bad=True, out=tmp_path / "c.pt")
    images, manifest = load_with_manifest(out)
    assert manifest["n_skipped"] == 2 and manifest["skipped_files"] == ["000002.jpg", "000005.jpg"]
    assert manifest["count"] == 6 and images.shape == (6, 1, 16, 16)
    assert "000002.jpg" not in manifest["files"]
    assert manifest["sha256"] == tensor_sha256(images)
    # Reusing a tensor that skipped images needs skip_bad again.
    assert prepare_celeba(root, size=16, skip_bad=True, out=out) == out
    with pytest.raises(DataError, match="skipped 2 unreadable"):
        prepare_celeba(root, size=16, out=out)


def make_bad_root(tmp: Path, kind: str) -> Path:
    """A root that prepare_celeba must reject: missing, a file, a folder without images, an empty image folder."""
    if kind == "missing":
        return tmp / "missing"
    if kind == "file":
        (tmp / "a.zip").write_bytes(b"zip")
        return tmp / "a.zip"
    if kind == "no_images":
        (tmp / "wrong").mkdir()
        (tmp / "wrong" / "x.txt").write_text("not an image")
        return tmp / "wrong"
    (tmp / "empty" / "celeba" / "img_align_celeba").mkdir(parents=True)
    return tmp / "empty"


@pytest.mark.parametrize("kind, message", [
    ("missing", "does not exist"),
    ("file", "is a file"),
    ("no_images", "holds neither img_align_celeba"),
    ("empty_image_dir", "no .jpg/.png images"),
])
def test_missing_root_or_wrong_layout_is_a_one_line_error_naming_the_layout(tmp_path, kind, message):
    with pytest.raises(DataError, match=message) as info:
        prepare_celeba(make_bad_root(tmp_path, kind), size=16)
    assert "img_align_celeba" in str(info.value) and "\n" not in str(info.value)


def test_partition_file_errors(celeba_root, tmp_path):
    root = celeba_root(n=6)
    partition_file = image_dir_of(root).parent / "list_eval_partition.txt"
    lines = partition_file.read_text().splitlines()
    partition_file.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(DataError, match=r"1 images are not listed.*000001\.jpg"):
        prepare_celeba(root, size=8, out=tmp_path / "c.pt")
    partition_file.write_text("\n".join(lines[:2] + ["000003.jpg seven"] + lines[3:]) + "\n")
    with pytest.raises(DataError, match=r"list_eval_partition\.txt:3"):
        prepare_celeba(root, size=8, out=tmp_path / "c.pt")


def test_bad_size_and_out_arguments(celeba_root, tmp_path):
    root = celeba_root(n=3)
    with pytest.raises(DataError, match="positive integer"):
        prepare_celeba(root, size=0)
    with pytest.raises(DataError, match="tensor file path"):
        prepare_celeba(root, size=8, out=tmp_path / "x.json")


# --- load_images ------------------------------------------------------------------------------------------------

def test_load_images_from_a_root_prepares_into_the_cache_and_from_a_tensor_file(celeba_root, tmp_path):
    root = celeba_root(n=10)
    cfg = DataConfig(source="celeba", path=str(root), image_size=16, cache_dir=str(tmp_path / "cache"))
    from_root = load_images(cfg)
    assert from_root.images.shape == (10, 1, 16, 16) and from_root.images.dtype == torch.uint8
    assert len(list((tmp_path / "cache").glob("celeba_16_*.pt"))) == 1
    tensor_file = next((tmp_path / "cache").glob("*.pt"))
    from_file = load_images(dataclasses.replace(cfg, path=str(tensor_file), cache_dir=None))
    assert from_file.sha256 == from_root.sha256 == from_root.manifest["sha256"]
    assert torch.equal(from_file.images, from_root.images)


def test_load_images_rejects_a_size_mismatch(celeba_root, tmp_path):
    out = prepare_celeba(celeba_root(n=4), size=8, out=tmp_path / "c8.pt")
    with pytest.raises(DataError, match="holds 8x8 images but data.image_size = 16"):
        load_images(DataConfig(source="celeba", path=str(out), image_size=16))


def test_load_prepared_rejects_missing_manifest_and_tampered_tensor(celeba_root, tmp_path):
    out = prepare_celeba(celeba_root(n=4), size=8, out=tmp_path / "c.pt")
    images = torch.load(out, weights_only=True)
    images[0, 0, 0, 0] ^= 1
    torch.save(images, out)
    with pytest.raises(DataError, match="does not match its manifest"):
        load_prepared(out)
    manifest_path_for(out).unlink()
    with pytest.raises(DataError, match="no manifest"):
        load_prepared(out)
    with pytest.raises(DataError, match="does not exist"):
        load_prepared(tmp_path / "nothing.pt")


# --- embedded sources -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [16, 25, 32])
def test_lfw_faces_are_the_first_100_images_as_uint8(size):
    faces = load_images(DataConfig(source="lfw_faces", image_size=size))
    assert faces.images.shape == (100, 1, size, size) and faces.images.dtype == torch.uint8
    assert faces.sha256 == tensor_sha256(faces.images) and faces.manifest["source"] == "lfw_faces"
    if size == 25:  # native size: no resampling, just rounding to 0..255
        from skimage.data import lfw_subset
        expected = torch.from_numpy(np.round(lfw_subset()[:100] * 255).astype(np.uint8)).unsqueeze(1)
        assert torch.equal(faces.images, expected)


def test_digits_are_1797_images_with_full_range():
    digits = embedded_digits(8)
    assert digits.images.shape == (1797, 1, 8, 8) and digits.images.dtype == torch.uint8
    assert digits.images.max() == 255 and digits.images.min() == 0
    from sklearn.datasets import load_digits
    assert torch.equal(digits.images[:, 0], torch.from_numpy(np.round(load_digits().images / 16 * 255)).to(torch.uint8))
    assert embedded_digits(16).images.shape == (1797, 1, 16, 16)


def test_embedded_sources_are_deterministic():
    assert embedded_lfw_faces(16).sha256 == embedded_lfw_faces(16).sha256


# --- splits -----------------------------------------------------------------------------------------------------

def indexed_image_set(count: int, size: int = 4) -> ImageSet:
    """Image k has every pixel = k (mod 256) plus a unique tag in pixel (0, 0) and (0, 1), so rows are traceable."""
    images = torch.zeros((count, 1, size, size), dtype=torch.uint8)
    k = torch.arange(count)
    images[:, 0, 0, 0] = (k % 256).to(torch.uint8)
    images[:, 0, 0, 1] = (k // 256).to(torch.uint8)
    return ImageSet(images=images, sha256=tensor_sha256(images), manifest={"source": "test"})


def row_ids(images: torch.Tensor) -> set[int]:
    return set((images[:, 0, 0, 0].long() + 256 * images[:, 0, 0, 1].long()).tolist())


def test_train_subsets_are_disjoint_from_each_other_and_the_heldout_pool():
    image_set = indexed_image_set(1000)
    cfg = DataConfig(source="digits", n=64, n_heldout=100, order="source")
    heldout = make_splits(image_set, cfg).heldout
    assert row_ids(heldout) == set(range(900, 1000))
    seen: set[int] = set()
    for i in range(900 // 64):
        splits = make_splits(image_set, dataclasses.replace(cfg, subset_index=i))
        ids = row_ids(splits.train)
        assert ids == set(range(i * 64, (i + 1) * 64)) and splits.train_range == (i * 64, (i + 1) * 64)
        assert not ids & seen and not ids & row_ids(heldout)
        seen |= ids
    assert splits.heldout_range == (900, 1000)


def test_splits_are_deterministic_and_the_mean_is_the_train_sets_scalar_mean():
    faces = embedded_lfw_faces(16)
    cfg = DataConfig(source="lfw_faces", n=16, image_size=16, n_heldout=20, subset_index=2, order="source")
    a, b = make_splits(faces, cfg), make_splits(faces, cfg)
    assert isinstance(a, Splits)
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout) and torch.equal(a.mean, b.mean)
    assert torch.equal(a.train, faces.images[32:48]) and a.train.dtype == torch.uint8
    assert a.mean.shape == (1, 16, 16) and a.mean.dtype == torch.float32
    expected = faces.images[32:48].double().mean() / 255
    assert torch.allclose(a.mean, torch.full((1, 16, 16), float(expected)), atol=1e-6)


def test_a_shuffled_split_cuts_disjoint_blocks_of_one_seeded_permutation():
    image_set = indexed_image_set(1000)
    cfg = DataConfig(source="digits", n=64, n_heldout=100)  # data.order = "shuffled": the default
    assert cfg.order == "shuffled"
    order = np.random.default_rng(0).permutation(1000)
    pool = make_splits(image_set, cfg)
    assert row_ids(pool.heldout) == set(order[900:].tolist()) and pool.heldout_indices.tolist() == order[900:].tolist()
    seen: set[int] = set()
    for i in range(900 // 64):
        splits = make_splits(image_set, dataclasses.replace(cfg, subset_index=i))
        assert splits.train_indices.tolist() == order[i * 64:(i + 1) * 64].tolist()
        assert [int(v) for v in splits.train[:, 0, 0, 0]] == [int(v) % 256 for v in splits.train_indices]
        assert row_ids(splits.train) == set(splits.train_indices.tolist())
        ids = set(splits.train_indices.tolist())
        assert not ids & seen and not ids & set(pool.heldout_indices.tolist())
        seen |= ids
    other_seed = make_splits(image_set, dataclasses.replace(cfg, order_seed=1))
    assert other_seed.train_indices.tolist() != pool.train_indices.tolist()


@pytest.mark.parametrize("order", ["shuffled", "source"])
def test_the_control_block_is_another_block_of_the_training_part_and_split_pairs_share_it(order):
    image_set = indexed_image_set(1000)
    cfg = DataConfig(source="digits", n=64, n_heldout=100, order=order)  # 14 blocks of 64 in 900 images
    a, b = (make_splits(image_set, dataclasses.replace(cfg, subset_index=i)) for i in (0, 1))
    assert a.control_indices.tolist() == b.control_indices.tolist() and len(a.control) == 64
    assert not set(a.control_indices.tolist()) & (set(a.train_indices.tolist()) | set(a.heldout_indices.tolist()))
    assert a.pair_indices.tolist() == b.train_indices.tolist() and b.pair_indices.tolist() == a.train_indices.tolist()
    assert torch.equal(a.control, image_set.images[torch.from_numpy(a.control_indices)])
    last = make_splits(image_set, dataclasses.replace(cfg, subset_index=13))  # the train set is the last block
    assert set(last.control_indices.tolist()).isdisjoint(last.train_indices.tolist()) and len(last.control) == 64
    assert len(last.pair_indices) == 0
    one_block = make_splits(image_set, dataclasses.replace(cfg, n=600))  # 900 // 600 = 1 block: no control
    assert len(one_block.control) == 0 and len(one_block.control_indices) == 0


def test_control_block_is_the_last_block_or_the_one_before_it():
    assert [control_block(n, i) for n, i in ((1, 0), (2, 0), (2, 1), (5, 0), (5, 3), (5, 4))] == \
        [None, 1, 0, 4, 4, 3]


@pytest.mark.parametrize("total, expected", [(100, 50), (1797, 898), (202599, 50000), (3, 1)])
def test_the_default_heldout_pool_is_half_the_source_at_most_50000(total, expected):
    assert default_heldout(total) == expected
    splits = make_splits(indexed_image_set(total), DataConfig(source="digits", n=1))  # n_heldout = 0: the default
    assert splits.heldout_range == (total - expected, total) and len(splits.heldout) == expected


def test_the_embedded_sources_work_without_a_heldout_override():
    digits = make_splits(embedded_digits(8), DataConfig(source="digits", n=512, image_size=8))
    assert len(digits.heldout) == 898 and len(digits.train) == 512
    faces = make_splits(embedded_lfw_faces(16), DataConfig(source="lfw_faces", n=32, image_size=16))
    assert len(faces.heldout) == 50 and len(faces.train) == 32


def test_a_default_pool_too_small_for_n_says_how_to_change_it():
    with pytest.raises(DataError, match=r"chosen by the source: set data.n_heldout"):
        make_splits(embedded_lfw_faces(16), DataConfig(source="lfw_faces", n=64, image_size=16))


@pytest.mark.parametrize("changes, message", [
    ({"n": 950}, r"larger than the training part of source 'test' \(900 images"),
    ({"n": 300, "subset_index": 3}, r"hold 3 disjoint subsets .* use 0\.\.2"),
    ({"n_heldout": 1000}, r"has 1000 images"),
])
def test_split_errors_say_what_to_do(changes, message):
    cfg = dataclasses.replace(DataConfig(source="digits", n=64, n_heldout=100), **changes)
    with pytest.raises(DataError, match=message) as info:
        make_splits(indexed_image_set(1000), cfg)
    assert "\n" not in str(info.value)


# --- centering --------------------------------------------------------------------------------------------------

def test_to_model_and_back_round_trips_exactly():
    faces = embedded_lfw_faces(16)
    splits = make_splits(faces, DataConfig(source="lfw_faces", n=32, image_size=16, n_heldout=20))
    x = to_model(splits.train, splits.mean)
    assert x.shape == splits.train.shape and x.dtype == torch.float32
    assert abs(float(x.mean())) < 1e-5  # centered on the train set's mean
    assert torch.allclose(to_pixels(x, splits.mean), splits.train.float() / 255, atol=1e-6)
    assert torch.equal(to_uint8(x, splits.mean), splits.train)
    assert torch.equal(to_uint8(to_model(splits.heldout[:3], splits.mean), splits.mean), splits.heldout[:3])


def test_to_pixels_clamps_and_to_model_rejects_floats():
    mean = torch.full((1, 4, 4), 0.5)
    x = torch.tensor([-2.0, 0.0, 2.0]).view(3, 1, 1, 1).expand(3, 1, 4, 4)
    pixels = to_pixels(x, mean)
    assert pixels.min() == 0 and pixels.max() == 1 and torch.all(pixels[1] == 0.5)
    assert to_uint8(x, mean).dtype == torch.uint8 and int(to_uint8(x, mean)[1, 0, 0, 0]) == 128
    with pytest.raises(DataError, match="uint8"):
        to_model(x, mean)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_centering_keeps_the_device():
    mean = torch.full((1, 4, 4), 0.25)
    x = torch.randint(0, 256, (2, 1, 4, 4), dtype=torch.uint8, device="cuda")
    assert to_model(x, mean).device.type == "cuda" and to_uint8(to_model(x, mean), mean).device.type == "cuda"
    assert torch.equal(to_uint8(to_model(x, mean), mean), x)
