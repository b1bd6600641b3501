"""Turning captured attention weights into pictures: cls-token maps per head and attention rollout.

Inputs are the (B, heads, N, N) tensors that `capture_attention` records, N = prefix tokens + gh * gw.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cls_attention(attn: torch.Tensor, grid: tuple[int, int], num_prefix: int = 1) -> torch.Tensor:
    """How much the cls token attends to each patch: (B, heads, N, N) -> (B, heads, gh, gw)."""
    batch, heads, _, _ = attn.shape
    return attn[:, :, 0, num_prefix:].reshape(batch, heads, *grid)


def rollout(maps: list[torch.Tensor], residual_weight: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): (B, N, N) token-to-input attention through all layers.

    Each layer's head-averaged attention is mixed with the identity for the residual connection,
    A' = w I + (1 - w) A, rows renormalised, and the layers multiplied in order.
    """
    result = None
    for attn in maps:
        mean = attn.float().mean(dim=1)  # (B, N, N)
        eye = torch.eye(mean.shape[-1], device=mean.device).expand_as(mean)
        mixed = residual_weight * eye + (1 - residual_weight) * mean
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    if result is None:
        raise ValueError("rollout needs at least one attention map")
    return result


def upsample(heat: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(B, k, gh, gw) -> (B, k, H, W), each map scaled to [0, 1]."""
    heat = F.interpolate(heat.float(), size=size, mode="bilinear", align_corners=False)
    low = heat.amin(dim=(-2, -1), keepdim=True)
    high = heat.amax(dim=(-2, -1), keepdim=True)
    return (heat - low) / (high - low).clamp_min(1e-12)


def colorize(heat: torch.Tensor) -> torch.Tensor:
    """[0, 1] maps (..., H, W) -> RGB (..., 3, H, W) with matplotlib's 'inferno' colormap."""
    from matplotlib import colormaps

    lut = torch.tensor(colormaps["inferno"](torch.linspace(0, 1, 256).numpy())[:, :3], dtype=torch.float32)
    index = (heat.clamp(0, 1) * 255).round().long().cpu()
    return lut[index].movedim(-1, -3)


def attention_overlay(images: torch.Tensor, maps: list[torch.Tensor], grid: tuple[int, int]) -> torch.Tensor:
    """One picture per image for TensorBoard: [image | last-layer cls attention (head mean) | rollout].

    images: (B, 3, H, W) in [0, 1]. Returns a (3, B*H, 3*W) grid.
    """
    size = images.shape[-2:]
    # T2T models also capture their token-attention stages (other token counts): keep the encoder's.
    maps = [m for m in maps if m.shape[-1] == maps[-1].shape[-1]]
    last = upsample(cls_attention(maps[-1], grid).mean(dim=1, keepdim=True), size)[:, 0]  # (B, H, W)
    rolled = rollout(maps)[:, 0, 1:].reshape(-1, 1, *grid)
    rolled = upsample(rolled, size)[:, 0]
    blend = [images.cpu(), 0.4 * images.cpu() + 0.6 * colorize(last), 0.4 * images.cpu() + 0.6 * colorize(rolled)]
    rows = torch.cat(blend, dim=-1)  # (B, 3, H, 3W)
    return torch.cat(list(rows), dim=-2).clamp(0, 1)  # (3, B*H, 3W)
