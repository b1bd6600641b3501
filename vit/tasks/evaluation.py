"""The evaluation pass: top-1, top-5, loss (and the confusion matrix) of a classifier over a loader, or a masked
autoencoder's reconstruction loss; under torchrun each rank evaluates its shard and the sums are all-reduced."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from vit.naflex import to_device
from vit.runtime.compile import eager
from vit.runtime.device import autocast_to
from vit.runtime.distributed import Distributed
from vit.runtime.sharding import is_sharded, reshard


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
    shift: int = 0,
) -> dict:
    """Top-1, top-5 and mean cross-entropy over the loader (sums kept on the device until the end).
    With `num_classes`, also the confusion matrix (rows: true class, columns: predicted).
    Under torchrun each rank evaluates its shard and the sums are all-reduced: every rank gets the totals.
    `flip`, `shift`: test-time augmentation, the class probabilities averaged over the views of `tta_views`."""
    model.eval()
    ctx = autocast_to(device, amp_dtype)
    with eager():  # blocks compiled in place for training (trainer.compile_scope=blocks) evaluate eagerly
        result = _evaluate(model, loader, device, ctx, limit_batches, num_classes, dist, flip, shift)
    reshard(model)  # a sharded model's blocks gathered for the passes, freed (see vit/runtime/sharding.py)
    return result


def shifted(images: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """The images moved `dy` pixels down and `dx` right (negative: up, left), the uncovered border zero-filled as
    the training pad-crop fills it. (B, C, H, W) -> same."""
    pad = max(abs(dy), abs(dx))
    height, width = images.shape[-2:]
    padded = F.pad(images, (pad, pad, pad, pad))  # (B, C, H + 2 pad, W + 2 pad)
    return padded[..., pad - dy : pad - dy + height, pad - dx : pad - dx + width]


def tta_views(images: torch.Tensor, flip: bool, shift: int) -> list[tuple[float, torch.Tensor]]:
    """The (weight, view) pairs whose class probabilities test-time augmentation averages, weights summing to 1:
    the image; with `shift` > 0 also the image moved `shift` pixels down-right and up-left, weighed 1/2, 1/4,
    1/4 (airbench's multi-crop weights); with `flip` each view and its mirror, half the view's weight each."""
    views = [(1.0, images)]
    if shift > 0:
        views = [(0.5, images), (0.25, shifted(images, shift, shift)), (0.25, shifted(images, -shift, -shift))]
    if flip:
        views = [pair for weight, view in views for pair in ((weight / 2, view), (weight / 2, view.flip(-1)))]
    return views


def batches_to_run(model: nn.Module, loader, limit_batches: int | None, dist: Distributed | None) -> int | None:
    """A sharded model (trainer.strategy=fsdp) gathers its parameters in every forward pass, with every rank at once,
    so every rank must run as many passes: the most batches any rank's shard of the split holds (they differ by one
    where the images do not divide evenly). None: no such need (each rank runs its own batches)."""
    if dist is None or not dist.enabled or not is_sharded(model):
        return None
    batches = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    return int(dist.max_(torch.tensor([batches], device=next(model.parameters()).device)).item())


def idle_passes(model: nn.Module, images: torch.Tensor | None, count: int, views: int, ctx) -> None:
    """`count` batches' worth of forward passes (of `views` views each) whose results are dropped: a rank whose
    shard ran out keeps its part in the sharded model's gathers (see `batches_to_run`)."""
    if images is None:  # this rank's shard was empty: an image of the model's size stands in
        side = model.patch_embed.img_size
        images = torch.zeros(1, 3, *(side if isinstance(side, tuple) else (side, side)))
    with ctx:
        for _ in range(count * views):
            model(images[:1].to(next(model.parameters()).device))


def _evaluate(model, loader, device, ctx, limit_batches, num_classes, dist, flip, shift) -> dict:
    correct1 = torch.zeros((), device=device, dtype=torch.long)
    correct5 = torch.zeros((), device=device, dtype=torch.long)
    loss_sum = torch.zeros((), device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device) if num_classes else None
    count, done, images = 0, 0, None
    even = batches_to_run(model, loader, limit_batches, dist)
    for i, (images, targets) in enumerate(loader):
        if limit_batches is not None and i >= limit_batches:
            break
        done = i + 1
        images = to_device(images, device)  # (B, 3, H, W), or a NaFlex batch (vit/naflex.py)
        targets = targets.to(device, non_blocking=True)
        if flip or shift:
            with ctx:
                scores = sum(w * model(view).float().softmax(-1) for w, view in tta_views(images, flip, shift))
            # scores: the views' weighted probabilities (B, classes)
            loss_sum += F.nll_loss(scores.clamp_min(1e-12).log(), targets, reduction="sum")
        else:
            with ctx:
                scores = model(images).float()  # logits (B, classes)
            loss_sum += F.cross_entropy(scores, targets, reduction="sum")
        top5 = scores.topk(min(5, scores.shape[-1]), dim=-1).indices  # (B, 5)
        correct1 += (top5[:, 0] == targets).sum()
        correct5 += (top5 == targets[:, None]).any(dim=-1).sum()
        if confusion is not None:
            confusion += torch.bincount(targets * num_classes + top5[:, 0], minlength=num_classes * num_classes).view(
                num_classes, num_classes
            )
        count += targets.shape[0]
    if even is not None:
        idle_passes(model, images, even - done, (2 if flip else 1) * (3 if shift else 1), ctx)
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


# The masks of evaluation: the same noise, so the same hidden patches, for each validation image in every epoch.
RECONSTRUCTION_EVAL_SEED = 0


@torch.no_grad()
def evaluate_reconstruction(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    limit_batches: int | None = None,
    dist: Distributed | None = None,
) -> dict:
    """task=mae: the masked autoencoder's loss (mean squared error on the hidden patches) over the loader, as
    {"loss", "count"} with top1/top5 None (no labels). Each batch's masking noise comes from a generator seeded
    once per pass, so every epoch hides the same patches of the same images and the losses compare."""
    model.eval()
    ctx = autocast_to(device, amp_dtype)
    generator = torch.Generator().manual_seed(RECONSTRUCTION_EVAL_SEED)
    num_patches = model.patch_embed.num_patches
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    count, done, images = 0, 0, None
    even = batches_to_run(model, loader, limit_batches, dist)
    with eager():
        for i, (images, _) in enumerate(loader):
            if limit_batches is not None and i >= limit_batches:
                break
            done = i + 1
            images = images.to(device, non_blocking=True)  # (B, 3, H, W)
            noise = torch.rand(images.shape[0], num_patches, generator=generator).to(device)  # (B, N)
            with ctx:
                loss, _, _ = model(images, noise=noise)
            # Every image hides the same number of patches, so the batch mean weighs each image alike.
            loss_sum += loss.double() * images.shape[0]
            count += images.shape[0]
        if even is not None:
            idle_passes(model, images, even - done, 1, ctx)
    reshard(model)
    sums = torch.stack([loss_sum, loss_sum.new_tensor(float(count))])
    if dist is not None:
        dist.sum_(sums)
    total, count = sums.tolist()
    count = max(int(count), 1)
    return {"top1": None, "top5": None, "loss": total / count, "count": count}
