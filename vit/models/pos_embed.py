"""Position embeddings: learned (timm's init), fixed sinusoidal (1D over the token index, or 2D over the patch
grid as in MAE), and resampling to another grid.

Layout everywhere: (1, num_prefix + H*W, C), the class token's row first, patches in row-major order.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

POS_EMBED_KINDS = ("learned", "sinusoidal", "sincos2d")


def sinusoid_table(num_positions: int, dim: int) -> torch.Tensor:
    """The Transformer's fixed encoding, (1, num_positions, dim).

    PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
    Position 0 is the class token, as in the official T2T-ViT code.
    """
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    pair_index = torch.arange(dim, dtype=torch.float64) // 2  # i for both columns 2i and 2i+1
    angle = position / torch.pow(10000.0, 2 * pair_index / dim)  # (P, dim)
    table = torch.empty_like(angle)
    table[:, 0::2] = torch.sin(angle[:, 0::2])
    table[:, 1::2] = torch.cos(angle[:, 1::2])
    return table.float().unsqueeze(0)


def sincos_2d_table(grid: tuple[int, int], dim: int, num_prefix: int = 0) -> torch.Tensor:
    """The fixed 2D sin-cos table of MAE and MoCo v3, (1, num_prefix + rows * columns, dim), prefix rows zero.

    Half the channels encode the column x, half the row y, each with the 1D encoding of d = dim / 2 channels:
    [sin(x ω_0..ω_{d/2-1}) | cos(x ω) | sin(y ω) | cos(y ω)], ω_i = 10000^(-2i/d). Patches in row-major order.
    (The official MAE code names the column half "h"; the numbers are these.)
    """
    if dim % 4:
        raise ValueError(f"a 2D sin-cos table needs a width divisible by 4, not {dim}")
    rows, cols = grid
    y, x = torch.meshgrid(
        torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64), indexing="ij"
    )
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # (dim / 4,)
    halves = []
    for coord in (x.reshape(-1), y.reshape(-1)):  # (N,) each: column, then row
        angle = coord[:, None] * omega  # (N, dim / 4)
        halves += [angle.sin(), angle.cos()]
    table = torch.cat([torch.zeros(num_prefix, dim, dtype=torch.float64), torch.cat(halves, dim=1)])
    return table.float().unsqueeze(0)


def make_pos_embed(
    kind: str, num_positions: int, dim: int, grid: tuple[int, int] | None = None, num_prefix: int = 0
) -> nn.Parameter:
    """A learned table (zeros here; the model's init draws trunc_normal(0.02) as timm does), or a fixed table
    stored as a frozen Parameter so it sits in the state dict under the same key: the 1D sinusoid over the
    `num_positions` indices, or the 2D sin-cos over `grid` after `num_prefix` zero rows."""
    if kind == "learned":
        return nn.Parameter(torch.zeros(1, num_positions, dim))
    if kind == "sinusoidal":
        return nn.Parameter(sinusoid_table(num_positions, dim), requires_grad=False)
    if kind == "sincos2d":
        if grid is None or num_prefix + grid[0] * grid[1] != num_positions:
            raise ValueError(f"pos_embed=sincos2d needs the token grid of the {num_positions} positions")
        return nn.Parameter(sincos_2d_table(grid, dim, num_prefix), requires_grad=False)
    raise ValueError(f"pos_embed={kind!r} must be one of {POS_EMBED_KINDS}")


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    old_grid: tuple[int, int] | None = None,
    mode: str = "bicubic",
    ar_preserving: bool = False,
) -> torch.Tensor:
    """Resampling (bicubic, or `mode`; antialiased) of the patch part of a (1, prefix + h*w, C) table onto
    `new_grid`.

    The prefix (class token) rows are kept as they are: they carry no spatial position. `old_grid` defaults
    to the square root of the patch count. `ar_preserving` (timm's NaFlex `pos_embed_ar_preserving`): the table
    is resampled to a square of the longer side and the grid cut from its top-left corner, so a row of a wide
    image has the positions a square image's row has, not a squeezed copy of them.
    """
    if pos_embed.ndim != 3 or pos_embed.shape[0] != 1:
        raise ValueError(f"pos_embed of shape {tuple(pos_embed.shape)} must be (1, tokens, dim)")
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    num_patches = patches.shape[1]
    if old_grid is None:
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(f"pos_embed has {num_patches} patch rows, not a square grid: pass old_grid")
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != num_patches:
        raise ValueError(f"old_grid={old_grid} does not hold the {num_patches} patch rows of pos_embed")
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    dim = patches.shape[-1]
    grid = patches.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)  # (1, C, h, w)
    size = (max(new_grid),) * 2 if ar_preserving else tuple(new_grid)
    grid = F.interpolate(grid.float(), size=size, mode=mode, align_corners=False, antialias=True)
    grid = grid[:, :, : new_grid[0], : new_grid[1]]  # (1, C, rows, columns)
    patches = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(pos_embed.dtype)
    return torch.cat([prefix, patches], dim=1)
