"""trainer.keep_last keeps the newest epoch checkpoints; vit-average averages them into a
checkpoint that evaluation and fine-tuning read; trainer.grad_checkpointing trains exactly as without it."""

import json
import sys

import pytest
import torch
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, compose_config, load_script, run_cli

from vit.errors import ConfigError
from vit.tasks.build import build_model_from_config
from vit.train import run, validate
from vit.train.averaging import average_checkpoints
from vit.train.finetune import read_pretrained
from vit.weights.read import CheckpointError, load_checkpoint

BASE = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.deterministic=true"]
BASE += ["trainer.attn_maps_every_n_epochs=0", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1"]


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """Four epochs with trainer.keep_last=2."""
    run_dir = tmp_path_factory.mktemp("kept")
    metrics = run(compose_config([*BASE, "trainer.epochs=4", "trainer.keep_last=2"]), output_dir=run_dir)
    return run_dir, metrics


def test_keep_last_leaves_the_newest_epochs_beside_last_and_best(kept_run):
    run_dir, metrics = kept_run
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "epoch_0003.pt", "epoch_0004.pt", "last.pt"]
    assert [load_checkpoint(folder / f"epoch_000{n}.pt")["epoch"] for n in (3, 4)] == [3, 4]
    last, epoch4 = load_checkpoint(folder / "last.pt"), load_checkpoint(folder / "epoch_0004.pt")
    assert last["epoch"] == 4 and all(torch.equal(last["model"][k], v) for k, v in epoch4["model"].items())
    best_epoch = metrics["best"]["epoch"]
    assert load_checkpoint(folder / "best.pt")["epoch"] == best_epoch


def test_a_resumed_run_keeps_counting_its_epoch_files(tmp_path):
    run(compose_config([*BASE, "trainer.epochs=3", "trainer.keep_last=2", "trainer.stop_after_epoch=1"]), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch_*")) == ["epoch_0001.pt"]
    run(compose_config([*BASE, "trainer.epochs=3", "trainer.keep_last=2", "trainer.resume=auto"]), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch_*")) == ["epoch_0002.pt", "epoch_0003.pt"]


def test_averaging_two_checkpoints_gives_the_elementwise_mean(kept_run):
    folder = kept_run[0] / "checkpoints"
    a, b = (load_checkpoint(folder / f"epoch_000{n}.pt") for n in (3, 4))
    for which, key in (("raw", "model"), ("ema", "ema")):
        averaged = average_checkpoints([folder / "epoch_0003.pt", folder / "epoch_0004.pt"], which)
        assert averaged["model"].keys() == a[key].keys()
        for name, tensor in averaged["model"].items():
            torch.testing.assert_close(tensor, (a[key][name] + b[key][name]) / 2, rtol=0, atol=1e-7)
        differs = [n for n in a[key] if not torch.equal(a[key][n], b[key][n])]
        assert differs  # two epochs apart: the mean is not just one of them


def test_the_script_writes_a_checkpoint_that_evaluation_and_finetuning_read(kept_run, tmp_path, capsys, monkeypatch):
    from vit.cli.evaluate import cli

    run_dir = kept_run[0]
    out = tmp_path / "averaged.pt"
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:  # vit-average's entry point, in this process
        monkeypatch.setattr(sys, "argv", ["vit-average", f"run={run_dir}", f"out={out}"])
        load_script("average").console()
    assert done.value.code == 0
    assert "2 checkpoints (epoch_0003.pt, epoch_0004.pt)" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert cli([f"checkpoint={out}", "limit_batches=1"]) == 0  # evaluate.py's own entry point, in this process
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoint"] == str(out) and report["count"] == 32  # one batch of the run's data config
    config = compose_config([*BASE, f"model.pretrained={out}"])
    model = build_model_from_config(config.model, num_classes=10)
    weights = read_pretrained(config.model, model)
    assert weights is not None
    assert torch.equal(weights.state_dict["head.weight"], load_checkpoint(out)["model"]["head.weight"])
    with pytest.raises(CheckpointError, match="holds no optimizer or scheduler state"):
        run(compose_config([*BASE, "trainer.epochs=5", f"trainer.resume={out}"]), output_dir=tmp_path / "resume")
    # ema=true: the average is already of the EMA weights (the run had EMA), not "trained with trainer.ema=false"
    assert cli([f"checkpoint={out}", "ema=true", "limit_batches=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "holds no separate EMA weights: it is the average of the ema weights of 2 checkpoints" in line
    assert "trainer.ema=false" not in line


def test_checkpoints_of_other_models_are_not_averaged(kept_run, tmp_path):
    other = tmp_path / "other"
    run(compose_config([*BASE, "trainer.epochs=1", "model.embed_dim=48"]), output_dir=other)
    with pytest.raises(CheckpointError, match=r"is \([0-9, ]+\) torch.float32 in '.*other.*' but"):
        average_checkpoints([kept_run[0] / "checkpoints" / "last.pt", other / "checkpoints" / "last.pt"])


def test_bad_keep_last_and_bad_script_arguments_are_one_line(tmp_path, capsys):
    from vit.cli import average
    from vit.cli.args import run_script

    with pytest.raises(ConfigError, match=r"trainer.keep_last=0 must be >= 1 or null"):
        validate(compose_config([*BASE, "trainer.keep_last=0"]))
    done = run_cli([*BASE, "trainer.keep_last=0"], cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "trainer.keep_last=0" in done.stderr
    capsys.readouterr()
    assert run_script(average.main, [f"run={tmp_path}"], usage=average.__doc__) == 2  # the tool's own exit path
    err = capsys.readouterr().err
    assert "holds no epoch checkpoints" in err and err.strip().count("\n") == 0


def test_gradient_checkpointing_trains_exactly_as_without(tmp_path, caplog):
    args = [*BASE, "trainer.epochs=1", "model.drop_path_rate=0.1"]
    plain = run(compose_config(args), output_dir=tmp_path / "plain")
    caplog.set_level("INFO", logger="vit.train")
    recomputed = run(compose_config([*args, "trainer.grad_checkpointing=true"]), output_dir=tmp_path / "ckpt")
    assert "gradient checkpointing: the encoder blocks are recomputed" in caplog.text
    assert plain["history"][0]["train_loss"] == recomputed["history"][0]["train_loss"]
    a = load_checkpoint(tmp_path / "plain" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "ckpt" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
