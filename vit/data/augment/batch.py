"""The training augmentation both loaders apply, defined once: `BatchAugment`, the ops on uint8 batches, as
`AugmentSettings` (spec.py: the `data.augment` keys, checked) describes them.

Both loaders hand `BatchAugment` the same thing, a uint8 (B, 3, H, W) batch at the training size, and it runs
on the training device:

    uint8 (B, 3, H, W)
      --crop: pad-and-crop (one gather) or random-resized-crop (one grid_sample; the torch loader has already
        cropped from the full-size file in its workers, so here only for the GPU-resident loader)-->
      --horizontal flip-->
      --policy: `data.augment.auto_augment` (policies.py's `build_policy`), every sample with its own draws-->
    float (B, 3, H, W), normalised
      --random erasing (a random box of N(0, 1) noise, like RandomErasing(value="random"))-->

Every batch draws from its own generator, seeded from (seed, epoch, rank, batch index): a resumed epoch draws for
its remaining batches exactly what an uninterrupted one would, without replaying the batches before them, and the
two loaders draw alike for the same batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vit.data.augment import draws
from vit.data.augment.policies import build_policy
from vit.settings.data import AugmentSettings

# ---- the batch ops: uint8 or float (B, C, H, W), every sample with its own draw from `generator` ----


def _uniform(n: int, low: float, high: float, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    return draws.rand(n, generator, device) * (high - low) + low


def random_pad_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by `pad` and cut a random HxW window per sample, in one gather. (B, C, H, W) -> same."""
    batch, _, height, width = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    off_y = draws.randint(2 * pad + 1, (batch, 1), generator, x.device)
    off_x = draws.randint(2 * pad + 1, (batch, 1), generator, x.device)
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
    box that does not fit, we clamp its sides to the image. The GPU-resident loader crops from the decoded img_size
    image (not the original file), so large scales lose a little detail compared with the torch loader.
    """
    batch, _, height, width = x.shape
    area = _uniform(batch, scale[0], scale[1], x.device, generator)
    aspect = torch.exp(_uniform(batch, math.log(ratio[0]), math.log(ratio[1]), x.device, generator))
    box_w = torch.sqrt(area * aspect).clamp(max=1.0)  # (B,) fractions of the width and height
    box_h = torch.sqrt(area / aspect).clamp(max=1.0)
    left = draws.rand(batch, generator, x.device) * (1 - box_w)
    top = draws.rand(batch, generator, x.device) * (1 - box_h)
    # affine_grid maps output coords in [-1, 1] to input coords: x_in = box_w * x_out + box centre.
    theta = torch.zeros(batch, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 0, 2] = box_w, 2 * left + box_w - 1
    theta[:, 1, 1], theta[:, 1, 2] = box_h, 2 * top + box_h - 1
    grid = F.affine_grid(theta, [batch, x.shape[1], height, width], align_corners=False)  # (B, H, W, 2)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def random_hflip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each sample left-right with probability 1/2. (B, C, H, W) -> same."""
    return hflip(x, draws.rand(x.shape[0], generator, x.device) < 0.5)


def hflip(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror the samples where `flip` (bool (B,), on x's device) is true. (B, C, H, W) -> same.

    On CUDA one torch.where over the batch (finding the flipped samples would be a host sync); on the CPU only the
    flipped samples are copied, written over a copy of the batch as 8-byte words (uint8 rows one byte at a time are
    several times slower)."""
    if x.device.type != "cpu" or x[0].numel() * x.element_size() % 8:
        return torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    index = flip.nonzero().squeeze(1)
    if len(index) == 0:
        return x
    out = x.contiguous().clone()
    rows = x.index_select(0, index).flip(3).contiguous()
    out.view(len(x), -1).view(torch.int64).index_copy_(0, index, rows.view(len(index), -1).view(torch.int64))
    return out


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
    top = (draws.rand(batch, generator, x.device) * (height - box_h + 1)).floor()
    left = (draws.rand(batch, generator, x.device) * (width - box_w + 1)).floor()
    apply = draws.rand(batch, generator, x.device) < prob
    rows = torch.arange(height, device=x.device).view(1, height)
    cols = torch.arange(width, device=x.device).view(1, width)
    in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (B, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (B, W)
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & apply[:, None, None]).unsqueeze(1)  # (B, 1, H, W)
    # The noise is a whole batch of values: drawn where the batch is, from a generator seeded by one CPU draw (its
    # values differ between a CPU and a GPU; the boxes do not).
    noise_seed = int(draws.randint(2**62, (1,), generator, torch.device("cpu")))
    noise_generator = torch.Generator(device=x.device).manual_seed(noise_seed)
    noise = torch.randn(x.shape, device=x.device, generator=noise_generator, dtype=x.dtype)
    return torch.where(mask, noise, x)


def resize_batch(images: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, h, w), `size` = h = w or (h, w): after augmentation, progressive resizing's smaller epochs
    (vit/train/progressive.py) and each NaFlex batch's grid (vit/data/loading/naflex_loader.py). Antialiasing keeps a
    downscaled image what a smaller photograph of the scene would look like, not an aliased subsample of it."""
    size = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(images.shape[-2:]) == size:
        return images
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)


class AlternatingFlip:
    """data.augment.hflip_alternate, airbench's derandomized flip: a random half of the split's images mirrored in
    even epochs (a fixed draw from the seed), the other half in odd ones. The loaders pass each batch's indices
    into the split; whichever loader, worker count or resume made the batch, an image's flip depends only on
    (seed, index, epoch)."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed * 7_919 + 1)  # not the batches' seeds (batch_seed)
        self.first = {"cpu": torch.randint(0, 2, (size,), generator=generator, dtype=torch.uint8).bool()}  # (N,)

    def __call__(self, indices: torch.Tensor, epoch: int, device: torch.device) -> torch.Tensor:
        """bool (B,) on `device`: whether each image of the batch (indices int64 (B,) into the split) is mirrored.
        Looked up where the indices are (the resident loader's on its device: no host sync on a GPU)."""
        key = str(indices.device)
        if key not in self.first:
            self.first[key] = self.first["cpu"].to(indices.device)
        return (self.first[key][indices] ^ bool(epoch % 2)).to(device, non_blocking=True)


# ---- the stage both loaders call ----


def batch_seed(seed: int, epoch: int, rank: int, index: int) -> int:
    """The generator seed of train batch `index` of `epoch` on `rank`: distinct for every (seed, epoch, rank,
    index) a run can reach, and the same whichever loader, worker count or resume produced the batch."""
    return ((seed * 100_003 + epoch) * 1_009 + rank) * 10_000_019 + index


class BatchAugment:
    """uint8 (B, 3, H, W) on the device -> float32 (B, 3, H, W) normalised (see the module docstring).

    train=False: normalisation only. crop_done: the crop already happened elsewhere (the torch loader's workers
    crop random-resized boxes from the full-size file); pad-and-crop and no-crop always happen here.
    """

    def __init__(
        self, spec: AugmentSettings, mean, std, img_size: int, *, train: bool, crop_done: bool = False
    ) -> None:
        self.spec, self.train = spec, train
        self.crop = spec.crop if train and not (crop_done and spec.crop == "rrc") else "none"
        self.policy = build_policy(spec.auto_augment, img_size, mean) if train else None
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self._device_stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def generator(self, seed: int, epoch: int, rank: int, index: int) -> torch.Generator:
        """The batch's generator: a CPU one whatever device the batch is on (vit/data/augment/draws.py says why)."""
        return torch.Generator().manual_seed(batch_seed(seed, epoch, rank, index))

    def alternating_flip(self, size: int, seed: int) -> AlternatingFlip | None:
        """The flips a train loader over `size` images passes to each call, where data.augment.hflip_alternate."""
        return AlternatingFlip(size, seed) if self.train and self.spec.hflip and self.spec.hflip_alternate else None

    def __call__(
        self, x: torch.Tensor, generator: torch.Generator | None = None, flip: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`flip`: bool (B,), the batch's mirrored samples (from `alternating_flip`); None: each drawn anew."""
        spec = self.spec
        if self.train:
            if self.crop == "pad" and spec.pad > 0:
                x = random_pad_crop(x, int(spec.pad), generator)
            elif self.crop == "rrc":
                x = random_resized_crop(x, (float(spec.scale_min), 1.0), generator)
            if spec.hflip and flip is None and spec.hflip_alternate:
                raise RuntimeError("data.augment.hflip_alternate: this loader passed no flips (alternating_flip)")
            if spec.hflip:
                x = random_hflip(x, generator) if flip is None else hflip(x, flip)
            if self.policy is not None:
                x = self.policy(x, generator)
        key = str(x.device)
        if key not in self._device_stats:  # moved once: a per-batch copy of a CPU tensor to CUDA is a host sync
            self._device_stats[key] = (
                1 / (255 * self.std.to(x.device)),
                -self.mean.to(x.device) / self.std.to(x.device),
            )
        scale, shift = self._device_stats[key]
        x = x.to(torch.float32).mul_(scale).add_(shift)  # (v / 255 - mean) / std, in place
        if self.train and spec.re_prob > 0:
            x = random_erasing(x, float(spec.re_prob), generator)
        return x
