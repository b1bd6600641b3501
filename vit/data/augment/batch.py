"""The training augmentation both loaders apply, defined once: `AugmentSpec` (the `data.augment` keys, checked) and
`BatchAugment` (the ops on uint8 batches).

Both loaders hand `BatchAugment` the same thing, a uint8 (B, 3, H, W) batch at the training size, and it runs
on the training device:

    uint8 (B, 3, H, W)
      --crop: pad-and-crop (one gather) or random-resized-crop (one grid_sample; the torch loader has already
        cropped from the full-size file in its workers, so here only for the GPU-resident loader)-->
      --horizontal flip-->
      --policy: `data.augment.auto_augment` (`build_policy`), every sample with its own draws-->
    float (B, 3, H, W), normalised
      --random erasing (a random box of N(0, 1) noise, like RandomErasing(value="random"))-->

Every batch draws from its own generator, seeded from (seed, epoch, rank, batch index): a resumed epoch draws for
its remaining batches exactly what an uninterrupted one would, without replaying the batches before them, and the
two loaders draw alike for the same batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from vit.data.augment.batched_policy import BatchedAutoAugment, BatchedTrivialAugmentWide
from vit.data.augment.rand_augment import LEVEL_DENOM, TimmRandAugment
from vit.data.declared import BASE, declared
from vit.data.errors import DataError

CROPS = ("pad", "rrc", "none")
POLICY_HELP = (
    "null, autoaug, trivial, rand-<sections> (timm's RandAugment: m<int>, n<int>, p<float>, mstd<float>, "
    "mmax<int>, inc<0|1>, tweights; e.g. rand-m9-mstd0.5-inc1) or augmix[-m<severity>-w<width>-d<depth>-a<alpha>]"
)


# The one declaration of the augment keys' defaults: the base data config, which every data config inherits.


@functools.lru_cache(maxsize=1)
def declared_defaults() -> dict:
    """The `augment` node of configs/data/cifar10.yaml: what a key left out of a hand-built config means."""
    return dict(declared(BASE)["augment"])


@dataclass(frozen=True)
class AugmentSpec:
    """The `data.augment` node, checked. Keys a config leaves out take their value from `declared_defaults()`."""

    crop: str  # pad | rrc | none
    pad: int
    scale_min: float
    hflip: bool
    auto_augment: str | None
    re_prob: float
    mixup_alpha: float
    cutmix_alpha: float
    mixup_prob: float
    label_smoothing: float

    @classmethod
    def from_config(cls, node: Mapping | None) -> AugmentSpec:
        """Check the node (exit-2 messages name the key and value) and read it."""
        values = declared_defaults()
        known = [f.name for f in fields(cls)]
        for key, value in dict(node or {}).items():
            if key not in known:
                raise DataError(f"data.augment.{key} is not a known key (known: {', '.join(known)})")
            values = {**values, key: value}
        spec = cls(**{key: values[key] for key in known})
        spec.check()
        return spec

    def check(self) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise DataError(f"data.augment.{message}")

        require(self.crop in CROPS, f"crop={self.crop!r} must be one of {CROPS}")
        require(int(self.pad) >= 0, f"pad={self.pad} must be >= 0")
        require(0.0 < float(self.scale_min) <= 1.0, f"scale_min={float(self.scale_min)} must be in (0, 1]")
        for key in ("re_prob", "label_smoothing"):
            value = float(getattr(self, key))
            require(0.0 <= value < 1.0, f"{key}={value} must be in [0, 1)")
        require(0.0 <= float(self.mixup_prob) <= 1.0, f"mixup_prob={float(self.mixup_prob)} must be in [0, 1]")
        for key in ("mixup_alpha", "cutmix_alpha"):
            require(float(getattr(self, key)) >= 0, f"{key}={getattr(self, key)} must be >= 0")
        build_policy(self.auto_augment, 32, (0.5, 0.5, 0.5))  # refuses a bad policy string up front


# ---- the policy: one meaning of `data.augment.auto_augment` ----


def _sections(text: str, parsers: dict[str, type]) -> dict[str, object]:
    """ "rand-m9-mstd0.5-inc1" -> {"m": 9, "mstd": 0.5, "inc": 1}: each section is a known key (the longest that
    prefixes it) and a number of that key's type; "tweights" is the one word-valued section."""
    values: dict[str, object] = {}
    for section in text.split("-")[1:]:
        key = max((k for k in parsers if section.startswith(k)), key=len, default=None)
        try:
            values[key] = parsers[key](section[len(key) :])
        except (KeyError, TypeError, ValueError):
            key = None
        if key is None or values[key] == "":
            known = ", ".join(f"{k}<{p.__name__}>" for k, p in parsers.items())
            raise DataError(f"data.augment.auto_augment={text!r}: section {section!r} is not one of {known}")
    return values


def _rand_augment(text: str, mean: tuple[float, ...]) -> TimmRandAugment:
    options = _sections(text, {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int, "t": str})
    magnitude, magnitude_max = options.get("m", 10), options.get("mmax", int(LEVEL_DENOM))
    std, num_ops, prob = options.get("mstd", 0.0), options.get("n", 2), options.get("p", 0.5)
    problems = {
        f"m{magnitude} must be in [0, mmax={magnitude_max}] (raise the bound with mmax)": 0
        <= magnitude
        <= magnitude_max,
        f"n{num_ops} must be between 1 and 15 ops": 1 <= num_ops <= 15,
        f"p{prob} must be in [0, 1]": 0.0 <= prob <= 1.0,
        f"mstd{std} must be >= 0 (over 100: uniform in [0, m])": std >= 0,
        f"inc{options.get('inc', 0)} must be 0 or 1": options.get("inc", 0) in (0, 1),
        f"t{options.get('t', 'weights')} must be tweights (the weighted op choice)": options.get("t", "weights")
        == "weights",
    }
    for problem, ok in problems.items():
        if not ok:
            raise DataError(f"data.augment.auto_augment={text!r}: {problem}")
    return TimmRandAugment(
        num_ops=num_ops,
        magnitude=magnitude,
        magnitude_std=math.inf if std > 100 else std,
        magnitude_max=magnitude_max,
        increasing=bool(options.get("inc", 0)),
        prob=prob,
        weighted="t" in options,
        fill=tuple(round(255 * m) for m in mean),  # timm's img_mean
    )


class PerImageAugMix:
    """torchvision's AugMix, one image at a time (its op chain is drawn once per call, so a batch in one call would
    share it), seeded from the batch's generator so its draws repeat on resume and leave the global RNG alone."""

    def __init__(self, **kwargs) -> None:
        self.augmix = v2.AugMix(**kwargs)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        seeds = torch.randint(2**62, (len(x),), device=x.device, generator=generator).tolist()
        out = []
        for image, seed in zip(x, seeds, strict=True):
            with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
                torch.manual_seed(seed)
                out.append(self.augmix(image))
        return torch.stack(out)


def _augmix(text: str) -> PerImageAugMix:
    options = _sections(text, {"m": int, "w": int, "d": int, "a": float})
    severity, width, depth, alpha = (
        options.get("m", 3),
        options.get("w", 3),
        options.get("d", -1),
        options.get("a", 1.0),
    )
    if not (1 <= severity <= 10 and width >= 1 and (depth == -1 or 1 <= depth) and alpha > 0):
        raise DataError(
            f"data.augment.auto_augment={text!r}: needs m (severity) in [1, 10], w >= 1, d = -1 or >= 1, a > 0"
        )
    return PerImageAugMix(severity=severity, mixture_width=width, chain_depth=depth, alpha=alpha)


def is_small(img_size: int) -> bool:
    """CIFAR-like images: AutoAugment uses its CIFAR-10 policy for these, ImageNet's for larger ones."""
    return img_size <= 64


def build_policy(text: str | None, img_size: int, mean: tuple[float, ...]):
    """`data.augment.auto_augment` as a callable (uint8 (B, 3, H, W), generator) -> uint8 (B, 3, H, W), or None.

    autoaug: AutoAugment (the CIFAR-10 policy up to 64 px, ImageNet's above), trivial: TrivialAugmentWide, both
    torchvision's policies drawn per sample (vit/data/augment/batched_policy.py); rand-...: timm's RandAugment
    (vit/data/augment/rand_augment.py); augmix...: torchvision's AugMix, per image."""
    if not text:
        return None
    if text == "autoaug":
        return BatchedAutoAugment("cifar10" if is_small(img_size) else "imagenet")
    if text == "trivial":
        return BatchedTrivialAugmentWide()
    kind = str(text).split("-")[0]
    if kind == "rand":
        return _rand_augment(str(text), mean)
    if kind == "augmix":
        return _augmix(str(text))
    raise DataError(f"data.augment.auto_augment={text!r} must be {POLICY_HELP}")


# ---- the batch ops: uint8 or float (B, C, H, W), every sample with its own draw from `generator` ----


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
    box that does not fit, we clamp its sides to the image. The GPU-resident loader crops from the decoded img_size
    image (not the original file), so large scales lose a little detail compared with the torch loader.
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
    """Mirror each sample left-right with probability 1/2. (B, C, H, W) -> same.

    On CUDA one torch.where over the batch (finding the flipped samples would be a host sync); on the CPU only the
    flipped samples are copied, written over a copy of the batch as 8-byte words (uint8 rows one byte at a time are
    several times slower)."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5  # (B,)
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

    def __init__(self, spec: AugmentSpec, mean, std, img_size: int, *, train: bool, crop_done: bool = False) -> None:
        self.spec, self.train = spec, train
        self.crop = spec.crop if train and not (crop_done and spec.crop == "rrc") else "none"
        self.policy = build_policy(spec.auto_augment, img_size, mean) if train else None
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self._device_stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def generator(self, device: torch.device, seed: int, epoch: int, rank: int, index: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(batch_seed(seed, epoch, rank, index))

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        spec = self.spec
        if self.train:
            if self.crop == "pad" and spec.pad > 0:
                x = random_pad_crop(x, int(spec.pad), generator)
            elif self.crop == "rrc":
                x = random_resized_crop(x, (float(spec.scale_min), 1.0), generator)
            if spec.hflip:
                x = random_hflip(x, generator)
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
