"""The Vision Transformer (Dosovitskiy et al. 2021), shaped and named like timm's so its weights load as is.

A ViT is the shared `TransformerClassifier` (vit/models/classifier.py, which walks an image through the model)
with a patch embedding: the image cut into p x p patches, each projected to a token of width C. Five kinds
(docs/LEVERS.md): timm's Conv2d patches, Shifted Patch Tokenization, T2T-style overlapping windows, a strided
convolutional stem, or CCT's convolution and max-pool stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from vit.models.classifier import TransformerClassifier
from vit.models.classifier_config import ClassifierConfig
from vit.models.layers import to_2tuple
from vit.models.patch_embed import ConvPoolEmbed, ConvStemEmbed, OverlappingPatchEmbed, PatchEmbed, ShiftedPatchEmbed
from vit.models.pos_embed import resample_factorized

PATCH_EMBEDS = {
    "standard": PatchEmbed,
    "spt": ShiftedPatchEmbed,
    "overlap": OverlappingPatchEmbed,
    "conv": ConvStemEmbed,
    "cct": ConvPoolEmbed,
}


@dataclass(frozen=True)
class ViTConfig(ClassifierConfig):
    """A ViT's settings: the `ClassifierConfig`'s and its patch embedding's (timm's defaults: ViT-B/16 at 224 px)."""

    # -- patch embedding --
    img_size: int = 224  # input side (or an (H, W) pair); `patch_size` must divide it
    patch_size: int = 16  # p: each token is a p x p patch
    in_chans: int = 3  # the image's channels
    # "standard" (timm's PatchEmbed), "spt" (Shifted Patch Tokenization, `ShiftedPatchEmbed`), "overlap" (T2T-style
    # overlapping windows, `OverlappingPatchEmbed`), "conv" (a convolutional stem, `ConvStemEmbed`) or "cct" (the
    # Compact Convolutional Transformer's convolution, ReLU and max-pool stages, `ConvPoolEmbed`). `patch_embed`
    # and `lsa` are the two levers of Lee, Lee & Song 2021 for small data sets (docs/LEVERS.md); both off, the
    # model and its state dict are timm's.
    patch_embed: str = "standard"
    # patch_embed="conv": 3 x 3 convolutions per halving of the stem (`ConvStemEmbed`). 1 is Xiao et al.'s stem (one
    # of stride 2 each); every one more adds a convolution of stride 1 at that stage: a deeper convolutional tokenizer
    stem_convs_per_stage: int = 1
    # patch_embed="conv": the trainer starts the stem's first convolution from the whitening of the 3 x 3 patches of
    # its first training images (airbench's patch-whitening initialisation, `ConvStemEmbed.whiten`)
    stem_whitening: bool = False
    # Accept images of other sizes (sides multiples of `patch_size`): the position table is resampled (bicubic) to
    # the input's patch grid in `forward`, as timm's `dynamic_img_size` does. The trainer switches it on for
    # progressive resizing; the parameters and state dict do not change.
    dynamic_img_size: bool = False
    patch_bias: bool = True  # the standard patch projection's bias; CLIP's has none (its `norm_pre` follows)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_embed not in PATCH_EMBEDS:
            raise ValueError(f"patch_embed={self.patch_embed!r} must be one of {tuple(PATCH_EMBEDS)}")
        depth = self.stem_convs_per_stage
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"stem_convs_per_stage={depth!r} must be a whole number of at least 1")
        if depth > 1 and self.patch_embed != "conv":
            raise ValueError(f"stem_convs_per_stage={depth} is for patch_embed=conv, not {self.patch_embed!r}")
        if not isinstance(self.stem_whitening, bool):
            raise ValueError(f"stem_whitening={self.stem_whitening!r} must be true or false")
        if self.stem_whitening and self.patch_embed != "conv":
            raise ValueError(f"stem_whitening=true is for patch_embed=conv, not {self.patch_embed!r}")
        if not isinstance(self.patch_bias, bool):
            raise ValueError(f"patch_bias={self.patch_bias!r} must be true or false")
        if not self.patch_bias and self.patch_embed != "standard":
            raise ValueError(f"patch_bias=false is for patch_embed=standard, not {self.patch_embed!r}")
        if not isinstance(self.dynamic_img_size, bool):
            raise ValueError(f"dynamic_img_size={self.dynamic_img_size!r} must be true or false")


class VisionTransformer(TransformerClassifier):
    """ViT classifier: a patch embedding under timm's name `patch_embed`, then the `TransformerClassifier`; `config`
    holds every knob the configs expose (`ViTConfig`). `distill_token` adds DeiT's distillation token and second head
    (`dist_token`, `head_dist`: the names of timm's distilled DeiT models, whose weights load as they are), which
    the trainer trains towards a teacher (docs/DISTILLATION.md); qk_norm, mlp, reg_tokens, class_token,
    no_embed_class, fc_norm and rotary positions (`pos_embed="rope"`, `"rope_mixed"`) are today's ViT variants
    (docs/VARIANTS.md), each as timm builds it.
    """

    def __init__(self, config: ViTConfig) -> None:
        sizes = dict(img_size=config.img_size, patch_size=config.patch_size, in_chans=config.in_chans)
        if config.patch_embed == "standard":
            embed = PatchEmbed(**sizes, embed_dim=config.embed_dim, bias=config.patch_bias)
        elif config.patch_embed == "conv":
            embed = ConvStemEmbed(**sizes, embed_dim=config.embed_dim, convs_per_stage=config.stem_convs_per_stage,
                                  whitening=config.stem_whitening)  # fmt: skip
        else:
            embed = PATCH_EMBEDS[config.patch_embed](**sizes, embed_dim=config.embed_dim)
        embed.dynamic_img_size = config.dynamic_img_size
        super().__init__(embed, config)
        self.patch_embed_kind = config.patch_embed

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
        if self.pos_embed_y is not None and grid != self.grid_size:  # factorized: each table at its new side
            ar_preserving = self.config.pos_embed_ar_preserving
            tables = resample_factorized(self.pos_embed_y, self.pos_embed_x, grid, ar_preserving)
            self.pos_embed_y, self.pos_embed_x = (nn.Parameter(t.detach().clone()) for t in tables)
        self.patch_embed.img_size, self.patch_embed.grid_size = size, grid
        self.patch_embed.num_patches = grid[0] * grid[1]
