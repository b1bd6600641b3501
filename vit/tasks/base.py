"""The base of the tasks (vit/tasks/__init__.py): a classifier's behaviour, which the others override."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn

from vit.runtime.distributed import Distributed


class Task:
    """What a run trains for. The default methods are a classifier's."""

    name = ""
    score = "val_top1"  # the run's score (metrics.json's final and best, a search's default metric)
    classifier = True  # a head over the data's classes: labels are read, the test split, flip averaging, top-1
    reconstructs = False  # draws its reconstructions (trainer.recon_images_every_n_epochs)

    def check(self, cfg) -> None:
        """The settings this task cannot run with, one ConfigError each (vit/train/config.py calls it)."""

    def build_model(self, cfg: Mapping, num_classes: int | None, **kwargs) -> nn.Module:
        """The model `cfg` (the whole run config) describes for this task; `kwargs`: build_model_from_config's."""
        from vit.tasks.build import build_model_from_config

        return build_model_from_config(cfg["model"], num_classes=num_classes, **kwargs)

    def loss(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion: Callable):
        """The training loss of one batch (B, 3, H, W), under the caller's autocast."""
        return criterion(model(images), targets)

    def log_values(self) -> dict:
        """Extra values of the loss to log with each window (train/...)."""
        return {}

    def evaluate(
        self,
        model: nn.Module,
        loader: Iterable,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        limit_batches: int | None,
        dist: Distributed,
        flip: bool,
        shift: int = 0,
    ) -> dict:
        """The evaluation every epoch and the final test run: top-1, top-5 and loss (flip, shift: over each image's
        test-time views, vit/tasks/evaluation.py's `tta_views`)."""
        from vit.tasks.evaluation import evaluate

        return evaluate(model, loader, device, amp_dtype, limit_batches, dist=dist, flip=flip, shift=shift)
