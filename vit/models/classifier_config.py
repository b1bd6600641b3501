"""The classifier's settings, each default declared once in `ClassifierConfig` (a model's config adds its
embedding's), and the checks that make a config that exists a valid one: every choice named, every combination
that cannot work refused with a ValueError naming the setting."""

from __future__ import annotations

from dataclasses import dataclass

from vit.models.attention import Attention, LocalitySelfAttention, RotaryAttention
from vit.models.layers import MLPS, check_rate
from vit.models.pos_embed import POS_EMBED_KINDS
from vit.models.rotary_positions import ROTARY_POSITIONS

GLOBAL_POOLS = ("token", "avg", "map", "seq")


POS_EMBED_INTERPS = ("bicubic", "bilinear")  # how a position table is resampled to another grid


# Rotary positions: axial (fixed frequencies), mixed (learned per head), DINOv3's (normalised centres, half
# layout), and EVA-02's (axial beside a learned table).
ROPE_KINDS = tuple(ROTARY_POSITIONS)


def table_kind(pos_embed: str) -> str | None:
    """The kind of position table added to the tokens (vit/models/pos_embed.py), None for rotary positions only."""
    if pos_embed == "learned_rope":
        return "learned"
    return None if pos_embed in ROPE_KINDS else pos_embed


@dataclass(frozen=True)
class ClassifierConfig:
    """The settings of the `TransformerClassifier`, grouped by the step of the path they change, each default
    declared here once (timm's, so the plain model is timm's ViT). A model's config adds its embedding's settings
    (`ViTConfig`, `T2TConfig`). A config that exists is valid: each check below raises a ValueError naming the
    setting and its value."""

    # -- size --
    embed_dim: int = 768  # C, the width of every token
    depth: int = 12  # number of blocks
    num_heads: int = 12  # heads per block
    num_classes: int = 1000  # classes of the head (0: no head, `forward` returns pooled features)

    # -- tokens before the image's: cls, dist, then the registers --
    class_token: bool = True  # the cls token; false needs global_pool=avg, map or seq (timm's `class_token`)
    distill_token: bool = False  # DeiT's distillation token and second head; needs global_pool=token
    reg_tokens: int = 0  # register tokens after the cls (and dist) token, `reg_token` (1, R, C)

    # -- positions --
    # "learned" (trunc-normal init), "sinusoidal" (fixed, 1D) or "sincos2d" (fixed, 2D over the patch grid, MAE's),
    # a table added to the tokens; "factorized" (NaViT's: a learned row table and column table, their sum added to
    # the image's tokens; needs no_embed_class=true); "rope" (axial rotary positions), "rope_mixed" (rotary with
    # learned 2D frequencies) or "rope_dinov3" (DINOv3's), in the attention; "learned_rope" (EVA-02's): a learned
    # table and axial rotary positions.
    pos_embed: str = "learned"
    no_embed_class: bool = False  # the position table has rows for the image's tokens only (timm's)
    # How the position table is resampled to another grid (a dynamic image size, each image of a NaFlex batch):
    # "bicubic" (timm's default) or "bilinear" (SigLIP 2's NaFlex models); antialiased either way.
    pos_embed_interp: str = "bicubic"
    # Resample the table to a square of the grid's longer side and cut the grid from it (timm's NaFlex
    # `pos_embed_ar_preserving`), rather than stretching it to the grid's aspect ratio.
    pos_embed_ar_preserving: bool = False
    # The rotary frequencies' base; null: 100 for "rope" and "rope_dinov3", 10 for "rope_mixed", 10000 for
    # "learned_rope" (vit/models/rotary_positions.py).
    rope_temperature: float | None = None
    # pos_embed="learned_rope": the rotary positions rescaled as if the grid were this many patches a side (EVA-02's
    # pretraining grid, 16 for its 224 px models); null: the patch indices as they are.
    rope_ref_grid: int | None = None

    # -- attention (vit/models/attention.py) --
    qkv_bias: bool = True  # a bias on q, k and v
    k_bias: bool = True  # with qkv_bias: the keys' bias too; false: EVA-02's `q_bias` and `v_bias`, keys without
    qk_scale: float | None = None  # the scale of q @ k^T; null: head_dim ** -0.5
    qk_norm: bool = False  # a LayerNorm on each head's q and k
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    attn_backend: str = "auto"  # the kernel: "math" (written out), "sdpa" (fused) or "auto" (`use_fused_attn`)
    lsa: bool = False  # Locality Self-Attention (`LocalitySelfAttention`)

    # -- MLP (vit/models/layers.py) --
    mlp_ratio: float = 4.0  # MLP width / C
    # "gelu" (`Mlp`), "quick_gelu" (CLIP's), "gelu_tanh", or "swiglu" (`SwiGLU`; mlp_ratio sizes its fc1, gate and
    # value together).
    mlp: str = "gelu"
    mlp_norm: bool = False  # a LayerNorm inside every MLP, over its hidden width before fc2 (EVA-02 B and L)

    # -- every block, and the tokens around the blocks --
    drop_rate: float = 0.0  # dropout after the position embedding and inside every block (timm's classic ViT)
    drop_path_rate: float = 0.0  # stochastic depth of the last block; rates rise linearly from 0 at the first
    init_values: float | None = None  # LayerScale init (null: off)
    norm_eps: float = 1e-6  # the epsilon of every LayerNorm: timm's ViTs' 1e-6; CLIP's and DINOv3's 1e-5
    norm_pre: bool = False  # a LayerNorm on the tokens after the position table, before the blocks (CLIP's)

    # -- head --
    # "token" reads the cls token; "avg" averages the image's tokens (not the cls, dist or register tokens) and,
    # as timm does, moves the final LayerNorm after the pooling (`fc_norm`); "map": a learned query attends over
    # the image's tokens (SigLIP's attention-pool head, `attn_pool`); "seq": CCT's sequence pooling, a softmax over
    # the image's tokens of one learned score each (`seq_pool`, a Linear C -> 1) weighs their average.
    global_pool: str = "token"
    # The final LayerNorm after pooling (true) or before it (false); null: after it exactly when global_pool="avg"
    # (timm's `fc_norm`).
    fc_norm: bool | None = None

    def __post_init__(self) -> None:
        for check in (check_size, check_tokens, check_positions, check_blocks, check_head):
            check(self)


# Each check raises a ValueError naming the setting and its value (the trainer turns it into one line naming
# `model.<setting>`).


def check_bools(config: ClassifierConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be true or false")


def check_size(c: ClassifierConfig) -> None:
    if c.depth <= 0:
        raise ValueError(f"depth={c.depth} must be positive")
    if c.num_classes < 0:
        raise ValueError(f"num_classes={c.num_classes} must be >= 0")
    if c.embed_dim <= 0 or c.num_heads <= 0 or c.embed_dim % c.num_heads:
        raise ValueError(f"num_heads={c.num_heads} must be a positive divisor of embed_dim={c.embed_dim}")


def check_tokens(c: ClassifierConfig) -> None:
    check_bools(c, "class_token", "distill_token")
    if isinstance(c.reg_tokens, bool) or not isinstance(c.reg_tokens, int) or c.reg_tokens < 0:
        raise ValueError(f"reg_tokens={c.reg_tokens!r} must be an integer >= 0")


def check_positions(c: ClassifierConfig) -> None:
    if c.pos_embed not in POS_EMBED_KINDS + ROPE_KINDS:
        raise ValueError(f"pos_embed={c.pos_embed!r} must be one of {POS_EMBED_KINDS + ROPE_KINDS}")
    check_bools(c, "no_embed_class", "pos_embed_ar_preserving")
    if c.pos_embed_interp not in POS_EMBED_INTERPS:
        raise ValueError(f"pos_embed_interp={c.pos_embed_interp!r} must be one of {POS_EMBED_INTERPS}")
    if table_kind(c.pos_embed) is None and c.no_embed_class:
        raise ValueError(f"no_embed_class=true places a position table, and pos_embed={c.pos_embed!r} has none")
    if c.pos_embed == "factorized" and not c.no_embed_class:
        raise ValueError("pos_embed=factorized has rows for the image's tokens only: it needs no_embed_class=true")
    if c.pos_embed == "factorized" and c.pos_embed_interp != "bicubic":
        raise ValueError(
            f"pos_embed_interp={c.pos_embed_interp!r} resamples a 2D table; pos_embed=factorized resamples its row"
            " and column tables linearly (timm's NaFlexVit)"
        )
    if c.rope_ref_grid is not None:
        if c.pos_embed != "learned_rope":
            raise ValueError(f"rope_ref_grid={c.rope_ref_grid} is for pos_embed=learned_rope, not {c.pos_embed!r}")
        if isinstance(c.rope_ref_grid, bool) or not isinstance(c.rope_ref_grid, int) or c.rope_ref_grid <= 0:
            raise ValueError(f"rope_ref_grid={c.rope_ref_grid!r} must be a positive integer (patches a side)")
    if c.rope_temperature is not None:
        if c.pos_embed not in ROPE_KINDS:
            raise ValueError(
                f"rope_temperature={c.rope_temperature} is for pos_embed={'|'.join(ROPE_KINDS)}, not {c.pos_embed!r}"
            )
        if not c.rope_temperature > 0:
            raise ValueError(f"rope_temperature={c.rope_temperature} must be > 0")


def check_blocks(c: ClassifierConfig) -> None:
    """The attention's, the MLP's and every block's settings."""
    check_bools(c, "k_bias", "qk_norm", "lsa", "mlp_norm", "norm_pre")
    if c.mlp not in MLPS:
        raise ValueError(f"mlp={c.mlp!r} must be one of {tuple(MLPS)}")
    for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
        check_rate(name, getattr(c, name))
    if isinstance(c.norm_eps, bool) or not isinstance(c.norm_eps, (int, float)) or not 0 < c.norm_eps < 1:
        raise ValueError(f"norm_eps={c.norm_eps!r} must be a number in (0, 1)")


def check_head(c: ClassifierConfig) -> None:
    if c.global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool={c.global_pool!r} must be one of {GLOBAL_POOLS}")
    if c.fc_norm is not None and not isinstance(c.fc_norm, bool):
        raise ValueError(f"fc_norm={c.fc_norm!r} must be true, false or null (null: after the pooling with avg)")
    if c.distill_token and c.global_pool != "token":
        raise ValueError(
            f"distill_token=true needs global_pool=token (the heads read the two tokens), not {c.global_pool!r}"
        )
    if not c.class_token and c.global_pool == "token":
        raise ValueError("class_token=false needs global_pool=avg, map or seq: global_pool=token reads the cls token")
    if not c.class_token and c.distill_token:
        raise ValueError("distill_token=true needs class_token=true: the two heads read the cls and dist tokens")


def attention_choice(config: ClassifierConfig) -> dict:
    """The encoder's blocks' attention and its options: `Attention`; `RotaryAttention` under rotary positions or
    EVA-02's biases (model.k_bias=false); `LocalitySelfAttention` with model.lsa."""
    rotary = config.pos_embed in ROPE_KINDS or (config.qkv_bias and not config.k_bias)
    options = {"attention": Attention, "attn_backend": config.attn_backend, "qk_norm": config.qk_norm}
    if config.lsa:
        if rotary:
            raise ValueError(
                f"lsa=True with pos_embed={config.pos_embed!r} and k_bias={config.k_bias}: locality self-attention "
                "is not built with rotary positions or EVA-02's biases"
            )
        return {**options, "attention": LocalitySelfAttention}
    if rotary:
        return {
            **options,
            "attention": RotaryAttention,
            "rope_half": config.pos_embed == "rope_dinov3",
            "k_bias": config.k_bias,
        }
    return options
