"""Multi-head scaled dot-product self-attention, the heart of every model here, and its two variants.

A worked example: a batch of B=13 sequences of N=100 tokens, each token dim=49 wide, projected to dim_out=64
over 4 heads of head_dim = 64 / 4 = 16. `Attention.forward` takes exactly these steps, in this order:

    x                                      (B, N, dim)              (13, 100, 49)
    project:  qkv = self.qkv(x)            (B, N, 3 * dim_out)      (13, 100, 192)
    split heads: q, k, v                   (B, heads, N, head_dim)  (13, 4, 100, 16)   each
    [qk_norm: q, k = LN(q), LN(k)]         (B, heads, N, head_dim)                     over head_dim, per head
    [rope: rotate q, k by position]        (B, heads, N, head_dim)                     vit/models/rope.py
    scores = q @ kᵀ * scale                (B, heads, N, N)         (13, 4, 100, 100)  scale = head_dim ** -0.5
    attn = softmax(scores) over the keys   (B, heads, N, N)         (13, 4, 100, 100)  each row sums to 1
    weighted sum:  attn @ v                (B, heads, N, head_dim)  (13, 4, 100, 16)
    merge heads                            (B, N, dim_out)          (13, 100, 64)
    project:  self.proj                    (B, N, dim_out)          (13, 100, 64)

In every ViT block dim_out == dim and this is timm's `Attention`, with its parameter names, so timm's weights
load unchanged. One self-attention layer costs 4·N·C² + 2·N²·C multiply-adds at width C: the four projections
(Q, K, V, output) 4·N·C², and the two (N, N) products q·kᵀ and attn·v 2·N²·C (vit/models/complexity.py).

Two variants change one thing each and are small subclasses:

* `TokenAttention`, the token attention of Tokens-to-Token ViT (vit/models/t2t.py): dim_out differs from dim, so
  the input cannot be added back as a residual around the layer; V, merged over heads, is added instead.
* `LocalitySelfAttention` (Lee, Lee & Song 2021, "Vision Transformer for Small-Size Datasets") changes the
  scores and nothing else:

      scores = (q * scale_h) @ kᵀ     scale_h: a learnable temperature per head, (heads,), starts at head_dim ** -0.5
      scores[..., i, i] = -inf        diagonal masking: a token takes nothing from itself, only from the others

  so the softmax is sharper where the model learns to want it and every token has to look at its neighbours.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit.models.rope import apply_rope

ATTN_BACKENDS = ("auto", "math", "sdpa")
# attn_backend=auto on a CPU: the written-out scores up to these token counts, the fused kernel above them. On the
# 2-core AVX512-BF16 EPYC, a training step's attention (forward and backward) ran 2.4-7.5x faster written out than in
# PyTorch's CPU flash kernel in bf16 at every count measured (16-576 tokens), and in fp32 2.9x faster at 16 tokens,
# 1.1-1.2x at 64-128 and slower from 145 (lab/bench_attention.py; docs/BENCHMARKS.md, "Attention on the CPU"). In
# bf16 the bound is memory's: the written-out form keeps the (B, heads, N, N) weights for backward, 0.2 GB a layer at
# 256 tokens, 6 heads and batch 256, and grows with N^2 past what the speed is worth on long sequences.
CPU_MATH_MAX_TOKENS = 256
CPU_MATH_MAX_TOKENS_FP32 = 128


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection and an output projection ``proj``.

    Args:
        dim: width of the input tokens.
        num_heads: number of heads; must divide ``dim_out``.
        qkv_bias: add a bias to the Q/K/V projection.
        qk_scale: multiplier of ``q @ kᵀ``; ``None`` means ``head_dim ** -0.5``. Must be > 0.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
        dim_out: width of the output tokens (and of Q, K, V); ``None`` means ``dim``.
        attn_backend: ``"math"`` writes out softmax(Q Kᵀ · scale) V step by step (readable, and the only path
            that can hand out the attention weights); ``"sdpa"`` calls ``F.scaled_dot_product_attention``
            (fused, flash where available, no (N, N) matrix kept); ``"auto"`` is sdpa, except while maps are
            captured and on a CPU at the token counts where math measured faster (`fused`).
        qk_norm: a LayerNorm over each head's q and each head's k (`q_norm`, `k_norm`, timm's names), after the
            split and before the scores: |q·k| stays bounded however large the activations grow, which keeps the
            softmax out of saturation and the logits in range under fp16/bf16 (Dehghani et al. 2023, ViT-22B).
        norm_eps: the epsilon of those LayerNorms (1e-6, timm's ViT).
        rope_half: the rotary table pairs channel j with j + head_dim / 2 (DINOv3's layout), not 2j with 2j + 1.
        k_bias: with `qkv_bias`, whether the keys have a bias too. False is EVA-02's attention: learned `q_bias`
            and `v_bias` (timm's names) and a key bias fixed at zero. Under rotary positions a key bias is not
            inert (each key's rotation turns it differently), so it is left out rather than trained from zero.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        dim_out: int | None = None,
        attn_backend: str = "auto",
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rope_half: bool = False,
        k_bias: bool = True,
    ) -> None:
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        if dim <= 0 or dim_out <= 0:
            raise ValueError(f"dim={dim} and dim_out={dim_out} must be positive")
        if num_heads <= 0 or dim_out % num_heads != 0:
            width = "dim" if dim_out == dim else "dim_out"
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of {width}={dim_out}")
        if qk_scale is not None and not qk_scale > 0:
            raise ValueError(f"qk_scale={qk_scale} must be > 0 (or None for head_dim ** -0.5)")
        for name, rate in (("attn_drop", attn_drop), ("proj_drop", proj_drop)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name}={rate} must be in [0, 1)")
        if attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend={attn_backend!r} must be one of {ATTN_BACKENDS}")

        self.dim = dim
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.head_dim = dim_out // num_heads
        self.scale = qk_scale if qk_scale is not None else self.head_dim**-0.5
        self.attn_backend = attn_backend
        self.rope_half = rope_half

        separate = qkv_bias and not k_bias  # EVA-02: q and v biases of their own, none on k
        self.qkv = nn.Linear(dim, 3 * dim_out, bias=qkv_bias and not separate)
        self.q_bias = nn.Parameter(torch.zeros(dim_out)) if separate else None
        self.v_bias = nn.Parameter(torch.zeros(dim_out)) if separate else None
        self.q_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()  # over head_dim
        self.k_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim_out, dim_out)
        self.proj_drop = nn.Dropout(proj_drop)

        # Set by `capture_attention`: a list that receives this layer's (B, heads, N, N) weights.
        # A plain attribute (not a hook) so the normal path pays one `is None` test and nothing else.
        self.attention_sink: list[torch.Tensor] | None = None

    def extra_repr(self) -> str:
        scale = "learned" if isinstance(self.scale, torch.Tensor) else f"{self.scale:.4g}"
        return (
            f"dim={self.dim}, dim_out={self.dim_out}, num_heads={self.num_heads}, scale={scale}, "
            f"attn_backend={self.attn_backend}"
        )

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, N, dim) -> (B, N, dim_out), the steps of the module docstring's worked example.

        attn_mask: bool (True = may attend) or additive float, broadcastable to (B, heads, N, N).
        is_causal: token i attends to tokens 0..i only.
        rope: rotary position table [sin | cos], (N, 2 * head_dim) or per head (heads, N, 2 * head_dim): q and k
            are rotated by it before the scores (vit/models/rope.py), so q·k sees the tokens' relative offset.
        """
        q, k, v = self.split_heads(x)  # project qkv, split heads: each (B, heads, N, head_dim)
        q, k = self.rotate(q, k, rope)  # qk-norm and rotary positions, where switched on
        out = self.attend(q, k, v, attn_mask, is_causal)  # scores, softmax, weighted sum: (B, heads, N, head_dim)
        out = rearrange(out, "b h n d -> b n (h d)")  # merge heads: (B, N, dim_out)
        return self.proj_drop(self.proj(out))  # output projection: (B, N, dim_out)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and split: (B, N, dim) -> q, k, v, each (B, heads, N, head_dim)."""
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"input of shape {tuple(x.shape)} must be (batch, tokens, dim={self.dim})")
        if self.q_bias is None:
            qkv = self.qkv(x)  # (B, N, 3 * dim_out), laid out as [q | k | v], each split into heads
        else:  # [q_bias | 0 | v_bias]: the key bias stays zero
            bias = torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
            qkv = F.linear(x, self.qkv.weight, bias)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return q, k, v

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, heads, N, head_dim) normalised per head (`qk_norm`) and rotated by the rotary table `rope`;
        timm's order: norm first, then the rotation, whose result is cast back to q's dtype."""
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is None:
            return q, k
        return apply_rope(q, rope, self.rope_half), apply_rope(k, rope, self.rope_half)

    def fused(self, q: torch.Tensor) -> bool:
        """Whether the scores run in `F.scaled_dot_product_attention`'s one kernel rather than written out: sdpa
        does, math and a capture of the maps do not; auto does except on a CPU where the written-out form measured
        faster: in bf16 (and fp16, not measured) up to `CPU_MATH_MAX_TOKENS` tokens, in fp32 up to
        `CPU_MATH_MAX_TOKENS_FP32` (docs/BENCHMARKS.md, "Attention on the CPU"). q: (B, heads, N, head_dim), in the
        dtype the scores take."""
        if self.attn_backend == "math" or self.attention_sink is not None:
            return False
        if self.attn_backend == "sdpa" or q.device.type != "cpu":
            return True
        bound = CPU_MATH_MAX_TOKENS_FP32 if q.dtype in (torch.float32, torch.float64) else CPU_MATH_MAX_TOKENS
        return q.shape[-2] > bound

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        """softmax(q @ kᵀ * scale + mask) @ v for every head: q, k, v (B, heads, N, head_dim) -> (B, heads, N,
        head_dim). `scale`: None means `self.scale`."""
        if attn_mask is not None and is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
        scale = self.scale if scale is None else scale
        if self.fused(q):  # the same formula in one kernel
            dropout_p = self.attn_drop.p if self.training else 0.0
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
            )
        scores = (q * scale) @ k.transpose(-2, -1)  # (B, heads, N, N): how well query i matches key j
        scores = mask_scores(scores, attn_mask, is_causal)
        attn = scores.softmax(dim=-1)  # (B, heads, N, N): row i = how token i mixes all tokens
        if self.attention_sink is not None:
            self.attention_sink.append(attn.detach())
        return self.attn_drop(attn) @ v  # (B, heads, N, head_dim): the weighted sum of the values


class TokenAttention(Attention):
    """The token attention of Tokens-to-Token ViT: attention that changes the token width, dim -> dim_out, with
    V as the skip connection. (B, N, dim) -> (B, N, dim_out).

    A residual around the layer would add a (B, N, dim) input to a (B, N, dim_out) output; the official code
    adds V instead, merged over heads, which has the output's width. Parameters are `Attention`'s.
    """

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self.split_heads(x)  # each (B, heads, N, head_dim)
        q, k = self.rotate(q, k, rope)
        out = rearrange(self.attend(q, k, v, attn_mask, is_causal), "b h n d -> b n (h d)")  # (B, N, dim_out)
        out = self.proj_drop(self.proj(out))
        return rearrange(v, "b h n d -> b n (h d)") + out  # V skip: (B, N, dim_out)


class LocalitySelfAttention(Attention):
    """Locality Self-Attention: the scale of the scores is a learned temperature per head, `scale` of shape
    (heads,) started at `qk_scale` or head_dim ** -0.5 (as in the authors' code), and no token attends to itself.
    Same arguments as `Attention`; one parameter more (`scale`), so timm's weights load with that key added."""

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.scale = nn.Parameter(torch.full((num_heads,), float(self.scale)))  # (heads,)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        if is_causal:
            # Token 0 may see only itself, and LSA hides exactly that: its row would be all -inf.
            raise ValueError("LocalitySelfAttention cannot take is_causal=True: token 0 would attend to nothing")
        # SDPA's `scale=` takes a float, so the learned temperature multiplies q instead, in both paths. Cast to
        # q's dtype: under autocast a float32 temperature would turn a bf16 q back into float32.
        q = q * self.scale.to(q.dtype)[:, None, None]  # (B, heads, N, head_dim) * (heads, 1, 1)
        return super().attend(q, k, v, mask_diagonal(attn_mask, q.shape[-2], q.device), scale=1.0)


def mask_scores(scores: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """Scores (B, heads, N, N) with masked pairs at -inf (bool mask, True = may attend; causal: j > i) or the
    additive float mask added, as `F.scaled_dot_product_attention` reads them."""
    if is_causal:
        n_q, n_k = scores.shape[-2:]
        attn_mask = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril()
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
    layer in ``maps``, in forward order. Layers run on the math path while capturing; outside the block
    nothing is recorded and nothing is slower. Capture in evaluation (or under ``torch.no_grad()``): in a
    training step with gradient checkpointing the backward pass recomputes the blocks and records them again.
    """
    maps: list[torch.Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Attention layer to capture")
    for layer in layers:
        layer.attention_sink = maps
    try:
        yield maps
    finally:
        for layer in layers:
            layer.attention_sink = None
