"""The Vision Transformer (Dosovitskiy et al. 2021), shaped and named like timm's so its weights load as is.

An image's path through `forward`, for ViT-Ti/16 at 224 px (C = 192, N = 14 * 14 = 196 patches):

    image                      (B, 3, 224, 224)
    patch_embed                (B, 196, C)
    prepend cls token          (B, 197, C)
    + pos_embed                (B, 197, C)
    depth x Block              (B, 197, C)
    norm                       (B, 197, C)
    pool: cls token / mean     (B, C)
    head                       (B, num_classes)

With `distill_token=True` (DeiT's distilled ViT, timm's `VisionTransformerDistilled`): a second learned token
sits after the cls token, (B, 2 + N, C) through the blocks, with its own position row and its own classifier
`head_dist`; in training mode `forward` returns both heads' logits (cls, dist), in eval mode their average.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.init import trunc_normal_

from vit.models.layers import (
    OverlappingPatchEmbed,
    PatchEmbed,
    ShiftedPatchEmbed,
    check_encoder_args,
    encoder_blocks,
    run_blocks,
)
from vit.models.pos_embed import make_pos_embed, resample_pos_embed
from vit.models.registry import register_model

GLOBAL_POOLS = ("token", "avg")
# How the image becomes tokens: timm's Conv2d patches, Shifted Patch Tokenization, or T2T-style overlapping
# windows (docs/LEVERS.md).
PATCH_EMBEDS = {"standard": PatchEmbed, "spt": ShiftedPatchEmbed, "overlap": OverlappingPatchEmbed}


class VisionTransformer(nn.Module):
    """ViT classifier. Every argument is an ablation knob exposed by the configs.

    Args:
        img_size, patch_size, in_chans: input geometry; `patch_size` must divide `img_size`.
        num_classes: classes of the head (0: no head, `forward` returns pooled features).
        embed_dim, depth, num_heads, mlp_ratio: width, number of blocks, heads per block, MLP width / C.
        qkv_bias, qk_scale: see `Attention`.
        drop_rate: dropout after the position embedding and inside every block (timm's classic ViT).
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth of the last block; rates rise linearly from 0 at the first.
        pos_embed: "learned" (trunc-normal init) or "sinusoidal" (fixed).
        global_pool: "token" reads the cls token; "avg" averages the patch tokens and, as timm does,
            moves the final LayerNorm after the pooling (`fc_norm`).
        init_values: LayerScale init (None: off).
        attn_backend: "auto" | "math" | "sdpa", see `Attention`.
        dynamic_img_size: accept images of other sizes (sides multiples of `patch_size`): the position table is
            resampled (bicubic) to the input's patch grid in `forward`, as timm's `dynamic_img_size` does. The
            trainer switches it on for progressive resizing; the parameters and state dict do not change.
        patch_embed: "standard" (timm's PatchEmbed), "spt" (Shifted Patch Tokenization, `ShiftedPatchEmbed`) or
            "overlap" (T2T-style overlapping windows, `OverlappingPatchEmbed`).
        lsa: Locality Self-Attention in every block: learned temperature, no token attends to itself.
            `patch_embed` and `lsa` are the two levers of Lee, Lee & Song 2021 for small data sets
            (docs/LEVERS.md); both off, the model and its state dict are timm's.
        distill_token: DeiT's distillation token and second head (`dist_token`, `head_dist`: the names of timm's
            distilled DeiT models, whose weights load as they are); needs `global_pool="token"`. The trainer
            trains `head_dist` towards a teacher (docs/DISTILLATION.md).
    """

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pos_embed: str = "learned",
        global_pool: str = "token",
        init_values: float | None = None,
        attn_backend: str = "auto",
        patch_embed: str = "standard",
        lsa: bool = False,
        dynamic_img_size: bool = False,
        distill_token: bool = False,
    ) -> None:
        super().__init__()
        if global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool={global_pool!r} must be one of {GLOBAL_POOLS}")
        if patch_embed not in PATCH_EMBEDS:
            raise ValueError(f"patch_embed={patch_embed!r} must be one of {tuple(PATCH_EMBEDS)}")
        if not isinstance(lsa, bool):
            raise ValueError(f"lsa={lsa!r} must be true or false")
        if not isinstance(dynamic_img_size, bool):
            raise ValueError(f"dynamic_img_size={dynamic_img_size!r} must be true or false")
        if not isinstance(distill_token, bool):
            raise ValueError(f"distill_token={distill_token!r} must be true or false")
        if distill_token and global_pool != "token":
            raise ValueError(
                f"distill_token=true needs global_pool=token (the heads read the two tokens), not {global_pool!r}"
            )
        check_encoder_args(embed_dim, depth, num_heads, num_classes, drop_rate, attn_drop_rate, drop_path_rate)

        self.num_classes = num_classes
        self.embed_dim = self.num_features = embed_dim
        self.global_pool = global_pool
        self.distilled = distill_token
        self.num_prefix_tokens = 2 if distill_token else 1  # cls (and dist) tokens before the patches

        self.patch_embed = PATCH_EMBEDS[patch_embed](img_size, patch_size, in_chans, embed_dim)
        self.patch_embed_kind = patch_embed
        self.patch_embed.dynamic_img_size = dynamic_img_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distill_token else None
        # One row per prefix token (cls, dist), then the patches: (1, prefix + N, C).
        self.pos_embed = make_pos_embed(pos_embed, self.patch_embed.num_patches + self.num_prefix_tokens, embed_dim)
        self.pos_embed_kind = pos_embed
        self.pos_drop = nn.Dropout(drop_rate)

        self.blocks = encoder_blocks(
            depth,
            embed_dim,
            num_heads,
            drop_path_rate,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            drop=drop_rate,
            attn_drop=attn_drop_rate,
            init_values=init_values,
            attn_backend=attn_backend,
            lsa=lsa,
        )
        use_fc_norm = global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(embed_dim, eps=1e-6)
        self.fc_norm = nn.LayerNorm(embed_dim, eps=1e-6) if use_fc_norm else nn.Identity()
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = self._dist_head() if distill_token else None
        self.grad_checkpointing = False
        self.init_weights()

    @property
    def img_size(self) -> tuple[int, int]:
        return self.patch_embed.img_size

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's method)."""
        self.grad_checkpointing = enable

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

    def _dist_head(self) -> nn.Module:
        return nn.Linear(self.embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if self.distilled:
            self.head_dist = self._dist_head()
        if num_classes > 0:
            init_linear_trunc_normal(self.head)
            if self.distilled:
                init_linear_trunc_normal(self.head_dist)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> all tokens after the last block and norm, (B, P + N, C) with P prefix tokens."""
        tokens = self.patch_embed(x)  # (B, N, C); the input's shape is checked there
        grid = self.patch_embed.input_grid(x)
        prefix = [self.cls_token] if self.dist_token is None else [self.cls_token, self.dist_token]
        prefix = [t.expand(tokens.shape[0], -1, -1) for t in prefix]  # P x (B, 1, C)
        x = torch.cat([*prefix, tokens], dim=1)  # (B, P + N, C)
        pos_embed = self.pos_embed  # (1, P + N_table, C)
        if grid != self.patch_embed.grid_size:  # dynamic_img_size: the table resampled to this grid, (1, 1 + N, C)
            pos_embed = resample_pos_embed(pos_embed, grid, self.num_prefix_tokens, self.patch_embed.grid_size)
        x = self.pos_drop(x + pos_embed)
        x = run_blocks(self.blocks, x, self.grad_checkpointing and self.training and torch.is_grad_enabled())
        return self.norm(x)

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, P + N, C) -> logits (B, num_classes), or the pooled (B, C) with `pre_logits`. With the distillation
        token: in training mode the pair (cls logits, dist logits), each (B, num_classes); else their average."""
        if self.dist_token is not None:
            return self._distilled_head(x, pre_logits)
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, C): mean over the patch tokens
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


def init_linear_trunc_normal(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# timm's shapes: 224 px, patch 16. `create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10)` is
# the CIFAR-sized ViT-Ti/4.
register_model(
    "vit_tiny",
    VisionTransformer,
    "ViT-Ti/16 (timm vit_tiny_patch16_224)",
    embed_dim=192,
    depth=12,
    num_heads=3,
)
register_model(
    "vit_small",
    VisionTransformer,
    "ViT-S/16 (timm vit_small_patch16_224)",
    embed_dim=384,
    depth=12,
    num_heads=6,
)
register_model(
    "vit_base",
    VisionTransformer,
    "ViT-B/16 (timm vit_base_patch16_224)",
    embed_dim=768,
    depth=12,
    num_heads=12,
)
