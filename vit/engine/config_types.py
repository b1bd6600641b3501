"""The value types of the composed config's keys: a value that is not a number, a flag or a list of the right
length is named with its key before any range check or constructor sees it."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from vit.errors import require

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
    "optim": {
        "int": ("lr_batch",),
        "float": ("lr", "weight_decay", "weight_decay_end", "eps", "momentum", "layer_decay"),
    },
    "sched": {"int": (), "float": ("warmup_epochs", "warmup_lr_init", "min_lr")},
    "trainer": {
        "int": (
            "epochs",
            "seed",
            "accum_steps",
            "limit_train_batches",
            "limit_val_batches",
            "log_every_n_steps",
            "attn_maps_every_n_epochs",
            "recon_images_every_n_epochs",
            "stop_after_epoch",
            "max_bad_steps",
            "val_every_n_epochs",
            "keep_last",
            "progressive_resize.min_size",
        ),
        "float": ("grad_clip", "ema_decay", "progressive_resize.start", "progressive_resize.end"),
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
    "distill": {"int": ("teacher_img_size",), "float": ("alpha", "tau")},
    "mae": {"int": ("decoder_embed_dim", "decoder_depth", "decoder_num_heads"), "float": ("mask_ratio",)},
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
    "distill": ("teacher_ema",),
    "mae": ("norm_pix_loss",),
    "data": ("pin_memory", "unlabelled", "download", "scan_images", "augment.hflip"),
    "trainer": ("deterministic", "ema", "ema_warmup", "save_checkpoints", "eval_flip", "grad_checkpointing"),
}


# Lists of numbers: (key, length); their values' ranges are checked in validate.
NUMBER_LISTS = {
    "optim": (("betas", 2),),
    "data": (("mean", 3), ("std", 3)),
    "distill": (("teacher_mean", 3), ("teacher_std", 3)),
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_types(cfg: DictConfig) -> None:
    """Every numeric knob holds a number (or null): `config error: model.img_size='abc' must be an integer`;
    switches hold true/false, and number lists hold that many numbers."""
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
