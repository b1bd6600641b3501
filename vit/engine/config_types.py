"""The value types of the composed config's keys: a value that is not a number, a flag or a list of the right
length is named with its key before any range check or constructor sees it. Every group with a settings class
(vit/settings: trainer, data, optim, sched, distill, mae) is checked by it, types and ranges, from its one
declaration (data's class is its dataset's, named in DATASETS); the tables below list the model's keys, whose
defaults are the model families' config classes (vit/models)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from vit.data.sources.registry import DATASETS, data_settings
from vit.errors import require
from vit.settings import SETTINGS

# The numeric knobs of each config group: a value that is not a number (`model.img_size=abc`) is named as such
# before any range check or constructor sees it. "int" refuses 32.5 and also 32.0 or 1e3 (floats that torch's
# layer constructors would reject later with a traceback); None is allowed where the YAML says null. The model
# comes last: its img_size and num_classes repeat data's (`${data.img_size}`), which are named first.
NUMERIC_KEYS = {
    "model": {
        "int": (
            "img_size",
            "patch_size",
            "in_chans",
            "num_classes",
            "embed_dim",
            "depth",
            "num_heads",
            "token_dim",
            "reg_tokens",
        ),
        "float": (
            "mlp_ratio",
            "qk_scale",
            "drop_rate",
            "attn_drop_rate",
            "drop_path_rate",
            "init_values",
            "rope_temperature",
        ),
    },
}


# Switches: `trainer.ema=maybe` would otherwise count as true (a non-empty string).
BOOL_KEYS = {
    "model": (
        "qkv_bias",
        "lsa",
        "pretrained_ema",
        "distill_token",
        "qk_norm",
        "dynamic_img_size",
        "class_token",
        "no_embed_class",
        "fc_norm",
    ),
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_types(cfg: DictConfig) -> None:
    """Every numeric knob holds a number (or null): `config error: model.img_size='abc' must be an integer`;
    switches hold true/false, and number lists hold that many numbers."""
    for group, settings in SETTINGS.items():
        if cfg.get(group) is not None:
            settings.check(cfg.get(group))
    if cfg.get("data") is not None:  # before the model, whose img_size and num_classes repeat data's
        data_settings(cfg.data.get("name")).check(cfg.data)
    for group, kinds in NUMERIC_KEYS.items():
        node = cfg.get(group)
        if node is None:
            continue
        for kind, keys in kinds.items():
            for key in keys:
                value = OmegaConf.select(node, key, default=None)
                if value is None:
                    continue
                if kind == "int":
                    require(
                        isinstance(value, int) and not isinstance(value, bool),
                        f"{group}.{key}={value!r} must be an integer",
                    )
                else:
                    require(_is_number(value), f"{group}.{key}={value!r} must be a number")
    for group, keys in BOOL_KEYS.items():
        node = cfg.get(group)
        for key in keys if node is not None else ():
            value = OmegaConf.select(node, key, default=None)
            require(value is None or isinstance(value, bool), f"{group}.{key}={value!r} must be true or false")


def numeric_keys() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every numeric key, by group and kind ("int" or "float"): the model's table above, the settings classes'
    fields, and data's over every dataset's class."""
    keys = {group: dict(kinds) for group, kinds in NUMERIC_KEYS.items()}
    for group, settings in _group_classes():
        for kind, base in (("int", int), ("float", float)):
            keys.setdefault(group, {}).setdefault(kind, ())
            keys[group][kind] += tuple(k for k in _fields_of(settings, base) if k not in keys[group][kind])
    return keys


def _group_classes():
    yield from SETTINGS.items()
    for source in DATASETS.values():
        yield "data", source.settings


def _fields_of(settings, base: type, prefix: str = ""):
    """The dotted names of a settings class's fields of type `base` (sub-groups' included), parsed ones left out:
    they have a syntax of their own (trainer.budget's durations)."""
    for name, (kind, meta) in settings.kinds().items():
        if kind.nested:
            yield from _fields_of(kind.base, base, f"{prefix}{name}.")
        elif kind.base is base and not kind.choices and not meta.get("parse"):
            yield f"{prefix}{name}"


def number_lists() -> dict[str, tuple[tuple[str, int], ...]]:
    """Every list-of-numbers key with its length: the settings classes' tuple fields."""
    lists: dict[str, tuple[tuple[str, int], ...]] = {}
    for group, settings in _group_classes():
        found = tuple((name, k.length) for name, (k, _) in settings.kinds().items() if k.base is tuple)
        lists[group] = tuple(dict.fromkeys(lists.get(group, ()) + found))
    return lists
