"""What a training step (vit/train/trainer.py) reads and changes, and the checks around it: `StepParts` (what to
call, what to optimise, how; a budget's re-plan changes only its schedule), `StepState` (the step count and the
counters behind the divergence check), the device-side sums behind a log line (`LogWindow`), the gradient sync while
accumulating, the agreed stop under torchrun and the divergence checks. The step never waits for the GPU: losses
and gradient norms stay on the device and are read every `log_every_n_steps` steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from vit.errors import CheckFailed
from vit.runtime.device import Precision
from vit.runtime.distributed import Distributed
from vit.runtime.sharding import is_sharded, local
from vit.tasks import Task
from vit.tasks.classify import Classify
from vit.train.callbacks import Callbacks


@dataclass
class StepParts:
    """Everything a training step needs besides the batch: built once per run (only the schedule's plan moves, with
    trainer.budget)."""

    train_model: nn.Module  # what is called: the model, or its DDP wrapper, possibly compiled
    model: nn.Module  # the module that holds the parameters (its state dict is what checkpoints save)
    optimizer: torch.optim.Optimizer
    scheduler: object  # timm Scheduler, `step_update(num_updates)`
    criterion: nn.Module
    device: torch.device
    precision: Precision  # the number format the forward passes run in (vit/runtime/device.py)
    scaler: torch.amp.GradScaler | None
    mixup_fn: Callable | None = None
    ema: object | None = None  # timm ModelEmaV3
    grad_clip: float | None = None
    accum_steps: int = 1
    log_every: int = 50
    max_bad_steps: int = 5
    dist: Distributed = field(default_factory=Distributed)
    ddp: nn.Module | None = None  # the DistributedDataParallel wrapper, for `no_sync` while accumulating
    stop_requested: Callable[[], bool] = field(default=lambda: False)
    compiled: bool = False  # whether torch.compile is on (reported in metrics.json)
    task: Task = field(default_factory=Classify)  # what the run trains for: its loss (vit/tasks/)
    budget: object | None = None  # trainer.budget's Budget (vit/train/budget.py): the plan the schedule follows
    callbacks: Callbacks = field(default_factory=Callbacks)  # what hooks into the loop (vit/train/callbacks.py)

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return self.precision.dtype


@dataclass
class StepState:
    """What the steps change; `step` is saved in checkpoints, the rest is reported."""

    step: int = 0  # optimizer steps so far
    train_img_size: int | None = None  # progressive resizing: this epoch's image size (None: as the loader gives)
    bad_run: torch.Tensor | None = None  # (,) consecutive non-finite losses up to the latest step, on the device
    worst_bad_run: torch.Tensor | None = None  # (,) the longest such run since the last log
    first_step_seconds: float | None = None  # host time of this process's first step: torch.compile's cost
    skipped_steps: int = 0  # fp16 steps the scaler skipped (counted at log time, see count_skipped_steps)
    last_scale: float | None = None  # the GradScaler's scale when it was last read


class TrainingDiverged(CheckFailed):
    """The loss stopped being finite for trainer.max_bad_steps steps, or the weights after an epoch: the settings
    were valid, the run was not. Exit code 3, whichever diverged (a failed check of another kind is 1)."""

    what = "training stopped"
    exit_code = 3


class LogWindow:
    """The sums behind one log line (the steps since the last one), kept on the device until it is read."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), device=device)
        self.grad = torch.zeros((), device=device)
        self.reset()

    def reset(self) -> None:
        self.loss.zero_()
        self.grad.zero_()
        self.batches, self.optimizer_steps, self.images = 0, 0, 0
        self.start = time.perf_counter()

    def add_batch(self, loss: torch.Tensor, images: int) -> None:
        self.loss += loss
        self.batches += 1
        self.images += images

    def add_step(self, grad_norm: torch.Tensor) -> None:
        self.grad += grad_norm
        self.optimizer_steps += 1


def autocast(parts: StepParts):
    return parts.precision.autocast(parts.device)


def sync_context(parts: StepParts, last_micro_step: bool):
    """DDP all-reduces gradients in backward (a sharded model reduce-scatters them); while accumulating, only the
    last micro-batch needs to."""
    if is_sharded(parts.model):
        parts.model.set_requires_gradient_sync(last_micro_step)  # until the next call: set at every micro-batch
        return nullcontext()
    if parts.ddp is None or last_micro_step:
        return nullcontext()
    return parts.ddp.no_sync()


def stop_agreed(parts: StepParts) -> bool:
    """Whether to stop now. Every rank must leave the loop at the same step (or the others would wait for it in
    the next all-reduce), so under torchrun the ranks' flags are combined; they are all asked at the same steps."""
    return parts.dist.any(parts.stop_requested(), parts.device)


def check_finite(state: StepState, loss: torch.Tensor) -> None:
    """Count consecutive non-finite losses on the device, without a host sync (read at log time)."""
    if state.bad_run is None:
        state.bad_run = torch.zeros((), dtype=torch.long, device=loss.device)
        state.worst_bad_run = torch.zeros((), dtype=torch.long, device=loss.device)
    state.bad_run = torch.where(torch.isfinite(loss), 0, state.bad_run + 1)
    state.worst_bad_run = torch.maximum(state.worst_bad_run, state.bad_run)


def raise_if_diverged(parts: StepParts, state: StepState) -> None:
    """fp16: the GradScaler skips steps with inf/NaN gradients (counted, not fatal). Otherwise a non-finite loss
    has already poisoned the weights, so `max_bad_steps` in a row stop the run before a checkpoint stores them."""
    if state.worst_bad_run is None:
        return
    worst = int(parts.dist.max_(state.worst_bad_run.clone()).item())
    state.worst_bad_run.zero_()
    if parts.scaler is None and worst >= parts.max_bad_steps:
        raise TrainingDiverged(
            f"the loss was not finite for {worst} consecutive steps (trainer.max_bad_steps={parts.max_bad_steps}), "
            f"detected at step {state.step}; the checkpoints of the last finished epoch are kept"
        )


def weights_finite(model: nn.Module, dist: Distributed | None = None) -> bool:
    """One host sync: whether every parameter is finite (checked before a checkpoint overwrites a good one). A
    sharded model's ranks each check their shards and agree (`dist`, every rank calling)."""
    params = [local(p.detach()) for p in model.parameters()]
    finite = bool(torch.isfinite(torch.stack(torch._foreach_norm(params))).all().item()) if params else True
    if dist is None or not is_sharded(model):
        return finite
    return not dist.any(not finite, params[0].device if params else torch.device("cpu"))


def count_skipped_steps(parts: StepParts, state: StepState) -> None:
    """fp16: every step the GradScaler skips (inf/NaN gradients) multiplies its scale by the backoff factor (0.5),
    so the skips since the last read are log_{1/backoff}(old / new). Reading the scale is a host sync, so it
    happens here, every `log_every` steps, not in the step. (A growth, every 2000 clean steps, landing in the
    same window as a skip hides that one skip; the count is a diagnostic.)"""
    if parts.scaler is None:
        return
    scale = parts.scaler.get_scale()
    if state.last_scale is not None and scale < state.last_scale:
        state.skipped_steps += round(math.log(state.last_scale / scale, 1.0 / parts.scaler.get_backoff_factor()))
    state.last_scale = scale
