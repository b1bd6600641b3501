"""Every model name, in one table: `create_model("vit_tiny", img_size=32, patch_size=4)`.

A name is a model class, its config class and the values that make the model what its name says (width, depth,
heads; T2T's token type and MLP ratio): its identity, not defaults. Every other setting's default is declared
once, on the config dataclass (`ViTConfig`, `T2TConfig`); `create_model` overrides any setting by keyword.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

from vit.models.classifier import TransformerClassifier
from vit.models.classifier_config import ClassifierConfig
from vit.models.t2t import T2TConfig, T2TViT
from vit.models.vit import VisionTransformer, ViTConfig


@dataclass(frozen=True)
class ModelEntry:
    model: type[TransformerClassifier]  # built as model(config(**identity, **overrides))
    config: type[ClassifierConfig]
    identity: dict[str, Any]
    description: str


def _vit(embed_dim: int, depth: int, num_heads: int, description: str) -> ModelEntry:
    identity = dict(embed_dim=embed_dim, depth=depth, num_heads=num_heads)
    return ModelEntry(VisionTransformer, ViTConfig, identity, description)


def _t2t(tokens_type: str, embed_dim: int, depth: int, num_heads: int, mlp_ratio: float) -> ModelEntry:
    identity = dict(tokens_type=tokens_type, embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio)
    description = f"T2T-ViT ({tokens_type} tokens), {embed_dim} wide, {depth} deep, {num_heads} heads"
    return ModelEntry(T2TViT, T2TConfig, identity, description)


# timm's ViT shapes at their 224 px, patch 16 (`create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10)`
# is the CIFAR-sized ViT-Ti/4), and the T2T-ViT paper's Table 1: (tokens_type, embed_dim, depth, num_heads,
# mlp_ratio).
MODELS: dict[str, ModelEntry] = {
    "vit_tiny": _vit(192, 12, 3, "ViT-Ti/16 (timm vit_tiny_patch16_224)"),
    "vit_small": _vit(384, 12, 6, "ViT-S/16 (timm vit_small_patch16_224)"),
    "vit_base": _vit(768, 12, 12, "ViT-B/16 (timm vit_base_patch16_224)"),
    "t2t_vit_7": _t2t("performer", 256, 7, 4, 2.0),
    "t2t_vit_10": _t2t("performer", 256, 10, 4, 2.0),
    "t2t_vit_12": _t2t("performer", 256, 12, 4, 2.0),
    "t2t_vit_14": _t2t("performer", 384, 14, 6, 3.0),
    "t2t_vit_19": _t2t("performer", 448, 19, 7, 3.0),
    "t2t_vit_24": _t2t("performer", 512, 24, 8, 3.0),
    "t2t_vit_t_14": _t2t("transformer", 384, 14, 6, 3.0),
    "t2t_vit_t_19": _t2t("transformer", 448, 19, 7, 3.0),
    "t2t_vit_t_24": _t2t("transformer", 512, 24, 8, 3.0),
}

# Settings for which None is itself the value, not "use the default".
NONE_IS_A_VALUE = frozenset({"qk_scale", "init_values", "fc_norm", "rope_temperature"})


def list_models(pattern: str = "*") -> list[str]:
    """Registered names matching a shell-style pattern, sorted."""
    return sorted(n for n in MODELS if fnmatch.fnmatch(n, pattern))


def model_entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise ValueError(f"unknown model name {name!r}; known models: {', '.join(list_models())}")
    return MODELS[name]


def model_settings(config: type[ClassifierConfig]) -> list[str]:
    """The settings a config class takes (those its model family fixes, `init=False`, are not settings)."""
    return [f.name for f in fields(config) if f.init]


def model_defaults(name: str) -> dict[str, Any]:
    """Every setting of the registered model `name` with the value `create_model(name)` builds it with: its
    config class's defaults, and its identity over them (the trainer's config keys start from these)."""
    entry = model_entry(name)
    config = entry.config(**entry.identity)
    return {key: getattr(config, key) for key in model_settings(entry.config)}


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model; every setting of its config class can be overridden by keyword.

    `None` values in `overrides` mean "use the default" (configs pass `null` that way), except for the settings
    whose meaningful value is None (`qk_scale`, `init_values`, `fc_norm`, `rope_temperature`), which are passed
    through.
    """
    entry = model_entry(name)
    return entry.model(entry.config(**model_arguments(name, **overrides)))


def model_arguments(name: str, **overrides: Any) -> dict[str, Any]:
    """The settings `create_model(name, **overrides)` gives its config class: the name's identity with the
    overrides on top (the config class fills in the rest). A wrapper built around a registered model (the masked
    autoencoder around a ViT encoder) takes the same settings."""
    entry = model_entry(name)
    valid = model_settings(entry.config)
    unknown = sorted(k for k in overrides if k not in valid)
    if unknown:
        raise ValueError(f"{unknown[0]} is not an argument of model {name!r}; valid arguments: {', '.join(valid)}")
    kwargs = dict(entry.identity)
    for key, value in overrides.items():
        if value is None and key not in NONE_IS_A_VALUE:
            continue
        kwargs[key] = value
    return kwargs


def official_qk_scale(name: str) -> float:
    """The encoder scale the released checkpoints of the registered T2T-ViT `name` were trained with:
    embed_dim ** -0.5."""
    return model_arguments(name)["embed_dim"] ** -0.5
