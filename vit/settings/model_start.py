"""`model.pretrained`, `model.pretrained_file`, `model.pretrained_ema`, `model.freeze`: how a run's model starts
(docs/FINETUNE.md). They are keys of the model group but not constructor arguments: every model config includes
them (`shared/finetune@_here_`, stored from these defaults as `model/shared/finetune`), and the trainer reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vit.settings.schema import Settings, knob


@dataclass(frozen=True)
class ModelStartSettings(Settings):
    group: ClassVar[str] = "model"

    # null: random init | timm:<name>[.<tag>] | a .safetensors/.pth/.pt/.bin file | a .pth.tar release file | a
    # last.pt/best.pt of this trainer. The position table and the patch kernel are resampled, a classifier of another
    # class count replaced; everything else must fit (width, depth, heads, every key and shape).
    pretrained: str | None = knob(None)
    # With pretrained=timm:<name>: the file holding that model's weights (a timm-layout state dict), read instead of
    # timm's download (as timm's pretrained_cfg_overlay=dict(file=...)); the architecture is still timm's <name>.
    pretrained_file: str | None = knob(None)
    # of a source holding EMA and raw weights (our checkpoints, T2T-ViT's releases): the EMA ones
    pretrained_ema: bool = knob(True)
    freeze: str = knob("none")  # none | backbone (a linear probe: only the head trains)
