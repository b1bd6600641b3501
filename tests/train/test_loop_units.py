"""The training loop's parts alone, on a stub model (a single linear layer over 4 numbers) with no trainer around
them: `optimizer_step`, `train_one_epoch` with gradient accumulation, its stop between optimizer steps, and the
checkpoint's training state restored into a fresh loop."""

import math

import torch
from torch import nn
from trainer_utils import stub_step_parts

from vit.train.checkpoints import restore_training_state, training_parts, training_state
from vit.train.step_parts import StepParts, StepState
from vit.train.trainer import optimizer_step, train_one_epoch


def stub_settings(**kwargs) -> StepParts:
    torch.manual_seed(0)
    return stub_step_parts(nn.Linear(4, 3), **{"log_every": 2, **kwargs})


def batches(count: int, size: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 4, generator=generator), torch.arange(size) % 3) for _ in range(count)]


def test_optimizer_step_clips_steps_and_counts():
    settings = stub_settings(grad_clip=0.5)
    weight = settings.model.weight.detach().clone()
    settings.model.weight.grad = torch.full_like(weight, 10.0)  # norm 10 * sqrt(12)
    settings.model.bias.grad = torch.zeros(3)
    state = StepState()
    norm = optimizer_step(settings, state)
    assert norm == torch.tensor(10.0 * math.sqrt(12))  # the norm before clipping
    step = weight - settings.model.weight.detach()  # lr 0.1 times the clipped gradient
    assert torch.allclose(step.norm(), torch.tensor(0.1 * 0.5))
    assert state.step == 1 and settings.model.weight.grad is None  # zeroed for the next step


def test_an_epoch_with_accumulation_steps_once_per_group_of_batches_and_logs_each_window():
    settings = stub_settings(accum_steps=2)
    state, logged = StepState(), []

    class Reporter:
        def log_step(self, step_in_epoch, step, values):
            logged.append((step_in_epoch, step, sorted(values)))

    result = train_one_epoch(settings, state, batches(5), limit_batches=None, reporter=Reporter())
    assert state.step == 3  # batches 1+2, 3+4, and the last one alone
    assert result["batches"] == 5 and not result["stopped"] and math.isfinite(result["loss"])
    assert [entry[:2] for entry in logged] == [(2, 1), (4, 2), (5, 3)]
    assert logged[0][2] == ["train/grad_norm", "train/img_per_s", "train/loss", "train/lr"]


def test_an_epoch_stops_after_the_step_where_a_stop_is_asked_and_limit_batches_caps_it():
    asks = iter([False, False, True])  # checked once before the epoch, then after each optimizer step
    settings = stub_settings(stop_requested=lambda: next(asks, True))
    state = StepState()
    result = train_one_epoch(settings, state, batches(6), limit_batches=None)
    assert result["stopped"] and state.step == 2 and result["batches"] == 2
    capped = train_one_epoch(stub_settings(), StepState(), batches(6), limit_batches=4)
    assert capped["batches"] == 4 and not capped["stopped"]


def test_the_training_state_restored_continues_as_the_unbroken_loop():
    """Two epochs straight against one epoch, a checkpoint's training state (weights, optimizer, schedule), and the
    second epoch in a loop built anew: the same weights, bit for bit."""
    data = batches(4)
    straight = stub_settings()
    straight_state = StepState()
    for _ in range(2):
        train_one_epoch(straight, straight_state, data, limit_batches=None)

    first = stub_settings()
    first_state = StepState()
    train_one_epoch(first, first_state, data, limit_batches=None)
    saved = training_state(
        **training_parts(first),
        epoch=1,
        step=first_state.step,
        best_score=0.0,
        class_to_idx={"a": 0, "b": 1, "c": 2},
        config={"optim": {"name": "sgd"}},
        history=[],
    )
    second = stub_settings()
    restore_training_state(saved, **training_parts(second), path="last.pt", optim_name="sgd")
    second_state = StepState(step=saved["step"])
    second.scheduler.step_update(num_updates=second_state.step)
    train_one_epoch(second, second_state, data, limit_batches=None)
    assert second_state.step == straight_state.step == 8
    for a, b in zip(second.model.parameters(), straight.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
