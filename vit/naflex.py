"""The NaFlex batch format: images at their own shape and size, each cut into patches on its own grid and packed
into one batch of padded patch sequences (NaViT's patch-n-pack). The data's loaders make it
(vit/data/loading/naflex_loader.py), the encoder reads it (vit/models/naflex_tokens.py); the keys are timm's, so timm's
NaFlex loader's batches go in as they are:

    patches      (B, N, p_h * p_w * C)   each image's patches in row-major order over its own grid, each flattened
                                         as (row, column, channel); after an image's last patch, padding up to N;
                 or (B, N, p_h, p_w, C)  the same unflattened: timm's form for patches of another size than the
                                         model's (random patch sizes), whose kernel is resampled to fit them
    patch_coord  (B, N, 2)               (row, column) of each patch in its image's grid, integers (padding: 0)
    patch_valid  (B, N)                  True for a patch, False for padding

An image of h x w patches fills h * w of the N places; its grid is read back from its coordinates (largest + 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    if patches.ndim not in (3, 5):
        raise ValueError(
            f"patches of shape {tuple(patches.shape)} must be (batch, tokens, patch values) or (batch, tokens, "
            "patch rows, patch columns, channels)"
        )
    batch_size, length = patches.shape[:2]
    if tuple(coord.shape) != (batch_size, length, 2):
        raise ValueError(f"patch_coord of shape {tuple(coord.shape)} must be ({batch_size}, {length}, 2)")
    if tuple(valid.shape) != (batch_size, length):
        raise ValueError(f"patch_valid of shape {tuple(valid.shape)} must be ({batch_size}, {length})")
    valid = valid.bool()
    if not bool(valid.any(dim=1).all()):
        raise ValueError("every image of a NaFlex batch needs at least one valid patch (patch_valid)")
    return patches, coord.long(), valid


def patchify(images: torch.Tensor, patch_size: Grid, flat: bool = True) -> tuple[torch.Tensor, Grid]:
    """Images (C, H, W) or (B, C, H, W) -> their patches (..., h * w, p_h * p_w * C) in row-major order, each
    flattened as (row, column, channel) (MAE's reconstruction targets too), and the grid (h, w) = (H / p_h, W / p_w).
    `flat=False`: each patch as (p_h, p_w, C), (..., h * w, p_h, p_w, C). The sides must be whole numbers of
    patches."""
    ph, pw = patch_size
    if images.ndim not in (3, 4):
        raise ValueError(f"images of shape {tuple(images.shape)} must be ([batch,] channels, height, width)")
    height, width = images.shape[-2:]
    if height < ph or width < pw or height % ph or width % pw:
        raise ValueError(f"an image of {height} x {width} px is not a whole number of {ph} x {pw} patches")
    layout = "... (h w) (p q c)" if flat else "... (h w) p q c"
    patches = rearrange(images, f"... c (h p) (w q) -> {layout}", p=ph, q=pw)
    return patches, (height // ph, width // pw)


def pack(
    images: Sequence[torch.Tensor], patch_size: Grid, seq_len: int | None = None, flat: bool = True
) -> dict[str, torch.Tensor]:
    """Images (C, H_i, W_i) of any shapes -> one NaFlex batch, padded to `seq_len` tokens (None: the longest
    image's); `flat=False` keeps each patch (p_h, p_w, C). An image with more patches than `seq_len` is a
    ValueError (resize it first)."""
    if not images:
        raise ValueError("no images to pack")
    cut = [patchify(image, patch_size, flat) for image in images]
    longest = max(patches.shape[0] for patches, _ in cut)
    length = longest if seq_len is None else int(seq_len)
    if longest > length:
        grid = next(g for p, g in cut if p.shape[0] == longest)
        raise ValueError(f"an image of {grid[0]} x {grid[1]} patches ({longest} tokens) does not fit seq_len={length}")
    first = cut[0][0]
    patches = first.new_zeros(len(images), length, *first.shape[1:])
    coord = torch.zeros(len(images), length, 2, dtype=torch.long, device=first.device)
    valid = torch.zeros(len(images), length, dtype=torch.bool, device=first.device)
    for i, (image_patches, (h, w)) in enumerate(cut):
        n = h * w
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        patches[i, :n] = image_patches
        coord[i, :n] = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1).to(first.device)
        valid[i, :n] = True
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def pack_batch(
    images: torch.Tensor, patch_size: Grid, seq_len: int | None = None, flat: bool = True
) -> dict[str, torch.Tensor]:
    """Images (B, C, H, W) of one size -> one NaFlex batch, every image on the same grid, padded to `seq_len`
    tokens (None: the grid's h * w). `pack` for a batch the loaders resized together, in one reshape."""
    patches, (h, w) = patchify(images, patch_size, flat)  # (B, h * w, p_h * p_w * C) or (B, h * w, p_h, p_w, C)
    batch, count = patches.shape[:2]
    length = count if seq_len is None else int(seq_len)
    if count > length:
        raise ValueError(f"an image of {h} x {w} patches ({count} tokens) does not fit seq_len={length}")
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coord = torch.zeros(batch, length, 2, dtype=torch.long, device=images.device)
    coord[:, :count] = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1).to(images.device)
    valid = torch.zeros(batch, length, dtype=torch.bool, device=images.device)
    valid[:, :count] = True
    padding = patches.new_zeros(batch, length - count, *patches.shape[2:])
    patches = torch.cat([patches, padding], dim=1)  # (B, length, ...): zeros after the image's
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def batch_size_of(batch: torch.Tensor | Mapping[str, torch.Tensor]) -> int:
    """The number of images in a batch: an image tensor's first dimension, or a NaFlex batch's."""
    return int((batch["patches"] if is_naflex(batch) else batch).shape[0])


def to_device(batch: torch.Tensor | Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor | dict:
    """An image tensor or a NaFlex batch on `device` (non-blocking, as the loaders' batches move)."""
    if is_naflex(batch):
        return {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    return batch.to(device, non_blocking=True)
