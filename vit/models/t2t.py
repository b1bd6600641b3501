"""Tokens-to-Token ViT (Yuan et al. 2021): a ViT whose tokens come from overlapping soft splits, each followed
by a small attention layer, instead of one hard cut into patches.

The T2T module at 224 px with the official soft splits (kernel/stride/padding 7/4/2, 3/2/1, 3/2/1) and
token_dim 64:

    image                                  (B, 3, 224, 224)
    soft split 0 (Unfold 7x7 / 4)          (B, 3136, 147)     3136 = 56²,  147 = 3·7·7
    token attention 1   147 -> 64          (B, 3136, 64)
    re-structurize                         (B, 64, 56, 56)
    soft split 1 (Unfold 3x3 / 2)          (B, 784, 576)      576 = 64·3·3
    token attention 2   576 -> 64          (B, 784, 64)
    re-structurize + soft split 2          (B, 196, 576)
    project                                (B, 196, embed_dim)

then, as in ViT, the shared `TransformerClassifier` (vit/models/classifier.py): cls token, position embedding
(here the fixed sinusoid table), encoder Blocks, LayerNorm, head. T2T-ViT is that classifier with the T2T module
as its embedding.

The token attention is either `TokenAttention` (the token transformer: attention from width dim to dim_out with
V as the skip connection) or the linear-time `TokenPerformer`. Parameter names follow the official code
(`tokens_to_token.attention1.attn.qkv.weight`, ...) so its released checkpoints load with strict=True.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import nn
from torch.nn.init import trunc_normal_

from vit.models.attention import TokenAttention
from vit.models.classifier import TransformerClassifier, init_linear_trunc_normal
from vit.models.classifier_config import ClassifierConfig
from vit.models.layers import Mlp, run_blocks
from vit.models.norm import LayerNorm
from vit.models.performer import TokenPerformer

# (kernel, stride, padding) of the three soft splits.
SOFT_SPLITS = {
    "imagenet": ((7, 4, 2), (3, 2, 1), (3, 2, 1)),  # the paper's: 224 px -> 14 x 14 tokens
    "cifar": ((3, 1, 1), (3, 2, 1), (3, 2, 1)),  # ours for 32 px: 32 -> 32 -> 16 -> 8 x 8 tokens
}
TOKEN_TYPES = ("performer", "transformer")
SCALE_CONVENTIONS = ("input", "output")


def resolve_soft_split(soft_split, img_size: int) -> tuple[tuple[int, int, int], ...]:
    """Three (kernel, stride, padding) triples from `soft_split`: the triples as given, a name in SOFT_SPLITS,
    or "auto", which picks "cifar" below 64 px and "imagenet" from 64 px up."""
    if soft_split == "auto":
        soft_split = "cifar" if img_size < 64 else "imagenet"
    if isinstance(soft_split, str):
        if soft_split not in SOFT_SPLITS:
            raise ValueError(f"soft_split={soft_split!r} must be 'auto', one of {list(SOFT_SPLITS)} or 3 (k, s, p)")
        return SOFT_SPLITS[soft_split]
    try:
        triples = tuple(tuple(int(v) for v in t) for t in soft_split)
    except (TypeError, ValueError):  # not a list of lists of ints
        triples = ()
    if len(triples) != 3 or any(len(t) != 3 or t[0] <= 0 or t[1] <= 0 or t[2] < 0 for t in triples):
        raise ValueError(f"soft_split={soft_split!r} must be three (kernel, stride, padding) triples")
    return triples


def square_side(img_size) -> int:
    """The side of a square image given as an int or an (H, W) pair with H == W (the official code and the
    re-structurization between stages assume square token grids)."""
    if not isinstance(img_size, int):
        try:
            height, width = (int(v) for v in img_size)
        except (TypeError, ValueError):
            height, width = -1, 0
        if height != width:
            raise ValueError(f"img_size={img_size!r} must be a positive int or a square (H, W) pair")
        img_size = height
    if img_size <= 0:
        raise ValueError(f"img_size={img_size} must be positive")
    return img_size


def soft_split_grids(img_size: int, splits: Sequence[tuple[int, int, int]]) -> list[int]:
    """Side of the token grid after each soft split; ValueError unless every stage tiles its input exactly
    (output side = input side / stride), which the re-structurization between stages relies on."""
    total_stride = math.prod(s for _, s, _ in splits)
    sides, side = [], img_size
    for kernel, stride, padding in splits:
        out = (side + 2 * padding - kernel) // stride + 1
        if side % stride or out != side // stride:
            lo = max(total_stride, img_size // total_stride * total_stride)
            raise ValueError(
                f"img_size={img_size} cannot be tiled by the soft splits {list(splits)} "
                f"(kernel, stride, padding): choose a multiple of {total_stride}, e.g. {lo} or {lo + total_stride}"
            )
        side = out
        sides.append(side)
    return sides


class TokenTransformer(nn.Module):
    """(B, N, dim) -> (B, N, dim_out): LayerNorm -> TokenAttention (dim -> dim_out, V skip) -> LayerNorm -> MLP."""

    def __init__(
        self,
        dim: int,
        dim_out: int,
        num_heads: int = 1,
        qk_scale: float | None = None,
        attn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = TokenAttention(dim, dim_out, num_heads=num_heads, qk_scale=qk_scale, attn_backend=attn_backend)
        self.norm2 = LayerNorm(dim_out)
        self.mlp = Mlp(dim_out, hidden_features=dim_out, out_features=dim_out)  # MLP ratio 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.norm1(x))  # no residual around it: the width changes (V is the skip, inside)
        return x + self.mlp(self.norm2(x))


class T2TModule(nn.Module):
    """Image -> tokens through three soft splits with two token-attention stages in between. A T2T-ViT builds it
    from its `T2TConfig`, where the defaults are.

    Args:
        img_size: input side; the soft splits must tile it (see `soft_split_grids`).
        tokens_type: "performer" (linear time) or "transformer" (the core Attention).
        embed_dim: width of the output tokens.
        token_dim: width of the tokens between the stages (64 in the paper).
        soft_split: "auto", "imagenet", "cifar", or three (kernel, stride, padding) triples.
        token_scale: "input" uses (input width // heads) ** -0.5 as the official code does (147 ** -0.5 in
            the first stage; needed to reproduce its checkpoints); "output" uses (token_dim // heads) ** -0.5,
            the usual head_dim ** -0.5 of attention with the width it works in. Only the transformer type scales.
        attn_backend: see `Attention` (the transformer type only).

    With gradient checkpointing (`grad_checkpointing`, set by the model's `set_grad_checkpointing`) the two token
    blocks are recomputed in the backward pass too: at 224 px the first works on 3136 tokens, 16 times the
    encoder's 196, so its activations are among the largest of a training step.
    """

    def __init__(
        self,
        *,
        img_size: int,
        tokens_type: str,
        in_chans: int,
        embed_dim: int,
        token_dim: int,
        soft_split,
        token_scale: str,
        attn_backend: str,
    ) -> None:
        super().__init__()
        if tokens_type not in TOKEN_TYPES:
            raise ValueError(f"tokens_type={tokens_type!r} must be one of {TOKEN_TYPES}")
        if token_scale not in SCALE_CONVENTIONS:
            raise ValueError(f"token_scale={token_scale!r} must be one of {SCALE_CONVENTIONS}")
        if token_dim <= 0 or embed_dim <= 0:
            raise ValueError(f"token_dim={token_dim} and embed_dim={embed_dim} must be positive")
        if in_chans <= 0:
            raise ValueError(f"in_chans={in_chans} must be positive")
        img_size = square_side(img_size)
        self.splits = resolve_soft_split(soft_split, img_size)
        self.grid_sides = soft_split_grids(img_size, self.splits)
        self.img_size = img_size
        self.in_chans = in_chans
        (k0, s0, p0), (k1, s1, p1), (k2, s2, p2) = self.splits
        self.soft_split0 = nn.Unfold(kernel_size=k0, stride=s0, padding=p0)
        self.soft_split1 = nn.Unfold(kernel_size=k1, stride=s1, padding=p1)
        self.soft_split2 = nn.Unfold(kernel_size=k2, stride=s2, padding=p2)
        widths = (in_chans * k0 * k0, token_dim * k1 * k1)  # token widths entering stage 1 and 2
        self.attention1 = self._stage(tokens_type, widths[0], token_dim, token_scale, attn_backend)
        self.attention2 = self._stage(tokens_type, widths[1], token_dim, token_scale, attn_backend)
        self.project = nn.Linear(token_dim * k2 * k2, embed_dim)
        self.grid_size = (self.grid_sides[-1], self.grid_sides[-1])
        self.num_patches = self.grid_sides[-1] ** 2
        self.grad_checkpointing = False

    @staticmethod
    def _stage(tokens_type: str, dim: int, token_dim: int, token_scale: str, attn_backend: str) -> nn.Module:
        if tokens_type == "performer":
            return TokenPerformer(dim, dim_out=token_dim, kernel_ratio=0.5)
        scale = (dim if token_scale == "input" else token_dim) ** -0.5  # one head
        return TokenTransformer(dim, dim_out=token_dim, num_heads=1, qk_scale=scale, attn_backend=attn_backend)

    def input_grid(self, x: torch.Tensor) -> tuple[int, int]:
        """The token grid of an input: always `grid_size`, as the T2T module takes `img_size` only."""
        return self.grid_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans or tuple(x.shape[-2:]) != (self.img_size, self.img_size):
            raise ValueError(
                f"input of shape {tuple(x.shape)} does not match the model: expected "
                f"(batch, in_chans={self.in_chans}, {self.img_size}, {self.img_size})"
            )
        checkpointed = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        x = self.soft_split0(x).transpose(1, 2)  # (B, N0, C·k0²): one overlapping patch per token
        x = run_blocks([self.attention1], x, checkpointed)  # (B, N0, token_dim)
        x = rearrange(x, "b (h w) c -> b c h w", h=self.grid_sides[0])  # re-structurize: tokens -> image
        x = self.soft_split1(x).transpose(1, 2)  # (B, N1, token_dim·k1²)
        x = run_blocks([self.attention2], x, checkpointed)  # (B, N1, token_dim)
        x = rearrange(x, "b (h w) c -> b c h w", h=self.grid_sides[1])
        x = self.soft_split2(x).transpose(1, 2)  # (B, N2, token_dim·k2²)
        return self.project(x)  # (B, N2, embed_dim)


@dataclass(frozen=True)
class T2TConfig(ClassifierConfig):
    """A T2T-ViT's settings: the `ClassifierConfig`'s with the official code's defaults, and the T2T module's (see
    `T2TModule` for each). The position table (the fixed sinusoid) is the official code's, not a setting; nor are
    the encoder's variants that the official model has no place for (LSA, LayerScale, rotary positions)."""

    qkv_bias: bool = False  # the official code's
    pos_embed: str = field(default="sinusoidal", init=False)
    lsa: bool = field(default=False, init=False)
    init_values: float | None = field(default=None, init=False)
    rope_temperature: float | None = field(default=None, init=False)
    rope_ref_grid: int | None = field(default=None, init=False)
    norm_eps: float = field(default=1e-5, init=False)  # nn.LayerNorm's default, as in the official code
    # -- T2T module (`T2TModule`) --
    img_size: int = 224  # input side; the soft splits take it to the token grid
    tokens_type: str = "performer"  # "performer" (linear time) or "transformer" (the core Attention)
    in_chans: int = 3  # the image's channels
    token_dim: int = 64  # width of the tokens between the T2T stages (64 in the paper)
    soft_split: str | Sequence = "auto"  # "auto", "imagenet", "cifar", or three (kernel, stride, padding) triples
    token_scale: str = "input"  # "input": (input width // heads) ** -0.5 as the official code | "output"
    dynamic_img_size: bool = False  # ViTs only: kept as a setting so a config shared with ViTs can say false

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dynamic_img_size is not False:
            raise ValueError(
                "dynamic_img_size=true is for ViTs: the T2T module's soft splits and token grid are fixed by img_size"
            )


class T2TViT(TransformerClassifier):
    """T2T-ViT: the T2T module under the official name `tokens_to_token`, then the `TransformerClassifier` with the
    fixed sinusoid position table and PyTorch's LayerNorm epsilon (1e-5), as in the official code.

    `qkv_bias=False` and the encoder's `qk_scale` follow the official code: None means head_dim ** -0.5
    (what it trains with); its released ImageNet weights were trained with `qk_scale = embed_dim ** -0.5`,
    so build with that to reproduce them (docs/T2T.md). `distill_token`: DeiT's distillation token and second
    head, as on a ViT (docs/DISTILLATION.md); the official code has none, and its weights load only without it.
    """

    embed_name = "tokens_to_token"

    def __init__(self, config: T2TConfig) -> None:
        embed = T2TModule(
            img_size=config.img_size,
            tokens_type=config.tokens_type,
            in_chans=config.in_chans,
            embed_dim=config.embed_dim,
            token_dim=config.token_dim,
            soft_split=config.soft_split,
            token_scale=config.token_scale,
            attn_backend=config.attn_backend,
        )
        super().__init__(embed, config)

    def init_weights(self) -> None:
        """The official init: trunc-normal(0.02) cls token and Linears, zero biases (and the distillation token
        as timm's distilled DeiT)."""
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                trunc_normal_(token, std=0.02)
        self.apply(init_linear_trunc_normal)
