"""Unreadable images in folder trees (data.on_bad_image, data.scan_images, the cached scan) and the held-out
selection slice (data.holdout)."""

import builtins
import dataclasses
import functools
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

import vit.data.sources.registry as registry
import vit.data.sources.scan as scan_module
from vit.data import DataError, build_data, resources
from vit.data.sources.cifar import cifar_splits
from vit.data.sources.folders import scan_cache_dir
from vit.data.sources.registry import build_splits
from vit.data.sources.splits import targets_of
from vit.settings.data import DataSettings

# Odd names on purpose: spaces, non-ASCII letters (NFC), a name starting with a dash.
CLASSES = ("chat noir", "chien", "grenouille été")
NAMES = ("img 0.jpg", "ñandú 1.png", "-x 2.jpg", "日本 3.jpeg", "plain4.png", "café 5.jpg")


def _save(path: Path, seed: int, size: int = 12) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


def good_tree(root: Path, per_class: int = 6, val: str = "val", val_per_class: int = 2) -> Path:
    for split, count in (("train", per_class), (val, val_per_class)):
        for c, name in enumerate(CLASSES):
            for i in range(count):
                stem, suffix = os.path.splitext(NAMES[i % len(NAMES)])
                _save(root / split / name / f"{stem}-{i}{suffix}", seed=1000 * c + i + (0 if split == "train" else 500))
    return root


def _encoded(seed: int, fmt: str) -> bytes:
    path = Path(f"/tmp/_vit_scan_{os.getpid()}_{seed}.{fmt}")
    _save(path, seed, size=24)
    data = path.read_bytes()
    path.unlink()
    return data


def add_bad_files(root: Path) -> dict[str, str]:
    """Write one file of every kind of damage; {path relative to root: a word its reason must hold}."""
    jpeg, png = _encoded(1, "jpg"), _encoded(2, "png")
    idat = png.find(b"IDAT")
    corrupt_png = png[: idat + 20] + bytes(40) + png[idat + 60 :]
    bad = {
        "train/chien/truncated photo.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
        "train/chat noir/corrupt é.png": (corrupt_png, "corrupt"),
        "train/chien/empty.jpg": (b"", "empty"),
        "val/grenouille été/notes.jpg": (b"just some text, not a JPEG\n", "not an image"),
        "train/grenouille été/locked.png": (png, "permission denied"),  # made unreadable by deny_read()
    }
    for rel, (data, _) in bad.items():
        (root / rel).write_bytes(data)
    return {rel: word for rel, (_, word) in bad.items()}


@pytest.fixture
def deny_read(monkeypatch):
    """Files named locked.* raise PermissionError when opened, as a mode-000 file does for a normal user
    (the tests run as root, which chmod does not stop). Patches builtins.open, which PIL and read_rgb use."""
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, str | Path) and os.path.basename(file).startswith("locked."):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)


def folder_cfg(root, **extra):
    cfg = {
        "name": "imagefolder",
        "root": str(root),
        "img_size": 8,
        "batch_size": 2,
        "num_workers": 0,
        "loader": "torch",
        "augment": {"crop": "pad", "pad": 1, "hflip": True, "auto_augment": None},
    }
    cfg.update(extra)
    return cfg


def _all_images(root: Path, split: str) -> set[str]:
    return {str(p) for p in (root / split).rglob("*") if p.is_file()}


def count_decodes(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = scan_module.decode_image

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(scan_module, "decode_image", counting)
    return calls


# ---- the scan, data.on_bad_image ----


def test_error_mode_names_every_bad_file_its_reason_and_the_count(tmp_path, deny_read):
    root = good_tree(tmp_path / "tree")
    bad = add_bad_files(root)
    total = len(_all_images(root, "train") | _all_images(root, "val"))
    with pytest.raises(DataError) as err:
        build_data(folder_cfg(root))
    message = str(err.value)
    assert f"{len(bad)} of {total} image files cannot be read" in message
    assert "data.on_bad_image=skip" in message
    listed = {line.strip().split(": ", 1)[0]: line for line in message.splitlines()[1:]}
    assert set(listed) == set(bad)  # every bad file, and no good one (odd names included)
    for rel, word in bad.items():
        assert word in listed[rel].split(": ", 1)[1], listed[rel]


def test_error_lists_20_paths_but_counts_them_all(tmp_path):
    root = good_tree(tmp_path / "tree", per_class=2)
    for i in range(25):
        (root / "train" / "chien" / f"text {i:02d}.jpg").write_text("not an image")
    with pytest.raises(DataError) as err:
        build_data(folder_cfg(root))
    message = str(err.value)
    listed = [line for line in message.splitlines() if line.startswith("  train/")]
    assert len(listed) == 20 and len(set(listed)) == 20
    assert "25 of" in message and "and 5 more" in message


def test_skip_mode_trains_on_the_rest_and_logs_the_count(tmp_path, deny_read, caplog):
    root = good_tree(tmp_path / "tree")
    bad = add_bad_files(root)
    bad_paths = {str(root / rel) for rel in bad}
    with caplog.at_level(logging.WARNING, logger="vit.data"):
        bundle = build_data(folder_cfg(root, on_bad_image="skip"))
    train, val = bundle.train_loader.dataset.dataset, bundle.val_loader.dataset.dataset
    assert {p for p, _ in train.samples} == _all_images(root, "train") - bad_paths
    assert {p for p, _ in val.samples} == _all_images(root, "val") - bad_paths
    assert train.imgs == train.samples and train.targets == [t for _, t in train.samples]
    assert bundle.num_train == len(train.samples) and bundle.num_val == len(val.samples)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"leaving out {len(bad)} unreadable" in warnings[0]
    # Every remaining image decodes, through the loaders and one by one.
    assert sum(len(y) for _, y in bundle.val_loader) == bundle.num_val
    assert sum(len(y) for _, y in bundle.train_loader) == bundle.num_train // 2 * 2
    for dataset in (bundle.train_loader.dataset, bundle.val_loader.dataset):
        for i in range(len(dataset)):
            x, _ = dataset[i]
            assert x.shape == (3, 8, 8)
    # The second run reads the scan from its cache and leaves out the same files.
    again = build_data(folder_cfg(root, on_bad_image="skip")).train_loader.dataset.dataset
    assert again.samples == train.samples


def test_odd_names_simply_work(tmp_path):
    root = good_tree(tmp_path / "tree ü")
    bundle = build_data(folder_cfg(root))
    assert bundle.class_to_idx == {name: i for i, name in enumerate(sorted(CLASSES))}
    assert bundle.num_train == len(_all_images(root, "train"))
    assert sum(len(y) for _, y in bundle.val_loader) == len(_all_images(root, "val"))


def test_scan_runs_once_per_tree_and_again_when_a_file_changes(tmp_path, monkeypatch):
    root = good_tree(tmp_path / "tree")
    calls = count_decodes(monkeypatch)
    build_data(folder_cfg(root))
    assert sorted(calls) == sorted(_all_images(root, "train") | _all_images(root, "val"))
    cached = sorted((root / ".vit-cache").glob("scan-*.json"))
    assert len(cached) == 2 and all(json.loads(p.read_text())["bad"] == [] for p in cached)
    calls.clear()
    build_data(folder_cfg(root))
    assert calls == []  # nothing decoded again
    # A file rewritten in place (new size and mtime): its split is scanned again, and the damage is found.
    victim = root / "train" / "chien" / "img 0-0.jpg"
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(DataError, match="train/chien/img 0-0.jpg: truncated"):
        build_data(folder_cfg(root))
    assert sorted(calls) == sorted(_all_images(root, "train"))  # only the changed split
    _save(victim, seed=7)
    calls.clear()
    build_data(folder_cfg(root))
    assert len(calls) == len(_all_images(root, "train"))
    # Only the mtime changes (touch): scanned again.
    calls.clear()
    stat = victim.stat()
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    build_data(folder_cfg(root))
    assert len(calls) == len(_all_images(root, "train"))
    # An added file: scanned again.
    calls.clear()
    _save(root / "val" / "chien" / "new one.png", seed=8)
    build_data(folder_cfg(root))
    assert sorted(calls) == sorted(_all_images(root, "val"))
    # One result per split is kept, written whole (no temporary files left behind).
    assert len([p for p in (root / ".vit-cache").iterdir() if p.name != resources.LOCK_FILE]) == 2


def test_cached_result_still_reports_the_bad_files(tmp_path, monkeypatch):
    root = good_tree(tmp_path / "tree", per_class=2)
    (root / "train" / "chien" / "fake.jpg").write_text("text")
    total = len(_all_images(root, "train") | _all_images(root, "val"))
    with pytest.raises(DataError, match=f"(?s)1 of {total} image files.*train/chien/fake.jpg: not an image"):
        build_data(folder_cfg(root))
    calls = count_decodes(monkeypatch)
    with pytest.raises(DataError, match=f"(?s)1 of {total} image files.*train/chien/fake.jpg: not an image"):
        build_data(folder_cfg(root))
    assert calls == []  # from the cache


def test_scan_cache_leaves_a_read_only_tree_alone(tmp_path, monkeypatch):
    root = good_tree(tmp_path / "tree", per_class=2)
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == root else writable(path, mode))
    assert scan_cache_dir(DataSettings(cache_dir=str(tmp_path / "c")), root) == tmp_path / "c"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert scan_cache_dir(DataSettings(), root) == tmp_path / "xdg" / "vit" / "scan"
    build_data(folder_cfg(root))
    assert not (root / ".vit-cache").exists() and len(list((tmp_path / "xdg" / "vit" / "scan").glob("scan-*"))) == 2


def test_scan_images_false_skips_the_scan(tmp_path, monkeypatch):
    root = good_tree(tmp_path / "tree", per_class=2)
    (root / "train" / "chien" / "fake.jpg").write_text("text")
    calls = count_decodes(monkeypatch)
    bundle = build_data(folder_cfg(root, scan_images=False))
    assert calls == [] and bundle.num_train == len(_all_images(root, "train"))  # the bad file is kept
    assert not (root / ".vit-cache").exists()


def test_bad_on_bad_image_value_is_named(tmp_path):
    root = good_tree(tmp_path / "tree", per_class=2)
    with pytest.raises(DataError, match=r"data.on_bad_image='ignore' must be one of \('error', 'skip'\)"):
        build_data(folder_cfg(root, on_bad_image="ignore"))


@pytest.mark.parametrize("split", ["train", "val"])
def test_empty_class_folder_is_named_with_its_split(tmp_path, split):
    root = good_tree(tmp_path / "tree", per_class=2)
    for name in ("train", "val"):
        (root / name / "zèbre").mkdir()
        _save(root / name / "zèbre" / "z.png", seed=3)
    (root / split / "zèbre" / "z.png").unlink()
    (root / split / "zèbre" / "readme.txt").write_text("not an image extension")
    with pytest.raises(DataError, match=f"class folder {split}/zèbre/ holds no image files"):
        build_data(folder_cfg(root))


def test_skip_that_empties_a_class_is_named(tmp_path):
    root = good_tree(tmp_path / "tree", per_class=2)
    for path in (root / "train" / "chien").iterdir():
        path.write_bytes(b"")
    with pytest.raises(DataError, match="class folder train/chien/ has no readable image left"):
        build_data(folder_cfg(root, on_bad_image="skip"))


def test_unreadable_paths_and_reasons_from_the_scan_function(tmp_path, deny_read):
    root = good_tree(tmp_path / "tree", per_class=1)
    bad = add_bad_files(root)
    paths = sorted(str(p) for p in (root / "train").rglob("*") if p.is_file())
    found = scan_module.find_unreadable(paths, root / "train", workers=3)
    expected = {str(root / rel): word for rel, word in bad.items() if rel.startswith("train/")}
    assert set(found) == set(expected)
    assert all(word in found[path] for path, word in expected.items())


# ---- data.holdout ----


def _paths(dataset) -> list[str]:
    base, indices = dataset, None
    while hasattr(base, "indices"):
        indices = np.asarray(base.indices) if indices is None else np.asarray(base.indices)[indices]
        base = base.dataset
    return [base.samples[i][0] for i in (range(len(base.samples)) if indices is None else indices)]


def test_holdout_imagefolder_is_a_fixed_balanced_slice_of_train(tmp_path):
    root = good_tree(tmp_path / "tree", per_class=10, val="test")
    cfg = folder_cfg(root, holdout=6)
    plain = build_splits(folder_cfg(root), seed=0)
    assert plain.val_name == "test"
    a, b = build_splits(cfg, seed=1), build_splits(cfg, seed=7)
    assert a.val_name == "holdout" and _paths(a.val) == _paths(b.val) and _paths(a.train) == _paths(b.train)
    train, held = set(_paths(a.train)), set(_paths(a.val))
    assert len(held) == 6 and len(train) == 24 and not train & held
    assert train | held == _all_images(root, "train")
    assert np.bincount(targets_of(a.val), minlength=3).tolist() == [2, 2, 2]
    for dataset in (a.train, a.val):  # the targets carried by the subset are those of its images
        assert targets_of(dataset).tolist() == [dataset[i][1] for i in range(len(dataset))]


def test_holdout_gets_the_val_transform(tmp_path):
    root = good_tree(tmp_path / "tree", per_class=10)
    cfg = folder_cfg(root, holdout=0.2, augment={"crop": "rrc", "hflip": True, "auto_augment": "trivial"})
    bundle = build_data(cfg)
    assert bundle.num_val == 6 and bundle.num_train == 24
    first, second = (torch.cat([x for x, _ in bundle.val_loader]) for _ in range(2))
    assert torch.equal(first, second)  # not augmented


def test_holdout_fraction_on_arrays_keeps_images_and_labels_together():
    cfg = {"name": "synthetic", "img_size": 8, "batch_size": 16, "num_workers": 0, "augment": {"crop": "none"}}
    cfg["synthetic"] = {"num_train": 200, "num_val": 40}
    full = build_splits(cfg, seed=3)
    splits = build_splits({**cfg, "holdout": 0.25}, seed=3)
    assert splits.val_name == "holdout" and len(splits.val) == 50 and len(splits.train) == 150
    for dataset, (images, labels) in ((splits.train, splits.train_array), (splits.val, splits.val_array)):
        assert len(images) == len(labels) == len(dataset)
        for i in range(0, len(dataset), 7):
            image, label = dataset[i]
            assert np.array_equal(np.asarray(image), images[i]) and label == labels[i]
    # Each class held out in proportion to its size (the synthetic classes are not exactly balanced).
    sizes = np.bincount(targets_of(full.train), minlength=10)
    held = np.bincount(splits.val_array[1], minlength=10)
    assert held.sum() == 50 and (np.abs(held - 50 * sizes / sizes.sum()) < 1).all()
    # Both loaders see the same held-out images.
    gpu = build_data({**cfg, "holdout": 0.25, "loader": "resident"}, seed=3)
    cpu = build_data({**cfg, "holdout": 0.25, "loader": "torch"}, seed=3)
    assert gpu.num_val == cpu.num_val == 50
    torch.testing.assert_close(torch.cat([x for x, _ in gpu.val_loader]), torch.cat([x for x, _ in cpu.val_loader]))


class FakeCifar(Dataset):
    """Stands in for torchvision's CIFAR10 (which needs the real, checksummed files)."""

    base_folder = "cifar-10-batches-py"

    def __init__(self, root, train=True, download=False):
        rng = np.random.default_rng(0 if train else 1)
        count = 300 if train else 50
        self.data = rng.integers(0, 255, (count, 8, 8, 3), dtype=np.uint8)
        self.targets = [i % 10 for i in range(count)]
        self.class_to_idx = {f"c{i}": i for i in range(10)}

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return Image.fromarray(self.data[index]), self.targets[index]


def use_fake_cifar(monkeypatch) -> None:
    """data=cifar10 reads FakeCifar in place of torchvision's class."""
    entry = registry.DATASETS["cifar10"]
    fake = dataclasses.replace(entry, splits=functools.partial(cifar_splits, torchvision_class=FakeCifar))
    monkeypatch.setitem(registry.DATASETS, "cifar10", fake)


def test_holdout_cifar_same_images_for_every_seed_and_disjoint(monkeypatch, tmp_path):
    use_fake_cifar(monkeypatch)
    cfg = {"name": "cifar10", "root": str(tmp_path), "img_size": 8, "download": False, "holdout": 50}
    a, b = build_splits(cfg, seed=0), build_splits(cfg, seed=5)
    assert build_splits({**cfg, "holdout": None}).val_name == "test" and a.val_name == "holdout"
    assert a.val.indices == b.val.indices and a.train.indices == b.train.indices
    assert not set(a.val.indices) & set(a.train.indices) and len(a.val) + len(a.train) == 300
    assert np.bincount(a.val_array[1], minlength=10).tolist() == [5] * 10
    assert np.array_equal(a.val_array[0], FakeCifar(None).data[a.val.indices])
    # With the sample limits, the limited holdout is still the same images for every seed.
    limited = {**cfg, "limit_train_samples": 100, "limit_val_samples": 20}
    c, d = build_splits(limited, seed=0), build_splits(limited, seed=9)
    assert len(c.train) == 100 and len(c.val) == 20 and np.array_equal(c.val_array[0], d.val_array[0])
    assert not set(_indices(c.val)) & set(_indices(c.train))


def _indices(subset) -> list[int]:
    return [subset.dataset.indices[i] for i in subset.indices]


@pytest.mark.parametrize("value", [0, -3, 0.0, 1.0, 1.5, "abc", True, [5], 300, 291])
def test_bad_holdout_values_are_named(monkeypatch, tmp_path, value):
    use_fake_cifar(monkeypatch)
    cfg = {"name": "cifar10", "root": str(tmp_path), "img_size": 8, "download": False, "holdout": value}
    with pytest.raises(DataError, match=r"data\.holdout="):
        build_splits(cfg)


def test_holdout_as_large_as_allowed_keeps_one_image_per_class(monkeypatch, tmp_path):
    use_fake_cifar(monkeypatch)
    cfg = {"name": "cifar10", "root": str(tmp_path), "img_size": 8, "download": False, "holdout": 290}
    splits = build_splits(cfg)
    assert len(splits.val) == 290 and sorted(splits.train_array[1].tolist()) == list(range(10))
