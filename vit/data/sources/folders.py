"""ImageNet-style image folders (`data=imagefolder`): data.root (or a .tar/.tar.gz/.zip archive of it, extracted once
into the cache) holding train/<class>/* and val/, validation/ or test/ with the same class folders; with
data.unlabelled=true any tree of images, as one class.

The folders are scanned for files that cannot be decoded (`data.on_bad_image`, `data.scan_images`) before training
starts, so a bad file is named at once and not in the middle of an epoch.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tv_datasets

from vit.data.augment.policies import SMALL_PHOTOS_POLICY
from vit.data.errors import DataError
from vit.data.images import read_rgb
from vit.data.resources import cache_folder, num_workers
from vit.data.sources.archive import ArchiveError, extract_archive, is_archive
from vit.data.sources.scan import find_unreadable
from vit.data.sources.splits import Splits
from vit.settings.data import DataSettings, ImageFolderSettings

VAL_SPLIT_NAMES = ("val", "validation", "test")
BAD_IMAGES_LISTED = 20  # paths named in the data.on_bad_image=error message; the count covers all of them

log = logging.getLogger("vit.data")


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


def folder_splits(cfg: ImageFolderSettings, seed: int = 0) -> Splits:
    """data.root's train/ and validation folders (or an archive of them), one class per subfolder; with
    data.unlabelled, every image under data.root in one class. `seed` unused: the split is the folders'."""
    if not cfg.root:
        raise DataError("data.root is not set: data=imagefolder needs data.root=<folder or .tar/.tar.gz/.zip>")
    root = Path(cfg.root).expanduser().resolve()
    if not root.exists():
        raise DataError(f"data.root={str(root)!r} does not exist")
    if is_archive(root):
        try:
            root = extract_archive(root, cfg.cache_dir)
        except ArchiveError as err:
            raise DataError(f"data.root: {err}") from err
    if cfg.unlabelled:
        return _unlabelled_folder(cfg, root)
    root = find_tree_root(root)
    val_name = cfg.val_split
    if val_name is None:
        val_name = next((n for n in VAL_SPLIT_NAMES if (root / n).is_dir()), None)
        if val_name is None:
            raise DataError(f"data.root={str(root)!r} has no val/, validation/ or test/ folder; set data.val_split")
    elif not (root / val_name).is_dir():
        raise DataError(f"data.val_split={val_name!r}: {root / val_name} does not exist")
    on_bad = cfg.on_bad_image
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
    _say_if_small(train.samples, cfg)
    return Splits(train, val, dict(train.class_to_idx), root=root, val_name=val_name)


UPSAMPLED_NOTICE_RATIO = 2  # data.img_size at least this many times the images' longer side: said in one line
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL's one-channel modes (read_rgb copies the channel thrice)


def _say_if_small(samples: list[tuple[str, int]], cfg: ImageFolderSettings) -> None:
    """One line when data.img_size is far above the images' own size (CIFAR's 32 px JPEGs at the image-folder
    default of 224 cost 49x the compute for no new pixels; 8 px digits 784x), with the settings that fit small
    images: their own size, a patch for 4x4 to 8x8 tokens (small_patch), a padded crop in place of the
    random-resized one (which throws away most of a tiny image). For small photos, AutoAugment's CIFAR-10 policy
    (SMALL_PHOTOS_POLICY) in place of another; for grey ones (digits, letters), no policy of photo operations and no
    mirror where it changes the class. The size and mode of 8 images spread over the split, from their headers:
    nothing is decoded."""
    img_size = cfg.img_size
    if not samples or img_size <= 0:
        return
    sides, grey = [], []
    for path, _ in samples[:: max(1, len(samples) // 8)][:8]:
        try:
            with Image.open(path) as image:
                sides.append(max(image.size))
                grey.append(image.mode in GREY_MODES)
        except Exception:  # an unreadable file is the scan's to report
            continue
    if not sides or img_size < UPSAMPLED_NOTICE_RATIO * (side := int(np.median(sides))):
        return
    is_grey, aug = all(grey), cfg.augment
    tone = ", grey" if is_grey else ""
    fits = [f"data.img_size={side}", f"data.patch_size={small_patch(side)}"]
    if aug.crop == "rrc":
        fits += ["data.augment.crop=pad", f"data.augment.pad={max(1, side // 8)}"]
    if is_grey and aug.auto_augment:
        fits.append("data.augment.auto_augment=null")
    elif not is_grey and aug.auto_augment not in (None, SMALL_PHOTOS_POLICY):
        fits.append(f"data.augment.auto_augment={SMALL_PHOTOS_POLICY}")
    flips = is_grey and aug.hflip
    mirror = " (and data.augment.hflip=false where a mirrored image is another class: digits, letters)" * flips
    log.warning(
        "data.img_size=%d but the training images are about %d px on their longer side%s: each is upsampled %.0fx "
        "(as fine-tuning weights trained at that size wants); small images train at their own size: %s%s",
        img_size, side, tone, img_size / side, " ".join(fits), mirror,
    )  # fmt: skip


def small_patch(side: int) -> int:
    """The patch for images of `side` px: the divisor of `side` nearest side / 8 (8x8 tokens: CIFAR's 32 px at
    patch 4) and never below 2 where a divisor allows, since a token of one pixel learns poorly (8 px digits at
    patch 1 reached 37% against 90% at patch 2, docs/DATA.md). 28 px: 4 (7x7 tokens); 8 px: 2 (4x4)."""
    target = max(2.0, side / 8)
    return min((d for d in range(1, side + 1) if side % d == 0), key=lambda d: (abs(d - target), d))


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


def _unlabelled_folder(cfg: ImageFolderSettings, root: Path) -> Splits:
    """data.unlabelled=true: the images under data.root whatever their folders. With data.holdout, every image under
    data.root is one pool (train/, val/ or test/ and any other folder alike: no labels are read, so none needs to be
    kept apart) and the validation images are `data.holdout` of it. Without it, a tree with train/ and a validation
    folder keeps that split (class folders inside are fine, and ignored). One line says which."""
    try:
        tree = find_tree_root(root)
    except DataError:
        tree = None
    val_name = cfg.val_split
    if val_name is not None and (tree is None or not (tree / val_name).is_dir()):
        raise DataError(f"data.val_split={val_name!r}: {(tree or root) / val_name} does not exist")
    if tree is not None and val_name is None and cfg.holdout is None:
        val_name = next((n for n in VAL_SPLIT_NAMES if (tree / n).is_dir()), None)
    if cfg.holdout is None and val_name is not None:
        splits = {"train": UnlabelledImages(tree / "train"), val_name: UnlabelledImages(tree / val_name)}
        log.info(
            "data.unlabelled=true: training on the %d images of train/, validating on the %d of %s/ "
            "(data.holdout=<n> pools every image under data.root and holds n of them out)",
            len(splits["train"]),
            len(splits[val_name]),
            val_name,
        )
    elif cfg.holdout is None:
        raise DataError(
            f"data.root={str(root)!r} has no train/ and val/ folders to split by: with data.unlabelled=true set "
            "data.holdout=<n> (or a fraction) to validate on that many of its images"
        )
    else:
        val_name = None
        tree = tree or root
        splits = {".": UnlabelledImages(tree)}
        parts = [Path(path).relative_to(tree).parts for path, _ in splits["."].samples]
        folders = sorted({f"{p[0]}/" for p in parts if len(p) > 1})  # the top folders the pool comes from
        shown = ", ".join(folders[:4]) + (", ..." if len(folders) > 4 else "") if folders else "no subfolders"
        log.info(
            "data.unlabelled=true: every image under data.root is the pool (%d images; %s), data.holdout=%s of "
            "them held out for validation",
            len(parts),
            shown,
            cfg.holdout,
        )
    for split, dataset in splits.items():
        if not len(dataset):
            shown = str(tree / split) if split != "." else str(tree)
            raise DataError(
                f"data.root: {shown!r} holds no image files ({', '.join(tv_datasets.folder.IMG_EXTENSIONS)})"
            )
    on_bad = cfg.on_bad_image
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


def scan_cache_dir(cfg: DataSettings, root: Path) -> Path:
    """Where the scan results of the tree under `root` are kept (vit/data/resources.py's rule)."""
    return cache_folder(cfg.cache_dir, root, "scan")


def _drop_unreadable(cfg: DataSettings, root: Path, splits: dict[str, tv_datasets.ImageFolder], on_bad: str) -> None:
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
            # Tool-neutral: training and vit-eval both read this message.
            f"Fix or delete them, or set data.on_bad_image=skip to leave them out and use the rest:\n{listed}{more}"
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
