"""The datasets behind `data.name`, and `build_splits`: the named dataset's train and val splits (without
transforms; the loader adds them) and its class-to-index map (saved with every checkpoint), after data.holdout and
data.limit_*_samples."""

from __future__ import annotations

from vit.data.declared import complete
from vit.data.errors import DataError
from vit.data.sources.cifar import cifar_splits
from vit.data.sources.folders import folder_splits
from vit.data.sources.hf import build_hf_splits
from vit.data.sources.splits import HOLDOUT_SEED, Splits, hold_out, limit_split, parse_holdout
from vit.data.sources.synthetic import synthetic_splits

# webdataset (streamed tar shards) is routed by vit/data/loading/build.py before build_splits; listed here for the
# messages.
DATASET_NAMES = ("cifar10", "cifar100", "imagefolder", "synthetic", "hf", "webdataset")


def build_splits(cfg, seed: int = 0) -> Splits:
    cfg = complete(cfg)  # a hand-built config's missing keys: as configs/data/<name>.yaml declares them
    name = cfg.get("name")
    holdout = parse_holdout(cfg.get("holdout"))  # before any data is read: a typo fails at once
    if name in ("cifar10", "cifar100"):
        splits = cifar_splits(cfg, name)
    elif name == "imagefolder":
        splits = folder_splits(cfg)
    elif name == "synthetic":
        splits = synthetic_splits(cfg, seed)
    elif name == "hf":
        splits = build_hf_splits(cfg)  # hf.py imports the datasets library only when called
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
