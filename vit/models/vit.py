"""The Vision Transformer (Dosovitskiy et al. 2021), shaped and named like timm's so its weights load as is.

A ViT is the shared `Encoder` (vit/models/encoder.py, which walks an image through the model) with a patch
embedding as its tokenizer: the image cut into p x p patches, each projected to a token of width C. Three kinds
(docs/LEVERS.md): timm's Conv2d patches, Shifted Patch Tokenization, or T2T-style overlapping windows.
"""

from __future__ import annotations

from torch import nn

from vit.models.encoder import Encoder
from vit.models.layers import ConvStemEmbed, OverlappingPatchEmbed, PatchEmbed, ShiftedPatchEmbed, to_2tuple
from vit.models.registry import register_model

PATCH_EMBEDS = {
    "standard": PatchEmbed,
    "spt": ShiftedPatchEmbed,
    "overlap": OverlappingPatchEmbed,
    "conv": ConvStemEmbed,
}


class VisionTransformer(Encoder):
    """ViT classifier: a patch embedding under timm's name `patch_embed`, then the `Encoder`. Every argument is a
    knob the configs expose; those not listed here are the `Encoder`'s.

    Args:
        img_size, patch_size, in_chans: input geometry; `patch_size` must divide `img_size`.
        patch_embed: "standard" (timm's PatchEmbed), "spt" (Shifted Patch Tokenization, `ShiftedPatchEmbed`) or
            "overlap" (T2T-style overlapping windows, `OverlappingPatchEmbed`) or "conv" (a convolutional stem,
            `ConvStemEmbed`).
        lsa: Locality Self-Attention in every block. `patch_embed` and `lsa` are the two levers of Lee, Lee &
            Song 2021 for small data sets (docs/LEVERS.md); both off, the model and its state dict are timm's.
        dynamic_img_size: accept images of other sizes (sides multiples of `patch_size`): the position table is
            resampled (bicubic) to the input's patch grid in `forward`, as timm's `dynamic_img_size` does. The
            trainer switches it on for progressive resizing; the parameters and state dict do not change.
        distill_token: DeiT's distillation token and second head (`dist_token`, `head_dist`: the names of timm's
            distilled DeiT models, whose weights load as they are). The trainer trains `head_dist` towards a
            teacher (docs/DISTILLATION.md).
        qk_norm, mlp, reg_tokens, class_token, no_embed_class, fc_norm, rope_temperature: today's ViT variants
            (docs/VARIANTS.md), each as timm builds it; see `Encoder`. `pos_embed` takes "rope" and "rope_mixed".
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
        qk_norm: bool = False,
        mlp: str = "gelu",
        reg_tokens: int = 0,
        class_token: bool = True,
        no_embed_class: bool = False,
        fc_norm: bool | None = None,
        rope_temperature: float | None = None,
    ) -> None:
        if patch_embed not in PATCH_EMBEDS:
            raise ValueError(f"patch_embed={patch_embed!r} must be one of {tuple(PATCH_EMBEDS)}")
        if not isinstance(dynamic_img_size, bool):
            raise ValueError(f"dynamic_img_size={dynamic_img_size!r} must be true or false")
        tokenizer = PATCH_EMBEDS[patch_embed](
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim
        )
        tokenizer.dynamic_img_size = dynamic_img_size
        super().__init__(
            tokenizer,
            num_classes=num_classes,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            attn_backend=attn_backend,
            pos_embed=pos_embed,
            global_pool=global_pool,
            init_values=init_values,
            lsa=lsa,
            distill_token=distill_token,
            qk_norm=qk_norm,
            mlp=mlp,
            reg_tokens=reg_tokens,
            class_token=class_token,
            no_embed_class=no_embed_class,
            fc_norm=fc_norm,
            rope_temperature=rope_temperature,
        )
        self.patch_embed_kind = patch_embed

    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Make `img_size` the model's own input size, as timm's `set_input_size`: the position table resampled
        once to the new patch grid (what `dynamic_img_size` does in every forward) and stored, so a model trained
        at one size runs, and exports, at another as a fixed-size model. Rotary tables follow the grid anyway."""
        size = to_2tuple(img_size)
        patch = self.patch_embed.patch_size
        if min(size) <= 0 or size[0] % patch[0] or size[1] % patch[1]:
            raise ValueError(f"img_size={img_size} must be a positive multiple of the patch size {patch}")
        grid = (size[0] // patch[0], size[1] // patch[1])
        if self.pos_embed is not None and grid != self.grid_size:
            table = self.position_table(grid).detach().clone()  # (1, P + rows * columns, C), or no prefix rows
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        self.patch_embed.img_size, self.patch_embed.grid_size = size, grid
        self.patch_embed.num_patches = grid[0] * grid[1]


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
