"""A model from the config's `model` group (and `mae` group for task=mae): `create_model` with the config's keys,
a bad value named as `model.<key>`. Training, evaluation, export and the analysis tools all build models here.

With `model.pretrained=timm:<name>` the architecture is timm's `<name>`, read from timm (vit/models/foundation.py):
its settings replace the model config's. What the config sets on top stays where the weights still fit: the image
size (the position table is resampled, rotary positions follow the grid), a patch size other than the registry's
16 (the kernel is resampled), the class count, dropout and drop-path rates, the attention backend, `dynamic_img_size`
and `qk_scale`. Any other architecture setting the config gives a value of its own (other than what `model=<name>`
builds with, e.g. `model.embed_dim=192`) is one log line naming it, and timm's value is used.

What a run records of such a model (checkpoints, metrics.json, the log) is the model built, not the config it was
composed with (`model=vit_tiny`'s 192 wide, 3 heads): `built_model_config` gives the model config with timm's
architecture in place and `model.name=timm:<name>`, which builds the same model again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from vit.config.value_types import check_types
from vit.errors import ConfigError, require
from vit.models import create_mae, create_model, list_models
from vit.models.foundation import TimmArchitecture, timm_architecture
from vit.models.registry import model_defaults
from vit.models.vit import VisionTransformer, ViTConfig
from vit.settings import MaeSettings
from vit.weights.fit import PretrainedError
from vit.weights.read import CheckpointError, check_timm_name, source_kind, source_name

log = logging.getLogger("vit.tasks.build")

# Model keys that say how a run starts (vit/train/finetune.py), not how the model is built.
FINETUNE_MODEL_KEYS = ("pretrained", "pretrained_file", "pretrained_ema", "freeze")
# Settings the model config keeps over a timm architecture (the weights still fit; see the module's docstring).
KEPT_OVER_TIMM = (
    "num_classes",
    "img_size",
    "patch_size",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "attn_backend",
    "dynamic_img_size",
    "qk_scale",
    "in_chans",
)
# Model keys that say how the model trains or how its attention is computed, not what it is (metrics.json's
# "architecture" leaves them out, beside the class count, which the data decides and metrics.json names apart).
NOT_ARCHITECTURE = ("name", "num_classes", "drop_rate", "attn_drop_rate", "drop_path_rate", "attn_backend")


def built_config_file(group: str) -> Path:
    """In a run folder, beside Hydra's .hydra/config.yaml (the config the command composed): the `group` config the
    run trained with where the two differ (the model of model.pretrained=timm:<name> or of a width
    trainer.width_by_budget picked; any group its long_overrides set), written by vit/train/setup.py, read by
    vit/analysis/runs.py."""
    return Path(".hydra") / f"{group}_built.yaml"


def model_kwargs(model_cfg: Mapping, num_classes: int | None = None) -> dict:
    kwargs = {k: v for k, v in dict(model_cfg).items() if k != "name" and k not in FINETUNE_MODEL_KEYS}
    if kwargs.get("num_classes") is None and num_classes is not None:
        kwargs["num_classes"] = num_classes
    return kwargs


def build_model_from_config(
    model_cfg: Mapping, num_classes: int | None = None, dynamic_img_size: bool = False, announce: bool = True
) -> nn.Module:
    """`create_model` with the config's keys; a bad value becomes a ConfigError naming `model.<key>`.
    `dynamic_img_size`: a ViT that also takes other image sizes (progressive resizing), as `model.dynamic_img_size`.
    With `model.pretrained=timm:<name>`: timm's architecture for it, the config's kept settings on top (logged
    unless `announce` is False, for a second build of the same model)."""
    name = model_cfg.get("name")
    if is_timm_named(model_cfg):  # a record of a model built from a timm name: a ViT, typed as the registry's are
        check_types(OmegaConf.create({"model": {**dict(model_cfg), "name": list_models("vit_*")[0]}}))
        pretrained = model_cfg.get("pretrained")
        require(
            pretrained == name,
            f"model.name={name!r} names the model a run built from model.pretrained={name}; it is built from that "
            f"setting, and model.pretrained is {pretrained!r}: give model.pretrained={name}",
        )
    else:
        check_types(OmegaConf.create({"model": dict(model_cfg)}))
        if name not in list_models():
            raise ConfigError(f"model.name={name!r} is not a known model; known models: {', '.join(list_models())}")
    init_values = model_cfg.get("init_values")
    if init_values is not None:
        require(float(init_values) >= 0, f"model.init_values={init_values} must be >= 0 (LayerScale; 0 or null: off)")
    norm_eps = model_cfg.get("norm_eps")
    if norm_eps is not None:
        require(float(norm_eps) > 0, f"model.norm_eps={norm_eps} must be > 0 (every LayerNorm's epsilon)")
    kwargs = model_kwargs(model_cfg, num_classes)
    if dynamic_img_size:  # progressive resizing needs it whatever model.dynamic_img_size says
        kwargs["dynamic_img_size"] = True
    arch = pretrained_architecture(model_cfg)
    if arch is not None:
        kwargs = over_timm_architecture(arch, name, kwargs, announce)
    try:
        if arch is not None:
            model = VisionTransformer(ViTConfig(**kwargs))
            # The weights check names the timm model, not config keys, when a file does not fit (vit/weights/fit.py).
            model.timm_name = arch.name
            return model
        return create_model(name, **kwargs)
    except ValueError as err:
        raise ConfigError(f"model.{err}") from err
    except TypeError as err:  # a value of the wrong shape for its argument (a list where a number belongs, ...)
        raise ConfigError(f"model settings do not build {name}: {str(err).strip().splitlines()[0]}") from err


def pretrained_architecture(model_cfg: Mapping) -> TimmArchitecture | None:
    """timm's architecture of `model.pretrained=timm:<name>`, None for any other source (or none). An unknown name
    is a CheckpointError naming the setting; a timm model our ViT does not build, a ConfigError naming what."""
    source = model_cfg.get("pretrained")
    if not isinstance(source, str) or source_kind(source) != "timm":
        return None
    name, setting = source_name(source), f"model.pretrained={source!r}"
    try:
        check_timm_name(name, need_weights=not model_cfg.get("pretrained_file"))
        return timm_architecture(name)
    except PretrainedError as err:
        raise CheckpointError(f"{setting}: {err}") from None
    except ValueError as err:
        raise ConfigError(f"{setting}: {err}") from None


def over_timm_architecture(arch: TimmArchitecture, name: str, kwargs: dict, announce: bool) -> dict[str, Any]:
    """ViTConfig's settings for timm's architecture `arch` with the config's `kwargs` on top where they keep the
    weights fitting. A setting of another value than `model=<name>` builds with (so given by the user or a recipe)
    that cannot stay is named in one log line; so is the architecture used. A record's `name=timm:<name>` has
    timm's architecture for its values, so none of its settings is another value."""
    baseline = dict(arch.settings) if source_kind(name) == "timm" else model_defaults(name)
    valid = {f.name for f in fields(ViTConfig) if f.init}
    settings = {**arch.settings, "lsa": False, "patch_embed": "standard"}
    if kwargs.get("patch_size") == baseline.get("patch_size"):  # not chosen: the registry's 16, timm's instead
        kwargs = {k: v for k, v in kwargs.items() if k != "patch_size"}
    ignored = []
    for key, value in kwargs.items():
        if key in KEPT_OVER_TIMM and key in valid:
            if value is not None or key == "qk_scale":  # None: the default, so timm's (qk_scale: None is a value)
                settings[key] = value
        elif key in settings and value != settings[key] and value != baseline.get(key, value):
            ignored.append(f"model.{key}={value} (timm's: {settings[key]})")
        elif key not in settings and key not in valid and value != baseline.get(key, value):
            ignored.append(f"model.{key}={value} (not a setting of timm's ViT)")
    if announce:
        log.info("model.pretrained=timm:%s: timm's architecture, %s", arch.name, arch.describe())
        if ignored:
            log.warning("model.pretrained=timm:%s fixes the architecture; ignored: %s", arch.name, ", ".join(ignored))
    return settings


def is_timm_named(model_cfg: Mapping) -> bool:
    """Whether `model_cfg` is the record of a model built from a timm name (`model.name=timm:<name>`, named as the
    weight source it came from: built_model_config)."""
    return source_kind(str(model_cfg.get("name") or "")) == "timm"


def model_label(model_cfg: Mapping) -> str:
    """How records and reports name the model `model_cfg` builds: `timm:<name>` for a model built from
    model.pretrained=timm:<name> (its architecture is timm's, whatever model config it was composed with), else
    model.name."""
    source = model_cfg.get("pretrained")
    if not is_timm_named(model_cfg) and isinstance(source, str) and source_kind(source) == "timm":
        return source
    return str(model_cfg.get("name"))


def built_model_config(model_cfg: Mapping) -> dict:
    """The model config a run records (checkpoints, .hydra/model_built.yaml, metrics.json): `model_cfg` (resolved)
    as it is, or with model.pretrained=timm:<name> the model actually built: `name=timm:<name>`, timm's
    architecture in place of the config's own, the settings kept over it as the config gives them. It builds the
    same model again (nothing in it differs from timm's, so nothing is named as ignored), and a record of a record
    is itself."""
    config = dict(model_cfg)
    arch = pretrained_architecture(config)
    if arch is None:
        return config
    settings = over_timm_architecture(arch, str(config.get("name")), model_kwargs(config), announce=False)
    valid = {f.name for f in fields(ViTConfig) if f.init}
    # Another family's keys (a T2T-ViT config composed with a timm name) build nothing: left out of the record.
    record = {k: v for k, v in config.items() if k in valid or k in FINETUNE_MODEL_KEYS}
    return {"name": model_label(config), **record, **settings}


def architecture(model_cfg: Mapping) -> dict:
    """The settings of a (recorded) model config that say what the model is: width, depth, heads, patch and image
    size, and every other key timm's architecture fixes; not the weights' source, rates or class count."""
    return {k: v for k, v in model_cfg.items() if k not in NOT_ARCHITECTURE and k not in FINETUNE_MODEL_KEYS}


def build_mae_from_config(model_cfg: Mapping, mae_cfg: Mapping) -> nn.Module:
    """task=mae: the masked autoencoder around the encoder `model_cfg` describes (vit/models/mae.py)."""
    check_types(OmegaConf.create({"model": dict(model_cfg)}))
    mae = asdict(MaeSettings.of(mae_cfg))  # types and ranges: vit/settings/mae.py
    kwargs = model_kwargs(model_cfg)
    kwargs.pop("num_classes", None)
    try:
        return create_mae(str(model_cfg.get("name")), mae, **kwargs)
    except ValueError as err:
        raise ConfigError(f"task=mae: model.{err}") from err
