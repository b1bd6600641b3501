"""Multi-head scaled dot-product self-attention: the heart of every model here.

Walk through one call with the seed's shapes (batch B=13, N=100 tokens of width dim=49, chan=64, 4 heads):

    x                          (B, N, dim)              (13, 100, 49)
    qkv = self.qkv(x)          (B, N, 3 * chan)         (13, 100, 192)
    q, k, v                    (B, heads, N, head_dim)  (13, 4, 100, 16)   head_dim = chan // heads
    attn = softmax(q @ k^T * scale)
                               (B, heads, N, N)         (13, 4, 100, 100)
    attn @ v                   (B, heads, N, head_dim)  (13, 4, 100, 16)
    merge heads                (B, N, chan)             (13, 100, 64)
    self.proj                  (B, N, chan)             (13, 100, 64)

When ``chan == dim`` (every ViT block) this is timm's ``Attention`` with the same parameter names, so timm's
weights load unchanged.  When ``chan != dim`` (the Tokens-to-Token token attention, which changes the token
width), the input cannot be added back as a residual, so V, merged over heads, is added instead.

Locality Self-Attention (``lsa=True``, Lee, Lee & Song 2021, "Vision Transformer for Small-Size Datasets")
changes two things in the score matrix, and nothing else:

    scores = (q * scale_h) @ k^T   scale_h: a learnable temperature per head, (heads,), starts at head_dim ** -0.5
    scores[..., i, i] = -inf       diagonal masking: a token takes nothing from itself, only from the others

so the softmax is sharper where the model learns to want it and every token has to look at its neighbours.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

BACKENDS = ("auto", "math", "sdpa")


class Attention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection and an output projection ``proj``.

    Args:
        dim: width of the input tokens.
        num_heads: number of heads; must divide ``chan``.
        qkv_bias: add a bias to the Q/K/V projection.
        qk_scale: multiplier of ``q @ k^T``; ``None`` means ``head_dim ** -0.5``. Must be > 0.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
        chan: width of the output tokens (and of Q, K, V); ``None`` means ``dim``. When it differs from
            ``dim`` the V skip connection of the Tokens-to-Token token attention is added to the output.
        backend: ``"math"`` writes out softmax(Q Kᵀ · scale) V (readable, and the only path that can hand
            out the attention weights); ``"sdpa"`` calls ``F.scaled_dot_product_attention`` (fused, flash
            where available, no (N, N) matrix in memory); ``"auto"`` is sdpa unless maps are captured.
        lsa: Locality Self-Attention: ``scale`` becomes a learnable parameter of shape (heads,), started at
            ``qk_scale`` or ``head_dim ** -0.5``, and no token attends to itself. Off: no parameter is added
            and the state dict is timm's.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        chan: int | None = None,
        backend: str = "auto",
        lsa: bool = False,
    ) -> None:
        super().__init__()
        chan = dim if chan is None else chan
        if dim <= 0 or chan <= 0:
            raise ValueError(f"dim={dim} and chan={chan} must be positive")
        if num_heads <= 0 or chan % num_heads != 0:
            width = "dim" if chan == dim else "chan"
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of {width}={chan}")
        if qk_scale is not None and not qk_scale > 0:
            raise ValueError(f"qk_scale={qk_scale} must be > 0 (or None for head_dim ** -0.5)")
        for name, rate in (("attn_drop", attn_drop), ("proj_drop", proj_drop)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name}={rate} must be in [0, 1)")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
        if not isinstance(lsa, bool):
            raise ValueError(f"lsa={lsa!r} must be true or false")

        self.dim = dim
        self.chan = chan
        self.num_heads = num_heads
        self.head_dim = chan // num_heads
        scale = qk_scale if qk_scale is not None else self.head_dim**-0.5
        self.lsa = lsa
        # LSA: the temperature is learned, one per head (as in the authors' code); otherwise a fixed float.
        self.scale = nn.Parameter(torch.full((num_heads,), float(scale))) if lsa else scale
        self.backend = backend
        self.v_skip = chan != dim

        self.qkv = nn.Linear(dim, 3 * chan, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(chan, chan)
        self.proj_drop = nn.Dropout(proj_drop)

        # Set by `capture_attention`: a list that receives this layer's (B, heads, N, N) weights.
        # A plain attribute (not a hook) so the normal path pays one `is None` test and nothing else.
        self.attention_sink: list[torch.Tensor] | None = None

    def extra_repr(self) -> str:
        scale = "learned (lsa)" if self.lsa else f"{self.scale:.4g}"
        return f"dim={self.dim}, chan={self.chan}, num_heads={self.num_heads}, scale={scale}, backend={self.backend}"

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, dim) -> q, k, v, each (B, heads, N, head_dim)."""
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"input of shape {tuple(x.shape)} must be (batch, tokens, dim={self.dim})")
        qkv = self.qkv(x)  # (B, N, 3 * chan)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """x: (B, N, dim) -> (B, N, chan).

        attn_mask: bool (True = may attend) or additive float, broadcastable to (B, heads, N, N).
        is_causal: token i attends to tokens 0..i only.
        """
        q, k, v = self.split_heads(x)  # each (B, heads, N, head_dim)
        if attn_mask is not None and is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
        scale = self.scale
        if self.lsa:
            if is_causal:
                # Token 0 may see only itself, and LSA hides exactly that: its row would be all -inf.
                raise ValueError("lsa=True cannot be combined with is_causal=True: token 0 would attend to nothing")
            # SDPA's `scale=` takes a float, so the learned temperature multiplies q instead, in both paths.
            # Cast to q's dtype: under autocast a float32 temperature would turn a bf16 q back into float32.
            q = q * self.scale.to(q.dtype)[:, None, None]  # (B, heads, N, head_dim) * (heads, 1, 1)
            scale = 1.0
            attn_mask = self._mask_diagonal(attn_mask, q.shape[-2], q.device)

        use_math = self.backend == "math" or self.attention_sink is not None
        if use_math:
            out = self._math_attention(q, k, v, attn_mask, is_causal, scale)
        else:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=self.attn_drop.p if self.training else 0.0,
                is_causal=is_causal,
                scale=scale,
            )
        out = rearrange(out, "b h n d -> b n (h d)")  # (B, N, chan): heads merged
        out = self.proj_drop(self.proj(out))
        if self.v_skip:
            # The token width changed, so the input cannot be the residual; V (merged over heads) can.
            out = rearrange(v, "b h n d -> b n (h d)") + out
        return out

    @staticmethod
    def _mask_diagonal(attn_mask: torch.Tensor | None, num_tokens: int, device: torch.device) -> torch.Tensor:
        """LSA's diagonal masking folded into the caller's mask, in the mask's own form:
        bool (True = may attend) gets ``& ~eye``; additive float gets -inf on the diagonal. (N, N) or broadcast."""
        eye = torch.eye(num_tokens, dtype=torch.bool, device=device)  # (N, N), True on the diagonal
        if attn_mask is None:
            return ~eye
        if attn_mask.dtype == torch.bool:
            return attn_mask & ~eye
        diagonal = torch.zeros(num_tokens, num_tokens, dtype=attn_mask.dtype, device=device)
        return attn_mask + diagonal.masked_fill(eye, float("-inf"))  # (N, N) + (..., N, N): -inf on the diagonal

    def _math_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float,
    ) -> torch.Tensor:
        scores = (q * scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        n_q, n_k = scores.shape[-2:]
        if is_causal:
            attn_mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask
        attn = scores.softmax(dim=-1)  # (B, heads, N, N): row i = how token i mixes all tokens
        if self.attention_sink is not None:
            self.attention_sink.append(attn.detach())
        attn = self.attn_drop(attn)
        return attn @ v  # (B, heads, N, head_dim)


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record the softmax weights of every `Attention` in `model` while the block is open.

    ``with capture_attention(model) as maps: model(x)`` leaves one (B, heads, N, N) tensor per attention
    layer in ``maps``, in forward order. Layers run on the math path while capturing; outside the block
    nothing is recorded and nothing is slower.
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
