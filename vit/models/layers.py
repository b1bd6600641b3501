"""The pieces a ViT is stacked from (the patch embeddings are in vit/models/patch_embed.py): MLP, stochastic depth,
the pre-norm encoder block, the attention pool, and the loop that runs a stack of blocks (with gradient
checkpointing or without).

Parameter names follow timm (`patch_embed.proj`, `mlp.fc1`, `norm1`, `ls1.gamma`, ...) so state dicts load
in both directions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit.models.attention import Attention
from vit.models.norm import LayerNorm


def check_rate(name: str, value: float) -> None:
    """Dropout-like rates live in [0, 1): 1 would drop everything."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value} must be in [0, 1)")


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected an int or a pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the sigmoid approximation of GELU that OpenAI's CLIP was trained with (timm's
    `quick_gelu`). Close to GELU but not equal (up to ~0.02 apart), so CLIP's weights need it to compute what they
    were trained to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def gelu_tanh() -> nn.Module:
    """GELU's tanh approximation (SigLIP's, timm's `GELUTanh`): the same numbers as `F.gelu(x, approximate="tanh")`."""
    return nn.GELU(approximate="tanh")


ACTIVATIONS = {"gelu": nn.GELU, "quick_gelu": QuickGELU, "gelu_tanh": gelu_tanh}


def inner_norm(width: int, norm_eps: float | None) -> nn.Module:
    """The LayerNorm inside an MLP, over its hidden width before fc2 (NormFormer's, EVA-02's `scale_mlp`), or
    nothing when `norm_eps` is None."""
    return nn.Identity() if norm_eps is None else LayerNorm(width, eps=norm_eps)


class Mlp(nn.Module):
    """Token-wise feed-forward: fc1 -> act -> dropout -> [norm] -> fc2 -> dropout. (B, N, C) -> (B, N, out).

    `act` is "gelu" or "quick_gelu" (`QuickGELU`, CLIP's); `norm_eps` adds a LayerNorm over the hidden width
    before fc2 (`norm`, timm's name), None leaves it out.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
        act: str = "gelu",
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = ACTIVATIONS[act]()
        self.drop1 = nn.Dropout(drop)
        self.norm = inner_norm(hidden_features, norm_eps)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class QuickGeluMlp(Mlp):
    """`Mlp` with CLIP's activation (`QuickGELU`); the same parameters."""

    def __init__(self, in_features: int, hidden_features: int | None = None, **kwargs) -> None:
        super().__init__(in_features, hidden_features, act="quick_gelu", **kwargs)


class GeluTanhMlp(Mlp):
    """`Mlp` with GELU's tanh approximation (SigLIP 2's NaFlex models); the same parameters."""

    def __init__(self, in_features: int, hidden_features: int | None = None, **kwargs) -> None:
        super().__init__(in_features, hidden_features, act="gelu_tanh", **kwargs)


class SwiGLU(nn.Module):
    """The gated MLP of recent ViTs (Shazeer 2020; DINOv2, EVA-02): fc1 -> split in two halves a, b ->
    SiLU(a) * b -> dropout -> [norm] -> fc2 -> dropout. (B, N, C) -> (B, N, out).

    `hidden_features` is fc1's width, both halves together (timm's `SwiGLUPacked`, whose state dict loads
    as is): the gated width is half of it. Parameters ~ 1.5 * hidden_features * C against 2 * hidden * C for
    `Mlp`, so hidden_features = 4/3 x `Mlp`'s hidden matches its size (mlp_ratio 5.33 for 4: DINOv2's choice).
    `norm_eps` adds a LayerNorm over the gated width (EVA-02 B and L, timm's `SwiGLU` with `norm`); timm's split
    layout of that MLP (`fc1_g`, `fc1_x`) is [gate | value] of this fc1 (vit/weights/read.py converts it).
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        if hidden_features % 2:
            raise ValueError(
                f"mlp=swiglu needs an even fc1 width (it is split into gate and value), not {hidden_features}: "
                f"choose mlp_ratio so that embed_dim * mlp_ratio is even"
            )
        self.fc1 = nn.Linear(in_features, hidden_features)  # [gate | value], each hidden_features / 2
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(drop)
        self.norm = inner_norm(hidden_features // 2, norm_eps)
        self.fc2 = nn.Linear(hidden_features // 2, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # (B, N, hidden / 2) each
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


# The MLP kinds, by their `mlp` setting: each takes (in_features, hidden_features, drop=, norm_eps=).
MLPS = {"gelu": Mlp, "quick_gelu": QuickGeluMlp, "gelu_tanh": GeluTanhMlp, "swiglu": SwiGLU}


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch of a sample with probability `drop_prob`.

    Kept branches are scaled by 1 / (1 - p) so the expected value is unchanged; identity at eval and at p=0.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        check_rate("drop_path", drop_prob)
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep_prob = 1.0 - self.drop_prob
        # One Bernoulli draw per sample, broadcast over every other dim: (B, 1, 1, ...).
        mask_shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        keep = x.new_empty(mask_shape).bernoulli_(keep_prob)
        return x * keep / keep_prob

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT), started small so deep stacks train."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer encoder block, (B, N, dim) -> (B, N, dim):

        x = x + drop_path(ls1(attn(norm1(x))))
        x = x + drop_path(ls2(mlp(norm2(x))))

    `proj_drop` is the dropout after the attention's output projection and inside the MLP (timm's name);
    `norm_eps` is 1e-6 in timm's ViTs and 1e-5 (PyTorch's default) in the official T2T-ViT code;
    `init_values` switches on LayerScale (None: off, as in plain ViT); `mlp` is "gelu" (`Mlp`), "quick_gelu"
    (`Mlp` with CLIP's `QuickGELU`) or "swiglu" (`SwiGLU`, `mlp_ratio` then sizes fc1, both halves); `mlp_norm`
    adds a LayerNorm inside the MLP (EVA-02's). `attention` is the attention's class (vit/models/attention.py:
    `Attention`, or a variant), built with the arguments above and `attn_options` (`qk_norm`, `attn_backend`;
    `rope_half`, `k_bias` for `RotaryAttention`). `forward(x, rope)` hands a rotary position table to it.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
        mlp: str = "gelu",
        mlp_norm: bool = False,
        attention: type[Attention] = Attention,
        **attn_options,
    ) -> None:
        super().__init__()
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={mlp_ratio} must be > 0")
        if mlp not in MLPS:
            raise ValueError(f"mlp={mlp!r} must be one of {tuple(MLPS)}")
        check_rate("drop_rate", proj_drop)
        self.norm1 = LayerNorm(dim, eps=norm_eps)
        self.attn = attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_eps=norm_eps,
            **attn_options,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = LayerNorm(dim, eps=norm_eps)
        mlp_norm_eps = norm_eps if mlp_norm else None
        self.mlp = MLPS[mlp](dim, hidden_features=int(dim * mlp_ratio), drop=proj_drop, norm_eps=mlp_norm_eps)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (B, N, dim) -> (B, N, dim): attention, then the MLP, each on the normed tokens and added back."""
        h = self.norm1(x)
        h = self.attn(h, attn_mask) if rope is None else self.attn(h, attn_mask, rope)  # RotaryAttention: rope
        x = x + self.drop_path1(self.ls1(h))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def run_blocks(
    blocks: nn.Module,
    x: torch.Tensor,
    checkpointed: bool,
    ropes: list[torch.Tensor | None] | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x` through each module of `blocks` in turn. `checkpointed`: gradient checkpointing, each module's
    activations are dropped after its forward and recomputed in the backward pass, so only the (B, N, C) input of
    every block stays in memory, at the cost of one more forward pass of the blocks. Non-reentrant checkpointing
    (`use_reentrant=False`) restores the RNG state for the recomputation, so dropout and drop-path draw the same
    masks both times. `ropes`: one rotary position table per block (or None), handed to each block's attention;
    `attn_mask`: the same mask for every block's attention (NaFlex batches: padding is no key,
    vit/models/naflex_tokens.py)."""
    for i, block in enumerate(blocks):
        args = (x,) if ropes is None or ropes[i] is None else (x, ropes[i])
        kwargs = {} if attn_mask is None else {"attn_mask": attn_mask}
        x = checkpoint(block, *args, use_reentrant=False, **kwargs) if checkpointed else block(*args, **kwargs)
    return x


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; SigLIP's head, timm's `AttentionPoolLatent`): one learned query attends
    over the tokens, and a residual MLP refines what it read. (B, N, C) -> (B, C).

    For SigLIP B/16 at 224 px (C = 768, 12 heads of 64, N = 196 image tokens):

        latent -> q = self.q(latent)             (B, 1, C) -> (B, heads, 1, head_dim)     the query, learned
        k, v = self.kv(x)                        (B, N, 2C) -> (B, heads, N, head_dim) each
        softmax(q kᵀ / sqrt(head_dim)) v         (B, heads, 1, head_dim)
        merge heads, proj                        (B, 1, C)
        y = y + mlp(norm(y))                     (B, 1, C)      GELU MLP of width mlp_ratio * C
        the query's token                        (B, C)

    Parameter names are timm's (`latent`, `q`, `kv`, `proj`, `norm`, `mlp.fc1`, `mlp.fc2`), so its weights load.
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, norm_eps: float = 1e-6, act: str = "gelu"
    ) -> None:
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of embed_dim={dim}")
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the query token (1, 1, C); init_weights draws it
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)  # [k | v], each split into heads
        self.proj = nn.Linear(dim, dim)
        self.norm = LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act=act)  # act: "gelu"; SigLIP 2's NaFlex heads "gelu_tanh"

    def init_weights(self) -> None:
        """timm's: the query trunc-normal with std C^-0.5, cut at 2 std (the Linears get the model's init)."""
        std = self.latent.shape[-1] ** -0.5
        nn.init.trunc_normal_(self.latent, std=std, a=-2 * std, b=2 * std)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, C) -> (B, C); `valid` (B, N) bool: the tokens the query may read (a NaFlex batch's padding
        is not), None: all."""
        batch = x.shape[0]
        q = self.q(self.latent.expand(batch, -1, -1))  # (B, 1, C)
        q = rearrange(q, "b l (h d) -> b h l d", h=self.num_heads)  # (B, heads, 1, head_dim)
        k, v = rearrange(self.kv(x), "b n (two h d) -> two b h n d", two=2, h=self.num_heads)  # (B, heads, N, d)
        mask = None if valid is None else valid[:, None, None, :]  # (B, 1, 1, N): True = may attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, heads, 1, head_dim): the query's read
        out = self.proj(rearrange(out, "b h l d -> b l (h d)"))  # (B, 1, C)
        out = out + self.mlp(self.norm(out))
        return out[:, 0]  # (B, C)
