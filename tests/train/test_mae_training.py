"""task=mae through the trainer: pretraining on images with or without labels, exact resume, the reconstructions
figure, the checkpoint fine-tuning a classifier, and the settings it refuses (the model itself: test_mae.py)."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trainer_utils import (
    QUICK,
    QUICK_SYNTHETIC,
    TINY_MODEL,
    assert_resumes_exactly,
    compose_config,
    load_script,
    make_tree,
    noise_image,
    run_cli,
)

from vit.data.errors import DataError
from vit.data.sources.registry import build_splits
from vit.errors import ConfigError
from vit.tasks.build import build_mae_from_config
from vit.train import run
from vit.train.config import validate
from vit.train.report import reconstruction_image
from vit.weights.read import load_checkpoint

DECODER = ["mae.decoder_embed_dim=32", "mae.decoder_depth=1", "mae.decoder_num_heads=4"]
# Two short epochs of pretraining of the tiny model on the CPU; MAE on the synthetic images (their labels unread).
PRETRAIN = ["task=mae", *TINY_MODEL, *DECODER, "trainer.device=cpu", "trainer.epochs=2", "sched.warmup_epochs=1"]
MAE = [*PRETRAIN, *QUICK_SYNTHETIC, "trainer.limit_train_batches=4"]


def test_pretraining_resumes_exactly_and_records_the_loss(tmp_path):
    straight, _, weights = assert_resumes_exactly(MAE, tmp_path)
    assert any(k.startswith("decoder_blocks.") for k in weights) and "mask_token" in weights
    assert "head.weight" not in weights
    events = EventAccumulator(str(tmp_path / "straight" / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    assert {"train/loss", "train/lr", "val/loss"} <= set(events.Tags()["scalars"])
    assert "val/top1" not in events.Tags()["scalars"]
    assert events.Tags()["images"] == ["mae/original_masked_reconstruction"]  # after the last epoch
    last = straight["final"]
    assert last["val_top1"] is None and np.isfinite(last["val_loss"]) and "test" not in straight
    assert straight["task"] == "mae" and straight["best"]["val_loss"] == min(r["val_loss"] for r in straight["history"])


@pytest.mark.parametrize(("task", "expected"), [("mae", 0.42), ("classify", 61.5)])
def test_the_hydra_task_returns_the_runs_score(task, expected, monkeypatch):
    """What a sweeper optimises: the reconstruction loss of a pretraining run, the top-1 of a classifier."""
    import vit.train
    from vit.cli.train import train_task

    final = {"val_loss": 0.42, "val_top1": None if task == "mae" else 61.5}
    monkeypatch.setattr(vit.train, "run", lambda cfg: {"task": task, "final": final})
    assert train_task(compose_config(MAE if task == "mae" else QUICK)) == expected


def test_the_validation_loss_uses_the_same_masks_every_time(tmp_path):
    """Evaluating the same weights twice gives the same loss: the masks are fixed, not drawn anew."""
    from vit.data import build_data
    from vit.tasks.evaluation import evaluate_reconstruction

    cfg = compose_config(MAE)
    model = build_mae_from_config(cfg.model, cfg.mae)
    bundle = build_data(cfg.data, device=torch.device("cpu"), seed=0)
    first = evaluate_reconstruction(model, bundle.val_loader, torch.device("cpu"), None)
    torch.manual_seed(123)  # the global generator is not what draws the masks
    second = evaluate_reconstruction(model, bundle.val_loader, torch.device("cpu"), None)
    assert first == second and first["count"] == 64


def test_the_pretrained_encoder_fine_tunes_a_classifier(tmp_path):
    run(compose_config(MAE), output_dir=tmp_path / "mae")
    source = tmp_path / "mae" / "checkpoints" / "last.pt"
    overrides = [*QUICK, "trainer.epochs=1", "trainer.limit_train_batches=2", f"model.pretrained={source}"]
    metrics = run(compose_config([*overrides, "optim.layer_decay=0.75"]), output_dir=tmp_path / "ft")
    pretrained = load_checkpoint(source)["model"]
    tuned = load_checkpoint(tmp_path / "ft" / "checkpoints" / "last.pt")["model"]
    assert "head.weight" in tuned and not any(k.startswith(("decoder", "mask_token")) for k in tuned)
    # One layer-decayed epoch moves the encoder a little from where pretraining left it, not back to a fresh init.
    diff = (tuned["blocks.0.attn.qkv.weight"] - pretrained["blocks.0.attn.qkv.weight"]).abs().max()
    assert 0 < diff < 0.05
    assert np.isfinite(metrics["final"]["val_top1"])


def test_an_image_folder_without_labels_pretrains(tmp_path):
    """A pool of images in no class layout (nested at any depth), validated on data.holdout of them."""
    pool = tmp_path / "pool"
    for i in range(24):
        folder = pool / ("a" if i % 2 else "b/c")
        folder.mkdir(parents=True, exist_ok=True)
        noise_image("RGB", 20, seed=i).save(folder / f"{i}.jpg")
    data = ["data=imagefolder", f"data.root={pool}", "data.unlabelled=true", "data.img_size=16", "data.patch_size=4"]
    data += ["data.batch_size=8", "data.num_workers=0"]
    splits = build_splits(compose_config([*PRETRAIN, *data, "data.holdout=4"]).data)
    assert (len(splits.train), len(splits.val), splits.class_to_idx) == (20, 4, {"images": 0})
    metrics = run(compose_config([*PRETRAIN, *data, "data.holdout=4"]), output_dir=tmp_path / "run")
    assert metrics["final"]["val_loss"] > 0 and metrics["num_classes"] == 1
    with pytest.raises(DataError, match=r"data.unlabelled=true set data.holdout=<n>"):
        build_splits(compose_config([*PRETRAIN, *data]).data)


def test_a_labelled_tree_pretrains_with_its_labels_unread(tmp_path):
    root = make_tree(tmp_path / "tree", per_class=4)
    data = ["data=imagefolder", f"data.root={root}", "data.unlabelled=true", "data.img_size=16", "data.patch_size=4"]
    splits = build_splits(compose_config([*PRETRAIN, *data]).data)
    assert (len(splits.train), len(splits.val), set(splits.train.targets)) == (12, 6, {0})


def test_the_reconstruction_image_shows_three_views_per_image():
    cfg = compose_config(MAE)
    model = build_mae_from_config(cfg.model, cfg.mae)
    images = torch.randn(2, 3, 32, 32)
    grid = reconstruction_image(model, images, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    # make_grid: 3 columns and 2 rows of 32 px tiles with 2 px padding around each.
    assert grid.dtype == torch.uint8 and tuple(grid.shape) == (3, 2 + 2 * 34, 2 + 3 * 34)
    assert torch.equal(reconstruction_image(model, images, (0.5,) * 3, (0.25,) * 3), grid)  # the same masks


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["mae.mask_ratio=0"], "mae.mask_ratio=0 must be in (0, 1)"),
        (["mae.decoder_num_heads=3"], "mae.decoder_num_heads=3 must divide mae.decoder_embed_dim=32"),
        (["model=t2t_vit_7"], "model.name='t2t_vit_7' is a T2T-ViT"),
        (["model.pos_embed=rope"], "task=mae: model.pos_embed='rope' is not supported"),
        (["model.pos_embed=rope_dinov3"], "task=mae: model.pos_embed='rope_dinov3' is not supported"),
        (
            ["model.pos_embed=factorized", "model.no_embed_class=true"],
            "task=mae: model.pos_embed='factorized' is not supported",
        ),
        (["model.global_pool=avg"], "task=mae: model.global_pool='avg'"),
        (["data.augment.mixup_alpha=0.8"], "task=mae reads no labels: data.augment.mixup_alpha=0.8 must be 0"),
        (["trainer.attn_maps_every_n_epochs=5"], "trainer.attn_maps_every_n_epochs=5 must be 0"),
        (["trainer.eval_flip=true"], "trainer.eval_flip=true is unused"),
        (["trainer.eval_shift=1"], "trainer.eval_shift=1 is unused"),
        (["model.reg_tokens=4"], "task=mae: model.the masked autoencoder keeps the cls token and nothing else"),
    ],
)
def test_settings_pretraining_cannot_take_are_refused_by_name(overrides, needle):
    cfg = compose_config([*MAE, *overrides])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
        build_mae_from_config(cfg.model, cfg.mae)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_labels_off_is_refused_for_a_classifier():
    with pytest.raises(ConfigError, match="data.unlabelled=true reads no labels, which a classifier needs"):
        validate(compose_config([*TINY_MODEL, "data=imagefolder", "data.root=.", "data.unlabelled=true"]))


def test_the_command_line_refuses_a_bad_mask_ratio_in_one_line(tmp_path):
    result = run_cli(["task=mae", *TINY_MODEL, "data=synthetic", "mae.mask_ratio=1.5"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("mae.mask_ratio=1.5 must be in (0, 1)")


def test_an_official_mae_file_continues_pretraining_strictly(tmp_path):
    """A release file of the official code ({"model": encoder + decoder}, the same names) loads into task=mae
    whole, decoder included, so pretraining goes on from it."""
    from vit.train.finetune import load_pretrained_weights, read_pretrained

    cfg = compose_config(MAE)
    torch.manual_seed(1)
    source = build_mae_from_config(cfg.model, cfg.mae).state_dict()
    torch.save({"model": source}, tmp_path / "mae_pretrain_vit_tiny.pth")
    cfg = compose_config([*MAE, f"model.pretrained={tmp_path / 'mae_pretrain_vit_tiny.pth'}"])
    torch.manual_seed(2)
    model = build_mae_from_config(cfg.model, cfg.mae)
    load_pretrained_weights(model, read_pretrained(cfg.model, model))
    loaded = model.state_dict()
    assert loaded.keys() == source.keys() and all(torch.equal(loaded[k], source[k]) for k in source)


def test_the_figure_script_draws_a_run_and_the_deploy_scripts_refuse_it(tmp_path):

    from vit.cli.args import run_script
    from vit.deploy.loaded_model import WeightsError, read_source
    from vit.deploy.loaded_model import build_model as build_deploy_model

    run(compose_config(MAE), output_dir=tmp_path / "mae")
    checkpoint = tmp_path / "mae" / "checkpoints" / "last.pt"
    for i in range(2):
        noise_image("RGB", 32, seed=i).save(tmp_path / f"{i}.png")
    script = load_script("plot_mae")
    out = tmp_path / "mae.png"
    args = [f"checkpoint={checkpoint}", f"image={tmp_path}", f"out={out}", "max_images=2"]
    assert run_script(script.main, args, usage=script.__doc__) == 0 and out.stat().st_size > 0
    with pytest.raises(WeightsError, match="is a masked-autoencoder pretraining run .task=mae. and has no classifier"):
        build_deploy_model(read_source(str(checkpoint)), str(checkpoint))


def test_an_unlabelled_tree_names_a_missing_val_split_and_pools_every_image_with_a_holdout(tmp_path, caplog):
    root = make_tree(tmp_path / "tree", per_class=4)
    data = ["data=imagefolder", f"data.root={root}", "data.unlabelled=true", "data.img_size=16", "data.patch_size=4"]
    with pytest.raises(DataError, match=r"data.val_split='dev': .*dev does not exist"):
        build_splits(compose_config([*PRETRAIN, *data, "data.val_split=dev"]).data)
    # With data.holdout every image under the root is the pool, val/'s too (no labels to keep apart); one line says so.
    with caplog.at_level(logging.INFO, logger="vit.data"):
        splits = build_splits(compose_config([*PRETRAIN, *data, "data.holdout=2"]).data)
    assert (len(splits.train), len(splits.val)) == (16, 2)  # train/'s 12 and val/'s 6 images, 2 of them held out
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.unlabelled=true")]
    assert said == [
        "data.unlabelled=true: every image under data.root is the pool (18 images; train/, val/), data.holdout=2 "
        "of them held out for validation"
    ]
    shutil.rmtree(root / "val")
    splits = build_splits(compose_config([*PRETRAIN, *data, "data.holdout=2"]).data)
    assert (len(splits.train), len(splits.val)) == (10, 2)  # train/'s 12 images, 2 of them held out
