"""The models the benchmarks time: each case is one model shape, built by us (the registry) and by a peer of the
same shape (timm's VisionTransformer, or the official T2T-ViT code when a checkout of it is named).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from torch import nn

from vit.models import create_model

# Dense bf16 tensor-core throughput of an H100 SXM, the GPU the benchmarks ran on, from NVIDIA's datasheet (1,979
# TFLOP/s with 2:4 sparsity, half of it dense); MFU is relative to it. lab/bench_matmul.py measures what a large
# product really reaches on the machine at hand.
H100_BF16_PEAK_FLOPS = 989e12


@dataclass(frozen=True)
class BenchCase:
    """One model shape: how we build it and how the peer (timm) builds the same thing."""

    name: str
    ours: str
    kwargs: dict
    img_size: int
    batch: int
    # "timm": timm's VisionTransformer(**peer_kwargs); "official": the function of the same name in the
    # official T2T-ViT code (models/t2t_vit.py of yitu-opensource/T2T-ViT, a checkout named by the
    # environment variable VIT_T2T_OFFICIAL; never part of this project); "ours": our `ours` model with
    # peer_kwargs (a lever's case against the model without it); None: no peer.
    peer: str | None
    peer_kwargs: dict = field(default_factory=dict)
    # A foundation ViT by its timm name: ours built with the architecture timm has for it (vit/models/foundation.py),
    # the peer timm's own model of that name; `ours` and `kwargs` are then unused.
    timm_name: str | None = None


def _vit_peer(embed_dim, depth, heads, img, patch, classes=1000, drop_path=0.0, mlp_ratio=4.0):
    return dict(
        mlp_ratio=mlp_ratio,
        img_size=img,
        patch_size=patch,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=heads,
        num_classes=classes,
        drop_path_rate=drop_path,
    )


CPU_CIFAR = {"img_size": 32, "patch_size": 4, "num_classes": 10, "embed_dim": 128, "depth": 6, "num_heads": 4}


def _cpu_lever_cases() -> list[BenchCase]:
    from timm.layers import SwiGLUPacked

    base = dict(CPU_CIFAR, mlp_ratio=2.0)
    peer = _vit_peer(128, 6, 4, 32, 4, classes=10, mlp_ratio=2.0)
    swiglu_peer = dict(peer, mlp_layer=SwiGLUPacked, act_layer=nn.SiLU)
    levers = {"qk_norm": True, "pos_embed": "rope_mixed", "mlp": "swiglu"}
    return [
        BenchCase("vit_cpu_cifar_conv_stem", "vit_tiny", dict(base, patch_embed="conv"), 32, 128, None),
        BenchCase("vit_cpu_cifar_qk_norm", "vit_tiny", dict(base, qk_norm=True), 32, 128, "timm",
                  dict(peer, qk_norm=True)),
        BenchCase("vit_cpu_cifar_rope_mixed", "vit_tiny", dict(base, pos_embed="rope_mixed"), 32, 128, None),
        BenchCase("vit_cpu_cifar_swiglu", "vit_tiny", dict(base, mlp="swiglu"), 32, 128, "timm", swiglu_peer),
        BenchCase("vit_cpu_cifar_three_levers", "vit_tiny", dict(base, **levers), 32, 128, None),
    ]  # fmt: skip


def _cpu_recipe_cases() -> list[BenchCase]:
    """experiment=cifar10_cpu's model at the widths trainer.width_by_budget picks from, and wider (conv stem, qk-norm,
    mixed rotary positions, sequence pooling, no cls token), against timm's ViT of the same width, depth, heads, MLP
    ratio and qk-norm (timm builds neither that stem nor mixed rotary positions, so the peer computes a little
    less)."""
    recipe = {
        "patch_embed": "conv",
        "qk_norm": True,
        "pos_embed": "rope_mixed",
        "global_pool": "seq",
        "class_token": False,
        "mlp_ratio": 2.0,
        "depth": 6,
        "img_size": 32,
        "patch_size": 4,
        "num_classes": 10,
    }
    widest = dict(recipe, embed_dim=144, num_heads=3)
    return [
        BenchCase(f"vit_cpu_recipe_{width}", "vit_tiny", dict(recipe, embed_dim=width, num_heads=width // 48), 32, 256,
                  "timm", dict(_vit_peer(width, 6, width // 48, 32, 4, classes=10, mlp_ratio=2.0), qk_norm=True))
        for width in (96, 144, 192, 240, 288)  # the widths trainer.width_by_budget picks from, and wider ones
    ] + [  # the deeper stem (model.stem_convs_per_stage), against the recipe's own stem
        BenchCase(f"vit_cpu_recipe_144_stem{n}", "vit_tiny", dict(widest, stem_convs_per_stage=n), 32, 256, "ours",
                  widest)
        for n in (2, 3)
    ]  # fmt: skip


CASES: dict[str, BenchCase] = {
    c.name: c
    for c in [
        BenchCase(
            "vit_tiny_cifar",
            "vit_tiny",
            {"img_size": 32, "patch_size": 4, "num_classes": 10},
            32,
            512,
            "timm",
            _vit_peer(192, 12, 3, 32, 4, classes=10),
        ),
        # experiment=cifar10_cpu's encoder with plain patches (timm has no convolutional stem of that shape).
        BenchCase(
            "vit_cpu_cifar",
            "vit_tiny",
            {
                "img_size": 32,
                "patch_size": 4,
                "num_classes": 10,
                "embed_dim": 128,
                "depth": 6,
                "num_heads": 4,
                "mlp_ratio": 2.0,
            },
            32,
            128,
            "timm",
            _vit_peer(128, 6, 4, 32, 4, classes=10, mlp_ratio=2.0),
        ),  # fmt: skip
        # The CPU recipe's model levers, one at a time on vit_cpu_cifar, and qk-norm + mixed RoPE + SwiGLU together
        # (docs/BENCHMARKS.md, "What each model lever costs on the CPU"); timm is the peer where its
        # VisionTransformer builds the same thing (qk-norm; SwiGLU as its packed fc1 = [gate | value]).
        *_cpu_lever_cases(),
        # The CPU recipe's model as it trains, at the two widths trainer.width_by_budget picks from.
        *_cpu_recipe_cases(),
        # A toy shape so the whole protocol runs in seconds on a CPU (tests, smoke checks).
        BenchCase(
            "toy",
            "vit_tiny",
            {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10},
            32,
            8,
            "timm",
            _vit_peer(32, 2, 2, 32, 8, classes=10),
        ),
        BenchCase("vit_tiny", "vit_tiny", {}, 224, 256, "timm", _vit_peer(192, 12, 3, 224, 16)),
        BenchCase("vit_small", "vit_small", {}, 224, 256, "timm", _vit_peer(384, 12, 6, 224, 16)),
        BenchCase("vit_base", "vit_base", {}, 224, 128, "timm", _vit_peer(768, 12, 12, 224, 16)),
        # Foundation ViTs by their timm names (docs/FINETUNE.md): random weights, 1000 classes.
        BenchCase("deit3_small", "vit_small", {}, 224, 32, "timm", timm_name="deit3_small_patch16_224"),
        BenchCase("eva02_tiny", "vit_tiny", {}, 224, 32, "timm", timm_name="eva02_tiny_patch14_224"),
        BenchCase("t2t_vit_7", "t2t_vit_7", {}, 224, 256, "official"),
        BenchCase("t2t_vit_14", "t2t_vit_14", {}, 224, 128, "official"),
        BenchCase("t2t_vit_t_14", "t2t_vit_t_14", {}, 224, 128, "official"),
    ]
}


def build_side(case: BenchCase, side: str) -> nn.Module:
    if case.timm_name:
        return _by_timm_name(case.timm_name, side)
    if side == "ours":
        return create_model(case.ours, **case.kwargs)
    if side == "peer" and case.peer == "timm":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(**case.peer_kwargs)
    if side == "peer" and case.peer == "ours":
        return create_model(case.ours, **case.peer_kwargs)
    if side == "peer" and case.peer == "official":
        return official_t2t(case.ours)
    raise ValueError(f"side={side!r} of case {case.name!r} has no model (peer: {case.peer})")


def _by_timm_name(name: str, side: str) -> nn.Module:
    """`side` "ours": our ViT with the architecture of timm's `name`; "peer": timm's own model of that name."""
    if side == "peer":
        import timm

        return timm.create_model(name, pretrained=False, num_classes=1000)
    from vit.models.foundation import timm_architecture
    from vit.models.vit import VisionTransformer, ViTConfig

    return VisionTransformer(ViTConfig(**timm_architecture(name).settings, num_classes=1000))


def official_t2t(name: str) -> nn.Module:
    """Build `name` (e.g. "t2t_vit_14") from the official T2T-ViT checkout at $VIT_T2T_OFFICIAL."""
    import importlib

    root = os.environ.get("VIT_T2T_OFFICIAL")
    if not root or not os.path.isfile(os.path.join(root, "models", "t2t_vit.py")):
        raise RuntimeError(
            f"VIT_T2T_OFFICIAL={root!r} must name a checkout of yitu-opensource/T2T-ViT "
            "(the folder holding models/t2t_vit.py)"
        )
    if root not in sys.path:
        sys.path.insert(0, root)
    return getattr(importlib.import_module("models.t2t_vit"), name)()


def peer_available(case: BenchCase) -> bool:

    if case.peer == "official":
        return bool(os.environ.get("VIT_T2T_OFFICIAL"))
    return case.peer is not None


def num_classes_of(model: nn.Module) -> int:
    return int(getattr(model, "num_classes", 1000))
