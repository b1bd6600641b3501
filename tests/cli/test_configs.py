"""Every model x data config composes and builds; overrides reach the modules; bad settings are named."""

from pathlib import Path

import pytest
import torch
from trainer_utils import TINY_MODEL, compose_config, run_cli

import vit.train
from vit.cli.overrides import check_group_choices
from vit.cli.train import train_task
from vit.data import DataError
from vit.errors import ConfigError
from vit.models import Attention
from vit.tasks.build import build_model_from_config
from vit.train.config import validate
from vit.weights.read import CheckpointError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
DATA = ["cifar10", "cifar100", "imagefolder", "synthetic"]


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("model", MODELS)
def test_every_model_and_data_config_composes_and_builds(model, data, tmp_path):
    overrides = [f"model={model}", f"data={data}"]
    if data == "imagefolder":
        overrides.append(f"data.root={tmp_path}")
    cfg = compose_config(overrides)
    validate(cfg)
    with torch.device("meta"):  # built whole, its parameters neither allocated nor initialised (ViT-B: 1.3 s less)
        net = build_model_from_config(cfg.model, num_classes=cfg.data.num_classes or 1000)
    assert net.img_size[0] == cfg.data.img_size
    if cfg.data.num_classes:
        assert net.num_classes == cfg.data.num_classes


def test_cifar_gives_the_cifar_vit_and_folders_the_imagenet_one(tmp_path):
    cifar = build_model_from_config(compose_config(["model=vit_tiny"]).model)
    assert cifar.patch_embed.num_patches == 64 and cifar.num_classes == 10
    folder = compose_config(["model=vit_tiny", "data=imagefolder", f"data.root={tmp_path}"])
    net = build_model_from_config(folder.model, num_classes=1000)
    assert net.patch_embed.num_patches == 196 and net.patch_embed.patch_size == (16, 16)


def test_attention_overrides_reach_every_attention():
    cfg = compose_config(["model.num_heads=4", "model.qkv_bias=false", "model.qk_scale=0.1"])
    attns = [m for m in build_model_from_config(cfg.model).modules() if isinstance(m, Attention)]
    assert len(attns) == 12
    assert all(a.num_heads == 4 and a.qkv.bias is None and a.scale == 0.1 for a in attns)


def test_shape_overrides_take_effect():
    cfg = compose_config(
        ["model.embed_dim=256", "model.num_heads=4", "model.depth=6", "model.mlp_ratio=2", "model.patch_size=2"]
        + ["model.pos_embed=sinusoidal", "model.global_pool=avg", "model.attn_backend=math", "model.drop_path_rate=0.2"]
    )
    net = build_model_from_config(cfg.model)
    assert net.embed_dim == 256 and len(net.blocks) == 6 and net.patch_embed.num_patches == 256
    assert net.blocks[0].mlp.fc1.out_features == 512 and not net.pos_embed.requires_grad
    assert net.global_pool == "avg" and net.blocks[0].attn.attn_backend == "math"
    assert net.blocks[-1].drop_path1.drop_prob == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model.num_heads=5"], "model.num_heads=5"),
        (["model.patch_size=5"], "model.img_size=32 is not divisible by patch_size=5"),
        (["model.drop_path_rate=1.0"], "model.drop_path_rate=1.0"),
        (["model.attn_drop_rate=-0.1"], "model.attn_drop_rate=-0.1"),
        (["model.name=vit_huge"], "model.name='vit_huge' is not a known model"),
        (["data=imagefolder"], "data.root is not set"),
        (["data=imagefolder", "data.root=/no/such/folder"], "data.root='/no/such/folder' does not exist"),
        (["data.augment.label_smoothing=1.5"], "data.augment.label_smoothing=1.5"),
        (["optim.lr=0"], "optim.lr=0"),
        (["trainer.amp=fp8"], "trainer.amp='fp8'"),
        (["trainer.compile=yes"], "trainer.compile='yes' must be true, false or auto"),
        (["data.augment.mixup_prob=1.5"], r"data.augment.mixup_prob=1.5 must be in \[0, 1\]"),
        (["trainer.epochs=0"], "trainer.epochs=0"),
        (["trainer.resume=/no/such.pt"], "trainer.resume='/no/such.pt'"),
    ],
)
def test_bad_settings_name_key_and_value(overrides, needle):
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        validate(cfg)
        build_model_from_config(cfg.model)


def test_bad_config_exits_2_with_one_line(tmp_path):
    done = run_cli(["model.num_heads=5", *TINY_MODEL[:1], f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("config error: model.num_heads=5 must be a positive divisor of")
    assert "Traceback" not in done.stderr


def test_unknown_group_choice_exits_2_naming_the_options(capsys):
    check_group_choices(["model=vit_small", "data=synthetic", "model.num_heads=4", "experiment=null"])  # all fine
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices(["-m", "model=vit_tiny,vit_huge", "trainer.epochs=1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: model=vit_huge is not a known model config; known:") and "vit_tiny" in err


def test_help_lists_only_the_groups_a_command_chooses_from(tmp_path):
    """`--help`'s groups are the ones a command line chooses from; the groups inside them (the settings' declared
    defaults stored by vit/config/compose.py's register_configs as optim/schema, data/schema, model/registry, ...;
    configs/model/shared/) are what those configs are built from."""
    done = run_cli(["--help"], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    groups = done.stdout.split("== Configuration groups ==")[1].split("== Keys ==")[0]
    listed = dict(line.split(": ", 1) for line in groups.splitlines() if ": " in line)
    assert sorted(listed) == sorted(p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name != "hydra")
    assert listed["optim"] == "adamw, lion, muon, sgd" and listed["model"] == ", ".join(MODELS)
    assert "schema" not in groups and "registry" not in groups and "shared" not in groups
    assert not list(tmp_path.iterdir())  # help writes no folder


@pytest.mark.parametrize(
    "arg", ["optim/schema=defaults", "data/schema=hf", "model/registry=vit_base", "+mae/schema=defaults",
            "model/shared=finetune", "~model/shared", "model/registry@model=vit_base"],
)  # fmt: skip
def test_a_group_inside_another_is_not_a_choice(arg, capsys):
    """Hydra would take some of these (a config's defaults swapped for another dataset's) and stop on others with
    exit code 1 and several lines: one line and exit code 2 here, naming the group to choose instead."""
    top = arg.lstrip("+~").split("/")[0]
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices([arg])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"config error: {arg.lstrip('+~').split('=')[0].split('@')[0]} is not a config group to ")
    hint = f"; choose {top}=<name> (" if top != "mae" else "(the groups to choose from: --help)"  # no configs/mae/
    assert hint in err and "\n" not in err


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (DataError("data.root='/x' holds no train/ folder"), "data error: data.root='/x' holds no train/ folder"),
        (CheckpointError("checkpoint 'a.pt' does not fit"), "checkpoint error: checkpoint 'a.pt' does not fit"),
    ],
)
def test_data_and_checkpoint_errors_exit_2_with_one_line(error, line, monkeypatch, capsys):
    def failing_run(cfg):
        raise error

    monkeypatch.setattr(vit.train, "run", failing_run)  # what the Hydra task calls
    with pytest.raises(SystemExit) as exit_info:
        train_task(compose_config([]))
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == line


def test_help_lists_each_key_its_overrides_compose_with_its_help_and_leaves_other_flags_to_hydra(capsys):
    """`--help model=vit_small` prints the help template with every key those overrides compose (vit_small's
    width) and, below each, what it does (its comment in the settings); `--resolve` resolves the interpolations; any
    other flag (`--hydra-help`, `--cfg job`) is Hydra's."""
    from vit.cli.train import print_help

    assert print_help(["--help", "model=vit_small", "data.batch_size=7"])
    shown = capsys.readouterr().out
    groups, keys = shown.split("== Configuration groups ==")[1].split("== Keys ==")
    assert "optim: adamw, lion, muon, sgd" in groups
    lines = keys.splitlines()
    assert "  model.embed_dim=384" in lines and "  data.batch_size=7" in lines
    assert not [line for line in lines if line.startswith("  hydra.")]
    budget = lines.index("  trainer.budget=null")
    assert lines[budget + 1].startswith("      null | a wall-clock budget for the whole run")
    assert "  optim.kwargs={}" in lines  # a mapping setting is one key
    assert "  model.patch_size=${data.patch_size}" in lines  # unresolved, as Hydra shows it
    assert print_help(["-h", "--resolve"]) and "${" not in capsys.readouterr().out.split("== Keys ==")[1]
    assert not print_help(["--hydra-help"]) and not print_help(["--help", "--cfg", "job"])
    assert not print_help(["model=vit_small"])
