"""Per-sample augmentation (torchvision/timm), per-dataset normalisation, Mixup/CutMix and the loss."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from timm.data import Mixup
from timm.data.auto_augment import augment_and_mix_transform, rand_augment_transform
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torchvision import transforms as T

from vit.data.datasets import DataError

MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "synthetic": ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
}
CROPS = ("pad", "rrc", "none")
POLICY_HELP = "null, autoaug, trivial, or a timm string such as rand-m9-mstd0.5-inc1 or augmix-m5-w4-d2"


def mean_std(cfg: Mapping) -> tuple[tuple[float, ...], tuple[float, ...]]:
    default = MEAN_STD.get(cfg.get("name"), MEAN_STD["imagenet"])
    mean = tuple(float(v) for v in (cfg.get("mean") or default[0]))
    std = tuple(float(v) for v in (cfg.get("std") or default[1]))
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise DataError(f"data.mean={list(mean)} / data.std={list(std)} must be 3 values each, std > 0")
    return mean, std


def is_small(img_size: int) -> bool:
    """CIFAR-like images: AutoAugment uses its CIFAR-10 policy for these, ImageNet's for larger ones."""
    return img_size <= 64


def policy_options(policy: str) -> dict[str, str]:
    """The numeric sections of a timm policy string, as timm reads them:
    "rand-m9-mstd0.5-inc1" -> {"m": "9", "mstd": "0.5", "inc": "1"} (the letters before the first digit)."""
    options = {}
    for section in policy.split("-")[1:]:
        key, *value = re.split(r"(\d.*)", section)
        if value:
            options[key] = value[0]
    return options


def auto_augment_op(policy: str | None, img_size: int, mean: tuple[float, ...]):
    """ "autoaug" (torchvision AutoAugment: CIFAR-10 policy for small images, ImageNet's otherwise),
    "trivial" (TrivialAugmentWide), or a timm RandAugment ("rand-...") / AugMix ("augmix-...") string."""
    if not policy:
        return None
    if policy == "autoaug":
        return T.AutoAugment(T.AutoAugmentPolicy.CIFAR10 if is_small(img_size) else T.AutoAugmentPolicy.IMAGENET)
    if policy == "trivial":
        return T.TrivialAugmentWide()
    # timm's PIL ops fill uncovered pixels with the dataset mean and translate by up to 45% of the image.
    hparams = {"translate_const": int(img_size * 0.45), "img_mean": tuple(round(255 * m) for m in mean)}
    try:
        if policy.startswith("rand-") or policy == "rand":
            return rand_augment_transform(policy, hparams)
        if policy.startswith("augmix-") or policy == "augmix":
            return augment_and_mix_transform(policy, hparams)
    except (AssertionError, KeyError, ValueError) as err:
        raise DataError(f"data.augment.auto_augment={policy!r} is not a valid timm policy: {err}") from err
    raise DataError(f"data.augment.auto_augment={policy!r} must be {POLICY_HELP}")


def train_transform(cfg: Mapping) -> T.Compose:
    aug = cfg.get("augment") or {}
    size = int(cfg["img_size"])
    mean, std = mean_std(cfg)
    crop = aug.get("crop", "pad")
    ops: list = []
    if crop == "rrc":
        ops.append(T.RandomResizedCrop(size, scale=(float(aug.get("scale_min", 0.08)), 1.0), antialias=True))
    elif crop == "pad":
        ops += [T.Resize(size, antialias=True), T.CenterCrop(size)]
        ops.append(T.RandomCrop(size, padding=int(aug.get("pad", 4))))
    elif crop == "none":
        ops += [T.Resize(size, antialias=True), T.CenterCrop(size)]
    else:
        raise DataError(f"data.augment.crop={crop!r} must be one of {CROPS}")
    if aug.get("hflip", True):
        ops.append(T.RandomHorizontalFlip())
    policy = auto_augment_op(aug.get("auto_augment"), size, mean)
    if policy is not None:
        ops.append(policy)
    ops += [T.PILToTensor(), T.ConvertImageDtype(torch.float32), T.Normalize(mean, std)]
    re_prob = float(aug.get("re_prob", 0.0))
    if re_prob > 0:
        ops.append(T.RandomErasing(p=re_prob, value="random"))
    return T.Compose(ops)


def val_transform(cfg: Mapping) -> T.Compose:
    size = int(cfg["img_size"])
    mean, std = mean_std(cfg)
    # ImageNet-style evaluation crops the central 87.5%; small images are used whole.
    resize = int(round(size / 0.875)) if size >= 128 else size
    return T.Compose(
        [
            T.Resize(resize, antialias=True),
            T.CenterCrop(size),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float32),
            T.Normalize(mean, std),
        ]
    )


def mixup_and_criterion(cfg: Mapping, num_classes: int) -> tuple[Mixup | None, torch.nn.Module]:
    """timm's Mixup/CutMix (it also smooths the labels) with the matching loss."""
    aug = cfg.get("augment") or {}
    smoothing = float(aug.get("label_smoothing", 0.0))
    mixup_alpha, cutmix_alpha = float(aug.get("mixup_alpha", 0.0)), float(aug.get("cutmix_alpha", 0.0))
    if not 0.0 <= smoothing < 1.0:
        raise DataError(f"data.augment.label_smoothing={smoothing} must be in [0, 1)")
    if mixup_alpha > 0 or cutmix_alpha > 0:
        mixup = Mixup(
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            prob=float(aug.get("mixup_prob", 1.0)),
            label_smoothing=smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=smoothing)
    return None, torch.nn.CrossEntropyLoss()
