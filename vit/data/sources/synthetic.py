"""Synthetic images (`data=synthetic`): a dataset that needs no files, for tests and smoke runs."""

from __future__ import annotations

import torch
from PIL import Image
from torch.utils.data import Dataset

from vit.data.sources.splits import Splits
from vit.settings.data import SyntheticSettings


class SyntheticImages(Dataset):
    """Images with a learnable class signal: each class a fixed smooth colour pattern, plus noise.

    The class patterns are the same for every seed (train and val must share them); the labels and the
    per-pixel Gaussian noise (std `noise`, on a [0, 1] scale) come from `seed`. A tiny ViT on a CPU learns
    it well above chance in a couple of epochs.
    """

    def __init__(self, num_samples: int, num_classes: int, img_size: int, seed: int, noise: float = 0.35):
        generator = torch.Generator().manual_seed(seed)
        pattern_gen = torch.Generator().manual_seed(12345)  # the same class patterns for train and val
        # (classes, 3, 4, 4) random colours upsampled to the image: low-frequency, patch-friendly signal.
        coarse = torch.rand(num_classes, 3, 4, 4, generator=pattern_gen)
        patterns = torch.nn.functional.interpolate(coarse, size=(img_size, img_size), mode="bilinear")
        self.targets = torch.randint(0, num_classes, (num_samples,), generator=generator)
        noise_t = noise * torch.randn(num_samples, 3, img_size, img_size, generator=generator)
        images = (patterns[self.targets] + noise_t).clamp(0, 1)
        self.data = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()  # NHWC
        self.classes = [f"class_{i}" for i in range(num_classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return Image.fromarray(self.data[index]), int(self.targets[index])


def synthetic_splits(cfg: SyntheticSettings, seed: int) -> Splits:
    """data.synthetic.num_train and num_val images of data.num_classes classes at data.img_size."""
    counts, num_classes, img_size = cfg.synthetic, cfg.num_classes, cfg.img_size
    train = SyntheticImages(counts.num_train, num_classes, img_size, seed=seed)
    val = SyntheticImages(counts.num_val, num_classes, img_size, seed=seed + 1)
    return Splits(
        train,
        val,
        train.class_to_idx,
        (train.data, train.targets.numpy()),
        (val.data, val.targets.numpy()),
        val_name="val",
    )
