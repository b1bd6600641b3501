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
    step: int = 0  # optimizer steps so far
    bad_steps: int = 0
    skipped_steps: int = 0  # fp16 steps the scaler skipped (counted at log time, see count_skipped_steps)
    last_scale: float | None = None  # the GradScaler's scale when it was last read
    stop_requested: Callable[[], bool] = field(default=lambda: False)


class NonFiniteLossError(RuntimeError):
    pass


def autocast(ctx: StepContext):
    if ctx.amp_dtype is None:
        return nullcontext()
    return torch.autocast(ctx.device.type, dtype=ctx.amp_dtype)


def train_one_epoch(
    ctx: StepContext,
    loader: Iterable,
    *,
    limit_batches: int | None,
    on_log: Callable[[int, dict], None],
) -> dict:
    """Train over `loader`; returns the epoch's mean loss, images/s and seconds."""
    ctx.model.train()
    count_skipped_steps(ctx)  # the scale before this epoch's first step
    steps = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    loss_sum = torch.zeros((), device=ctx.device)
    window_loss = torch.zeros((), device=ctx.device)
    window_grad = torch.zeros((), device=ctx.device)
    window_count, window_opt_steps, images_seen = 0, 0, 0
    start = window_start = time.perf_counter()
    window_images = 0
    for i, (images, targets) in enumerate(loader):
        if i >= steps:
            break
        images = images.to(ctx.device, non_blocking=True)
        targets = targets.to(ctx.device, non_blocking=True)
        if ctx.mixup_fn is not None:
            images, targets = ctx.mixup_fn(images, targets)  # soft targets (B, classes)
        with autocast(ctx):
            loss = ctx.criterion(ctx.model(images), targets)
        if ctx.scaler is not None:
            ctx.scaler.scale(loss / ctx.accum_steps).backward()
        else:
            (loss / ctx.accum_steps).backward()
        loss = loss.detach()
        loss_sum += loss
        window_loss += loss
        window_count += 1
        images_seen += images.shape[0]
        window_images += images.shape[0]

        if (i + 1) % ctx.accum_steps == 0 or i + 1 == steps:
            window_grad += optimizer_step(ctx)
            window_opt_steps += 1

        if (i + 1) % ctx.log_every == 0 or i + 1 == steps:
            mean_loss = (window_loss / window_count).item()  # the one host sync, every log_every steps
            if not math.isfinite(mean_loss):
                ctx.bad_steps += window_count
                if ctx.scaler is None and ctx.bad_steps >= ctx.max_bad_steps:
                    raise NonFiniteLossError(
                        f"loss is {mean_loss} at step {ctx.step} ({ctx.bad_steps} non-finite steps in a row); "
                        "stopping, the last good checkpoint is kept"
                    )
            else:
                ctx.bad_steps = 0
            count_skipped_steps(ctx)
            now = time.perf_counter()
            on_log(
                i + 1,
                {
                    "train/loss": mean_loss,
                    "train/lr": ctx.optimizer.param_groups[0]["lr"],
                    "train/grad_norm": (window_grad / max(1, window_opt_steps)).item(),
                    "train/img_per_s": window_images / max(now - window_start, 1e-9),
                },
            )
            window_loss.zero_()
            window_grad.zero_()
            window_count, window_opt_steps, window_images, window_start = 0, 0, 0, now
        if ctx.stop_requested():
            break
    seconds = time.perf_counter() - start
    done = max(1, min(i + 1, steps)) if steps else 1
    return {
        "loss": (loss_sum / done).item(),
        "img_per_s": images_seen / max(seconds, 1e-9),
        "seconds": seconds,
        "steps": done,
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
) -> dict:
    """Top-1, top-5 and mean cross-entropy over the loader (sums kept on the device until the end).
    With `num_classes`, also the confusion matrix (rows: true class, columns: predicted)."""
    model.eval()
    correct1 = torch.zeros((), device=device, dtype=torch.long)
    correct5 = torch.zeros((), device=device, dtype=torch.long)
    loss_sum = torch.zeros((), device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device) if num_classes else None
    count = 0
    ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    for i, (images, targets) in enumerate(loader):
        if limit_batches is not None and i >= limit_batches:
            break
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with ctx:
            logits = model(images)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, targets, reduction="sum")
        top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (B, 5)
        correct1 += (top5[:, 0] == targets).sum()
        correct5 += (top5 == targets[:, None]).any(dim=-1).sum()
        if confusion is not None:
            confusion += torch.bincount(targets * num_classes + top5[:, 0], minlength=num_classes * num_classes).view(
                num_classes, num_classes
            )
        count += targets.shape[0]
    count = max(count, 1)
    result = {
        "top1": 100.0 * correct1.item() / count,
        "top5": 100.0 * correct5.item() / count,
        "loss": loss_sum.item() / count,
        "count": count,
    }
    if confusion is not None:
        result["confusion"] = confusion.cpu()
    return result
