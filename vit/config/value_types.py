"""The value types of the composed config's keys: a value that is not a number, a flag or a list of the right
length is named with its key before any range check or constructor sees it. Every group with a settings class
(vit/settings: trainer, data, optim, sched, distill, mae, search; the root's task and optimized_metric) is checked
by it, types and ranges, from its one declaration (data's class is its dataset's, named in DATASETS); the model's
numbers and switches are typed by its family's config class (vit/models)."""

from __future__ import annotations

import typing
from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from vit.data.sources.registry import data_settings
from vit.errors import require
from vit.models.registry import MODELS
from vit.settings import SETTINGS, RunSettings
from vit.settings.model_start import ModelStartSettings
from vit.settings.schema import Kind


def model_kinds(name) -> dict[str, Kind]:
    """The numbers and switches of model `name`'s config class, by field (an unknown name: none; building it names
    the name). Choices and ranges are the class's own checks, when the model is built."""
    entry = MODELS.get(str(name))
    if entry is None:
        return {}
    hints = typing.get_type_hints(entry.config)
    kinds = {f.name: Kind.of(hints[f.name]) for f in fields(entry.config) if f.init}
    return {key: kind for key, kind in kinds.items() if kind.base in (bool, int, float) and not kind.choices}


def check_types(cfg: DictConfig) -> None:
    """Every numeric knob holds a number (or null): `config error: model.img_size='abc' must be an integer`;
    switches hold true/false, and number lists hold that many numbers."""
    RunSettings.check(cfg)  # the root's own keys: task, optimized_metric
    for group, settings in SETTINGS.items():
        if cfg.get(group) is not None:
            settings.check(cfg.get(group))
    if cfg.get("data") is not None:  # before the model, whose img_size and num_classes repeat data's
        data_settings(cfg.data.get("name")).check(cfg.data)
    model = cfg.get("model")
    if model is not None:  # last: its img_size and num_classes repeat data's (`${data.img_size}`), named first
        for key, kind in model_kinds(model.get("name")).items():
            value = OmegaConf.select(model, key, default=None)
            problem = kind.problem(value) if value is not None else None
            require(problem is None, f"model.{key}={value!r} {problem}")
        ModelStartSettings.check(model)  # the keys that say how the model starts: pretrained, freeze, ...
