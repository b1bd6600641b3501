"""The datasets behind `data.name`: CIFAR-10/100 (torchvision), ImageNet-style folders, synthetic images, and
Hugging Face datasets (vit/data/sources/hf.py).

Each builder returns the train and val datasets (without transforms; the loader adds them) and the
class-to-index map that is saved with every checkpoint. Image folders are scanned for files that cannot be
decoded (`data.on_bad_image`, `data.scan_images`), and `data.holdout` turns a fixed slice of the training
set into the validation split, so that epochs and settings are never chosen by their test accuracy.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import datasets as tv_datasets

from vit.data.declared import complete
from vit.data.images import read_rgb
from vit.data.resources import cache_folder, num_workers
from vit.data.sources.archive import ArchiveError, extract_archive, is_archive
from vit.data.sources.scan import find_unreadable
from vit.errors import UserError

VAL_SPLIT_NAMES = ("val", "validation", "test")
# webdataset (streamed tar shards) is routed by vit/data/loading/build.py before build_splits; listed here for the
# messages.
DATASET_NAMES = ("cifar10", "cifar100", "imagefolder", "synthetic", "hf", "webdataset")
BAD_IMAGE_MODES = ("error", "skip")
BAD_IMAGES_LISTED = 20  # paths named in the data.on_bad_image=error message; the count covers all of them
HOLDOUT_SEED = 0  # fixed, not trainer.seed: every run holds out the same images
HOLDOUT_NAME = "holdout"

log = logging.getLogger("vit.data")


class DataError(UserError):
    """A data setting that cannot work: one message naming the key, value or path, and how to fix it."""

    kind = "data"


@dataclass
class Splits:
    train: Dataset
    val: Dataset
    class_to_idx: dict[str, int]
    # uint8 (N, H, W, 3) arrays of the whole split when the dataset already holds them (CIFAR, synthetic):
    # the GPU loader uses them without decoding anything.
    train_array: tuple[np.ndarray, np.ndarray] | None = None
    val_array: tuple[np.ndarray, np.ndarray] | None = None
    # Where the GPU loader may keep its decoded .npy files by default: the folder holding train/ (after any
    # archive extraction), or the CIFAR root.
    root: Path | None = None
    # What `val` is, for labelling its accuracy: "holdout" (data.holdout: a slice of the training set, the
    # one to select epochs and settings on), else the split it came from: "test" (CIFAR), the folder name
    # (imagefolder: val, validation or test), "val" (synthetic).
    val_name: str = "val"
    # With data.holdout: the split `val` was before (its name in `test_name`), evaluated once after training.
    test: Dataset | None = None
    test_array: tuple[np.ndarray, np.ndarray] | None = None
    test_name: str | None = None


def _cifar(cfg, name: str) -> Splits:
    root = Path(cfg.get("root") or "data").expanduser()
    cls = tv_datasets.CIFAR10 if name == "cifar10" else tv_datasets.CIFAR100
    folder = root / cls.base_folder
    if root.is_file():
        kind = "an archive" if is_archive(root) else "a file"
        raise DataError(
            f"data.root={str(root)!r} is {kind}: data={name} reads torchvision's {cls.base_folder} folder; for image "
            "folders (or an archive of them, as scripts/make_cifar_jpegs.py writes) use data=imagefolder"
        )
    try:
        train = cls(str(root), train=True, download=bool(cfg.download))
        val = cls(str(root), train=False, download=False)
    except Exception as err:  # RuntimeError "Dataset not found", URLError offline, corrupt files
        raise DataError(
            f"data.root={str(root)!r}: no {name} found at {folder.resolve()} and it could not be downloaded "
            f"({type(err).__name__}: {err}). Point data.root at a folder that holds {cls.base_folder}, or use "
            f"data=imagefolder data.root=<folder or archive with train/ and test/>"
        ) from err
    return Splits(
        train,
        val,
        dict(train.class_to_idx),
        (train.data, np.asarray(train.targets, dtype=np.int64)),
        (val.data, np.asarray(val.targets, dtype=np.int64)),
        root=root,
        val_name="test",
    )


def find_tree_root(root: Path) -> Path:
    """The folder holding `train/`: `root` itself, or its only subfolder that holds one (archives often
    wrap the tree in a folder named after the dataset)."""
    if (root / "train").is_dir():
        return root
    candidates = [p for p in root.iterdir() if p.is_dir() and (p / "train").is_dir()] if root.is_dir() else []
    if len(candidates) == 1:
        return candidates[0]
    raise DataError(
        f"data.root={str(root)!r} has no train/ folder (expected <root>/train/<class>/* and "
        f"<root>/{{{','.join(VAL_SPLIT_NAMES)}}}/<class>/*)"
    )


def _imagefolder(cfg) -> Splits:
    if not cfg.get("root"):
        raise DataError("data.root is not set: data=imagefolder needs data.root=<folder or .tar/.tar.gz/.zip>")
    root = Path(cfg["root"]).expanduser().resolve()
    if not root.exists():
        raise DataError(f"data.root={str(root)!r} does not exist")
    if is_archive(root):
        try:
            root = extract_archive(root, cfg.get("cache_dir"))
        except ArchiveError as err:
            raise DataError(f"data.root: {err}") from err
    if cfg.get("unlabelled"):
        return _unlabelled_folder(cfg, root)
    root = find_tree_root(root)
    val_name = cfg.get("val_split")
    if val_name is None:
        val_name = next((n for n in VAL_SPLIT_NAMES if (root / n).is_dir()), None)
        if val_name is None:
            raise DataError(f"data.root={str(root)!r} has no val/, validation/ or test/ folder; set data.val_split")
    elif not (root / val_name).is_dir():
        raise DataError(f"data.val_split={val_name!r}: {root / val_name} does not exist")
    on_bad = cfg.get("on_bad_image") or "error"
    if on_bad not in BAD_IMAGE_MODES:
        raise DataError(f"data.on_bad_image={on_bad!r} must be one of {BAD_IMAGE_MODES}")
    try:
        # allow_empty: an empty class folder is reported below by its split and name.
        train = tv_datasets.ImageFolder(str(root / "train"), loader=read_rgb, allow_empty=True)
        val = tv_datasets.ImageFolder(str(root / val_name), loader=read_rgb, allow_empty=True)
    except (FileNotFoundError, RuntimeError) as err:
        raise DataError(f"data.root={str(root)!r}: {err}") from err
    if val.class_to_idx != train.class_to_idx:
        missing = sorted(set(train.classes) ^ set(val.classes))
        raise DataError(
            f"data.root={str(root)!r}: the classes of train/ and {val_name}/ differ ({', '.join(missing[:10])}); "
            "both splits need the same class folders"
        )
    for split, dataset in (("train", train), (val_name, val)):
        _check_no_empty_class(root, split, dataset, "holds no image files")
    if cfg.scan_images:
        _drop_unreadable(cfg, root, {"train": train, val_name: val}, on_bad)
    _say_if_upsampled(train.samples, int(cfg.get("img_size") or 0))
    return Splits(train, val, dict(train.class_to_idx), root=root, val_name=val_name)


UPSAMPLED_NOTICE_RATIO = 2  # data.img_size at least this many times the images' longer side: said in one line


def _say_if_upsampled(samples: list[tuple[str, int]], img_size: int) -> None:
    """One line when data.img_size is far above the images' own size (CIFAR's 32 px JPEGs at the image-folder
    default of 224 cost 49x the compute for no new pixels). The size of 8 images spread over the split, from
    their headers: nothing is decoded."""
    if not samples or img_size <= 0:
        return
    sides = []
    for path, _ in samples[:: max(1, len(samples) // 8)][:8]:
        try:
            with Image.open(path) as image:
                sides.append(max(image.size))
        except Exception:  # an unreadable file is the scan's to report
            continue
    if sides and img_size >= UPSAMPLED_NOTICE_RATIO * (side := int(np.median(sides))):
        log.warning(
            "data.img_size=%d but the training images are about %d px on their longer side: each is upsampled "
            "%.0fx (as fine-tuning weights trained at that size wants); to train at their own size set "
            "data.img_size=%d (and data.patch_size to match, e.g. 4 for 32 px)",
            img_size, side, img_size / side, side,
        )  # fmt: skip


class UnlabelledImages(Dataset):
    """Every image file under `folder`, at any depth and in any layout, each with the label 0 (one class,
    "images"): pretraining data, where the folders say nothing. Sorted paths, so every run sees the same order."""

    def __init__(self, folder: Path) -> None:
        extensions = tuple(tv_datasets.folder.IMG_EXTENSIONS)
        paths = sorted(str(p) for p in folder.rglob("*") if p.suffix.lower() in extensions and p.is_file())
        self.samples = [(path, 0) for path in paths]
        self.imgs = self.samples
        self.targets = [0] * len(paths)
        self.classes, self.class_to_idx = ["images"], {"images": 0}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        return read_rgb(path), target


def _unlabelled_folder(cfg, root: Path) -> Splits:
    """data.unlabelled=true: the images under data.root whatever their folders. A tree with train/ and a
    validation folder keeps that split (class folders inside are fine, and ignored); train/ alone, or any other
    folder, is one pool, and the validation images are `data.holdout` of it."""
    try:
        tree = find_tree_root(root)
    except DataError:
        tree = None
    val_name = cfg.get("val_split")
    if val_name is not None and (tree is None or not (tree / val_name).is_dir()):
        raise DataError(f"data.val_split={val_name!r}: {(tree or root) / val_name} does not exist")
    if tree is not None and val_name is None:
        val_name = next((n for n in VAL_SPLIT_NAMES if (tree / n).is_dir()), None)
    if tree is not None and val_name is not None:
        splits = {"train": UnlabelledImages(tree / "train"), val_name: UnlabelledImages(tree / val_name)}
    elif cfg.get("holdout") is None:
        raise DataError(
            f"data.root={str(root)!r} has no train/ and val/ folders to split by: with data.unlabelled=true set "
            "data.holdout=<n> (or a fraction) to validate on that many of its images"
        )
    elif tree is not None:  # train/ alone: its images are the pool
        splits = {"train": UnlabelledImages(tree / "train")}
    else:
        tree = root
        splits = {".": UnlabelledImages(tree)}
    for split, dataset in splits.items():
        if not len(dataset):
            shown = str(tree / split) if split != "." else str(tree)
            raise DataError(
                f"data.root: {shown!r} holds no image files ({', '.join(tv_datasets.folder.IMG_EXTENSIONS)})"
            )
    on_bad = cfg.get("on_bad_image") or "error"
    if on_bad not in BAD_IMAGE_MODES:
        raise DataError(f"data.on_bad_image={on_bad!r} must be one of {BAD_IMAGE_MODES}")
    if cfg.scan_images:
        _drop_unreadable(cfg, tree, splits, on_bad)
    train = splits.get("train", splits.get("."))
    val = splits.get(val_name) if val_name else None
    return Splits(train, val, dict(train.class_to_idx), root=tree, val_name=val_name or "val")


def _printable(path: str) -> str:
    """A path as text that can always be printed (undecodable bytes in a name shown as escapes)."""
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_no_empty_class(root: Path, split: str, dataset: tv_datasets.ImageFolder, why: str) -> None:
    counts = np.bincount(np.asarray(dataset.targets, dtype=np.int64), minlength=len(dataset.classes))
    empty = [f"{split}/{_printable(c)}/" for c, n in zip(dataset.classes, counts, strict=True) if n == 0]
    if empty:
        raise DataError(
            f"data.root={str(root)!r}: class folder {', '.join(empty)} {why} "
            f"({', '.join(tv_datasets.folder.IMG_EXTENSIONS)}); every class needs images in train/ and "
            f"the validation split: add some, or remove the class folder from every split"
        )


def scan_cache_dir(cfg, root: Path) -> Path:
    """Where the scan results of the tree under `root` are kept (vit/data/resources.py's rule)."""
    return cache_folder(cfg, root, "scan")


def _drop_unreadable(cfg, root: Path, splits: dict[str, tv_datasets.ImageFolder], on_bad: str) -> None:
    """Scan every split (cached); `error`: raise naming the unreadable files; `skip`: drop them and warn."""
    workers = max(1, num_workers(cfg))  # threads; 0 loader workers still scans with one
    cache_dir = scan_cache_dir(cfg, root)
    bad = {
        split: find_unreadable([p for p, _ in ds.samples], root / split, workers=workers, cache_dir=cache_dir)
        for split, ds in splits.items()
    }
    rows = [(os.path.relpath(p, root), why) for found in bad.values() for p, why in sorted(found.items())]
    if not rows:
        return
    total = sum(len(ds.samples) for ds in splits.values())
    listed = "\n".join(f"  {_printable(rel)}: {why}" for rel, why in rows[:BAD_IMAGES_LISTED])
    more = f"\n  ... and {len(rows) - BAD_IMAGES_LISTED} more" if len(rows) > BAD_IMAGES_LISTED else ""
    if on_bad == "error":
        shown = f"the first {BAD_IMAGES_LISTED}" if len(rows) > BAD_IMAGES_LISTED else "listed"
        raise DataError(
            f"data.root={str(root)!r}: {len(rows)} of {total} image files cannot be read ({shown} below). "
            f"Fix or delete them, or set data.on_bad_image=skip to train on the rest:\n{listed}{more}"
        )
    per_split = ", ".join(f"{split}: {len(found)}" for split, found in bad.items() if found)
    log.warning(
        "data.on_bad_image=skip: leaving out %d unreadable image files of %d (%s):\n%s%s",
        len(rows),
        total,
        per_split,
        listed,
        more,
    )
    for split, dataset in splits.items():
        if bad[split]:
            dataset.samples = [s for s in dataset.samples if s[0] not in bad[split]]
            dataset.imgs = dataset.samples
            dataset.targets = [target for _, target in dataset.samples]
            _check_no_empty_class(root, split, dataset, "has no readable image left after data.on_bad_image=skip")


class SyntheticImages(Dataset):
    """Images with a learnable class signal: each class a fixed smooth colour pattern, plus noise.

    The class patterns are the same for every seed (train and val must share them); the labels and the
    per-pixel Gaussian noise (std `noise`, on a [0, 1] scale) come from `seed`. A tiny ViT on a CPU learns
    it well above chance in a couple of epochs.
    """

    def __init__(self, num_samples: int, num_classes: int, img_size: int, seed: int, noise: float = 0.35):
        generator = torch.Generator().manual_seed(seed)
        pattern_gen = torch.Generator().manual_seed(12345)  # the same class patterns for train and val
        # (classes, 3, 4, 4) random colours upsampled to the image: low-frequency, patch-friendly signal.
        coarse = torch.rand(num_classes, 3, 4, 4, generator=pattern_gen)
        patterns = torch.nn.functional.interpolate(coarse, size=(img_size, img_size), mode="bilinear")
        self.targets = torch.randint(0, num_classes, (num_samples,), generator=generator)
        noise_t = noise * torch.randn(num_samples, 3, img_size, img_size, generator=generator)
        images = (patterns[self.targets] + noise_t).clamp(0, 1)
        self.data = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()  # NHWC
        self.classes = [f"class_{i}" for i in range(num_classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return Image.fromarray(self.data[index]), int(self.targets[index])


def _synthetic(cfg, seed: int) -> Splits:
    spec = cfg.synthetic
    num_classes, img_size = int(cfg.num_classes), int(cfg.img_size)
    noise = float(spec.get("noise", 0.35))  # the class signal's noise: a property of the generator, not a knob
    train = SyntheticImages(int(spec.num_train), num_classes, img_size, seed=seed, noise=noise)
    val = SyntheticImages(int(spec.num_val), num_classes, img_size, seed=seed + 1, noise=noise)
    return Splits(
        train,
        val,
        train.class_to_idx,
        (train.data, train.targets.numpy()),
        (val.data, val.targets.numpy()),
        val_name="val",
    )


def targets_of(dataset: Dataset) -> np.ndarray:
    if isinstance(dataset, Subset):
        return targets_of(dataset.dataset)[np.asarray(dataset.indices)]
    return np.asarray(dataset.targets, dtype=np.int64)


def balanced_subset_indices(targets: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """`limit` indices with the classes as equally represented as possible, fixed by the seed."""
    rng = np.random.default_rng(seed)
    classes = np.unique(targets)
    per_class = math.ceil(limit / len(classes))
    chosen = [rng.permutation(np.flatnonzero(targets == c))[:per_class] for c in classes]
    picked = np.concatenate(chosen)
    return np.sort(rng.permutation(picked)[:limit])


def limit_split(dataset: Dataset, array, limit: int | None, seed: int):
    if not limit or limit >= len(dataset):
        return dataset, array
    indices = balanced_subset_indices(targets_of(dataset), int(limit), seed)
    subset = Subset(dataset, indices.tolist())
    subset.targets = targets_of(dataset)[indices]  # type: ignore[attr-defined]
    if array is not None:
        array = (array[0][indices], array[1][indices])
    return subset, array


def parse_holdout(value) -> int | float | None:
    """data.holdout as None, an image count (int >= 1) or a fraction (float in (0, 1))."""
    if value is None:
        return None
    text = f"data.holdout={value!r} must be null, a count of training images (an int >= 1) or a fraction in (0, 1)"
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise DataError(text) from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataError(text)
    if isinstance(value, numbers.Integral):
        if value < 1:
            raise DataError(text)
        return int(value)
    if not 0 < value < 1:
        raise DataError(text)
    return float(value)


def holdout_indices(targets: np.ndarray, count: int, seed: int = HOLDOUT_SEED) -> np.ndarray:
    """`count` indices, each class held out in proportion to its size (equal counts for balanced classes,
    then the remainder to the classes with the largest fractional share), never a class's last image;
    which images within a class is fixed by `seed`. Sorted."""
    targets = np.asarray(targets)
    classes, sizes = np.unique(targets, return_counts=True)
    if not 0 <= count <= int((sizes - 1).sum()):
        raise ValueError(f"cannot hold out {count} of {len(targets)} images and keep one per class")
    share = count * sizes / sizes.sum()
    quota = np.floor(share).astype(np.int64)
    order = sorted(range(len(classes)), key=lambda i: (-(share[i] - quota[i]), i))
    while quota.sum() < count:
        for i in order:
            if quota.sum() < count and quota[i] < sizes[i] - 1:
                quota[i] += 1
    rng = np.random.default_rng(seed)
    chosen = [rng.permutation(np.flatnonzero(targets == c))[:q] for c, q in zip(classes, quota, strict=True)]
    return np.sort(np.concatenate(chosen))


def _subset(dataset: Dataset, indices: np.ndarray) -> Subset:
    subset = Subset(dataset, indices.tolist())
    subset.targets = targets_of(dataset)[indices]  # type: ignore[attr-defined]
    return subset


def hold_out(splits: Splits, holdout: int | float) -> Splits:
    """The validation split becomes a fixed, class-balanced slice of the training set, removed from it."""
    targets = targets_of(splits.train)
    size, num_classes = len(targets), len(np.unique(targets))
    count = holdout if isinstance(holdout, int) else round(holdout * size)
    if count < 1 or count > size - num_classes:
        raise DataError(
            f"data.holdout={holdout!r} holds out {count} of the {size} training images: it must hold out at "
            f"least 1 and leave every one of the {num_classes} classes at least one training image "
            f"(at most {size - num_classes})"
        )
    held = holdout_indices(targets, count)
    keep = np.setdiff1d(np.arange(size), held)
    splits.test, splits.test_array, splits.test_name = splits.val, splits.val_array, splits.val_name
    array = splits.train_array
    splits.train, splits.val = _subset(splits.train, keep), _subset(splits.train, held)
    if array is not None:
        splits.train_array = (array[0][keep], array[1][keep])
        splits.val_array = (array[0][held], array[1][held])
    else:
        splits.val_array = None
    splits.val_name = HOLDOUT_NAME
    return splits


def build_splits(cfg, seed: int = 0) -> Splits:
    cfg = complete(cfg)  # a hand-built config's missing keys: as configs/data/<name>.yaml declares them
    name = cfg.get("name")
    holdout = parse_holdout(cfg.get("holdout"))  # before any data is read: a typo fails at once
    if name in ("cifar10", "cifar100"):
        splits = _cifar(cfg, name)
    elif name == "imagefolder":
        splits = _imagefolder(cfg)
    elif name == "synthetic":
        splits = _synthetic(cfg, seed)
    elif name == "hf":
        from vit.data.sources.hf import (
            build_hf_splits,  # imported here: it imports this module, and the datasets library
        )

        splits = build_hf_splits(cfg)
    else:
        raise DataError(f"data.name={name!r} must be one of {DATASET_NAMES}")
    val_seed = seed + 1
    if holdout is not None:
        splits = hold_out(splits, holdout)
        val_seed = HOLDOUT_SEED + 1  # a limited holdout is also the same images in every run
    splits.train, splits.train_array = limit_split(
        splits.train, splits.train_array, cfg.get("limit_train_samples"), seed
    )
    splits.val, splits.val_array = limit_split(splits.val, splits.val_array, cfg.get("limit_val_samples"), val_seed)
    return splits
