"""NaFlex batches: images at their own shape and size, each cut into patches on its own grid and packed into one
batch of padded patch sequences (NaViT's patch-n-pack, as timm's NaFlexVit and its NaFlex loader take them).

The batch format is vit/naflex.py's (made by the data's loaders, read here). Through the encoder
(vit/models/classifier.py), per image: the patch projection (the Conv2d kernel read as a Linear over the flattened
patch, `PatchEmbed.embed_patches`), the position table resampled to that image's grid (or its rotary table computed
for that grid) and each patch given the row of its coordinate, padding masked out of every attention as keys
(`key_mask`) and out of the pooling. A padded image and the same image alone give the same logits
(tests/models/test_naflex.py), and with timm's weights the same logits as timm's NaFlexVit.

Under a trace (an export, vit/deploy/export.py) the grids cannot be Python numbers, or the file would hold the
example's: the encoder then reads each image's grid as a tensor (`grid_extent`) and computes every token's position
row from it (vit/models/pos_embed.py's `resampled_rows_at`, `factorized_rows_at`; rope.py's `*_rope_at`), the
same numbers as the eager path to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vit.models.layers import run_blocks
from vit.models.pos_embed import factorized_rows_at, resampled_rows_at
from vit.naflex import Grid, naflex_inputs


def naflex_features(model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """What the encoder's `forward_features` does to an image, done to a NaFlex batch (vit/naflex.py: patches (B,
    N, p_h * p_w * C_in), their (row, column) and a valid mask), per image: its own grid's position rows or rotary
    tables, padding masked out as a key. Returns (tokens (B, P + N, C) after the last block and norm, valid (B, N)).
    `model`: the encoder (vit/models/classifier.py), with the standard patch embedding."""
    patches, coord, valid = naflex_inputs(inputs)
    embed_patches = getattr(model.embed, "embed_patches", None)
    if embed_patches is None:
        raise ValueError(f"NaFlex batches need the standard patch embedding, not {type(model.embed).__name__}")
    tokens = embed_patches(
        patches, model.config.pos_embed_interp
    )  # (B, N, C); a kernel resampled as timm's, by that mode
    prefix = model.prefix_tokens(tokens.shape[0])
    prefix = torch.cat(prefix, dim=1) if prefix else tokens[:, :0]  # (B, P, C)
    if model.has_position_table:
        table_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        # each token's row of its image's table (1, P + h * w, C), the prefix rows left out: (B, N, C)
        if torch.jit.is_tracing():  # the grids as tensors, so the trace holds for images of every shape
            tokens = tokens + position_rows_at(model, coord, valid)
        else:
            tokens = tokens + rows_per_image(lambda grid: model.position_table(grid)[0, table_prefix:], coord, valid)
        if table_prefix:
            prefix = prefix + model.pos_embed[:, :table_prefix]  # the prefix tokens' own rows
    x = model.norm_pre(model.pos_drop(torch.cat([prefix, tokens], dim=1)))  # (B, P + N, C)
    checkpointed = model.grad_checkpointing and model.training and torch.is_grad_enabled()
    mask = key_mask(valid, model.num_prefix_tokens)  # (B, 1, 1, P + N)
    ropes = None if model.rope is None else model.rope.naflex(coord, valid)  # one rotary table per block, or none
    x = run_blocks(model.blocks, x, checkpointed, ropes, attn_mask=mask)
    return model.norm(x), valid


def position_rows_at(model, coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """What `rows_per_image` gives from the model's `position_table`, (B, N, C), computed per token from tensors
    (each image's grid from its coordinates, `grid_extent`), for a trace: the resampling written out as weights."""
    extent = grid_extent(coord, valid)  # (B, 2)
    height, width = extent[:, :1], extent[:, 1:]  # (B, 1) each
    lengths = (height, width)  # the sides each table is resampled to
    own_grid = model.grid_size
    if model.config.pos_embed_ar_preserving:  # the longer side's square, but the model's own grid as it is
        own = (height == own_grid[0]) & (width == own_grid[1])
        side = torch.maximum(height, width)
        lengths = (torch.where(own, height, side), torch.where(own, width, side))
    y, x = coord[..., 0], coord[..., 1]  # (B, N)
    if model.pos_embed_y is not None:
        rows = factorized_rows_at(model.pos_embed_y, model.pos_embed_x, lengths, y, x)
    else:
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        table = model.pos_embed[0, prefix:]  # (H * W, C)
        rows = resampled_rows_at(table, own_grid, lengths, y, x, model.config.pos_embed_interp)
    return rows * valid[..., None].to(rows.dtype)  # padding: zeros, as rows_per_image


def grid_sizes(coord: torch.Tensor, valid: torch.Tensor) -> list[Grid]:
    """Each image's grid (h, w): its valid patches' largest row and column + 1."""
    return [(int(h), int(w)) for h, w in grid_extent(coord, valid).tolist()]


def grid_extent(coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`grid_sizes` as a tensor, (B, 2) int64 (rows, columns): what a trace computes inside the graph."""
    return coord.masked_fill(~valid[..., None], 0).amax(dim=1) + 1


def one_full_grid(coord: torch.Tensor, valid: torch.Tensor) -> Grid | None:
    """The batch's grid (h, w) when every image fills that one grid in row-major order, unpadded (square images
    resized alike, the common case), else None."""
    grids = set(grid_sizes(coord, valid))
    if len(grids) != 1:
        return None
    ((h, w),) = grids
    length = valid.shape[1]
    places = coord[..., 0] * w + coord[..., 1]  # (B, N)
    full = h * w == length and bool(valid.all())
    return (h, w) if full and bool((places == torch.arange(length, device=coord.device)).all()) else None


def rows_per_image(table_of: Callable[[Grid], torch.Tensor], coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each token's row of its own image's table: `table_of(grid)` is a table (..., h * w, D) laid out in
    row-major order over that grid (a resampled position table); the result is (B, ..., N, D),
    the row at the token's coordinate, zeros for padding. One table per distinct grid in the batch.

    A batch of one grid whose every image fills it in row-major order, unpadded (`one_full_grid`: square images
    resized alike, the common case), gets the table itself as (1, ..., N, D), broadcast over the batch: the same
    values without a copy per image."""
    batch, length = valid.shape
    grid = one_full_grid(coord, valid)
    if grid is not None:
        return table_of(grid).unsqueeze(0)  # (1, ..., N, D)
    by_grid: dict[Grid, list[int]] = {}
    for i, grid in enumerate(grid_sizes(coord, valid)):
        by_grid.setdefault(grid, []).append(i)
    out = None
    for (h, w), members in by_grid.items():
        table = table_of((h, w))  # (..., h * w, D)
        index = (coord[members, :, 0] * w + coord[members, :, 1]).clamp(0, h * w - 1)  # (M, N): row-major place
        rows = table[..., index, :].movedim(-3, 0)  # (M, ..., N, D)
        if out is None:
            out = table.new_zeros((batch, *rows.shape[1:]))
        out[members] = rows
    keep = valid.reshape(batch, *([1] * (out.ndim - 3)), length, 1).to(out.dtype)  # (B, 1.., N, 1)
    return out * keep


def key_mask(valid: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """The attention mask of a NaFlex batch, (B, 1, 1, P + N) bool, True = may be attended to: the P prefix tokens
    and the valid patches. Padding is no key for any query; a padded query still attends to the valid keys, so its
    row stays finite (its output is never read)."""
    prefix = valid.new_ones(valid.shape[0], num_prefix)
    return torch.cat([prefix, valid], dim=1)[:, None, None, :]


def masked_mean(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, N, C) tokens, (B, N) valid -> (B, C): the mean over each image's valid tokens."""
    weights = valid.to(tokens.dtype).unsqueeze(-1)  # (B, N, 1)
    return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


__all__ = ["grid_extent", "grid_sizes", "key_mask", "masked_mean", "naflex_features", "rows_per_image"]
