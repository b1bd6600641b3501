"""Model names -> constructors with defaults: `create_model("vit_tiny", img_size=32, patch_size=4)`."""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass(frozen=True)
class ModelEntry:
    name: str
    constructor: Callable[..., nn.Module]
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, constructor: Callable[..., nn.Module], description: str = "", **defaults: Any) -> None:
    """Register `name` as `constructor(**defaults)`; `create_model` overrides any default."""
    if name in _REGISTRY:
        raise ValueError(f"model name {name!r} is already registered")
    accepted = inspect.signature(constructor).parameters
    unknown = sorted(set(defaults) - set(accepted))
    if unknown:
        raise ValueError(f"defaults {unknown} of {name!r} are not arguments of {constructor.__name__}")
    _REGISTRY[name] = ModelEntry(name, constructor, dict(defaults), description)


def list_models(pattern: str = "*") -> list[str]:
    """Registered names matching a shell-style pattern, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def model_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        raise ValueError(f"unknown model name {name!r}; known models: {', '.join(list_models())}")
    return _REGISTRY[name]


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model; every constructor argument can be overridden by keyword.

    `None` values in `overrides` mean "use the registered default" (configs pass `null` that way), except
    for arguments whose meaningful value is None (`qk_scale`, `init_values`, `fc_norm`, `rope_temperature`),
    which are passed through.
    """
    return model_entry(name).constructor(**model_arguments(name, **overrides))


def model_arguments(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments `create_model(name, **overrides)` passes its constructor: the registered defaults
    with the overrides on top. A wrapper built around a registered model (the masked autoencoder around a ViT
    encoder) takes the same arguments."""
    entry = model_entry(name)
    params = inspect.signature(entry.constructor).parameters
    unknown = sorted(k for k in overrides if k not in params)
    if unknown:
        raise ValueError(f"{unknown[0]} is not an argument of model {name!r}; valid arguments: {', '.join(params)}")
    kwargs = dict(entry.defaults)
    for key, value in overrides.items():
        if value is None and key not in NONE_IS_A_VALUE:
            continue
        kwargs[key] = value
    return kwargs


# Arguments for which None is itself the setting, not "use the default".
NONE_IS_A_VALUE = frozenset({"qk_scale", "init_values", "fc_norm", "rope_temperature"})
