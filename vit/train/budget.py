"""`trainer.budget`: a wall-clock budget for the whole run, from the process start to the end of the final test
evaluation, spent on as many optimizer steps as fit, with the learning-rate decay ending on the last of them.

A count of epochs is a guess at how fast the machine is; a budget is what the user actually has. Cutting a fixed
schedule off when time runs out (Lightning's `max_time`) stops it before the learning rate has decayed, and a
schedule that ends exactly at the budget beats a longer one cut off there (Li, Yumer and Ramanan, "Budgeted
Training", ICLR 2020). So the run measures its own speed and sizes its schedule to the time left:

- After a few warm-up steps (the first one holds allocations or compilation and is not timed, as is the first step
  at each new image size under progressive resizing, after which the speed is measured afresh), the plan: the
  largest number of optimizer steps T such that the steps left, the end of every epoch still to come (its
  evaluation, when `trainer.val_every_n_epochs` or the last epoch asks for one, its checkpoint, and the attention
  or reconstruction figures it draws, one of which is drawn and timed before the plan) and the final test
  evaluation all end before the budget, less a small margin for writing metrics.json.
- The speed is measured again at every step (every 10 steps under torchrun, where rank 0 plans and broadcasts the
  plan at the same steps on every rank), over the steps of the latest half of the time left; an epoch's end is
  timed when it happens. When the predicted end drifts away from the budget by more than a band (2% of the time
  left, 0.5% of the budget near the end: a loaded machine, a slower epoch, larger images under progressive
  resizing), the run re-plans. A re-plan is a log line only when it moves the end by more than 2% of the budget or
  changes the planned epochs (Budget.worth_a_line). The progress line counts towards the current plan, and
  metrics.json keeps every plan.
- The schedule is a function of planned progress. The warmup runs over its configured steps (at most half of the
  plan); the cosine after it runs over the planned progress q in [0, 1], and a re-plan at step s keeps q(s) and
  stretches or shrinks what is left so that q reaches 1 on the new last step: the learning rate never jumps and
  always ends at `sched.min_lr`. timm's scheduler computes the rate: it is stepped at the virtual step that
  progress corresponds to in the schedule it was built for (`trainer.epochs` of steps, the upper bound), so a plan
  that fills every epoch trains exactly the schedule a run without a budget trains.
- `trainer.epochs` is the upper bound. The plan, its re-plans, the time used and the steps planned and trained go to
  the log, metrics.json (`budget`) and TensorBoard (`budget/*`); a resumed run keeps the plan of the run it
  continues and counts the time already spent (checkpoints hold the budget's state).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from dataclasses import dataclass
from functools import partial

from vit.errors import UserError
from vit.settings.trainer import duration
from vit.train.report import figure_due
from vit.train.run_shape import RunShape
from vit.train.step_pricing import StepPricing, seconds_to, steps_within


class BudgetTooSmall(UserError):
    """trainer.budget cannot hold the run, as measured on this machine (the start, the step): a setting to change,
    so exit code 2, but named as the measurement it is, with the budget that would have fitted."""

    kind = "budget"


log = logging.getLogger("vit.train")


def clock() -> float:
    """The clock every budget decision reads: the run's own (`RunProgress.elapsed`) is time.perf_counter too."""
    return time.perf_counter()


def tolerance(seconds: float) -> float:
    """How far past its budget a run may end before that counts as a bug: 2% or 5 s, whichever is larger."""
    return max(0.02 * seconds, 5.0)


@dataclass
class Plan:
    """The steps the run ends on, and the point the cosine's progress is anchored at: progress(anchor_step) is
    anchor_progress and reaches 1 at total_steps, linearly in between."""

    total_steps: int
    anchor_step: int
    anchor_progress: float
    warmup_steps: int


class Budget:
    """The plan of a budgeted run and the measurements behind it. Through its callback (vit/train/budget_hooks.py's
    `BudgetPlan`), the loop (vit/train/trainer.py) calls `after_step` once per optimizer step, before the schedule
    is stepped, and `epoch_starts`, `epoch_trained` and `epoch_ended` around each epoch's training loop,
    evaluation and checkpoint."""

    WARMUP_STEPS = 3  # timed steps before the first plan (after the untimed first step of each process) ...
    # ... spanning at least this share of the budget: a process's first few steps can run slower or faster than the
    # rest (docs/BENCHMARKS.md, "The budget's first plan against the steps trained"). The plan's warmup is the
    # configured one, which the steps before the plan follow as built, so waiting changes no learning rate.
    FIRST_PLAN_SHARE = 0.01
    DISTRIBUTED_EVERY = 10  # under torchrun, the ranks agree on the plan every this many steps
    MIN_WINDOW = 20  # the speed is measured over the latest half of the time left, at least this many steps
    RECENT_S = 5.0  # the load's effect on the evaluations to come: the step over the latest few seconds
    MAX_SAMPLES = 8192

    def __init__(self, shape: RunShape, elapsed_s: float, dist=None, state: dict | None = None) -> None:
        self.shape, self.dist = shape, dist
        self.start = clock() - elapsed_s  # the run's clock, over resumes: elapsed = clock() - start
        # End `margin` before the budget (metrics.json and the event files are written after the test).
        self.margin = max(0.2, 0.002 * shape.budget_s)
        state = state or {}
        self.plan = Plan(**state["plan"]) if state.get("plan") else None  # None: the upper bound rules
        self.history: list[dict] = list(state.get("history", []))  # one entry per plan and re-plan
        self.eval_end_s: float | None = state.get("eval_end_s")  # measured: an epoch end with an evaluation
        self.plain_end_s: float | None = state.get("plain_end_s")  # ... and one without (figures left out of both)
        self.figure_s: float | None = state.get("figure_s")  # measured: drawing the figures once
        # (image size, seconds per step) measured when eval_end_s was: a slower step at that size since (another
        # process took CPU time) slows the evaluations still to come alike
        self.eval_step: tuple[int | None, float] | None = tuple(state["eval_step"]) if state.get("eval_step") else None
        self.pricing = StepPricing(shape.resize, shape.timed_full_step_s, state.get("fixed_share"))
        self.figure_in_epoch_s = 0.0  # figures drawn in the epoch end being timed, left out of its cost
        self.step_s: float | None = None  # measured seconds per optimizer step in this process
        self.recent_s: float | None = None  # ... over the latest RECENT_S (read once a step: planning asks often)
        self.sample_steps: list[int] = []  # optimizer steps timed in this process, ascending ...
        self.sample_clock: list[float] = []  # ... and the training clock after each
        self.train_seconds = 0.0  # time spent inside training loops in this process
        self.loop_started: float | None = None
        self.loop_ended: float | None = None
        self.too_small_reason: str | None = None
        # Untimed steps of this process: the first (allocations, compilation) and one per loader worker, whose
        # first batch waits for the worker to start (the main process's start-up copied into it).
        self.untimed_left = 1 + shape.loader_workers
        self.img_size: int | None = None  # the image size of the epoch being trained (progressive resizing)
        # The plan the log last told of: (its last step, the run's clock then); a resumed plan counts as told.
        self.announced: tuple[int, float] | None = (self.plan.total_steps, elapsed_s) if self.plan else None

    @property
    def planner(self) -> bool:
        """Rank 0 plans; under torchrun the others take its plan."""
        return self.dist is None or self.dist.is_main

    # --- the run's clock ---------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return clock() - self.start

    def check_start(self) -> None:
        """Before the first step: a budget the start-up has already spent is refused at once."""
        if self.elapsed() >= self.shape.budget_s - self.margin:
            raise BudgetTooSmall(
                f"trainer.budget={duration(self.shape.budget_s)} is too small for this run: the start (imports, "
                f"model, data) took {self.elapsed():.1f} s of it before the first step; give more than "
                f"{math.ceil(self.elapsed() + self.margin)}s"
            )

    def epoch_starts(self, img_size: int | None = None) -> None:
        """An epoch's training loop starts, at `img_size` (progressive resizing; None: the loader's size). A new
        size costs a compilation in its first step and changes the step's cost: the speed is measured afresh from
        the step after it, as at the start of the process."""
        if img_size != self.img_size and self.img_size is not None:
            self.untimed_left = max(self.untimed_left, 1)
        self.img_size = img_size
        self.loop_started = clock()

    def epoch_trained(self) -> None:
        """An epoch's training loop has ended (its evaluation and checkpoint come next)."""
        now = clock()
        if self.loop_started is not None:
            self.train_seconds += now - self.loop_started
        self.loop_started, self.loop_ended = None, now

    def epoch_ended(self, evaluated: bool) -> None:
        """The epoch's evaluation, record and checkpoint are done: their time is what an epoch end costs."""
        if self.loop_ended is None:
            return
        seconds = clock() - self.loop_ended - self.figure_in_epoch_s
        self.figure_in_epoch_s = 0.0
        if evaluated:
            self.eval_end_s = seconds
            self.eval_step = (self.img_size, self.step_s) if self.step_s is not None else None
        else:
            self.plain_end_s = seconds
        self.loop_ended = None

    def figure_drawn(self, seconds: float, in_epoch: bool = True) -> None:
        """The figures took `seconds`: the cost of each epoch end that draws them (`in_epoch`: this epoch's end,
        whose own cost is measured without them)."""
        self.figure_s = seconds
        if in_epoch:
            self.figure_in_epoch_s += seconds

    def training_clock(self) -> float:
        running = clock() - self.loop_started if self.loop_started is not None else 0.0
        return self.train_seconds + running

    # --- the step loop -----------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        return self.plan.total_steps if self.plan is not None else self.shape.max_steps

    def reached(self, step: int) -> bool:
        """Whether the plan's last step is done (before the first plan: the trainer.epochs bound)."""
        return step >= self.total_steps()

    def planned_epochs(self) -> int:
        return max(1, math.ceil(self.total_steps() / self.shape.steps_per_epoch))

    def after_step(self, step: int) -> None:
        """After optimizer step `step`: measure the speed, and plan or re-plan."""
        if self.untimed_left:  # the process's first steps: allocations, compilation, the loader workers' start
            self.untimed_left -= 1
            self.sample_steps, self.sample_clock = [step], [self.training_clock()]
            return
        distributed = self.dist is not None and self.dist.enabled
        if distributed and step % self.DISTRIBUTED_EVERY:
            return
        self.sample_steps.append(step)
        self.sample_clock.append(self.training_clock())
        if len(self.sample_steps) > self.MAX_SAMPLES:  # a long run: the oldest half is older than any window
            del self.sample_steps[: self.MAX_SAMPLES // 2], self.sample_clock[: self.MAX_SAMPLES // 2]
        self.step_s = self.measured_step_seconds(step)
        self.recent_s = self.recent_step_seconds()
        decision = self.decide(step) if self.planner and self.step_s is not None else None
        if distributed:  # rank 0's decision on every rank, taken at the same steps
            decision = self.dist.broadcast(decision)
        if decision == TOO_SMALL:
            budget = duration(self.shape.budget_s)
            raise BudgetTooSmall(self.too_small_reason or f"trainer.budget={budget} is too small")
        if decision is not None:
            self.adopt(step, decision)

    def measured_step_seconds(self, step: int) -> float | None:
        """Seconds per optimizer step over the steps trained in the latest half of the time left (at least
        MIN_WINDOW steps, at most those timed in this process at this image size), once WARMUP_STEPS are timed.
        The speed of a shared machine wavers by 10-20% from one minute to the next: a window as long as half of
        what is left averages that out while the end is far (the plan does not swing with it), and shrinks towards
        the end, where a lasting change matters and is caught. The window is time, not planned steps: a window of
        planned steps would grow with every longer plan and take in older, different steps, which changes the
        plan again (measured: a 5-minute GPU run swung between 3,400 and 4,700 planned steps that way)."""
        left = max(0.0, self.shape.budget_s - self.margin - self.elapsed())
        by_time = bisect.bisect_left(self.sample_clock, self.sample_clock[-1] - 0.5 * left)
        by_count = max(0, bisect.bisect_right(self.sample_steps, step - self.MIN_WINDOW) - 1)
        first = min(by_time, by_count, len(self.sample_steps) - 1)
        steps = step - self.sample_steps[first]
        if steps < self.WARMUP_STEPS:
            return None
        return max(self.sample_clock[-1] - self.sample_clock[first], 1e-9) / steps

    # --- planning ----------------------------------------------------------------------------------------------
    def step_cost(self, epoch: int, epochs: int) -> float:
        """Seconds per step of `epoch` (from 0) in a run of `epochs`: the measured step, priced at the size that
        epoch trains at (vit/train/step_pricing.py)."""
        resize = self.shape.resize
        size = resize.size_at(min(epoch, epochs - 1), epochs) if resize is not None else None
        return self.step_s * self.pricing.factor(size, self.step_s, self.img_size) if size else self.step_s

    def full_size_step_s(self) -> float:
        """Seconds per step at the full image size (what the evaluations see), from the measured step."""
        resize = self.shape.resize
        return self.step_s * (self.pricing.factor(resize.full_size, self.step_s, self.img_size) if resize else 1.0)

    def evaluated(self, epochs: int) -> list[int]:
        """The epochs (from 0) of a run of `epochs` that end with an evaluation."""
        every = self.shape.val_every
        return [e for e in range(epochs) if e == epochs - 1 or (e + 1) % every == 0]

    def eval_batch_seconds(self) -> float:
        """Seconds per batch of an evaluation, all its passes (the EMA's) and mirrors (flip) together: measured by
        the latest epoch end with an evaluation (its record and checkpoint included) and scaled by the step's
        slowdown since, else estimated from the step: a forward pass costs about a third of a training step's
        forward and backward."""
        shape = self.shape
        if self.eval_end_s is not None and shape.val_batches:
            return self.eval_end_s * self.load_change() / shape.val_batches
        return self.full_size_step_s() / 3 * shape.eval_passes * shape.views

    def load_change(self) -> float:
        """How much slower a step at the image size of the latest measured evaluation runs now than it ran then
        (1.0 when the size differs, or nothing was measured). "Now": the slower of the plan's window, which spans
        half the time left, and the latest RECENT_S, which a load starting near the end reaches at once."""
        if self.eval_step is None or self.step_s is None or self.eval_step[0] != self.img_size:
            return 1.0
        return max(self.step_s, self.recent_s or 0.0) / self.eval_step[1]

    def first_plan_s(self) -> float:
        """Seconds of timed steps the first plan waits for (FIRST_PLAN_SHARE of the budget)."""
        return self.FIRST_PLAN_SHARE * self.shape.budget_s

    def waits_to_plan(self, step: int) -> bool:
        """Before the first plan, after `step`: whether to time more steps first, unless the trainer.epochs bound
        comes before the wait would end (a sweep's fitting job publishes such a plan at once)."""
        timed = self.sample_clock[-1] - self.sample_clock[0]  # over the steps timed in this process at this size
        wait = self.first_plan_s() - timed
        return wait > 0 and (self.shape.max_steps - step) * self.step_s > wait

    def recent_step_seconds(self) -> float | None:
        """Seconds per step over the steps timed in the latest RECENT_S (at least 2 steps), or None."""
        clocks, steps = self.sample_clock, self.sample_steps
        if len(clocks) < 3:
            return None
        first = min(bisect.bisect_left(clocks, clocks[-1] - self.RECENT_S), len(clocks) - 3)
        span = steps[-1] - steps[first]
        return (clocks[-1] - clocks[first]) / span if span > 0 else None

    def end_cost(self, evaluated: bool) -> float:
        if not evaluated:
            return self.plain_end_s or 0.0
        if self.eval_end_s is not None:
            return self.eval_end_s * self.load_change()
        return self.eval_batch_seconds() * self.shape.val_batches

    def current_epoch(self, step: int) -> int:
        """The epoch (from 0) of optimizer step `step`: its end is still to come."""
        return max(0, step - 1) // self.shape.steps_per_epoch

    def ends_cost(self, step: int, epochs: int) -> float:
        """Seconds of the epoch ends still to come after `step` in a run of `epochs` epochs, and of the test."""
        current = self.current_epoch(step)
        evaluated = set(self.evaluated(epochs))
        ends = sum(self.end_cost(e in evaluated) for e in range(current, epochs))
        figures = sum(figure_due(self.shape.figure_every, e, epochs) for e in range(current, epochs))
        return ends + figures * (self.figure_s or 0.0) + self.eval_batch_seconds() * self.shape.test_batches

    def most_steps(self, step: int, left: float) -> int | None:
        """The most steps (at least `step`) whose training, epoch ends and test take at most `left` seconds from
        now; None when not even ending now fits. For each count of epochs the evaluations are fixed, so the steps
        that fit follow; a longer run has more epoch ends to pay for, so the search stops at the first count whose
        last epoch cannot be reached."""
        spe, best = self.shape.steps_per_epoch, None
        for epochs in range(max(1, math.ceil(step / spe)), self.shape.max_epochs + 1):
            low, high = max(step, (epochs - 1) * spe + 1), epochs * spe  # steps of a run that has `epochs` epochs
            seconds = left - self.ends_cost(step, epochs)
            fits = steps_within(partial(self.step_cost, epochs=epochs), spe, step, seconds, epochs, self.shape.resize)
            if fits < (high if self.shape.sweep_plan else low):  # a sweep's plan: every job trains whole epochs
                break
            best = max(best or 0, min(fits, high))
        return best

    def decide(self, step: int):
        """The plan's new last step; None to keep the plan (its predicted end is within the band around the
        target, or its last step is done); TOO_SMALL when the first plan finds no room for the run."""
        left = self.shape.budget_s - self.margin - self.elapsed()
        current = self.total_steps()
        if self.plan is None and self.waits_to_plan(step):
            return None
        if self.plan is not None:
            if step >= current or self.shape.sweep_plan:  # the sweep's other jobs train the first plan's epochs
                return None
            epochs = self.planned_epochs()
            training = seconds_to(partial(self.step_cost, epochs=epochs), self.shape.steps_per_epoch, step, current)
            predicted = training + self.ends_cost(step, epochs)
            if abs(predicted - left) <= self.band(left):
                return None
        best = self.most_steps(step, left)
        # Too small: nothing fits, or only the steps already timed when time, not trainer.epochs, is the bound.
        if self.plan is None and (best is None or step >= best < self.shape.max_steps):
            self.too_small_reason = self.too_small(step)
            return TOO_SMALL
        best = step if best is None else best  # out of time: this step is the last
        return None if best == current and (self.plan or not self.shape.sweep_plan) else best  # a sweep publishes

    def band(self, left: float) -> float:
        """How far the predicted end may stray from the target before the run re-plans: 2% of the time left (the
        measured speed wavers by a few percent from window to window, and re-planning on that noise helps nobody),
        narrowing to 0.5% of the budget near the end, so the run ends well within the tolerance."""
        return max(0.2, 0.005 * self.shape.budget_s, 0.02 * left)

    def too_small(self, step: int) -> str:
        """The refusal, with the smallest budget that plans one step beyond those timed (spent, a step, the ends)."""
        shape = self.shape
        evaluation = self.eval_batch_seconds() * (shape.val_batches + shape.test_batches)
        epochs = max(1, math.ceil(step / shape.steps_per_epoch))
        smallest = self.elapsed() + self.step_s + self.ends_cost(step, epochs) + self.margin
        return (
            f"trainer.budget={duration(shape.budget_s)} is too small for this run: the start and the first {step} "
            f"steps took {self.elapsed():.1f} s, a step takes {self.step_s:.2f} s and the final evaluation about "
            f"{evaluation:.1f} s; the smallest budget that fits on this machine now is about "
            f"{math.ceil(smallest)}s, and a longer one trains more"
        )

    def adopt(self, step: int, total: int) -> None:
        """Make `total` the plan from `step` on, keeping the cosine's progress at `step` (the rate does not jump)."""
        first = self.plan is None
        if first or step <= self.plan.warmup_steps:
            # a short plan: at most half of it warms up; a sweep's, as its other jobs' fixed epochs do
            warmup = min(self.shape.warmup_steps, total - 1 if self.shape.sweep_plan else total // 2)
            anchor = (max(warmup, step), 0.0)
        else:
            warmup = self.plan.warmup_steps
            anchor = (step, 1.0 if total <= step else self.progress(step))
        self.plan = Plan(total, anchor[0], anchor[1], warmup)
        self.history.append({"step": step, "total_steps": total, "elapsed_s": self.elapsed(), "step_s": self.step_s})
        if self.planner:
            self.announce(step, first)

    # A re-plan is a line when it moves the end by more than ANNOUNCE_CHANGE of the budget (in time at the measured
    # speed) or changes the planned epochs, ANNOUNCE_GAP of the budget after the last line (the first plans settle
    # in quick succession). Smaller corrections go to metrics.json only: a line that moved nothing is noise.
    ANNOUNCE_CHANGE, ANNOUNCE_GAP = 0.02, 0.02

    def worth_a_line(self, first: bool) -> bool:
        if first or self.announced is None:
            return True
        told, told_at = self.announced
        since = (self.elapsed() - told_at) / self.shape.budget_s
        moved_s = abs(self.plan.total_steps - told) * (self.step_s or 0.0)
        spe = self.shape.steps_per_epoch
        epochs_changed = math.ceil(self.plan.total_steps / spe) != math.ceil(told / spe)
        return since >= self.ANNOUNCE_GAP and (moved_s > self.ANNOUNCE_CHANGE * self.shape.budget_s or epochs_changed)

    def announce(self, step: int, first: bool) -> None:
        shape, total = self.shape, self.plan.total_steps
        epochs = self.planned_epochs()
        evaluations = sum(1 for e in self.evaluated(epochs) if e >= self.current_epoch(step))  # still to come
        kept = self.ends_cost(step, epochs)
        bound = " (the trainer.epochs bound)" if total == shape.max_steps else ""
        what = f"budget {duration(shape.budget_s)}" if first else f"budget re-plan at step {step:,}"
        test = " and the test" if shape.test_batches else ""
        line = (
            f"{what}: {total:,} steps of {step_images(shape.images_per_step)} images "
            f"({total / shape.steps_per_epoch:.1f} epochs)"
            f"{bound} at {shape.images_per_step / self.step_s:,.0f} img/s measured; {kept:.0f} s kept for "
            f"{evaluations} evaluation{'s' if evaluations != 1 else ''}{test}; {self.elapsed():.0f} s spent"
            f"{self.pricing.describe(self.step_s, self.img_size) if first else ''}"
        )
        if not self.worth_a_line(first):
            log.debug(line)  # a small correction: in metrics.json's plans, not the console
            return
        self.announced = (total, self.elapsed())
        log.info(line)

    def progress(self, step: int) -> float:
        """The cosine's planned progress at `step`, in [0, 1] (0 until the warmup's end)."""
        plan = self.plan
        if plan is None:
            return 0.0
        if step <= plan.anchor_step:
            return plan.anchor_progress
        span = plan.total_steps - plan.anchor_step
        return min(1.0, plan.anchor_progress + (step - plan.anchor_step) * (1 - plan.anchor_progress) / span)

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the plan and the measured epoch-end costs (the speed is measured afresh)."""
        return {
            "budget_s": self.shape.budget_s,
            "plan": None if self.plan is None else vars(self.plan).copy(),
            "history": list(self.history),
            "eval_end_s": self.eval_end_s,
            "plain_end_s": self.plain_end_s,
            "figure_s": self.figure_s,
            "eval_step": None if self.eval_step is None else list(self.eval_step),
            "fixed_share": self.pricing.share,
        }


TOO_SMALL = -1  # a decision: the budget cannot hold the run


def step_images(images: float) -> str:
    """A step's images in the plan line: 256, or a NaFlex run's mean, 494 (mean): a token budget fills batches."""
    return f"{int(images)}" if float(images).is_integer() else f"{images:,.0f} (mean)"
