"""Cosine similarity between the position embeddings of every pair of patch positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def position_similarity(pos_embed: torch.Tensor, grid: tuple[int, int], num_prefix: int = 1) -> torch.Tensor:
    """(1, prefix + gh*gw, C) -> (gh, gw, gh, gw): entry [i, j, k, l] = cos(pe[i, j], pe[k, l])."""
    patches = F.normalize(pos_embed[0, num_prefix:].float(), dim=-1)  # (gh*gw, C), unit rows
    gh, gw = grid
    if patches.shape[0] != gh * gw:
        raise ValueError(f"pos_embed has {patches.shape[0]} patch rows, grid {grid} needs {gh * gw}")
    return (patches @ patches.T).reshape(gh, gw, gh, gw)
