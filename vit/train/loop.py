"""One training epoch: its steps (forward and loss through the run's task, backward, optimizer step). The step
never waits for the GPU: losses and gradient norms stay on the device and are read every `log_every_n_steps` steps.

A step reads two objects: `StepParts` (what to call, what to optimise, how; a budget's re-plan changes only
its schedule), and `StepState`, what the steps change (the step count and the counters behind the divergence
check)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from vit.data.augment.batch import resize_batch
from vit.engine.device import Precision
from vit.engine.distributed import Distributed
from vit.engine.sharding import full, is_sharded, local
from vit.engine.tasks import Task
from vit.engine.tasks.classify import Classify
from vit.errors import CheckFailed
from vit.naflex import batch_size_of, to_device


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
    precision: Precision  # the number format the forward passes run in (vit/engine/device.py)
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
    task: Task = field(default_factory=Classify)  # what the run trains for: its loss (vit/engine/tasks/)
    budget: object | None = None  # trainer.budget (vit/train/budget.py): plans the steps, ends the run on the last
    forecast: object | None = None  # without a budget: a run of many hours says so early (vit/train/budget.py)

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


class NonFiniteLossError(CheckFailed):
    """The loss stopped being finite for trainer.max_bad_steps steps: the settings were valid, the run was not."""

    what = "training stopped"


class Window:
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


def autocast(settings: StepParts):
    return settings.precision.autocast(settings.device)


def sync_context(settings: StepParts, last_micro_step: bool):
    """DDP all-reduces gradients in backward (a sharded model reduce-scatters them); while accumulating, only the
    last micro-batch needs to."""
    if is_sharded(settings.model):
        settings.model.set_requires_gradient_sync(last_micro_step)  # until the next call: set at every micro-batch
        return nullcontext()
    if settings.ddp is None or last_micro_step:
        return nullcontext()
    return settings.ddp.no_sync()


def stop_agreed(settings: StepParts) -> bool:
    """Whether to stop now. Every rank must leave the loop at the same step (or the others would wait for it in
    the next all-reduce), so under torchrun the ranks' flags are combined; they are all asked at the same steps."""
    return settings.dist.any(settings.stop_requested(), settings.device)


def check_finite(state: StepState, loss: torch.Tensor) -> None:
    """Count consecutive non-finite losses on the device, without a host sync (read at log time)."""
    if state.bad_run is None:
        state.bad_run = torch.zeros((), dtype=torch.long, device=loss.device)
        state.worst_bad_run = torch.zeros((), dtype=torch.long, device=loss.device)
    state.bad_run = torch.where(torch.isfinite(loss), 0, state.bad_run + 1)
    state.worst_bad_run = torch.maximum(state.worst_bad_run, state.bad_run)


def raise_if_diverged(settings: StepParts, state: StepState) -> None:
    """fp16: the GradScaler skips steps with inf/NaN gradients (counted, not fatal). Otherwise a non-finite loss
    has already poisoned the weights, so `max_bad_steps` in a row stop the run before a checkpoint stores them."""
    if state.worst_bad_run is None:
        return
    worst = int(settings.dist.max_(state.worst_bad_run.clone()).item())
    state.worst_bad_run.zero_()
    if settings.scaler is None and worst >= settings.max_bad_steps:
        raise NonFiniteLossError(
            f"the loss was not finite for {worst} consecutive steps (trainer.max_bad_steps={settings.max_bad_steps}), "
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


def train_one_epoch(
    settings: StepParts, state: StepState, loader: Iterable, *, limit_batches: int | None, reporter=None
) -> dict:
    """Train over `loader`; returns the epoch's mean loss, images/s, seconds, steps, whether a stop was
    requested (then the epoch is unfinished) and whether the budget's planned last step was trained.
    `reporter.log_step(step_in_epoch, step, values)` receives the
    logged values every `log_every` steps (vit/train/report.py)."""
    settings.train_model.train()
    count_skipped_steps(settings, state)  # the scale before this epoch's first step
    steps = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    if stop_agreed(settings):  # a signal that came during the last evaluation or checkpoint
        return {"loss": math.nan, "img_per_s": 0.0, "seconds": 0.0, "steps": 0, "stopped": True, "planned_end": False}
    stopped, planned_end, done, images_seen = False, False, 0, 0
    loss_sum = torch.zeros((), device=settings.device)
    window = Window(settings.device)
    start = time.perf_counter()
    for i, (images, targets) in enumerate(loader):
        if i >= steps:
            break
        if i == 0:
            first_start = time.perf_counter()  # after the first batch arrived: the loader's start-up is not the step's
        last_micro_step = (i + 1) % settings.accum_steps == 0 or i + 1 == steps
        loss = forward_backward(settings, state, images, targets, last_micro_step)
        loss_sum += loss
        count = batch_size_of(images)  # NaFlex batches (data.naflex) hold a number of their own
        window.add_batch(loss, count)
        images_seen, done = images_seen + count, i + 1
        if last_micro_step:
            window.add_step(optimizer_step(settings, state))
            if state.first_step_seconds is None:  # compiling blocks the host, so no sync is needed to time it
                state.first_step_seconds = time.perf_counter() - first_start
            planned_end = settings.budget is not None and settings.budget.reached(state.step)
        log_step = (i + 1) % settings.log_every == 0 or i + 1 == steps or planned_end
        if log_step:
            values = window_values(settings, state, window)
            if reporter is not None:
                reporter.log_step(i + 1, state.step, values)
            window.reset()
        if planned_end:  # trainer.budget: the plan's last step
            break
        # Single process: stop after any optimizer step (never inside an accumulation, whose gradients a
        # checkpoint would not hold). Under torchrun: at those of the log steps, where the ranks compare flags.
        if last_micro_step and (log_step or not settings.dist.enabled) and stop_agreed(settings):
            stopped = True
            break
    seconds = time.perf_counter() - start
    world = settings.dist.world_size
    return {
        # The mean over all ranks' batches; nan when nothing was left to train this epoch.
        "loss": (settings.dist.sum_(loss_sum / max(done, 1)) / world).item() if steps else float("nan"),
        "img_per_s": images_seen * world / max(seconds, 1e-9),  # global
        "seconds": seconds,
        "steps": max(done, 1),
        "stopped": stopped,
        "planned_end": planned_end,  # trainer.budget's last step was trained
    }


def forward_backward(
    settings: StepParts, state: StepState, images: torch.Tensor, targets: torch.Tensor, last_micro_step: bool
) -> torch.Tensor:
    """One micro-batch: (resize,) mix, forward, loss, backward of loss / accum_steps. Returns the detached loss.
    `images`: (B, 3, H, W), or a NaFlex batch (vit/naflex.py), which is neither resized nor mixed (the config
    check refuses both with it)."""
    images = to_device(images, settings.device)  # (B, 3, H, W)
    targets = targets.to(settings.device, non_blocking=True)  # (B,)
    if state.train_img_size is not None:
        images = resize_batch(images, state.train_img_size)  # (B, 3, s, s)
    if settings.mixup_fn is not None:
        images, targets = settings.mixup_fn(images, targets)  # soft targets (B, classes)
    with sync_context(settings, last_micro_step):
        with autocast(settings):
            loss = settings.task.loss(settings.train_model, images, targets, settings.criterion)
        scaled = loss / settings.accum_steps
        (settings.scaler.scale(scaled) if settings.scaler is not None else scaled).backward()
    loss = loss.detach()
    check_finite(state, loss)
    return loss


def window_values(settings: StepParts, state: StepState, window: Window) -> dict:
    """The logged values of one window. The host syncs here, every log_every steps: the window's mean loss (over
    all ranks) and the images seen."""
    raise_if_diverged(settings, state)
    totals = torch.stack([window.loss / max(window.batches, 1), window.loss.new_tensor(float(window.images))])
    totals = settings.dist.sum_(totals) / totals.new_tensor([settings.dist.world_size, 1.0])
    mean_loss, global_images = totals.tolist()
    count_skipped_steps(settings, state)
    values = {
        "train/loss": mean_loss,
        "train/lr": settings.optimizer.param_groups[0]["lr"],
        "train/grad_norm": (window.grad / max(1, window.optimizer_steps)).item(),
        "train/img_per_s": global_images / max(time.perf_counter() - window.start, 1e-9),
    }
    values.update(settings.task.log_values())  # distillation: the label and distillation terms
    return values


def count_skipped_steps(settings: StepParts, state: StepState) -> None:
    """fp16: every step the GradScaler skips (inf/NaN gradients) multiplies its scale by the backoff factor (0.5),
    so the skips since the last read are log_{1/backoff}(old / new). Reading the scale is a host sync, so it
    happens here, every `log_every` steps, not in the step. (A growth, every 2000 clean steps, landing in the
    same window as a skip hides that one skip; the count is a diagnostic.)"""
    if settings.scaler is None:
        return
    scale = settings.scaler.get_scale()
    if state.last_scale is not None and scale < state.last_scale:
        state.skipped_steps += round(math.log(state.last_scale / scale, 1.0 / settings.scaler.get_backoff_factor()))
    state.last_scale = scale


def optimizer_step(settings: StepParts, state: StepState) -> torch.Tensor:
    """Unscale, clip, step, schedule, EMA. Returns the gradient norm (a device tensor)."""
    if settings.scaler is not None:
        settings.scaler.unscale_(settings.optimizer)
    params = [p for p in settings.model.parameters() if p.grad is not None]
    max_norm = settings.grad_clip if settings.grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if settings.scaler is not None:
        settings.scaler.step(settings.optimizer)  # skipped when the unscaled gradients hold inf/NaN
        settings.scaler.update()
    else:
        settings.optimizer.step()
    settings.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    if settings.budget is not None:  # measure the speed; a re-plan takes effect in the schedule below
        settings.budget.after_step(state.step)
    elif settings.forecast is not None:
        settings.forecast.after_step(state.step)
    settings.scheduler.step_update(num_updates=state.step)
    if settings.ema is not None:
        settings.ema.update(settings.model, step=state.step)
    return full(grad_norm.detach()).float()  # sharded gradients: the norm over all ranks' shards
