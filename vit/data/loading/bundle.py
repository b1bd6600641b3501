"""`DataBundle`: what `build_data` hands the trainer, whichever loader (torch, device-resident, streamed) built it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler


@dataclass
class DataBundle:
    # (images float (B, 3, H, W) normalised, or a NaFlex batch (vit/naflex.py); targets int64 (B,)); len() = batches
    train_loader: Iterable
    val_loader: Iterable
    num_classes: int
    class_to_idx: dict[str, int]
    mixup_fn: Callable | None  # timm Mixup, applied by the trainer on the device
    train_criterion: torch.nn.Module
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    img_size: int
    num_train: int
    num_val: int
    train_sampler: Sampler | None = None  # the torch loader's DistributedSampler, to `set_epoch` on
    loader_kind: str = "torch"
    loader_reason: str = ""  # why this loader (data.loader=auto decides by device and memory)
    val_name: str = "val"  # "holdout" with data.holdout, else the split's own name
    test_loader: Iterable | None = None  # with data.holdout: the split the holdout replaced, for the final report
    test_name: str | None = None
    train_workers: int = 0  # the train loader's worker processes (0: it runs in the training process)
