"""Checking a composed config before any data is touched: one readable message naming the key and value."""

from __future__ import annotations

import copy
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vit.config.value_types import check_types
from vit.data.augment.spec import augment_settings
from vit.data.errors import DataError
from vit.data.loading.build import LOADERS, RENAMED_LOADERS
from vit.data.sources.archive import is_archive
from vit.data.sources.registry import DATASETS
from vit.data.sources.splits import parse_holdout
from vit.errors import ConfigError, require
from vit.runtime.device import resolve_device
from vit.tasks import task_of
from vit.train.finetune import FREEZE_MODES
from vit.train.long_overrides import LONG_KEY, apply_long_overrides
from vit.weights.read import names_a_source, source_kind
from vit.weights.sharded import is_sharded_checkpoint


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first impossible setting. The model itself is checked by building it."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # an interpolation that points nowhere
        raise ConfigError(f"config cannot be resolved: {err}") from err
    check_types(cfg)
    check_heads(cfg.model)
    check_task(cfg)
    check_data(cfg)
    check_optim(cfg.optim)
    check_finetune(cfg)
    check_distill(cfg)
    check_sched(cfg.sched, cfg.optim)
    check_trainer(cfg.trainer)
    check_strategy(cfg)
    check_progressive_resize(cfg)
    check_width_by_budget(cfg)
    check_naflex(cfg)
    resolve_device(cfg.trainer.device)


def check_heads(model: DictConfig) -> None:
    """The heads against the width, here, before the run folder is announced and any data is read: the commonest
    slip in a model's shape (building the model checks the rest, with the same words). A timm name fixes both."""
    if source_kind(str(model.get("pretrained") or "")) == "timm":
        return
    width, heads = model.get("embed_dim"), model.get("num_heads")
    if isinstance(width, int) and isinstance(heads, int):
        require(
            width > 0 and heads > 0 and width % heads == 0,
            f"model.num_heads={heads} must be a positive divisor of embed_dim={width}",
        )


def check_data(cfg: DictConfig) -> None:
    """Types, ranges and choices: the dataset's settings class (vit/settings/data.py, checked with the types). What
    remains needs a registry, the disk or another group."""
    data = cfg.data
    require(data.name in DATASETS, f"data.name={data.name!r} must be one of {tuple(DATASETS)}")
    try:
        parse_holdout(data.get("holdout"))
        augment_settings(data.get("augment"))  # the policy, against the policies' registry
    except DataError as err:
        raise ConfigError(str(err)) from None
    if DATASETS[data.name].needs_root:
        require(data.root is not None, f"data.root is not set: data={data.name} needs data.root=<folder or archive>")
        root = Path(str(data.root)).expanduser()
        require(root.is_dir() or is_archive(root), f"data.root={str(data.root)!r} does not exist")
    require(data.loader in (*LOADERS, *RENAMED_LOADERS), f"data.loader={data.loader!r} must be one of {LOADERS}")
    model_classes = cfg.model.get("num_classes")
    if model_classes is not None and data.get("num_classes") is not None and task_of(cfg).classifier:
        # Fewer outputs than classes: the loss would fail on the first label the head has no output for.
        require(
            int(model_classes) >= int(data.num_classes),
            f"model.num_classes={model_classes} is less than data.num_classes={data.num_classes}: training needs "
            "an output per class (null: the data's count)",
        )


def check_task(cfg: DictConfig) -> None:
    """The task's own checks (vit/tasks/; `task`'s choices are checked with the types): settings that act on
    labels or a head are refused by name with task=mae rather than ignored, mae.* settings without it."""
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
    from timm.optim import get_optimizer_info

    # A name timm does not know is refused with the types (vit/settings/optim.py, with the closest names).
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
    # The shared keys' types and ranges: vit/settings/optim.py (checked with the types, vit/config/value_types.py).


def check_sched(sched: DictConfig, optim: DictConfig) -> None:
    # Types, ranges and sched.name's choices: vit/settings/sched.py. What remains is between groups.
    if sched.get("min_lr") is not None:
        # The cosine would climb from the peak up to min_lr. (Compared with optim.lr as configured, before the
        # batch-size scaling.)
        require(
            float(sched.min_lr) <= float(optim.lr),
            f"sched.min_lr={sched.min_lr} must be <= optim.lr={optim.lr} (the schedule decays towards it)",
        )


def check_strategy(cfg: DictConfig) -> None:
    """What trainer.strategy=fsdp does not run (one line each, before any data): an optimizer whose sharded step is
    not its whole one, and compiling (trainer.compile=true: not tested sharded)."""
    from vit.train.optimizer import SHARDED_OPTIMIZERS

    if cfg.trainer.get("strategy") != "fsdp":
        return
    name = cfg.optim.get("name")
    require(
        name in SHARDED_OPTIMIZERS,
        f"optim.name={name} with trainer.strategy=fsdp: its step is not known to treat sharded weights as whole ones "
        f"(those that do, compared step for step: adamw, lamb, lars, lion, muon, sgd ... {len(SHARDED_OPTIMIZERS)} "
        "in all, vit/train/optimizer.py's SHARDED_OPTIMIZERS)",
    )
    require(
        cfg.trainer.get("compile") is not True,
        "trainer.compile=true with trainer.strategy=fsdp: compiling a sharded model is not supported yet (not "
        "tested here); leave trainer.compile at auto (off under fsdp) or false",
    )


def check_trainer(trainer: DictConfig) -> None:
    """Types, ranges and choices: vit/settings/trainer.py (checked with the types). What remains needs the disk."""
    resume = trainer.resume
    if resume not in (None, "auto"):
        found = Path(str(resume)).is_file() or is_sharded_checkpoint(str(resume))
        require(found, f"trainer.resume={str(resume)!r}: no such checkpoint file (or sharded checkpoint folder)")
    sweep_budget, widths = trainer.get("sweep_budget"), (trainer.get("width_by_budget") or {}).get("widths")
    require(
        sweep_budget is None or trainer.budget is None,
        f"trainer.sweep_budget={sweep_budget} and trainer.budget={trainer.budget}: give one (the sweep's budget "
        "fits every job's length; a job's budget fits only its own)",
    )
    require(
        sweep_budget is None or widths is None,
        f"trainer.sweep_budget={sweep_budget} fixes one length for every job, and trainer.width_by_budget.widths="
        f"{list(widths or [])} would pick a width per budget: set trainer.width_by_budget.widths=null",
    )


def check_finetune(cfg: DictConfig) -> None:
    """`model.pretrained` (a source string or null) and `model.freeze` (optim.layer_decay: vit/settings/optim.py);
    whether the source can be read and fits the model is checked when the run reads it (vit/train/finetune.py),
    still before data."""
    source = cfg.model.get("pretrained")
    require(
        source is None or names_a_source(source),
        f"model.pretrained={source!r} must be null, timm:<model name> or a path to a weight file",
    )
    mode = cfg.model.get("freeze", "none")
    require(mode in FREEZE_MODES, f"model.freeze={mode!r} must be one of {FREEZE_MODES}")


def check_distill(cfg: DictConfig) -> None:
    """`distill.*`: the type, alpha in [0, 1], tau > 0, and a teacher exactly when a distillation type needs one.
    Whether the teacher can be read and fits the data is checked when the run loads it (vit/train/distill.py)."""
    dcfg = cfg.get("distill")
    if dcfg is None:
        return
    kind, teacher = dcfg.type, dcfg.teacher  # types and ranges: vit/settings/distill.py
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


def check_progressive_resize(cfg: DictConfig) -> None:
    """`trainer.progressive_resize`: a ViT, a first size that is a whole number of patches below the full size,
    and a ramp inside the run."""
    setting = cfg.trainer.get("progressive_resize")
    if not setting or setting.get("min_size") is None:
        return
    key = "trainer.progressive_resize"
    min_size, full = int(setting.min_size), cfg.data.img_size
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


def check_width_by_budget(cfg: DictConfig) -> None:
    """`trainer.width_by_budget.widths`: a model of ours with a width and heads, each width a whole number of the
    configured model's heads (the head width is kept), no pretrained weights (they fix the width);
    `long_overrides`: the config they make passes these checks too."""
    setting = cfg.trainer.get("width_by_budget") or {}
    check_long_overrides(cfg, setting)
    widths = setting.get("widths")
    if widths is None:
        return
    key, model = f"trainer.width_by_budget.widths={list(widths)}", cfg.model
    width, heads = model.get("embed_dim"), model.get("num_heads")
    require(
        isinstance(width, int) and isinstance(heads, int) and source_kind(str(model.get("name", ""))) != "timm",
        f"{key} needs a model of this project with model.embed_dim and model.num_heads, not "
        f"model.name={model.get('name')!r}",
    )
    pretrained = model.get("pretrained")
    require(not pretrained, f"{key}: model.pretrained={pretrained!r} fixes the width; drop one of them")
    head_width = width // heads
    odd = [w for w in widths if w % head_width]
    require(
        not odd,
        f"{key}: {odd[0] if odd else 0} is not a whole number of heads {head_width} wide (model.embed_dim={width} / "
        f"model.num_heads={heads})",
    )


def check_long_overrides(cfg: DictConfig, setting) -> None:
    """`trainer.width_by_budget.long_overrides`: overrides in Hydra's grammar of data, model, optim and sched keys,
    each key one the config has, and the config with all of them applied valid; `long_epochs` with nothing to
    apply is refused."""
    overrides = tuple(setting.get("long_overrides") or ())
    epochs = setting.get("long_epochs")
    require(
        epochs is None or bool(overrides),
        f"trainer.width_by_budget.long_epochs={epochs} sets when a run is long, and {LONG_KEY} is empty: nothing "
        f"to apply; set {LONG_KEY}=[<key>=<value>,...] or long_epochs=null",
    )
    if not overrides:
        return
    trial = copy.deepcopy(cfg)
    apply_long_overrides(trial, overrides)
    trial.trainer.width_by_budget.long_overrides, trial.trainer.width_by_budget.long_epochs = [], None
    try:
        validate(trial)
    except ConfigError as err:
        raise ConfigError(f"{LONG_KEY}={list(overrides)}: with them applied, {err}") from err


def check_naflex(cfg: DictConfig) -> None:
    """`data.naflex.seq_lens`: a ViT with the standard patch embedding at the data's patch size, a token budget
    that holds the longest sequence, and none of the settings that need square image batches."""
    naflex = cfg.data.get("naflex")
    if not naflex or naflex.get("seq_lens") is None:
        for name in ("max_seq_len", "patch_sizes"):
            value = (naflex or {}).get(name)
            require(
                value is None, f"data.naflex.{name}={value} is a setting of NaFlex batches: add data.naflex.seq_lens"
            )
        return
    key = f"data.naflex.seq_lens={list(naflex.seq_lens)}"
    longest, budget = max(naflex.seq_lens), naflex.get("max_seq_len")
    require(
        budget is None or budget >= longest,
        f"data.naflex.max_seq_len={budget} is below the longest of {key}: a batch's tokens must hold its sequences",
    )
    model = cfg.model
    require(
        str(model.get("name", "")).startswith("vit") and model.get("patch_embed", "standard") == "standard",
        f"{key} needs a ViT with the standard patch embedding (each patch projected on its own), not "
        f"model.name={model.get('name')!r} with model.patch_embed={model.get('patch_embed')!r}",
    )
    require(cfg.data.get("patch_size") is not None, f"{key} needs data.patch_size, the side of the patches it cuts")
    require(
        model.get("patch_size") in (None, cfg.data.patch_size),
        f"{key}: model.patch_size={model.get('patch_size')} must be data.patch_size={cfg.data.patch_size}, the "
        "patches the loader cuts",
    )
    augment = cfg.data.augment
    require(
        not augment.get("mixup_alpha") and not augment.get("cutmix_alpha"),
        f"{key} mixes no images: set data.augment.mixup_alpha=0 and data.augment.cutmix_alpha=0",
    )
    resize = cfg.trainer.get("progressive_resize") or {}
    require(
        resize.get("min_size") is None,
        f"{key} already trains at several sizes: drop trainer.progressive_resize.min_size",
    )
    task = task_of(cfg)  # distillation is a task of its own (a teacher: distill.type, model.distill_token)
    require(task.name == "classify", f"{key} trains a classifier from its labels alone, not the {task.name} task")
