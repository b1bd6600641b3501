"""What happens to single images before batching (decoding geometry), per-dataset normalisation constants,
Mixup/CutMix and the loss. The augmentation of the batches themselves is vit/data/augment/batch.py."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torchvision import transforms as T

from vit.data.augment.batch import AugmentSpec
from vit.data.errors import DataError

MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "synthetic": ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
}


def mean_std(cfg: Mapping) -> tuple[tuple[float, ...], tuple[float, ...]]:
    default = MEAN_STD.get(cfg.get("name"), MEAN_STD["imagenet"])
    mean = tuple(float(v) for v in (cfg.get("mean") or default[0]))
    std = tuple(float(v) for v in (cfg.get("std") or default[1]))
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise DataError(f"data.mean={list(mean)} / data.std={list(std)} must be 3 values each, std > 0")
    return mean, std


def eval_resize(img_size: int) -> int:
    """The shorter side before the centre crop at evaluation: ImageNet-sized images keep their central 87.5%,
    small ones are used whole."""
    return int(round(img_size / 0.875)) if img_size >= 128 else img_size


def decode_geometry(img_size: int, resize: int) -> T.Compose:
    """PIL image -> uint8 (3, img_size, img_size): shorter side to `resize`, then the centre crop."""
    return T.Compose([T.Resize(resize, antialias=True), T.CenterCrop(img_size), T.PILToTensor()])


def train_geometry(cfg: Mapping, spec: AugmentSpec) -> T.Compose:
    """What the torch loader's workers do to a training image before `BatchAugment`: a random-resized crop from the
    full-size file (crop=rrc), else the whole image at the training size (the pad-and-crop comes later, on the
    batch). PIL image -> uint8 (3, H, W)."""
    size = int(cfg["img_size"])
    if spec.crop == "rrc":
        crop = T.RandomResizedCrop(size, scale=(float(spec.scale_min), 1.0), antialias=True)
        return T.Compose([crop, T.PILToTensor()])
    return decode_geometry(size, size)


def val_geometry(cfg: Mapping) -> T.Compose:
    size = int(cfg["img_size"])
    return decode_geometry(size, eval_resize(size))


def val_transform(cfg: Mapping) -> T.Compose:
    """One PIL image -> float (3, H, W) normalised as evaluation sees it (for tools that take single images)."""
    mean, std = mean_std(cfg)
    return T.Compose([val_geometry(cfg), T.ConvertImageDtype(torch.float32), T.Normalize(mean, std)])


def mixup_and_criterion(spec: AugmentSpec, num_classes: int) -> tuple[Mixup | None, torch.nn.Module]:
    """timm's Mixup/CutMix (it also smooths the labels) with the matching loss."""
    smoothing = float(spec.label_smoothing)
    mixup_alpha, cutmix_alpha = float(spec.mixup_alpha), float(spec.cutmix_alpha)
    if mixup_alpha > 0 or cutmix_alpha > 0:
        mixup = Mixup(
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            prob=float(spec.mixup_prob),
            label_smoothing=smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=smoothing)
    return None, torch.nn.CrossEntropyLoss()
