"""One training epoch and one evaluation pass. The step never waits for the GPU: losses and gradient norms
stay on the device and are read every `log_every_n_steps` steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vit.train.compile import eager
from vit.train.distributed import Distributed
from vit.train.progressive import resize_batch


@dataclass
class StepContext:
    """Everything a training step needs besides the batch."""

    model: nn.Module  # what is called (possibly compiled)
    raw_model: nn.Module  # what holds the parameters
    optimizer: torch.optim.Optimizer
    scheduler: object  # timm Scheduler, `step_update(num_updates)`
    criterion: nn.Module
    device: torch.device
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    mixup_fn: Callable | None = None
    ema: object | None = None  # timm ModelEmaV3
    grad_clip: float | None = None
    accum_steps: int = 1
    log_every: int = 50
    max_bad_steps: int = 5
    dist: Distributed = field(default_factory=Distributed)
    ddp: nn.Module | None = None  # the DistributedDataParallel wrapper, for `no_sync` while accumulating
    step: int = 0  # optimizer steps so far
    bad_run: torch.Tensor | None = None  # (,) consecutive non-finite losses up to the latest step, on the device
    worst_bad_run: torch.Tensor | None = None  # (,) the longest such run since the last log
    first_step_seconds: float | None = None  # host time of this process's first step: torch.compile's cost
    skipped_steps: int = 0  # fp16 steps the scaler skipped (counted at log time, see count_skipped_steps)
    last_scale: float | None = None  # the GradScaler's scale when it was last read
    stop_requested: Callable[[], bool] = field(default=lambda: False)
    train_img_size: int | None = None  # progressive resizing: this epoch's image size (None: as the loader gives)
    distill: object | None = None  # vit/train/distill.py's Distiller: the loss with a teacher or distillation token


class NonFiniteLossError(RuntimeError):
    pass


def autocast(ctx: StepContext):
    if ctx.amp_dtype is None:
        return nullcontext()
    return torch.autocast(ctx.device.type, dtype=ctx.amp_dtype)


def sync_context(ctx: StepContext, last_micro_step: bool):
    """DDP all-reduces gradients in backward; while accumulating, only the last micro-batch needs to."""
    if ctx.ddp is None or last_micro_step:
        return nullcontext()
    return ctx.ddp.no_sync()


def stop_agreed(ctx: StepContext) -> bool:
    """Whether to stop now. Every rank must leave the loop at the same step (or the others would wait for it in
    the next all-reduce), so under torchrun the ranks' flags are combined; they are all asked at the same steps."""
    return ctx.dist.any(ctx.stop_requested(), ctx.device)


def check_finite(ctx: StepContext, loss: torch.Tensor) -> None:
    """Count consecutive non-finite losses on the device, without a host sync (read at log time)."""
    if ctx.bad_run is None:
        ctx.bad_run = torch.zeros((), dtype=torch.long, device=ctx.device)
        ctx.worst_bad_run = torch.zeros((), dtype=torch.long, device=ctx.device)
    ctx.bad_run = torch.where(torch.isfinite(loss), 0, ctx.bad_run + 1)
    ctx.worst_bad_run = torch.maximum(ctx.worst_bad_run, ctx.bad_run)


def raise_if_diverged(ctx: StepContext) -> None:
    """fp16: the GradScaler skips steps with inf/NaN gradients (counted, not fatal). Otherwise a non-finite loss
    has already poisoned the weights, so `max_bad_steps` in a row stop the run before a checkpoint stores them."""
    if ctx.worst_bad_run is None:
        return
    worst = int(ctx.dist.max_(ctx.worst_bad_run.clone()).item())
    ctx.worst_bad_run.zero_()
    if ctx.scaler is None and worst >= ctx.max_bad_steps:
        raise NonFiniteLossError(
            f"the loss was not finite for {worst} consecutive steps (trainer.max_bad_steps={ctx.max_bad_steps}), "
            f"detected at step {ctx.step}; the checkpoints of the last finished epoch are kept"
        )


def weights_finite(model: nn.Module) -> bool:
    """One host sync: whether every parameter is finite (checked before a checkpoint overwrites a good one)."""
    params = [p.detach() for p in model.parameters()]
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(params))).all().item()) if params else True


def train_one_epoch(
    ctx: StepContext,
    loader: Iterable,
    *,
    limit_batches: int | None,
    on_log: Callable[[int, dict], None],
) -> dict:
    """Train over `loader`; returns the epoch's mean loss, images/s, seconds, steps and whether a stop was
    requested (then the epoch is unfinished)."""
    ctx.model.train()
    count_skipped_steps(ctx)  # the scale before this epoch's first step
    steps = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    if stop_agreed(ctx):  # a signal that came during the last evaluation or checkpoint
        return {"loss": float("nan"), "img_per_s": 0.0, "seconds": 0.0, "steps": 0, "stopped": True}
    stopped = False
    loss_sum = torch.zeros((), device=ctx.device)
    window_loss = torch.zeros((), device=ctx.device)
    window_grad = torch.zeros((), device=ctx.device)
    window_count, window_opt_steps, images_seen = 0, 0, 0
    start = window_start = time.perf_counter()
    window_images = 0
    for i, (images, targets) in enumerate(loader):
        if i >= steps:
            break
        if i == 0:
            first_start = time.perf_counter()  # after the first batch arrived: the loader's start-up is not the step's
        images = images.to(ctx.device, non_blocking=True)
        targets = targets.to(ctx.device, non_blocking=True)
        if ctx.train_img_size is not None:
            images = resize_batch(images, ctx.train_img_size)  # (B, 3, s, s)
        if ctx.mixup_fn is not None:
            images, targets = ctx.mixup_fn(images, targets)  # soft targets (B, classes)
        last_micro_step = (i + 1) % ctx.accum_steps == 0 or i + 1 == steps
        with sync_context(ctx, last_micro_step):
            with autocast(ctx):  # the teacher (ctx.distill) runs in it too, on the same mixed images
                outputs = ctx.model(images)
                if ctx.distill is None:
                    loss = ctx.criterion(outputs, targets)
                else:
                    loss = ctx.distill.loss(images, outputs, targets)
            if ctx.scaler is not None:
                ctx.scaler.scale(loss / ctx.accum_steps).backward()
            else:
                (loss / ctx.accum_steps).backward()
        loss = loss.detach()
        check_finite(ctx, loss)
        loss_sum += loss
        window_loss += loss
        window_count += 1
        images_seen += images.shape[0]
        window_images += images.shape[0]

        if last_micro_step:
            window_grad += optimizer_step(ctx)
            window_opt_steps += 1
            if ctx.first_step_seconds is None:  # compiling blocks the host, so no sync is needed to time it
                ctx.first_step_seconds = time.perf_counter() - first_start

        log_step = (i + 1) % ctx.log_every == 0 or i + 1 == steps
        if log_step:
            raise_if_diverged(ctx)
            # The host syncs, every log_every steps: the window's mean loss (over all ranks) and images seen.
            totals = torch.stack([window_loss / window_count, window_loss.new_tensor(float(window_images))])
            totals = ctx.dist.sum_(totals) / totals.new_tensor([ctx.dist.world_size, 1.0])
            mean_loss, global_images = totals.tolist()
            count_skipped_steps(ctx)
            now = time.perf_counter()
            values = {
                "train/loss": mean_loss,
                "train/lr": ctx.optimizer.param_groups[0]["lr"],
                "train/grad_norm": (window_grad / max(1, window_opt_steps)).item(),
                "train/img_per_s": global_images / max(now - window_start, 1e-9),
            }
            if ctx.distill is not None:  # the label and distillation terms of the loss
                values.update(ctx.distill.log_values())
            on_log(i + 1, values)
            window_loss.zero_()
            window_grad.zero_()
            window_count, window_opt_steps, window_images, window_start = 0, 0, 0, now
        # Single process: stop after any optimizer step (never inside an accumulation, whose gradients a
        # checkpoint would not hold). Under torchrun: at those of the log steps, where the ranks compare flags.
        if last_micro_step and (log_step or not ctx.dist.enabled) and stop_agreed(ctx):
            stopped = True
            break
    seconds = time.perf_counter() - start
    done = max(1, min(i + 1, steps)) if steps else 1
    return {
        # The mean over all ranks' batches; nan when nothing was left to train this epoch.
        "loss": (ctx.dist.sum_(loss_sum / done) / ctx.dist.world_size).item() if steps else float("nan"),
        "img_per_s": images_seen * ctx.dist.world_size / max(seconds, 1e-9),  # global
        "seconds": seconds,
        "steps": done,
        "stopped": stopped,
    }


def count_skipped_steps(ctx: StepContext) -> None:
    """fp16: every step the GradScaler skips (inf/NaN gradients) multiplies its scale by the backoff factor (0.5),
    so the skips since the last read are log_{1/backoff}(old / new). Reading the scale is a host sync, so it
    happens here, every `log_every` steps, not in the step. (A growth, every 2000 clean steps, landing in the
    same window as a skip hides that one skip; the count is a diagnostic.)"""
    if ctx.scaler is None:
        return
    scale = ctx.scaler.get_scale()
    if ctx.last_scale is not None and scale < ctx.last_scale:
        ctx.skipped_steps += round(math.log(ctx.last_scale / scale, 1.0 / ctx.scaler.get_backoff_factor()))
    ctx.last_scale = scale


def optimizer_step(ctx: StepContext) -> torch.Tensor:
    """Unscale, clip, step, schedule, EMA. Returns the gradient norm (a device tensor)."""
    if ctx.scaler is not None:
        ctx.scaler.unscale_(ctx.optimizer)
    params = [p for p in ctx.raw_model.parameters() if p.grad is not None]
    max_norm = ctx.grad_clip if ctx.grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if ctx.scaler is not None:
        ctx.scaler.step(ctx.optimizer)  # skipped when the unscaled gradients hold inf/NaN
        ctx.scaler.update()
    else:
        ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    ctx.step += 1
    ctx.scheduler.step_update(num_updates=ctx.step)
    if ctx.ema is not None:
        ctx.ema.update(ctx.raw_model, step=ctx.step)
    return grad_norm.detach().float()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    limit_batches: int | None = None,
    num_classes: int | None = None,
    dist: Distributed | None = None,
    flip: bool = False,
) -> dict:
    """Top-1, top-5 and mean cross-entropy over the loader (sums kept on the device until the end).
    With `num_classes`, also the confusion matrix (rows: true class, columns: predicted).
    Under torchrun each rank evaluates its shard and the sums are all-reduced: every rank gets the totals.
    `flip`: test-time augmentation, the class probabilities averaged over each image and its mirror image."""
    model.eval()
    ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    with eager():  # blocks compiled in place for training (trainer.compile_scope=blocks) evaluate eagerly
        return _evaluate(model, loader, device, ctx, limit_batches, num_classes, dist, flip)


def _evaluate(model, loader, device, ctx, limit_batches, num_classes, dist, flip) -> dict:
    correct1 = torch.zeros((), device=device, dtype=torch.long)
    correct5 = torch.zeros((), device=device, dtype=torch.long)
    loss_sum = torch.zeros((), device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device) if num_classes else None
    count = 0
    for i, (images, targets) in enumerate(loader):
        if limit_batches is not None and i >= limit_batches:
            break
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with ctx:
            logits = model(images).float()  # (B, classes)
            if flip:
                mirrored = model(images.flip(-1)).float()
        if flip:
            scores = (logits.softmax(-1) + mirrored.softmax(-1)) / 2  # probabilities (B, classes)
            loss_sum += F.nll_loss(scores.clamp_min(1e-12).log(), targets, reduction="sum")
        else:
            scores = logits
            loss_sum += F.cross_entropy(logits, targets, reduction="sum")
        top5 = scores.topk(min(5, scores.shape[-1]), dim=-1).indices  # (B, 5)
        correct1 += (top5[:, 0] == targets).sum()
        correct5 += (top5 == targets[:, None]).any(dim=-1).sum()
        if confusion is not None:
            confusion += torch.bincount(targets * num_classes + top5[:, 0], minlength=num_classes * num_classes).view(
                num_classes, num_classes
            )
        count += targets.shape[0]
    sums = torch.stack([correct1.double(), correct5.double(), loss_sum.double(), loss_sum.new_tensor(count).double()])
    if dist is not None:
        dist.sum_(sums)
        if confusion is not None:
            dist.sum_(confusion)
    correct1, correct5, loss_total, count = sums.tolist()
    count = max(int(count), 1)
    result = {
        "top1": 100.0 * correct1 / count,
        "top5": 100.0 * correct5 / count,
        "loss": loss_total / count,
        "count": count,
    }
    if confusion is not None:
        result["confusion"] = confusion.cpu()
    return result
