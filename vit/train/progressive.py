"""Progressive resizing (as FFCV's ResNet recipes do it): the first epochs train on smaller images, the size
growing linearly to the full `data.img_size` over a ramp of epochs; evaluation always sees full-size images.

For a ViT the saving is in the token count: ViT-Ti/4 at 24 px cuts 6 x 6 = 36 patches instead of 64, and the
attention's N^2 term shrinks faster still. The model accepts the smaller grids through `dynamic_img_size`
(its position table resampled to the grid), so nothing about its parameters changes.

The batch is resized on the device after augmentation (bilinear with antialiasing: vit/data/augment/batch.py's
`resize_batch`), so both loaders and every augmentation work unchanged. Each size is a new input shape: under
torch.compile it compiles once per size (static shapes, the best kernels), so a ramp over few sizes keeps the
compile cost small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vit.settings import ProgressiveResize


@dataclass(frozen=True)
class ResizeSchedule:
    """`trainer.progressive_resize`: from `min_size` until `start` * epochs, then linearly up to `full_size`, reached
    at `end` * epochs. Sizes are rounded down to a multiple of `multiple` (the patch size, so the grid is whole)."""

    min_size: int
    full_size: int
    start: float  # fraction of the epochs
    end: float  # fraction of the epochs
    multiple: int

    def size_at(self, epoch: int, epochs: int) -> int:
        """The training image size of `epoch` (counted from 0) of `epochs`. The fractions are of the last epoch's
        index, so `end=1.0` puts the full size on the last epoch."""
        first, last = self.start * (epochs - 1), self.end * (epochs - 1)
        if epoch >= last:
            progress = 1.0
        elif epoch < first:
            progress = 0.0
        else:  # first <= epoch < last, so last > first
            progress = (epoch - first) / (last - first)
        size = self.min_size + progress * (self.full_size - self.min_size)
        return max(self.min_size, min(self.full_size, int(size) // self.multiple * self.multiple))

    def sizes(self, epochs: int) -> list[int]:
        return [self.size_at(epoch, epochs) for epoch in range(epochs)]


def size_cost(size: int, full_size: int) -> float:
    """A training step's cost at `size` px against one at `full_size`, counted by tokens: (size / full)^2. The
    width choice prices an epoch with it, and the budget the part of a step that grows with the tokens (the rest
    is vit/train/step_pricing.py's fixed share). How close that comes to measured steps: docs/BENCHMARKS.md, "The
    budget's first plan against the steps trained"."""
    return (size / full_size) ** 2


def resize_schedule(
    setting: ProgressiveResize | Mapping | None, full_size: int, patch_size: int
) -> ResizeSchedule | None:
    """The schedule of `trainer.progressive_resize` (its settings, vit/settings/trainer.py); None when it is off
    (`min_size: null`)."""
    setting = ProgressiveResize.of(setting)
    if setting.min_size is None:
        return None
    return ResizeSchedule(setting.min_size, int(full_size), setting.start, setting.end, multiple=int(patch_size))


def allow_recompiles(num_sizes: int) -> None:
    """torch.compile gives up on a function after `recompile_limit` (8) recompilations and runs it eagerly from
    then on, silently slow; a ramp over more image sizes than that raises the limit to cover every size."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    if getattr(dynamo_config, name) < num_sizes + 1:
        setattr(dynamo_config, name, num_sizes + 1)
