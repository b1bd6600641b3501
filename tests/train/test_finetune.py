"""Fine-tuning: `model.pretrained` from every source kind through a real run, layer-wise lr decay against timm's,
`model.freeze=backbone`, the bad sources (exit 2, one line), and the exact resume of a fine-tuning run."""

import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed, resample_patch_embed
from timm.optim import param_groups_layer_decay
from trainer_utils import (
    QUICK_SYNTHETIC,
    REPO,
    TINY_MODEL,
    assert_measurement_record,
    compose_config,
    empty_image_tree,
    load_script,
    scales_by_name,
    train_exit_line,
)

from vit.errors import ConfigError
from vit.models import create_model, sinusoid_table
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.train.config import validate
from vit.train.finetune import read_pretrained
from vit.train.optimizer import build_optimizer, build_scheduler
from vit.weights.read import load_checkpoint

setup_phase = importlib.import_module("vit.train.setup")  # where a run builds its model and data
optimisation_phase = importlib.import_module("vit.train.assemble")  # where the optimizer is built on the model
CPU = ["trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0", "trainer.ema=false"]
# 5 classes at 32 px (patch 4: an 8 x 8 grid), a few steps.
TARGET = ["data=synthetic", "data.synthetic.num_train=32", "data.synthetic.num_val=16", "data.batch_size=16"]
TARGET += ["data.num_classes=5", "trainer.epochs=1", "trainer.limit_val_batches=1", *CPU]


def save_safetensors(state_dict, path):
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def timm_source():
    """timm's ViT-Ti/16 at 224 px (2 blocks to keep the runs short; timm's layout and init)."""
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2).state_dict()


def train_from(overrides, run_dir, monkeypatch):
    """A real run; returns (metrics, the weights the optimizer was built on, i.e. at step 0)."""
    seen = {}
    real = optimisation_phase.build_optimizer

    def spy(model, *args, **kwargs):
        seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real(model, *args, **kwargs)

    monkeypatch.setattr(optimisation_phase, "build_optimizer", spy)
    metrics = run(compose_config(overrides), output_dir=run_dir)
    return metrics, seen


def assert_equal_except(step0, source, skip):
    for key, value in source.items():
        if key not in skip:
            assert torch.equal(step0[key], value), key


# --- every source kind, through a run at another image size and class count ------------------------------------


@pytest.mark.parametrize("kind", ["safetensors", "wrapped_pth"])
def test_a_timm_state_dict_file_starts_the_run(kind, timm_source, tmp_path, monkeypatch):
    if kind == "safetensors":
        path = save_safetensors(timm_source, tmp_path / "vit_tiny.safetensors")
    else:
        path = tmp_path / "vit_tiny.pth"
        torch.save({"model": timm_source, "epoch": 300}, path)
    args = [*TARGET, "model=vit_tiny", "model.depth=2", f"model.pretrained={path}"]
    metrics, step0 = train_from(args, tmp_path / "run", monkeypatch)

    grid = resample_abs_pos_embed(timm_source["pos_embed"], [8, 8], [14, 14], num_prefix_tokens=1)
    torch.testing.assert_close(step0["pos_embed"], grid, rtol=0, atol=0)  # 224/16 -> 32/4: 14 x 14 -> 8 x 8
    kernel = resample_patch_embed(timm_source["patch_embed.proj.weight"], [4, 4])
    torch.testing.assert_close(step0["patch_embed.proj.weight"], kernel, rtol=0, atol=0)  # patch 16 -> 4
    assert step0["head.weight"].shape == (5, 192) and timm_source["head.weight"].shape == (1000, 192)
    assert_equal_except(step0, timm_source, {"pos_embed", "patch_embed.proj.weight", "head.weight", "head.bias"})
    assert metrics["final"]["step"] == 2  # and it trained: 32 images, batches of 16
    trained = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    assert not torch.equal(trained["blocks.0.attn.qkv.weight"], timm_source["blocks.0.attn.qkv.weight"])


def test_an_official_t2t_release_file_starts_the_run_with_its_ema_or_raw_weights(tmp_path, monkeypatch):
    """The release layout: {"state_dict_ema": ..., "state_dict": ...} in a .pth.tar, 224 px, 1000 classes (2 of
    T2T-ViT-7's blocks, to keep the run short)."""
    ema = create_model("t2t_vit_7", depth=2).state_dict()
    raw = {k: v + 0.01 if v.is_floating_point() else v for k, v in ema.items()}
    path = tmp_path / "71.7_T2T_ViT_7.pth.tar"
    torch.save({"state_dict_ema": ema, "state_dict": raw, "epoch": 310}, path)
    # 64 px with the paper's soft splits: a 4 x 4 token grid, the fixed sinusoid table recomputed for 17 tokens.
    args = [*TARGET, "model=t2t_vit_7", "model.depth=2", "data.img_size=64", "model.soft_split=imagenet"]
    args += [f"model.pretrained={path}", "data.batch_size=8", "trainer.limit_train_batches=2"]
    metrics, step0 = train_from(args, tmp_path / "ema", monkeypatch)
    torch.testing.assert_close(step0["pos_embed"], sinusoid_table(17, 256), rtol=0, atol=0)
    assert_equal_except(step0, ema, {"pos_embed", "head.weight", "head.bias"})
    assert step0["head.weight"].shape == (5, 256) and metrics["final"]["step"] == 2

    cfg = compose_config([*args, "model.pretrained_ema=false"])
    weights = read_pretrained(cfg.model, build_model_from_config(cfg.model, num_classes=5))
    assert_equal_except(weights.state_dict, raw, set())  # the raw weights, which the run would start from


@pytest.fixture(scope="module")
def our_run(tmp_path_factory):
    """last.pt of a short run of this trainer: the tiny ViT/4, 10 classes at 32 px, with EMA."""
    run_dir = tmp_path_factory.mktemp("source")
    args = [*QUICK_SYNTHETIC, *TINY_MODEL, *CPU, "trainer.ema=true", "trainer.ema_decay=0.5", "trainer.epochs=1"]
    args += ["data.synthetic.num_train=64", "trainer.limit_val_batches=1"]
    run(compose_config(args), output_dir=run_dir)
    return run_dir / "checkpoints" / "last.pt"


def test_a_checkpoint_of_ours_starts_the_run_with_its_ema_or_raw_weights(our_run, tmp_path, monkeypatch):
    state = load_checkpoint(our_run)
    assert not torch.equal(state["ema"]["cls_token"], state["model"]["cls_token"])  # two different sets
    args = [*TARGET, *TINY_MODEL, "data.img_size=48", f"model.pretrained={our_run}"]
    _, step0 = train_from(args, tmp_path / "run", monkeypatch)
    grid = resample_abs_pos_embed(state["ema"]["pos_embed"], [12, 12], [8, 8], num_prefix_tokens=1)
    torch.testing.assert_close(step0["pos_embed"], grid, rtol=0, atol=0)  # 32 -> 48 px: 8 x 8 -> 12 x 12
    assert step0["head.weight"].shape == (5, 32)
    assert_equal_except(step0, state["ema"], {"pos_embed", "head.weight", "head.bias"})

    cfg = compose_config([*args, "model.pretrained_ema=false"])
    weights = read_pretrained(cfg.model, build_model_from_config(cfg.model, num_classes=5))
    assert_equal_except(weights.state_dict, state["model"], set())  # the raw weights, which the run would start from


@pytest.mark.parametrize(
    ("source_name", "size", "old", "new"),
    [("vit_tiny_patch16_384", 224, 24, 14), ("vit_tiny_patch16_224", 384, 14, 24)],
)
def test_tables_of_384_and_224_px_are_resampled_for_each_other(source_name, size, old, new, tmp_path):
    """timm's 384 px checkpoints hold 1 + 24 * 24 = 577 rows, its 224 px ones 1 + 14 * 14 = 197."""
    from vit.weights.read import load_pretrained

    source = timm.create_model(source_name, pretrained=False, depth=1).state_dict()
    assert source["pos_embed"].shape == (1, 1 + old * old, 192)
    path = save_safetensors(source, tmp_path / "w.safetensors")
    model = load_pretrained(create_model("vit_tiny", depth=1, img_size=size), path)
    expected = resample_abs_pos_embed(source["pos_embed"], [new, new], [old, old], num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 1 + new * new, 192)
    torch.testing.assert_close(model.pos_embed.data, expected, rtol=0, atol=0)
    torch.testing.assert_close(model.pos_embed.data[:, :1], source["pos_embed"][:, :1], rtol=0, atol=0)


# --- layer-wise learning-rate decay ----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [12, 4])
def test_layer_decay_scales_equal_timms(depth):
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=depth)
    expected = scales_by_name(
        theirs, param_groups_layer_decay(theirs, 0.05, theirs.no_weight_decay(), layer_decay=0.65)
    )
    ours = create_model("vit_tiny", depth=depth)
    optimizer = build_optimizer(
        ours, {"name": "adamw", "weight_decay": 0.05, "layer_decay": 0.65}, 1e-3, ours.cls_token.device
    )
    got = scales_by_name(ours, optimizer.param_groups)
    assert got == expected
    assert got["head.weight"] == (1.0, 0.05) and got["pos_embed"] == (pytest.approx(0.65 ** (depth + 1)), 0.0)


def test_layer_decay_of_a_distilled_vit_equals_timms_deit():
    """The distillation token sits with the stem, as in timm's distilled DeiT; head_dist at the top with head."""
    theirs = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=4)
    expected = scales_by_name(
        theirs, param_groups_layer_decay(theirs, 0.05, theirs.no_weight_decay(), layer_decay=0.65)
    )
    ours = create_model("vit_tiny", depth=4, distill_token=True)
    optimizer = build_optimizer(
        ours, {"name": "adamw", "weight_decay": 0.05, "layer_decay": 0.65}, 1e-3, ours.cls_token.device
    )
    got = scales_by_name(ours, optimizer.param_groups)
    assert got == expected
    assert got["dist_token"] == (pytest.approx(0.65**5), 0.0) and got["head_dist.weight"] == (1.0, 0.05)


def test_t2t_layer_decay_follows_the_documented_assignment():
    """tokens-to-token module and cls token with the stem (layer 0), blocks.i at layer i + 1, the final norm with
    the last block, the head on top; the fixed position table does not train."""
    model = create_model("t2t_vit_7")
    optimizer = build_optimizer(
        model, {"name": "adamw", "weight_decay": 0.05, "layer_decay": 0.5}, 1e-3, model.cls_token.device
    )
    got = {name: scale for name, (scale, _) in scales_by_name(model, optimizer.param_groups).items()}
    for name in got:
        if name.startswith(("tokens_to_token.", "cls_token")):
            assert got[name] == 0.5**8, name
        elif name.startswith("blocks."):
            assert got[name] == 0.5 ** (7 - int(name.split(".")[1])), name
        elif name.startswith("norm."):
            assert got[name] == 0.5, name
        else:
            assert name.startswith("head.") and got[name] == 1.0, name
    assert "pos_embed" not in got and len(got) == sum(1 for p in model.parameters() if p.requires_grad)


def test_the_schedule_runs_every_group_at_its_scale():
    model = create_model("vit_tiny", depth=2)
    optimizer = build_optimizer(
        model, {"name": "sgd", "weight_decay": 0.0, "layer_decay": 0.5}, 0.1, model.cls_token.device
    )
    scheduler = build_scheduler(optimizer, {"name": "cosine", "warmup_epochs": 0, "min_lr": 0.0}, 1, 10)
    lrs = sorted({(g["lr_scale"], g["lr"]) for g in optimizer.param_groups}, reverse=True)
    assert lrs == [(1.0, 0.1), (0.5, 0.05), (0.25, 0.025), (0.125, 0.0125)]  # the first step already scaled
    assert optimizer.param_groups[0]["lr_scale"] == 1.0  # group 0 (train/lr in the logs) is the head's
    scheduler.step_update(num_updates=5)
    head, stem = optimizer.param_groups[0]["lr"], optimizer.param_groups[-1]["lr"]
    assert 0 < head < 0.1 and stem == pytest.approx(head * 0.125)


# --- freezing --------------------------------------------------------------------------------------------------


def test_a_frozen_backbone_trains_the_head_alone(timm_source, tmp_path, monkeypatch, caplog):
    path = save_safetensors(timm_source, tmp_path / "w.safetensors")
    args = [*TARGET, "model=vit_tiny", "model.depth=2", f"model.pretrained={path}", "model.freeze=backbone"]
    args += ["optim.layer_decay=0.75", "trainer.accum_steps=2", "trainer.ema=true", "trainer.ema_decay=0.5"]
    args += ["data.synthetic.num_train=64"]
    with caplog.at_level(logging.INFO, logger="vit.train"):
        metrics, step0 = train_from(args, tmp_path / "run", monkeypatch)
    assert "training 965 of " in caplog.text  # 5 x 192 + 5
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert metrics["final"]["step"] == 2  # 4 batches, 2 accumulated into each step
    for weights in (state["model"], state["ema"]):  # the EMA of frozen weights is the weights
        changed = {k for k in step0 if not torch.equal(step0[k], weights[k])}
        assert changed == {"head.weight", "head.bias"}
    groups = state["optimizer"]["param_groups"]
    assert sum(len(g["params"]) for g in groups) == 2 and len(state["optimizer"]["state"]) == 2


# --- bad sources: exit 2, one line -----------------------------------------------------------------------------


class RunsCode:
    """Unpickling this would create a marker file: weights_only=True must refuse before that happens."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def exit_line(overrides, tmp_path, monkeypatch, capsys) -> str:
    return train_exit_line([*TARGET, *overrides], tmp_path, monkeypatch, capsys)


def test_bad_source_files_exit_2_naming_path_and_problem(timm_source, tmp_path, monkeypatch, capsys):
    vit_tiny = ["model=vit_tiny", "model.depth=2"]
    missing = tmp_path / "nowhere.safetensors"
    line = exit_line([*vit_tiny, f"model.pretrained={missing}"], tmp_path, monkeypatch, capsys)
    assert line.startswith(f"checkpoint error: model.pretrained='{missing}': no such file (give timm:<name>")

    cut = save_safetensors(timm_source, tmp_path / "cut.safetensors")
    cut.write_bytes(cut.read_bytes()[:50_000])
    line = exit_line([*vit_tiny, f"model.pretrained={cut}"], tmp_path, monkeypatch, capsys)
    assert f"cannot read safetensors file '{cut}'" in line

    cut_pth = tmp_path / "cut.pth"
    torch.save(timm_source, cut_pth)
    cut_pth.write_bytes(cut_pth.read_bytes()[:50_000])
    line = exit_line([*vit_tiny, f"model.pretrained={cut_pth}"], tmp_path, monkeypatch, capsys)
    assert "with weights_only=True: the file is truncated or corrupted" in line

    marker, evil = tmp_path / "code-ran", tmp_path / "evil.pth"
    torch.save({"state_dict": timm_source, "extra": RunsCode(marker)}, evil)
    line = exit_line([*vit_tiny, f"model.pretrained={evil}"], tmp_path, monkeypatch, capsys)
    assert "holds pickled objects other than tensors" in line and "GLOBAL io.open" in line
    assert not marker.exists()


def test_weights_that_do_not_fit_exit_2_naming_the_keys(timm_source, tmp_path, monkeypatch, capsys):
    resnet = save_safetensors(
        {"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.weight": torch.zeros(10, 512)}, tmp_path / "r.safetensors"
    )
    line = exit_line(["model=vit_tiny", f"model.pretrained={resnet}"], tmp_path, monkeypatch, capsys)
    assert line.endswith(
        "holds no ViT or T2T-ViT weights (no blocks.<i>.* keys with a blocks.0.norm1; its first keys: "
        "conv1.weight, fc.weight)"
    )

    path = save_safetensors(timm_source, tmp_path / "w.safetensors")
    line = exit_line(["model=vit_tiny", "model.depth=3", f"model.pretrained={path}"], tmp_path, monkeypatch, capsys)
    assert "is a model 192 wide and 2 deep, the configured one has model.depth=3: set model.depth=2" in line
    line = exit_line(["model=vit_small", "model.depth=2", f"model.pretrained={path}"], tmp_path, monkeypatch, capsys)
    assert "the configured one has model.embed_dim=384: set model.embed_dim=192" in line

    broken = dict(timm_source)
    broken.pop("blocks.1.mlp.fc2.bias")
    broken["blocks.0.attn.qkv.weight"] = broken["blocks.0.attn.qkv.weight"][:100]
    path = save_safetensors(broken, tmp_path / "broken.safetensors")
    line = exit_line(["model=vit_tiny", "model.depth=2", f"model.pretrained={path}"], tmp_path, monkeypatch, capsys)
    assert "1 missing keys (e.g. blocks.1.mlp.fc2.bias)" in line
    assert "blocks.0.attn.qkv.weight: checkpoint (100, 192) vs model (576, 192)" in line


def test_timm_names_are_checked_and_offline_is_said_in_one_line(tmp_path, monkeypatch, capsys):
    line = exit_line(["model.pretrained=timm:vit_tinny_patch16_224"], tmp_path, monkeypatch, capsys)
    assert line.startswith("checkpoint error: model.pretrained='timm:vit_tinny_patch16_224': timm has no model")
    assert "close names: vit_tiny_patch16_224" in line

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    line = exit_line(["model.pretrained=timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k"], tmp_path, monkeypatch, capsys)
    assert "cannot download the weights" in line and f"not in timm's cache {tmp_path / 'hub'}" in line
    file = "vit_tiny_patch16_224.augreg_in21k_ft_in1k.safetensors"
    assert line.endswith(f"or give a file: model.pretrained_file=/path/to/{file}")


def test_cached_timm_weights_load_without_a_network(tmp_path, monkeypatch):
    """timm's weights in the hub cache (the layout huggingface_hub writes) and no network: read from the cache
    at once, with the head count timm's model records."""
    from huggingface_hub import constants

    from vit.weights.read import read_weights

    source = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    repo = tmp_path / "hub" / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    save_safetensors(source.state_dict(), repo / "snapshots" / ("0" * 40) / "model.safetensors")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    weights = read_weights("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert weights.num_heads == 3 and weights.where == "timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    assert_equal_except(weights.state_dict, source.state_dict(), set())


def test_a_checkpoint_trained_on_other_classes_gets_a_fresh_head_at_the_same_count():
    from vit.train.finetune import load_pretrained_weights
    from vit.weights.fit import Weights

    source = create_model("vit_tiny", depth=1, num_classes=2).state_dict()
    for classes, kept in ((["cat", "dog"], True), (["car", "ship"], False)):
        weights = Weights(source, "last.pt", 3, class_to_idx={"cat": 0, "dog": 1})
        model = create_model("vit_tiny", depth=1, num_classes=2)
        fresh = model.head.weight.detach().clone()
        load_pretrained_weights(model, weights, {name: i for i, name in enumerate(classes)})
        assert torch.equal(model.head.weight, source["head.weight"] if kept else fresh), classes
        assert torch.equal(model.blocks[0].attn.qkv.weight, source["blocks.0.attn.qkv.weight"])


@pytest.mark.slow
def test_timm_offline_through_the_cli(tmp_path):
    """The real command line: no download attempt, no traceback, one line, exit 2."""
    cache = tmp_path / "hub"
    args = [sys.executable, str(REPO / "train.py"), "data=synthetic", f"hydra.run.dir={tmp_path / 'run'}", *CPU]
    args += ["model.pretrained=timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert line.startswith("checkpoint error: model.pretrained='timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k': ")
    assert f"not in timm's cache {cache}" in line


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.freeze=partial", "model.freeze='partial' must be one of ('none', 'backbone')"),
        ("optim.layer_decay=1.5", "optim.layer_decay=1.5 must be in (0, 1] or null"),
        ("optim.layer_decay=abc", "optim.layer_decay='abc' must be a number"),
        ("model.pretrained_ema=maybe", "model.pretrained_ema='maybe' must be true or false"),
        ("model.pretrained=''", "model.pretrained='' must be null, timm:<model name> or a path"),
    ],
)
def test_bad_fine_tuning_settings_are_named(override, message):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["data=synthetic", override]))
    assert str(err.value).startswith(message)


# --- resume ----------------------------------------------------------------------------------------------------


def test_a_resumed_fine_tuning_run_continues_from_its_own_checkpoint(tmp_path):
    """Stopped after epoch 1 and resumed (with the pretrained file gone: it is not read again), it ends with the
    weights of an uninterrupted run."""
    source = create_model("vit_tiny", embed_dim=32, depth=2, num_heads=2, img_size=64, patch_size=8).state_dict()
    path = save_safetensors(source, tmp_path / "source.safetensors")
    base = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=2", "trainer.device=cpu", "trainer.deterministic=true"]
    base += ["data.synthetic.num_train=96", "trainer.limit_val_batches=1", "trainer.attn_maps_every_n_epochs=0"]
    base += ["data.augment.crop=pad", "model.drop_path_rate=0.1"]
    base += [f"model.pretrained={path}", "optim.layer_decay=0.75"]
    run(compose_config(base), output_dir=tmp_path / "straight")
    run(compose_config([*base, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    path.rename(tmp_path / "moved.safetensors")
    resumed = run(compose_config([*base, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    assert [r["epoch"] for r in resumed["history"]] == [1, 2]
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 6
    for part in ("model", "ema"):
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)


# --- the recipes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["finetune_cifar10", "linear_probe"])
def test_the_recipes_compose_with_their_source_and_settings(name, tmp_path):
    cfg = compose_config([f"experiment={name}", "data=imagefolder", f"data.root={tmp_path}"])
    validate(cfg)
    assert cfg.model.name == "vit_small" and cfg.model.pretrained == "timm:vit_small_patch16_224.augreg_in21k_ft_in1k"
    assert (cfg.data.img_size, cfg.model.patch_size, cfg.data.num_classes) == (224, 16, 10)
    assert cfg.model.freeze == ("backbone" if name == "linear_probe" else "none")
    assert cfg.optim.layer_decay == (0.65 if name == "finetune_cifar10" else None)


@pytest.mark.slow
def test_vit_small_fine_tunes_from_a_timm_file_at_224_px_through_the_cli(tmp_path):
    """`train.py model=vit_small model.pretrained=<timm vit_small file> data=imagefolder ... data.img_size=224`:
    a fresh 3-class head, two steps."""
    from PIL import Image

    for split in ("train", "test"):
        for c, name in enumerate(("cat", "dog", "owl")):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (40, 40), (80 * c, 10 * i, 100)).save(tmp_path / "data" / split / name / f"{i}.png")
    source = timm.create_model("vit_small_patch16_224", pretrained=False).state_dict()
    path = save_safetensors(source, tmp_path / "vit_small.safetensors")
    args = ["model=vit_small", f"model.pretrained={path}", "data=imagefolder", f"data.root={tmp_path / 'data'}"]
    args += ["data.img_size=224", "data.batch_size=4", "data.num_workers=0", "trainer.epochs=1", *CPU]
    args += [f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "classifier: checkpoint has 1000 classes, model has 3; head re-initialised" in done.stdout + done.stderr
    trained = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert trained["step"] == 3 and trained["model"]["head.weight"].shape == (3, 384)


@pytest.mark.slow
def test_two_ranks_fine_tune_to_the_weights_of_one_process(tmp_path):
    """torchrun, gloo, 2 ranks of 16 against 1 process of 32: the same pretrained start (read by every rank), layer
    decay and EMA, the same weights to fp32 tolerance."""
    source = create_model("vit_tiny", embed_dim=32, depth=2, num_heads=2, img_size=64, patch_size=8).state_dict()
    path = save_safetensors(source, tmp_path / "source.safetensors")
    common = ["data=synthetic", "data.synthetic.num_train=128", "data.synthetic.num_val=32", *TINY_MODEL]
    common += ["model.drop_path_rate=0.0", "trainer.epochs=1", "trainer.device=cpu", "trainer.ema=true"]
    common += ["trainer.attn_maps_every_n_epochs=0", f"model.pretrained={path}", "optim.layer_decay=0.75"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    states = []
    for nproc, batch in ((1, 32), (2, 16)):
        launcher = [sys.executable] + (
            ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] * (nproc > 1)
        )
        run_dir = tmp_path / f"ranks{nproc}"
        args = [str(REPO / "train.py"), *common, f"data.batch_size={batch}", f"hydra.run.dir={run_dir}"]
        done = subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        states.append(load_checkpoint(run_dir / "checkpoints" / "last.pt"))
    assert states[0]["step"] == states[1]["step"] == 4
    for part in ("model", "ema"):
        for key in states[0][part]:
            torch.testing.assert_close(states[1][part][key], states[0][part][key], atol=2e-5, rtol=1e-4, msg=key)


def test_the_experiment_script_records_every_seed_beside_its_provenance(tmp_path, monkeypatch):
    """lab/transfer_experiment.py with its train.py runs answered from a table (the runs themselves: the tests
    above): results.json is its measurement record, each seed's run and the summary beside the provenance."""
    script = load_script("transfer_experiment")
    empty_image_tree(tmp_path / "data", (*script.SOURCE_CLASSES, *script.TARGET_CLASSES))
    top1 = {"pretrain": 70.0, "finetune": 60.0, "probe": 50.0, "scratch": 40.0}

    def train(name, overrides, work):
        method, _, seed = name.partition("-")
        final = {"val_top1": top1[method] - 5, "step": 10}
        return {"test": {"top1": top1[method] + int(seed or 0)}, "final": final, "wall_time_s": 1.0}

    monkeypatch.setattr(script, "train", train)
    work = tmp_path / "work"
    assert script.main([f"data={tmp_path / 'data'}", f"work={work}", "seeds=0,2"]) == 0
    record = json.loads((work / "results.json").read_text())
    assert_measurement_record(record, "transfer_experiment", "seeds=0,2")
    assert record["runs"]["probe-2"]["test"]["top1"] == 52.0
    assert "model.freeze=backbone" in record["commands"]["probe-2"]
    assert record["summary"]["finetune"]["test_top1"] == [60.0, 62.0]
    assert record["summary"]["pretrain"]["val_top1"] == 65
    assert record["settings"]["epochs"] == 40


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["seeds=0 1"], "seeds='0 1' must be whole numbers >= 0"),
        (["source_per_class=-5"], "source_per_class='-5' must be an integer >= 1"),
        (["plot_only=maybe"], "plot_only='maybe' must be true or false"),
        (["--epochs", "4"], "argument '--epochs' must look like key=value"),
    ],
)
def test_the_experiment_script_says_a_bad_argument_in_one_line_with_exit_code_2(args, named, tmp_path, capsys):
    from vit.cli.args import run_script

    script = load_script("transfer_experiment")
    script.train = None  # nothing trains: the arguments are read first
    assert run_script(script.main, [f"data={tmp_path}", f"work={tmp_path / 'work'}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("usage error: ") and named in err[0], err
