"""Turning captured attention weights into pictures: cls-token maps per head and attention rollout.

Inputs are the (B, heads, N, N) tensors that `capture_attention` records, N = prefix tokens + gh * gw.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vit.models import capture_attention


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


@torch.no_grad()
def attention_views(model, images: torch.Tensor, layer: int = -1) -> dict[str, torch.Tensor]:
    """Everything the attention figure shows, each as (B, k, H, W) maps in [0, 1] over the image:
    "heads" (cls attention of every head of `layer`), "rollout" (all layers), and for T2T-ViTs with transformer
    tokens "token_stage" (the attention each token receives in the first T2T stage)."""
    was_training = model.training
    model.eval()
    with capture_attention(model) as maps:
        model(images)
    model.train(was_training)
    maps = [m.float().cpu() for m in maps]
    encoder = [m for m in maps if m.shape[-1] == maps[-1].shape[-1]]  # T2T models also record token stages
    if not -len(encoder) <= layer < len(encoder):
        raise IndexError(f"layer={layer} is out of range: the model has {len(encoder)} attention layers")
    grid = model.grid_size if hasattr(model, "grid_size") else model.patch_embed.grid_size
    size = tuple(images.shape[-2:])
    views = {
        "heads": upsample(cls_attention(encoder[layer], grid), size),
        "rollout": upsample(rollout(encoder)[:, 0, 1:].reshape(-1, 1, *grid), size),
    }
    if len(maps) > len(encoder):
        received = maps[0].mean(dim=(1, 2))  # (B, N0): mean over heads and queries
        side = int(round(received.shape[-1] ** 0.5))
        views["token_stage"] = upsample(received.reshape(-1, 1, side, side), size)
    return views
