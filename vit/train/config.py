"""Checking a composed config before any data is touched: one readable message naming the key and value."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from vit.data.augment.spec import AugmentSpec
from vit.data.errors import DataError
from vit.data.loading.build import LOADERS
from vit.data.sources.archive import is_archive
from vit.data.sources.registry import DATASETS
from vit.data.sources.splits import parse_holdout
from vit.errors import UserError
from vit.models import create_mae, create_model, list_models
from vit.train.finetune import FREEZE_MODES
from vit.train.precision import AMP_MODES


class ConfigError(UserError):
    """A setting that cannot work. The trainer prints it and exits with code 2."""

    kind = "config"


DEVICES = ("auto", "cpu", "cuda")
PROGRESS = ("auto", "bar", "log")
COMPILE_SCOPES = ("model", "blocks")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "constant")
DISTILL_TYPES = ("none", "hard", "soft")
TASKS = ("classify", "mae")
MAE_KEYS = ("mask_ratio", "decoder_embed_dim", "decoder_depth", "decoder_num_heads", "norm_pix_loss")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


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
                    _require(
                        isinstance(value, int) and not isinstance(value, bool),
                        f"{group}.{key}={value!r} must be an integer",
                    )
                else:
                    _require(_is_number(value), f"{group}.{key}={value!r} must be a number")
    for group, keys in BOOL_KEYS.items():
        node = cfg.get(group)
        for key in keys if node is not None else ():
            value = OmegaConf.select(node, key, default=None)
            _require(value is None or isinstance(value, bool), f"{group}.{key}={value!r} must be true or false")
    for group, lists in NUMBER_LISTS.items():
        node = cfg.get(group)
        for key, length in lists if node is not None else ():
            value = OmegaConf.select(node, key, default=None)
            if value is None:
                continue
            values = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
            ok = len(values) == length and all(_is_number(v) for v in values)
            shown = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
            _require(ok, f"{group}.{key}={shown!r} must be a list of {length} numbers or null")


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
        _require(float(init_values) >= 0, f"model.init_values={init_values} must be >= 0 (LayerScale; 0 or null: off)")
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


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=auto or cpu")
    return torch.device(setting)


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first impossible setting. The model itself is checked by building it."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # an interpolation that points nowhere
        raise ConfigError(f"config cannot be resolved: {err}") from err
    check_types(cfg)
    check_task(cfg)
    check_data(cfg)
    check_optim(cfg.optim)
    check_finetune(cfg)
    check_distill(cfg)
    check_sched(cfg.sched, cfg.optim)
    check_trainer(cfg.trainer)
    check_progressive_resize(cfg)
    resolve_device(cfg.trainer.device)


def check_data(cfg: DictConfig) -> None:
    data = cfg.data
    _require(data.name in DATASETS, f"data.name={data.name!r} must be one of {tuple(DATASETS)}")
    _require(int(data.img_size) > 0, f"data.img_size={data.img_size} must be positive")
    _require(int(data.batch_size) > 0, f"data.batch_size={data.batch_size} must be positive")
    if data.get("patch_size") is not None:
        _require(int(data.patch_size) > 0, f"data.patch_size={data.patch_size} must be positive")
    try:
        parse_holdout(data.get("holdout"))
    except DataError as err:
        raise ConfigError(str(err)) from None
    if data.get("std") is not None:
        _require(all(float(v) > 0 for v in data.std), f"data.std={list(data.std)} must be > 0 in every channel")
    if DATASETS[data.name].needs_root:
        _require(data.root is not None, f"data.root is not set: data={data.name} needs data.root=<folder or archive>")
        root = Path(str(data.root)).expanduser()
        _require(root.is_dir() or is_archive(root), f"data.root={str(data.root)!r} does not exist")
    try:
        AugmentSpec.from_config(data.get("augment"))
    except DataError as err:
        raise ConfigError(str(err)) from None
    _require(data.loader in LOADERS, f"data.loader={data.loader!r} must be one of {LOADERS}")
    if data.get("num_workers") is not None:
        _require(int(data.num_workers) >= 0, f"data.num_workers={data.num_workers} must be >= 0 or null")
    if data.get("num_classes") is not None:
        _require(int(data.num_classes) >= 1, f"data.num_classes={data.num_classes} must be >= 1 or null")
    model_classes = cfg.model.get("num_classes")
    if model_classes is not None and data.get("num_classes") is not None and not is_mae(cfg):
        # Fewer outputs than classes: the loss would fail on the first label the head has no output for.
        _require(
            int(model_classes) >= int(data.num_classes),
            f"model.num_classes={model_classes} is less than data.num_classes={data.num_classes}: training needs "
            "an output per class (null: the data's count)",
        )
    repeats = data.get("repeated_aug")
    _require(repeats is None or int(repeats) >= 1, f"data.repeated_aug={repeats} must be >= 1 (1: off)")
    for key in ("limit_train_samples", "limit_val_samples"):
        value = data.get(key)
        _require(value is None or int(value) >= 1, f"data.{key}={value} must be >= 1 or null")
    for key in ("num_train", "num_val"):
        value = (data.get("synthetic") or {}).get(key)
        _require(value is None or int(value) >= 1, f"data.synthetic.{key}={value} must be >= 1")
    buffer, samples = data.get("shuffle_buffer"), data.get("epoch_samples")
    _require(buffer is None or int(buffer) >= 0, f"data.shuffle_buffer={buffer} must be >= 0 (0 or 1: no buffer)")
    _require(samples is None or int(samples) >= 1, f"data.epoch_samples={samples} must be >= 1 or null")


def check_task(cfg: DictConfig) -> None:
    """`task`: classify or mae. Masked-autoencoder pretraining reads no labels and has no head, so the settings
    that act on labels or on a head are refused by name rather than ignored."""
    task = cfg.get("task", "classify")
    _require(task in TASKS, f"task={task!r} must be one of {TASKS}")
    if task != "mae":
        _require(cfg.get("mae") is None, "mae.* settings are given but task=classify: add task=mae to pretrain")
        _require(
            not cfg.data.get("unlabelled"),
            "data.unlabelled=true reads no labels, which a classifier needs: it is for task=mae",
        )
        return
    mae = cfg.get("mae")
    _require(mae is not None, "task=mae needs the mae.* settings: select it with task=mae (configs/task/mae.yaml)")
    missing = [k for k in MAE_KEYS if mae.get(k) is None]
    _require(not missing, f"mae.{missing[0] if missing else ''} is not set (task=mae needs {', '.join(MAE_KEYS)})")
    ratio = float(mae.mask_ratio)
    _require(0.0 < ratio < 1.0, f"mae.mask_ratio={mae.mask_ratio} must be in (0, 1)")
    for key in ("decoder_embed_dim", "decoder_depth", "decoder_num_heads"):
        _require(int(mae[key]) >= 1, f"mae.{key}={mae[key]} must be >= 1")
    _require(
        int(mae.decoder_embed_dim) % int(mae.decoder_num_heads) == 0,
        f"mae.decoder_num_heads={mae.decoder_num_heads} must divide mae.decoder_embed_dim={mae.decoder_embed_dim}",
    )
    model, augment = cfg.model, cfg.data.get("augment") or {}
    name = str(model.get("name"))
    _require(
        not name.startswith("t2t"),
        f"task=mae: model.name={name!r} is a T2T-ViT, whose soft split has no patches to hide; use a ViT config",
    )
    pos = model.get("pos_embed")
    _require(
        pos not in ("rope", "rope_mixed"),
        f"task=mae: model.pos_embed={pos!r} is not supported: the masked encoder adds a position table to the "
        "patches it keeps (sincos2d, learned or sinusoidal)",
    )
    _require(
        model.get("global_pool", "token") == "token",
        f"task=mae: model.global_pool={model.get('global_pool')!r}: the pretrained encoder ends in its norm and has "
        "no head; choose the pooling when fine-tuning",
    )
    for key in ("mixup_alpha", "cutmix_alpha", "label_smoothing"):
        value = augment.get(key) or 0.0
        _require(float(value) == 0.0, f"task=mae reads no labels: data.augment.{key}={value} must be 0")
    dcfg = cfg.get("distill") or {}
    _require(
        dcfg.get("type", "none") == "none", f"task=mae has no classifier to distil: distill.type={dcfg.get('type')}"
    )
    _require(
        not cfg.trainer.get("eval_flip"), "task=mae evaluates the reconstruction: trainer.eval_flip=true is unused"
    )
    attn_every = cfg.trainer.get("attn_maps_every_n_epochs") or 0
    _require(
        int(attn_every) == 0,
        f"task=mae: trainer.attn_maps_every_n_epochs={attn_every} must be 0 (the masked encoder has no whole-image "
        "attention to draw; trainer.recon_images_every_n_epochs draws its reconstructions)",
    )
    resize = cfg.trainer.get("progressive_resize") or {}
    _require(
        resize.get("min_size") is None,
        "task=mae: trainer.progressive_resize is not supported (the decoder's table is built for one size)",
    )


def check_optim(optim: DictConfig) -> None:
    _require(optim.name in OPTIMIZERS, f"optim.name={optim.name!r} must be one of {OPTIMIZERS}")
    _require(float(optim.lr) > 0, f"optim.lr={optim.lr} must be > 0")
    _require(float(optim.weight_decay) >= 0, f"optim.weight_decay={optim.weight_decay} must be >= 0")
    if optim.get("weight_decay_end") is not None:
        _require(float(optim.weight_decay_end) >= 0, f"optim.weight_decay_end={optim.weight_decay_end} must be >= 0")
    if optim.get("lr_batch") is not None:
        _require(int(optim.lr_batch) >= 1, f"optim.lr_batch={optim.lr_batch} must be >= 1")
    if optim.get("eps") is not None:
        _require(float(optim.eps) > 0, f"optim.eps={optim.eps} must be > 0")
    if optim.get("momentum") is not None:
        _require(0.0 <= float(optim.momentum) < 1.0, f"optim.momentum={optim.momentum} must be in [0, 1)")
    if optim.get("betas") is not None:
        betas = list(optim.betas)
        _require(all(0.0 <= float(b) < 1.0 for b in betas), f"optim.betas={betas} must both be in [0, 1)")


def check_sched(sched: DictConfig, optim: DictConfig) -> None:
    _require(sched.name in SCHEDULES, f"sched.name={sched.name!r} must be one of {SCHEDULES}")
    _require(float(sched.warmup_epochs) >= 0, f"sched.warmup_epochs={sched.warmup_epochs} must be >= 0")
    for key in ("warmup_lr_init", "min_lr"):
        value = sched.get(key)
        _require(value is None or float(value) >= 0, f"sched.{key}={value} must be >= 0")
    if sched.get("min_lr") is not None:
        # The cosine would climb from the peak up to min_lr. (Compared with optim.lr as configured, before the
        # batch-size scaling.)
        _require(
            float(sched.min_lr) <= float(optim.lr),
            f"sched.min_lr={sched.min_lr} must be <= optim.lr={optim.lr} (the schedule decays towards it)",
        )


def check_trainer(trainer: DictConfig) -> None:
    _require(int(trainer.epochs) > 0, f"trainer.epochs={trainer.epochs} must be positive")
    _require(0 <= int(trainer.seed) < 2**32, f"trainer.seed={trainer.seed} must be in [0, 2**32)")
    _require(trainer.amp in AMP_MODES, f"trainer.amp={trainer.amp!r} must be one of {AMP_MODES}")
    threads = trainer.get("threads", "auto")
    _require(
        threads == "auto" or (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1),
        f"trainer.threads={threads!r} must be auto or a whole number >= 1",
    )
    _require(trainer.device in DEVICES, f"trainer.device={trainer.device!r} must be one of {DEVICES}")
    _require(
        trainer.compile in (True, False, "auto"), f"trainer.compile={trainer.compile!r} must be true, false or auto"
    )
    _require(trainer.progress in PROGRESS, f"trainer.progress={trainer.progress!r} must be one of {PROGRESS}")
    scope = trainer.compile_scope
    _require(scope in COMPILE_SCOPES, f"trainer.compile_scope={scope!r} must be one of {COMPILE_SCOPES}")
    _require(int(trainer.accum_steps) >= 1, f"trainer.accum_steps={trainer.accum_steps} must be >= 1")
    _require(int(trainer.log_every_n_steps) >= 1, f"trainer.log_every_n_steps={trainer.log_every_n_steps} must be >= 1")
    _require(0.0 < float(trainer.ema_decay) < 1.0, f"trainer.ema_decay={trainer.ema_decay} must be in (0, 1)")
    if trainer.grad_clip is not None:
        _require(float(trainer.grad_clip) > 0, f"trainer.grad_clip={trainer.grad_clip} must be > 0 or null")
    _require(int(trainer.max_bad_steps) >= 1, f"trainer.max_bad_steps={trainer.max_bad_steps} must be >= 1")
    val_every = trainer.get("val_every_n_epochs")
    _require(val_every is None or int(val_every) >= 1, f"trainer.val_every_n_epochs={val_every} must be >= 1")
    attn_every = trainer.get("attn_maps_every_n_epochs")
    _require(attn_every is None or int(attn_every) >= 0, f"trainer.attn_maps_every_n_epochs={attn_every} must be >= 0")
    recon_every = trainer.get("recon_images_every_n_epochs")
    _require(
        recon_every is None or int(recon_every) >= 0,
        f"trainer.recon_images_every_n_epochs={recon_every} must be >= 0",
    )
    for key in ("limit_train_batches", "limit_val_batches", "stop_after_epoch"):
        value = trainer.get(key)
        _require(value is None or int(value) >= 1, f"trainer.{key}={value} must be >= 1 or null")
    keep = trainer.keep_last
    _require(keep is None or int(keep) >= 1, f"trainer.keep_last={keep} must be >= 1 or null (null: no epoch files)")
    resume = trainer.resume
    if resume not in (None, "auto"):
        _require(Path(str(resume)).is_file(), f"trainer.resume={str(resume)!r}: no such checkpoint file")


def check_finetune(cfg: DictConfig) -> None:
    """`model.pretrained` (a source string or null), `model.freeze` and `optim.layer_decay`; whether the source
    can be read and fits the model is checked when the run reads it (vit/train/finetune.py), still before data."""
    source = cfg.model.get("pretrained")
    _require(
        source is None or (isinstance(source, str) and source.strip() != "" and source != "timm:"),
        f"model.pretrained={source!r} must be null, timm:<model name> or a path to a weight file",
    )
    mode = cfg.model.get("freeze", "none")
    _require(mode in FREEZE_MODES, f"model.freeze={mode!r} must be one of {FREEZE_MODES}")
    decay = cfg.optim.get("layer_decay")
    _require(decay is None or 0.0 < float(decay) <= 1.0, f"optim.layer_decay={decay} must be in (0, 1] or null")


def check_distill(cfg: DictConfig) -> None:
    """`distill.*`: the type, alpha in [0, 1], tau > 0, and a teacher exactly when a distillation type needs one.
    Whether the teacher can be read and fits the data is checked when the run loads it (vit/train/distill.py)."""
    dcfg = cfg.get("distill")
    if dcfg is None:
        return
    kind, teacher = dcfg.type, dcfg.teacher  # the defaults: configs/distill/default.yaml
    _require(kind in DISTILL_TYPES, f"distill.type={kind!r} must be one of {DISTILL_TYPES}")
    alpha, tau = float(dcfg.alpha), float(dcfg.tau)
    _require(0.0 <= alpha <= 1.0, f"distill.alpha={alpha} must be in [0, 1] (the distillation loss's weight)")
    _require(tau > 0.0, f"distill.tau={tau} must be > 0 (the soft distillation's temperature)")
    _require(
        teacher is None or (isinstance(teacher, str) and teacher.strip() not in ("", "timm:")),
        f"distill.teacher={teacher!r} must be null, timm:<model name> or a path to a weight file",
    )
    if kind != "none":
        _require(teacher is not None, f"distill.type={kind} needs a teacher: set distill.teacher=<source>")
    else:
        _require(
            teacher is None, f"distill.teacher={teacher!r} is set but distill.type=none: set distill.type=hard or soft"
        )
    size = dcfg.get("teacher_img_size")
    _require(size is None or int(size) > 0, f"distill.teacher_img_size={size} must be positive or null")
    std = dcfg.get("teacher_std")
    _require(std is None or all(float(v) > 0 for v in std), f"distill.teacher_std={std} must be > 0 in every channel")


def check_progressive_resize(cfg: DictConfig) -> None:
    """`trainer.progressive_resize`: a ViT, a first size that is a whole number of patches below the full size,
    and a ramp inside the run."""
    setting = cfg.trainer.get("progressive_resize")
    if not setting or setting.get("min_size") is None:
        return
    key = "trainer.progressive_resize"
    min_size, full = int(setting.min_size), int(cfg.data.img_size)
    patch = cfg.model.get("patch_size")
    _require(
        str(cfg.model.get("name", "")).startswith("vit"),
        f"{key}.min_size={min_size} needs a ViT model, not model.name={cfg.model.get('name')!r}: T2T-ViT's soft "
        "split and position table are built for one image size",
    )
    _require(0 < min_size <= full, f"{key}.min_size={min_size} must be in [1, data.img_size={full}]")
    if patch is not None:
        _require(
            min_size % int(patch) == 0,
            f"{key}.min_size={min_size} must be a multiple of model.patch_size={patch} (whole patches)",
        )
    start, end = float(setting.start), float(setting.end)
    _require(
        0.0 <= start <= end <= 1.0,
        f"{key}.start={start} and {key}.end={end} must satisfy 0 <= start <= end <= 1 (fractions of trainer.epochs)",
    )
