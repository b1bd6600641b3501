"""Bad input gets one clear message and loses nothing: unknown or non-numeric settings, checkpoints of another
model or class count, truncated or code-carrying checkpoints, a full disk or unwritable folder, a diverging loss."""

import errno
import importlib
import os
import re
import subprocess

import pytest
import torch
from omegaconf import OmegaConf
from trainer_utils import QUICK, QUICK_SYNTHETIC, REPO, compose_config, compose_onto_groups, run_cli

from vit.cli.overrides import check_override_keys
from vit.config.compose import compose
from vit.config.value_types import model_kinds
from vit.data.sources.registry import DATASETS
from vit.errors import ConfigError
from vit.models.registry import MODELS
from vit.records.files import atomic_save
from vit.settings import SETTINGS
from vit.tasks import task_of
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.train.config import validate
from vit.train.step_parts import TrainingDiverged, weights_finite
from vit.weights.read import CheckpointError, load_checkpoint

setup_phase = importlib.import_module("vit.train.setup")  # where a run builds its model and data


# --- every numeric key, read from the declarations (the settings classes, the model families' configs) ---


def numeric_keys() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every numeric key, by group and kind ("int" or "float"): the model families' config fields, the settings
    classes' fields, and data's over every dataset's class."""
    keys: dict[str, dict[str, tuple[str, ...]]] = {"model": {"int": (), "float": ()}}
    for name in MODELS:
        for key, kind in model_kinds(name).items():
            kind_name = {int: "int", float: "float"}.get(kind.base)
            if kind_name and key not in keys["model"][kind_name]:
                keys["model"][kind_name] += (key,)
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


# --- settings --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "suggestion"),
    [
        ("model.num_head=4", "did you mean model.num_heads?"),
        ("data.batchsize=8", "did you mean data.batch_size?"),
        ("data.augment.reprob=0.1", "did you mean data.augment.re_prob?"),
        ("trainr.epochs=3", "did you mean trainer.epochs?"),
        ("num_heads=3", "did you mean model.num_heads?"),
        ("model.zebra=1", "unknown key model.zebra (a new key"),
    ],
)
def test_unknown_key_exits_2_suggesting_the_nearest(arg, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_override_keys([arg])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: unknown key {arg.split('=')[0]}") and suggestion in err


@pytest.mark.parametrize(
    "args",
    [
        ["model.num_heads=4", "data.augment.re_prob=0.2"],
        ["experiment=ablation_heads", "model.num_heads=1,2"],  # a sweep's values, an experiment's keys
        ["model=t2t_vit_7", "model.token_dim=32"],  # a key only the T2T configs have
        ["-m", "--cfg", "job", "+model.new_knob=1", "~trainer.eval_flip", "hydra.run.dir=x", "++model.depth=3"],
        ["-m", "model=glob(t2t*)", "model.token_dim=32"],  # every model the glob picks has the key
        ["-m", "experiment=ablation_heads,ablation_qk_scale", "model.qk_scale=0.5"],
        ["experiment=null", "model.depth=1"],
        ["--help"],
    ],
)
def test_known_keys_and_hydra_syntax_pass(args):
    check_override_keys(args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+model.num_heads=4"], "model.num_heads already exists: set it with model.num_heads=... (+ adds new keys"),
        (["~model.zebra"], "unknown key model.zebra"),
        (["model.num_heads=["], "cannot parse the override 'model.num_heads=[': no viable alternative at input"),
        # A sweep over models: each of its runs must have the key (Hydra would fail in the first run without it).
        (["-m", "model=vit_tiny,t2t_vit_7", "model.token_dim=32"], "unknown key model.token_dim in the sweep's run"),
        (["experiment=null", "model.dept=1"], "unknown key model.dept; did you mean model.depth?"),
    ],
)
def test_override_forms_hydra_would_refuse_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_override_keys(args)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"config error: {message}")


def test_experiment_null_written_out_runs(tmp_path):
    """`experiment=null` is the default; Hydra alone stops on it with a ValueError traceback."""
    done = run_cli(["experiment=null", "data=synthetic", "--cfg", "job"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "name: vit_tiny" in done.stdout


def test_unknown_key_through_the_cli_exits_2_before_training(tmp_path):
    done = run_cli(["model.num_head=4"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("config error: unknown key model.num_head; did you mean model.num_heads?")
    assert not (tmp_path / "outputs").exists()


# One out-of-range value per numeric knob of configs/**/*.yaml (and the null-by-default ones): the override(s) and
# what the message must say. test_every_numeric_knob_has_a_range_case keeps this table complete.
RANGE_CASES = {
    "model.img_size": (["model.img_size=0"], "model.img_size=0"),
    "model.patch_size": (["model.patch_size=0"], "patch_size=0 must be positive"),
    "model.in_chans": (["+model.in_chans=0"], "model.in_chans=0 must be positive"),
    "model.num_classes": (["model.num_classes=5"], "model.num_classes=5 is less than data.num_classes=10"),
    "model.embed_dim": (["model.embed_dim=0"], "positive divisor of embed_dim=0"),
    "model.depth": (["model.depth=0"], "model.depth=0 must be positive"),
    "model.stem_convs_per_stage": (
        ["model.patch_embed=conv", "model.stem_convs_per_stage=0"],
        "model.stem_convs_per_stage=0 must be a whole number of at least 1",
    ),
    "model.num_heads": (["model.num_heads=5"], "model.num_heads=5 must be a positive divisor of embed_dim=192"),
    "model.token_dim": (["model=t2t_vit_7", "model.token_dim=0"], "model.token_dim=0"),
    "model.mlp_ratio": (["model.mlp_ratio=0"], "model.mlp_ratio=0 must be > 0"),
    "model.qk_scale": (["model.qk_scale=-1"], "model.qk_scale=-1 must be > 0"),
    "model.drop_rate": (["model.drop_rate=1.0"], "model.drop_rate=1.0 must be in [0, 1)"),
    "model.attn_drop_rate": (["model.attn_drop_rate=-0.1"], "model.attn_drop_rate=-0.1 must be in [0, 1)"),
    "model.drop_path_rate": (["model.drop_path_rate=1.0"], "model.drop_path_rate=1.0 must be in [0, 1)"),
    "model.init_values": (["model.init_values=-1e-5"], "model.init_values=-1e-05 must be >= 0"),
    "model.norm_eps": (["model.norm_eps=0"], "model.norm_eps=0 must be > 0"),
    "model.rope_ref_grid": (
        ["model.pos_embed=learned_rope", "model.rope_ref_grid=0"],
        "model.rope_ref_grid=0 must be a positive integer",
    ),
    "model.reg_tokens": (["model.reg_tokens=-2"], "model.reg_tokens=-2 must be an integer >= 0"),
    "model.rope_temperature": (
        ["model.pos_embed=rope", "model.rope_temperature=0"],
        "model.rope_temperature=0 must be > 0",
    ),
    "data.img_size": (["data.img_size=0"], "data.img_size=0 must be positive"),
    "data.crop_pct": (["data.crop_pct=1.2"], "data.crop_pct=1.2 must be in (0, 1] or null"),
    "data.patch_size": (["data.patch_size=0"], "data.patch_size=0 must be positive"),
    "data.num_classes": (["data.num_classes=0"], "data.num_classes=0 must be >= 1"),
    "data.batch_size": (["data.batch_size=0"], "data.batch_size=0 must be positive"),
    "data.num_workers": (["data.num_workers=-2"], "data.num_workers=-2 must be >= 0"),
    "data.limit_train_samples": (["data.limit_train_samples=0"], "data.limit_train_samples=0 must be >= 1"),
    "data.limit_val_samples": (["data.limit_val_samples=0"], "data.limit_val_samples=0 must be >= 1"),
    "data.repeated_aug": (["data.repeated_aug=0"], "data.repeated_aug=0 must be >= 1"),
    "data.holdout": (["data.holdout=1.5"], "data.holdout=1.5 must be null, a count"),
    "data.mean": (["data.mean=[0.5]"], "data.mean=[0.5] must be a list of 3 numbers"),
    "data.std": (["data.std=[0.2,0,0.2]"], "data.std=[0.2, 0, 0.2] must be > 0 in every channel"),
    "data.augment.pad": (["data.augment.pad=-1"], "data.augment.pad=-1 must be >= 0"),
    "data.augment.scale_min": (["data.augment.scale_min=0"], "data.augment.scale_min=0 must be in (0, 1]"),
    "data.augment.re_prob": (["data.augment.re_prob=1.0"], "data.augment.re_prob=1.0 must be in [0, 1)"),
    "data.augment.mixup_alpha": (["data.augment.mixup_alpha=-1"], "data.augment.mixup_alpha=-1 must be >= 0"),
    "data.augment.cutmix_alpha": (["data.augment.cutmix_alpha=-1"], "data.augment.cutmix_alpha=-1 must be >= 0"),
    "data.augment.mixup_prob": (["data.augment.mixup_prob=1.5"], "data.augment.mixup_prob=1.5 must be in [0, 1]"),
    "data.augment.label_smoothing": (["data.augment.label_smoothing=1"], "data.augment.label_smoothing=1 must"),
    "data.synthetic.num_train": (["data.synthetic.num_train=0"], "data.synthetic.num_train=0 must be >= 1"),
    "data.synthetic.num_val": (["data.synthetic.num_val=0"], "data.synthetic.num_val=0 must be >= 1"),
    "optim.lr": (["optim.lr=0"], "optim.lr=0 must be > 0"),
    "optim.lr_batch": (["optim.lr_batch=0"], "optim.lr_batch=0 must be >= 1"),
    "optim.weight_decay": (["optim.weight_decay=-0.1"], "optim.weight_decay=-0.1 must be >= 0"),
    "optim.weight_decay_end": (["optim.weight_decay_end=-0.1"], "optim.weight_decay_end=-0.1 must be >= 0"),
    "optim.eps": (["optim.eps=0"], "optim.eps=0 must be > 0"),
    "optim.momentum": (["optim=sgd", "optim.momentum=1.0"], "optim.momentum=1.0 must be in [0, 1)"),
    "optim.layer_decay": (["optim.layer_decay=0"], "optim.layer_decay=0 must be in (0, 1] or null"),
    "optim.betas": (["optim.betas=[0.9,1.0]"], "optim.betas=[0.9, 1.0] must both be in [0, 1)"),
    "sched.warmup_epochs": (["sched.warmup_epochs=-1"], "sched.warmup_epochs=-1 must be >= 0"),
    "sched.warmup_lr_init": (["sched.warmup_lr_init=-1e-6"], "sched.warmup_lr_init=-1e-06 must be >= 0"),
    "sched.min_lr": (["sched.min_lr=0.01"], "sched.min_lr=0.01 must be <= optim.lr=0.001"),
    "trainer.epochs": (["trainer.epochs=0"], "trainer.epochs=0 must be positive"),
    "trainer.seed": (["trainer.seed=-1"], "trainer.seed=-1 must be in [0, 2**32)"),
    "trainer.accum_steps": (["trainer.accum_steps=0"], "trainer.accum_steps=0 must be >= 1"),
    "trainer.limit_train_batches": (["trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 must be >= 1"),
    "trainer.limit_val_batches": (["trainer.limit_val_batches=0"], "trainer.limit_val_batches=0 must be >= 1"),
    "trainer.log_every_n_steps": (
        ["trainer.log_every_n_steps=0"],
        "trainer.log_every_n_steps=0 must be auto or a whole number >= 1",
    ),
    "trainer.attn_maps_every_n_epochs": (["trainer.attn_maps_every_n_epochs=-1"], "attn_maps_every_n_epochs=-1"),
    "trainer.stop_after_epoch": (["trainer.stop_after_epoch=0"], "trainer.stop_after_epoch=0 must be >= 1"),
    "trainer.max_bad_steps": (["trainer.max_bad_steps=0"], "trainer.max_bad_steps=0 must be >= 1"),
    "trainer.grad_clip": (["trainer.grad_clip=0"], "trainer.grad_clip=0 must be > 0 or null"),
    "trainer.ema_decay": (["trainer.ema_decay=1.0"], "trainer.ema_decay=1.0 must be in (0, 1)"),
    "trainer.val_every_n_epochs": (["trainer.val_every_n_epochs=0"], "trainer.val_every_n_epochs=0 must be >= 1"),
    "trainer.keep_last": (["trainer.keep_last=0"], "trainer.keep_last=0 must be >= 1 or null"),
    "trainer.eval_shift": (["trainer.eval_shift=-1"], "trainer.eval_shift=-1 must be >= 0"),
    "data.shuffle_buffer": (["data=webdataset", "data.shuffle_buffer=-1"], "data.shuffle_buffer=-1 must be >= 0"),
    "data.epoch_samples": (["data=webdataset", "data.epoch_samples=0"], "data.epoch_samples=0 must be >= 1"),
    "data.naflex.max_seq_len": (["data.naflex.max_seq_len=0"], "data.naflex.max_seq_len=0 must be >= 1"),
    "trainer.progressive_resize.min_size": (
        ["trainer.progressive_resize.min_size=0"],
        "trainer.progressive_resize.min_size=0 must be in [1, data.img_size=32]",
    ),
    "trainer.progressive_resize.start": (
        ["trainer.progressive_resize.min_size=16", "trainer.progressive_resize.start=-0.1"],
        "trainer.progressive_resize.start=-0.1",
    ),
    "trainer.progressive_resize.end": (
        ["trainer.progressive_resize.min_size=16", "trainer.progressive_resize.end=1.1"],
        "trainer.progressive_resize.end=1.1",
    ),
    "trainer.width_by_budget.min_epochs": (
        ["trainer.width_by_budget.min_epochs=-1"],
        "trainer.width_by_budget.min_epochs=-1 must be >= 0",
    ),
    "trainer.width_by_budget.long_epochs": (
        ["trainer.width_by_budget.long_epochs=-1"],
        "trainer.width_by_budget.long_epochs=-1 must be >= 0",
    ),
    "trainer.width_by_budget.long_overrides": (
        ["trainer.width_by_budget.long_overrides=3"],
        "trainer.width_by_budget.long_overrides=3 must be a list of overrides, e.g. ",
    ),
    "trainer.width_by_budget.widths": (
        ["trainer.width_by_budget.widths=[32,0]"],
        "trainer.width_by_budget.widths=[32, 0]: 0 is not a width (a whole number >= 1)",
    ),
    "distill.alpha": (["distill.alpha=-0.1"], "distill.alpha=-0.1 must be in [0, 1]"),
    "distill.tau": (["distill.tau=0"], "distill.tau=0 must be > 0"),
    "distill.teacher_img_size": (["distill.teacher_img_size=0"], "distill.teacher_img_size=0 must be positive"),
    "distill.teacher_mean": (["distill.teacher_mean=[0.5]"], "distill.teacher_mean=[0.5] must be a list of 3 numbers"),
    "distill.teacher_std": (["distill.teacher_std=[0.2,0,0.2]"], "distill.teacher_std=[0.2, 0, 0.2] must be > 0"),
    "trainer.recon_images_every_n_epochs": (
        ["trainer.recon_images_every_n_epochs=-1"],
        "trainer.recon_images_every_n_epochs=-1 must be >= 0",
    ),
    "mae.mask_ratio": (["task=mae", "mae.mask_ratio=1.0"], "mae.mask_ratio=1.0 must be in (0, 1)"),
    "search.trial": (["search.trial=-1"], "search.trial=-1 must be >= 0"),
    "mae.decoder_embed_dim": (["task=mae", "mae.decoder_embed_dim=0"], "mae.decoder_embed_dim=0 must be >= 1"),
    "mae.decoder_depth": (["task=mae", "mae.decoder_depth=0"], "mae.decoder_depth=0 must be >= 1"),
    "mae.decoder_num_heads": (
        ["task=mae", "mae.decoder_num_heads=5"],
        "mae.decoder_num_heads=5 must divide mae.decoder_embed_dim=512",
    ),
}


def test_composing_the_settings_onto_composed_groups_gives_hydras_config():
    """`compose_config`, which composes the settings onto the cached group choices (compose_onto_groups) where it
    can, gives the config Hydra composes (values of every kind) and Hydra's refusals; the forms it does not apply
    itself go to Hydra."""
    overrides = ["data=synthetic", "task=mae", "mae.mask_ratio=0.5", "data.std=[a,1,1]", "data.batch_size=1e3"]
    overrides += ["+model.in_chans=abc", "trainer.ema=maybe", "optim.betas=abc", "trainer.epochs=true"]
    overrides += ["data.holdout=null", "model.depth=3", "model=vit_small"]  # a group chosen after a setting of it
    assert compose_onto_groups(overrides) == compose(overrides)
    cases = [overrides, ["experiment=cifar10_cpu", "model.depth=3", "+model.pretrained=x"]]  # `+` onto a null: added
    cases += [["~trainer.eval_flip"], ["++model.depth=3"], ["hydra.run.dir=elsewhere", "model.depth=3"]]
    for case in cases:
        assert compose_config(case) == compose(case), case
    for refused in (["+model.depth=3"], ["model.no_such_key=1"], ["model.depth=[1,"], ["model=no_such_model"]):
        with pytest.raises(ConfigError) as ours:
            compose_config(refused)
        with pytest.raises(ConfigError) as hydras:
            compose(refused)
        assert str(ours.value) == str(hydras.value), refused


def check(overrides: list[str]) -> None:
    """What run() checks before any data is read: the config, then the model it builds."""
    cfg = compose_config(["data=synthetic", *overrides])
    validate(cfg)
    task_of(cfg).build_model(cfg, num_classes=10)


@pytest.mark.parametrize("key", sorted(RANGE_CASES))
def test_every_numeric_knob_is_range_checked_naming_the_key(key):
    overrides, needle = RANGE_CASES[key]
    with pytest.raises(ConfigError) as err:
        check(overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def numeric_leaves(node, prefix: str = "") -> set[str]:
    found = set()
    for key, value in node.items():
        if isinstance(value, dict):
            found |= numeric_leaves(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float, list)) and not isinstance(value, bool):
            found.add(f"{prefix}{key}")
    return found


def test_every_numeric_knob_has_a_range_case():
    """Every number in every group option of configs/ (plus the typed null-by-default knobs) is in RANGE_CASES,
    so a knob added to the YAML without a range check fails here."""
    knobs = {f"{group}.{key}" for group, kinds in numeric_keys().items() for keys in kinds.values() for key in keys}
    knobs |= {f"{group}.{key}" for group, lists in number_lists().items() for key, _ in lists} | {"data.holdout"}
    groups = ("model", "data", "optim", "sched", "trainer", "mae")
    for group in ("model", "data", "optim", "sched", "trainer", "task"):
        for option in sorted((REPO / "configs" / group).glob("*.yaml")):
            cfg = OmegaConf.to_container(compose_config([f"{group}={option.stem}"]), resolve=True)
            knobs |= numeric_leaves({k: cfg[k] for k in groups if k in cfg})
    # An experiment composes the options above and sets values on top: its own file holds every number it adds
    # (Hydra refuses a key that no option has unless it is written `+key`, which its file would show too).
    for option in sorted((REPO / "configs" / "experiment").glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(option), resolve=False)
        knobs |= numeric_leaves({k: cfg[k] for k in groups if k in cfg})
    knobs -= {"model.soft_split"}  # T2T's kernel/stride/padding triples: checked by the model (test_t2t.py)
    assert sorted(knobs - set(RANGE_CASES)) == []


NOT_NUMBERS = sorted(
    (f"{group}.{key}", kind) for group, kinds in numeric_keys().items() for kind, keys in kinds.items() for key in keys
)


# Knobs that only some group options have: the option to compose them with.
CONFIG_WITH_KEY = {
    "model.token_dim": ["model=t2t_vit_7"],
    "mae.mask_ratio": ["task=mae"],
    "mae.decoder_embed_dim": ["task=mae"],
    "mae.decoder_depth": ["task=mae"],
    "mae.decoder_num_heads": ["task=mae"],
    "data.shuffle_buffer": ["data=webdataset"],
    "data.epoch_samples": ["data=webdataset"],
}


@pytest.mark.parametrize(("key", "kind"), NOT_NUMBERS)
def test_every_numeric_knob_refuses_a_word(key, kind):
    extra = CONFIG_WITH_KEY.get(key, [])
    prefix = "+" if key == "model.in_chans" else ""  # not in the YAML: the model's default
    with pytest.raises(ConfigError) as err:
        check([*extra, f"{prefix}{key}=abc"])
    assert str(err.value) == f"{key}='abc' must be {'an integer' if kind == 'int' else 'a number'}"


FLOAT_KNOBS = [key for key, kind in NOT_NUMBERS if kind != "int"]
NON_FINITE = [(key, "inf") for key in FLOAT_KNOBS] + [("optim.lr", "nan"), ("optim.weight_decay", "-inf")]


@pytest.mark.parametrize(("key", "value"), NON_FINITE)
def test_every_float_knob_refuses_a_non_finite_value(key, value):
    """inf and nan pass a range check (nan compares false both ways), and `optim.lr=inf` trained to non-finite
    weights before this: refused with the key before anything is built."""
    extra = CONFIG_WITH_KEY.get(key, [])
    prefix = "+" if key == "model.in_chans" else ""
    with pytest.raises(ConfigError) as err:
        check([*extra, f"{prefix}{key}={value}"])
    assert str(err.value) == f"{key}={value} must be a finite number"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.embed_dim=19.5", "model.embed_dim=19.5 must be an integer"),
        ("model.depth=2.0", "model.depth=2.0 must be an integer"),  # torch.linspace would fail with a traceback
        ("data.batch_size=1e3", "data.batch_size=1000.0 must be an integer"),
        ("trainer.epochs=true", "trainer.epochs=True must be an integer"),
        ("trainer.ema=maybe", "trainer.ema='maybe' must be true or false"),
        ("model.qkv_bias=1", "model.qkv_bias=1 must be true or false"),
        ("model.lsa=maybe", "model.lsa='maybe' must be true or false"),
        ("model.stem_whitening=maybe", "model.stem_whitening='maybe' must be true or false"),
        ("trainer.malloc=keep", "trainer.malloc='keep' must be one of ('auto', 'reuse', 'system')"),
        ("data.augment.hflip_alternate=maybe", "data.augment.hflip_alternate='maybe' must be true or false"),
        ("optim.betas=abc", "optim.betas='abc' must be a list of 2 numbers or null"),
        ("data.std=[a,1,1]", "data.std=['a', 1, 1] must be a list of 3 numbers or null"),
        ("data.holdout=some", "data.holdout='some' must be null, a count"),
    ],
)
def test_values_of_the_wrong_kind_are_named(override, needle):
    with pytest.raises(ConfigError) as err:
        check([override])
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("arg", "line"),
    [
        ("data.batch_size=x", "config error: data.batch_size='x' must be an integer"),
        ("optim.lr=fast", "config error: optim.lr='fast' must be a number"),
        ("optim.lr=inf", "config error: optim.lr=inf must be a finite number"),
        ("data.augment.re_prob=1.0", "config error: data.augment.re_prob=1.0 must be in [0, 1)"),
    ],
)
def test_bad_values_through_the_cli_exit_2_with_one_line(tmp_path, arg, line):
    done = run_cli([arg, "data=synthetic", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == line


def test_a_non_numeric_model_value_is_named_through_the_cli(tmp_path):
    done = run_cli(["model.img_size=abc", "data=synthetic"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "config error: model.img_size='abc' must be an integer"


def tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_refused_run_leaves_no_folder_behind(tmp_path):
    """Hydra makes outputs/<date>/<time>/ with .hydra/ and an empty train.log before the task starts: a refused
    command takes it away again, and its outputs/<date>/ and outputs/ where it made them; an earlier run's folder
    stays as it was."""
    done = run_cli(["optim.lr=fast", "data=synthetic"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "config error: optim.lr='fast' must be a number"
    assert tree(tmp_path) == []
    earlier = tmp_path / "outputs" / "2020-01-01" / "00-00-00"
    (earlier / ".hydra").mkdir(parents=True)
    (earlier / "train.log").write_text("")
    before = tree(tmp_path)
    for arg in ("trainer.budget=1h30", "data.augment.re_prob=1.0", "search.trial=0"):
        assert run_cli([arg, "data=synthetic"], cwd=tmp_path, timeout=120).returncode == 2
    assert tree(tmp_path) == before


def test_a_refused_sweep_job_leaves_no_folder_behind(tmp_path):
    """-m: the sweep's folder (multirun/<date>/<time>/, its multirun.yaml) and the job's (<n>/) go too."""
    done = run_cli(["-m", "optim.lr=fast", "data=synthetic"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "config error: optim.lr='fast' must be a number"
    assert tree(tmp_path) == []


def test_a_folder_the_user_named_is_removed_only_if_the_command_made_it(tmp_path):
    """hydra.run.dir=<a folder that was there>: kept, and its log holds the error line; a new folder under a folder
    that was there goes, up to that folder."""
    mine = tmp_path / "mine"
    mine.mkdir()
    done = run_cli(["optim.lr=fast", "data=synthetic", f"hydra.run.dir={mine}"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert (mine / ".hydra").is_dir()
    (log_line,) = (mine / "train.log").read_text().splitlines()
    assert log_line.endswith("[ERROR] - config error: optim.lr='fast' must be a number")
    done = run_cli(["optim.lr=fast", "data=synthetic", f"hydra.run.dir={mine}/new/run"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and sorted(p.name for p in mine.iterdir()) == [".hydra", "train.log"]


# --- checkpoints -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "needle"),
    [
        (["model.embed_dim=64"], "patch_embed.proj.weight: checkpoint (32, 3, 4, 4) vs model (64, 3, 4, 4)"),
        (["model.depth=3"], "missing keys (e.g. blocks.2."),
        (["data.num_classes=7", "model.num_classes=7"], "head.weight: checkpoint (10, 32) vs model (7, 32)"),
    ],
)
def test_resuming_another_model_names_the_first_differences(trained, tmp_path, other, needle):
    cfg = compose_config([*QUICK, "trainer.epochs=2", *other, f"trainer.resume={trained}"])
    with pytest.raises(CheckpointError) as err:
        run(cfg, output_dir=tmp_path)
    assert str(trained) in str(err.value) and needle in str(err.value)


def test_resuming_a_vit_tiny_checkpoint_as_vit_small_through_the_cli(trained, tmp_path):
    args = [*QUICK_SYNTHETIC, "model=vit_small", "trainer.device=cpu", "trainer.epochs=2", f"trainer.resume={trained}"]
    done = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert line.startswith(f"checkpoint error: checkpoint '{trained}' (vit_tiny) does not fit")
    assert re.search(r"shape mismatches \(cls_token: checkpoint \(1, 1, 32\) vs model \(1, 1, 384\)", line)
    assert "missing keys (e.g. blocks.2." in line  # 12 blocks against the checkpoint's 2


def test_resuming_with_another_optimizer_is_named(trained, tmp_path):
    cfg = compose_config([*QUICK, "trainer.epochs=2", "optim=sgd", f"trainer.resume={trained}"])
    with pytest.raises(
        CheckpointError,
        match="was trained with optim.name=adamw, this run uses optim.name=sgd: resume with optim.name=adamw",
    ):
        run(cfg, output_dir=tmp_path)


def test_a_file_of_weights_alone_cannot_be_resumed(trained, tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save({"model": load_checkpoint(trained)["model"]}, weights)
    with pytest.raises(CheckpointError, match="holds no optimizer or scheduler state"):
        run(compose_config([*QUICK, "trainer.epochs=2", f"trainer.resume={weights}"]), output_dir=tmp_path / "run")


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (0.5, r"the file is truncated or corrupted \(PytorchStreamReader failed reading zip archive"),
        (0.0, r"the file is empty \(0 bytes\)"),
    ],
)
def test_a_truncated_checkpoint_is_refused_with_its_path(trained, tmp_path, cut, reason):
    path = tmp_path / "cut.pt"
    data = trained.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint '.*cut\.pt'.*: {reason}") as err:
        run(compose_config([*QUICK, "trainer.epochs=2", f"trainer.resume={path}"]), output_dir=tmp_path / "run")
    assert "\n" not in str(err.value)


class RunsCode:
    """Unpickling this would create a marker file: weights_only=True must refuse before that happens."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(trained, tmp_path):
    marker = tmp_path / "code-ran"
    state = load_checkpoint(trained)
    state["extra"] = RunsCode(marker)
    evil = tmp_path / "evil.pt"
    torch.save(state, evil)
    done = run_cli(
        [*QUICK, "trainer.epochs=2", f"trainer.resume={evil}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path
    )
    assert done.returncode == 2 and not marker.exists()
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]  # one line, not torch's dozen
    assert line.startswith(
        f"checkpoint error: cannot read checkpoint '{evil}' with weights_only=True: it holds pickled"
    )
    assert "GLOBAL io.open" in line and "refuses without running them" in line
    assert torch.load(evil, weights_only=False) is not None and marker.exists()  # the payload was real


# --- disk ------------------------------------------------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """The second epoch's checkpoint write fails half way as a full disk makes torch.save fail; the run stops with
    one clear error and last.pt is still epoch 1's."""
    real_save = torch.save
    calls = {"n": 0}

    def save_until_full(obj, handle, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 1:  # epoch 1: last.pt (best.pt is a second name of the same file, no second write)
            return real_save(obj, handle, *args, **kwargs)
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("vit.records.files.torch.save", save_until_full)
    with pytest.raises(CheckpointError) as err:
        run(compose_config([*QUICK, "trainer.epochs=3"]), output_dir=tmp_path)
    message = str(err.value)
    assert "No space left on device" in message and "the previous file is intact" in message
    assert "last.pt" in message
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["epoch"] == 1
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_real_full_disk_is_reported_with_its_free_space(tmp_path):
    """The same on a real 64 KiB tmpfs, where torch.save fails with its own RuntimeError (needs mount rights)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the monkeypatched test above covers the logic")
    try:
        atomic_save({"model": {"w": torch.zeros(4)}}, mount / "last.pt")
        with pytest.raises(CheckpointError, match=r"MiB free there\); the previous file is intact"):
            atomic_save({"model": {"w": torch.zeros(100_000)}}, mount / "last.pt")
        assert torch.equal(load_checkpoint(mount / "last.pt")["model"]["w"], torch.zeros(4))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_an_unwritable_output_folder_is_named(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder should be")
    done = run_cli([*QUICK, "trainer.epochs=1", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"checkpoint error: cannot write checkpoint '{tmp_path / 'checkpoints' / 'last.pt'}'")
    assert f"'{tmp_path / 'checkpoints'}' is a file, not a folder" in line and "there was no earlier file" in line


@pytest.mark.parametrize(
    ("code", "where"),
    [(errno.ENOSPC, "write"), (errno.EACCES, "open"), (errno.EROFS, "open"), (errno.EIO, "rename")],
)
def test_every_os_error_while_saving_names_path_and_reason_and_keeps_the_old_file(tmp_path, monkeypatch, code, where):
    """A full disk, a folder without write permission, a read-only file system, a failing disk: whichever step
    meets it (root ignores permissions, so the OS errors are raised by hand), one message, the old file kept."""
    path = tmp_path / "checkpoints" / "last.pt"
    atomic_save({"model": {"w": torch.ones(2)}, "epoch": 1}, path)
    failure = OSError(code, os.strerror(code))
    real_open, real_save = open, torch.save

    def failing_open(file, *args, **kwargs):
        if where == "open" and ".tmp-" in str(file):
            raise failure
        return real_open(file, *args, **kwargs)

    def failing_save(obj, handle):
        real_save(obj, handle)
        if where == "write":
            raise failure

    def failing_replace(src, dst):
        raise failure

    monkeypatch.setattr("builtins.open", failing_open)
    monkeypatch.setattr("vit.records.files.torch.save", failing_save)
    if where == "rename":
        monkeypatch.setattr("vit.records.files.os.replace", failing_replace)
    with pytest.raises(CheckpointError) as err:
        atomic_save({"model": {"w": torch.zeros(2)}, "epoch": 2}, path)
    monkeypatch.undo()
    assert str(err.value).startswith(f"cannot write checkpoint '{path}': {os.strerror(code)} (")
    assert str(err.value).endswith("free there); the previous file is intact")
    assert load_checkpoint(path)["epoch"] == 1 and [p.name for p in path.parent.iterdir()] == ["last.pt"]


# --- divergence ------------------------------------------------------------------------------------------------


def test_a_diverging_run_exits_3_naming_the_step(tmp_path):
    args = [*QUICK, "optim.name=sgd", "optim.lr=1e30", "trainer.grad_clip=null", "sched.warmup_epochs=0"]
    args += ["trainer.max_bad_steps=2", "trainer.log_every_n_steps=1", f"hydra.run.dir={tmp_path}"]
    done = run_cli(args, tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("training stopped:")]
    assert "finite" in line and re.search(r"step \d+", line)  # the wording is the loop's; a step is named
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "checkpoints" / "last.pt").exists()  # nothing non-finite was saved
    assert line in (tmp_path / "train.log").read_text()  # the run folder's log ends as the console did


def test_divergence_in_epoch_2_keeps_epoch_1s_checkpoints(tmp_path, monkeypatch):
    real_build = setup_phase.build_data

    class NanAfter(torch.nn.CrossEntropyLoss):
        """NaN losses from the 10th call on (epoch 2 of 8 steps), with the gradients to match."""

        calls = 0

        def forward(self, logits, targets):
            NanAfter.calls += 1
            loss = super().forward(logits, targets)
            return loss * float("nan") if NanAfter.calls >= 10 else loss

    def build_data(*args, **kwargs):
        bundle = real_build(*args, **kwargs)
        bundle.train_criterion = NanAfter()
        return bundle

    monkeypatch.setattr(setup_phase, "build_data", build_data)
    with pytest.raises(TrainingDiverged, match="step"):
        run(compose_config([*QUICK, "trainer.epochs=3", "trainer.max_bad_steps=3"]), output_dir=tmp_path)
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(tmp_path / "checkpoints" / name)
        model = build_model_from_config(compose_config(QUICK).model)
        model.load_state_dict(state["model"])
        assert state["epoch"] == 1 and weights_finite(model)
