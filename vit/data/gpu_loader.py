"""A loader for datasets that fit in GPU memory: the split lives on the device as uint8, and whole batches are
augmented there, so no CPU worker sits between the GPU and its next batch.

Per epoch: a seeded permutation; per batch (B images, all ops vectorised over the batch):
    uint8 (B, 3, H, W) --pad-and-crop, per-sample offsets--> --flip, per-sample-->
    --policy (AutoAugment / RandAugment / TrivialAugment), one draw per chunk of `policy_chunk` images-->
    float, normalised (B, 3, H, W)
The decoded split is cached on disk as .npy (beside the data, or in `data.cache_dir`) and reused.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from vit.data.datasets import DataError
from vit.data.transforms import mean_std


def policy_op(policy: str | None):
    """The torchvision (tensor, batch-capable) counterpart of `data.augment.auto_augment`."""
    if not policy:
        return None
    if policy == "autoaug":
        return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    if policy == "trivial":
        return v2.TrivialAugmentWide()
    if policy.startswith("rand"):
        parts = {p[0]: p[1:] for p in policy.split("-")[1:] if p}
        magnitude = int(float(parts.get("m", 9)))
        num_ops = int(parts.get("n", 2))
        return v2.RandAugment(num_ops=num_ops, magnitude=magnitude)
    raise DataError(f"data.augment.auto_augment={policy!r} must be null, autoaug, trivial or a rand-* string")


def decode_split(dataset: Dataset, img_size: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image once, resized and centre-cropped to img_size: uint8 (N, H, W, 3), int64 (N,)."""
    from torchvision import transforms as T

    geometry = T.Compose([T.Resize(img_size, antialias=True), T.CenterCrop(img_size), T.PILToTensor()])

    class Decoded(Dataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            image, target = dataset[i]
            return geometry(image).permute(1, 2, 0), target

    loader = DataLoader(Decoded(), batch_size=256, num_workers=num_workers, shuffle=False)
    images, targets = [], []
    for x, y in loader:
        images.append(x.numpy())
        targets.append(y.numpy())
    return np.concatenate(images), np.concatenate(targets).astype(np.int64)


def cached_split(
    dataset: Dataset, img_size: int, cache_dir: Path, tag: str, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """`decode_split`, stored as two .npy files keyed by the split's files, size and count."""
    files = [s[0] for s in getattr(dataset, "samples", [])] or [str(len(dataset))]
    if hasattr(dataset, "indices"):  # a Subset: the chosen files only
        base = getattr(dataset.dataset, "samples", None)
        if base is not None:
            files = [base[i][0] for i in dataset.indices]
    key = hashlib.sha1("|".join(files).encode()).hexdigest()[:12]
    stem = cache_dir / f"{tag}-{img_size}px-{len(dataset)}-{key}"
    images_path, targets_path = stem.with_suffix(".images.npy"), stem.with_suffix(".targets.npy")
    if images_path.is_file() and targets_path.is_file():
        return np.load(images_path), np.load(targets_path)
    images, targets = decode_split(dataset, img_size, num_workers)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for path, array in ((images_path, images), (targets_path, targets)):
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as handle:
            np.save(handle, array)
        os.replace(tmp, path)
    return images, targets


class GpuLoader:
    """Iterable of (images float (B, 3, H, W) normalised, targets int64 (B,)) on `device`."""

    def __init__(
        self,
        images: np.ndarray,
        targets: np.ndarray,
        cfg: Mapping,
        *,
        batch_size: int,
        device: torch.device,
        train: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        # (N, H, W, 3) uint8 -> (N, 3, H, W) uint8 on the device: a CIFAR-10 train split is 150 MB.
        self.images = torch.from_numpy(np.ascontiguousarray(images)).to(device).permute(0, 3, 1, 2).contiguous()
        self.targets = torch.from_numpy(np.asarray(targets)).to(device)
        self.device = device
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        aug = cfg.get("augment") or {}
        self.crop = aug.get("crop", "pad") if train else "none"
        self.pad = int(aug.get("pad", 4))
        self.hflip = bool(aug.get("hflip", True)) and train
        self.policy = policy_op(aug.get("auto_augment")) if train else None
        self.policy_chunk = int(aug.get("policy_chunk", 16))
        mean, std = mean_std(cfg)
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        if self.crop == "rrc":
            raise DataError("data.loader=gpu supports data.augment.crop=pad or none; use data.loader=torch for rrc")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        n = len(self.targets)
        if not self.train:
            order = torch.arange(n, device=self.device)
        else:
            generator = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
            order = torch.randperm(n, generator=generator).to(self.device)
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        per_rank = len(self.targets) // self.world_size if self.train else -(-len(self.targets) // self.world_size)
        return per_rank // self.batch_size if self.train else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._indices()
        generator = torch.Generator(device=self.device).manual_seed(self.seed * 7919 + self.epoch)
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.augment(self.images[idx], generator), self.targets[idx]
        self.epoch += 1 if self.train else 0

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> float normalised (B, 3, H, W)."""
        if self.crop == "pad" and self.pad > 0:
            x = random_pad_crop(x, self.pad, generator)
        if self.hflip:
            flip = torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
        if self.policy is not None:
            x = torch.cat([self.policy(chunk) for chunk in x.split(self.policy_chunk)])
        return (x.float().div_(255) - self.mean) / self.std


def random_pad_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by `pad` and cut a random HxW window per sample, in one gather. (B, C, H, W) -> same."""
    batch, _, height, width = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    off_y = torch.randint(0, 2 * pad + 1, (batch, 1), device=x.device, generator=generator)
    off_x = torch.randint(0, 2 * pad + 1, (batch, 1), device=x.device, generator=generator)
    rows = off_y + torch.arange(height, device=x.device)  # (B, H)
    cols = off_x + torch.arange(width, device=x.device)  # (B, W)
    b = torch.arange(batch, device=x.device).view(batch, 1, 1)
    # Advanced indices on dims 0, 2, 3 broadcast to (B, H, W); the sliced channel dim goes last.
    out = padded[b, :, rows.view(batch, height, 1), cols.view(batch, 1, width)]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
