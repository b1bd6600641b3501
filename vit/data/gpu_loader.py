"""A loader for datasets that fit in GPU memory: the split lives on the device as uint8, and whole batches are
augmented there, so no CPU worker sits between the GPU and its next batch.

Per epoch: a seeded permutation; per batch of B images, every op vectorised over the batch with its own random
draw per sample unless noted:
    uint8 (B, 3, H, W)
      --crop: pad-and-crop (one gather) or random-resized-crop (one grid_sample)-->
      --horizontal flip-->
      --policy (`augment.policy_impl`: batched, vit/data/batched_policy.py: AutoAugment / RandAugment /
        TrivialAugmentWide with per-sample draws from the loader's generator, a fixed number of launches per op
        family; or torchvision: the v2 transforms, which draw one op per call from the global RNG, called on chunks
        of `augment.policy_chunk` images. AugMix always runs on torchvision's)-->
    float (B, 3, H, W), normalised
      --random erasing (per-pixel Gaussian noise in a random box, like RandomErasing(value="random"))-->
The decoded split is cached on disk as .npy (beside the data, or in `data.cache_dir`) and reused across runs.

It also runs with device="cpu" (tests, debugging): the same ops, only slower.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision import transforms as T
from torchvision.transforms import v2

from vit.data.batched_policy import BatchedAutoAugment, BatchedPolicy, BatchedRandAugment, BatchedTrivialAugmentWide
from vit.data.datasets import DataError
from vit.data.sampling import repeat_order
from vit.data.transforms import CROPS, POLICY_HELP, is_small, mean_std, policy_options

POLICY_IMPLS = ("batched", "torchvision")


def policy_op(policy: str | None, img_size: int, impl: str = "torchvision"):
    """The uint8-batch counterpart of `data.augment.auto_augment`: torchvision's v2 transform, or with
    impl="batched" its per-sample version from vit/data/batched_policy.py (called as `op(x, generator)`).

    timm strings map to their nearest torchvision op: "rand-mM-nN" -> RandAugment(num_ops=N, magnitude=M on
    timm's 0..10 scale); "augmix-mM-wW-dD-aA" -> AugMix(severity=M, width=W, depth=D, alpha=A), torchvision's in
    both impls. timm's extras (mstd magnitude noise, inc, per-op probability) have no counterpart here and are
    ignored.
    """
    if impl not in POLICY_IMPLS:
        raise DataError(f"data.augment.policy_impl={impl!r} must be one of {POLICY_IMPLS}")
    if not policy:
        return None
    batched = impl == "batched"
    if policy == "autoaug":
        if batched:
            return BatchedAutoAugment("cifar10" if is_small(img_size) else "imagenet")
        return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10 if is_small(img_size) else v2.AutoAugmentPolicy.IMAGENET)
    if policy == "trivial":
        return BatchedTrivialAugmentWide() if batched else v2.TrivialAugmentWide()
    options = policy_options(policy)
    if policy.split("-")[0] == "rand":
        magnitude = min(10, max(0, round(float(options.get("m", 10)))))
        num_ops = int(options.get("n", 2))
        if batched:
            return BatchedRandAugment(num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=11)
        return v2.RandAugment(num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=11)
    if policy.split("-")[0] == "augmix":
        return v2.AugMix(
            severity=min(10, max(1, round(float(options.get("m", 3))))),
            mixture_width=int(options.get("w", 3)),
            chain_depth=int(options.get("d", -1)),
            alpha=float(options.get("a", 1.0)),
        )
    raise DataError(f"data.augment.auto_augment={policy!r} must be {POLICY_HELP}")


def decode_size(img_size: int, train: bool) -> int:
    """The shorter side images are resized to before the centre crop: val crops the central 87.5% of
    ImageNet-sized images like `val_transform`; train keeps the whole image (the batch crops come later)."""
    return int(round(img_size / 0.875)) if not train and img_size >= 128 else img_size


class _Decoded(Dataset):
    """(uint8 (H, W, 3) tensor, target) pairs of a dataset of PIL images, resized and centre-cropped.

    A module-level class (not a closure) so DataLoader workers can pickle it under any start method."""

    def __init__(self, dataset: Dataset, img_size: int, resize: int) -> None:
        self.dataset = dataset
        self.geometry = T.Compose([T.Resize(resize, antialias=True), T.CenterCrop(img_size), T.PILToTensor()])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.geometry(image).permute(1, 2, 0), target  # (3, H, W) -> (H, W, 3)


def decode_split(dataset: Dataset, img_size: int, resize: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image once: uint8 (N, H, W, 3) and int64 (N,)."""
    loader = DataLoader(_Decoded(dataset, img_size, resize), batch_size=256, num_workers=num_workers)
    images, targets = [], []
    for x, y in loader:
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


class GpuLoader:
    """Iterable of (images float32 (B, 3, H, W) normalised, targets int64 (B,)) on `device`.

    Train: a new permutation every epoch (from seed and epoch; `set_epoch` or one full pass advances it),
    augmented, last partial batch dropped. Val: the images in order, only normalised, every image once.
    With world_size > 1 each rank takes every world_size-th index of the shared permutation.
    """

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
        self.targets = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(device)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.skip = 0  # batches of the next epoch already trained (a resume inside an epoch)
        aug = cfg.get("augment") or {}
        self.crop = aug.get("crop", "pad") if train else "none"
        if self.crop not in CROPS:
            raise DataError(f"data.augment.crop={self.crop!r} must be one of {CROPS}")
        self.pad = int(aug.get("pad", 4))
        self.scale_min = float(aug.get("scale_min", 0.08))
        self.hflip = bool(aug.get("hflip", True)) and train
        impl = aug.get("policy_impl", "batched")
        self.policy = policy_op(aug.get("auto_augment"), self.images.shape[-1], impl) if train else None
        self.policy_chunk = int(aug.get("policy_chunk", 16))  # torchvision's policies only
        self.re_prob = float(aug.get("re_prob", 0.0)) if train else 0.0
        self.repeats = int(cfg.get("repeated_aug") or 1) if train else 1
        mean, std = mean_std(cfg)
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.skip = 0

    def skip_batches(self, count: int) -> None:
        """Start the next pass after its first `count` batches, drawing exactly what the rest would have seen."""
        self.skip = count

    def _order(self) -> torch.Tensor:
        n = len(self.targets)
        if not self.train:
            order = torch.arange(n, device=self.device)
        else:  # the same permutation on every rank (same seed), so the strided shards are disjoint
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = repeat_order(torch.randperm(n, generator=generator), self.repeats).to(self.device)
        return order[self.rank :: self.world_size]

    def _full_len(self) -> int:
        n = len(self.targets)
        if self.train:
            return (n // self.world_size) // self.batch_size
        return math.ceil(math.ceil(n / self.world_size) / self.batch_size)

    def __len__(self) -> int:
        return self._full_len() - min(self.skip, self._full_len())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        # Augmentation draws differ per epoch and per rank, and repeat exactly for the same (seed, epoch, rank).
        generator = torch.Generator(device=self.device).manual_seed((self.seed * 7919 + self.epoch) * 1009 + self.rank)
        skip, self.skip = self.skip, 0
        for b in range(self._full_len()):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            if b < skip:
                # Trained before the resume: advance the batch generator as that pass did, but leave the global
                # RNG (some policy ops draw from it) where the checkpoint put it.
                with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                    self.augment(self.images[idx], generator)
                continue
            yield self.augment(self.images[idx], generator), self.targets[idx]
        if self.train:
            self.epoch += 1

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> float32 normalised (B, 3, H, W)."""
        if self.crop == "pad" and self.pad > 0:
            x = random_pad_crop(x, self.pad, generator)
        elif self.crop == "rrc":
            x = random_resized_crop(x, (self.scale_min, 1.0), generator)
        if self.hflip:
            x = random_hflip(x, generator)
        if isinstance(self.policy, BatchedPolicy):  # per-sample draws from the batch generator
            x = self.policy(x, generator)
        elif self.policy is not None:  # torchvision's policies draw from the global RNG (seeded by the trainer)
            x = torch.cat([self.policy(chunk) for chunk in x.split(self.policy_chunk)])
        x = (x.float().div_(255) - self.mean) / self.std
        if self.re_prob > 0:
            x = random_erasing(x, self.re_prob, generator)
        return x


def _uniform(n: int, low: float, high: float, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(n, device=device, generator=generator) * (high - low) + low


def random_pad_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by `pad` and cut a random HxW window per sample, in one gather. (B, C, H, W) -> same."""
    batch, _, height, width = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    off_y = torch.randint(0, 2 * pad + 1, (batch, 1), device=x.device, generator=generator)
    off_x = torch.randint(0, 2 * pad + 1, (batch, 1), device=x.device, generator=generator)
    rows = off_y + torch.arange(height, device=x.device)  # (B, H)
    cols = off_x + torch.arange(width, device=x.device)  # (B, W)
    b = torch.arange(batch, device=x.device).view(batch, 1, 1)
    # Advanced indices on dims 0, 2, 3 broadcast to (B, H, W); the sliced channel dim goes last.
    out = padded[b, :, rows.view(batch, height, 1), cols.view(batch, 1, width)]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


def random_resized_crop(
    x: torch.Tensor, scale: tuple[float, float], generator: torch.Generator, ratio=(3 / 4, 4 / 3)
) -> torch.Tensor:
    """RandomResizedCrop per sample, resized back to H x W in one bilinear grid_sample. uint8 (B, C, H, W).

    Like torchvision: area fraction ~ U(scale), log aspect ratio ~ U(log ratio). Where torchvision retries a
    box that does not fit, we clamp its sides to the image. The crop comes from the decoded img_size image
    (not the original file), so large scales lose a little detail compared with the torch loader.
    """
    batch, _, height, width = x.shape
    area = _uniform(batch, scale[0], scale[1], x.device, generator)
    aspect = torch.exp(_uniform(batch, math.log(ratio[0]), math.log(ratio[1]), x.device, generator))
    box_w = torch.sqrt(area * aspect).clamp(max=1.0)  # (B,) fractions of the width and height
    box_h = torch.sqrt(area / aspect).clamp(max=1.0)
    left = torch.rand(batch, device=x.device, generator=generator) * (1 - box_w)
    top = torch.rand(batch, device=x.device, generator=generator) * (1 - box_h)
    # affine_grid maps output coords in [-1, 1] to input coords: x_in = box_w * x_out + box centre.
    theta = torch.zeros(batch, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 0, 2] = box_w, 2 * left + box_w - 1
    theta[:, 1, 1], theta[:, 1, 2] = box_h, 2 * top + box_h - 1
    grid = F.affine_grid(theta, [batch, x.shape[1], height, width], align_corners=False)  # (B, H, W, 2)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def random_hflip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each sample left-right with probability 1/2. (B, C, H, W) -> same."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5  # (B,)
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)


def random_erasing(
    x: torch.Tensor, prob: float, generator: torch.Generator, scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3)
) -> torch.Tensor:
    """With probability `prob` per sample, replace a random box by N(0, 1) noise (the normalised scale), like
    torchvision's RandomErasing(value="random"); boxes that would not fit are clamped. float (B, C, H, W)."""
    batch, _, height, width = x.shape
    area = _uniform(batch, scale[0], scale[1], x.device, generator) * height * width
    aspect = torch.exp(_uniform(batch, math.log(ratio[0]), math.log(ratio[1]), x.device, generator))
    box_h = torch.sqrt(area * aspect).round().clamp(1, height)  # (B,) in pixels
    box_w = torch.sqrt(area / aspect).round().clamp(1, width)
    top = (torch.rand(batch, device=x.device, generator=generator) * (height - box_h + 1)).floor()
    left = (torch.rand(batch, device=x.device, generator=generator) * (width - box_w + 1)).floor()
    apply = torch.rand(batch, device=x.device, generator=generator) < prob
    rows = torch.arange(height, device=x.device).view(1, height)
    cols = torch.arange(width, device=x.device).view(1, width)
    in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (B, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (B, W)
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & apply[:, None, None]).unsqueeze(1)  # (B, 1, H, W)
    noise = torch.randn(x.shape, device=x.device, generator=generator, dtype=x.dtype)
    return torch.where(mask, noise, x)
