"""What a budget's plan needs to know of the run besides the clock (vit/train/budget.py): its steps, epochs,
evaluations and the sizes progressive resizing trains at."""

from __future__ import annotations

from dataclasses import dataclass

from vit.train.progressive import ResizeSchedule


@dataclass(frozen=True)
class RunShape:
    """What the plan needs to know of the run besides the clock."""

    budget_s: float
    steps_per_epoch: int  # optimizer steps per epoch and process
    max_epochs: int  # trainer.epochs: the upper bound
    warmup_steps: int  # the configured warmup, in optimizer steps
    val_every: int  # trainer.val_every_n_epochs
    val_batches: int  # batches of one evaluation pass (trainer.limit_val_batches applied)
    test_batches: int  # batches of the final test pass, 0 when the run has none
    eval_passes: int  # passes per evaluation: 1, 2 with an EMA (its own pass)
    views: int  # forward passes per image in a pass: 1, x2 with trainer.eval_flip, x3 with trainer.eval_shift
    images_per_step: float  # global images per optimizer step (batch x accumulation x processes); NaFlex: a mean
    loader_workers: int = 0  # the train loader's worker processes: each one's first batch waits for its start
    figure_every: int = 0  # the attention or reconstruction figures: every this many epochs and after the last
    sweep_plan: bool = False  # trainer.sweep_budget's fitting job: whole epochs, its first plan kept (no re-plans)
    # trainer.progressive_resize: the size each epoch trains at, so the steps still to come are planned at their
    # own sizes' cost, not at the size the step was measured at
    resize: ResizeSchedule | None = None
    # trainer.width_by_budget's seconds for a step of the picked width at the full size: against the first steps'
    # time at the first size, it measures the share of a step that does not grow with the tokens (step_pricing.py)
    timed_full_step_s: float | None = None

    @property
    def max_steps(self) -> int:
        return self.max_epochs * self.steps_per_epoch
