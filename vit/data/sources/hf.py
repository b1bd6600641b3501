"""Hugging Face datasets as a data source (`data=hf`): a dataset by its Hub name, or one saved with `save_to_disk`.

Each split becomes an `HFImages`: (RGB PIL image, int target) pairs like torchvision's ImageFolder gives, with
the targets read from the label column up front (without decoding an image), so holdout, limit_*_samples, both
loaders, the GPU loader's decoded cache and `BatchAugment` treat it as they treat an image folder. Example: a saved
DatasetDict {train: 50000 rows, test: 10000 rows} with columns image (Image) and label (ClassLabel of 10 names)
gives Splits(train=HFImages(50000), val=HFImages(10000), class_to_idx={name: 0..9}, val_name="test").

  data.dataset_name  Hub name (or a local folder of data files), loaded by `datasets.load_dataset` through its
                     cache: data.cache_dir when set, else the library's (HF_DATASETS_CACHE, default under HF_HOME)
  data.path          a folder written by `save_to_disk`: a DatasetDict, or one Dataset (then data.holdout)
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from vit.data.errors import DataError
from vit.data.images import to_rgb
from vit.data.sources.splits import Splits
from vit.hub import host_reachable, hub_host, offline_hub
from vit.settings.data import HfSettings

HF_VAL_SPLIT_NAMES = ("validation", "val", "test")  # data.val_split=null: the first of these the dataset has
FALLBACK_IMAGE_COLUMN = "img"  # tried when the default `image` is missing: CIFAR-10/100 on the Hub use it

log = logging.getLogger("vit.data")


class HFImages(Dataset):
    """One split of a `datasets.Dataset` as (RGB PIL image, int target) pairs.

    `targets`: int64 (N,), read from the label column when the split is built (no image decoded).
    `root`: what the GPU loader's decoded-split cache is keyed on (with the class name and the length): the folder
    of the split's Arrow files, the split name and the dataset's fingerprint, so two datasets, or one saved again
    with other rows, never share decoded images.
    """

    def __init__(self, dataset, image_column: str, targets: np.ndarray, root: Path) -> None:
        self.dataset = dataset.select_columns([image_column])  # only the image column is read per item
        self.image_column = image_column
        self.targets = targets
        self.root = root

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        image = self.dataset[int(index)][self.image_column]  # the Image feature decodes to a PIL image
        return to_rgb(image), int(self.targets[index])


def _load_hub(cfg):
    """The DatasetDict of data.dataset_name (and data.dataset_config) through the datasets cache."""
    import datasets

    name, config = cfg.dataset_name, cfg.dataset_config
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else Path(datasets.config.HF_DATASETS_CACHE)
    # Offline, huggingface_hub would retry each request for about 30 s, a warning per try, before the cache.
    online = Path(name).expanduser().is_dir() or host_reachable(hub_host())
    try:
        with offline_hub(not online):
            return datasets.load_dataset(name, config, cache_dir=str(cache))
    except ConnectionError as err:  # offline (HF_DATASETS_OFFLINE=1) or no network, and not in the cache
        why = _one_line(err) if online else f"no network: {hub_host()} is unreachable, or offline mode is on"
        raise DataError(
            f"data.dataset_name={name!r}: not in the datasets cache {cache} and the Hub cannot be reached "
            f"({why}); "
            "load it once where a network exists with the same data.cache_dir (or HF_HOME), or use "
            "data.path=<folder saved with save_to_disk>"
        ) from err
    except OSError as err:  # no such Hub dataset, a local folder without data files, a refused download
        raise DataError(f"data.dataset_name={name!r}: {_one_line(err)}") from err
    except ValueError as err:  # an unknown config name: the message lists the known ones
        raise DataError(f"data.dataset_config={config!r} of data.dataset_name={name!r}: {_one_line(err)}") from err


def _one_line(err: Exception) -> str:
    """The library's message on one line (some span several)."""
    return " ".join(str(err).split())


def _load_saved(cfg):
    """The Dataset or DatasetDict that `save_to_disk` wrote to data.path."""
    import datasets

    path = Path(cfg.path).expanduser()
    if not path.exists():
        raise DataError(f"data.path={str(path)!r} does not exist")
    try:
        return datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        raise DataError(
            f"data.path={str(path)!r} is not a dataset saved with save_to_disk (no dataset_dict.json or "
            "state.json in it); for a Hub name use data.dataset_name"
        ) from err


def _pick_splits(cfg, loaded) -> tuple[str, object, str | None, object]:
    """(train name, train Dataset, val name, val Dataset or None). A lone Dataset is the training set and needs
    data.holdout; so does a DatasetDict without a validation split."""
    import datasets

    holdout = cfg.holdout is not None
    if isinstance(loaded, datasets.Dataset):
        if not holdout:
            raise DataError(
                f"data.path={cfg.path!r} holds one Dataset, no splits: set data.holdout=<count or fraction> "
                "to validate on a slice of it, or save a DatasetDict with train and validation splits"
            )
        return "train", loaded, None, None
    have = list(loaded)
    train_name = cfg.train_split
    if train_name not in loaded:
        raise DataError(f"data.train_split={train_name!r} is not a split of the dataset; its splits: {have}")
    val_name = cfg.val_split
    if val_name is None:
        val_name = next((n for n in HF_VAL_SPLIT_NAMES if n in loaded and n != train_name), None)
        if val_name is None and not holdout:
            raise DataError(
                f"the dataset has no validation split ({'/'.join(HF_VAL_SPLIT_NAMES)}); its splits: {have}: "
                "set data.val_split=<split> or data.holdout=<count or fraction>"
            )
    elif str(val_name) not in loaded:
        raise DataError(f"data.val_split={val_name!r} is not a split of the dataset; its splits: {have}")
    val = loaded[str(val_name)] if val_name is not None else None
    return train_name, loaded[train_name], (str(val_name) if val_name is not None else None), val


def _image_column(cfg, dataset, split: str) -> str:
    """data.image_column, or `img` when the default `image` is missing and `img` is there."""
    import datasets

    column = cfg.image_column
    if column not in dataset.column_names and column == "image" and FALLBACK_IMAGE_COLUMN in dataset.column_names:
        log.info("data.image_column: no column `image`, using `%s`", FALLBACK_IMAGE_COLUMN)
        column = FALLBACK_IMAGE_COLUMN
    if column not in dataset.column_names:
        raise DataError(
            f"data.image_column={column!r} is not a column of split {split!r}; its columns: {dataset.column_names}"
        )
    feature = dataset.features[column]
    if not isinstance(feature, datasets.Image) or not feature.decode:
        raise DataError(f"data.image_column={column!r} holds {feature}, not decodable images (an Image feature)")
    return column


def _raw_labels(cfg, dataset, split: str) -> np.ndarray:
    column = cfg.label_column
    if column not in dataset.column_names:
        raise DataError(
            f"data.label_column={column!r} is not a column of split {split!r}; its columns: {dataset.column_names}"
        )
    return np.asarray(dataset.with_format("numpy")[column])  # the label column alone: no image decoded


def _class_to_idx(cfg, train, labels: list[np.ndarray]) -> dict[str, int]:
    """ClassLabel names of the label column; else integer labels as {str(i): i} for i up to the largest label seen
    (so every label has a logit), or string labels sorted and numbered as ImageFolder numbers its folders."""
    import datasets

    feature = train.features[cfg.label_column]
    if isinstance(feature, datasets.ClassLabel):
        return {name: i for i, name in enumerate(feature.names)}
    seen = np.concatenate(labels)
    if seen.dtype.kind in "iu":
        return {str(i): i for i in range(int(seen.max()) + 1 if seen.size else 0)}
    if seen.dtype.kind in "UO":
        return {name: i for i, name in enumerate(sorted({str(v) for v in seen}))}
    raise DataError(
        f"data.label_column={cfg.label_column!r} holds {feature}, not class labels (ClassLabel, int or string)"
    )


def _check_same_classes(cfg, train, val, val_name: str) -> None:
    """A ClassLabel in either split must be the same in both: label i has to mean one class in train and val."""
    import datasets

    column = cfg.label_column
    mine, theirs = train.features[column], val.features[column]
    if (isinstance(mine, datasets.ClassLabel) or isinstance(theirs, datasets.ClassLabel)) and mine != theirs:
        raise DataError(
            f"data.label_column={column!r}: the class labels of the training split ({mine}) and of split "
            f"{val_name!r} ({theirs}) differ; both splits need the same ClassLabel names"
        )


def _targets(cfg, raw: np.ndarray, class_to_idx: dict[str, int], split: str) -> np.ndarray:
    """int64 (N,) class indices; an unlabelled row (-1, as Hub test splits often have) is an error naming the split."""
    if raw.dtype.kind in "UO":
        return np.asarray([class_to_idx[str(v)] for v in raw], dtype=np.int64)
    targets = raw.astype(np.int64)
    unlabelled = int((targets < 0).sum())
    if unlabelled:
        raise DataError(
            f"data.label_column={cfg.label_column!r}: {unlabelled} of the {len(targets)} rows of split "
            f"{split!r} have no label (< 0); set data.val_split to a labelled split or validate on data.holdout"
        )
    return targets


def _split_root(dataset, split: str) -> tuple[Path | None, Path]:
    """(the folder holding the split's Arrow files, the split's identity under it). The Hub cache keeps them in
    <cache>/<owner>___<name>/<config>/<version>/<hash>/; `save_to_disk` in <path>/<split>/."""
    files = [Path(f["filename"]) for f in dataset.cache_files]
    folder = files[0].parent if files else None
    return folder, Path(folder or ".") / f"{split}-{dataset._fingerprint}"


def build_hf_splits(cfg: HfSettings, seed: int = 0) -> Splits:
    """The Splits of data=hf: exactly one of data.dataset_name and data.path (`seed` unused: the splits are the
    dataset's own)."""
    name, path = cfg.dataset_name, cfg.path
    if bool(name) == bool(path):
        given = "both are set" if name else "neither is set"
        raise DataError(
            f"data=hf needs exactly one of data.dataset_name=<Hub name> and data.path=<folder saved with "
            f"save_to_disk>; {given}"
        )
    loaded = _load_hub(cfg) if name else _load_saved(cfg)
    train_name, train, val_name, val = _pick_splits(cfg, loaded)
    column = _image_column(cfg, train, train_name)
    parts = [(train_name, train)] + ([(val_name, val)] if val is not None else [])
    raw = [_raw_labels(cfg, ds, split) for split, ds in parts]
    class_to_idx = _class_to_idx(cfg, train, raw)
    if val is not None:
        _check_same_classes(cfg, train, val, val_name)
    made = [
        _images(cfg, ds, split, column, labels, class_to_idx) for (split, ds), labels in zip(parts, raw, strict=True)
    ]
    # Splits.root, where the GPU loader keeps decoded splits by default: data.path itself, or the Hub dataset's
    # folder in the datasets cache (beside its Arrow files).
    root = Path(str(path)).expanduser().resolve() if path else _split_root(train, train_name)[0]
    # No val split (a lone Dataset, or none of validation/val/test): `build_splits` applies data.holdout next,
    # which sets the validation split in place of this None.
    val_images = made[1] if val is not None else None
    return Splits(made[0], val_images, class_to_idx, root=root, val_name=val_name or "val")  # type: ignore[arg-type]


def _images(cfg, dataset, split: str, column: str, labels: np.ndarray, class_to_idx: dict[str, int]) -> HFImages:
    if column not in dataset.column_names:
        raise DataError(
            f"data.image_column={column!r} is not a column of split {split!r}; its columns: {dataset.column_names}"
        )
    return HFImages(dataset, column, _targets(cfg, labels, class_to_idx, split), _split_root(dataset, split)[1])
