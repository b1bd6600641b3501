"""data=webdataset: tar shards streamed through DataLoader workers, then the same device-side augmentation as every
other dataset.

An image's way: a worker reads its pieces of the shards (vit/data/sources/shards.py says which) as raw samples (bytes),
shuffles them in a buffer seeded from (seed, epoch, rank, stream), drops the ones a resume skips (before
decoding them), decodes the rest with the image folders' PIL conversion (`to_rgb`) into uint8 (3, H, W) by the
folders' worker geometry (`train_geometry` / `val_geometry`), and the DataLoader stacks B of them into a uint8
(B, 3, H, W) batch. `DeviceBatches` (torch_loader.py) then moves the batch to the device and runs
`BatchAugment` on it: float32 (B, 3, H, W), normalised.

Batch i of a rank comes from stream i % K (K = max(1, data.num_workers)), which is how the DataLoader takes
batches from its workers in turn; after `skip_batches(c)` worker w serves stream (w + c) % K, so the batches
go on at c in the same order. Everything is seeded (the random-resized crop too, per sample), so a resumed
epoch sees exactly the batches the uninterrupted one would have, given the same world size, batch size and
worker count.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vit.data.augment.batch import BatchAugment
from vit.data.augment.transforms import mixup_and_criterion, resize_filter, train_geometry, val_geometry
from vit.data.errors import DataError
from vit.data.images import decode, problem_of, to_rgb
from vit.data.loading.bundle import DataBundle
from vit.data.loading.naflex_loader import NaFlexFileBatches, NaFlexSchedule, OwnShape
from vit.data.loading.torch_loader import DeviceBatches, init_worker
from vit.data.resources import num_workers
from vit.data.sources.shards import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSION,
    class_map,
    cyclic_plan,
    expand_shards,
    known_lengths,
    train_plan,
    val_plan,
    val_shards,
)
from vit.settings.data import WebDatasetSettings

log = logging.getLogger(__name__)


def _mix(*values: int) -> int:
    """One 63-bit seed from several integers (seed, epoch, rank, stream, position)."""
    out = 0
    for value in values:
        out = (out * 1_000_003 + int(value)) % 2**63
    return out


class ShardStream(IterableDataset):
    """One rank's samples of one split, as (uint8 (3, H, W), class index, images skipped as unreadable) from
    each of `streams` DataLoader workers. `set_epoch` and `skip` (samples, a whole number of batches) are set by
    `DeviceBatches` before each pass; the DataLoader copies the dataset into fresh workers every pass."""

    def __init__(self, urls, lengths, geometry, *, train, seed, rank, world_size, streams, batch_size, num_classes,
                 on_bad="error", shuffle_buffer=0, limit=None, epoch_samples=None, random_crop=False):  # fmt: skip
        self.urls, self.lengths, self.geometry, self.train = urls, lengths, geometry, train
        self.seed, self.rank, self.world_size, self.streams = seed, rank, world_size, streams
        self.batch_size, self.num_classes, self.on_bad = batch_size, num_classes, on_bad
        self.shuffle_buffer, self.limit, self.epoch_samples = shuffle_buffer, limit, epoch_samples
        self.random_crop = random_crop
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.skip = epoch, 0

    def num_samples(self) -> int:
        """Samples in one pass over all ranks (before the per-rank and per-batch remainders)."""
        if self.epoch_samples:
            return int(self.epoch_samples)
        total = sum(self.lengths)
        return min(total, int(self.limit)) if self.limit else total

    def batch_sizes(self) -> list[int]:
        """The samples of each of this rank's training batches in a whole pass, in their order."""
        return [self.batch_size] * (self.num_samples() // self.world_size // self.batch_size)

    def batches(self) -> list[int]:
        """Batches of each stream in a whole pass of this rank."""
        if self.train:
            sizes = self.batch_sizes()
            return [len(sizes[stream :: self.streams]) for stream in range(self.streams)]
        return [-(-size // self.batch_size) for size in self._val_sizes()]

    def _val_sizes(self) -> list[int]:
        return [sum(stop - first for _, first, stop in pieces) for pieces in self.plan()]

    def batches_done(self) -> int:
        """The batches of this pass already trained (a resume inside an epoch): `skip` counts samples."""
        return self.skip // self.batch_size

    def batches_left(self) -> int:
        return sum(self.batches()) - self.batches_done()

    def __len__(self) -> int:  # samples still to come on this rank (the DataLoader counts its batches from it)
        if self.train:
            return self.batches_left() * self.batch_size
        return sum(self._val_sizes())

    def plan(self) -> list[list[tuple[int, int, int | None]]]:
        where = dict(rank=self.rank, world_size=self.world_size, streams=self.streams)
        if not self.train:
            return val_plan(self.lengths, limit=self.limit, **where)
        if self.epoch_samples:
            return cyclic_plan(len(self.urls), seed=self.seed, epoch=self.epoch, **where)
        return train_plan(
            self.lengths, seed=self.seed, epoch=self.epoch, batch_sizes=self.batch_sizes(), limit=self.limit, **where
        )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int]]:
        yield from self._items(*self._where())

    def _where(self) -> tuple[int, int]:
        """The stream this worker reads in this pass, and how many of that stream's batches a resume skips."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers != self.streams:
            raise RuntimeError(f"a ShardStream of {self.streams} streams read by {workers} workers")
        done = self.batches_done()
        stream = (worker + done) % self.streams
        return stream, max(0, -(-(done - stream) // self.streams))  # this stream's batches among the first `done`

    def _items(self, stream: int, skipped: int) -> Iterator[tuple[object, int, int]]:
        """The stream's decoded samples (image, class index, unreadable ones left out before it) after its first
        `skipped` batches."""
        sizes = self.batch_sizes()[stream :: self.streams] if self.train else []
        raw = self._raw(self.plan()[stream], sum(sizes) if self.train else None)
        if self.train and self.shuffle_buffer > 1:
            # webdataset is an optional dependency (pip install .[data]), imported where shards are read, so that
            # vit/data loads and trains the other datasets without it.
            from webdataset.filters import _shuffle

            rng = random.Random(_mix(self.seed, self.epoch, self.rank, stream))
            raw = _shuffle(raw, self.shuffle_buffer, self.shuffle_buffer, rng=rng)
        return self._decoded(raw, sum(sizes[:skipped]), stream)

    def _raw(self, pieces, quota: int | None) -> Iterator[dict]:
        """The raw samples of `pieces` in order; with a quota exactly that many (data.epoch_samples: reading the
        pieces again and again)."""
        produced = 0
        while True:
            before = produced
            for shard, first, stop in pieces:
                for sample in self._piece(shard, first, stop):
                    yield sample
                    produced += 1
                    if produced == quota:
                        return
            if quota is None or not self.epoch_samples or produced == before:
                break
        if quota is not None and produced < quota:
            shards = ", ".join(self.urls[s] for s, _, _ in pieces[:3])
            raise DataError(f"shards {shards}: only {produced} samples where {quota} were expected")

    def _piece(self, shard: int, first: int, stop: int | None) -> Iterator[dict]:
        """Samples first..stop-1 of a shard, undecoded (those before `first` are read past, not decoded)."""
        from webdataset.tariterators import tarfile_samples  # optional dependency: see ShardStream.__iter__

        url, index = self.urls[shard], -1
        try:
            for index, sample in enumerate(tarfile_samples(iter([{"url": url}]))):
                if stop is not None and index >= stop:
                    return
                if index >= first:
                    yield sample
        except DataError:
            raise
        except Exception as err:  # not a tar, truncated, unreadable
            why = err.args[0] if err.args else err
            raise DataError(f"shard {url} cannot be read ({type(err).__name__}: {why})") from None
        if stop is not None and index + 1 < stop:
            raise DataError(f"shard {url} holds {index + 1} samples but its info file lists at least {stop}")

    def _decoded(self, raw: Iterator[dict], skip: int, stream: int) -> Iterator[tuple[torch.Tensor, int, int]]:
        """Decode from position `skip` on. data.on_bad_image=skip: an unreadable training image's place is taken
        by the next readable one (so every rank keeps its number of batches); in validation it is left out."""
        pending, bad, last = 0, 0, None
        for position, sample in enumerate(raw):
            if position < skip:
                continue
            item = self._decode(sample, _mix(self.seed, self.epoch, self.rank, stream, position))
            if item is None:
                pending, bad = pending + self.train, bad + 1
                continue
            for _ in range(1 + pending):
                yield item[0], item[1], bad
                bad = 0
            pending, last = 0, item
        if pending and last is None:
            raise DataError(f"no readable image in the shards one loader worker read ({self.urls[0]}, ...)")
        for _ in range(pending):
            yield last[0], last[1], bad
            bad = 0
        if bad:
            log.warning("data.on_bad_image=skip: left out %d unreadable validation images", bad)

    def _decode(self, sample: dict, seed: int) -> tuple[torch.Tensor, int] | None:
        url, key = sample.get("__url__"), sample.get("__key__")
        label = self._label(sample, url, key)
        ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        if ext is None:
            raise DataError(f"shard {url}: sample {key} has no image ({', '.join('.' + e for e in IMAGE_EXTENSIONS)})")
        try:
            rgb = to_rgb(decode(sample[ext]))
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... on damaged data
            if self.on_bad == "error":
                raise DataError(
                    f"shard {url}: sample {key}.{ext} cannot be decoded ({problem_of(err)}); "
                    "set data.on_bad_image=skip to leave such samples out and use the rest"
                ) from None
            return None
        if not self.random_crop:
            return self.geometry(rgb), label
        with torch.random.fork_rng(devices=[]):  # the crop from (seed, epoch, rank, stream, position) alone
            torch.manual_seed(seed)
            return self.geometry(rgb), label

    def _label(self, sample: dict, url, key) -> int:
        raw = sample.get(LABEL_EXTENSION)
        if raw is None:
            raise DataError(f"shard {url}: sample {key} has no .cls label (<key>.cls holding its class index)")
        try:
            label = int(raw.decode().strip())
        except (UnicodeDecodeError, ValueError):
            raise DataError(f"shard {url}: sample {key}.cls holds {raw[:20]!r}, not a class index") from None
        if not 0 <= label < self.num_classes:
            raise DataError(
                f"shard {url}: sample {key}.cls holds {label}, outside 0..{self.num_classes - 1} "
                f"(data.num_classes={self.num_classes})"
            )
        return label


class NaFlexShardStream(ShardStream):
    """data.naflex over tar shards: one rank's training samples as the token budget's batches (vit/data/loading/
    naflex_loader.py's `NaFlexSchedule`, the same for every epoch, each epoch in its own order). Batch b of a pass comes
    from stream b % K as above, each stream reading one contiguous piece of the rank's range; a worker crops each
    image as it decodes it (crop=rrc, seeded by its place, so a resume crops alike), then resizes the images of a
    batch, each with its aspect ratio kept, to its grid for the batch's seq_len. Yields whole batches: (uint8
    (3, h_i, w_i) list, int64 (b,) targets, seq_len, patch side or None for the run's own, unreadable images left
    out). `skip` counts batches, as `NaFlexFileBatches` sets it; `len()` is the batches still to come."""

    def __init__(self, *args, seq_lens, tokens: int, patch_sizes, own_shape: OwnShape, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        images = self.num_samples() // self.world_size
        self.schedule = NaFlexSchedule(images, seq_lens, tokens, self.seed, patch_sizes)
        self.mean_batch_size = self.schedule.mean_batch_size
        self.own_shape = own_shape

    def batch_sizes(self) -> list[int]:
        return [size for _, size, _, _ in self.schedule.of_epoch(self.epoch)]

    def batches_done(self) -> int:
        return self.skip

    def batches_left(self) -> int:
        return len(self.schedule) - self.skip

    def __len__(self) -> int:
        return self.batches_left()

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor, int, int | None, int]]:
        stream, skipped = self._where()
        items = self._items(stream, skipped)
        for seq_len, size, _, patch in self.schedule.of_epoch(self.epoch)[stream :: self.streams][skipped:]:
            batch = list(itertools.islice(items, size))  # _raw has raised if the stream held fewer
            images = [self.own_shape.fit(image, seq_len, patch) for image, _, _ in batch]
            targets = torch.tensor([target for _, target, _ in batch], dtype=torch.long)
            yield images, targets, seq_len, patch, sum(bad for _, _, bad in batch)


def as_batch(batch):
    """collate_fn of a stream that yields whole batches (DataLoader batch_size=None): the batch as it is."""
    return batch


def worker_message(err: Exception) -> str:
    """A DataError's own message, also when a DataLoader worker raised it (the main process then gets it wrapped
    in a multi-line text ending with the original `...DataError: <message>` line)."""
    text = str(err)
    if "\n" not in text:
        return text
    last = [line for line in text.splitlines() if line.strip()][-1]
    return last.split("DataError: ", 1)[-1]


class StreamLoader:
    """A DataLoader over a `ShardStream` as `DeviceBatches` drives it: uint8 (B, 3, H, W) and int64 (B,) batches
    (a `NaFlexShardStream`'s for `NaFlexFileBatches`: images of their own shapes, targets, seq_len, patch side),
    `len()` the batches still to come, errors from workers as one line, unreadable images counted per pass."""

    def __init__(self, dataset: ShardStream, loader: torch.utils.data.DataLoader) -> None:
        self.dataset, self.loader = dataset, loader
        self.batch_size, self.generator = loader.batch_size, loader.generator

    def __len__(self) -> int:
        return self.dataset.batches_left()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        bad = 0
        batches = iter(self.loader)
        try:
            for *batch, skipped in batches:  # (images, targets[, seq_len, patch side]) and unreadable ones left out
                bad += int(torch.as_tensor(skipped).sum())
                yield tuple(batch)
        except DataError as err:
            # Stop the workers now, not when the error's traceback (which keeps this iterator alive) is dropped.
            shutdown = getattr(batches, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            raise DataError(worker_message(err)) from None
        if bad:
            split = "training" if self.dataset.train else "validation"
            log.warning(
                "data.on_bad_image=skip: %d unreadable %s images this epoch (epoch %d)%s",
                bad,
                split,
                self.dataset.epoch,
                "; each place taken by the next readable image" if self.dataset.train else ", left out",
            )


def _settings(cfg: WebDatasetSettings) -> tuple[str, int, int | None]:
    """(on_bad_image, shuffle_buffer, epoch_samples), after refusing what this loader cannot do."""
    if cfg.loader == "resident":
        raise DataError(
            "data.loader=resident cannot read data=webdataset (shards stream through CPU loader workers): use "
            "data.loader=auto or data.loader=torch"
        )
    if cfg.holdout is not None:
        raise DataError(
            f"data.holdout={cfg.holdout!r} is not available with data=webdataset: write the held-out images "
            "as their own shards and pass them as data.val_urls"
        )
    if (cfg.repeated_aug or 1) > 1:
        raise DataError(f"data.repeated_aug={cfg.repeated_aug} is not available with data=webdataset (use 1)")
    return cfg.on_bad_image, cfg.shuffle_buffer or 0, cfg.epoch_samples


def build_stream_data(
    cfg: WebDatasetSettings, spec, mean, std, *, device, seed, rank, world_size, batch_size
) -> DataBundle:
    """The train/val loaders of data=webdataset, as a `DataBundle` like the other datasets'."""
    on_bad, buffer, epoch_samples = _settings(cfg)
    if spec.hflip_alternate:  # with hflip (build_data checks)
        raise DataError(
            "data.augment.hflip_alternate=true is not available with data=webdataset: a stream has no fixed index "
            "per image to alternate its flip by (use false: each flip drawn anew)"
        )
    train_urls = expand_shards(cfg.urls, "urls")
    val_urls, val_name = val_shards(cfg, train_urls)
    num_classes, class_to_idx = class_map(cfg, train_urls)
    workers = num_workers(cfg)
    common = dict(seed=seed, rank=rank, world_size=world_size, streams=max(1, workers), batch_size=batch_size)
    common.update(num_classes=num_classes, on_bad=on_bad)
    train_lengths = known_lengths(train_urls, "urls", epoch_samples)
    train_common = dict(train=True, shuffle_buffer=buffer, limit=cfg.limit_train_samples, epoch_samples=epoch_samples,
                        random_crop=spec.crop == "rrc", **common)  # fmt: skip
    val_ds = ShardStream(
        val_urls, known_lengths(val_urls, "val_urls", None), val_geometry(cfg), train=False,
        limit=cfg.limit_val_samples, **common,
    )  # fmt: skip
    wrap = dict(device=device, seed=seed, rank=rank)
    pin = cfg.pin_memory and torch.device(device).type == "cuda"
    # Not persistent: each pass copies the dataset (its epoch and skip) into fresh workers.
    over = dict(num_workers=workers, pin_memory=pin, worker_init_fn=init_worker)
    over.update(generator=torch.Generator().manual_seed(seed))
    train_aug = BatchAugment(spec, mean, std, cfg.img_size, train=True, crop_done=True)
    naflex = cfg.naflex
    if naflex.seq_lens is not None:  # the images at their own shapes, as the token budget's batches
        own_shape = OwnShape(cfg.patch_size, spec.crop, float(spec.scale_min), resize_filter(cfg))
        tokens = batch_size * (naflex.max_seq_len or max(naflex.seq_lens))
        budget = dict(seq_lens=naflex.seq_lens, tokens=tokens, patch_sizes=naflex.patch_sizes, own_shape=own_shape)
        train_ds = NaFlexShardStream(train_urls, train_lengths, own_shape.crop, **budget, **train_common)
        loader = StreamLoader(train_ds, DataLoader(train_ds, batch_size=None, collate_fn=as_batch, **over))
        train = NaFlexFileBatches(loader, train_ds, train_aug, cfg.patch_size, **wrap)
    else:
        train_ds = ShardStream(train_urls, train_lengths, train_geometry(cfg, spec), **train_common)
        loader = StreamLoader(train_ds, DataLoader(train_ds, batch_size=batch_size, **over))
        train = DeviceBatches(loader, train_ds, train_aug, **wrap)
    over["generator"] = torch.Generator().manual_seed(seed)  # its own: evaluating must not move the training loader's
    val_loader = StreamLoader(val_ds, DataLoader(val_ds, batch_size=batch_size, **over))
    val = DeviceBatches(val_loader, val_ds, BatchAugment(spec, mean, std, cfg.img_size, train=False), **wrap)
    if len(train) == 0:
        raise DataError(
            f"data.batch_size={batch_size} is larger than the {train_ds.num_samples() // world_size} training "
            f"samples of each of the {world_size} processes: no full batch"
        )
    reason = f"data=webdataset: {len(train_urls)} training shards streamed through {workers} CPU loader workers"
    log.info("loader: webdataset (%s)", reason)
    mixup_fn, criterion = mixup_and_criterion(spec, num_classes)
    kind = cfg.name  # the loader is the stream of this dataset's shards, reported by the dataset's name
    return DataBundle(
        train, val, num_classes, class_to_idx, mixup_fn, criterion, mean, std, cfg.img_size,
        train_ds.num_samples(), val_ds.num_samples(), None, kind, reason, val_name, train_workers=workers,
    )  # fmt: skip
