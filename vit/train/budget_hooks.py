"""trainer.budget in a run (vit/train/budget.py's Budget does the planning): attaching it to the run with its
schedule, hooking it into the loop as a callback, and its lines; without a budget, the forecast that warns of a run
of hours."""

from __future__ import annotations

import logging
import math

from vit.settings.trainer import duration
from vit.train.budget import Budget, clock, tolerance
from vit.train.callbacks import Callback
from vit.train.run_shape import RunShape

log = logging.getLogger("vit.train")


class BudgetSchedule:
    """The run's schedule (timm's scheduler, with the weight-decay cosine) stepped at the virtual step that the
    budget's planned progress corresponds to in the schedule it was built for: warmup steps map onto its warmup,
    the cosine's progress q onto warmup + q * (its cosine length)."""

    def __init__(self, schedule, budget: Budget) -> None:
        lr = getattr(schedule, "lr", schedule)  # vit/train/optimizer.py's Schedules, or the timm scheduler alone
        self.schedule, self.budget = schedule, budget
        self.built_warmup, self.built_cosine = int(lr.warmup_t), float(lr.t_initial)

    def virtual_step(self, step: int) -> float:
        plan = self.budget.plan
        if plan is None:  # before the first plan: the schedule of the trainer.epochs bound, as built
            return float(step)
        if step < plan.warmup_steps:
            return step * self.built_warmup / plan.warmup_steps
        return self.built_warmup + self.budget.progress(step) * self.built_cosine

    def step_update(self, num_updates: int) -> None:
        self.schedule.step_update(num_updates=self.virtual_step(num_updates))

    def state_dict(self) -> dict:
        return self.schedule.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.schedule.load_state_dict(state)


class Forecast:
    """Without trainer.budget: how long the trainer.epochs of the run take at the measured speed, said twice.

    - Early, within the first minute: from the steps timed after the first one (whose allocations and compilation
      are not the step's), once EARLY_STEPS are timed or EARLY_S have passed, whichever comes first. A first
      command should not run for an hour before it says how long it is.
    - Then a better estimate, once TIMED_STEPS are timed after the loader workers' start (each worker's first
      batch is slow).

    Each is one line for a run whose steps left take more than SHORT_RUN_S; past LONG_RUN_S it is a warning
    naming the setting that plans for a fixed time instead."""

    SHORT_RUN_S = 120.0  # a run of a couple of minutes needs no forecast
    LONG_RUN_S = 3 * 3600.0  # "a few hours": a warning
    EARLY_STEPS = 2
    EARLY_S = 30.0
    TIMED_STEPS = 10

    def __init__(self, max_steps: int, images_per_step: int, untimed: int, speaks: bool, swept: bool = False) -> None:
        self.max_steps, self.images_per_step, self.speaks = max_steps, images_per_step, speaks
        self.swept = swept  # a job of a trainer.sweep_budget sweep: its length is the sweep's, not to be changed
        self.untimed_left = untimed  # the first step (allocations, compilation) and each loader worker's start
        self.after_first: tuple[int, float] | None = None  # (step, clock) after the first step: the early timing
        self.first: tuple[int, float] | None = None  # (step, clock) where the better timing starts
        self.early_done = self.done = not speaks

    def after_step(self, step: int) -> None:
        if self.done:
            return
        now = clock()
        if self.after_first is None:
            self.after_first = (step, now)
        elif not self.early_done:
            timed, seconds = step - self.after_first[0], now - self.after_first[1]
            if timed >= self.EARLY_STEPS or seconds >= self.EARLY_S:
                self.early_done = True
                self.tell(step, seconds / timed, early=True)
        if self.untimed_left or self.first is None:
            self.untimed_left = max(0, self.untimed_left - 1)
            self.first = (step, now)
            return
        if step - self.first[0] < self.TIMED_STEPS:
            return
        self.done = True
        self.tell(step, (now - self.first[1]) / (step - self.first[0]), early=False)

    def tell(self, step: int, step_s: float, early: bool) -> None:
        left_s = (self.max_steps - step) * step_s
        if left_s <= self.SHORT_RUN_S:
            return
        line = self.line(step, step_s, left_s, early)
        (log.warning if left_s > self.LONG_RUN_S else log.info)(line)

    def line(self, step: int, step_s: float, left_s: float, early: bool) -> str:
        hours = f"{left_s / 3600:.1f} h" if left_s >= 3600 else f"{left_s / 60:.0f} min"
        timed = "over its first steps, a better estimate follows" if early else f"over {self.TIMED_STEPS} steps"
        hint = "add trainer.budget=<time> (e.g. 30m or 2h): the run then plans as many steps as fit"
        then = "the epochs every job of the sweep trains (trainer.sweep_budget)" if self.swept else None
        return (
            f"this run's {self.max_steps - step:,} steps left take about {hours} on this machine "
            f"({self.images_per_step / step_s:,.0f} img/s measured {timed}; evaluations not counted); "
            + (then or f"to train for a fixed time instead, {hint}")
        )


def attach_budget(run, sweep_plan: bool = False) -> Budget | None:
    """trainer.budget: the run's Budget (its plan resumed where the checkpoint had one), in `run.callbacks` (the
    loop tells it of every optimizer step and epoch end, and asks it whether the plan is done) and in the step's
    parts (the schedule follows its planned progress). Without a budget, the forecast. `run` is
    vit/train/setup.py's Run, with its checkpoint resumed; `sweep_plan`: this job fits trainer.sweep_budget's length
    (whole epochs, the first plan kept)."""
    trainer, step, bundle = run.trainer, run.step_parts, run.bundle
    saved = run.progress.budget_state
    steps_per_epoch = max(1, math.ceil(run.batches_per_epoch() / trainer.accum_steps))  # optimizer steps, a process
    # global; NaFlex batches (data.naflex) hold as many images as their token budget allows: their mean
    per_batch = getattr(bundle.train_loader, "mean_batch_size", run.cfg.data.batch_size)
    images_per_step = per_batch * trainer.accum_steps * run.dist.world_size
    loader_workers = int(bundle.train_workers or 0)
    if trainer.budget is None:
        max_steps = trainer.epochs * steps_per_epoch
        swept = trainer.sweep_budget is not None  # a job training the epochs its sweep's first job fitted
        forecast = Forecast(max_steps, images_per_step, 1 + loader_workers, speaks=run.dist.is_main, swept=swept)
        run.callbacks.append(LongRunForecast(forecast))
        if saved:
            log.info(
                "the checkpoint's run had trainer.budget=%s; this one has none and trains to trainer.epochs=%d",
                duration(saved["budget_s"]),
                trainer.epochs,
            )
        return None
    if saved and saved["budget_s"] != trainer.budget:
        log.info(
            "trainer.budget=%s, the checkpoint's run had %s: the plan is fitted to the new budget",
            duration(trainer.budget),
            duration(saved["budget_s"]),
        )
    schedule = getattr(step.scheduler, "lr", step.scheduler)
    val_loader, test_loader = bundle.val_loader, bundle.test_loader
    limit = trainer.limit_val_batches
    tests = test_loader is not None and run.trial is None and run.task.classifier
    shape = RunShape(
        budget_s=trainer.budget,
        steps_per_epoch=steps_per_epoch,
        max_epochs=trainer.epochs,
        warmup_steps=int(schedule.warmup_t),
        val_every=trainer.val_every_n_epochs,
        val_batches=min(len(val_loader), limit) if limit else len(val_loader),
        test_batches=(min(len(test_loader), limit) if limit else len(test_loader)) if tests else 0,
        eval_passes=2 if step.ema is not None else 1,
        views=(2 if trainer.eval_flip else 1) * (3 if trainer.eval_shift else 1) if run.task.classifier else 1,
        images_per_step=images_per_step,
        loader_workers=loader_workers,
        figure_every=run.report.figure_every,
        sweep_plan=sweep_plan,
        resize=run.setup.resize,
        timed_full_step_s=timed_full_step_s(run.setup.width_choice, trainer.accum_steps),
    )
    budget = Budget(shape, run.progress.elapsed(), dist=run.dist, state=saved)
    budget.check_start()
    step.budget, step.scheduler = budget, BudgetSchedule(step.scheduler, budget)
    run.callbacks.append(BudgetPlan(budget))
    if budget.plan is None:
        log.info(
            "budget %s: %.0f s spent by the start; the plan follows %d or more timed steps over at least %.1f s, "
            "after %d untimed",
            duration(trainer.budget),
            budget.elapsed(),
            Budget.WARMUP_STEPS,
            budget.first_plan_s(),
            budget.untimed_left,
        )
    else:  # resumed: what is spent and left now, not only at the next re-plan
        log.info(resumed_line(budget, run.step_state.step))
    return budget


def resumed_line(budget: Budget, step: int) -> str:
    """A resumed budgeted run's first word on its budget: the time spent (start-ups included) and left, and where
    the resumed plan stands; the speed is measured afresh and the plan re-fitted if it moved."""
    shape, total = budget.shape, budget.total_steps()
    spent = budget.elapsed()
    return (
        f"budget {duration(shape.budget_s)} resumed: {spent:.0f} s spent, {max(0.0, shape.budget_s - spent):.0f} s "
        f"left; {step:,} of the plan's {total:,} steps trained ({total / shape.steps_per_epoch:.1f} epochs); the "
        f"speed is measured again and the plan re-fitted to the time left"
    )


def timed_full_step_s(width_choice: dict | None, accum_steps: int) -> float | None:
    """trainer.width_by_budget's seconds for an optimizer step of the picked width at the full image size (its
    record's timing of that width); None where no width was timed."""
    for timing in (width_choice or {}).get("timed", ()):
        if timing["width"] == width_choice["width"]:
            return timing["batch_s"] * accum_steps
    return None


def budget_record(budget: Budget, step: int, wall_s: float, final_lr: float) -> dict:
    """metrics.json's `budget`: the budget, the time used, the steps planned and trained, the plans."""
    budget_s, history = budget.shape.budget_s, budget.history
    return {
        "budget_s": budget_s,
        "wall_s": wall_s,
        "planned_steps": budget.total_steps(),
        "trained_steps": step,
        "planned_epochs": budget.total_steps() / budget.shape.steps_per_epoch,
        "final_lr": final_lr,  # the rate of the last step trained (of a stopped run: at the stop)
        "replans": max(0, len(history) - 1),
        "first_plan_steps": history[0]["total_steps"] if history else None,  # against trained_steps
        "fixed_share": budget.pricing.share,  # progressive resizing: the share of a step the tokens do not grow
        "overrun_s": max(0.0, wall_s - budget_s),
        "within_tolerance": wall_s - budget_s <= tolerance(budget_s),
        "plans": list(history),
    }


def budget_line(record: dict, stopped: bool = False) -> str:
    """The run's last console line about its budget: the time used against it, the steps planned and trained, the
    re-plans (each in metrics.json) and the learning rate reached: the final one, or for a run stopped before its
    plan's end (a signal, trainer.stop_after_epoch) the one at the stop, which its resume continues from."""
    over = "" if record["within_tolerance"] else f" (over by {record['overrun_s']:.1f} s, more than the tolerance)"
    replans = record.get("replans", 0)
    early = stopped or record["trained_steps"] < record["planned_steps"]
    return (
        f"budget {duration(record['budget_s'])}: {record['wall_s']:.1f} s used{over}; {record['trained_steps']:,} of "
        f"{record['planned_steps']:,} planned steps ({record['planned_epochs']:.2f} epochs, {replans} "
        f"re-plan{'s' if replans != 1 else ''}), {'lr at the stop' if early else 'final lr'} {record['final_lr']:.3g}"
    )


class BudgetPlan(Callback):
    """trainer.budget (vit/train/budget.py's Budget): the epochs' loops and ends timed, every optimizer step
    measured (a re-plan moves the schedule, which follows the plan's progress), the loop stopped at the plan's last
    step; its record and last line at the end."""

    def __init__(self, budget) -> None:
        self.budget = budget

    def on_epoch_start(self, run, epoch: int) -> None:
        self.budget.epoch_starts(run.step_state.train_img_size)

    def on_step_end(self, step: int) -> None:
        self.budget.after_step(step)

    def should_stop(self, step: int) -> bool:
        return self.budget.reached(step)

    def on_epoch_trained(self, run, epoch: int) -> None:
        self.budget.epoch_trained()

    def on_epoch_record(self, run, record: dict, scalars: dict, val: dict | None) -> None:
        scalars.update({"budget/planned_steps": self.budget.total_steps(), "budget/elapsed_s": self.budget.elapsed()})

    def on_figures_drawn(self, seconds: float, in_epoch: bool) -> None:
        self.budget.figure_drawn(seconds, in_epoch=in_epoch)

    def on_epoch_end(self, run, epoch: int, val: dict | None, val_ema: dict | None, last: bool) -> bool:
        self.budget.epoch_ended(evaluated=val is not None)
        return False

    def on_train_end(self, run, metrics: dict) -> None:
        step = run.step_state.step
        final_lr = run.step_parts.optimizer.param_groups[0]["lr"]
        metrics["budget"] = budget_record(self.budget, step, metrics["wall_time_s"], final_lr)
        run.report.scalars({"budget/wall_s": metrics["wall_time_s"], "budget/trained_steps": step}, step)
        run.report.line(budget_line(metrics["budget"], stopped=run.stop.name is not None))


class LongRunForecast(Callback):
    """Without trainer.budget: after the first timed steps, a run whose steps would take hours says so once
    (vit/train/budget.py's Forecast)."""

    def __init__(self, forecast) -> None:
        self.forecast = forecast

    def on_step_end(self, step: int) -> None:
        self.forecast.after_step(step)
