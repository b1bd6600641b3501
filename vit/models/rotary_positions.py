"""Rotary positions in the encoder: the tables every block's attention turns q and k by, for a grid of tokens or
for each token of a NaFlex batch. vit/models/rope.py holds the formulas; this module lays them out per block.

A model with rotary positions holds one of these modules under timm's name `rope`; a model without holds none.
Each kind changes one thing, `rows_at`: the [sin | cos] rows of tokens at given rows and columns.

    pos_embed       class            tables                    what differs
    rope            AxialRotary      one for every block       the axial table (Heo et al. 2024)
    learned_rope    EvaRotary        one for every block       rows first, positions on a reference grid (EVA-02)
    rope_dinov3     Dinov3Rotary     one for every block       normalised patch centres, half layout
    rope_mixed      MixedRotary      one per block and head    learned frequencies, `rope.freqs`

For ViT-S/16 at 224 px (head_dim D = 64, one cls token, N = 196): `rope(grid)` gives 12 tables of (1 + 196, 2 * 64),
or with mixed positions 12 of (6, 1 + 196, 2 * 64). The P prefix tokens (cls, dist, registers) have no place in
the image: their rows are the identity rotation (sin 0, cos 1), so attention leaves them as they are (timm skips
them).
"""

from __future__ import annotations

import torch
from torch import nn

from vit.models.naflex_tokens import grid_extent, one_full_grid
from vit.models.rope import axial_rope_at, dinov3_rope_at, mixed_rope_at, mixed_rope_freqs


class AxialRotary(nn.Module):
    """Axial rotary positions: the first quarter of each head's channel pairs turns with the token's column, the
    second with its row, at fixed frequencies. One table, the same for every block. No parameters."""

    temperature_default = 100.0  # the frequency base of the RoPE ViT paper, as timm's `vit_*_rope_*` models

    def __init__(self, head_dim: int, depth: int, num_prefix: int = 0, temperature: float | None = None) -> None:
        super().__init__()
        self.head_dim, self.depth, self.num_prefix = head_dim, depth, num_prefix
        self.temperature = self.temperature_default if temperature is None else float(temperature)

    def rows_at(self, y: torch.Tensor, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        """The rows [sin | cos] of tokens at rows `y` and columns `x` (float tensors (...)) of an image whose grid
        is `grid` (ints, or tensors that broadcast against y): (..., 2 * head_dim)."""
        return axial_rope_at(y, x, grid, self.head_dim, self.temperature)

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> list[torch.Tensor]:
        """One table per block for a token grid of `grid` (rows, columns): (P + N, 2 * head_dim) each."""
        return self.for_blocks(self.grid_table(grid, device), batched=False)

    def grid_table(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        """The table of a token grid without prefix rows, row-major: (rows * columns, 2 * head_dim)."""
        rows, columns = torch.meshgrid(
            torch.arange(grid[0], dtype=torch.float32, device=device),
            torch.arange(grid[1], dtype=torch.float32, device=device),
            indexing="ij",
        )
        return self.rows_at(rows.reshape(-1), columns.reshape(-1), grid)

    def naflex(self, coord: torch.Tensor, valid: torch.Tensor) -> list[torch.Tensor]:
        """One table per block for a NaFlex batch (coord (B, N, 2) as (row, column), valid (B, N)): each token
        turned by its place on its own image's grid, (B, 1, P + N, 2 * head_dim) each (padding rows are zeros)."""
        grid = None if torch.jit.is_tracing() else one_full_grid(coord, valid)
        if grid is not None:  # one grid, unpadded: its table broadcast over the batch, (1, N, 2D)
            return self.for_blocks(self.grid_table(grid, coord.device).unsqueeze(0), batched=True)
        # Each token's rows from its coordinate. Under a trace the grids are tensors, so the graph holds for images
        # of every shape; eagerly it is cheaper than gathering rows from one table per grid.
        extent = grid_extent(coord, valid).to(torch.float32)  # (B, 2)
        grid_of_each = (extent[:, :1], extent[:, 1:])  # (B, 1) each: broadcast over the tokens
        rows = self.rows_at(coord[..., 0].to(torch.float32), coord[..., 1].to(torch.float32), grid_of_each)
        rows = self.batch_first(rows)  # (B, N, 2D), or (B, depth, heads, N, 2D) when mixed
        keep = valid.reshape(valid.shape[0], *([1] * (rows.ndim - 3)), valid.shape[1], 1)  # (B, 1.., N, 1)
        return self.for_blocks(rows * keep.to(rows.dtype), batched=True)

    def batch_first(self, rows: torch.Tensor) -> torch.Tensor:
        """`rows_at`'s result for a batch of tokens with the batch dimension first (here it already is)."""
        return rows

    def for_blocks(self, table: torch.Tensor, batched: bool) -> list[torch.Tensor]:
        """A table (N, 2D), or a batch's (B, N, 2D), as every block's, the prefix tokens' identity rows in front;
        a batch's gets a heads dimension, (B, 1, P + N, 2D), to broadcast against q (B, heads, P + N, D)."""
        table = table.unsqueeze(1) if batched else table
        return [identity_prefix(table, self.num_prefix)] * self.depth

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, depth={self.depth}, prefix={self.num_prefix}, temperature={self.temperature}"


class EvaRotary(AxialRotary):
    """EVA-02's rotary positions, beside its learned table: axial, the row first, and with `ref_grid` the
    positions rescaled to the pretraining grid (16 for its 224 px models)."""

    temperature_default = 10000.0

    def __init__(self, head_dim: int, depth: int, num_prefix: int = 0, temperature: float | None = None,
                 ref_grid: int | None = None) -> None:  # fmt: skip
        super().__init__(head_dim, depth, num_prefix, temperature)
        self.ref_grid = None if ref_grid is None else (ref_grid, ref_grid)

    def rows_at(self, y: torch.Tensor, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        return axial_rope_at(y, x, grid, self.head_dim, self.temperature, rows_first=True, ref_grid=self.ref_grid)


class Dinov3Rotary(AxialRotary):
    """DINOv3's rotary positions: the patch centres normalised to [-1, 1] on each axis, so every grid spans the
    same range; the channel pairs in half layout (the attention turns them with `rope_half`)."""

    def rows_at(self, y: torch.Tensor, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        return dinov3_rope_at(y, x, grid, self.head_dim, self.temperature)


class MixedRotary(AxialRotary):
    """Mixed rotary positions: every block and head learns a 2D frequency per channel pair, `freqs` (2, depth,
    heads, head_dim / 2), under timm's name `rope.freqs`; each block gets its own table (heads, P + N, 2D)."""

    temperature_default = 10.0

    def __init__(self, head_dim: int, depth: int, num_heads: int, num_prefix: int = 0,
                 temperature: float | None = None) -> None:  # fmt: skip
        super().__init__(head_dim, depth, num_prefix, temperature)
        self.num_heads = num_heads
        self.freqs = nn.Parameter(mixed_rope_freqs(head_dim, depth, num_heads, self.temperature))

    def rows_at(self, y: torch.Tensor, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        return mixed_rope_at(self.freqs, y, x)  # (depth, heads, ..., 2D): the grid does not matter

    def grid_table(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        """(depth, heads, rows * columns, 2 * head_dim), on the frequencies' device."""
        return super().grid_table(grid, self.freqs.device)

    def batch_first(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.movedim(2, 0)  # (depth, heads, B, N, 2D) -> (B, depth, heads, N, 2D)

    def for_blocks(self, table: torch.Tensor, batched: bool) -> list[torch.Tensor]:
        """(depth, heads, N, 2D) -> each block's (heads, P + N, 2D); a batch's (B, depth, heads, N, 2D) -> each
        block's (B, heads, P + N, 2D)."""
        return list(identity_prefix(table, self.num_prefix).unbind(1 if batched else 0))


ROTARY_POSITIONS = {"rope": AxialRotary, "rope_mixed": MixedRotary, "rope_dinov3": Dinov3Rotary,
                    "learned_rope": EvaRotary}  # fmt: skip


def rotary_positions(kind: str, head_dim: int, depth: int, num_heads: int, num_prefix: int,
                     temperature: float | None, ref_grid: int | None) -> AxialRotary | None:  # fmt: skip
    """The rotary positions of `pos_embed=kind`, or None where the kind has none (a table added to the tokens)."""
    if kind not in ROTARY_POSITIONS:
        return None
    if kind == "rope_mixed":
        return MixedRotary(head_dim, depth, num_heads, num_prefix, temperature)
    if kind == "learned_rope":
        return EvaRotary(head_dim, depth, num_prefix, temperature, ref_grid)
    return ROTARY_POSITIONS[kind](head_dim, depth, num_prefix, temperature)


def identity_prefix(table: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """A rotary table (..., N, 2 * head_dim) [sin | cos] with `num_prefix` identity rows (sin 0, cos 1) in front:
    (..., P + N, 2 * head_dim). x * cos + rot(x) * sin is then x itself for the prefix tokens, bit for bit."""
    if num_prefix == 0:
        return table
    half = table.shape[-1] // 2
    rows = table.new_zeros(*table.shape[:-2], num_prefix, 2 * half)
    rows[..., half:] = 1.0  # cos = 1, sin = 0
    return torch.cat([rows, table], dim=-2)
