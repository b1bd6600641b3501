"""NaFlex training batches (`data.naflex.seq_lens`): every batch draws a sequence length, its images are resized to
fit that many patches and cut into them (vit/naflex.py's format), and the batch holds as many images as the token
budget allows, so short sequences come in large batches and long ones in small batches (NaViT's patch-n-pack,
timm's NaFlex loader's schedule).

The schedule of an epoch's batches (`NaFlexSchedule`):

    tokens per batch  = data.batch_size x data.naflex.max_seq_len        (per process)
    a batch           = (seq_len drawn from seq_lens, tokens per batch // seq_len images)   timm's batch-size rule
                        and, with data.naflex.patch_sizes, a patch side drawn from them (FlexiViT's random patch
                        sizes, timm's patch_size_choices): the images resized for seq_len patches of that side,
                        the batch's patches unflattened (p, p, 3) so the model resamples its kernel to them
    the epoch         = such batches until the images run out (a last one that would not be full is dropped)

The batches are drawn once from the run's seed, so every epoch has the same number of them (the step count a
budget plans and a resume skips) and each epoch trains them in an order of its own, over the images in the
epoch's permutation (vit/data/loading/sampling.py). Under torchrun every rank follows the same schedule and takes
every world_size-th image of each global batch.

Three loaders make them, as for square batches:
- `NaFlexLoader`, the resident loader's: the decoded split (at data.img_size) through the run's augmentation
  (`BatchAugment`: crop, flip, policy, normalisation, erasing), then each batch resized to its grid (the aspect
  ratio kept, the sides whole numbers of patches: timm's `get_image_size_for_seq`) and packed;
- `NaFlexFileBatches`, the torch loader's: each image decoded in a worker and kept at its own shape (a
  random-resized crop of it with crop=rrc), resized to its own grid for the batch's seq_len, then on the device the
  images of one shape augmented together (the crop already done) and all of them packed, each on its grid;
- the same `NaFlexFileBatches` over tar shards (vit/data/loading/stream.py's `NaFlexShardStream`): the schedule's
  batches read by the loader workers from their pieces of the shards, each batch resized in its worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from timm.data.naflex_dataset import calculate_naflex_batch_size
from timm.data.naflex_transforms import get_image_size_for_seq
from torch.utils.data import Dataset, Sampler
from torchvision import transforms as T

from vit.data.augment.batch import BatchAugment, resize_batch
from vit.data.loading.resident import ResidentLoader
from vit.data.loading.sampling import epoch_order
from vit.naflex import pack, pack_batch


def batch_schedule(
    images: int, seq_lens: tuple[int, ...], tokens: int, seed: int, patch_sizes: tuple[int, ...] | None = None
) -> list[tuple[int, int, int | None]]:
    """One process's batches of an epoch over `images` images, as (seq_len, images in the batch, patch side),
    drawn from `seed`: each batch's seq_len uniformly from `seq_lens`, its size `tokens // seq_len` (timm's
    `calculate_naflex_batch_size`), its patch side uniformly from `patch_sizes` (None without them: the run's own),
    until the next batch would not be full."""
    generator = torch.Generator().manual_seed(seed)
    schedule, left = [], images
    while True:
        seq_len = seq_lens[int(torch.randint(len(seq_lens), (1,), generator=generator))]
        size = calculate_naflex_batch_size(tokens, seq_len)
        if size > left:
            return schedule
        patch = patch_sizes[int(torch.randint(len(patch_sizes), (1,), generator=generator))] if patch_sizes else None
        schedule.append((seq_len, size, patch))
        left -= size


class NaFlexSchedule:
    """A process's batches over `images` images (`batch_schedule`) and the order each epoch trains them in."""

    def __init__(
        self, images: int, seq_lens: tuple[int, ...], tokens: int, seed: int, patch_sizes: tuple[int, ...] | None = None
    ) -> None:
        self.batches = batch_schedule(images, tuple(seq_lens), tokens, seed, patch_sizes)
        self.seed = seed
        self.mean_batch_size = sum(size for _, size, _ in self.batches) / max(1, len(self.batches))

    def __len__(self) -> int:
        return len(self.batches)

    def of_epoch(self, epoch: int) -> list[tuple[int, int, int, int | None]]:
        """The batches of `epoch` in their order: (seq_len, images per process, the first of this process's places
        in the epoch's order of its images, the patch side or None for the run's own)."""
        order = torch.randperm(len(self.batches), generator=torch.Generator().manual_seed(self.seed + epoch))
        batches, start = [], 0
        for index in order.tolist():
            seq_len, size, patch = self.batches[index]
            batches.append((seq_len, size, start, patch))
            start += size
        return batches


def grid_for(image_hw: tuple[int, int], patch_size: int, seq_len: int) -> tuple[int, int]:
    """The (height, width) in pixels an image of `image_hw` is resized to for `seq_len` tokens: its aspect ratio
    kept, each side a whole number of patches, at most `seq_len` patches in all (and at least one)."""
    return tuple(get_image_size_for_seq(image_hw, patch_size, seq_len)[1])


class PackImages:
    """A DataLoader's collate_fn for (image (3, H_i, W_i), target) samples of any shapes: one NaFlex batch, padded
    to its longest image, and the targets int64 (B,). Evaluation and prediction at the images' own shapes."""

    def __init__(self, patch_size: int) -> None:
        self.patch_size = int(patch_size)

    def __call__(self, samples) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        images, targets = zip(*samples, strict=True)
        return pack(list(images), (self.patch_size, self.patch_size)), torch.as_tensor(targets, dtype=torch.long)


class NaFlexLoader(ResidentLoader):
    """The resident loader's training split as NaFlex batches: iterable of (dict of `patches` (b, L, p * p * 3),
    `patch_coord` (b, L, 2), `patch_valid` (b, L); targets int64 (b,)) on the device, b and L the batch's own.
    `len()` is the epoch's batch count, the same every epoch; `skip_batches` and `set_epoch` as the resident
    loader's."""

    def __init__(
        self, images, targets, augment, *, seq_lens, max_seq_len: int, patch_size: int, patch_sizes=None, **kwargs
    ) -> None:
        super().__init__(images, targets, augment, train=True, **kwargs)
        self.patch_size = int(patch_size)
        per_rank = len(self.targets) // self.world_size
        tokens = self.batch_size * int(max_seq_len)
        self.schedule = NaFlexSchedule(per_rank, seq_lens, tokens, self.seed, patch_sizes)
        self.mean_batch_size = self.schedule.mean_batch_size

    def _full_len(self) -> int:
        return len(self.schedule)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        # this rank's places of the epoch's order: every world_size-th, so global batch k is the next
        # size x world_size images of the permutation, this rank taking every world_size-th of them
        order = epoch_order(len(self.targets), self.seed, self.epoch, self.repeats).to(self.device)
        order = order[self.rank :: self.world_size]
        skip, self.skip = self.skip, 0
        size_hw = tuple(self.images.shape[-2:])
        for b, (seq_len, size, start, patch) in enumerate(self.schedule.of_epoch(self.epoch)):
            if b < skip:
                continue
            idx = order[start : start + size]  # (size,)
            generator = self.augment.generator(self.seed, self.epoch, self.rank, b)
            flip = self.alternating_flip(idx, self.epoch, self.device) if self.alternating_flip else None
            images = self.augment(self.images[idx], generator, flip)  # float (size, 3, H, W), normalised
            side = patch or self.patch_size
            images = resize_batch(images, grid_for(size_hw, side, seq_len))  # (size, 3, h, w)
            yield pack_batch(images, (side, side), seq_len, flat=side == self.patch_size), self.targets[idx]
        self.epoch += 1


# ---- the torch loader's: images decoded in workers at their own shapes ----


class OwnShape:
    """(PIL image, seq_len[, patch side]) -> uint8 (3, h, w): with crop=rrc a random-resized crop of the file
    (torchvision's box: area in [scale_min, 1], aspect ratio in [3/4, 4/3]), else the whole image, resized with its
    aspect ratio kept to at most seq_len patches (of `patch_size`, or the batch's own side), each side a whole
    number of them. The two halves apart (`crop`, `fit`) for a loader that crops an image before it knows the
    seq_len of its batch (the shard stream's)."""

    def __init__(self, patch_size: int, crop: str, scale_min: float, interpolation: str) -> None:
        self.patch_size, self.random_crop, self.scale_min = int(patch_size), crop == "rrc", float(scale_min)
        self.mode = T.InterpolationMode(interpolation)

    def crop(self, image):
        if not self.random_crop:
            return image
        top, left, height, width = T.RandomResizedCrop.get_params(image, (self.scale_min, 1.0), (3 / 4, 4 / 3))
        return T.functional.crop(image, top, left, height, width)

    def fit(self, image, seq_len: int, patch: int | None = None) -> torch.Tensor:
        size = grid_for((image.height, image.width), patch or self.patch_size, seq_len)
        resized = T.functional.resize(image, list(size), interpolation=self.mode, antialias=True)
        return T.functional.pil_to_tensor(resized)

    def __call__(self, image, seq_len: int, patch: int | None = None) -> torch.Tensor:
        return self.fit(self.crop(image), seq_len, patch)


class ToSequence(Dataset):
    """A split whose items are asked for as (index, seq_len, patch side or None): (uint8 (3, h, w) at the shape
    that seq_len patches of that side give this image, target, seq_len, patch side)."""

    def __init__(self, dataset: Dataset, geometry: OwnShape) -> None:
        self.dataset, self.geometry = dataset, geometry

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int, int | None]):
        index, seq_len, patch = item
        image, target = self.dataset[index]
        return self.geometry(image, seq_len, patch), target, seq_len, patch


def as_lists(samples) -> tuple[list[torch.Tensor], torch.Tensor, int, int | None]:
    """collate_fn: the images as a list (their shapes differ), the targets int64 (B,), the batch's seq_len and
    patch side (None: the run's own)."""
    images, targets, seq_lens, patches = zip(*samples, strict=True)
    return list(images), torch.as_tensor(targets, dtype=torch.long), seq_lens[0], patches[0]


class ScheduledBatches(Sampler):
    """The torch loader's batch_sampler: each batch of the schedule's epoch order as [(index, seq_len, patch side),
    ...], the
    indices this rank's of the epoch (`EpochSampler.epoch_indices`), consecutively; `skip` batches of the next
    epoch already trained (a resume inside an epoch)."""

    def __init__(self, sampler, schedule: NaFlexSchedule) -> None:
        self.sampler, self.schedule = sampler, schedule
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.skip = 0

    def __len__(self) -> int:
        return len(self.schedule) - min(self.skip, len(self.schedule))

    def __iter__(self):
        indices = self.sampler.epoch_indices().tolist()
        skip, self.skip = self.skip, 0
        for b, (seq_len, size, start, patch) in enumerate(self.schedule.of_epoch(self.sampler.epoch)):
            if b >= skip:
                yield [(index, seq_len, patch) for index in indices[start : start + size]]


class NaFlexFileBatches:
    """The torch loader's NaFlex batches, as the trainer sees them: each batch's images moved to the device,
    those of one shape through `augment` together (its crop done in the workers), then packed on their own grids
    into one NaFlex batch of the batch's seq_len. `set_epoch`, `skip_batches`, `generator` as `DeviceBatches`."""

    def __init__(self, loader, batches: ScheduledBatches, augment: BatchAugment, patch_size: int, *, device, seed: int,
                 rank: int) -> None:  # fmt: skip
        self.loader, self.batches, self.augment = loader, batches, augment
        self.device, self.seed, self.rank = torch.device(device), seed, rank
        self.epoch, self.patch_size = 0, int(patch_size)
        self.generator = loader.generator  # seeds the workers each epoch (vit/train/setup.py's set_loader_epoch)
        self.mean_batch_size = batches.schedule.mean_batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches.set_epoch(epoch)

    def skip_batches(self, count: int) -> None:
        self.batches.skip = count

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        start = len(self.batches.schedule) - len(self.batches)
        for index, (images, targets, seq_len, side) in enumerate(self.loader, start):
            generator = self.augment.generator(self.seed, self.epoch, self.rank, index)
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for i, image in enumerate(images):
                by_shape.setdefault(tuple(image.shape), []).append(i)
            out: list[torch.Tensor | None] = [None] * len(images)
            for members in by_shape.values():  # one call a shape: every image drawing from the batch's generator
                group = torch.stack([images[i] for i in members]).to(self.device, non_blocking=True)
                for i, augmented in zip(members, self.augment(group, generator), strict=True):
                    out[i] = augmented
            side = side or self.patch_size
            packed = pack(out, (side, side), seq_len, flat=side == self.patch_size)
            yield packed, targets.to(self.device, non_blocking=True)
        self.epoch += 1
        self.batches.set_epoch(self.epoch)
