"""The training loop, read top to bottom. `train(run)` takes the run vit/train/run.py built (the model and the data,
the step's parts, the resumed checkpoint, the writers) and, for each epoch: points the data at it, trains its steps,
evaluates, records, checkpoints and asks whether to stop; `finish` then reads the test split once and writes
metrics.json. Each step (`train_one_epoch`, `forward_backward`, `optimizer_step`): a batch to the device, resized
(progressive resizing) and mixed (Mixup/CutMix); the forward pass and loss through the run's task under its
precision; backward (the gradients synced across ranks on the last micro-batch of an accumulation); unscale, clip,
optimizer step, schedule, EMA; every `log_every_n_steps` steps one host sync for the log line.

What is not the step hooks in through `run.callbacks` (vit/train/callbacks.py), one interface called at fixed
points: trainer.budget's plan (it times the steps and the epoch ends and answers `should_stop`), the forecast, a
search trial's pruner and the distillation teacher's check. The step's parts and state, the divergence checks and
the log window are in vit/train/step_parts.py.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable

import torch

from vit.data.augment.batch import resize_batch
from vit.naflex import batch_size_of, to_device
from vit.records.files import atomic_write_text
from vit.runtime.sharding import gathered
from vit.train.checkpoints import rng_state, set_rng_state
from vit.train.metrics import (
    chosen_evaluation,
    epoch_line,
    epoch_record,
    epoch_scalars,
    final_test,
    run_metrics,
    val_score,
)
from vit.train.report import job_overrides, run_hparams
from vit.train.setup import Run, epoch_seed, rank_seed, seed_everything, set_loader_epoch, skip_train_batches
from vit.train.signals import requeue
from vit.train.step_parts import (
    LogWindow,
    StepParts,
    StepState,
    TrainingDiverged,
    autocast,
    check_finite,
    count_skipped_steps,
    raise_if_diverged,
    stop_agreed,
    sync_context,
    weights_finite,
)

log = logging.getLogger("vit.train")


def train(run: Run) -> dict:
    """The epochs, then `finish`: every phase is a named function taking the run."""
    progress, callbacks = run.progress, run.callbacks
    # The stop handlers cover everything that runs collectives, the final evaluation included: under torchrun a
    # signal that met the default handler there would end one rank while the others wait for it in a gather.
    with run.report, run.stop.installed():
        run.report.keep_images(run.bundle.val_loader)
        budget = run.budget
        if budget is not None and budget.shape.figure_every and budget.figure_s is None:
            # A budget keeps time for the figures its last epoch draws: it measures one (at step 0, the model
            # as initialised or resumed) before it plans.
            draw_figures(run)
        callbacks.on_train_start(run)  # the teacher's top-1: a bad teacher shows before the student trains
        for epoch in range(progress.start_epoch, run.trainer.epochs):
            if callbacks.should_stop(run.step_state.step):
                break  # a resumed run whose plan is done
            prepare_epoch(run, epoch)
            limit = batch_limit(run, epoch)
            # After a resume inside this epoch the loader holds only the batches left (it skips the trained ones),
            # and the lines count the epoch's real batch: the trained ones, then these.
            done_before = progress.batches_done_before(epoch)
            left = len(run.bundle.train_loader) if limit is None else min(len(run.bundle.train_loader), limit)
            run.report.start_epoch(epoch, epoch_totals(run, epoch, done_before + left), done_before)
            callbacks.on_epoch_start(run, epoch)
            trained = train_one_epoch(
                run.step_parts, run.step_state, run.bundle.train_loader, limit_batches=limit, reporter=run.report
            )
            callbacks.on_epoch_trained(run, epoch)
            if trained["stopped"]:
                save_stopped(run, epoch, trained)
                break
            last = trained["planned_end"] or epoch + 1 == run.trainer.epochs
            val, val_ema = evaluate_epoch(run, epoch, last)
            record_epoch(run, epoch, trained, val, val_ema)
            chosen = chosen_evaluation(val, val_ema)  # the EMA's where the run keeps one: what the tools read
            is_best = chosen is not None and val_score(chosen) > progress.best_score
            if chosen is not None:
                progress.best_score = max(progress.best_score, val_score(chosen))
            check_weights(run, epoch)
            run.checkpoints.save_epoch(epoch + 1, run.step_state.step, progress, is_best)
            if callbacks.on_epoch_end(run, epoch, val, val_ema, last):
                break  # a pruned search trial: last.pt holds this epoch
            if last:
                break
            if run.trainer.pauses_after(epoch):
                log.info("trainer.stop_after_epoch=%d reached; continue with trainer.resume=auto", epoch + 1)
                break
        run.stop.finishing = True  # a signal from here on lets the final evaluation end on every rank
        return finish(run)


def prepare_epoch(run: Run, epoch: int) -> None:
    """Point the data at `epoch`, seed its randomness and set its image size (progressive resizing). In the epoch a
    stop interrupted, the loader skips the batches trained before it and the RNG is the checkpoint's."""
    trainer, bundle, rank = run.trainer, run.bundle, run.dist.rank
    set_loader_epoch(bundle.train_loader, bundle.train_sampler, trainer.seed, epoch, rank)
    done_before = run.progress.batches_done_before(epoch)
    if done_before:
        skip_train_batches(bundle, done_before)
        set_rng_state(run.progress.resume_rng)
    else:
        seed_everything(rank_seed(epoch_seed(trainer.seed, epoch), rank))
    if run.setup.resize is not None:
        run.step_state.train_img_size = run.setup.resize.size_at(epoch, run.planned_epochs())


def batch_limit(run: Run, epoch: int) -> int | None:
    """The batches `epoch` trains at most (trainer.limit_train_batches; None: all), less those trained before a
    stop inside it."""
    limit, done_before = run.trainer.limit_train_batches, run.progress.batches_done_before(epoch)
    if not done_before:
        return limit
    return max(0, limit - done_before) if limit else None


def epoch_totals(run: Run, epoch: int, batches: int) -> Callable[[], tuple[int | None, int]]:
    """What the progress line of `epoch` counts towards, asked at each of its updates: (the run's epochs, the
    epoch's batches). Under trainer.budget, the plan's: the epochs of the plan last printed, and of the `batches`
    only those up to the current plan's last step (a re-plan moves it mid-epoch); before the first plan the epochs
    are not known yet (None)."""

    def totals() -> tuple[int | None, int]:
        budget = run.budget
        if budget is None:
            return run.trainer.epochs, batches
        if budget.plan is None:
            return None, batches
        spe = budget.shape.steps_per_epoch
        steps_left = budget.total_steps() - epoch * spe  # optimizer steps
        # the epochs of the plan the log last told of: a re-plan too small for a line leaves the total as it was,
        # unless the current plan ends in this epoch, which is then the last whatever the log said
        told = math.ceil(budget.announced[0] / spe) if budget.announced else budget.planned_epochs()
        epochs = epoch + 1 if budget.planned_epochs() == epoch + 1 else max(told, epoch + 1)
        return epochs, min(batches, max(0, steps_left) * run.trainer.accum_steps)

    return totals


# --- the steps of one epoch --------------------------------------------------------------------------------------


def train_one_epoch(
    parts: StepParts, state: StepState, loader: Iterable, *, limit_batches: int | None, reporter=None
) -> dict:
    """Train over `loader`; returns the epoch's mean loss, images/s, seconds, batches, whether a stop was requested
    (then the epoch is unfinished) and whether the run should stop after this step (`planned_end`: the budget's
    planned last step was trained). `reporter.log_step(step_in_epoch, step, values)` receives the logged values
    every `log_every` steps (vit/train/report.py)."""
    parts.train_model.train()
    count_skipped_steps(parts, state)  # the scale before this epoch's first step
    batches = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    if stop_agreed(parts):  # a signal that came during the last evaluation or checkpoint
        return {"loss": math.nan, "img_per_s": 0.0, "images": 0, "seconds": 0.0, "batches": 0, "stopped": True,
                "planned_end": False}  # fmt: skip
    stopped, planned_end, done, images_seen = False, False, 0, 0
    loss_sum = torch.zeros((), device=parts.device)
    window = LogWindow(parts.device)
    start = time.perf_counter()
    for i, (images, targets) in enumerate(loader):
        if i >= batches:
            break
        if i == 0:
            first_start = time.perf_counter()  # after the first batch arrived: the loader's start-up is not the step's
        last_micro_step = (i + 1) % parts.accum_steps == 0 or i + 1 == batches
        loss = forward_backward(parts, state, images, targets, last_micro_step)
        loss_sum += loss
        count = batch_size_of(images)  # NaFlex batches (data.naflex) hold a number of their own
        window.add_batch(loss, count)
        images_seen, done = images_seen + count, i + 1
        if last_micro_step:
            window.add_step(optimizer_step(parts, state))
            if state.first_step_seconds is None:  # compiling blocks the host, so no sync is needed to time it
                state.first_step_seconds = time.perf_counter() - first_start
            planned_end = parts.callbacks.should_stop(state.step)
        log_step = (i + 1) % parts.log_every == 0 or i + 1 == batches or planned_end
        if log_step:
            values = window_values(parts, state, window)
            if reporter is not None:
                reporter.log_step(i + 1, state.step, values)
            window.reset()
        if planned_end:  # trainer.budget: the plan's last step
            break
        # Single process: stop after any optimizer step (never inside an accumulation, whose gradients a
        # checkpoint would not hold). Under torchrun: at those of the log steps, where the ranks compare flags.
        if last_micro_step and (log_step or not parts.dist.enabled) and stop_agreed(parts):
            stopped = True
            break
    seconds = time.perf_counter() - start
    world = parts.dist.world_size
    return {
        # The mean over all ranks' batches; nan when nothing was left to train this epoch.
        "loss": (parts.dist.sum_(loss_sum / max(done, 1)) / world).item() if batches else float("nan"),
        "img_per_s": images_seen * world / max(seconds, 1e-9),  # global
        "images": images_seen * world,  # global: what the summary of a sweep compares runs by
        "seconds": seconds,
        "batches": max(done, 1),  # micro-batches, not optimizer steps (trainer.accum_steps)
        "stopped": stopped,
        "planned_end": planned_end,
    }


def forward_backward(
    parts: StepParts, state: StepState, images: torch.Tensor, targets: torch.Tensor, last_micro_step: bool
) -> torch.Tensor:
    """One micro-batch: (resize,) mix, forward, loss, backward of loss / accum_steps. Returns the detached loss.
    `images`: (B, 3, H, W), or a NaFlex batch (vit/naflex.py), which is neither resized nor mixed (the config
    check refuses both with it)."""
    images = to_device(images, parts.device)  # (B, 3, H, W)
    targets = targets.to(parts.device, non_blocking=True)  # (B,)
    if state.train_img_size is not None:
        images = resize_batch(images, state.train_img_size)  # (B, 3, s, s)
    if parts.mixup_fn is not None:
        images, targets = parts.mixup_fn(images, targets)  # soft targets (B, classes)
    with sync_context(parts, last_micro_step):
        with autocast(parts):
            loss = parts.task.loss(parts.train_model, images, targets, parts.criterion)
        scaled = loss / parts.accum_steps
        (parts.scaler.scale(scaled) if parts.scaler is not None else scaled).backward()
    loss = loss.detach()
    check_finite(state, loss)
    return loss


def optimizer_step(parts: StepParts, state: StepState) -> torch.Tensor:
    """Unscale, clip, step, schedule, EMA. Returns the gradient norm (a device tensor)."""
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.optimizer)
    params = [p for p in parts.model.parameters() if p.grad is not None]
    max_norm = parts.grad_clip if parts.grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if parts.scaler is not None:
        parts.scaler.step(parts.optimizer)  # skipped when the unscaled gradients hold inf/NaN
        parts.scaler.update()
    else:
        parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    parts.callbacks.on_step_end(state.step)  # the budget measures the speed; a re-plan shows in the schedule below
    parts.scheduler.step_update(num_updates=state.step)
    if parts.ema is not None:
        parts.ema.update(parts.model, step=state.step)
    return gathered(grad_norm.detach()).float()  # sharded gradients: the norm over all ranks' shards


def window_values(parts: StepParts, state: StepState, window: LogWindow) -> dict:
    """The logged values of one window. The host syncs here, every log_every steps: the window's mean loss (over
    all ranks) and the images seen."""
    raise_if_diverged(parts, state)
    totals = torch.stack([window.loss / max(window.batches, 1), window.loss.new_tensor(float(window.images))])
    totals = parts.dist.sum_(totals) / totals.new_tensor([parts.dist.world_size, 1.0])
    mean_loss, global_images = totals.tolist()
    count_skipped_steps(parts, state)
    values = {
        "train/loss": mean_loss,
        "train/lr": parts.optimizer.param_groups[0]["lr"],
        "train/grad_norm": (window.grad / max(1, window.optimizer_steps)).item(),
        "train/img_per_s": global_images / max(time.perf_counter() - window.start, 1e-9),
    }
    values.update(parts.task.log_values())  # distillation: the label and distillation terms
    return values


# --- after the steps: evaluate, record, checkpoint ---------------------------------------------------------------


def evaluate_epoch(run: Run, epoch: int, last: bool) -> tuple[dict | None, dict | None]:
    """The raw weights' and the EMA's validation results, or (None, None) in an epoch without evaluation
    (trainer.val_every_n_epochs: a short recipe cannot spare one every epoch; the last is always due)."""
    if not (last or run.trainer.evaluates_after(epoch)):
        return None, None
    val_loader = run.bundle.val_loader
    val = run.evaluate(val_loader)
    return val, run.evaluate(val_loader, ema=True) if run.step_parts.ema is not None else None


def record_epoch(run: Run, epoch: int, trained: dict, val: dict | None, val_ema: dict | None) -> None:
    """The epoch's history entry, TensorBoard scalars and figures, and its console line."""
    state, history, epochs = run.step_state, run.progress.history, run.planned_epochs()
    history.append(epoch_record(epoch, state.step, trained, val, val_ema, run.progress.elapsed()))
    scalars = epoch_scalars(trained, val, val_ema, run.device, state.skipped_steps)
    if state.train_img_size is not None:
        history[-1]["train_img_size"] = scalars["train/img_size"] = state.train_img_size
    run.callbacks.on_epoch_record(run, history[-1], scalars, val)  # the teacher's agreement, the budget's plan
    run.report.scalars(scalars, state.step)
    draw_figures(run, epoch, epochs)
    val_name = run.bundle.val_name
    run.report.line(epoch_line(epoch, epochs, trained, val, val_ema, state.train_img_size, val_name))


def draw_figures(run: Run, epoch: int | None = None, epochs: int | None = None) -> None:
    """The figures due after `epoch` of `epochs` (None: now), timed for the budget, which keeps time for them (one
    drawn outside an epoch is not part of that epoch end's cost)."""
    start = time.perf_counter()
    drawn = run.report.figures(run.model, run.bundle, run.step_state.step, epoch, epochs)
    if drawn:
        run.callbacks.on_figures_drawn(time.perf_counter() - start, in_epoch=epoch is not None)


def check_weights(run: Run, epoch: int) -> None:
    """Non-finite steps too few to stop the loop may still have ruined the weights: never checkpoint those."""
    if not weights_finite(run.model, run.dist):
        raise TrainingDiverged(
            f"the weights are not finite after epoch {epoch + 1} (step {run.step_state.step}); the checkpoints of "
            f"epoch {epoch} are kept"
        )


def save_stopped(run: Run, epoch: int, trained: dict) -> None:
    """Stopped after an optimizer step: last.pt records the step (and the batches of this epoch done), so a
    resumed run continues with the next batch as the uninterrupted run would have."""
    batches_done = run.progress.batches_done_before(epoch) + trained["batches"]
    rng_ranks = run.dist.gather(rng_state())  # every rank takes part; rank 0 writes
    step = run.step_state.step
    if trained["batches"]:
        run.checkpoints.save_stop(epoch, step, run.progress, batches_done, rng_ranks)
    if run.dist.is_main:  # logged: the run folder's train.log ends with it, as the console does
        log.info(
            "stopped by %s in epoch %d after batch %d (step %d); last.pt in %s holds this step. Resume with the same "
            "command plus trainer.resume=auto",
            run.stop.name or "a signal", epoch + 1, batches_done, step, run.checkpoints.folder,
        )  # fmt: skip
        if run.stop.requeues:  # SIGUSR1: the job goes back in SLURM's queue and resumes when it starts again
            log.info("%s", requeue())


def finish(run: Run) -> dict:
    """After the last epoch (or a stop): the test split set aside by data.holdout, metrics.json, hparams."""
    bundle, state, report = run.bundle, run.step_state, run.report
    metrics = run_metrics(run)
    finished = run.finished()
    if bundle.test_loader is not None and finished and run.trial is not None:
        log.info("a search trial does not read the %s split: the search chooses on the holdout", bundle.test_name)
    elif bundle.test_loader is not None and finished and run.task.classifier:  # a test needs labels
        # data.holdout: epochs and settings are chosen on the holdout; the test split is looked at once, here.
        test = final_test(run)
        metrics["test"] = test
        report.scalars({f"test/{k}": v for k, v in test.items() if k != "split"}, state.step)
        ema_part = f" (EMA {test['ema_top1']:.2f}%)" if run.step_parts.ema is not None else ""
        report.line(f"{bundle.test_name} split after training: top-1 {test['top1']:.2f}%{ema_part}")
    # Process start (or the first run's start, over resumes) to the end of the final evaluation.
    metrics["wall_time_s"] = run.progress.elapsed()
    # Of it, the process's start-up before this run (imports, config): the first run of a train.py process pays it,
    # a multirun sweep's later runs do not; tables that compare runs subtract it (vit/analysis/runs.py).
    metrics["startup_s"] = run.progress.startup_s
    run.callbacks.on_train_end(run, metrics)  # the trial's record, the teacher's top-1, the budget's record and line
    metrics["stopped_by_signal"] = run.stop.name
    metrics["provenance"] = run.provenance  # as the run started: command, commit, machine, versions, date
    metrics["world_size"] = run.dist.world_size
    # With torch.compile the first step holds the compilation (reported apart from the img/s of later steps).
    metrics["first_step_seconds"] = state.first_step_seconds
    if run.step_parts.compiled and state.first_step_seconds is not None:
        log.info("first step (compilation included): %.1f s", state.first_step_seconds)
    if run.dist.is_main:
        atomic_write_text(json.dumps(metrics, indent=2), run.run_dir / "metrics.json")  # a failed write keeps the old
        score = run.task.score
        final, best = metrics["final"].get(score) or 0.0, metrics["best"][score] or 0.0
        hparams = run_hparams(run.setup.resolved, job_overrides(), run.step_parts.precision.name)
        report.hparams(hparams, {score: final, f"best_{score}": best})
    return metrics
