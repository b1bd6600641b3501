"""The LayerNorm every model here uses: `nn.LayerNorm`, normalising in float32 under a CPU's autocast.

Under `torch.autocast("cpu", torch.bfloat16)` PyTorch has no precision rule for layer_norm, so a bf16 activation
gets a bf16 LayerNorm. That kernel's backward sums the weight and bias gradients over every row (batch x tokens)
at low precision, and their error grows with the row count: 1% at 64 rows, 15% at 16,384 (a batch of 256 images
of 64 tokens), 23% at 49,152, against a float64 reference (docs/BENCHMARKS.md, "LayerNorm under CPU autocast").
CUDA's autocast runs layer_norm in float32 by rule; this class applies the same rule on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

LOW_PRECISION = (torch.bfloat16, torch.float16)


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` with the same parameters and state dict, and the same numbers outside CPU autocast. Under CPU
    autocast a bf16 or fp16 input (..., C) is normalised in float32 and the result stays float32, as CUDA's
    autocast leaves it; the next Linear casts it back. Its weight and bias gradients are then float32 sums."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if upcast_on_cpu(x, self.weight):
            x = x.float()  # (..., C) float32: also the contiguous copy the kernel would make of a strided view
        return super().forward(x)


def upcast_on_cpu(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether `LayerNorm` normalises x in float32: a low-precision x on a CPU under autocast, with float32 (or no)
    affine parameters. A model cast to bf16 as a whole keeps bf16 throughout (its parameters are bf16)."""
    return (
        x.dtype in LOW_PRECISION
        and x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and (weight is None or weight.dtype == torch.float32)
    )


__all__ = ["LayerNorm"]
