"""The 15 ops of timm's RandAugment (vit/data/augment/rand_augment.py draws which, and their arguments) on uint8
(B, 3, H, W) batches; per sample and slot an op index into OPS (-1: skipped) and its float64 argument. Two paths:

  `apply_with_pillow` (the CPU's): Pillow itself, image by image (Pillow's C loops beat tensor kernels on single
    images several times over), so the result is exactly timm's;
  `apply_with_tensors` (a GPU's): batched tensor kernels that reproduce Pillow's arithmetic, how closely measured in
    tests/data/test_augment.py:
      tables (Posterize, Solarize, SolarizeAdd, Invert, Brightness, AutoContrast, Equalize): integer lookup tables, the
        same values as Pillow's `point`/`ImageOps`. Posterize keeping 0 bits gives a black image, as Pillow before 13
        did (Pillow 13 refuses 0 bits, which crashed timm's own policy at magnitude 10; here it is one more table);
      blends (Color, Contrast, Sharpness): Pillow's `Image.blend(degenerate, image, factor)` in float32, truncated,
        with Pillow's degenerate images (its luma, the rounded luma mean, its 3x3 SMOOTH filter); within 1 of Pillow;
      geometric (ShearX/Y, TranslateXRel/YRel, Rotate): the inverse affine map of Pillow's `transform`/`rotate` in
        pixel-edge coordinates, bilinear (timm's training default), pixels mapped from outside the image filled with
        the dataset's mean colour (timm's `img_mean`), in one grid_sample per batch.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps

from vit.data.augment.batched_ops import apply_lut, equalize_lut, per_sample, ramp_table, update_samples

OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
OP_INDEX = {name: i for i, name in enumerate(OPS)}
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
STATIC_TABLES = ("Invert", "Posterize", "Solarize", "SolarizeAdd", "Brightness")
IMAGE_TABLES = ("AutoContrast", "Equalize")
BLENDS = ("Color", "Contrast", "Sharpness")


def _is(op: torch.Tensor, names: tuple[str, ...]) -> torch.Tensor:
    """bool, op's shape: whether each op index is one of `names`."""
    out = torch.zeros_like(op, dtype=torch.bool)
    for name in names:
        out |= op == OP_INDEX[name]
    return out


# ---- geometric: Pillow's inverse affine maps, one bilinear grid_sample ----


def pillow_inverse_affine(op: torch.Tensor, argument: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """float64 (n, 3, 3): for each sample, output pixel -> input pixel in Pillow's pixel-edge coordinates (pixel
    (i, j) spans [i, i + 1)), as timm calls Pillow: shear `(1, f, 0, 0, 1, 0)`, translate `(1, 0, pct * W, ...)`,
    `rotate(degrees)` about the centre (W / 2, H / 2), counter-clockwise. Identity for other ops."""
    n = len(op)
    matrix = torch.eye(3, dtype=torch.float64, device=op.device).repeat(n, 1, 1)
    matrix[:, 0, 1] = torch.where(op == OP_INDEX["ShearX"], argument, 0.0)
    matrix[:, 1, 0] = torch.where(op == OP_INDEX["ShearY"], argument, 0.0)
    matrix[:, 0, 2] = torch.where(op == OP_INDEX["TranslateXRel"], argument * width, 0.0)
    matrix[:, 1, 2] = torch.where(op == OP_INDEX["TranslateYRel"], argument * height, 0.0)
    rotate = op == OP_INDEX["Rotate"]
    angle = -torch.where(rotate, argument, 0.0) * (math.pi / 180.0)  # Pillow: angle = -radians(degrees)
    cos, sin = torch.cos(angle), torch.sin(angle)
    cx, cy = width / 2.0, height / 2.0
    rotation = torch.stack(
        [
            torch.stack([cos, sin, cx - cos * cx - sin * cy], dim=1),
            torch.stack([-sin, cos, cy + sin * cx - cos * cy], dim=1),
            torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64, device=op.device).expand(n, 3),
        ],
        dim=1,
    )  # in = R (out - c) + c
    return torch.where(per_sample(rotate, 3), rotation, matrix)


def warp_bilinear(x: torch.Tensor, matrix: torch.Tensor, fill: tuple[int, ...]) -> torch.Tensor:
    """uint8 (n, C, H, W) through the inverse maps float64 (n, 3, 3) -> uint8 (n, C, H, W).

    Like Pillow's bilinear transform: each output pixel's centre is mapped into the input; inside the image it is
    interpolated from its four neighbours (clamped at the edges), outside it takes the colour `fill` (C values)."""
    n, _, height, width = x.shape
    # grid_sample's [-1, 1] (align_corners=False: -1 is the left edge) from pixel-edge coordinates and back.
    to_unit = torch.tensor(
        [[2.0 / width, 0.0, -1.0], [0.0, 2.0 / height, -1.0], [0.0, 0.0, 1.0]], dtype=torch.float64, device=x.device
    )
    theta = (to_unit @ matrix @ torch.linalg.inv(to_unit))[:, :2].float()  # (n, 2, 3), unit out -> unit in
    # The sampling grid as two broadcast multiply-adds over the pixel centres: a batched GEMM with 3 x 2 matrices
    # (affine_grid) spends most of its time on overhead on the CPU.
    u = torch.linspace(-1 + 1 / width, 1 - 1 / width, width, device=x.device).view(1, 1, width)
    v = torch.linspace(-1 + 1 / height, 1 - 1 / height, height, device=x.device).view(1, height, 1)
    t = theta.view(n, 6, 1, 1)
    grid_x = t[:, 0] * u + t[:, 1] * v + t[:, 2]  # (n, H, W)
    grid_y = t[:, 3] * u + t[:, 4] * v + t[:, 5]
    sampled = F.grid_sample(
        x.float(), torch.stack([grid_x, grid_y], dim=-1), mode="bilinear", padding_mode="border", align_corners=False
    )
    inside = ((grid_x >= -1) & (grid_x < 1) & (grid_y >= -1) & (grid_y < 1)).unsqueeze(1)  # (n, 1, H, W)
    fill_colour = torch.tensor(fill, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return torch.where(inside, sampled.add_(0.5), fill_colour).clamp_(0, 255).to(torch.uint8)  # rounded


# ---- tables: one uint8 (n, 1 or C, 256) lookup table per sample, one gather ----


def static_tables(op: torch.Tensor, argument: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 1, 256): Pillow's table for each sample's op if it depends on the argument alone, else identity.
    Invert 255 - v; Posterize keeps the top `bits` bits; Solarize inverts v >= threshold; SolarizeAdd adds to
    v < 128, capped at 255; Brightness blends with black: trunc(float32(factor) * v), capped."""
    ramp = ramp_table(op.device)  # (1, 1, 256) int64
    arg = per_sample(argument, 3)  # (n, 1, 1)
    bits = arg.long().clamp(0, 8)
    tables = {
        "Invert": (255 - ramp).expand(len(op), 1, 256),
        "Posterize": ramp & (torch.bitwise_left_shift(torch.full_like(bits, 255), 8 - bits) & 255),
        "Solarize": torch.where(ramp < arg, ramp, 255 - ramp),
        "SolarizeAdd": torch.where(ramp < 128, (ramp + arg.long()).clamp(max=255), ramp),
        "Brightness": (ramp.float() * arg.float()).clamp(0, 255).trunc().long(),
    }
    lut = ramp.expand(len(op), 1, 256)
    for name, table in tables.items():
        lut = torch.where(per_sample(op == OP_INDEX[name], 3), table, lut)
    return lut.to(torch.uint8)


def autocontrast_table(x: torch.Tensor) -> torch.Tensor:
    """uint8 (n, C, 256): Pillow's `ImageOps.autocontrast` (no cutoff): per channel, lo/hi = the darkest and
    brightest value present, v -> int(v * 255 / (hi - lo) - lo * 255 / (hi - lo)) clipped; identity where hi <= lo."""
    low = x.amin(dim=(-2, -1)).double().unsqueeze(-1)  # (n, C, 1)
    high = x.amax(dim=(-2, -1)).double().unsqueeze(-1)
    # A tensor numerator: `255.0 / tensor` would multiply by the reciprocal, an ulp off Python's division.
    scale = torch.full_like(low, 255.0) / (high - low).clamp(min=1)
    ramp = ramp_table(x.device).double()
    stretched = (ramp * scale + (-low * scale)).trunc().clamp(0, 255)
    return torch.where(high > low, stretched, ramp).to(torch.uint8)


def apply_tables(x: torch.Tensor, op: torch.Tensor, lut: torch.Tensor, kinds: set[str]) -> torch.Tensor:
    """The table ops in `kinds`: `lut` (n, 1, 256) from `static_tables`, replaced by the image's own table where
    the op is AutoContrast or Equalize (Pillow's histogram equalisation, shared with the AutoAugment policies)."""
    for name, build in (("AutoContrast", autocontrast_table), ("Equalize", equalize_lut)):
        if name in kinds:
            table = build(x)
            lut = table if kinds == {name} else torch.where(per_sample(op == OP_INDEX[name], 3), table, lut)
    return apply_lut(x, lut)


# ---- blends: Pillow's Image.blend(degenerate, image, factor) ----


def pillow_luma(x: torch.Tensor) -> torch.Tensor:
    """int64 (n, 1, H, W): Pillow's RGB -> L, (299 R + 587 G + 114 B) / 1000 in its 16-bit fixed point, rounded."""
    r, g, b = x.long().unbind(dim=-3)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).unsqueeze(-3)


def pillow_smooth(x: torch.Tensor) -> torch.Tensor:
    """float32 (n, C, H, W): Pillow's ImageFilter.SMOOTH (3x3: 1s around a 5, / 13), rounded; the one-pixel border
    keeps the image's own values, as Pillow's 3x3 filter leaves it."""
    height, width = x.shape[-2:]
    pixels = x.float()
    if height <= 2 or width <= 2:
        return pixels
    rows = pixels[..., :-2] + pixels[..., 1:-1] + pixels[..., 2:]  # (n, C, H, W - 2), exact integer sums
    window = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]  # (n, C, H - 2, W - 2)
    smoothed = (pixels[..., 1:-1, 1:-1] * 4 + window).div_(13).round_()
    out = pixels.clone()
    out[..., 1:-1, 1:-1] = smoothed
    return out


def apply_blends(x: torch.Tensor, op: torch.Tensor, factor: torch.Tensor, kinds: set[str]) -> torch.Tensor:
    """Color (degenerate: the luma image), Contrast (the rounded mean luma), Sharpness (the smoothed image), those
    in `kinds`: degenerate + factor * (image - degenerate) in float32, truncated and clipped, as Pillow's blend."""
    degenerate = torch.zeros(1, device=x.device)
    if kinds & {"Color", "Contrast"}:
        luma = pillow_luma(x)  # (n, 1, H, W)
        if "Color" in kinds:
            degenerate = torch.where(per_sample(op == OP_INDEX["Color"]), luma.float(), degenerate)
        if "Contrast" in kinds:
            mean = luma.double().mean(dim=(-3, -2, -1), keepdim=True).add_(0.5).floor_().float()  # int(mean + 0.5)
            degenerate = torch.where(per_sample(op == OP_INDEX["Contrast"]), mean, degenerate)
    if "Sharpness" in kinds:
        degenerate = torch.where(per_sample(op == OP_INDEX["Sharpness"]), pillow_smooth(x), degenerate)
    out = degenerate + per_sample(factor.float()) * (x.float() - degenerate)
    return out.clamp_(0, 255).to(torch.uint8)  # the cast truncates, as Pillow's


def apply_with_tensors(x: torch.Tensor, slots: list[tuple], fill: tuple[int, ...], subsets: bool) -> torch.Tensor:
    """uint8 (B, C, H, W) through the drawn ops (per slot: op int64 (B,), -1 where skipped; argument float64 (B,))
    as batched tensor kernels (above): each op family once per slot, on the samples that drew it (subsets) or on
    the whole batch kept by torch.where (no host sync: the CUDA path)."""
    if subsets:
        x = x.clone(memory_format=torch.contiguous_format)  # rows are written in place
    height, width = x.shape[-2:]
    for op, argument in slots:
        matrix = pillow_inverse_affine(op, argument, height, width)
        x = update_samples(x, _is(op, GEOMETRIC), warp_bilinear, (x, matrix, fill), subsets)
        lut = static_tables(op, argument)
        groups = [STATIC_TABLES, *[(name,) for name in IMAGE_TABLES]] if subsets else [STATIC_TABLES + IMAGE_TABLES]
        for group in groups:
            x = update_samples(x, _is(op, group), apply_tables, (x, op, lut, set(group)), subsets)
        for group in [(name,) for name in BLENDS] if subsets else [BLENDS]:
            x = update_samples(x, _is(op, group), apply_blends, (x, op, argument, set(group)), subsets)
    return x


# ---- the same ops with Pillow, image by image: the CPU's path ----


@functools.lru_cache(maxsize=1024)
def _table(name: str, arg: int) -> tuple[int, ...]:
    """Pillow's 256-entry table of a table op at an integer argument, repeated for the 3 bands of an RGB image."""
    ramp = range(256)
    if name == "Posterize":  # Pillow 13's ImageOps.posterize refuses 0 bits, which keep nothing (black)
        table = [v & (0xFF << (8 - arg) & 0xFF) for v in ramp]
    elif name == "Solarize":
        table = [v if v < arg else 255 - v for v in ramp]
    else:  # SolarizeAdd
        table = [min(255, v + arg) if v < 128 else v for v in ramp]
    return tuple(table * 3)


def _point(name: str, image: Image.Image, arg: float, fill) -> Image.Image:
    return image.point(list(_table(name, int(arg))))


PILLOW_OPS = {
    "AutoContrast": lambda image, arg, fill: ImageOps.autocontrast(image),
    "Equalize": lambda image, arg, fill: ImageOps.equalize(image),
    "Invert": lambda image, arg, fill: ImageOps.invert(image),
    "Rotate": lambda image, arg, fill: image.rotate(arg, resample=Image.BILINEAR, fillcolor=fill),
    "Posterize": functools.partial(_point, "Posterize"),
    "Solarize": functools.partial(_point, "Solarize"),
    "SolarizeAdd": functools.partial(_point, "SolarizeAdd"),
    "Color": lambda image, arg, fill: ImageEnhance.Color(image).enhance(arg),
    "Contrast": lambda image, arg, fill: ImageEnhance.Contrast(image).enhance(arg),
    "Brightness": lambda image, arg, fill: ImageEnhance.Brightness(image).enhance(arg),
    "Sharpness": lambda image, arg, fill: ImageEnhance.Sharpness(image).enhance(arg),
    "ShearX": lambda image, arg, fill: _affine(image, (1, arg, 0, 0, 1, 0), fill),
    "ShearY": lambda image, arg, fill: _affine(image, (1, 0, 0, arg, 1, 0), fill),
    "TranslateXRel": lambda image, arg, fill: _affine(image, (1, 0, arg * image.size[0], 0, 1, 0), fill),
    "TranslateYRel": lambda image, arg, fill: _affine(image, (1, 0, 0, 0, 1, arg * image.size[1]), fill),
}


def _affine(image: Image.Image, data: tuple, fill: tuple[int, ...]) -> Image.Image:
    return image.transform(image.size, Image.AFFINE, data, resample=Image.BILINEAR, fillcolor=fill)


def apply_with_pillow(x: torch.Tensor, slots: list[tuple], fill: tuple[int, ...]) -> torch.Tensor:
    """The drawn ops with Pillow, one image at a time: uint8 (B, 3, H, W) on the CPU -> the same. What timm's
    RandAugment computes for the same ops and arguments, to the pixel; the tensor kernels agree within 1 level."""
    ops = torch.stack([op for op, _ in slots], dim=1).tolist()  # (B, n)
    arguments = torch.stack([argument for _, argument in slots], dim=1).tolist()
    out = x.contiguous().clone()
    planes = out.numpy()  # (B, 3, H, W): each channel plane is one contiguous Pillow "L" image
    height, width = planes.shape[-2:]
    for b, (row_ops, row_args) in enumerate(zip(ops, arguments, strict=True)):
        drawn = [(OPS[op], arg) for op, arg in zip(row_ops, row_args, strict=True) if op >= 0]
        if not drawn:
            continue
        image = Image.merge(
            "RGB", [Image.frombuffer("L", (width, height), plane, "raw", "L", 0, 1) for plane in planes[b]]
        )
        for name, arg in drawn:
            image = PILLOW_OPS[name](image, arg, fill)
        planes[b] = np.asarray(image).transpose(2, 0, 1)  # (H, W, 3) -> (3, H, W)
    return out
