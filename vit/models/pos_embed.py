"""Position embeddings: learned (timm's init), fixed sinusoidal (1D over the token index, or 2D over the patch
grid as in MAE), factorized (NaViT's: a row table and a column table), and resampling to another grid.

Layout everywhere: (1, num_prefix + H*W, C), the class token's row first, patches in row-major order. A factorized
model keeps its two tables, (1, H, C) and (1, W, C), and builds the (1, H*W, C) table from them for each grid.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

POS_EMBED_KINDS = ("learned", "sinusoidal", "sincos2d", "factorized")


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


def make_factorized(kind: str, grid: tuple[int, int], dim: int) -> tuple[nn.Parameter | None, nn.Parameter | None]:
    """For kind="factorized", NaViT's pair: a row table (1, rows, dim) and a column table (1, columns, dim), zeros
    here (the model's init draws normal(0.02), as timm's NaFlexVit); (None, None) for any other kind."""
    if kind != "factorized":
        return None, None
    return nn.Parameter(torch.zeros(1, grid[0], dim)), nn.Parameter(torch.zeros(1, grid[1], dim))


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


def factorized_table(
    rows: torch.Tensor, columns: torch.Tensor, grid: tuple[int, int], ar_preserving: bool = False
) -> torch.Tensor:
    """NaViT's factorized positions on a grid, (1, h * w, C) in row-major order: the token at (i, j) gets
    rows[i] + columns[j], with the two tables resampled to the grid (`resample_factorized`)."""
    pe_y, pe_x = resample_factorized(rows, columns, grid, ar_preserving)  # (1, h, C), (1, w, C)
    return (pe_y[:, :, None] + pe_x[:, None, :]).flatten(1, 2)  # (1, h, w, C) -> (1, h * w, C)


def resample_factorized(
    rows: torch.Tensor, columns: torch.Tensor, grid: tuple[int, int], ar_preserving: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """A factorized pair, `rows` (1, H, C) and `columns` (1, W, C), at the grid (h, w): each resampled linearly
    (align_corners off, no antialiasing: timm's NaFlexVit) to its side of the grid, or with `ar_preserving` both to
    the grid's longer side and cut from the start, so a wide image's columns have the positions a square image's
    have. Returns (1, h, C), (1, w, C)."""
    h, w = grid
    length_y, length_x = (max(grid),) * 2 if ar_preserving else grid
    return resample_1d(rows, length_y)[:, :h], resample_1d(columns, length_x)[:, :w]


def resample_1d(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (1, L, C) table at `length` rows, linearly (align_corners off); the table itself at its own length."""
    if table.shape[1] == length:
        return table
    line = F.interpolate(table.permute(0, 2, 1).float(), size=length, mode="linear", align_corners=False)
    return line.permute(0, 2, 1).to(table.dtype)  # (1, C, length) -> (1, length, C)


# ---- the same resampling per token, from tensors (a NaFlex model's trace: each image's grid read from its
# coordinates inside the graph, so the exported file takes images of every shape, not only the example's) ----


def antialias_weights(size: int, length: torch.Tensor, index: torch.Tensor, mode: str = "bicubic") -> torch.Tensor:
    """The weights F.interpolate(mode, antialias=True, align_corners=False) gives the `size` input positions for
    output position `index` of an output `length` long (tensors that broadcast, shape (...)): (..., size).

    PyTorch's antialiased kernel, written out: scale = size / length; the filter (bicubic with a = -0.5, or the
    triangle for bilinear) stretched by the scale when shrinking; the window [center - support, center + support)
    around center = scale * (index + 0.5), cut to the input and normalised to sum to 1."""
    scale = size / length.to(torch.float32)
    half = 2.0 if mode == "bicubic" else 1.0  # half the filter's support at scale 1
    shrinking = scale >= 1.0
    support = torch.where(shrinking, half * scale, torch.full_like(scale, half))
    invscale = torch.where(shrinking, 1.0 / scale, torch.ones_like(scale))
    center = scale * (index.to(torch.float32) + 0.5)  # (...)
    low = (center - support + 0.5).floor().clamp(min=0)[..., None]
    high = (center + support + 0.5).floor().clamp(max=size)[..., None]
    source = torch.arange(size, dtype=torch.float32, device=center.device)  # (size,)
    distance = ((source - center[..., None] + 0.5) * invscale[..., None]).abs()  # (..., size)
    if mode == "bicubic":
        a = -0.5
        near = ((a + 2) * distance - (a + 3)) * distance * distance + 1
        far = (((distance - 5) * distance + 8) * distance - 4) * a
        weights = torch.where(distance < 1, near, torch.where(distance < 2, far, torch.zeros_like(distance)))
    else:
        weights = (1.0 - distance).clamp(min=0)
    weights = weights * ((source >= low) & (source < high)).to(weights.dtype)
    return weights / weights.sum(dim=-1, keepdim=True)


def linear_weights(size: int, length: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The weights F.interpolate(mode="linear", align_corners=False) gives the `size` input positions for output
    position `index` of an output `length` long (tensors that broadcast, shape (...)): (..., size). The source
    position scale * (index + 0.5) - 0.5, clamped at 0, between its two neighbours."""
    scale = size / length.to(torch.float32)
    position = (scale * (index.to(torch.float32) + 0.5) - 0.5).clamp(min=0)  # (...)
    left = position.floor().clamp(max=size - 1)
    right = (left + 1).clamp(max=size - 1)
    share = (position - left)[..., None]  # the right neighbour's share
    source = torch.arange(size, dtype=torch.float32, device=position.device)  # (size,)
    on_left, on_right = (source == left[..., None]).to(share.dtype), (source == right[..., None]).to(share.dtype)
    return on_left * (1 - share) + on_right * share


def resampled_rows_at(
    patches: torch.Tensor,
    table_grid: tuple[int, int],
    lengths: tuple[torch.Tensor, torch.Tensor],
    y: torch.Tensor,
    x: torch.Tensor,
    mode: str = "bicubic",
) -> torch.Tensor:
    """`resample_pos_embed`'s rows at tokens (y, x) (row and column, (B, N)) of images whose table is resampled
    to (lengths[0], lengths[1]) (each (B, 1): the grid, or with aspect preserving the square of its longer side):
    `patches` (H * W, C), the table without prefix rows on `table_grid` (H, W) -> (B, N, C)."""
    rows, columns = table_grid
    weight_y = antialias_weights(rows, lengths[0], y, mode)  # (B, N, H)
    weight_x = antialias_weights(columns, lengths[1], x, mode)  # (B, N, W)
    weights = (weight_y[..., :, None] * weight_x[..., None, :]).flatten(-2)  # (B, N, H * W): separable
    return weights @ patches.to(weights.dtype)  # (B, N, C)


def factorized_rows_at(
    rows: torch.Tensor, columns: torch.Tensor, lengths: tuple[torch.Tensor, torch.Tensor], y, x
) -> torch.Tensor:
    """`factorized_table`'s rows at tokens (y, x) ((B, N)) of images whose tables are resampled to (lengths[0],
    lengths[1]) ((B, 1) each): `rows` (1, H, C) and `columns` (1, W, C) -> (B, N, C)."""
    weight_y = linear_weights(rows.shape[1], lengths[0], y)  # (B, N, H)
    weight_x = linear_weights(columns.shape[1], lengths[1], x)  # (B, N, W)
    return weight_y @ rows[0].to(weight_y.dtype) + weight_x @ columns[0].to(weight_x.dtype)
