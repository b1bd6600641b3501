"""AutoAugment, RandAugment and TrivialAugmentWide for whole uint8 (B, 3, H, W) batches, every sample with its own
draw: what `data.augment.auto_augment=autoaug|trivial` means on both loaders (vit/data/augment.py builds them).

torchvision's v2 policies draw ONE op per call, from the global RNG, so a loader calling them on a batch either
shares one draw among many images or makes a call per chunk of images, each a handful of small kernels (and host
syncs) launched from Python. Here a batch costs a fixed number of launches per op family, whatever its size:

    uint8 (B, 3, H, W), generator
      --draw, per sample and per slot (1 for TrivialAugmentWide, N for RandAugment, 2 for AutoAugment): a row of
        the policy's table = (op, magnitude bin, sign), and for AutoAugment a sub-policy and whether each of its two
        ops applies-->
      --per slot, three families (see below): the geometric ops in ONE nearest grid_sample with a per-sample
        affine matrix; the value-to-value ops in ONE lookup-table gather; Color / Contrast / Sharpness in ONE fused
        multiply-add-->
    uint8 (B, 3, H, W)

Matching torchvision (transforms/v2/_auto_augment.py, 0.2x): the same op set, magnitude bins and signed ops, the
same sub-policies and probabilities, and per op the same arithmetic as torchvision.transforms.v2.functional, down to
the rounding (tests/test_batched_policy.py checks every op image by image, exactly). The draws are not torchvision's:
they come from the generator passed in (the loader's per-epoch device generator), so they repeat exactly on resume.
AugMix (a Dirichlet mixture of op chains) has no batched version: the loader keeps torchvision's for it.

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
SIGNED = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness")

# The magnitude bins of each op, (num_bins, height, width) -> (num_bins,) or None (no magnitude), as torchvision's
# `_AUGMENTATION_SPACE`s: the "standard" one of AutoAugment and RandAugment, and TrivialAugmentWide's "wide" one.
MagnitudeFn = Callable[[int, int, int], torch.Tensor | None]
_NONE: MagnitudeFn = lambda bins, h, w: None  # noqa: E731


def _linspace(start: float, end: float) -> MagnitudeFn:
    return lambda bins, h, w: torch.linspace(start, end, bins)


def _posterize_bits(drop: int) -> MagnitudeFn:
    """8 bits down to 8 - drop bits over the bins, rounded (torchvision's formula)."""
    return lambda bins, h, w: (8 - (torch.arange(bins) / ((bins - 1) / drop))).round().int()


STANDARD_SPACE: dict[str, MagnitudeFn] = {
    "Identity": _NONE,
    "ShearX": _linspace(0.0, 0.3),
    "ShearY": _linspace(0.0, 0.3),
    "TranslateX": lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, bins),
    "TranslateY": lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, bins),
    "Rotate": _linspace(0.0, 30.0),
    "Brightness": _linspace(0.0, 0.9),
    "Color": _linspace(0.0, 0.9),
    "Contrast": _linspace(0.0, 0.9),
    "Sharpness": _linspace(0.0, 0.9),
    "Posterize": _posterize_bits(4),
    "Solarize": _linspace(1.0, 0.0),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
    "Invert": _NONE,
}
WIDE_SPACE: dict[str, MagnitudeFn] = {
    "Identity": _NONE,
    "ShearX": _linspace(0.0, 0.99),
    "ShearY": _linspace(0.0, 0.99),
    "TranslateX": _linspace(0.0, 32.0),  # pixels, whatever the image size (as torchvision)
    "TranslateY": _linspace(0.0, 32.0),
    "Rotate": _linspace(0.0, 135.0),
    "Brightness": _linspace(0.0, 0.99),
    "Color": _linspace(0.0, 0.99),
    "Contrast": _linspace(0.0, 0.99),
    "Sharpness": _linspace(0.0, 0.99),
    "Posterize": _posterize_bits(6),
    "Solarize": _linspace(1.0, 0.0),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
}

# AutoAugment's sub-policies: ((op, probability, magnitude bin or None), (op, probability, bin)), drawn uniformly.
AUTOAUGMENT_POLICIES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
}


# ---- the ops, each once, batched: images uint8 (n, C, H, W), magnitudes float64 (n,), one per sample ----
#
# Three families, each one pass over the images whatever mix of its ops a batch drew:
#   geometric (ShearX/Y, TranslateX/Y, Rotate): a per-sample affine matrix, one grid_sample;
#   tables (Brightness, Posterize, Solarize, Invert, AutoContrast, Equalize): every value of a channel goes through
#     a function of that value (and of the channel, for the last two), so a per-sample, per-channel lookup table
#     uint8 (n, 1 or C, 256) holding torchvision's float32 arithmetic at the 256 values, applied in one gather;
#   blends (Color, Contrast, Sharpness): torchvision's x * factor + other * (1 - factor) with each op's `other`
#     (the luma image, its mean, the smoothed image), one fused multiply-add.


def _per_sample(values: torch.Tensor, dims: int = 4) -> torch.Tensor:
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
def _ramp(device: torch.device) -> torch.Tensor:
    """int64 (1, 1, 256): the values 0..255, the identity table."""
    return torch.arange(256, device=device).view(1, 1, 256)


@functools.lru_cache(maxsize=64)
def _member(names: tuple[str, ...], device: torch.device) -> torch.Tensor:
    """bool (len(OPS),): whether each op is one of `names`; `_member(names, device)[ops]` tests a batch at once."""
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
    # or not) depends on the BLAS and the CPU: an elementwise copy of one dev machine's order picked the neighbouring
    # pixel for ~0.01% of the sheared pixels on another (an AMD EPYC); only the same operation gives the same grid
    # everywhere. Like torchvision's, it runs in TF32 on CUDA where the process allows TF32.
    grid = constants["base"].expand(n, -1, -1).bmm(rescaled).view(n, height, width, 2)  # input (x, y) per pixel
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round_().to(torch.uint8)


# ---- tables: uint8 (n, 1 or C, 256) per sample (and channel), one gather ----


def brightness_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.adjust_brightness(x, 1 + magnitude): x * factor, clamped, as a table (n, 1, 256)."""
    factor = _per_sample((1.0 + magnitude).float(), 3)
    return _ramp(magnitude.device).float().mul(factor).clamp_(0, 255).to(torch.uint8)


def posterize_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.posterize(x, int(magnitude)), keeping the top `bits` bits, as a table (n, 1, 256)."""
    bits = magnitude.trunc().clamp(0, 8).long()
    mask = torch.bitwise_left_shift(torch.full_like(bits, 255), 8 - bits) & 255  # 8 bits: 255, 4 bits: 240
    return (_ramp(magnitude.device) & _per_sample(mask, 3)).to(torch.uint8)


def solarize_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.solarize(x, 255 * magnitude), inverting the values >= the threshold (compared in float32, as torch does),
    as a table (n, 1, 256)."""
    ramp = _ramp(magnitude.device)
    threshold = _per_sample((255.0 * magnitude).float(), 3)
    return torch.where(ramp >= threshold, 255 - ramp, ramp).to(torch.uint8)


def invert_lut(magnitude: torch.Tensor) -> torch.Tensor:
    """F.invert(x) as a table (n, 1, 256)."""
    return (255 - _ramp(magnitude.device)).to(torch.uint8).expand(len(magnitude), 1, 256)


def autocontrast_lut(x: torch.Tensor) -> torch.Tensor:
    """F.autocontrast(x): every channel stretched to 0..255 (a constant one stays), as a table (n, C, 256)."""
    low = x.amin(dim=(-2, -1)).float().unsqueeze(-1)  # (n, C, 1)
    high = x.amax(dim=(-2, -1)).float().unsqueeze(-1)
    flat = high == low
    inv_scale = torch.where(flat, 1.0, (high - low).mul_(1.0 / 255))
    low = torch.where(flat, 0.0, low)
    return (_ramp(x.device) - low).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


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
    lut = torch.where(step != 0, lut, _ramp(x.device).view(1, 256))  # step 0 (a near-constant plane): as is
    return lut.to(torch.uint8).view(n, channels, 256)


STATIC_LUTS = {"Brightness": brightness_lut, "Posterize": posterize_lut, "Solarize": solarize_lut, "Invert": invert_lut}
IMAGE_LUTS = {"AutoContrast": autocontrast_lut, "Equalize": equalize_lut}
TABLE_OPS = (*STATIC_LUTS, *IMAGE_LUTS)


def static_lut(ops: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 1, 256): each sample's table if its op's depends on the magnitude alone (else the identity)."""
    lut = _ramp(magnitude.device).to(torch.uint8).expand(len(ops), 1, 256)
    for name, build in STATIC_LUTS.items():
        lut = torch.where(_per_sample(ops == OP_INDEX[name], 3), build(magnitude), lut)
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
    return torch.where(_per_sample(ops == OP_INDEX[name], value.dim()), value, other)


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
    factor = _per_sample(1.0 + magnitude)  # float64, as torchvision's Python floats
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


def _update(x: torch.Tensor, chosen: torch.Tensor, fn: Callable, args: tuple, subsets: bool) -> torch.Tensor:
    """x with its samples where `chosen` (bool (n,)) replaced by fn(*args) of those samples: computed on the
    gathered samples and written into x in place, or on all of them and kept by torch.where (no host sync).
    args: per-sample tensors, or other values passed as they are."""
    if not subsets:
        return torch.where(_per_sample(chosen), fn(*args), x)
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
        x = _update(x, _member(GEOMETRIC, x.device)[ops], warp, (x, theta), subsets)
    if kinds & set(TABLE_OPS):
        lut = static_lut(ops, magnitude) if lut is None else lut
        groups = [tuple(STATIC_LUTS), *[(name,) for name in IMAGE_LUTS]] if subsets else [TABLE_OPS]
        for group in groups:
            if kinds & set(group):
                x = _update(x, _member(group, x.device)[ops], apply_tables, (x, ops, lut, kinds & set(group)), subsets)
    for group in [(name,) for name in BLEND_OPS] if subsets else [BLEND_OPS]:
        if kinds & set(group):
            x = _update(
                x, _member(group, x.device)[ops], apply_blends, (x, ops, magnitude, kinds & set(group)), subsets
            )
    return x


def _as_op(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The op `name` alone, (uint8 (n, C, H, W), float64 (n,)) -> uint8 (n, C, H, W)."""

    def op(x: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
        ops = torch.full(magnitude.shape, OP_INDEX[name], device=magnitude.device)
        return apply_ops(x, ops, magnitude, kinds=(name,), subsets=False)

    op.__name__ = op.__qualname__ = name
    return op


OP_FUNCTIONS = {name: _as_op(name) for name in OPS[1:]}


# ---- the policies ----


class BatchedPolicy:
    """A policy as slots, each drawing per sample a row of the policy's table: (op, magnitude bin, sign).

    The table is built on the CPU with torchvision's formulas and kept per (image size, device): per row the op,
    its float64 magnitude, and what depends on the magnitude alone (the affine matrix, the static lookup table), so
    a batch gathers those instead of recomputing them. Subclasses set `space` (op -> magnitude bins), `num_bins`
    and `slot_kinds` (the ops each slot can draw) and implement `draw`. `subsets`: as `apply_ops`'s.
    """

    space: dict[str, MagnitudeFn]
    num_bins: int
    slot_kinds: list[tuple[str, ...]]

    def __init__(self) -> None:
        self._tables: dict[tuple, dict[str, torch.Tensor]] = {}
        self.subsets: bool | None = None

    def magnitudes(self, height: int, width: int) -> torch.Tensor:
        """float32 (len(OPS), num_bins): the magnitude of every op and bin (0 for ops without one)."""
        table = torch.zeros(len(OPS), self.num_bins)
        for name, fn in self.space.items():
            values = fn(self.num_bins, height, width)
            if values is not None:
                table[OP_INDEX[name]] = values.float()
        return table

    def row(self, ops: torch.Tensor, bins: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """The table row of (op, bin, sign): rows run over ops, then bins, then (+, -)."""
        return (ops * self.num_bins + bins) * 2 + negative.long()

    def build_tables(self, height: int, width: int) -> dict[str, torch.Tensor]:
        """On the CPU, for (H, W) images: op, magnitude, theta and lut per row; `choices`: the ops drawn from."""
        ops = torch.arange(len(OPS)).repeat_interleave(self.num_bins * 2)  # (R,), R = len(OPS) * num_bins * 2
        magnitude = self.magnitudes(height, width).double().view(-1, 1).repeat(1, 2)  # (len(OPS) * bins, 2)
        signed = _member(SIGNED, torch.device("cpu")).repeat_interleave(self.num_bins)  # (len(OPS) * bins,)
        magnitude[:, 1] = torch.where(signed, -magnitude[:, 1], magnitude[:, 1])  # torchvision: magnitude *= -1
        magnitude = magnitude.view(-1)
        return {
            "op": ops,
            "magnitude": magnitude,
            "theta": affine_theta(ops, magnitude, height, width),  # (R, 2, 3)
            "lut": static_lut(ops, magnitude),  # (R, 1, 256)
            "choices": torch.tensor([OP_INDEX[name] for name in self.space]),
        }

    def tables(self, height: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
        key = (height, width, str(device))
        if key not in self._tables:
            self._tables[key] = {name: t.to(device) for name, t in self.build_tables(height, width).items()}
        return self._tables[key]

    def draw(
        self, batch: int, height: int, width: int, device: torch.device, generator: torch.Generator
    ) -> list[torch.Tensor]:
        """Per slot: table rows int64 (B,). A fixed number of random values per batch, so the generator advances
        the same whatever is drawn. Signs as torchvision: negative where `torch.rand() <= 0.5`."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 (B, C, H, W) -> uint8 (B, C, H, W)."""
        height, width = x.shape[-2:]
        tables = self.tables(height, width, x.device)
        for rows, kinds in zip(self.draw(len(x), height, width, x.device, generator), self.slot_kinds, strict=True):
            ops, magnitude = tables["op"][rows], tables["magnitude"][rows]
            x = apply_ops(x, ops, magnitude, kinds, self.subsets, tables["theta"][rows], tables["lut"][rows])
        return x


class BatchedTrivialAugmentWide(BatchedPolicy):
    """TrivialAugmentWide: one op per sample, uniform over 14, a uniform bin of `num_magnitude_bins`, a random sign."""

    space = WIDE_SPACE

    def __init__(self, num_magnitude_bins: int = 31) -> None:
        super().__init__()
        self.num_bins = num_magnitude_bins
        self.slot_kinds = [tuple(self.space)]

    def draw(self, batch, height, width, device, generator):
        choices = self.tables(height, width, device)["choices"]
        ops = choices[torch.randint(len(choices), (batch,), device=device, generator=generator)]
        bins = torch.randint(self.num_bins, (batch,), device=device, generator=generator)
        negative = torch.rand(batch, device=device, generator=generator) <= 0.5
        return [self.row(ops, bins, negative)]


class BatchedRandAugment(BatchedPolicy):
    """RandAugment: `num_ops` ops in sequence per sample, each uniform over 14, all at bin `magnitude` of
    `num_magnitude_bins`, each with a random sign."""

    space = {name: fn for name, fn in STANDARD_SPACE.items() if name != "Invert"}

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31) -> None:
        super().__init__()
        if not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"magnitude={magnitude} must be in [0, num_magnitude_bins={num_magnitude_bins})")
        self.num_ops, self.magnitude, self.num_bins = num_ops, magnitude, num_magnitude_bins
        self.slot_kinds = [tuple(self.space)] * num_ops

    def draw(self, batch, height, width, device, generator):
        choices = self.tables(height, width, device)["choices"]
        slots = []
        for _ in range(self.num_ops):
            ops = choices[torch.randint(len(choices), (batch,), device=device, generator=generator)]
            negative = torch.rand(batch, device=device, generator=generator) <= 0.5
            slots.append(self.row(ops, torch.full_like(ops, self.magnitude), negative))
        return slots


class BatchedAutoAugment(BatchedPolicy):
    """AutoAugment: a uniform sub-policy per sample, then its two ops in sequence, each applied with its
    probability at its fixed bin (of 10), signed ops with a random sign. policy: "cifar10" or "imagenet"."""

    space = {name: fn for name, fn in STANDARD_SPACE.items() if name != "Identity"}
    num_bins = 10

    def __init__(self, policy: str = "imagenet") -> None:
        super().__init__()
        self.policy = policy
        self.sub_policies = AUTOAUGMENT_POLICIES[policy]
        self.slot_kinds = [tuple(sorted({sub[j][0] for sub in self.sub_policies})) for j in range(2)]

    def build_tables(self, height, width):
        tables = super().build_tables(height, width)
        steps = [step for sub in self.sub_policies for step in sub]  # (25 * 2) in sub-policy order
        ops = torch.tensor([OP_INDEX[name] for name, _, _ in steps])
        bins = torch.tensor([b or 0 for _, _, b in steps])
        tables["step_rows"] = self.row(ops, bins, torch.zeros_like(ops)).view(-1, 2)  # the + sign's rows
        tables["probability"] = torch.tensor([p for _, p, _ in steps], dtype=torch.float32).view(-1, 2)
        return tables

    def draw(self, batch, height, width, device, generator):
        tables = self.tables(height, width, device)
        sub = torch.randint(len(self.sub_policies), (batch,), device=device, generator=generator)
        slots = []
        for j in range(2):
            # torchvision: `if not torch.rand(()) <= probability: skip` (compared in float32); skipped: Identity
            applied = torch.rand(batch, device=device, generator=generator) <= tables["probability"][sub, j]
            negative = torch.rand(batch, device=device, generator=generator) <= 0.5
            rows = tables["step_rows"][sub, j] + negative  # the - sign's row follows the + sign's
            slots.append(torch.where(applied, rows, 0))  # row 0: Identity
        return slots
