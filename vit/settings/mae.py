"""`mae.*`: masked-autoencoder pretraining's own settings (vit/models/mae.py; task=mae, docs/MAE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vit.settings.schema import Settings, knob


@dataclass(frozen=True)
class MaeSettings(Settings):
    group: ClassVar[str] = "mae"

    mask_ratio: float = knob(0.75, low=0.0, high=1.0, low_open=True, high_open=True)  # patches hidden from the encoder
    decoder_embed_dim: int = knob(512, low=1)  # the paper's decoder for ViT-B/L/H
    decoder_depth: int = knob(8, low=1)  # the decoder's blocks
    decoder_num_heads: int = knob(16, low=1)  # must divide decoder_embed_dim
    norm_pix_loss: bool = knob(True)  # targets normalised per patch: the paper's better setting
