"""`build_data(cfg.data)`: datasets, transforms and loaders assembled into one `DataBundle`.

Two loaders, one augmentation. The torch loader decodes and crops in CPU workers and hands uint8 batches to the
device; the resident loader (data.loader=resident) keeps the decoded split on the training device, a GPU's or
the host's. Either way a batch then goes through the
same `BatchAugment` (vit/data/augment/batch.py) on the device, so a config means the same augmented images on both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vit.data.augment.batch import BatchAugment
from vit.data.augment.spec import augment_settings
from vit.data.augment.transforms import (
    eval_resize,
    mixup_and_criterion,
    resize_filter,
    train_geometry,
    val_geometry,
)
from vit.data.errors import DataError
from vit.data.loading.bundle import DataBundle
from vit.data.loading.decoded_cache import cached_split
from vit.data.loading.naflex_loader import (
    NaFlexFileBatches,
    NaFlexLoader,
    NaFlexSchedule,
    OwnShape,
    ScheduledBatches,
    ToSequence,
    as_lists,
)
from vit.data.loading.resident import ResidentLoader
from vit.data.loading.stream import build_stream_data
from vit.data.loading.torch_loader import DeviceBatches, EpochSampler, Transformed, init_worker, torch_loader
from vit.data.resources import available_memory, cache_folder, num_workers
from vit.data.sources.registry import build_splits, data_of, dataset_source, mean_std
from vit.data.sources.splits import Splits
from vit.settings.data import DataSettings

log = logging.getLogger(__name__)

LOADERS = ("auto", "torch", "resident")
# Former names still accepted, with a one-line notice: the resident loader was called "gpu", though it runs on
# any device (a CPU run's auto picks it too).
RENAMED_LOADERS = {"gpu": "resident"}


def loader_choice(cfg: DataSettings) -> str:
    """data.loader as one of LOADERS (a former name mapped to today's, with a one-line notice)."""
    kind = cfg.loader
    if kind in RENAMED_LOADERS:
        log.warning(
            "data.loader=%s is now data.loader=%s (the same loader); %s still works", kind, RENAMED_LOADERS[kind], kind
        )
        return RENAMED_LOADERS[kind]
    if kind not in LOADERS:
        raise DataError(f"data.loader={kind!r} must be one of {LOADERS}")
    return kind


def check_alternating_flip(cfg: DataSettings, spec) -> None:
    """data.augment.hflip_alternate alternates the flips data.augment.hflip draws, one per image and epoch."""
    if not spec.hflip_alternate:
        return
    if not spec.hflip:
        raise DataError("data.augment.hflip_alternate=true needs data.augment.hflip=true (no flip to alternate)")
    if (cfg.repeated_aug or 1) > 1:
        raise DataError(
            f"data.augment.hflip_alternate=true with data.repeated_aug={cfg.repeated_aug}: the copies of an image in "
            "one epoch would all be mirrored alike; use one of the two"
        )


def _in_memory_fits(splits: Splits, img_size: int, device: torch.device) -> tuple[bool, str]:
    """Whether the splits as uint8 (N, 3, H, W) take under a quarter of the free memory of the device they would
    live on (the GPU's, or the host's for a CPU run), and the reason in words; estimated before anything is
    decoded, so a split too large is never decoded for nothing. On a CPU the in-memory path pays most: the torch
    loader's workers would decode every JPEG again each epoch on the same cores the step needs (measured in
    docs/BENCHMARKS.md, "The CPU loader and thread defaults")."""
    if device.type == "cuda":
        free, where = torch.cuda.mem_get_info(device)[0], str(device)
    elif device.type == "cpu":
        free, where = available_memory(), "this machine's memory"
    else:
        return False, f"the device is {device.type}"
    images = len(splits.train) + len(splits.val) + (len(splits.test) if splits.test is not None else 0)
    needed = images * 3 * img_size * img_size
    verdict = "under" if needed < 0.25 * free else "over"
    return needed < 0.25 * free, (
        f"the device is {device.type}; {images} images at {img_size} px take {needed / 2**30:.2f} GiB, {verdict} a "
        f"quarter of the {free / 2**30:.1f} GiB free in {where}"
    )


def decoded_cache_dir(cfg: DataSettings, splits: Splits) -> Path:
    """Where the resident loader keeps decoded splits (vit/data/resources.py's rule, beside the folder holding train/
    or the CIFAR root)."""
    return cache_folder(cfg.cache_dir, splits.root, "decoded")


def choose_loader(cfg: DataSettings, splits: Splits, device: torch.device) -> tuple[str, str]:
    """("torch" or "resident", why): data.loader=resident|torch as asked; auto: the resident loader (the decoded
    splits in the training device's memory) when they fit (`_in_memory_fits`), on CUDA and on a CPU alike, else
    the torch loader."""
    kind = loader_choice(cfg)
    if kind != "auto":
        return kind, f"data.loader={kind}"
    fits, why = _in_memory_fits(splits, cfg.img_size, device)
    return ("resident" if fits else "torch"), f"data.loader=auto: {why}"


def build_data(
    cfg: Mapping | DataSettings,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> DataBundle:
    """Build the train/val loaders described by the `data` config node (or its settings, `data_of`)."""
    cfg = data_of(cfg)
    batch_size, img_size = cfg.batch_size, cfg.img_size
    spec = augment_settings(cfg.augment)
    device = torch.device(device)
    cfg = replace(cfg, loader=loader_choice(cfg))
    check_alternating_flip(cfg, spec)
    if dataset_source(cfg.name).streams:  # tar shards: no splits to hold in memory (stream.py)
        if cfg.naflex.seq_lens is not None:
            log.info(naflex_line(cfg, cfg.name))
        mean, std = mean_std(cfg)
        common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
        return build_stream_data(cfg, spec, mean, std, **common)
    splits = build_splits(cfg, seed=seed)
    num_classes = cfg.num_classes or len(splits.class_to_idx)
    if num_classes < len(splits.class_to_idx):
        raise DataError(f"data.num_classes={num_classes} but the data has {len(splits.class_to_idx)} classes")
    mixup_fn, criterion = mixup_and_criterion(spec, num_classes)
    mean, std = mean_std(cfg)
    kind, reason = choose_loader(cfg, splits, device)
    log.info("loader: %s (%s)", kind, reason)
    if cfg.naflex.seq_lens is not None:
        log.info(naflex_line(cfg, kind))
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    build = _resident_loaders if kind == "resident" else _torch_loaders
    train_loader, val_loader, test_loader, sampler = build(cfg, splits, spec, mean, std, **common)
    if len(train_loader) == 0:
        raise DataError(
            f"data.batch_size={batch_size} is larger than the {len(splits.train)} training images: no full batch"
        )
    return DataBundle(
        train_loader,
        val_loader,
        num_classes,
        splits.class_to_idx,
        mixup_fn,
        criterion,
        mean,
        std,
        img_size,
        len(splits.train),
        len(splits.val),
        sampler,
        kind,
        reason,
        splits.val_name,
        test_loader,
        splits.test_name,
        train_workers=num_workers(cfg) if kind == "torch" else 0,
    )


def naflex_line(cfg: DataSettings, kind: str) -> str:
    """The one line saying what a data.naflex run's images are before their batches resize them."""
    naflex = cfg.naflex
    budget = f"{cfg.batch_size} x {naflex.max_seq_len or max(naflex.seq_lens)} tokens a batch"
    if naflex.patch_sizes:
        budget += f", patches of {' or '.join(map(str, naflex.patch_sizes))} px drawn for each batch"
    if kind == "resident":
        return (
            f"NaFlex batches of {list(naflex.seq_lens)} tokens, {budget}, from each image as decoded at "
            f"{cfg.img_size} x {cfg.img_size} px (the resident loader's; data.loader=torch keeps each image at its "
            "own shape)"
        )
    return f"NaFlex batches of {list(naflex.seq_lens)} tokens, {budget}, each image at its own shape"


def _naflex_file_loader(cfg, splits, spec, mean, std, *, device, seed, rank, world_size, batch_size):
    """data.naflex through the torch loader: workers decode each image at its own shape for its batch's seq_len
    (`ScheduledBatches` hands them (index, seq_len)), the device augments and packs (`NaFlexFileBatches`)."""
    if spec.hflip_alternate:
        raise DataError(
            "data.augment.hflip_alternate=true with data.naflex through the torch loader: not built (the resident "
            "loader has it); set data.augment.hflip_alternate=false or data.loader=resident"
        )
    naflex = cfg.naflex
    geometry = OwnShape(cfg.patch_size, spec.crop, float(spec.scale_min), resize_filter(cfg))
    images = ToSequence(splits.train, geometry)
    sampler = EpochSampler(images, world_size, rank, seed, repeats=cfg.repeated_aug or 1)
    tokens = batch_size * (naflex.max_seq_len or max(naflex.seq_lens))
    schedule = NaFlexSchedule(sampler.num_samples, naflex.seq_lens, tokens, seed, naflex.patch_sizes)
    batches = ScheduledBatches(sampler, schedule)
    workers = num_workers(cfg)
    loader = DataLoader(
        images, batch_sampler=batches, collate_fn=as_lists, num_workers=workers, persistent_workers=workers > 0,
        worker_init_fn=init_worker, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    augment = BatchAugment(spec, mean, std, cfg.img_size, train=True, crop_done=True)
    return NaFlexFileBatches(loader, batches, augment, cfg.patch_size, device=device, seed=seed, rank=rank), sampler


def _torch_loaders(cfg, splits, spec, mean, std, *, device, seed, rank, world_size, batch_size):
    """DataLoaders over the files (workers decode and, for crop=rrc, crop), each wrapped in `DeviceBatches`."""
    img_size = cfg.img_size
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    train_aug = BatchAugment(spec, mean, std, img_size, train=True, crop_done=True)
    val_aug = BatchAugment(spec, mean, std, img_size, train=False)
    wrap = dict(device=device, seed=seed, rank=rank)
    if cfg.naflex.seq_lens is not None:  # the images at their own shapes, as NaFlex batches
        train, sampler = _naflex_file_loader(cfg, splits, spec, mean, std, **common)
    else:
        train_images = Transformed(splits.train, train_geometry(cfg, spec))
        loader, sampler = torch_loader(train_images, cfg, train=True, **common)
        train = DeviceBatches(loader, sampler, train_aug, **wrap)
    loaders = [train]
    for split in (splits.val, splits.test):
        if split is None:
            loaders.append(None)
            continue
        loader, shards = torch_loader(Transformed(split, val_geometry(cfg)), cfg, train=False, **common)
        loaders.append(DeviceBatches(loader, shards, val_aug, **wrap))
    return *loaders, sampler


def _resident_loaders(cfg, splits, spec, mean, std, *, device, seed, rank, world_size, batch_size):
    """Resident loaders over decoded uint8 splits, on the training device."""
    img_size = cfg.img_size
    arrays = []
    parts = [(True, splits.train, splits.train_array), (False, splits.val, splits.val_array)]
    if splits.test is not None:
        parts.append((False, splits.test, splits.test_array))
    for train, dataset, array in parts:
        # CIFAR and synthetic splits are already uint8 arrays at their size: used as they are unless the run resizes
        # them (another size, or evaluation's crop_pct), else decoded once (cached) as the torch loader decodes.
        resize = img_size if train else eval_resize(img_size, cfg.crop_pct)
        if array is None or array[0].shape[1:3] != (img_size, img_size) or resize != img_size:
            array = cached_split(dataset, cfg, train, decoded_cache_dir(cfg, splits))
        arrays.append(array)
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    train_aug = BatchAugment(spec, mean, std, img_size, train=True)
    val_aug = BatchAugment(spec, mean, std, img_size, train=False)
    repeats = cfg.repeated_aug or 1
    naflex = cfg.naflex
    if naflex.seq_lens is not None:  # data.naflex: batches of patch sequences, their sizes set by the token budget
        longest = naflex.max_seq_len or max(naflex.seq_lens)
        patches = dict(seq_lens=naflex.seq_lens, max_seq_len=longest, patch_size=cfg.patch_size)
        patches.update(patch_sizes=naflex.patch_sizes)
        train_loader = NaFlexLoader(*arrays[0], train_aug, repeats=repeats, **patches, **common)
    else:
        train_loader = ResidentLoader(*arrays[0], train_aug, train=True, repeats=repeats, **common)
    val_loader = ResidentLoader(*arrays[1], val_aug, train=False, **common)
    test_loader = ResidentLoader(*arrays[2], val_aug, train=False, **common) if len(arrays) > 2 else None
    return train_loader, val_loader, test_loader, None
