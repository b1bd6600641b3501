"""The image ops of the batched AutoAugment / TrivialAugmentWide (vit/data/augment/batched_policy.py), each once,
for whole uint8 (B, 3, H, W) batches with a per-sample op and magnitude: `apply_ops(x, ops, magnitude)`.

Three families, each one pass over the batch whatever mix of its ops it drew:

    uint8 (B, 3, H, W), ops int64 (B,) (indices into OPS), magnitude float64 (B,)
      --geometric (ShearX/Y, TranslateX/Y, Rotate): a per-sample affine matrix, ONE nearest grid_sample-->
      --tables (Brightness, Posterize, Solarize, Invert, AutoContrast, Equalize): every value of a channel goes
        through a function of that value (and of the channel, for the last two), so a per-sample, per-channel
        lookup table uint8 (B, 1 or C, 256) holding torchvision's float32 arithmetic at the 256 values, ONE gather-->
      --blends (Color, Contrast, Sharpness): torchvision's x * factor + other * (1 - factor) with each op's `other`
        (the luma image, its mean, the smoothed image), ONE fused multiply-add-->
    uint8 (B, 3, H, W)

Per op the same arithmetic as torchvision.transforms.v2.functional, down to the rounding
(tests/data/test_batched_policy.py checks every op image by image, exactly). timm's RandAugment
(vit/data/augment/rand_augment_ops.py) shares the lookup-table gather, Equalize's table and the per-sample row
update.

On CUDA each family runs on the whole batch and `torch.where` keeps the samples that drew one of its ops: finding
which samples did is a host sync, which would stall the sync-free training loop, while the extra arithmetic on a
512 x 3 x 32 x 32 batch is microseconds. On the CPU, where arithmetic is what costs, each op runs on the gathered
samples that drew it. Both give the same result.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)
OP_INDEX = {name: i for i, name in enumerate(OPS)}
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


# ---- shared helpers: images uint8 (n, C, H, W), magnitudes float64 (n,), one per sample ----


def per_sample(values: torch.Tensor, dims: int = 4) -> torch.Tensor:
    return values.view(-1, *[1] * (dims - 1))  # (n,) -> (n, 1, ...), to broadcast over a batch


@functools.lru_cache(maxsize=16)
def _grid_constants(height: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Made once per image size and device (a tensor made from Python values on CUDA is a blocking copy: a host
    sync per batch otherwise), as torchvision's `_affine_grid` makes them: base (1, H * W, 3), each output pixel's
    homogeneous coordinates (x, y, 1) relative to the image centre, and half_size (1, 1, 2), the divisor to
    grid_sample's [-1, 1]."""
    base = torch.empty(1, height, width, 3)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height).unsqueeze(-1))
    base[..., 2].fill_(1.0)
    constants = {"base": base.view(1, height * width, 3), "half_size": torch.tensor([[[0.5 * width, 0.5 * height]]])}
    return {name: t.to(device) for name, t in constants.items()}


@functools.lru_cache(maxsize=16)
def ramp_table(device: torch.device) -> torch.Tensor:
    """int64 (1, 1, 256): the values 0..255, the identity table."""
    return torch.arange(256, device=device).view(1, 1, 256)


@functools.lru_cache(maxsize=64)
def member(names: tuple[str, ...], device: torch.device) -> torch.Tensor:
    """bool (len(OPS),): whether each op is one of `names`; `member(names, device)[ops]` tests a batch at once."""
    return torch.tensor([name in names for name in OPS]).to(device)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c for float32 tensors, rounded once to float32, as the fused multiply-add that torch's
    `c.add_(a, alpha=b)` is on AVX2/AVX-512 CPUs and CUDA. Done in float64, where the product of two float32
    values is exact. A separate multiply and add would differ on ~0.04% of the pixels."""
    return (a.double() * b.double() + c.double()).float()


# ---- geometric: one affine matrix per sample, one grid_sample ----


def inverse_affine(
    angle: torch.Tensor,
    shear_x: torch.Tensor,
    shear_y: torch.Tensor,
    translate_x: torch.Tensor,
    translate_y: torch.Tensor,
    center_x: torch.Tensor,
    center_y: torch.Tensor,
) -> torch.Tensor:
    """torchvision's `_get_inverse_affine_matrix` (scale 1) for float64 (n,) parameters -> float32 (n, 2, 3):
    output pixel -> input pixel, coordinates relative to the image centre. Degrees; the same float64 operations in
    the same order, so the float32 matrix is torchvision's."""
    rot = angle * (math.pi / 180.0)  # math.radians
    sx, sy = shear_x * (math.pi / 180.0), shear_y * (math.pi / 180.0)
    cos_sy, tan_sx = torch.cos(sy), torch.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx, cy_plus_ty = center_x + translate_x, center_y + translate_y
    a = torch.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + torch.sin(rot))
    c = torch.sin(rot_minus_sy) / cos_sy
    d = torch.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = center_x - m0 * cx_plus_tx - m1 * cy_plus_ty
    m5 = center_y - m3 * cx_plus_tx - m4 * cy_plus_ty
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3).float()


def affine_theta(ops: torch.Tensor, magnitude: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """float32 (n, 2, 3): each sample's matrix as torchvision's policies call F.affine / F.rotate for its op (the
    identity for an op that is not geometric). ops: OPS indices (n,), magnitude float64 (n,)."""
    zero = torch.zeros_like(magnitude)

    def where(name: str, value) -> torch.Tensor:
        return torch.where(ops == OP_INDEX[name], value, zero)

    shear = torch.atan(magnitude) * (180.0 / math.pi)  # math.degrees(math.atan(m))
    corner = (ops == OP_INDEX["ShearX"]) | (ops == OP_INDEX["ShearY"])  # shears: center=[0, 0], the top-left corner
    return inverse_affine(
        -where("Rotate", torch.remainder(magnitude, 360.0)),  # F.rotate: angle % 360, then the matrix of -angle
        where("ShearX", shear),
        where("ShearY", shear),
        where("TranslateX", magnitude.trunc()),  # int(magnitude) pixels
        where("TranslateY", magnitude.trunc()),
        torch.where(corner, -0.5 * width, zero),
        torch.where(corner, -0.5 * height, zero),
    )


def warp(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """uint8 (n, C, H, W) and float32 (n, 2, 3) inverse matrices -> uint8 (n, C, H, W): nearest neighbour, 0 outside
    the image (torchvision's `_affine_grid` + `_apply_grid_transform` with fill=None)."""
    n, _, height, width = x.shape
    constants = _grid_constants(height, width, x.device)
    # A tensor divisor, as torchvision's: CUDA divides by a Python scalar as a multiply by its reciprocal.
    rescaled = theta.transpose(1, 2).div(constants["half_size"])  # (n, 3, 2): to [-1, 1]
    # The same float32 bmm as torchvision's: how a GEMM sums x * m0 + y * m1 + m2 (the order, fused multiply-adds
    # or not) depends on the BLAS and the CPU: an elementwise copy of one machine's order picked the neighbouring
    # pixel for ~0.01% of the sheared pixels on another; only the same operation gives the same grid
    # everywhere. Like torchvision's, it runs in TF32 on CUDA where the process allows TF32.
    grid = constants["base"].expand(n, -1, -1).bmm(rescaled).view(n, height, width, 2)  # input (x, y) per pixel
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round_().to(torch.uint8)


# ---- tables: uint8 (n, 1 or C, 256) per sample (and channel), one gather ----


def brightness_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.adjust_brightness(x, 1 + magnitude): x * factor, clamped, as a table (n, 1, 256)."""
    factor = per_sample((1.0 + magnitude).float(), 3)
    return ramp_table(magnitude.device).float().mul(factor).clamp_(0, 255).to(torch.uint8)


def posterize_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.posterize(x, int(magnitude)), keeping the top `bits` bits, as a table (n, 1, 256)."""
    bits = magnitude.trunc().clamp(0, 8).long()
    mask = torch.bitwise_left_shift(torch.full_like(bits, 255), 8 - bits) & 255  # 8 bits: 255, 4 bits: 240
    return (ramp_table(magnitude.device) & per_sample(mask, 3)).to(torch.uint8)


def solarize_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.solarize(x, 255 * magnitude), inverting the values >= the threshold (compared in float32, as torch does),
    as a table (n, 1, 256)."""
    ramp = ramp_table(magnitude.device)
    threshold = per_sample((255.0 * magnitude).float(), 3)
    return torch.where(ramp >= threshold, 255 - ramp, ramp).to(torch.uint8)


def invert_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.invert(x) as a table (n, 1, 256)."""
    return (255 - ramp_table(magnitude.device)).to(torch.uint8).expand(len(magnitude), 1, 256)


def autocontrast_lut(x: torch.Tensor) -> torch.Tensor:
    """F.autocontrast(x): every channel stretched to 0..255 (a constant one stays), as a table (n, C, 256)."""
    low = x.amin(dim=(-2, -1)).float().unsqueeze(-1)  # (n, C, 1)
    high = x.amax(dim=(-2, -1)).float().unsqueeze(-1)
    flat = high == low
    inv_scale = torch.where(flat, 1.0, (high - low).mul_(1.0 / 255))
    low = torch.where(flat, 0.0, low)
    return (ramp_table(x.device) - low).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


def equalize_lut(x: torch.Tensor) -> torch.Tensor:
    """F.equalize(x): PIL's histogram equalisation per channel of every image, from one batched histogram
    (scatter_add over (n * C, 256) bins), as a table (n, C, 256)."""
    n, channels, height, width = x.shape
    flat = x.reshape(n * channels, height * width).long()  # (P, HW), P = n * C planes
    hist = torch.zeros(n * channels, 256, dtype=torch.int32, device=x.device)
    hist.scatter_add_(1, flat, hist.new_ones(1).expand_as(flat))  # (P, 256)
    cum_hist = hist.cumsum(dim=1)  # int64
    # PIL: step = (pixels not of the plane's largest value) // 255; lut[k] = (cum_hist[k - 1] + step // 2) // step
    last = cum_hist.argmax(dim=1, keepdim=True)  # the largest value present: cum_hist reaches its total there
    step = (height * width - hist.gather(1, last)).div_(255, rounding_mode="floor")  # (P, 1)
    lut = (cum_hist[:, :-1] + step // 2).div_(step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([lut.new_zeros(n * channels, 1), lut], dim=1)  # (P, 256)
    lut = torch.where(step != 0, lut, ramp_table(x.device).view(1, 256))  # step 0 (a near-constant plane): as is
    return lut.to(torch.uint8).view(n, channels, 256)


STATIC_LUTS = {"Brightness": brightness_lut, "Posterize": posterize_lut, "Solarize": solarize_lut, "Invert": invert_lut}
IMAGE_LUTS = {"AutoContrast": autocontrast_lut, "Equalize": equalize_lut}
TABLE_OPS = (*STATIC_LUTS, *IMAGE_LUTS)


def static_lut(ops: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 1, 256): each sample's table if its op's depends on the magnitude alone (else the identity)."""
    lut = ramp_table(magnitude.device).to(torch.uint8).expand(len(ops), 1, 256)
    for name, build in STATIC_LUTS.items():
        lut = torch.where(per_sample(ops == OP_INDEX[name], 3), build(magnitude), lut)
    return lut


def apply_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Every value of channel c of image i through lut[i, c]: uint8 (n, C, H, W), uint8 (n, 1 or C, 256)."""
    n, channels, height, width = x.shape
    table = lut.expand(n, channels, 256).reshape(n * channels, 256)
    return table.gather(1, x.reshape(n * channels, height * width).long()).view_as(x)


def _select(kinds: set[str], ops: torch.Tensor, name: str, value: torch.Tensor, other) -> torch.Tensor:
    """value for the samples whose op is `name`, other elsewhere; just value when `name` is the only kind (the
    CPU's per-op subsets), so no selection pass is spent."""
    if kinds == {name}:
        return value
    return torch.where(per_sample(ops == OP_INDEX[name], value.dim()), value, other)


def apply_tables(x: torch.Tensor, ops: torch.Tensor, lut: torch.Tensor, kinds: set[str]) -> torch.Tensor:
    """The table ops in `kinds`: `lut` (n, 1, 256) from `static_lut`, replaced by the image's own table where the
    op is AutoContrast or Equalize, applied in one gather."""
    for name, build in IMAGE_LUTS.items():
        if name in kinds:
            lut = _select(kinds, ops, name, build(x), lut)  # (n, C, 256)
    return apply_lut(x, lut)


# ---- blends: one fused multiply-add ----

BLEND_OPS = ("Color", "Contrast", "Sharpness")


def _grayscale_floor(x: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 3, H, W) -> float32 (n, 1, H, W): torchvision's luma, floored, with its operation order."""
    r, g, b = x.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3).floor_()


def _smoothed_minus_x(x: torch.Tensor) -> torch.Tensor:
    """float32 (n, C, H, W): F.adjust_sharpness's smoothed image (3x3: 1s around a 5, / 13, rounded) minus x inside,
    0 on the one-pixel border (which it leaves as is).

    torchvision rounds a float32 conv2d: the exact value S / 13 (S = the 3x3 sum + 4 * centre, an integer) is never
    within 1/26 of a .5, far beyond float32's error, so round(S / 13) from the exact integer S is its result (and
    stays so where cuDNN would convolve in TF32)."""
    height, width = x.shape[-2:]
    if height <= 2 or width <= 2:
        return torch.zeros(x.shape, device=x.device)
    pixels = x.float()  # integers: the sums below are exact
    rows = pixels[..., :-2] + pixels[..., 1:-1] + pixels[..., 2:]  # (n, C, H, W - 2)
    window = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]  # (n, C, H - 2, W - 2)
    centre = pixels[..., 1:-1, 1:-1]
    smoothed = centre.mul(4).add_(window).div_(13).round_()
    return F.pad(smoothed.sub_(centre), (1, 1, 1, 1))


def apply_blends(x: torch.Tensor, ops: torch.Tensor, magnitude: torch.Tensor, kinds: set[str]) -> torch.Tensor:
    """Color, Contrast and Sharpness (those in `kinds`), factor = 1 + magnitude: torchvision's
    `x.mul(factor).add_(other, alpha=1 - factor)`, clamped, with `other` the floored luma image (F.adjust_saturation),
    its mean (F.adjust_contrast, an exact float32 sum: integers), or for F.adjust_sharpness
    `x.add_(smoothed - x, alpha=1 - factor)`, i.e. factor 1 on x and other = smoothed - x."""
    factor = per_sample(1.0 + magnitude)  # float64, as torchvision's Python floats
    other, scale = 0.0, factor
    if kinds & {"Color", "Contrast"}:
        gray = _grayscale_floor(x)  # (n, 1, H, W)
        if "Color" in kinds:
            other = _select(kinds, ops, "Color", gray, other)
        if "Contrast" in kinds:
            other = _select(kinds, ops, "Contrast", gray.mean(dim=(-3, -2, -1), keepdim=True), other)  # (n, 1, 1, 1)
    if "Sharpness" in kinds:
        other = _select(kinds, ops, "Sharpness", _smoothed_minus_x(x), other)
        scale = _select(kinds, ops, "Sharpness", torch.ones_like(factor), factor)
    # float32 (ratio, alpha), as the kernels see torchvision's Python scalars
    out = _fma(other, (1.0 - factor).float(), x.float() * scale.float())
    return out.clamp_(0, 255).to(torch.uint8)


# ---- one slot: each sample b transformed by OPS[ops[b]] with magnitude[b] ----


def update_samples(x: torch.Tensor, chosen: torch.Tensor, fn: Callable, args: tuple, subsets: bool) -> torch.Tensor:
    """x with its samples where `chosen` (bool (n,)) replaced by fn(*args) of those samples: computed on the
    gathered samples and written into x in place, or on all of them and kept by torch.where (no host sync).
    args: per-sample tensors, or other values passed as they are."""
    if not subsets:
        return torch.where(per_sample(chosen), fn(*args), x)
    index = chosen.nonzero().squeeze(1)
    if len(index):
        rows = fn(*(a.index_select(0, index) if isinstance(a, torch.Tensor) else a for a in args))
        # index_copy_ moves uint8 rows byte by byte on the CPU (~10x slower): copy them as 8-byte words
        words = x[0].numel() % 8 == 0
        flat, rows = x.view(len(x), -1), rows.reshape(len(rows), -1)
        (flat.view(torch.int64) if words else flat).index_copy_(0, index, rows.view(torch.int64) if words else rows)
    return x


def apply_ops(
    x: torch.Tensor,
    ops: torch.Tensor,
    magnitude: torch.Tensor,
    kinds: Sequence[str] = OPS,
    subsets: bool | None = None,
    theta: torch.Tensor | None = None,
    lut: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample b of uint8 x (B, C, H, W) transformed by OPS[ops[b]] with magnitude[b] (float64 (B,)).

    kinds: the op names that can occur (only those are computed). subsets: run each op on the gathered samples that
    drew it (the geometric ones together, the magnitude-only tables together; default on the CPU), or each family
    once on the whole batch, keeping its samples by torch.where (default on CUDA: no host sync, fewest launches).
    theta (B, 2, 3) and lut (B, 1, 256): `affine_theta` and `static_lut` of (ops, magnitude) if already known (a
    policy keeps them per magnitude bin).
    """
    subsets = x.device.type == "cpu" if subsets is None else subsets
    kinds = set(kinds)
    if subsets:
        x = x.clone(memory_format=torch.contiguous_format)  # written in place, row by row, from here
    if kinds & set(GEOMETRIC):
        theta = affine_theta(ops, magnitude, *x.shape[-2:]) if theta is None else theta
        x = update_samples(x, member(GEOMETRIC, x.device)[ops], warp, (x, theta), subsets)
    if kinds & set(TABLE_OPS):
        lut = static_lut(ops, magnitude) if lut is None else lut
        groups = [tuple(STATIC_LUTS), *[(name,) for name in IMAGE_LUTS]] if subsets else [TABLE_OPS]
        for group in groups:
            if kinds & set(group):
                x = update_samples(
                    x, member(group, x.device)[ops], apply_tables, (x, ops, lut, kinds & set(group)), subsets
                )
    for group in [(name,) for name in BLEND_OPS] if subsets else [BLEND_OPS]:
        if kinds & set(group):
            x = update_samples(
                x, member(group, x.device)[ops], apply_blends, (x, ops, magnitude, kinds & set(group)), subsets
            )
    return x
