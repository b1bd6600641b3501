"""The value types of the composed config's keys: a value that is not a number, a flag or a list of the right
length is named with its key before any range check or constructor sees it. The groups with a settings class
(vit/settings: optim, sched, distill, mae, trainer) are checked by it, types and ranges, from their one
declaration; the tables below still list the model's and data's keys."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from vit.errors import require
from vit.settings import SETTINGS

# The numeric knobs of each config group: a value that is not a number (`model.img_size=abc`) is named as such
# before any range check or constructor sees it. "int" refuses 32.5 and also 32.0 or 1e3 (floats that torch's
# layer constructors would reject later with a traceback); None is allowed where the YAML says null. The model
# comes last: its img_size and num_classes repeat data's (`${data.img_size}`), which are named first.
NUMERIC_KEYS = {
    "data": {
        "int": (
            "img_size",
            "patch_size",
            "num_classes",
            "batch_size",
            "num_workers",
            "limit_train_samples",
            "limit_val_samples",
            "repeated_aug",
            "augment.pad",
            "synthetic.num_train",
            "synthetic.num_val",
            "shuffle_buffer",
            "epoch_samples",
        ),
        "float": (
            "augment.scale_min",
            "augment.re_prob",
            "augment.mixup_alpha",
            "augment.cutmix_alpha",
            "augment.mixup_prob",
            "augment.label_smoothing",
        ),
    },
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
    "data": ("pin_memory", "unlabelled", "download", "scan_images", "augment.hflip"),
}


# Lists of numbers: (key, length); their values' ranges are checked in validate.
NUMBER_LISTS = {
    "data": (("mean", 3), ("std", 3)),
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_types(cfg: DictConfig) -> None:
    """Every numeric knob holds a number (or null): `config error: model.img_size='abc' must be an integer`;
    switches hold true/false, and number lists hold that many numbers."""
    for group, settings in SETTINGS.items():
        if cfg.get(group) is not None:
            settings.check(cfg.get(group))
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
    for group, lists in NUMBER_LISTS.items():
        node = cfg.get(group)
        for key, length in lists if node is not None else ():
            value = OmegaConf.select(node, key, default=None)
            if value is None:
                continue
            values = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
            ok = len(values) == length and all(_is_number(v) for v in values)
            shown = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
            require(ok, f"{group}.{key}={shown!r} must be a list of {length} numbers or null")


def numeric_keys() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every numeric key, by group and kind ("int" or "float"): the tables above and the settings classes' fields."""
    keys = {group: dict(kinds) for group, kinds in NUMERIC_KEYS.items()}
    for group, settings in SETTINGS.items():
        keys[group] = {kind: tuple(_fields_of(settings, base)) for kind, base in (("int", int), ("float", float))}
    return keys


def _fields_of(settings, base: type, prefix: str = ""):
    """The dotted names of a settings class's fields of type `base` (sub-groups' included), parsed ones left out:
    they have a syntax of their own (trainer.budget's durations)."""
    for name, (kind, meta) in settings.kinds().items():
        if kind.nested:
            yield from _fields_of(kind.base, base, f"{prefix}{name}.")
        elif kind.base is base and not kind.choices and not meta.get("parse"):
            yield f"{prefix}{name}"


def number_lists() -> dict[str, tuple[tuple[str, int], ...]]:
    """Every list-of-numbers key with its length: the table above and the settings classes' tuple fields."""
    lists = dict(NUMBER_LISTS)
    for group, settings in SETTINGS.items():
        lists[group] = tuple((name, k.length) for name, (k, _) in settings.kinds().items() if k.base is tuple)
    return lists
