"""Classification with the data's labels, and with a teacher's too (distillation)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vit.tasks.base import Task


class Classify(Task):
    """Supervised classification: the data's criterion (cross-entropy, with Mixup/CutMix and label smoothing as
    the data config asks) on the model's logits."""

    name = "classify"

    def check(self, cfg) -> None:
        from vit.errors import require

        require(cfg.get("mae") is None, "mae.* settings are given but task=classify: add task=mae to pretrain")
        require(
            not cfg.data.get("unlabelled"),
            "data.unlabelled=true reads no labels, which a classifier needs: it is for task=mae",
        )


class Distill(Classify):
    """Classification with a teacher (distill.type hard or soft; vit/train/distill.py): the loss mixes the labels'
    term and the teacher's, computed by the run's `Distiller`, which the trainer hands over with `attach`."""

    name = "distill"

    def __init__(self) -> None:
        self.distiller = None

    def attach(self, distiller) -> Distill:
        self.distiller = distiller
        return self

    def loss(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion: Callable):
        # The teacher runs in the caller's autocast too, on the same (mixed) images.
        return self.distiller.loss(images, model(images), targets)

    def log_values(self) -> dict:
        return self.distiller.log_values()  # the label and distillation terms of the loss
