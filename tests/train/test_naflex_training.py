"""Training on NaFlex batches (data.naflex): a run trains on the token budget's batches, evaluates on whole
images, stops and resumes to the same weights; the settings it cannot run with are refused, naming the key."""

import json

import pytest
import torch
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, assert_resumes_exactly, compose_config, mixed_shape_tree

from vit.data.loading.naflex_loader import batch_schedule
from vit.errors import ConfigError
from vit.train import run
from vit.train.config import validate
from vit.weights.read import load_checkpoint

BASE = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.deterministic=true", "trainer.seed=0"]
BASE += ["data.img_size=32"]
BASE += ["data.patch_size=4", "data.augment.crop=pad", "trainer.attn_maps_every_n_epochs=0"]
NAFLEX = [*BASE, "data.naflex.seq_lens=[16,64]"]


def test_a_naflex_run_trains_on_the_budget_batches_and_resumes_exactly(tmp_path):
    runs = [*NAFLEX, "trainer.epochs=2"]
    straight = run(compose_config(runs), output_dir=tmp_path / "straight")
    # 256 images, a budget of 32 x 64 tokens: batches of 128 images at 16 tokens or 32 at 64, the same every epoch
    schedule = batch_schedule(256, (16, 64), 32 * 64, seed=0)
    assert {size for _, size, _ in schedule} == {128, 32}
    assert [r["step"] for r in straight["history"]] == [len(schedule), 2 * len(schedule)]
    assert straight["history"][-1]["val_top1"] is not None  # evaluated on whole images
    run(compose_config([*runs, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    run(compose_config([*runs, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    run(compose_config([*BASE, "trainer.epochs=2"]), output_dir=tmp_path / "fixed")
    fixed = load_checkpoint(tmp_path / "fixed" / "checkpoints" / "last.pt")["model"]
    assert any(not torch.equal(a[key], fixed[key]) for key in a)  # the NaFlex batches trained something else


def test_a_folder_of_mixed_shapes_trains_at_their_shapes_resumes_and_evaluates(tmp_path, capsys):
    """The torch loader: wide, tall and square files each at its own shape; stopped after an epoch and resumed,
    the weights of the uninterrupted run; then evaluated whole at their shapes (vit-eval seq_len=)."""
    from vit.cli import evaluate as evaluate_tool

    root = mixed_shape_tree(tmp_path / "tree")
    runs = [*TINY_MODEL, "data=imagefolder", f"data.root={root}", "data.img_size=32", "data.patch_size=4"]
    runs += ["data.batch_size=2", "data.loader=torch", "data.num_workers=0", "data.naflex.seq_lens=[16,64]"]
    runs += ["trainer.device=cpu", "trainer.deterministic=true", "trainer.epochs=2"]
    runs += ["trainer.attn_maps_every_n_epochs=0"]
    run(compose_config(runs), output_dir=tmp_path / "straight")
    run(compose_config([*runs, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    run(compose_config([*runs, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    last = tmp_path / "straight" / "checkpoints" / "last.pt"
    a, b = (load_checkpoint(path)["model"] for path in (last, tmp_path / "resumed" / "checkpoints" / "last.pt"))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    capsys.readouterr()
    assert evaluate_tool.main([f"checkpoint={last}", "seq_len=64", "amp=none", "device=cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 12 and result["seq_len"] == 64


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["data.naflex.seq_lens=[0,16]"], r"data.naflex.seq_lens=\[0, 16\]: 0 is not a token count"),
        (["data.naflex.seq_lens=sixteen"], "must be a list of token counts"),
        (["data.naflex.max_seq_len=32"], "max_seq_len=32 is below the longest"),
        (["model.patch_embed=conv"], "needs a ViT with the standard patch embedding"),
        (["model=t2t_vit_7"], "needs a ViT with the standard patch embedding"),
        (["data.augment.mixup_alpha=0.8"], "mixes no images"),
        (["trainer.progressive_resize.min_size=16"], "already trains at several sizes"),
        (["task=mae"], "not the mae task"),
        (["data.naflex.patch_sizes=[0,4]"], r"data.naflex.patch_sizes=\[0, 4\]: 0 is not a patch side"),
    ],
)
def test_settings_naflex_cannot_run_with_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(compose_config([*NAFLEX, *overrides]))


@pytest.mark.parametrize("setting", ["data.naflex.max_seq_len=64", "data.naflex.patch_sizes=[2,4]"])
def test_a_naflex_setting_without_naflex_batches_is_named_not_ignored(setting):
    with pytest.raises(ConfigError, match="is a setting of NaFlex batches: add data.naflex.seq_lens"):
        validate(compose_config([*BASE, setting]))


def test_a_run_of_random_patch_sizes_trains_and_resumes_exactly(tmp_path):
    """data.naflex.patch_sizes=[2,4] on the resident loader: batches of 2 px patches (the kernel resampled from 4
    px) among 4 px ones; stopped after an epoch and resumed, the weights of the uninterrupted run."""
    assert_resumes_exactly([*NAFLEX, "data.naflex.patch_sizes=[2,4]", "trainer.epochs=2"], tmp_path)
    assert {patch for _, _, patch in batch_schedule(256, (16, 64), 32 * 64, 0, (2, 4))} == {2, 4}  # both trained
