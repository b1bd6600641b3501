"""What a training step costs at each image size progressive resizing trains at, so a budget plans its whole run
from the steps it measured at the first size (vit/train/budget.py).

A step at s px costs `share + (1 - share) * (s / full)^2` of a full-size step: a share that grows with the tokens
(`size_cost`, vit/train/progressive.py) and a fixed share that does not (the optimizer, the loader's work on each
image, which it augments at the full size before the step resizes, each operator's dispatch). The fixed share is
measured from trainer.width_by_budget's timing of the picked width at the full size against the step measured at
the first size: at the first plan, and again at every re-plan while the run still trains at that size, since the
first few steps of a process can run slower or faster than the rest (docs/BENCHMARKS.md, "The budget's first
plan against the steps trained"). Once the run trains at another size the share is kept. Without that timing it is
0, the token count alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vit.train.progressive import ResizeSchedule, size_cost

MAX_FIXED_SHARE = 0.5  # a timing that reads more is not a step's cost (a loaded machine, a cold start)


class StepPricing:
    """The fixed share of a run's steps (measured once, kept in its checkpoints) and the cost of one size against
    another."""

    def __init__(self, resize: ResizeSchedule | None, timed_full_step_s: float | None, share: float | None = None):
        self.resize, self.timed_full_step_s = resize, timed_full_step_s
        self.share = share  # None until the first plan measures it (or without progressive resizing)
        # the size the share is measured at while the run trains there; None once it trains at another (or resumed)
        self.measuring: int | None = None

    def fixed_share(self, step_s: float, measured: int) -> float:
        """The share, from the step of `step_s` seconds measured at `measured` px: the first time it is asked and
        every time after while `measured` is that first size; kept from the first other size on."""
        if self.share is None:
            self.measuring = measured
        elif measured != self.measuring:
            self.measuring = None
        if measured == self.measuring:
            resize, timed, share = self.resize, self.timed_full_step_s, 0.0
            if resize is not None and timed and measured < resize.full_size:
                tokens = size_cost(measured, resize.full_size)
                share = (step_s / timed - tokens) / (1 - tokens)  # step_s / timed = share + (1 - share) * tokens
            self.share = min(max(share, 0.0), MAX_FIXED_SHARE)
        return self.share

    def factor(self, size: int, step_s: float, measured: int | None) -> float:
        """A step at `size` px against one at `measured` px (1 without progressive resizing)."""
        if self.resize is None or measured is None:
            return 1.0
        share, full = self.fixed_share(step_s, measured), self.resize.full_size
        return (share + (1 - share) * size_cost(size, full)) / (share + (1 - share) * size_cost(measured, full))

    def describe(self, step_s: float, measured: int | None) -> str:
        """The first plan's price of a full-size step and where it comes from ("" at the full size)."""
        if self.resize is None or measured is None or measured >= self.resize.full_size:
            return ""
        full, share = self.resize.full_size, self.fixed_share(step_s, measured)
        why = "by tokens" if share == 0 else f"by tokens and a fixed {share:.0%} (trainer.width_by_budget's timing)"
        return f"; a {full} px step priced at {self.factor(full, step_s, measured):.2f}x a {measured} px one, {why}"


def seconds_to(step_cost: Callable[[int], float], steps_per_epoch: int, step: int, total: int) -> float:
    """Seconds of training from after `step` to `total`, each epoch's steps at `step_cost(epoch)`."""
    seconds = 0.0
    while step < total:
        epoch = step // steps_per_epoch  # the epoch of step + 1
        end = min(total, (epoch + 1) * steps_per_epoch)
        seconds += (end - step) * step_cost(epoch)
        step = end
    return seconds


def steps_within(step_cost: Callable[[int], float], steps_per_epoch: int, step: int, seconds: float, epochs: int,
                 resize: ResizeSchedule | None) -> int:  # fmt: skip
    """The last step that `seconds` of training from after `step` reach in a run of `epochs`, each epoch's steps
    at `step_cost(epoch)` (past the last epoch at its cost; before `step` when `seconds` is negative)."""
    if resize is None:  # one cost for every step
        return step + math.floor(seconds / step_cost(0))
    while True:
        epoch = min(step // steps_per_epoch, epochs - 1)
        cost, end = step_cost(epoch), (epoch + 1) * steps_per_epoch
        if epoch < epochs - 1 and (end - step) * cost <= seconds:
            seconds, step = seconds - (end - step) * cost, end
            continue
        return step + math.floor(seconds / cost)
