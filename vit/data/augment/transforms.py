"""What happens to single images before batching (decoding geometry), Mixup/CutMix and the loss. The augmentation
of the batches themselves is vit/data/augment/batch.py."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torchvision import transforms as T

from vit.data.sources.registry import mean_std
from vit.settings.data import AugmentSettings


def eval_resize(img_size: int) -> int:
    """The shorter side before the centre crop at evaluation: ImageNet-sized images keep their central 87.5%,
    small ones are used whole."""
    return int(round(img_size / 0.875)) if img_size >= 128 else img_size


def decode_geometry(img_size: int, resize: int) -> T.Compose:
    """PIL image -> uint8 (3, img_size, img_size): shorter side to `resize`, then the centre crop."""
    return T.Compose([T.Resize(resize, antialias=True), T.CenterCrop(img_size), T.PILToTensor()])


def train_geometry(cfg: Mapping, spec: AugmentSettings) -> T.Compose:
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


def mixup_and_criterion(spec: AugmentSettings, num_classes: int) -> tuple[Mixup | None, torch.nn.Module]:
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
