"""What hooks into the training loop besides the step (vit/train/trainer.py), through one interface: trainer.budget's
plan and the long-run forecast without a budget (vit/train/budget_hooks.py: the budget times the steps and the epoch
ends, re-plans, and says when the plan's last step is done), a search trial's pruner (vit/search/trial.py) and the
distillation teacher's evaluation (vit/train/distill.py). The loop calls every hook of `run.callbacks` at its point;
each hook does nothing unless a callback overrides it."""

from __future__ import annotations

import logging

log = logging.getLogger("vit.train")


class Callback:
    def on_train_start(self, run) -> None:
        """Before the first epoch (the model as initialised or resumed)."""

    def on_epoch_start(self, run, epoch: int) -> None:
        """The epoch's data is set (its image size in run.step_state.train_img_size); its steps come next."""

    def on_step_end(self, step: int) -> None:
        """After optimizer step `step` (counted from 1), before the schedule moves to it."""

    def should_stop(self, step: int) -> bool:
        """Whether the run has trained all it should after `step` (the budget's plan): the loop then ends the epoch
        here, evaluates and finishes."""
        return False

    def on_epoch_trained(self, run, epoch: int) -> None:
        """The epoch's steps are done; its evaluation, record and checkpoint come next."""

    def on_epoch_record(self, run, record: dict, scalars: dict, val: dict | None) -> None:
        """Add to the epoch's history entry and its TensorBoard scalars."""

    def on_figures_drawn(self, seconds: float, in_epoch: bool) -> None:
        """The figures took `seconds` (`in_epoch`: at an epoch's end; else before the first epoch)."""

    def on_epoch_end(self, run, epoch: int, val: dict | None, val_ema: dict | None, last: bool) -> bool:
        """The epoch is evaluated (val None: not this epoch), recorded and checkpointed; True stops the run."""
        return False

    def on_train_end(self, run, metrics: dict) -> None:
        """Add to metrics.json's entries (the run's last console lines with them)."""


class Callbacks(list):
    """The run's callbacks, in order; each hook is called on every one of them."""

    def on_train_start(self, run) -> None:
        for callback in self:
            callback.on_train_start(run)

    def on_epoch_start(self, run, epoch: int) -> None:
        for callback in self:
            callback.on_epoch_start(run, epoch)

    def on_step_end(self, step: int) -> None:
        for callback in self:
            callback.on_step_end(step)

    def should_stop(self, step: int) -> bool:
        return any(callback.should_stop(step) for callback in self)

    def on_epoch_trained(self, run, epoch: int) -> None:
        for callback in self:
            callback.on_epoch_trained(run, epoch)

    def on_epoch_record(self, run, record: dict, scalars: dict, val: dict | None) -> None:
        for callback in self:
            callback.on_epoch_record(run, record, scalars, val)

    def on_figures_drawn(self, seconds: float, in_epoch: bool) -> None:
        for callback in self:
            callback.on_figures_drawn(seconds, in_epoch)

    def on_epoch_end(self, run, epoch: int, val: dict | None, val_ema: dict | None, last: bool) -> bool:
        stops = [callback.on_epoch_end(run, epoch, val, val_ema, last) for callback in self]  # every one is told
        return any(stops)

    def on_train_end(self, run, metrics: dict) -> None:
        for callback in self:
            callback.on_train_end(run, metrics)


class TrialPruning(Callback):
    """A search trial: each evaluated epoch's score goes to the study (rank 0's `trial` reports) and its pruner
    decides whether the trial goes on; every rank learns the answer, so all of them stop together."""

    def __init__(self, trial) -> None:
        self.trial = trial  # vit/search/trial.py's TrialReport on rank 0, None on the others

    def on_epoch_end(self, run, epoch: int, val: dict | None, val_ema: dict | None, last: bool) -> bool:
        if val is None:  # an epoch without an evaluation (the same on every rank)
            return False
        stop = self.trial.report(epoch + 1, val, val_ema, last=last) if self.trial is not None else False
        return bool(run.dist.broadcast(stop))  # last.pt holds this epoch; no test split for a pruned trial

    def on_train_end(self, run, metrics: dict) -> None:
        if self.trial is not None:
            metrics["search"] = self.trial.record()


class TeacherCheck(Callback):
    """distill.teacher: its top-1 on the validation split before the student trains (a bad teacher shows at once),
    and after each evaluated epoch the share of validation images where student and teacher agree."""

    def __init__(self, distiller, source: str) -> None:
        self.distiller, self.source = distiller, source
        self.result: dict | None = None

    def on_train_start(self, run) -> None:
        self.result = self.distiller.evaluate_teacher(run.bundle.val_loader, *run.evaluation_settings())
        log.info("teacher top-1 on the %s split: %.2f%% (%d images)", run.bundle.val_name, *self.result.values())
        run.report.scalars({"distill/teacher_top1": self.result["top1"]}, run.step_state.step)

    def on_epoch_record(self, run, record: dict, scalars: dict, val: dict | None) -> None:
        if val is not None:  # percent of validation images where student and teacher agree
            agree = self.distiller.agreement(run.model, run.bundle.val_loader, *run.evaluation_settings())
            record["val_teacher_agreement"] = scalars["val/teacher_agreement"] = agree

    def on_train_end(self, run, metrics: dict) -> None:
        if self.result is not None:
            metrics["teacher"] = {"source": self.source, **self.result}
