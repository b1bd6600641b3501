"""Sharded data parallel (trainer.strategy=fsdp, FSDP2) on the CPU with gloo: two ranks train to the weights of one
process with the same global batch (as DDP does, tests/train/test_distributed.py), with gradient accumulation,
clipping and an EMA; their sharded checkpoint resumes in one process (DCP reshards 2 -> 1) to the weights of the
uninterrupted run; every reader takes the folder, and vit-consolidate writes it as one file.

Why the runs should agree: each parameter's shard is updated from the reduce-scattered mean gradient, which is
the mean over the global batch; the clipping norm is computed over all shards; nothing random remains inside a
step (no drop path, no augmentation)."""

import os
import pickle

import pytest
import torch
from trainer_utils import TINY_MODEL, run_cli, run_ranks

from vit.engine.weights import CheckpointError, load_checkpoint
from vit.models.weights_file import WeightsFileError, read_weights_file

# 256 training images = 8 global batches of 32 per epoch.
COMMON = ["data=synthetic", "data.synthetic.num_train=256", "data.synthetic.num_val=60", *TINY_MODEL]
COMMON += ["model.drop_path_rate=0.0", "trainer.epochs=2", "trainer.device=cpu", "trainer.ema=true"]
COMMON += ["trainer.log_every_n_steps=4", "trainer.attn_maps_every_n_epochs=0", "trainer.progress=log"]
# 2 ranks x 8 images x 2 micro-batches: the global batch of 32.
SHARDED = ["trainer.strategy=fsdp", "data.batch_size=8", "trainer.accum_steps=2", "trainer.keep_last=1"]


def assert_close_weights(a: dict, b: dict, atol=2e-5) -> None:
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"])
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], atol=atol, rtol=1e-4, msg=key)


def finished(run_dir, proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    return finished(run_dir, run_cli([*COMMON, "data.batch_size=32", f"hydra.run.dir={run_dir}"], run_dir))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fsdp")
    proc = run_ranks([*COMMON, *SHARDED, f"hydra.run.dir={run_dir}"], run_dir, nproc=2)
    return run_dir, proc, finished(run_dir, proc)


def test_two_sharded_ranks_match_one_process_with_the_same_global_batch(single, sharded):
    run_dir, proc, state = sharded
    assert "sharded data parallel (trainer.strategy=fsdp): each block and the root over 2 processes, ZeRO-3" in (
        proc.stdout + proc.stderr
    )
    assert state["step"] == 16  # 2 epochs of 256 / 32
    assert_close_weights(state, single)
    torch.testing.assert_close(state["ema"], single["ema"], atol=2e-5, rtol=1e-4)
    for ours, reference in zip(state["history"], single["history"], strict=True):
        assert ours["val_top1"] == pytest.approx(reference["val_top1"], abs=1e-6)
        assert ours["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-4)


def test_sharded_checkpoints_are_folders_named_by_links(sharded):
    run_dir, _, _ = sharded
    folder = run_dir / "checkpoints"
    links = {path.name: path for path in folder.iterdir() if path.is_symlink()}
    assert sorted(links) == ["best.pt", "epoch_0002.pt", "last.pt"]  # keep_last=1: epoch 1's name is gone
    assert not os.path.isabs(os.readlink(links["last.pt"]))  # relative: the run folder can move
    targets = {path.resolve() for path in links.values()}
    # every folder under sharded/ is named by a link (epoch 1's went with its name), and each is complete
    assert {path.resolve() for path in (folder / "sharded").iterdir()} == targets
    for target in targets:
        assert (target / ".metadata").is_file() and (target / "training.pt").is_file()
        assert len(list(target.glob("*.distcp"))) == 2  # one file of shards per rank


def test_resume_on_one_process_reshards_to_the_same_weights(sharded, tmp_path):
    """The two-rank run stopped after epoch 1 (its last.pt then), resumed by one process without torchrun."""
    run_dir, _, uninterrupted = sharded
    first = tmp_path / "first"
    proc = run_ranks([*COMMON, *SHARDED, "trainer.stop_after_epoch=1", f"hydra.run.dir={first}"], first, nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert load_checkpoint(first / "checkpoints" / "last.pt")["epoch"] == 1
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    args = [*COMMON, "trainer.strategy=fsdp", "data.batch_size=16", "trainer.accum_steps=2"]
    args += [f"trainer.resume={first / 'checkpoints' / 'last.pt'}", f"hydra.run.dir={resumed_dir}"]
    resumed = run_cli(args, resumed_dir)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert "over 1 process, ZeRO-3" in resumed.stdout + resumed.stderr
    assert_close_weights(finished(resumed_dir, resumed), uninterrupted, atol=2e-5)


def test_consolidate_writes_the_folder_as_one_file_that_resumes_unsharded(sharded, tmp_path, capsys):
    from vit.cli.consolidate import main

    run_dir, _, state = sharded
    out = tmp_path / "whole.pt"
    assert main([f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", f"out={out}"]) == 0
    whole = load_checkpoint(out)
    assert_close_weights(whole, state, atol=0)
    assert whole["optimizer_keys"] == "names" and "blocks.0.attn.qkv.weight" in whole["optimizer"]["state"]
    # One process without sharding resumes it (optimizer state by parameter name): the finished run's 2 epochs
    # done, one more trained.
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    args = [*COMMON, "data.batch_size=32", "trainer.epochs=3", f"trainer.resume={out}", f"hydra.run.dir={resumed_dir}"]
    assert finished(resumed_dir, run_cli(args, resumed_dir))["step"] == 24


def test_a_killed_write_leaves_last_on_the_complete_checkpoint(sharded, tmp_path):
    """A folder whose write stopped before training.pt (a kill -9 mid-save) is never named; the next save removes
    it. The copy of the run's checkpoints here keeps the run's own untouched."""
    import shutil

    from vit.train.sharded import point, remove_unnamed

    run_dir, _, state = sharded
    folder = tmp_path / "checkpoints"
    shutil.copytree(run_dir / "checkpoints", folder, symlinks=True)
    partial = folder / "sharded" / "step_00000099_partial"
    shutil.copytree((folder / "last.pt").resolve(), partial)
    (partial / "training.pt").unlink()  # killed before rank 0's last file
    assert load_checkpoint(folder / "last.pt")["step"] == state["step"]
    with pytest.raises(CheckpointError, match="training.pt: the folder is incomplete"):
        load_checkpoint(partial)
    point(folder / "best.pt", (folder / "last.pt").resolve())
    remove_unnamed(folder)
    assert not partial.exists() and (folder / "last.pt").resolve().is_dir()


def test_an_index_that_would_run_code_is_refused_unrun(sharded, tmp_path):
    import shutil

    run_dir, _, _ = sharded
    copy = tmp_path / "copy"
    shutil.copytree((run_dir / "checkpoints" / "last.pt").resolve(), copy)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (copy / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(WeightsFileError, match=r"asks to build (posix|os)\.system, which a DCP index never holds"):
        read_weights_file(copy, "checkpoint")
    assert not marker.exists()


def test_a_single_file_does_not_resume_sharded_and_bad_settings_are_one_line(single, tmp_path):
    path = tmp_path / "single.pt"
    torch.save(single, path)
    args = [*COMMON, "trainer.strategy=fsdp", "data.batch_size=32", f"trainer.resume={path}"]
    proc = run_cli([*args, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    assert proc.returncode == 2
    assert "is a single file, written without sharding" in proc.stderr and f"model.pretrained={path}" in proc.stderr
    proc = run_cli([*COMMON, "trainer.strategy=zero3", f"hydra.run.dir={tmp_path / 'c'}"], tmp_path)
    assert proc.returncode == 2 and "trainer.strategy" in proc.stderr and "zero3" in proc.stderr


def test_fp16_where_it_runs_is_refused_under_fsdp():
    """fp16 runs where the device has it (a GPU; a CPU substitutes another precision, said in one line, and that
    one shards): its gradient scaler cannot unscale sharded gradients."""
    from vit.engine.device import Precision
    from vit.errors import ConfigError
    from vit.settings import TrainerSettings
    from vit.train.optimizer import shard_run_model

    trainer = TrainerSettings(strategy="fsdp")
    with pytest.raises(ConfigError, match="trainer.amp=fp16 cannot run under trainer.strategy=fsdp"):
        shard_run_model(torch.nn.Linear(2, 2), None, Precision("fp16", "asked"), trainer, None)
