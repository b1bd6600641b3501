"""2D rotary position embeddings (RoPE) for ViTs, after Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer" (https://arxiv.org/abs/2403.13298).

RoPE adds no vector to the tokens. Inside attention it rotates each channel pair (x[2j], x[2j+1]) of q and k,
for every head, by an angle theta_j(p) that depends on the token's position p:

    (x0, x1) -> (x0 cos(theta) - x1 sin(theta),  x1 cos(theta) + x0 sin(theta))

theta is linear in p, so q(p) . k(p') only depends on the offset p - p'. Only the patch tokens are rotated; the
class token (and other prefix tokens) are left as they are.

Positions are (x, y) = (column, row) on the patch grid, integers starting at 0 (no offset, no centring, not
rescaled to a reference grid). For head_dim = D there are D / 2 pairs and L = D / 4 magnitudes
m_i = 1 / temperature^(4 i / D), i = 0 .. L - 1.

* Axial (timm `vit_small_patch16_rope_224`, temperature 100): pairs 0 .. L-1 rotate with the column,
  theta = x * m_i, pairs L .. 2L-1 with the row, theta = y * m_i. Fixed, the same for every head and block.
* Mixed (timm `vit_small_patch16_rope_mixed_224`, temperature 10): each block and head learns a 2D frequency
  (fx, fy) per pair, theta = fx * x + fy * y. Initially pair i and pair L + i have magnitude m_i, pairs 0 .. L-1
  point along a random direction phi (one per head and block) and pairs L .. 2L-1 along phi + pi / 2.
* EVA-02 (timm `eva02_*`, temperature 10000, beside a learned position table): axial, but the first half of the
  pairs turns with the row and the second with the column, and the positions are rescaled to the pretraining
  grid (`ref_grid`): on a 24 x 24 grid with ref_grid 16, column 3 turns as column 3 / 24 * 16 = 2 would.
* DINOv3 (timm `vit_*_dinov3`, temperature 100): positions are the patch centres normalised to [-1, 1] on each
  axis, (i + 0.5) / rows * 2 - 1, so any grid spans the same range; the D / 4 periods are
  temperature^(2 i / (D / 2)), angle = 2 pi * position / period, pairs 0 .. L-1 for the row, L .. 2L-1 for the
  column. The pairs are laid out in "half" order (channel j pairs with channel j + D / 2), not interleaved.

Tables use timm's layout: (..., N, 2 * D) = [sin | cos], each half interleaved per pair (s0, s0, s1, s1, ...), or
in half order (s0, s1, ..., s0, s1, ...) for DINOv3,
N = rows * columns in row-major order, computed in float32 (the mixed table is cast to the freqs' dtype,
float32 unless the module was cast). Real arithmetic only (no complex numbers), so it exports to ONNX.
"""

from __future__ import annotations

import math

import torch


def _check_head_dim(head_dim: int) -> None:
    if head_dim % 4 != 0:
        raise ValueError(f"head_dim={head_dim} must be divisible by 4 for 2D RoPE")


def _magnitudes(head_dim: int, temperature: float) -> torch.Tensor:
    """(head_dim // 4,) float32: 1 / temperature^(4 i / head_dim)."""
    num = head_dim // 4
    exponent = torch.arange(num, dtype=torch.float32) / num  # 4 i / head_dim
    return 1.0 / (temperature**exponent)


def _grid_xy(grid: tuple[int, int], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Column (x) and row (y) index of each patch, both (N,) float32, N = rows * columns in row-major order."""
    rows, cols = grid
    y, x = torch.meshgrid(
        torch.arange(rows, dtype=torch.float32, device=device),
        torch.arange(cols, dtype=torch.float32, device=device),
        indexing="ij",
    )  # (rows, cols) each
    return x.reshape(-1), y.reshape(-1)


def _table(angles: torch.Tensor, half: bool = False) -> torch.Tensor:
    """(..., N, D / 2) angles -> (..., N, 2 * D) [sin | cos] with each value repeated for both channels of a pair:
    interleaved (a0, a0, a1, a1, ...), or with `half` in half order (a0, a1, ..., a0, a1, ...)."""
    if half:
        angles = torch.cat([angles, angles], dim=-1)  # (..., N, D)
    else:
        # stack + flatten, not repeat_interleave: the TorchScript ONNX exporter loses the rank after repeat_interleave.
        angles = torch.stack([angles, angles], dim=-1).flatten(-2)  # (..., N, D)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def axial_rope_table(
    grid: tuple[int, int],
    head_dim: int,
    temperature: float = 100.0,
    *,
    device: torch.device | None = None,
    rows_first: bool = False,
    ref_grid: tuple[int, int] | None = None,
) -> torch.Tensor:
    """(N, 2 * head_dim) = [sin | cos] for a (rows, columns) grid, N = rows * columns in row-major order,
    the same tensor as timm's RotaryEmbeddingCat.get_embed() (float32): of the axial RoPE ViT by default (the
    first quarter of the pairs turns with the column), of EVA-02 with `rows_first` (the row first) and `ref_grid`
    (positions rescaled to that grid: index / grid * ref_grid, in timm's order of operations)."""
    x, y = _grid_xy(grid, device)  # (N,) each
    return axial_rope_at(y, x, grid, head_dim, temperature, rows_first=rows_first, ref_grid=ref_grid)


def axial_rope_at(
    y: torch.Tensor,
    x: torch.Tensor,
    grid: tuple,
    head_dim: int,
    temperature: float = 100.0,
    *,
    rows_first: bool = False,
    ref_grid: tuple[int, int] | None = None,
) -> torch.Tensor:
    """`axial_rope_table`'s rows of tokens at rows `y` and columns `x` (float tensors of one shape (...)) on a grid
    of (rows, columns) (ints, or tensors that broadcast against y: each image's own, in a NaFlex trace): (..., 2 *
    head_dim). The grid matters only with `ref_grid`."""
    _check_head_dim(head_dim)
    if ref_grid is not None:
        y, x = y / grid[0] * ref_grid[0], x / grid[1] * ref_grid[1]
    mag = _magnitudes(head_dim, temperature).to(y.device)  # (D / 4,)
    first, second = (y, x) if rows_first else (x, y)
    angles = torch.cat([first[..., None] * mag, second[..., None] * mag], dim=-1)  # (..., D / 2)
    return _table(angles)


def dinov3_rope_table(
    grid: tuple[int, int], head_dim: int, temperature: float = 100.0, *, device: torch.device | None = None
) -> torch.Tensor:
    """(N, 2 * head_dim) = [sin | cos], half order, for a (rows, columns) grid: DINOv3's rotary positions, the same
    tensor as timm's RotaryEmbeddingDinoV3.get_embed() (float32, no training-time coordinate jitter).

    For a 16 x 16 grid and head_dim 64: the patch centres (0.5 .. 15.5) / 16 * 2 - 1 on each axis, (256, 2) as
    (row, column); 16 periods 100^(2 i / 32); angles (256, 2, 16) -> (256, 32) [row | column]; table (256, 128)."""
    x, y = _grid_xy(grid, device)  # (N,) each
    return dinov3_rope_at(y, x, grid, head_dim, temperature)


def dinov3_rope_at(
    y: torch.Tensor, x: torch.Tensor, grid: tuple, head_dim: int, temperature: float = 100.0
) -> torch.Tensor:
    """`dinov3_rope_table`'s rows of tokens at rows `y` and columns `x` (float tensors of one shape (...)) on a grid
    of (rows, columns) (ints, or tensors that broadcast against y): (..., 2 * head_dim)."""
    _check_head_dim(head_dim)
    centres = torch.stack([(y + 0.5) / grid[0], (x + 0.5) / grid[1]], dim=-1)  # (..., 2) in (0, 1): (row, column)
    coords = 2.0 * centres - 1.0  # in [-1, 1]
    quarter = head_dim // 4
    periods = temperature ** (2.0 * torch.arange(quarter, dtype=torch.float32) / (head_dim // 2))  # (D / 4,)
    angles = 2 * math.pi * coords[..., None] / periods.to(y.device)  # (..., 2, D / 4)
    return _table(angles.flatten(-2), half=True)  # (..., 2 * D)


def mixed_rope_freqs(head_dim: int, depth: int, num_heads: int, temperature: float = 10.0) -> torch.Tensor:
    """The initial learned frequencies (2, depth, heads, head_dim // 2), drawn as timm's init_random_2d_freqs
    (a random rotation per head and block; uses torch's global RNG)."""
    _check_head_dim(head_dim)
    mag = _magnitudes(head_dim, temperature)  # (D / 4,)
    phi = torch.rand(depth, num_heads, 1) * 2 * torch.pi  # (depth, heads, 1): one direction per head and block
    # The second quarter of pairs points at right angles to the first: (depth, heads, D / 2).
    direction = torch.cat([phi.expand(-1, -1, mag.numel()), (phi + torch.pi / 2).expand(-1, -1, mag.numel())], -1)
    mag = torch.cat([mag, mag])  # (D / 2,)
    fx = mag * direction.cos()
    fy = mag * direction.sin()
    return torch.stack([fx, fy])  # (2, depth, heads, D / 2)


def mixed_rope_table(freqs: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(depth, heads, N, 2 * head_dim) = [sin | cos] for learned freqs (2, depth, heads, head_dim // 2): the same
    as timm's RotaryEmbeddingMixed.get_embed(shape=grid) with those freqs. Differentiable in freqs."""
    x, y = _grid_xy(grid, freqs.device)  # (N,) each
    return mixed_rope_at(freqs, y, x)


def mixed_rope_at(freqs: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`mixed_rope_table`'s rows of tokens at rows `y` and columns `x` (float tensors of one shape (...)):
    (depth, heads, ..., 2 * head_dim)."""
    f = freqs.float()
    # theta = fx * x + fy * y: (depth, heads, 1.., D / 2) * (..., 1) -> (depth, heads, ..., D / 2).
    fx, fy = (f[i].reshape(*f.shape[1:3], *([1] * y.ndim), f.shape[-1]) for i in (0, 1))
    angles = fx * x[..., None] + fy * y[..., None]
    return _table(angles).to(freqs.dtype)


def apply_rope(x: torch.Tensor, table: torch.Tensor, half: bool = False) -> torch.Tensor:
    """Rotate x (B, heads, N, head_dim) by table (N, 2 * head_dim) or (heads, N, 2 * head_dim) [sin | cos],
    interleaved pairs (x0, x1), (x2, x3), ..., or with `half` the pairs (x_j, x_{j + D/2}) (DINOv3); returns x's
    dtype. Equal to timm's apply_rot_embed_cat(x, table, half=half)."""
    sin, cos = table.chunk(2, dim=-1)  # (..., N, D) each
    if half:
        sin, cos = sin[..., : sin.shape[-1] // 2], cos[..., : cos.shape[-1] // 2]  # (..., N, D / 2): one per pair
        x0, x1 = x.chunk(2, dim=-1)  # (B, heads, N, D / 2): first and second channel of each pair
        return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).to(x.dtype)  # (B, heads, N, D)
    sin, cos = sin[..., 0::2], cos[..., 0::2]  # (..., N, D / 2): one value per pair
    # Math in the promoted dtype (float32 for a bf16 x and a float32 table), cast once at the end, as timm does.
    dtype = torch.promote_types(x.dtype, table.dtype)
    pairs = x.to(dtype).unflatten(-1, (-1, 2))  # (B, heads, N, D / 2, 2): a view of x in its dtype
    if _complex_multiply_ok(pairs):
        # A pair (x0, x1) read as x0 + i x1 and turned by cos + i sin: (x0 cos - x1 sin) + i (x1 cos + x0 sin), the
        # products and sums of the real form below, in one complex multiply over a view of x (a quarter of the real
        # form's time, forward and backward, on a CPU: that form passes over strided halves of x and stacks them).
        turned = torch.view_as_complex(pairs) * torch.complex(cos.to(dtype), sin.to(dtype))  # (B, heads, N, D / 2)
        return torch.view_as_real(turned).flatten(-2).to(x.dtype)  # (B, heads, N, D)
    x0, x1 = pairs.unbind(-1)  # (B, heads, N, D / 2): first and second channel of each pair
    out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)  # (B, heads, N, D / 2, 2)
    return out.flatten(-2).to(x.dtype)  # (B, heads, N, D)


def _complex_multiply_ok(pairs: torch.Tensor) -> bool:
    """Whether `apply_rope` may turn `pairs` by a complex multiply: in eager PyTorch (the ONNX export has no complex
    tensors, the compilers handle them through fallbacks), in float32 or float64 (there is no bf16 complex type), on
    a view torch can read as complex numbers (each pair adjacent in memory, every other stride even)."""
    if torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
        return False
    even = pairs.storage_offset() % 2 == 0 and all(stride % 2 == 0 for stride in pairs.stride()[:-1])
    return pairs.dtype in (torch.float32, torch.float64) and pairs.stride(-1) == 1 and even


__all__ = [
    "apply_rope",
    "axial_rope_at",
    "axial_rope_table",
    "dinov3_rope_at",
    "dinov3_rope_table",
    "mixed_rope_at",
    "mixed_rope_freqs",
    "mixed_rope_table",
]
