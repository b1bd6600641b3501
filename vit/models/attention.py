"""Multi-head scaled dot-product self-attention, the heart of every model here, and its variants.

A worked example: a batch of B=13 sequences of N=100 tokens, each dim=64 wide, over 4 heads of head_dim = 64 / 4
= 16. `Attention.forward` takes exactly these steps, in this order:

    x                                      (B, N, dim)              (13, 100, 64)
    project:  qkv = self.qkv(x)            (B, N, 3 * dim)          (13, 100, 192)
    split heads: q, k, v                   (B, heads, N, head_dim)  (13, 4, 100, 16)   each
    [qk_norm: q, k = LN(q), LN(k)]         (B, heads, N, head_dim)                     over head_dim, per head
    scores = q @ kᵀ * scale                (B, heads, N, N)         (13, 4, 100, 100)  scale = head_dim ** -0.5
    attn = softmax(scores) over the keys   (B, heads, N, N)         (13, 4, 100, 100)  each row sums to 1
    weighted sum:  attn @ v                (B, heads, N, head_dim)  (13, 4, 100, 16)
    merge heads                            (B, N, dim)              (13, 100, 64)
    project:  self.proj                    (B, N, dim)              (13, 100, 64)

This is timm's `Attention`, with its parameter names, so timm's weights load unchanged. One self-attention layer
costs 4·N·C² + 2·N²·C multiply-adds at width C: the four projections (Q, K, V, output) 4·N·C², and the two (N, N)
products q·kᵀ and attn·v 2·N²·C (vit/models/complexity.py).

Each variant is a small subclass that changes one thing:

* `RotaryAttention`: q and k rotated by their positions before the scores (vit/models/rope.py), and EVA-02's
  biases (a learned `q_bias` and `v_bias`, the key's fixed at zero): the foundation families' attention.
* `TokenAttention`, the token attention of Tokens-to-Token ViT (vit/models/t2t.py): the output width dim_out
  differs from dim, so the input cannot be added back around the layer; V, merged over heads, is added instead.
* `LocalitySelfAttention` (Lee, Lee & Song 2021, "Vision Transformer for Small-Size Datasets") changes the
  scores and nothing else:

      scores = (q * scale_h) @ kᵀ     scale_h: a learnable temperature per head, (heads,), starts at head_dim ** -0.5
      scores[..., i, i] = -inf        diagonal masking: a token takes nothing from itself, only from the others

  so the softmax is sharper where the model learns to want it and every token has to look at its neighbours.

`capture_attention` records the softmax weights from outside, through a hook on each layer's `attn_drop`, whose
input they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit.models.norm import LayerNorm
from vit.models.rope import apply_rope

ATTN_BACKENDS = ("auto", "math", "sdpa")
# attn_backend=auto on a CPU writes the scores out up to these token counts and calls the fused kernel above them:
# measured faster there (docs/BENCHMARKS.md, "Attention on the CPU").
CPU_MATH_MAX_TOKENS = 256  # bf16 and fp16
CPU_MATH_MAX_TOKENS_FP32 = 128
_capturing = 0  # open `capture_attention` blocks: the maps exist only on the written-out path


def use_fused_attn(backend: str, q: torch.Tensor) -> bool:
    """Whether attention runs in `F.scaled_dot_product_attention`'s one kernel rather than written out. "sdpa":
    always; "math": never; "auto": on a GPU, and on a CPU above the token counts where the written-out form is
    faster. Never while `capture_attention` is open. q: (B, heads, N, head_dim), in the dtype the scores take."""
    if backend == "math" or _capturing:
        return False
    if backend == "sdpa" or q.device.type != "cpu":
        return True
    bound = CPU_MATH_MAX_TOKENS_FP32 if q.dtype in (torch.float32, torch.float64) else CPU_MATH_MAX_TOKENS
    return q.shape[-2] > bound


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection and an output projection ``proj``.

    Args:
        dim: width of the tokens, in and out.
        num_heads: number of heads; must divide ``dim``.
        qkv_bias: add a bias to the Q/K/V projection.
        qk_scale: multiplier of ``q @ kᵀ``; ``None`` means ``head_dim ** -0.5``. Must be > 0.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
        qk_norm: a LayerNorm over each head's q and each head's k (`q_norm`, `k_norm`, timm's names) before the
            scores: |q·k| stays bounded however large the activations grow, which keeps the softmax out of
            saturation and the logits in range under fp16/bf16 (Dehghani et al. 2023, ViT-22B).
        norm_eps: the epsilon of those LayerNorms (1e-6, timm's ViT).
        attn_backend: ``"math"`` writes out softmax(Q Kᵀ · scale) V step by step (readable, and the only path
            whose attention weights `capture_attention` can record); ``"sdpa"`` calls
            ``F.scaled_dot_product_attention`` (fused, no (N, N) matrix kept); ``"auto"``: `use_fused_attn`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        attn_backend: str = "auto",
    ) -> None:
        super().__init__()
        check_attention(dim, num_heads, qk_scale, attn_drop, proj_drop, attn_backend)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.scale = qk_scale if qk_scale is not None else self.head_dim**-0.5
        self.attn_backend = attn_backend
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.q_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()  # over head_dim
        self.k_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def dim_out(self) -> int:
        """The output tokens' width: `dim`, except in `TokenAttention`."""
        return self.proj.out_features

    def extra_repr(self) -> str:
        scale = "learned" if isinstance(self.scale, torch.Tensor) else f"{self.scale:.4g}"
        dims = f"dim={self.dim}" + (f", dim_out={self.dim_out}" if self.dim_out != self.dim else "")
        return f"{dims}, num_heads={self.num_heads}, scale={scale}, attn_backend={self.attn_backend}"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, N, dim) -> (B, N, dim), the steps of the module docstring's worked example. attn_mask: bool
        (True = may attend) or additive float, broadcastable to (B, heads, N, N)."""
        qkv = self.qkv(check_tokens(x, self.dim))  # (B, N, 3 * dim): [q | k | v], each split into heads
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)  # each (B, heads, N, head_dim); no-ops without qk_norm
        out = self.attend(q, k, v, attn_mask)  # (B, heads, N, head_dim)
        out = rearrange(out, "b h n d -> b n (h d)")  # merge heads: (B, N, dim)
        return self.proj_drop(self.proj(out))

    def attend(self, q, k, v, attn_mask=None, scale: float | None = None) -> torch.Tensor:
        """softmax(q @ kᵀ * scale + mask) @ v for every head: q, k, v (B, heads, N, head_dim) -> (B, heads, N,
        head_dim). `scale`: None means `self.scale`."""
        scale = self.scale if scale is None else scale
        if use_fused_attn(self.attn_backend, q):  # the same formula in one kernel
            dropout_p = self.attn_drop.p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
        scores = (q * scale) @ k.transpose(-2, -1)  # (B, heads, N, N): how well query i matches key j
        attn = mask_scores(scores, attn_mask).softmax(dim=-1)  # (B, heads, N, N): row i = how token i mixes all
        return self.attn_drop(attn) @ v  # (B, heads, N, head_dim): the weighted sum of the values


class RotaryAttention(Attention):
    """`Attention` with rotary positions: `forward(x, attn_mask, rope)` rotates each head's q and k by the table
    `rope` after the qk-norm (timm's `AttentionRope` and EVA-02's order), so q·k sees the tokens' relative offset.

    Args beyond `Attention`'s:
        rope_half: the table pairs channel j with j + head_dim / 2 (DINOv3's layout), not 2j with 2j + 1.
        k_bias: with `qkv_bias`, whether the keys have a bias too. False is EVA-02's attention: learned `q_bias`
            and `v_bias` (timm's names) and a key bias fixed at zero. Under rotary positions a key bias is not
            inert (each key's rotation turns it differently), so it is left out rather than trained from zero.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, rope_half: bool = False, k_bias: bool = True, **kwargs):
        qkv_bias = kwargs.pop("qkv_bias", False)
        separate = qkv_bias and not k_bias
        super().__init__(dim, num_heads, qkv_bias=qkv_bias and not separate, **kwargs)
        self.rope_half = rope_half
        self.q_bias = nn.Parameter(torch.zeros(dim)) if separate else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if separate else None

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (B, N, dim) -> (B, N, dim). rope: [sin | cos], (N, 2 * head_dim) or per head (heads, N, 2 *
        head_dim); None: no rotation (a token without a position)."""
        x = check_tokens(x, self.dim)
        if self.q_bias is None:
            qkv = self.qkv(x)  # (B, N, 3 * dim)
        else:  # [q_bias | 0 | v_bias]: the key bias stays zero
            qkv = F.linear(x, self.qkv.weight, torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias]))
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # the rotation's result is cast back to q's dtype
            q, k = apply_rope(q, rope, self.rope_half), apply_rope(k, rope, self.rope_half)
        out = rearrange(self.attend(q, k, v, attn_mask), "b h n d -> b n (h d)")
        return self.proj_drop(self.proj(out))


class TokenAttention(Attention):
    """The token attention of Tokens-to-Token ViT: attention that changes the token width, dim -> dim_out (Q, K
    and V are dim_out wide), with V as the skip connection. (B, N, dim) -> (B, N, dim_out).

    A residual around the layer would add a (B, N, dim) input to a (B, N, dim_out) output; the official code
    adds V instead, merged over heads, which has the output's width. Parameters are `Attention`'s."""

    def __init__(self, dim: int, dim_out: int, num_heads: int = 1, qkv_bias: bool = False, **kwargs) -> None:
        if dim <= 0:
            raise ValueError(f"dim={dim} must be positive")
        super().__init__(dim_out, num_heads, qkv_bias=qkv_bias, **kwargs)
        self.dim = dim
        self.qkv = nn.Linear(dim, 3 * dim_out, bias=qkv_bias)  # (B, N, dim) -> (B, N, 3 * dim_out)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        qkv = self.qkv(check_tokens(x, self.dim))  # (B, N, 3 * dim_out)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        out = rearrange(self.attend(q, k, v, attn_mask), "b h n d -> b n (h d)")  # (B, N, dim_out)
        out = self.proj_drop(self.proj(out))
        return rearrange(v, "b h n d -> b n (h d)") + out  # V skip: (B, N, dim_out)


class LocalitySelfAttention(Attention):
    """Locality Self-Attention: the scale of the scores is a learned temperature per head, `scale` of shape
    (heads,) started at `qk_scale` or head_dim ** -0.5 (as in the authors' code), and no token attends to itself.
    Same arguments as `Attention`; one parameter more (`scale`), so timm's weights load with that key added."""

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.scale = nn.Parameter(torch.full((num_heads,), float(self.scale)))  # (heads,)

    def attend(self, q, k, v, attn_mask=None, scale: float | None = None) -> torch.Tensor:
        # SDPA's `scale=` takes a float, so the learned temperature multiplies q instead, in both paths. Cast to
        # q's dtype: under autocast a float32 temperature would turn a bf16 q back into float32.
        q = q * self.scale.to(q.dtype)[:, None, None]  # (B, heads, N, head_dim) * (heads, 1, 1)
        return super().attend(q, k, v, mask_diagonal(attn_mask, q.shape[-2], q.device), scale=1.0)


def check_attention(dim: int, num_heads: int, qk_scale, attn_drop: float, proj_drop: float, backend: str) -> None:
    """A ValueError naming the first argument an attention layer cannot be built with."""
    if dim <= 0:
        raise ValueError(f"dim={dim} must be positive")
    if num_heads <= 0 or dim % num_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be a positive divisor of dim={dim}")
    if qk_scale is not None and not qk_scale > 0:
        raise ValueError(f"qk_scale={qk_scale} must be > 0 (or None for head_dim ** -0.5)")
    for name, rate in (("attn_drop", attn_drop), ("proj_drop", proj_drop)):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{name}={rate} must be in [0, 1)")
    if backend not in ATTN_BACKENDS:
        raise ValueError(f"attn_backend={backend!r} must be one of {ATTN_BACKENDS}")


def check_tokens(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"input of shape {tuple(x.shape)} must be (batch, tokens, dim={dim})")
    return x


def mask_scores(scores: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """Scores (B, heads, N, N) with masked pairs at -inf (bool mask, True = may attend) or the additive float
    mask added, as `F.scaled_dot_product_attention` reads them."""
    if attn_mask is None:
        return scores
    if attn_mask.dtype == torch.bool:
        return scores.masked_fill(~attn_mask, float("-inf"))
    return scores + attn_mask


def mask_diagonal(attn_mask: torch.Tensor | None, num_tokens: int, device: torch.device) -> torch.Tensor:
    """Locality self-attention's diagonal masking folded into the caller's mask, in the mask's own form: bool
    (True = may attend) gets ``& ~eye``; additive float gets -inf on the diagonal. (N, N) or broadcast."""
    eye = torch.eye(num_tokens, dtype=torch.bool, device=device)  # (N, N), True on the diagonal
    if attn_mask is None:
        return ~eye
    if attn_mask.dtype == torch.bool:
        return attn_mask & ~eye
    diagonal = torch.zeros(num_tokens, num_tokens, dtype=attn_mask.dtype, device=device)
    return attn_mask + diagonal.masked_fill(eye, float("-inf"))  # (N, N) + (..., N, N): -inf on the diagonal


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record the softmax weights of every `Attention` in `model` (its variants included) while the block is open.

    ``with capture_attention(model) as maps: model(x)`` leaves one (B, heads, N, N) tensor per attention
    layer in ``maps``, in forward order: a forward hook on each layer's `attn_drop` takes its input, the weights.
    Layers run on the written-out path while capturing (`use_fused_attn`); outside the block nothing is recorded
    and nothing is slower. Capture in evaluation (or under ``torch.no_grad()``): in a training step with gradient
    checkpointing the backward pass recomputes the blocks and records them again.
    """
    global _capturing
    maps: list[torch.Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Attention layer to capture")
    hooks = [
        layer.attn_drop.register_forward_hook(lambda _, args, out: maps.append(args[0].detach())) for layer in layers
    ]
    _capturing += 1
    try:
        yield maps
    finally:
        _capturing -= 1
        for hook in hooks:
            hook.remove()
