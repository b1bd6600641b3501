"""NaFlex batches: images at their own shape and size, each cut into patches on its own grid and packed into one
batch of padded patch sequences (NaViT's patch-n-pack, as timm's NaFlexVit and its NaFlex loader take them).

A batch is a dict with timm's keys, so timm's NaFlex loader's batches go in as they are:

    patches      (B, N, p_h * p_w * C)   each image's patches in row-major order over its own grid, each flattened
                                         as (row, column, channel); after an image's last patch, padding up to N
    patch_coord  (B, N, 2)               (row, column) of each patch in its image's grid, integers (padding: 0)
    patch_valid  (B, N)                  True for a patch, False for padding

An image of h x w patches fills h * w of the N places; its grid is read back from its coordinates (largest + 1).
Through the encoder (vit/models/encoder.py), per image: the patch projection (the Conv2d kernel read as a Linear
over the flattened patch, `PatchEmbed.embed_patches`), the position table resampled to that image's grid (or its
rotary table computed for that grid) and each patch given the row of its coordinate, padding masked out of every
attention as keys (`key_mask`) and out of the pooling. A padded image and the same image alone give the same
logits (tests/models/test_naflex.py), and with timm's weights the same logits as timm's NaFlexVit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from einops import rearrange

NAFLEX_KEYS = ("patches", "patch_coord", "patch_valid")
Grid = tuple[int, int]


def is_naflex(x: object) -> bool:
    """Whether a model input is a NaFlex batch (a mapping of `NAFLEX_KEYS`) rather than an image tensor."""
    return isinstance(x, Mapping)


def naflex_inputs(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(patches (B, N, D), patch_coord (B, N, 2) long, patch_valid (B, N) bool) of a batch, its shapes checked:
    a ValueError naming the key and shape that does not fit."""
    missing = [key for key in NAFLEX_KEYS if key not in batch]
    if missing:
        raise ValueError(f"a NaFlex batch needs the keys {', '.join(NAFLEX_KEYS)}; missing: {', '.join(missing)}")
    patches, coord, valid = (batch[key] for key in NAFLEX_KEYS)
    if patches.ndim != 3:
        raise ValueError(f"patches of shape {tuple(patches.shape)} must be (batch, tokens, patch values)")
    batch_size, length = patches.shape[:2]
    if tuple(coord.shape) != (batch_size, length, 2):
        raise ValueError(f"patch_coord of shape {tuple(coord.shape)} must be ({batch_size}, {length}, 2)")
    if tuple(valid.shape) != (batch_size, length):
        raise ValueError(f"patch_valid of shape {tuple(valid.shape)} must be ({batch_size}, {length})")
    valid = valid.bool()
    if not bool(valid.any(dim=1).all()):
        raise ValueError("every image of a NaFlex batch needs at least one valid patch (patch_valid)")
    return patches, coord.long(), valid


def patchify(images: torch.Tensor, patch_size: Grid) -> tuple[torch.Tensor, Grid]:
    """Images (C, H, W) or (B, C, H, W) -> their patches (..., h * w, p_h * p_w * C) in row-major order, each
    flattened as (row, column, channel) (MAE's reconstruction targets too), and the grid (h, w) = (H / p_h, W / p_w).
    The sides must be whole numbers of patches."""
    ph, pw = patch_size
    if images.ndim not in (3, 4):
        raise ValueError(f"images of shape {tuple(images.shape)} must be ([batch,] channels, height, width)")
    height, width = images.shape[-2:]
    if height < ph or width < pw or height % ph or width % pw:
        raise ValueError(f"an image of {height} x {width} px is not a whole number of {ph} x {pw} patches")
    patches = rearrange(images, "... c (h p) (w q) -> ... (h w) (p q c)", p=ph, q=pw)
    return patches, (height // ph, width // pw)


def pack(images: Sequence[torch.Tensor], patch_size: Grid, seq_len: int | None = None) -> dict[str, torch.Tensor]:
    """Images (C, H_i, W_i) of any shapes -> one NaFlex batch, padded to `seq_len` tokens (None: the longest
    image's). An image with more patches than `seq_len` is a ValueError (resize it first)."""
    if not images:
        raise ValueError("no images to pack")
    cut = [patchify(image, patch_size) for image in images]
    longest = max(patches.shape[0] for patches, _ in cut)
    length = longest if seq_len is None else int(seq_len)
    if longest > length:
        grid = next(g for p, g in cut if p.shape[0] == longest)
        raise ValueError(f"an image of {grid[0]} x {grid[1]} patches ({longest} tokens) does not fit seq_len={length}")
    first = cut[0][0]
    patches = first.new_zeros(len(images), length, first.shape[1])
    coord = torch.zeros(len(images), length, 2, dtype=torch.long, device=first.device)
    valid = torch.zeros(len(images), length, dtype=torch.bool, device=first.device)
    for i, (image_patches, (h, w)) in enumerate(cut):
        n = h * w
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        patches[i, :n] = image_patches
        coord[i, :n] = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1).to(first.device)
        valid[i, :n] = True
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def grid_sizes(coord: torch.Tensor, valid: torch.Tensor) -> list[Grid]:
    """Each image's grid (h, w): its valid patches' largest row and column + 1."""
    extent = coord.masked_fill(~valid[..., None], 0).amax(dim=1) + 1  # (B, 2)
    return [(int(h), int(w)) for h, w in extent.tolist()]


def rows_per_image(table_of: Callable[[Grid], torch.Tensor], coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each token's row of its own image's table: `table_of(grid)` is a table (..., h * w, D) laid out in
    row-major order over that grid (a resampled position table, a rotary table); the result is (B, ..., N, D),
    the row at the token's coordinate, zeros for padding. One table per distinct grid in the batch."""
    batch, length = valid.shape
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


__all__ = [
    "NAFLEX_KEYS",
    "grid_sizes",
    "is_naflex",
    "key_mask",
    "masked_mean",
    "naflex_inputs",
    "pack",
    "patchify",
    "rows_per_image",
]
