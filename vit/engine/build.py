"""A model from the config's `model` group (and `mae` group for task=mae): `create_model` with the config's keys,
a bad value named as `model.<key>`. Training, evaluation, export and the analysis tools all build models here."""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf
from torch import nn

from vit.engine.config_types import check_types
from vit.errors import ConfigError, require
from vit.models import create_mae, create_model, list_models

MAE_KEYS = ("mask_ratio", "decoder_embed_dim", "decoder_depth", "decoder_num_heads", "norm_pix_loss")


# Model keys that say how a run starts (vit/train/finetune.py), not how the model is built.
FINETUNE_MODEL_KEYS = ("pretrained", "pretrained_ema", "freeze")


def model_kwargs(model_cfg: Mapping, num_classes: int | None = None) -> dict:
    kwargs = {k: v for k, v in dict(model_cfg).items() if k != "name" and k not in FINETUNE_MODEL_KEYS}
    if kwargs.get("num_classes") is None and num_classes is not None:
        kwargs["num_classes"] = num_classes
    return kwargs


def build_model_from_config(
    model_cfg: Mapping, num_classes: int | None = None, dynamic_img_size: bool = False
) -> nn.Module:
    """`create_model` with the config's keys; a bad value becomes a ConfigError naming `model.<key>`.
    `dynamic_img_size`: a ViT that also takes other image sizes (progressive resizing), as `model.dynamic_img_size`."""
    name = model_cfg.get("name")
    check_types(OmegaConf.create({"model": dict(model_cfg)}))
    if name not in list_models():
        raise ConfigError(f"model.name={name!r} is not a known model; known models: {', '.join(list_models())}")
    init_values = model_cfg.get("init_values")
    if init_values is not None:
        require(float(init_values) >= 0, f"model.init_values={init_values} must be >= 0 (LayerScale; 0 or null: off)")
    kwargs = model_kwargs(model_cfg, num_classes)
    if dynamic_img_size:  # progressive resizing needs it whatever model.dynamic_img_size says
        kwargs["dynamic_img_size"] = True
    try:
        return create_model(name, **kwargs)
    except ValueError as err:
        raise ConfigError(f"model.{err}") from err
    except TypeError as err:  # a value of the wrong shape for its argument (a list where a number belongs, ...)
        raise ConfigError(f"model settings do not build {name}: {str(err).strip().splitlines()[0]}") from err


def build_mae_from_config(model_cfg: Mapping, mae_cfg: Mapping) -> nn.Module:
    """task=mae: the masked autoencoder around the encoder `model_cfg` describes (vit/models/mae.py)."""
    check_types(OmegaConf.create({"model": dict(model_cfg), "mae": dict(mae_cfg)}))
    kwargs = model_kwargs(model_cfg)
    kwargs.pop("num_classes", None)
    try:
        return create_mae(str(model_cfg.get("name")), {k: mae_cfg[k] for k in MAE_KEYS}, **kwargs)
    except ValueError as err:
        raise ConfigError(f"task=mae: model.{err}") from err


def is_mae(cfg: Mapping) -> bool:
    return cfg.get("task", "classify") == "mae"
