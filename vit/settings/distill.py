"""`distill.*`: knowledge distillation from a teacher (vit/train/distill.py; docs/DISTILLATION.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vit.settings.schema import Settings, knob


@dataclass(frozen=True)
class DistillSettings(Settings):
    group: ClassVar[str] = "distill"

    # null: no teacher | timm:<name>[.<tag>] | a last.pt/best.pt of this trainer | a state dict file
    # (.safetensors/.pth/.pt/.bin) of the timm model named by teacher_model
    teacher: str | None = knob(None)
    # of a timm:<name> teacher: a file holding those pretrained weights, read in place of timm's download (offline),
    # as model.pretrained_file is for model.pretrained=timm:<name>
    teacher_file: str | None = knob(None)
    teacher_model: str | None = knob(None)  # the timm architecture of a state dict file, e.g. resnet18
    teacher_ema: bool = knob(True)  # of a checkpoint of this trainer holding EMA and raw weights: the EMA ones
    # none | hard (cross-entropy on the teacher's top-1) | soft (KL divergence at temperature tau)
    type: Literal["none", "hard", "soft"] = knob("none")
    # loss = (1 - alpha) * label loss + alpha * distillation loss (DeiT's default 0.5)
    alpha: float = knob(0.5, low=0.0, high=1.0, why="the distillation loss's weight")
    # type=soft: the temperature both models' logits are divided by before the KL divergence
    tau: float = knob(1.0, low=0.0, low_open=True, why="the soft distillation's temperature")
    # What the teacher sees: the student's batch resized on the device to teacher_img_size and re-normalised with
    # teacher_mean/teacher_std. null: the teacher's own where its source records it (timm's pretrained config,
    # the data config of a checkpoint of ours), else the student's.
    teacher_img_size: int | None = knob(None, low=1, text="must be positive or null")
    teacher_mean: tuple[float, float, float] | None = knob(None)  # the mean the teacher's inputs are normalised with
    # the standard deviation the teacher's inputs are normalised with
    teacher_std: tuple[float, float, float] | None = knob(
        None, low=0.0, low_open=True, text="must be > 0 in every channel"
    )
