"""The encoder every model here shares: a tokenizer turns the image into tokens, and the rest is the same.

ViT and T2T-ViT differ only in their tokenizer (vit/models/vit.py: a patch embedding; vit/models/t2t.py: the
Tokens-to-Token module). An image's path through `forward`, for ViT-Ti/16 at 224 px (C = 192, N = 14 * 14 = 196):

    image                                  (B, 3, 224, 224)
    tokenizer                              (B, 196, C)
    prepend the cls token                  (B, 197, C)
    + pos_embed, pos_drop                  (B, 197, C)      one row per prefix token, then one per grid position
    depth x Block                          (B, 197, C)
    norm                                   (B, 197, C)
    pool: the cls token, or the mean       (B, C)
    head                                   (B, num_classes)

With `distill_token=True` (DeiT's distilled ViT, timm's `VisionTransformerDistilled`) a second learned token sits
after the cls token, (B, 2 + N, C) through the blocks, with its own position row and its own classifier
`head_dist`; in training mode `forward` returns both heads' logits (cls, dist), in eval mode their average.

Parameter names are timm's (`cls_token`, `dist_token`, `pos_embed`, `blocks.N.*`, `norm`, `head`, `head_dist`);
the tokenizer sits under the name its model's weights use (`tokenizer_name`: `patch_embed` or `tokens_to_token`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.init import trunc_normal_

from vit.models.layers import Block, check_rate, run_blocks, to_2tuple
from vit.models.pos_embed import make_pos_embed, resample_pos_embed

GLOBAL_POOLS = ("token", "avg")


class Encoder(nn.Module):
    """Tokenizer -> prefix tokens -> position table -> Blocks -> norm -> head. Subclasses choose the tokenizer.

    Args:
        tokenizer: (B, C_in, H, W) -> (B, N, embed_dim); it has `img_size`, `grid_size` (rows, columns of its
            tokens), `num_patches` and `input_grid(x)` (the grid of an input of another size, with a dynamic size).
        num_classes: classes of the head (0: no head, `forward` returns pooled features).
        embed_dim, depth, num_heads, mlp_ratio: width, number of blocks, heads per block, MLP width / C.
        qkv_bias, qk_scale, attn_backend: see `Attention`.
        drop_rate: dropout after the position embedding and inside every block (timm's classic ViT).
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth of the last block; rates rise linearly from 0 at the first.
        pos_embed: "learned" (trunc-normal init) or "sinusoidal" (fixed).
        global_pool: "token" reads the cls token; "avg" averages the patch tokens and, as timm does, moves the
            final LayerNorm after the pooling (`fc_norm`).
        init_values: LayerScale init (None: off).
        lsa: Locality Self-Attention in every block (`LocalitySelfAttention`).
        distill_token: DeiT's distillation token and second head; needs `global_pool="token"`.
        norm_eps: the LayerNorms' epsilon: 1e-6 in timm's ViTs, 1e-5 in the official T2T-ViT code.
    """

    tokenizer_name = "patch_embed"  # the attribute (and state-dict prefix) of the tokenizer: timm's by default

    def __init__(
        self,
        tokenizer: nn.Module,
        *,
        num_classes: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        qk_scale: float | None,
        drop_rate: float,
        attn_drop_rate: float,
        drop_path_rate: float,
        attn_backend: str,
        pos_embed: str = "learned",
        global_pool: str = "token",
        init_values: float | None = None,
        lsa: bool = False,
        distill_token: bool = False,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        check_switches(global_pool=global_pool, lsa=lsa, distill_token=distill_token)
        check_encoder_args(
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            num_classes=num_classes,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
        )
        self.num_classes = num_classes
        self.embed_dim = self.num_features = embed_dim
        self.global_pool = global_pool
        self.distilled = distill_token
        self.num_prefix_tokens = 2 if distill_token else 1  # cls (and dist) tokens before the image's tokens
        self.grad_checkpointing = False

        self.add_module(self.tokenizer_name, tokenizer)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distill_token else None
        # One row per prefix token (cls, dist), then one per token of the tokenizer's grid: (1, P + N, C).
        self.pos_embed = make_pos_embed(pos_embed, tokenizer.num_patches + self.num_prefix_tokens, embed_dim)
        self.pos_embed_kind = pos_embed
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = encoder_blocks(
            depth=depth,
            dim=embed_dim,
            num_heads=num_heads,
            drop_path_rate=drop_path_rate,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            proj_drop=drop_rate,
            attn_drop=attn_drop_rate,
            init_values=init_values,
            attn_backend=attn_backend,
            norm_eps=norm_eps,
            lsa=lsa,
        )
        use_fc_norm = global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(embed_dim, eps=norm_eps)
        self.fc_norm = nn.LayerNorm(embed_dim, eps=norm_eps) if use_fc_norm else nn.Identity()
        self.head = self._new_head()
        self.head_dist = self._new_head() if distill_token else None
        self.init_weights()

    @property
    def tokenizer(self) -> nn.Module:
        return getattr(self, self.tokenizer_name)

    @property
    def img_size(self) -> tuple[int, int]:
        return to_2tuple(self.tokenizer.img_size)

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, columns) of the tokenizer's tokens at `img_size`: the grid the position table is laid out on."""
        return self.tokenizer.grid_size

    def init_weights(self) -> None:
        """timm's default ViT init: trunc-normal(0.02) Linears with zero bias, tiny cls token."""
        if self.pos_embed.requires_grad:
            trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)  # timm's VisionTransformerDistilled init
        self.apply(init_linear_trunc_normal)

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay would only pull towards zero for no benefit."""
        return {"pos_embed", "cls_token", "dist_token"} if self.distilled else {"pos_embed", "cls_token"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's method name).

        Only the (B, N, C) input of every block is kept; a training step costs about one more forward pass
        (docs/BENCHMARKS.md). Active in training with gradients only. A tokenizer with blocks of its own (the
        T2T module) has a `grad_checkpointing` switch too, and is told the same."""
        self.grad_checkpointing = enable
        if hasattr(self.tokenizer, "grad_checkpointing"):
            self.tokenizer.grad_checkpointing = enable

    def _new_head(self) -> nn.Module:
        return nn.Linear(self.embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = self._new_head()
        if self.distilled:
            self.head_dist = self._new_head()
        for head in (self.head, self.head_dist):
            if head is not None:
                init_linear_trunc_normal(head)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> all tokens after the last block and norm, (B, P + N, C) with P prefix tokens."""
        tokens = self.tokenizer(x)  # (B, N, C); the input's shape is checked there
        grid = self.tokenizer.input_grid(x)  # (rows, columns) of those N tokens
        prefix = [self.cls_token] if self.dist_token is None else [self.cls_token, self.dist_token]
        prefix = [t.expand(tokens.shape[0], -1, -1) for t in prefix]  # P x (B, 1, C)
        x = torch.cat([*prefix, tokens], dim=1)  # (B, P + N, C)
        x = self.pos_drop(x + self.position_table(grid))
        checkpointed = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        x = run_blocks(self.blocks, x, checkpointed)  # (B, P + N, C)
        return self.norm(x)

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The position table for a token grid of `grid`, (1, P + rows * columns, C): the stored one, or with a
        dynamic image size that table resampled (bicubic) to the input's grid, as timm's `dynamic_img_size`."""
        if grid == self.grid_size:
            return self.pos_embed
        return resample_pos_embed(self.pos_embed, grid, self.num_prefix_tokens, self.grid_size)

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, P + N, C) -> logits (B, num_classes), or the pooled (B, C) with `pre_logits`. With the distillation
        token: in training mode the pair (cls logits, dist logits), each (B, num_classes); else their average."""
        if self.dist_token is not None:
            return self._distilled_head(x, pre_logits)
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, C): mean over the image's tokens
        else:
            x = x[:, 0]  # (B, C): the cls token
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def _distilled_head(self, x: torch.Tensor, pre_logits: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x, x_dist = x[:, 0], x[:, 1]  # (B, C) each: the cls and the distillation token
        if pre_logits:
            return (x + x_dist) / 2
        logits, logits_dist = self.head(x), self.head_dist(x_dist)  # (B, num_classes) each
        if self.training:  # the trainer's loss reads the two heads apart (vit/train/distill.py)
            return logits, logits_dist
        return (logits + logits_dist) / 2  # evaluation: the heads averaged, as DeiT does

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.forward_head(self.forward_features(x))


def check_encoder_args(
    embed_dim: int,
    depth: int,
    num_heads: int,
    num_classes: int,
    drop_rate: float,
    attn_drop_rate: float,
    drop_path_rate: float,
) -> None:
    """The checks every encoder-stack model makes, each a ValueError naming the argument and value."""
    if depth <= 0:
        raise ValueError(f"depth={depth} must be positive")
    if num_classes < 0:
        raise ValueError(f"num_classes={num_classes} must be >= 0")
    if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
        raise ValueError(f"num_heads={num_heads} must be a positive divisor of embed_dim={embed_dim}")
    for name, rate in (
        ("drop_rate", drop_rate),
        ("attn_drop_rate", attn_drop_rate),
        ("drop_path_rate", drop_path_rate),
    ):
        check_rate(name, rate)


def encoder_blocks(depth: int, dim: int, num_heads: int, drop_path_rate: float = 0.0, **block_kwargs) -> nn.Sequential:
    """`depth` Blocks whose drop-path rates rise linearly: rate_i = drop_path_rate * i / (depth - 1), so deeper
    blocks are dropped more often (stochastic depth, Huang et al. 2016)."""
    rates = torch.linspace(0, drop_path_rate, depth).tolist()
    return nn.Sequential(*[Block(dim=dim, num_heads=num_heads, drop_path=rate, **block_kwargs) for rate in rates])


def check_switches(global_pool: str, lsa: bool, distill_token: bool) -> None:
    """The encoder's choices, each a ValueError naming the argument and its value."""
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool={global_pool!r} must be one of {GLOBAL_POOLS}")
    for name, value in (("lsa", lsa), ("distill_token", distill_token)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be true or false")
    if distill_token and global_pool != "token":
        raise ValueError(
            f"distill_token=true needs global_pool=token (the heads read the two tokens), not {global_pool!r}"
        )


def init_linear_trunc_normal(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
