"""The architecture of a timm ViT, read from timm itself: `timm_architecture("vit_small_patch14_reg4_dinov2")` gives
the settings of our `ViTConfig` that build the same network, so timm's weights for that name load strictly.

timm builds its model on the meta device (no memory, no init, about 0.1 s) and this module reads the structure off
the modules: nothing is copied into a table of ours that could drift from timm's. What is read, for DINOv2-S/14
with 4 registers (timm `vit_small_patch14_reg4_dinov2`):

    patch_embed      PatchEmbed, proj Conv2d 3 -> 384, 14 x 14, bias     patch_size=14, img_size=518, patch_bias
    tokens           cls_token (1, 1, 384), reg_token (1, 4, 384)         class_token, reg_tokens=4
    pos_embed        (1, 1369, 384) = 37 x 37 rows, no prefix rows       pos_embed="learned", no_embed_class
    blocks           12 x Block: 6 heads, qkv bias, LayerScale,           depth=12, num_heads=6, init_values,
                     Mlp 384 -> 1536 GELU, LayerNorm eps 1e-6             mlp="gelu", mlp_ratio=4, norm_eps=1e-6
    norm, fc_norm    LayerNorm, Identity; global_pool "token"             fc_norm=False, global_pool="token"

The families this reads, each with a parity test against timm (tests/models/test_foundation.py): DeiT III, DINOv2 (with
and without registers), DINOv3 (Eva, DINOv3 rotary positions), SigLIP (attention-pool head), CLIP (norm_pre, no
patch bias, QuickGELU), EVA-02 (Eva, learned table and rotary positions, SwiGLU, the inner MLP norm of B and L).
A structure our ViT does not build (another block, a norm that is not a LayerNorm, grouped-query attention, ...)
is a ValueError naming the part.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vit.models.vit import ViTConfig

# The timm model classes read here: its VisionTransformer (DeiT III, DINOv2, SigLIP, CLIP) and Eva (DINOv3, EVA-02,
# the RoPE ViTs). A subclass (DeiT's distilled ViT) counts as its base.
TIMM_CLASSES = ("VisionTransformer", "Eva", "NaFlexVit")


@dataclass(frozen=True)
class TimmArchitecture:
    """What timm says about a model name: our config's settings for it, and the images its weights expect."""

    name: str  # as given, with its tag if any ("vit_base_patch16_clip_224.openai")
    settings: dict[str, Any]  # ViTConfig settings (architecture only: no num_classes, drop rates, backend)
    img_size: int  # the input side timm's model is built for (its pretrained_cfg's)
    mean: tuple[float, float, float]  # the normalisation its weights were trained with (pretrained_cfg)
    std: tuple[float, float, float]
    num_classes: int  # the classes of its head (0: none)
    crop_pct: float  # evaluation's centre crop, as a fraction of the resized shorter side (pretrained_cfg)
    interpolation: str  # the resize filter its weights were evaluated with (pretrained_cfg)

    def describe(self) -> str:
        """One line: "384 wide, 12 deep, 6 heads, patch 14, 518 px, ..." (the settings that differ from a plain ViT)."""
        s, plain = self.settings, plain_settings()
        extra = [f"{k}={v}" for k, v in s.items() if k not in SHAPE_KEYS and plain.get(k, object()) != v]
        shape = f"{s['embed_dim']} wide, {s['depth']} deep, {s['num_heads']} heads, patch {s['patch_size']}"
        return f"{shape}, {self.img_size} px" + (f"; {', '.join(extra)}" if extra else "")


SHAPE_KEYS = ("embed_dim", "depth", "num_heads", "patch_size", "img_size")


def plain_settings() -> dict[str, Any]:
    """A plain ViT's settings, so `describe` names only what a family changes: ViTConfig's defaults, each declared
    once there, with the fc_norm its None means for the default pool."""
    defaults = {f.name: f.default for f in dataclasses.fields(ViTConfig)}
    return {**defaults, "fc_norm": defaults["global_pool"] == "avg"}


def timm_architecture(name: str, **timm_kwargs: Any) -> TimmArchitecture:
    """The architecture of timm's `name` (`<model>` or `<model>.<tag>`) as our ViTConfig's settings.
    `timm_kwargs` go to timm's constructor as they would to `timm.create_model` (e.g. `depth=2` for a short test
    model of the family). A name timm does not know, or a structure our ViT does not build, is a ValueError."""
    import timm
    from timm.data.constants import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    base = name.split(".", 1)[0]
    if not timm.is_model(base):
        raise ValueError(f"timm has no model {base!r}")
    with torch.device("meta"):  # structure only: no memory, no init
        model = timm.create_model(name, pretrained=False, **timm_kwargs)
    kind = next((c for c in TIMM_CLASSES if any(k.__name__ == c for k in type(model).__mro__)), None)
    if kind is None:
        raise ValueError(f"timm's {name} is a {type(model).__name__}; the ViTs read here are {', '.join(TIMM_CLASSES)}")
    tokens = read_naflex_tokens(model) if kind == "NaFlexVit" else read_tokens(model)
    settings = {**tokens, **read_blocks(model), **read_head(model, kind)}
    settings.update(read_positions(model, kind, settings))
    cfg = model.pretrained_cfg or {}
    # where a pretrained_cfg leaves a value out, timm's own default for it
    mean = tuple(float(v) for v in cfg.get("mean", IMAGENET_DEFAULT_MEAN))
    std = tuple(float(v) for v in cfg.get("std", IMAGENET_DEFAULT_STD))
    img_size = int(cfg.get("input_size", (3, settings["img_size"], settings["img_size"]))[-1])
    num_classes = int(getattr(model, "num_classes", 0) or 0)
    crop_pct, interpolation = float(cfg.get("crop_pct") or DEFAULT_CROP_PCT), str(cfg.get("interpolation") or "bicubic")
    return TimmArchitecture(name, settings, img_size, mean, std, num_classes, crop_pct, interpolation)


def unsupported(name: str, what: str) -> ValueError:
    return ValueError(f"timm's {name} has {what}, which our ViT does not build")


def square(value, what: str, name: str) -> int:
    pair = tuple(int(v) for v in (value if isinstance(value, (tuple, list)) else (value, value)))
    if pair[0] != pair[1]:
        raise unsupported(name, f"a non-square {what} {pair}")
    return pair[0]


def is_layer_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) and module.elementwise_affine and module.bias is not None


def read_tokens(model: nn.Module) -> dict[str, Any]:
    """Patch embedding, width, prefix tokens and the norm before the blocks."""
    name = model.default_cfg.get("architecture", type(model).__name__)
    embed = model.patch_embed
    if type(embed).__name__ != "PatchEmbed" or not isinstance(getattr(embed, "norm", nn.Identity()), nn.Identity):
        raise unsupported(name, f"a {type(embed).__name__} patch embedding with a norm")
    if embed.proj.in_channels != 3:
        raise unsupported(name, f"{embed.proj.in_channels} input channels")
    if not isinstance(model.norm_pre, nn.Identity) and not is_layer_norm(model.norm_pre):
        raise unsupported(name, f"a {type(model.norm_pre).__name__} before the blocks")
    reg = getattr(model, "reg_token", None)
    return dict(
        img_size=square(embed.img_size, "image size", name),
        patch_size=square(embed.patch_size, "patch size", name),
        patch_bias=embed.proj.bias is not None,
        embed_dim=int(model.embed_dim),
        class_token=getattr(model, "cls_token", None) is not None,
        distill_token=getattr(model, "dist_token", None) is not None,
        reg_tokens=0 if reg is None else int(reg.shape[1]),
        norm_pre=is_layer_norm(model.norm_pre),
    )


def read_naflex_tokens(model: nn.Module) -> dict[str, Any]:
    """`read_tokens` for timm's NaFlexVit, whose `embeds` holds the patch projection (a Linear over flattened
    patches, or a Conv2d), the position table over the patches only ((1, h, w, C) learned, or the factorized pair
    (1, h, C) and (1, w, C)), and the prefix tokens. Our ViT takes images of any size (`dynamic_img_size`) and
    NaFlex batches, with the tables resampled as timm does."""
    name = model.default_cfg.get("architecture", type(model).__name__)
    embeds = model.embeds
    factorized = embeds.pos_embed_type == "factorized"  # resampled linearly along each axis, whatever the mode
    rope = getattr(model, "rope", None)  # rotary positions (timm's Eva ViTs built as a NaFlexVit): read_positions
    if embeds.pos_embed_type not in ("learned", "factorized") and not (embeds.pos_embed_type == "none" and rope):
        raise unsupported(name, f"a {embeds.pos_embed_type!r} position embedding")
    if embeds.pos_embed_use_grid_sample:
        raise unsupported(name, "a position table resampled by grid_sample")
    if not factorized and (embeds.pos_embed_align_corners or not embeds.pos_embed_antialias):
        raise unsupported(name, "a position table resampled with align_corners or without antialiasing")
    if not factorized and embeds.pos_embed_interp_mode not in ("bicubic", "bilinear"):
        raise unsupported(name, f"a position table resampled {embeds.pos_embed_interp_mode}")
    if embeds.norm_input is not None or not isinstance(embeds.norm, nn.Identity):
        raise unsupported(name, "a norm in its patch embedding")
    # patch-size interpolation (embeds.patch_interpolator) needs nothing here: ours resamples its kernel to any
    # patches of another size it is given, as timm's interpolator does
    if not embeds.channels_last or embeds.in_chans != 3:
        raise unsupported(name, "(channel, row, column) patches or other than 3 channels")
    if not isinstance(model.norm_pre, nn.Identity) and not is_layer_norm(model.norm_pre):
        raise unsupported(name, f"a {type(model.norm_pre).__name__} before the blocks")
    patch = square(embeds.patch_size, "patch size", name)
    if factorized:
        table_grid = (embeds.pos_embed_y.shape[1], embeds.pos_embed_x.shape[1])
    else:  # the table's, or without one the grid of the default image size
        table_grid = embeds.pos_embed.shape[1:3] if embeds.pos_embed is not None else embeds.pos_embed_grid_size
    grid = square(tuple(table_grid), "position grid", name)
    reg = embeds.reg_token
    return dict(
        img_size=grid * patch,  # the table's own grid: any other is resampled
        patch_size=patch,
        patch_bias=embeds.proj.bias is not None,
        embed_dim=int(model.embed_dim),
        class_token=embeds.cls_token is not None,
        distill_token=False,
        reg_tokens=0 if reg is None else int(reg.shape[1]),
        norm_pre=is_layer_norm(model.norm_pre),
        dynamic_img_size=True,
        pos_embed_interp="bicubic" if factorized else str(embeds.pos_embed_interp_mode),
        pos_embed_ar_preserving=bool(embeds.pos_embed_ar_preserving),
    )


def read_blocks(model: nn.Module) -> dict[str, Any]:
    """Depth, heads, attention, LayerScale and MLP of the blocks (all alike: the first is read, the rest checked)."""
    name = model.default_cfg.get("architecture", type(model).__name__)
    blocks = list(model.blocks)
    kinds = {type(b).__name__ for b in blocks}
    if kinds - {"Block", "EvaBlock"} or len(kinds) != 1:
        raise unsupported(name, f"blocks of kind {', '.join(sorted(kinds))}")
    block, embed_dim = blocks[0], int(model.embed_dim)
    if not (is_layer_norm(block.norm1) and is_layer_norm(block.norm2)):
        raise unsupported(name, f"a {type(block.norm1).__name__} in its blocks")
    settings = dict(depth=len(blocks), norm_eps=float(block.norm1.eps), **read_attention(block.attn, embed_dim, name))
    settings.update(read_layer_scale(block, name))
    settings.update(read_mlp(block.mlp, embed_dim, name))
    return settings


def read_attention(attn: nn.Module, embed_dim: int, name: str) -> dict[str, Any]:
    kind = type(attn).__name__
    if kind not in ("Attention", "EvaAttention", "AttentionRope"):
        raise unsupported(name, f"a {kind} attention")
    if attn.num_heads * attn.head_dim != embed_dim:
        raise unsupported(name, f"attention {attn.num_heads * attn.head_dim} wide in a {embed_dim} wide model")
    if getattr(attn, "num_kv_heads", attn.num_heads) != attn.num_heads:
        raise unsupported(name, "grouped-query attention")
    if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity) or getattr(attn, "gate", None) is not None:
        raise unsupported(name, "a norm or gate inside the attention")
    if getattr(attn, "qkv", None) is not None:  # fused: the bias on the Linear, or EVA-02's q_bias and v_bias
        eva_bias = getattr(attn, "q_bias", None) is not None
        bias, k_bias = attn.qkv.bias is not None or eva_bias, not eva_bias
    else:  # separate q_proj, k_proj, v_proj (read as one qkv, vit/weights/read.py); EVA-02's k_proj has no bias
        bias, k_bias = attn.q_proj.bias is not None, attn.k_proj.bias is not None
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    if qk_norm and not is_layer_norm(attn.q_norm):
        raise unsupported(name, f"a {type(attn.q_norm).__name__} qk-norm")
    return dict(num_heads=int(attn.num_heads), qkv_bias=bool(bias), k_bias=bool(k_bias) or not bias, qk_norm=qk_norm)


def read_layer_scale(block: nn.Module, name: str) -> dict[str, Any]:
    """LayerScale on both branches (its init value: what a fresh model starts from; weights replace it)."""
    if type(block).__name__ == "EvaBlock":
        first, second = block.gamma_1 is not None, block.gamma_2 is not None
        value = block.init_values
    else:
        first, second = not isinstance(block.ls1, nn.Identity), not isinstance(block.ls2, nn.Identity)
        value = getattr(block.ls1, "init_values", None)
    if first != second:
        raise unsupported(name, "LayerScale on one branch only")
    return dict(init_values=(float(value) if value else 1e-5) if first else None)


def read_mlp(mlp: nn.Module, embed_dim: int, name: str) -> dict[str, Any]:
    """The MLP kind, its ratio (fc1's width / C, exactly: int(C * ratio) is fc1's width) and its inner norm."""
    kind, act = type(mlp).__name__, activation(getattr(mlp, "act", None))
    if kind == "Mlp" and act in ("gelu", "quick_gelu", "gelu_tanh"):
        which, width = act, mlp.fc1.out_features
    elif kind == "GluMlp" and act == "silu" and not mlp.gate_last:  # timm's SwiGLUPacked: fc1 = [gate | value]
        which, width = "swiglu", mlp.fc1.out_features
    elif kind == "SwiGLU" and act == "silu":  # separate fc1_g, fc1_x: read as one fc1 = [gate | value]
        which, width = "swiglu", 2 * mlp.fc1_g.out_features
    else:
        raise unsupported(name, f"a {kind} MLP with {act}")
    norm = getattr(mlp, "norm", nn.Identity())
    if not isinstance(norm, nn.Identity) and not is_layer_norm(norm):
        raise unsupported(name, f"a {type(norm).__name__} inside the MLP")
    return dict(mlp=which, mlp_ratio=exact_ratio(width, embed_dim), mlp_norm=is_layer_norm(norm))


def activation(act: nn.Module | None) -> str:
    """Our name of a timm activation module ("gelu", "gelu_tanh", "quick_gelu", "silu"), else its class name."""
    kind = type(act).__name__
    if kind == "GELU":
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate, f"GELU({act.approximate})")
    return {"GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu"}.get(kind, kind)


def exact_ratio(width: int, dim: int) -> float:
    """A float r with int(dim * r) == width: what our blocks size fc1 by (EVA-02-Ti's 1024 / 192 = 5.333...)."""
    ratio = width / dim
    while int(dim * ratio) < width:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def read_head(model: nn.Module, kind: str) -> dict[str, Any]:
    """Pooling and where the final norm sits."""
    name = model.default_cfg.get("architecture", type(model).__name__)
    pool = model.global_pool
    if pool not in ("token", "avg", "map"):
        raise unsupported(name, f"global_pool={pool!r}")
    if pool == "avg" and getattr(model, "pool_include_prefix", False):
        raise unsupported(name, "average pooling over its prefix tokens")
    norm, fc_norm = model.norm, model.fc_norm
    if not (is_layer_norm(norm) ^ is_layer_norm(fc_norm)) or not (
        isinstance(norm, nn.Identity) ^ isinstance(fc_norm, nn.Identity)
    ):
        raise unsupported(name, f"a final {type(norm).__name__} and an fc_norm {type(fc_norm).__name__}")
    if pool == "map":
        check_attention_pool(model, kind, name)
    return dict(global_pool=pool, fc_norm=is_layer_norm(fc_norm))


def check_attention_pool(model: nn.Module, kind: str, name: str) -> None:
    """SigLIP's head as `AttentionPool` builds it: one query, the blocks' heads, a GELU MLP of the blocks' ratio."""
    pool = model.attn_pool
    embed_dim = int(model.embed_dim)
    if type(pool).__name__ != "AttentionPoolLatent" or pool.latent_len != 1 or pool.pos_embed is not None:
        raise unsupported(name, f"a {type(pool).__name__} pooling head")
    if kind == "Eva" and model.num_prefix_tokens:
        raise unsupported(name, "attention pooling over its prefix tokens")
    if getattr(model, "pool_include_prefix", False) or not isinstance(pool.q_norm, nn.Identity):
        raise unsupported(name, "attention pooling over its prefix tokens, or with qk-norm")
    heads = model.blocks[0].attn.num_heads
    blocks_mlp = read_mlp(model.blocks[0].mlp, embed_dim, name)
    ratio = blocks_mlp["mlp_ratio"] if blocks_mlp["mlp"] != "swiglu" else 4.0
    if pool.num_heads != heads or pool.mlp is None or pool.mlp.fc1.out_features != int(embed_dim * ratio):
        raise unsupported(name, "an attention-pool head with other heads or MLP width than its blocks")
    expected = "gelu_tanh" if blocks_mlp["mlp"] == "gelu_tanh" else "gelu"  # as `TransformerClassifier` builds its head
    if activation(pool.mlp.act) != expected:
        raise unsupported(name, f"an attention-pool MLP with {type(pool.mlp.act).__name__}")


def read_positions(model: nn.Module, kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The position table and rotary positions: our `pos_embed` kind and its rotary settings."""
    name = model.default_cfg.get("architecture", type(model).__name__)
    if kind == "NaFlexVit":  # a table over the patches only (read_naflex_tokens refuses the rest), or none
        table_kind, rope, no_embed_class = model.embeds.pos_embed_type, model.rope, True
        if rope is None:
            pos_embed = "factorized" if table_kind == "factorized" else "learned"
            return dict(no_embed_class=True, rope_temperature=None, rope_ref_grid=None, pos_embed=pos_embed)
        if table_kind == "factorized":
            raise unsupported(name, "rotary positions beside a factorized table")
        table = table_kind == "learned"
    else:
        table = getattr(model, "pos_embed", None) is not None
        rope = getattr(model, "rope", None) if kind == "Eva" else None
        no_embed_class = bool(model.no_embed_class)
    out: dict[str, Any] = dict(no_embed_class=no_embed_class, rope_temperature=None, rope_ref_grid=None)
    if rope is None:
        if not table:
            raise unsupported(name, "no position information (neither a table nor rotary positions)")
        out["pos_embed"] = "learned"
        return out
    rope_kind = type(rope).__name__
    offset = float(getattr(rope, "grid_offset", 0.0))
    augmented = any(getattr(rope, k, None) is not None for k in ("shift_coords", "jitter_coords", "rescale_coords"))
    if offset or augmented:
        raise unsupported(name, "rotary positions with a grid offset or coordinate augmentation")
    if rope_kind == "RotaryEmbeddingDinoV3" and not table:
        if not rope.rotate_half or rope.normalize_coords != "separate" or rope.min_period is not None:
            raise unsupported(name, "DINOv3 rotary positions other than DINOv3's own")
        out["pos_embed"] = "rope_dinov3"
    elif rope_kind == "RotaryEmbeddingMixed" and not table:
        out["pos_embed"] = "rope_mixed"
    elif rope_kind == "RotaryEmbeddingCat" and not rope.in_pixels and not rope.rotate_half:
        if table and rope.grid_indexing == "ij":  # EVA-02: the table and the rows-first axial rotation
            ref = rope.ref_feat_shape
            out["pos_embed"] = "learned_rope"
            out["rope_ref_grid"] = None if ref is None else square(ref, "rotary reference grid", name)
        elif not table and rope.grid_indexing == "xy" and rope.ref_feat_shape is None:  # the RoPE ViTs
            out["pos_embed"] = "rope"
        else:
            raise unsupported(name, f"axial rotary positions with grid_indexing={rope.grid_indexing!r}")
    else:
        raise unsupported(name, f"{rope_kind} rotary positions" + (" beside a table" if table else ""))
    out["rope_temperature"] = float(rope.temperature)
    if out["no_embed_class"] and not table:
        out["no_embed_class"] = False  # no table to leave the prefix rows out of
    return out


__all__ = ["TimmArchitecture", "timm_architecture"]
