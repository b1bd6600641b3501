"""Decoded splits for the GPU-resident loader: every image of a split decoded once (resized and centre-cropped to
the run's size), kept as uint8 (N, H, W, 3) and int64 (N,) arrays, and cached on disk as .npy files (where
vit/data/resources.py's rule says) so later runs load them instead of decoding again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, Dataset, Subset

from vit.data.augment.transforms import decode_geometry, eval_resize, resize_filter
from vit.data.resources import num_workers, taking_turns
from vit.progress import progress
from vit.settings.data import DataSettings


class _Decoded(Dataset):
    """(uint8 (H, W, 3) tensor, target) pairs of a dataset of PIL images, resized and centre-cropped.

    A module-level class (not a closure) so DataLoader workers can pickle it under any start method."""

    def __init__(self, dataset: Dataset, img_size: int, resize: int, interpolation: str) -> None:
        self.dataset = dataset
        self.geometry = decode_geometry(img_size, resize, interpolation)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.geometry(image).permute(1, 2, 0), target  # (3, H, W) -> (H, W, 3)


def decode_split(
    dataset: Dataset, img_size: int, resize: int, interpolation: str, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image once: uint8 (N, H, W, 3) and int64 (N,)."""
    loader = DataLoader(_Decoded(dataset, img_size, resize, interpolation), batch_size=256, num_workers=num_workers)
    images, targets = [], []
    what = f"decoding {len(dataset):,} images"
    for x, y in progress(loader, len(loader), what, unit="batches of 256"):
        images.append(x.numpy())
        targets.append(y.numpy())
    return np.concatenate(images), np.concatenate(targets).astype(np.int64)


def split_identity(dataset: Dataset) -> list[str]:
    """What the decoded cache is keyed on: the image files (ImageFolder), or the dataset class and root
    (CIFAR), narrowed to the chosen indices for a Subset (data.limit_*_samples)."""
    if isinstance(dataset, Subset):
        base = split_identity(dataset.dataset)
        if len(base) == len(dataset.dataset):
            return [base[i] for i in dataset.indices]
        return [*base, ",".join(str(i) for i in dataset.indices)]
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return [str(path) for path, _ in samples]
    return [type(dataset).__name__, str(Path(getattr(dataset, "root", "")).resolve()), str(len(dataset))]


def cached_split(dataset: Dataset, cfg: DataSettings, train: bool, cache_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """`decode_split` at the run's size, stored as `<split>-<size>px-r<resize>[-<filter>]-<count>-<hash>.{images,
    targets}.npy` in `cache_dir` and loaded from there on later runs. The shorter side goes to `resize`: for
    evaluation as `val_geometry` does (data.crop_pct); for training the whole image (the batch crops come later)."""
    img_size, interpolation = cfg.img_size, resize_filter(cfg)
    resize = img_size if train else eval_resize(img_size, cfg.crop_pct)
    key = hashlib.sha1("|".join(split_identity(dataset)).encode()).hexdigest()[:12]
    tag = "train" if train else "val"
    tag += "" if interpolation == "bilinear" else f"-{interpolation}"  # the bilinear files keep their former names
    stem = f"{tag}-{img_size}px-r{resize}-{len(dataset)}-{key}"
    images_path, targets_path = cache_dir / f"{stem}.images.npy", cache_dir / f"{stem}.targets.npy"
    if images_path.is_file() and targets_path.is_file():
        return np.load(images_path), np.load(targets_path)
    with taking_turns(cache_dir):
        if images_path.is_file() and targets_path.is_file():  # decoded by a process that held the lock first
            return np.load(images_path), np.load(targets_path)
        images, targets = decode_split(dataset, img_size, resize, interpolation, num_workers(cfg))
        for path, array in ((images_path, images), (targets_path, targets)):
            # Write then rename: a run killed mid-write leaves no truncated file under the final name.
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            with open(tmp, "wb") as handle:
                np.save(handle, array)
            os.replace(tmp, path)
    return images, targets
