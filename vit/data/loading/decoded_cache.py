"""Decoded splits for the GPU-resident loader: every image of a split decoded once (resized and centre-cropped to
the run's size), kept as uint8 (N, H, W, 3) and int64 (N,) arrays, and cached on disk as .npy files (where
vit/data/resources.py's rule says) so later runs load them instead of decoding again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, Dataset, Subset

from vit.data.augment.transforms import decode_geometry, eval_resize
from vit.progress import progress


def decode_size(img_size: int, train: bool) -> int:
    """The shorter side images are resized to before the centre crop: val as `val_geometry`; train keeps the whole
    image (the batch crops come later)."""
    return img_size if train else eval_resize(img_size)


class _Decoded(Dataset):
    """(uint8 (H, W, 3) tensor, target) pairs of a dataset of PIL images, resized and centre-cropped.

    A module-level class (not a closure) so DataLoader workers can pickle it under any start method."""

    def __init__(self, dataset: Dataset, img_size: int, resize: int) -> None:
        self.dataset = dataset
        self.geometry = decode_geometry(img_size, resize)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.geometry(image).permute(1, 2, 0), target  # (3, H, W) -> (H, W, 3)


def decode_split(dataset: Dataset, img_size: int, resize: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image once: uint8 (N, H, W, 3) and int64 (N,)."""
    loader = DataLoader(_Decoded(dataset, img_size, resize), batch_size=256, num_workers=num_workers)
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


def cached_split(
    dataset: Dataset, img_size: int, train: bool, cache_dir: Path, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """`decode_split`, stored as `<split>-<size>px-r<resize>-<count>-<hash>.{images,targets}.npy` in
    `cache_dir` and loaded from there on later runs."""
    resize = decode_size(img_size, train)
    key = hashlib.sha1("|".join(split_identity(dataset)).encode()).hexdigest()[:12]
    tag = "train" if train else "val"
    stem = f"{tag}-{img_size}px-r{resize}-{len(dataset)}-{key}"
    images_path, targets_path = cache_dir / f"{stem}.images.npy", cache_dir / f"{stem}.targets.npy"
    if images_path.is_file() and targets_path.is_file():
        return np.load(images_path), np.load(targets_path)
    images, targets = decode_split(dataset, img_size, resize, num_workers)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for path, array in ((images_path, images), (targets_path, targets)):
        # Write then rename: a run killed mid-write leaves no truncated file under the final name.
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as handle:
            np.save(handle, array)
        os.replace(tmp, path)
    return images, targets
