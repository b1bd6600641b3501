"""CIFAR-10 and CIFAR-100 through torchvision: its `cifar-10-batches-py` / `cifar-100-python` folder under
data.root, downloaded there with data.download=true."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torchvision import datasets as tv_datasets

from vit.data.errors import DataError
from vit.data.sources.archive import is_archive
from vit.data.sources.splits import Splits
from vit.settings.data import DataSettings


def cifar_splits(cfg: DataSettings, seed: int = 0, *, torchvision_class: type[tv_datasets.CIFAR10]) -> Splits:
    """The train and test sets of torchvision's CIFAR-10 or CIFAR-100 under data.root (downloaded with
    data.download), as uint8 arrays too: the GPU loader uses them without decoding anything."""
    root = Path(cfg.root or "data").expanduser()
    name, cls = cfg.name, torchvision_class
    folder = root / cls.base_folder
    if root.is_file():
        kind = "an archive" if is_archive(root) else "a file"
        raise DataError(
            f"data.root={str(root)!r} is {kind}: data={name} reads torchvision's {cls.base_folder} folder; for image "
            "folders (or an archive of them, as vit-cifar-jpegs writes) use data=imagefolder"
        )
    try:
        train = cls(str(root), train=True, download=cfg.download)
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
