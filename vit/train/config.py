"""Checking a composed config before any data is touched: one readable message naming the key and value."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vit.data.augment.spec import AugmentSpec
from vit.data.errors import DataError
from vit.data.loading.build import LOADERS, RENAMED_LOADERS
from vit.data.sources.archive import is_archive
from vit.data.sources.registry import DATASETS
from vit.data.sources.splits import parse_holdout
from vit.engine.config_types import check_types
from vit.engine.device import AMP_MODES, resolve_device
from vit.engine.tasks import CONFIG_TASKS, task_of
from vit.engine.weights import names_a_source
from vit.errors import ConfigError, require
from vit.train.budget import parse_budget
from vit.train.finetune import FREEZE_MODES

DEVICES = ("auto", "cpu", "cuda")
PROGRESS = ("auto", "bar", "log")
COMPILE_SCOPES = ("model", "blocks")
SCHEDULES = ("cosine", "constant")
DISTILL_TYPES = ("none", "hard", "soft")


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
    require(data.name in DATASETS, f"data.name={data.name!r} must be one of {tuple(DATASETS)}")
    require(int(data.img_size) > 0, f"data.img_size={data.img_size} must be positive")
    require(int(data.batch_size) > 0, f"data.batch_size={data.batch_size} must be positive")
    if data.get("patch_size") is not None:
        require(int(data.patch_size) > 0, f"data.patch_size={data.patch_size} must be positive")
    try:
        parse_holdout(data.get("holdout"))
    except DataError as err:
        raise ConfigError(str(err)) from None
    if data.get("std") is not None:
        require(all(float(v) > 0 for v in data.std), f"data.std={list(data.std)} must be > 0 in every channel")
    if DATASETS[data.name].needs_root:
        require(data.root is not None, f"data.root is not set: data={data.name} needs data.root=<folder or archive>")
        root = Path(str(data.root)).expanduser()
        require(root.is_dir() or is_archive(root), f"data.root={str(data.root)!r} does not exist")
    try:
        AugmentSpec.from_config(data.get("augment"))
    except DataError as err:
        raise ConfigError(str(err)) from None
    require(data.loader in (*LOADERS, *RENAMED_LOADERS), f"data.loader={data.loader!r} must be one of {LOADERS}")
    if data.get("num_workers") is not None:
        require(int(data.num_workers) >= 0, f"data.num_workers={data.num_workers} must be >= 0 or null")
    if data.get("num_classes") is not None:
        require(int(data.num_classes) >= 1, f"data.num_classes={data.num_classes} must be >= 1 or null")
    model_classes = cfg.model.get("num_classes")
    if model_classes is not None and data.get("num_classes") is not None and task_of(cfg).classifier:
        # Fewer outputs than classes: the loss would fail on the first label the head has no output for.
        require(
            int(model_classes) >= int(data.num_classes),
            f"model.num_classes={model_classes} is less than data.num_classes={data.num_classes}: training needs "
            "an output per class (null: the data's count)",
        )
    repeats = data.get("repeated_aug")
    require(repeats is None or int(repeats) >= 1, f"data.repeated_aug={repeats} must be >= 1 (1: off)")
    for key in ("limit_train_samples", "limit_val_samples"):
        value = data.get(key)
        require(value is None or int(value) >= 1, f"data.{key}={value} must be >= 1 or null")
    for key in ("num_train", "num_val"):
        value = (data.get("synthetic") or {}).get(key)
        require(value is None or int(value) >= 1, f"data.synthetic.{key}={value} must be >= 1")
    buffer, samples = data.get("shuffle_buffer"), data.get("epoch_samples")
    require(buffer is None or int(buffer) >= 0, f"data.shuffle_buffer={buffer} must be >= 0 (0 or 1: no buffer)")
    require(samples is None or int(samples) >= 1, f"data.epoch_samples={samples} must be >= 1 or null")


def check_task(cfg: DictConfig) -> None:
    """`task`: classify or mae; then the task's own checks (vit/engine/tasks/): settings that act on labels or a
    head are refused by name with task=mae rather than ignored, mae.* settings without it."""
    task = cfg.get("task", "classify")
    require(task in CONFIG_TASKS, f"task={task!r} must be one of {CONFIG_TASKS}")
    task_of(cfg).check(cfg)


# Keys of optim.kwargs that are not the optimizer's: the settings optim.* has a key for, and the parameter grouping
# of timm's factory (create_optimizer_v2), which would ignore them since vit/train/optimizer.py passes its own groups.
OPTIM_KEYS = ("lr", "weight_decay", "momentum", "betas", "eps", "layer_decay")
FACTORY_KEYS = (
    "model_or_params",
    "opt",
    "filter_bias_and_bn",
    "fallback_list",
    "fallback_no_weight_decay",
    "layer_decay_min_scale",
    "layer_decay_no_opt_scale",
    "param_group_fn",
)


def check_optim(optim: DictConfig) -> None:
    """`optim.name`: any optimizer of timm's registry (timm.optim.list_optimizers()) that one backward pass per
    step can drive; the keys the optimizer shares with every other are range-checked here, optim.kwargs by the
    optimizer's constructor (vit/train/optimizer.py names a keyword it does not take)."""
    from timm.optim import get_optimizer_info, list_optimizers

    known = list_optimizers()
    require(
        optim.name in known, f"optim.name={optim.name!r} is not an optimizer timm knows; one of: {', '.join(known)}"
    )
    require(
        not get_optimizer_info(optim.name).second_order,
        f"optim.name={optim.name} is a second-order optimizer (its step needs the gradients' own graph, "
        "backward(create_graph=True)), which this trainer's step does not build",
    )
    kwargs = optim.get("kwargs")
    require(kwargs is None or isinstance(kwargs, DictConfig), f"optim.kwargs={kwargs!r} must be a mapping or null")
    for key in kwargs or {}:
        require(key not in OPTIM_KEYS, f"optim.kwargs.{key}: set optim.{key} instead")
        require(
            key not in FACTORY_KEYS,
            f"optim.kwargs.{key} is timm's parameter grouping, which the trainer does itself (vit/train/optimizer.py)",
        )
    require(float(optim.lr) > 0, f"optim.lr={optim.lr} must be > 0")
    require(float(optim.weight_decay) >= 0, f"optim.weight_decay={optim.weight_decay} must be >= 0")
    if optim.get("weight_decay_end") is not None:
        require(float(optim.weight_decay_end) >= 0, f"optim.weight_decay_end={optim.weight_decay_end} must be >= 0")
    if optim.get("lr_batch") is not None:
        require(int(optim.lr_batch) >= 1, f"optim.lr_batch={optim.lr_batch} must be >= 1")
    if optim.get("eps") is not None:
        require(float(optim.eps) > 0, f"optim.eps={optim.eps} must be > 0")
    if optim.get("momentum") is not None:
        require(0.0 <= float(optim.momentum) < 1.0, f"optim.momentum={optim.momentum} must be in [0, 1)")
    if optim.get("betas") is not None:
        betas = list(optim.betas)
        require(all(0.0 <= float(b) < 1.0 for b in betas), f"optim.betas={betas} must both be in [0, 1)")


def check_sched(sched: DictConfig, optim: DictConfig) -> None:
    require(sched.name in SCHEDULES, f"sched.name={sched.name!r} must be one of {SCHEDULES}")
    require(float(sched.warmup_epochs) >= 0, f"sched.warmup_epochs={sched.warmup_epochs} must be >= 0")
    for key in ("warmup_lr_init", "min_lr"):
        value = sched.get(key)
        require(value is None or float(value) >= 0, f"sched.{key}={value} must be >= 0")
    if sched.get("min_lr") is not None:
        # The cosine would climb from the peak up to min_lr. (Compared with optim.lr as configured, before the
        # batch-size scaling.)
        require(
            float(sched.min_lr) <= float(optim.lr),
            f"sched.min_lr={sched.min_lr} must be <= optim.lr={optim.lr} (the schedule decays towards it)",
        )


def check_trainer(trainer: DictConfig) -> None:
    require(int(trainer.epochs) > 0, f"trainer.epochs={trainer.epochs} must be positive")
    parse_budget(trainer.get("budget"))  # a ConfigError naming the value
    require(0 <= int(trainer.seed) < 2**32, f"trainer.seed={trainer.seed} must be in [0, 2**32)")
    require(trainer.amp in AMP_MODES, f"trainer.amp={trainer.amp!r} must be one of {AMP_MODES}")
    threads = trainer.get("threads", "auto")
    require(
        threads == "auto" or (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1),
        f"trainer.threads={threads!r} must be auto or a whole number >= 1",
    )
    require(trainer.device in DEVICES, f"trainer.device={trainer.device!r} must be one of {DEVICES}")
    require(
        trainer.compile in (True, False, "auto"), f"trainer.compile={trainer.compile!r} must be true, false or auto"
    )
    require(trainer.progress in PROGRESS, f"trainer.progress={trainer.progress!r} must be one of {PROGRESS}")
    scope = trainer.compile_scope
    require(scope in COMPILE_SCOPES, f"trainer.compile_scope={scope!r} must be one of {COMPILE_SCOPES}")
    require(int(trainer.accum_steps) >= 1, f"trainer.accum_steps={trainer.accum_steps} must be >= 1")
    require(int(trainer.log_every_n_steps) >= 1, f"trainer.log_every_n_steps={trainer.log_every_n_steps} must be >= 1")
    require(0.0 < float(trainer.ema_decay) < 1.0, f"trainer.ema_decay={trainer.ema_decay} must be in (0, 1)")
    if trainer.grad_clip is not None:
        require(float(trainer.grad_clip) > 0, f"trainer.grad_clip={trainer.grad_clip} must be > 0 or null")
    require(int(trainer.max_bad_steps) >= 1, f"trainer.max_bad_steps={trainer.max_bad_steps} must be >= 1")
    val_every = trainer.get("val_every_n_epochs")
    require(val_every is None or int(val_every) >= 1, f"trainer.val_every_n_epochs={val_every} must be >= 1")
    attn_every = trainer.get("attn_maps_every_n_epochs")
    require(attn_every is None or int(attn_every) >= 0, f"trainer.attn_maps_every_n_epochs={attn_every} must be >= 0")
    recon_every = trainer.get("recon_images_every_n_epochs")
    require(
        recon_every is None or int(recon_every) >= 0,
        f"trainer.recon_images_every_n_epochs={recon_every} must be >= 0",
    )
    for key in ("limit_train_batches", "limit_val_batches", "stop_after_epoch"):
        value = trainer.get(key)
        require(value is None or int(value) >= 1, f"trainer.{key}={value} must be >= 1 or null")
    keep = trainer.keep_last
    require(keep is None or int(keep) >= 1, f"trainer.keep_last={keep} must be >= 1 or null (null: no epoch files)")
    resume = trainer.resume
    if resume not in (None, "auto"):
        require(Path(str(resume)).is_file(), f"trainer.resume={str(resume)!r}: no such checkpoint file")


def check_finetune(cfg: DictConfig) -> None:
    """`model.pretrained` (a source string or null), `model.freeze` and `optim.layer_decay`; whether the source
    can be read and fits the model is checked when the run reads it (vit/train/finetune.py), still before data."""
    source = cfg.model.get("pretrained")
    require(
        source is None or names_a_source(source),
        f"model.pretrained={source!r} must be null, timm:<model name> or a path to a weight file",
    )
    mode = cfg.model.get("freeze", "none")
    require(mode in FREEZE_MODES, f"model.freeze={mode!r} must be one of {FREEZE_MODES}")
    decay = cfg.optim.get("layer_decay")
    require(decay is None or 0.0 < float(decay) <= 1.0, f"optim.layer_decay={decay} must be in (0, 1] or null")


def check_distill(cfg: DictConfig) -> None:
    """`distill.*`: the type, alpha in [0, 1], tau > 0, and a teacher exactly when a distillation type needs one.
    Whether the teacher can be read and fits the data is checked when the run loads it (vit/train/distill.py)."""
    dcfg = cfg.get("distill")
    if dcfg is None:
        return
    kind, teacher = dcfg.type, dcfg.teacher  # the defaults: configs/distill/default.yaml
    require(kind in DISTILL_TYPES, f"distill.type={kind!r} must be one of {DISTILL_TYPES}")
    alpha, tau = float(dcfg.alpha), float(dcfg.tau)
    require(0.0 <= alpha <= 1.0, f"distill.alpha={alpha} must be in [0, 1] (the distillation loss's weight)")
    require(tau > 0.0, f"distill.tau={tau} must be > 0 (the soft distillation's temperature)")
    require(
        teacher is None or names_a_source(teacher),
        f"distill.teacher={teacher!r} must be null, timm:<model name> or a path to a weight file",
    )
    if kind != "none":
        require(teacher is not None, f"distill.type={kind} needs a teacher: set distill.teacher=<source>")
    else:
        require(
            teacher is None, f"distill.teacher={teacher!r} is set but distill.type=none: set distill.type=hard or soft"
        )
    size = dcfg.get("teacher_img_size")
    require(size is None or int(size) > 0, f"distill.teacher_img_size={size} must be positive or null")
    std = dcfg.get("teacher_std")
    require(std is None or all(float(v) > 0 for v in std), f"distill.teacher_std={std} must be > 0 in every channel")


def check_progressive_resize(cfg: DictConfig) -> None:
    """`trainer.progressive_resize`: a ViT, a first size that is a whole number of patches below the full size,
    and a ramp inside the run."""
    setting = cfg.trainer.get("progressive_resize")
    if not setting or setting.get("min_size") is None:
        return
    key = "trainer.progressive_resize"
    min_size, full = int(setting.min_size), int(cfg.data.img_size)
    patch = cfg.model.get("patch_size")
    require(
        str(cfg.model.get("name", "")).startswith("vit"),
        f"{key}.min_size={min_size} needs a ViT model, not model.name={cfg.model.get('name')!r}: T2T-ViT's soft "
        "split and position table are built for one image size",
    )
    require(0 < min_size <= full, f"{key}.min_size={min_size} must be in [1, data.img_size={full}]")
    if patch is not None:
        require(
            min_size % int(patch) == 0,
            f"{key}.min_size={min_size} must be a multiple of model.patch_size={patch} (whole patches)",
        )
    start, end = float(setting.start), float(setting.end)
    require(
        0.0 <= start <= end <= 1.0,
        f"{key}.start={start} and {key}.end={end} must satisfy 0 <= start <= end <= 1 (fractions of trainer.epochs)",
    )
