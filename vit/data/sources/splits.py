"""`Splits`, what every dataset source returns (train and val datasets, the class map, where the caches go), and
what is done to splits whatever their source: `data.holdout` turns a fixed, class-balanced slice of the training set
into the validation split (so that epochs and settings are never chosen by their test accuracy), and
`data.limit_*_samples` keep a class-balanced subset."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, Subset

from vit.data.errors import DataError

HOLDOUT_SEED = 0  # fixed, not trainer.seed: every run holds out the same images
HOLDOUT_NAME = "holdout"


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
