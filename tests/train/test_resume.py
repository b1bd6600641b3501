"""A run stopped after epoch 1 and resumed ends exactly where an uninterrupted run ends (CPU, deterministic)."""

import json
import logging

import pytest
import torch
from trainer_utils import FP32, QUICK_SYNTHETIC, TINY_MODEL, compose_config

from vit.records.files import atomic_save
from vit.train import run
from vit.weights.read import CheckpointError, load_checkpoint

BASE = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=3", "trainer.device=cpu", "trainer.deterministic=true"]
BASE += ["data.augment.crop=pad", "data.augment.hflip=true", "model.drop_path_rate=0.1", "model.drop_rate=0.1"]


def _compare(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_after_epoch_1_equals_uninterrupted(tmp_path):
    straight = run(compose_config(BASE), output_dir=tmp_path / "straight")

    first = run(compose_config([*BASE, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    assert first["epochs_done"] == 1
    resumed = run(compose_config([*BASE, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    assert not torch.are_deterministic_algorithms_enabled()  # the process-wide switch is put back after a run

    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    _compare(a["model"], b["model"])
    _compare(a["ema"], b["ema"])
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"] == 3
    keys = ("train_loss", "val_top1", "val_top5", "val_loss", "val_ema_top1")
    for x, y in zip(straight["history"], resumed["history"], strict=True):
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}


def test_resume_from_an_explicit_path(tmp_path):
    run(compose_config([*BASE, "trainer.stop_after_epoch=2"]), output_dir=tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoints" / "last.pt"
    first_part = load_checkpoint(ckpt)["history"]
    metrics = run(compose_config([*BASE, f"trainer.resume={ckpt}"]), output_dir=tmp_path / "b")
    assert [r["epoch"] for r in metrics["history"]] == [1, 2, 3]
    # The wall-clock record goes on from the earlier process's: it keeps rising, and the run's total holds both.
    elapsed = [r["elapsed_s"] for r in metrics["history"]]
    assert elapsed[:2] == [r["elapsed_s"] for r in first_part]
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2] <= metrics["wall_time_s"]


def test_resume_auto_finds_the_newest_matching_run_and_continues_in_its_folder(tmp_path, caplog):
    """Hydra makes a new outputs/<date>/<time> folder per command: the run goes on in the folder it started in
    (one set of checkpoints, one TensorBoard history, one metrics.json), the new folder keeps the command's log."""
    runs = tmp_path / "outputs" / "2026-01-01"
    first, second = runs / "10-00-00", runs / "11-00-00"
    run(compose_config([*BASE, "trainer.stop_after_epoch=1"]), output_dir=first)
    with caplog.at_level("INFO", logger="vit"):
        metrics = run(compose_config([*BASE, "trainer.resume=auto"]), output_dir=second)
    assert [r["epoch"] for r in metrics["history"]] == [1, 2, 3]
    assert load_checkpoint(first / "checkpoints" / "last.pt")["epoch"] == 3
    assert len(json.loads((first / "metrics.json").read_text())["history"]) == 3
    assert not (second / "checkpoints").exists() and not (second / "metrics.json").exists()
    assert len(list((first / "tb").iterdir())) >= 1 and not (second / "tb").exists()
    said = [r.getMessage() for r in caplog.records]
    assert (
        f"trainer.resume=auto: the run continues in {first}, where it started; {second} holds this command's log"
        in said
    )
    assert any(m.startswith(f"resumed from {first / 'checkpoints' / 'last.pt'} after epoch 1 (step") for m in said)
    assert "resumed from" in (first / "train.log").read_text()  # the earlier folder's log goes on too


def test_gradient_accumulation_matches_the_large_batch(tmp_path):
    """2 x 16 images with accumulation take the same steps as batches of 32 (same order, same lr)."""
    common = [*QUICK_SYNTHETIC[:3], *TINY_MODEL, *FP32, "trainer.epochs=1", "trainer.device=cpu", "trainer.ema=false"]
    common += ["trainer.deterministic=true", "model.drop_path_rate=0.0", "trainer.grad_clip=null"]
    big = run(compose_config([*common, "data.batch_size=32"]), output_dir=tmp_path / "big")
    accum = run(compose_config([*common, "data.batch_size=16", "trainer.accum_steps=2"]), output_dir=tmp_path / "acc")
    assert big["final"]["step"] == accum["final"]["step"] == 8
    a = load_checkpoint(tmp_path / "big" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "acc" / "checkpoints" / "last.pt")["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


def test_a_failed_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.pt"
    atomic_save({"model": {"w": torch.ones(3)}, "epoch": 1}, path)

    def torn_save(obj, handle):  # half a file, then the disk fills up
        handle.write(b"PK\x03\x04 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(CheckpointError, match="No space left on device .* the previous file is intact"):
        atomic_save({"model": {"w": torch.zeros(3)}, "epoch": 2}, path)
    state = load_checkpoint(path)
    assert state["epoch"] == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("loader", "extra", "calls", "stop_step"),
    [
        # The loop asks for a stop at each epoch start and after each optimizer step: 8 steps per epoch, so the
        # 13th question is the one after step 11 (epoch 2, batch 3).
        ("torch", [], 13, 11),
        ("resident", ["data.augment.auto_augment=trivial"], 13, 11),  # the batched loader on the CPU, with a policy
        # 4 steps per epoch: epoch 2, after its 2nd step, in the sampler's repeated order, skipped into.
        ("torch", ["trainer.accum_steps=2", "data.repeated_aug=2"], 8, 6),
    ],
)
def test_a_stop_inside_an_epoch_writes_that_step_and_resumes_exactly(
    tmp_path, monkeypatch, caplog, loader, extra, calls, stop_step
):
    from vit.train.signals import StopSignal

    args = [*BASE, "trainer.epochs=2", f"data.loader={loader}", *extra]
    run(compose_config(args), output_dir=tmp_path / "straight")

    asked = {"count": 0}

    def requested(self) -> bool:  # a signal that arrives just before the `calls`-th question
        asked["count"] += 1
        return asked["count"] >= calls

    with monkeypatch.context() as patch:
        patch.setattr(StopSignal, "requested", requested)
        run(compose_config(args), output_dir=tmp_path / "resumed")
    stopped = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert (stopped["epoch"], stopped["step"]) == (1, stop_step)  # 1 finished epoch, then part of the 2nd
    assert stopped["batches_into_epoch"] > 0
    # The run's clock was saved with the step: the part-epoch's seconds count in the resumed run's times.
    assert stopped["elapsed_s"] > stopped["history"][-1]["elapsed_s"]

    every_step = ["trainer.resume=auto", "trainer.log_every_n_steps=1", "trainer.progress=log"]
    caplog.clear()  # the runs above logged too where an earlier test left the "vit" logger at INFO
    with caplog.at_level(logging.INFO, logger="vit"):
        resumed = run(compose_config([*args, *every_step]), output_dir=tmp_path / "resumed")
    assert resumed["history"][-1]["elapsed_s"] > stopped["elapsed_s"]
    # The progress lines count the epoch's real batch (the one TensorBoard logs), not the batches since the resume.
    steps = [line for line in caplog.messages if line.startswith("epoch 2/2 step ")]
    full = steps[-1].split()[3].split("/")[1]  # the epoch's batches
    assert steps[0].startswith(f"epoch 2/2 step {stopped['batches_into_epoch'] + 1}/{full} "), steps
    assert steps[-1].startswith(f"epoch 2/2 step {full}/{full} "), steps
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] and b.get("batches_into_epoch") is None
    _compare(a["model"], b["model"])
    _compare(a["ema"], b["ema"])
