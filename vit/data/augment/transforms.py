"""What happens to single images before batching (decoding geometry), Mixup/CutMix and the loss. The augmentation
of the batches themselves is vit/data/augment/batch.py."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torchvision import transforms as T

from vit.data.sources.registry import data_of, mean_std
from vit.settings.data import AugmentSettings, DataSettings


def eval_resize(img_size: int, crop_pct: float | None = None) -> int:
    """The shorter side before evaluation's centre crop (data.crop_pct): img_size / crop_pct, floored as timm does;
    null: ImageNet-sized images keep their central 87.5%, small ones are used whole."""
    if crop_pct is None:
        crop_pct = 0.875 if img_size >= 128 else 1.0
    return math.floor(img_size / crop_pct)


def resize_filter(cfg: DataSettings) -> str:
    """data.interpolation, bilinear where null."""
    return cfg.interpolation or "bilinear"


def decode_geometry(img_size: int, resize: int, interpolation: str = "bilinear") -> T.Compose:
    """PIL image -> uint8 (3, img_size, img_size): shorter side to `resize`, then the centre crop."""
    shorter_side = T.Resize(resize, interpolation=T.InterpolationMode(interpolation), antialias=True)
    return T.Compose([shorter_side, T.CenterCrop(img_size), T.PILToTensor()])


def train_geometry(cfg: DataSettings, spec: AugmentSettings) -> T.Compose:
    """What the torch loader's workers do to a training image before `BatchAugment`: a random-resized crop from the
    full-size file (crop=rrc), else the whole image at the training size (the pad-and-crop comes later, on the
    batch). PIL image -> uint8 (3, H, W)."""
    size, interpolation = cfg.img_size, resize_filter(cfg)
    if spec.crop == "rrc":
        mode = T.InterpolationMode(interpolation)
        crop = T.RandomResizedCrop(size, scale=(float(spec.scale_min), 1.0), interpolation=mode, antialias=True)
        return T.Compose([crop, T.PILToTensor()])
    return decode_geometry(size, size, interpolation)


def val_geometry(cfg: DataSettings) -> T.Compose:
    """Evaluation's resize and centre crop (data.img_size, data.crop_pct, data.interpolation)."""
    return decode_geometry(cfg.img_size, eval_resize(cfg.img_size, cfg.crop_pct), resize_filter(cfg))


def val_transform(cfg: Mapping | DataSettings) -> T.Compose:
    """One PIL image -> float (3, H, W) normalised as evaluation sees it (for tools that take single images)."""
    cfg = data_of(cfg)
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
