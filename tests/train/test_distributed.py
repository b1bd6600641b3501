"""Data-parallel training on the CPU with gloo and 2 processes: the same global batch gives the weights of a
single-process run (fp32 tolerance), with and without gradient accumulation (`no_sync`), and a stopped distributed
run resumes to the weights of the uninterrupted one. The two-rank run recomputes its blocks in the backward pass
(trainer.grad_checkpointing), which must change nothing: its gradients are the plain ones.

torchrun itself launches the SIGTERM test's run; the others' ranks are forked (trainer_utils.ForkedRun) with the
environment torchrun gives its workers (trainer_utils.run_ranks), which spares a launcher and two interpreters
importing torch per run.

Why they should agree: the train permutation is drawn from (seed, epoch) alone, rank r takes every 2nd index,
so global batch k holds the same images in both runs; DDP averages the ranks' mean gradients, which is the mean
over the global batch. Nothing random remains inside a step (no drop path, no augmentation, no mixup).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from trainer_utils import FP32, REPO, TINY_MODEL, run_cli, run_ranks, stub_step_parts

from vit.weights.read import load_checkpoint

# 256 training images = 8 global batches of 32 per epoch.
COMMON = ["data=synthetic", "data.synthetic.num_train=256", "data.synthetic.num_val=60", *TINY_MODEL, *FP32]
COMMON += ["model.drop_path_rate=0.0", "trainer.epochs=2", "trainer.device=cpu", "trainer.ema=true"]
COMMON += ["trainer.log_every_n_steps=4", "trainer.attn_maps_every_n_epochs=0", "trainer.progress=log"]


def train(run_dir, extra: list[str], nproc: int = 1) -> subprocess.CompletedProcess:
    """train.py with COMMON and `extra`: as `nproc` data-parallel ranks, or with one in this process."""
    args = [*COMMON, *extra, f"hydra.run.dir={run_dir}"]
    return run_ranks(args, run_dir, nproc) if nproc > 1 else run_cli(args, run_dir)


TWO_RANKS = ["data.batch_size=16", "trainer.grad_checkpointing=true", "trainer.keep_last=2"]


def finished(run_dir, proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")


def assert_close_weights(a: dict, b: dict, atol=2e-5) -> None:
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"])
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], atol=atol, rtol=1e-4, msg=key)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    return finished(run_dir, train(run_dir, ["data.batch_size=32"]))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp")
    # keep_last: the first epoch's checkpoint is the stopped run the resume test continues (one launch fewer)
    proc = train(run_dir, TWO_RANKS, nproc=2)
    return run_dir, proc, finished(run_dir, proc)


def test_two_ranks_match_one_process_with_the_same_global_batch(single, two_ranks):
    run_dir, proc, state = two_ranks
    assert state["step"] == 16  # 2 epochs of 256 / (2 ranks x 16)
    assert "gradient checkpointing: the encoder blocks are recomputed" in proc.stdout + proc.stderr
    assert_close_weights(state, single)
    torch.testing.assert_close(state["ema"], single["ema"], atol=2e-5, rtol=1e-4)
    # Validation: each rank its shard, sums all-reduced -> the single process's numbers over all 60 images.
    for ours, reference in zip(state["history"], single["history"], strict=True):
        assert ours["val_top1"] == pytest.approx(reference["val_top1"], abs=1e-6)
        assert ours["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-4)
        assert ours["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-4)  # averaged over the ranks


def test_only_rank_0_writes(two_ranks):
    run_dir, proc, _ = two_ranks
    # events.out.tfevents.<time>.<host>.<pid>.<n>: the scalars file and the hparams file, both of one process
    writers = {path.name.split(".")[-2] for path in (run_dir / "tb").glob("events.out.tfevents.*")}
    assert len(writers) == 1
    files = ["best.pt", "epoch_0001.pt", "epoch_0002.pt", "last.pt"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == files
    for line in ("epoch 2/2: train loss", "M params"):  # console lines from rank 0 alone
        assert proc.stdout.count(line) == 1, proc.stdout[-3000:]


def test_accumulation_under_ddp_skips_the_sync_and_matches(single, tmp_path, monkeypatch):
    # 2 ranks x 8 images x 2 micro-batches = the same global batch of 32.
    proc = train(tmp_path, ["data.batch_size=8", "trainer.accum_steps=2"], nproc=2)
    assert_close_weights(finished(tmp_path, proc), single)


def test_stopped_distributed_run_resumes_to_the_same_weights(two_ranks, tmp_path):
    """The two-rank run's checkpoint after its first epoch (what a run stopped there leaves: the stop itself under
    torchrun is the SIGTERM test's), resumed by two ranks: the weights of the uninterrupted run."""
    run_dir, _, uninterrupted = two_ranks
    first_epoch = run_dir / "checkpoints" / "epoch_0001.pt"
    assert load_checkpoint(first_epoch)["epoch"] == 1
    resumed = train(tmp_path, [*TWO_RANKS, f"trainer.resume={first_epoch}"], nproc=2)
    assert "resumed from" in resumed.stdout
    assert_close_weights(finished(tmp_path, resumed), uninterrupted, atol=1e-6)


def test_sigterm_to_torchrun_stops_every_rank_with_a_good_checkpoint(tmp_path):
    """The run torchrun launches (the launcher and a new interpreter per rank), stopped by a SIGTERM to torchrun."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = [*COMMON, "trainer.epochs=1000", "data.batch_size=16", f"hydra.run.dir={tmp_path}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*launcher, str(REPO / "train.py"), *args], stdout=subprocess.PIPE, text=True, env=env)
    last = tmp_path / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
    out, _ = proc.communicate(timeout=120)
    assert out.count("SIGTERM received") == 1 and out.count("stopped by SIGTERM") == 1, out[-3000:]
    epoch = load_checkpoint(last)["epoch"]
    assert 1 <= epoch < 1000


def step_context(model, **kwargs):
    return stub_step_parts(model, **{"log_every": 4, **kwargs})


def batches(count, poison=()):
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        x = torch.randn(4, 8, generator=gen)
        out.append((x * float("nan") if i in poison else x, torch.randint(0, 3, (4,), generator=gen)))
    return out


def test_no_sync_on_every_micro_batch_but_the_last_of_a_step():
    from contextlib import nullcontext

    from vit.train.step_parts import StepState
    from vit.train.trainer import train_one_epoch

    class CountingDDP:
        calls = 0

        def no_sync(self):
            CountingDDP.calls += 1
            return nullcontext()

    ctx = step_context(torch.nn.Linear(8, 3), ddp=CountingDDP(), accum_steps=4)
    state = StepState()
    train_one_epoch(ctx, state, batches(10), limit_batches=None)
    # steps of micro-batches [0-3], [4-7], [8-9]: the last of each syncs -> 3 + 3 + 1 without sync
    assert CountingDDP.calls == 7 and state.step == 3


def test_non_finite_losses_in_a_row_stop_with_the_step_named():
    from vit.train.step_parts import StepState, TrainingDiverged
    from vit.train.trainer import train_one_epoch

    ctx = step_context(torch.nn.Linear(8, 3), max_bad_steps=3, log_every=100)
    with pytest.raises(TrainingDiverged, match=r"3 consecutive steps .*max_bad_steps=3.*step 4"):
        # batch 1 poisons the weights: every later loss is NaN; detected at the log step (the epoch's end)
        train_one_epoch(ctx, StepState(), batches(4, poison={1}), limit_batches=None)


def test_isolated_non_finite_losses_below_the_limit_do_not_stop():
    from vit.train.step_parts import StepState, weights_finite
    from vit.train.trainer import train_one_epoch

    class NanAtCalls(torch.nn.CrossEntropyLoss):
        """Adds a detached NaN to the loss at some calls: the loss is NaN, the gradients stay finite."""

        def __init__(self, bad_calls):
            super().__init__()
            self.bad_calls, self.calls = bad_calls, 0

        def forward(self, logits, targets):
            self.calls += 1
            return super().forward(logits, targets) + (float("nan") if self.calls in self.bad_calls else 0.0)

    model = torch.nn.Linear(8, 3)
    ctx = step_context(model, max_bad_steps=2, log_every=100, criterion=NanAtCalls({2, 4}))
    result = train_one_epoch(ctx, StepState(), batches(6), limit_batches=None)
    assert result["batches"] == 6 and weights_finite(model)

    ctx = step_context(model, max_bad_steps=2, log_every=100, criterion=NanAtCalls({4, 5}))
    with pytest.raises(Exception, match="2 consecutive steps"):
        train_one_epoch(ctx, StepState(), batches(6), limit_batches=None)


def test_weights_finite_sees_one_bad_value():
    from vit.train.step_parts import weights_finite

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    assert weights_finite(model)
    with torch.no_grad():
        model[1].bias[1] = float("inf")
    assert not weights_finite(model)


def test_masked_autoencoder_pretrains_on_two_ranks(tmp_path):
    """task=mae with 2 ranks: each rank masks its own shard (its own noise), the gradients are averaged, rank 0
    writes; the run finishes with a finite reconstruction loss over all 60 validation images."""
    decoder = ["mae.decoder_embed_dim=32", "mae.decoder_depth=1", "mae.decoder_num_heads=4", "sched.warmup_epochs=1"]
    proc = train(tmp_path, ["task=mae", "data.batch_size=16", "trainer.ema=false", *decoder], nproc=2)
    state = finished(tmp_path, proc)
    assert state["step"] == 16 and "decoder_pred.weight" in state["model"]
    losses = [r["val_loss"] for r in state["history"]]
    assert all(0 < loss < 10 for loss in losses) and all(r["val_top1"] is None for r in state["history"])
    assert proc.stdout.count("epoch 2/2: train loss") == 1, proc.stdout[-3000:]


@pytest.mark.slow
def test_two_ranks_agree_on_one_budget_plan(tmp_path):
    """trainer.budget under torchrun: rank 0 plans, every rank takes its plan at the same steps, so both end on the
    same (planned) step inside the budget; only rank 0 speaks of the plan."""
    budget_s = 25
    proc = train(tmp_path, ["data.batch_size=16", "trainer.epochs=1000", f"trainer.budget={budget_s}s"], nproc=2)
    state = finished(tmp_path, proc)
    metrics = json.loads((tmp_path / "metrics.json").read_text())["budget"]
    assert state["step"] == metrics["trained_steps"] == metrics["planned_steps"] < 1000 * 8
    assert metrics["within_tolerance"] and metrics["wall_s"] <= budget_s + 1.0, metrics
    assert metrics["final_lr"] == pytest.approx(1e-6)  # sched.min_lr's default (vit/settings/sched.py), last step
    out = proc.stdout + proc.stderr
    # the start line, the first plan and the closing line, rank 0's only
    assert out.count(f"budget {budget_s}s: ") == 3, out[-3000:]
