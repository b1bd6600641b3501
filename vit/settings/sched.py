"""`sched.*`: the learning-rate schedule (vit/train/optimizer.py builds it; configs/sched/ chooses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vit.settings.schema import Settings, knob


@dataclass(frozen=True)
class SchedSettings(Settings):
    group: ClassVar[str] = "sched"

    name: Literal["cosine", "constant"] = knob("cosine")  # linear warmup, then cosine decay or a constant rate
    warmup_epochs: float = knob(3.0, low=0.0)  # epochs of linear warmup (fractions allowed)
    warmup_lr_init: float | None = knob(1.0e-6, low=0.0)  # the rate warmup starts from (null: 0)
    min_lr: float | None = knob(1.0e-6, low=0.0)  # where the cosine ends, on the last step (null: 0)
