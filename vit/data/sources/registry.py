"""The one table of the datasets `data.name` can name, `DATASETS`, and `build_splits`: the named dataset's train and
val splits (without transforms; the loader adds them) and its class-to-index map (saved with every checkpoint),
after data.holdout and data.limit_*_samples.

Adding a dataset is one entry here (its splits builder, its normalisation, whether it streams, and its settings
class when it has keys or defaults of its own: vit/settings/data.py) and its configs/data/<name>.yaml; every list
of the known names, and every message that gives them, reads this table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from omegaconf import DictConfig, OmegaConf
from torchvision import datasets as tv_datasets

from vit.data.errors import DataError
from vit.data.sources.cifar import cifar_splits
from vit.data.sources.folders import folder_splits
from vit.data.sources.hf import build_hf_splits
from vit.data.sources.splits import HOLDOUT_SEED, Splits, hold_out, limit_split, parse_holdout
from vit.data.sources.synthetic import synthetic_splits
from vit.errors import ConfigError
from vit.settings.data import (
    Cifar100Settings,
    DataSettings,
    HfSettings,
    ImageFolderSettings,
    SyntheticSettings,
    WebDatasetSettings,
)

MeanStd = tuple[tuple[float, float, float], tuple[float, float, float]]  # per channel (R, G, B), on a [0, 1] scale
IMAGENET_MEAN_STD: MeanStd = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass(frozen=True)
class DatasetSource:
    """One dataset `data.name` can name."""

    # (the data settings, `settings` below; the run's seed) -> its Splits. None: the dataset streams.
    splits: Callable[[DataSettings, int], Splits] | None
    # The normalisation when data.mean and data.std are null: the dataset's per-channel mean and std where the entry
    # gives them, else ImageNet's, which pretrained weights expect.
    mean_std: MeanStd = IMAGENET_MEAN_STD
    # data.root must name an existing folder or archive: checked with the config, before a run starts.
    needs_root: bool = False
    # Its keys, their types, ranges and defaults (vit/settings/data.py); Hydra's data/schema/<name>.
    settings: type[DataSettings] = DataSettings

    @property
    def streams(self) -> bool:
        """Tar shards read as a stream (vit/data/loading/stream.py): no splits held in memory, no loader to choose."""
        return self.splits is None


DATASETS: dict[str, DatasetSource] = {
    "cifar10": DatasetSource(
        functools.partial(cifar_splits, torchvision_class=tv_datasets.CIFAR10),
        ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ),
    "cifar100": DatasetSource(
        functools.partial(cifar_splits, torchvision_class=tv_datasets.CIFAR100),
        ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
        settings=Cifar100Settings,
    ),
    "imagefolder": DatasetSource(folder_splits, needs_root=True, settings=ImageFolderSettings),
    "synthetic": DatasetSource(synthetic_splits, ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), settings=SyntheticSettings),
    # Hugging Face datasets: the datasets library is imported when called
    "hf": DatasetSource(build_hf_splits, settings=HfSettings),
    "webdataset": DatasetSource(None, settings=WebDatasetSettings),  # tar shards, streamed (vit/data/loading/stream.py)
}


def data_settings(name: str | None) -> type[DataSettings]:
    """The settings class of dataset `name` (the common keys' for a name DATASETS does not have: the config check
    then names it)."""
    return DATASETS[name].settings if name in DATASETS else DataSettings


def data_defaults(name: str) -> dict:
    """Every key of data=`name` with its default, as Hydra composes configs/data/<name>.yaml."""
    return {**data_settings(name).defaults(), "name": name}


def data_of(cfg: Mapping | DataSettings) -> DataSettings:
    """The typed settings of a data config, the one form the data layer reads: a composed `cfg.data`, or a config
    built by hand (a notebook, a test, a tool) whose missing keys take their dataset's defaults (`complete`).
    Settings already read are returned as they are. A key the dataset does not have, or a value of the wrong type
    or range, is a DataError naming it."""
    if isinstance(cfg, DataSettings):
        return cfg
    merged = complete(cfg)
    settings = data_settings(merged.get("name"))
    known = [f.name for f in fields(settings)]
    for key in merged:
        if key not in known:
            raise DataError(f"data.{key} is not a key of data={merged.get('name')} (known: {', '.join(known)})")
    try:
        return settings.of(merged)
    except ConfigError as err:
        raise DataError(str(err)) from None


def complete(cfg: Mapping) -> DictConfig:
    """A data config built by hand (a notebook, a test, a tool) with every key it leaves out taken from its
    dataset's declaration: a key left out means what `data=<name>` gives it. Composed configs already hold every key;
    completing them changes nothing."""
    given = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    name = str(given.get("name") or "cifar10")
    merged = OmegaConf.merge(OmegaConf.create(data_defaults(name)), given)
    OmegaConf.set_struct(merged, False)
    return merged


def dataset_source(name: str | None) -> DatasetSource:
    """The entry of `name`, or a DataError naming the known ones."""
    if name not in DATASETS:
        raise DataError(f"data.name={name!r} must be one of {tuple(DATASETS)}")
    return DATASETS[name]


def mean_std(cfg: Mapping | DataSettings) -> MeanStd:
    """data.mean and data.std, or the dataset's normalisation where they are null (ImageNet's for a name not in
    the table: a tool's config may name a dataset this code does not build). Their shape and sign are checked
    with the settings (vit/settings/data.py)."""
    cfg = data_of(cfg)
    source = DATASETS.get(cfg.name)
    default = source.mean_std if source is not None else IMAGENET_MEAN_STD
    return cfg.mean or default[0], cfg.std or default[1]


def build_splits(cfg: Mapping | DataSettings, seed: int = 0) -> Splits:
    """The train and val splits of the dataset `cfg.name` names, after data.holdout and data.limit_*_samples."""
    cfg = data_of(cfg)
    name = cfg.name
    holdout = parse_holdout(cfg.holdout)  # before any data is read: a typo fails at once
    source = dataset_source(name)
    if source.streams:
        raise DataError(f"data.name={name!r} streams its tar shards: it has no splits to build (build_data reads it)")
    splits = source.splits(cfg, seed)
    val_seed = seed + 1
    if holdout is not None:
        splits = hold_out(splits, holdout)
        val_seed = HOLDOUT_SEED + 1  # a limited holdout is also the same images in every run
    splits.train, splits.train_array = limit_split(splits.train, splits.train_array, cfg.limit_train_samples, seed)
    splits.val, splits.val_array = limit_split(splits.val, splits.val_array, cfg.limit_val_samples, val_seed)
    return splits
