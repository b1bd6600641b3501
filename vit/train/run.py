"""`run(cfg)`: one training run from a composed config, start (or resume) to `metrics.json`.

`build_run` builds the one `Run` object every phase takes (vit/train/setup.py): the trainer's typed settings
(vit/settings/trainer.py), torch set up, the model and the data, the optimisation (vit/train/optimizer.py), the
checkpoints resumed (vit/train/checkpoints.py) and the writers (vit/train/report.py). `train` is the recipe, read
top to bottom: for each epoch, train it (vit/train/loop.py), evaluate, report, checkpoint; finally the test split
and metrics.json (vit/train/metrics.py).

Run directory (Hydra's, or `output_dir`): .hydra/ (written by Hydra), tb/ (TensorBoard events),
checkpoints/{last,best}.pt (and epoch_NNNN.pt with trainer.keep_last), metrics.json.

Under `torchrun` (see vit/engine/distributed.py) every rank runs this same function on its shard of the data;
rank 0's run directory is the run's, and only rank 0 writes into it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from omegaconf import DictConfig

from vit.engine.device import resolve_device
from vit.engine.distributed import Distributed, setup_distributed
from vit.engine.files import atomic_write_text, check_run_dir
from vit.engine.provenance import provenance
from vit.engine.sharding import is_sharded
from vit.engine.tasks import task_of
from vit.errors import ConfigError
from vit.search.trial import TrialReport, check_search, is_trial
from vit.settings import TrainerSettings
from vit.train.budget import attach_budget, duration
from vit.train.checkpoints import Checkpointer, RunProgress, resume, rng_state, set_rng_state
from vit.train.config import validate
from vit.train.loop import NonFiniteLossError, StepState, train_one_epoch, weights_finite
from vit.train.metrics import (
    chosen_weights,
    epoch_line,
    epoch_record,
    epoch_scalars,
    final_test,
    run_metrics,
    val_score,
)
from vit.train.optimizer import build_step_parts
from vit.train.report import Reporter, flat_hparams
from vit.train.setup import Run, build_model_and_data, epoch_seed, rank_seed, seed_everything, setup_torch
from vit.train.signals import StopSignal, requeue, restart_count

log = logging.getLogger("vit.train")


def run(
    cfg: DictConfig,
    output_dir: str | Path | None = None,
    train_loader_wrapper: Callable[[Iterable], Iterable] | None = None,
) -> dict:
    """Train as `cfg` says; write checkpoints, TensorBoard events and metrics.json into the run directory
    (`output_dir`, else Hydra's). Returns the metrics written to metrics.json.
    `train_loader_wrapper`: wraps the train loader (the end-to-end benchmark's real and static epochs,
    lab/e2e_timing.py)."""
    # Wall time counts from the process start (imports, config composition) for the first run of a train.py process:
    # the recipes' time goals are "process start to final evaluation". Other runs count from here.
    startup_s = startup_seconds()
    wall_start = time.perf_counter() - startup_s
    validate(cfg)
    check_search(cfg)
    own_dir = Path(output_dir) if output_dir is not None else hydra_output_dir()
    if own_dir is None:
        raise ConfigError("no run directory: call run(cfg, output_dir=...) or start through train.py")
    dist = setup_distributed(resolve_device(cfg.trainer.device), cfg.trainer.strategy)
    if not dist.is_main:  # the console is rank 0's; other ranks speak only of problems
        logging.getLogger("vit").setLevel(logging.WARNING)
    # Each torchrun worker's Hydra names its directory by its own clock: rank 0's is the run's.
    run_dir = Path(dist.broadcast(str(own_dir)))
    if dist.is_main:
        check_run_dir(run_dir, create=True)  # a file in the way, a read-only or full disk: OutputError, no data read
        log.info("run folder: %s", run_dir.resolve())  # checkpoints, metrics.json, TensorBoard events, the log
    elif own_dir != run_dir and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()  # the empty directory this worker's Hydra made for itself
    # Deterministic mode and the thread count (trainer.threads) are process-wide: put them back afterwards, so later
    # work in this process (tests, notebooks) is not slowed or broken by them.
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    threads = torch.get_num_threads()
    try:
        return train(cfg, run_dir, wall_start, dist, train_loader_wrapper, startup_s)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.set_num_threads(threads)
        dist.close()
        while _CONTINUATION_LOGS:
            handler = _CONTINUATION_LOGS.pop()
            logging.getLogger().removeHandler(handler)
            handler.close()


def continued_run_dir(setting, resume_path: Path | None, run_dir: Path, main: bool) -> Path:
    """Where the run writes: `run_dir`, except that `trainer.resume=auto` continuing an earlier run folder (Hydra's
    outputs/<date>/<time>, a new one per command) continues in that folder, so its checkpoints, TensorBoard curves
    and metrics.json stay one run. Hydra's new folder keeps this command's config and log, whose first lines say
    where the run went; the earlier folder's train.log gets the rest of the log too."""
    auto = str(setting) == "auto" or (not setting and restart_count() is not None)  # a restart resumes as auto
    if not auto or resume_path is None or resume_path.parent.name != "checkpoints":
        return run_dir
    earlier = resume_path.parent.parent
    if earlier.resolve() == run_dir.resolve():
        return run_dir
    if main:
        log.info(
            "trainer.resume=auto: the run continues in %s, where it started; %s holds this command's log",
            earlier,
            run_dir,
        )
        handler = logging.FileHandler(earlier / "train.log", mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        logging.getLogger().addHandler(handler)
        _CONTINUATION_LOGS.append(handler)
    return earlier


_CONTINUATION_LOGS: list[logging.Handler] = []  # closed when `run` returns


def build_run(
    cfg: DictConfig, run_dir: Path, wall_start: float, dist: Distributed, loader_wrapper=None, startup_s: float = 0.0
) -> Run:
    """The run object every phase takes: torch set up, the model and the data, the optimisation, the checkpoints
    resumed, and the writers. Only rank 0 writes: events, checkpoints, console lines, metrics.json."""
    trainer = TrainerSettings.of(cfg.trainer)
    device = setup_torch(trainer, dist)
    built = build_model_and_data(cfg, trainer, run_dir, device, dist, loader_wrapper)
    run_dir = continued_run_dir(trainer.resume, built.resume_path, run_dir, dist.is_main)
    step_parts, step_state = build_step_parts(cfg, trainer, built, device, dist), StepState()
    progress = RunProgress(wall_start)
    if built.resume_path is not None:
        args = (built.bundle.class_to_idx, wall_start, cfg.optim.name)
        progress = resume(built.resume_path, step_parts, step_state, *args)
    progress.startup_s = startup_s
    checkpoints = Checkpointer(
        run_dir / "checkpoints",
        enabled=trainer.save_checkpoints,  # rank 0 writes (every rank its shards under fsdp)
        keep_last=trainer.keep_last,
        settings=step_parts,
        class_to_idx=built.bundle.class_to_idx,
        config=built.resolved,
    )
    report = Reporter(
        str(run_dir / "tb"),
        trainer.progress,
        enabled=dist.is_main,
        attn_every=trainer.attn_maps_every_n_epochs,  # 0 with task=mae (vit/train/config.py refuses any other)
        recon_every=trainer.recon_images_every_n_epochs if task_of(cfg).reconstructs else 0,
        collective=is_sharded(step_parts.model),
    )
    stop = StopSignal()
    step_parts.stop_requested = stop.requested
    trial = TrialReport.of(cfg, run_dir, trainer.epochs) if is_trial(cfg) and dist.is_main else None
    run = Run(cfg, trainer, run_dir, built, step_parts, step_state, progress, checkpoints, report, stop, trial)
    run.provenance = provenance()
    attach_budget(run)  # trainer.budget: plans the steps from the measured speed (vit/train/budget.py)
    return run


def train(
    cfg: DictConfig, run_dir: Path, wall_start: float, dist: Distributed, loader_wrapper=None, startup_s: float = 0.0
) -> dict:
    """The recipe: every phase is a named function taking the run; the epoch loop is the only logic here."""
    run = build_run(cfg, run_dir, wall_start, dist, loader_wrapper, startup_s)
    progress, budget = run.progress, run.budget
    # The stop handlers cover everything that runs collectives, the final evaluation included: under torchrun a
    # signal that met the default handler there would end one rank while the others wait for it in a gather.
    with run.report, run.stop.installed():
        run.report.keep_images(run.bundle.val_loader)
        if budget is not None and budget.shape.figure_every and budget.figure_s is None:
            # A budget keeps time for the figures its last epoch draws: it measures one (at step 0, the model
            # as initialised or resumed) before it plans.
            draw_figures(run)
        teacher = evaluate_teacher(run)  # a bad teacher shows before the student trains
        for epoch in range(progress.start_epoch, run.trainer.epochs):
            if budget is not None and budget.reached(run.step_state.step):
                break  # a resumed run whose plan is done
            limit = start_epoch(run, epoch)
            # After a resume inside this epoch the loader holds only the batches left (it skips the trained ones),
            # and the lines count the epoch's real batch: the trained ones, then these.
            done_before = run.progress.batches_done_before(epoch)
            left = len(run.bundle.train_loader) if limit is None else min(len(run.bundle.train_loader), limit)
            run.report.start_epoch(epoch, epoch_totals(run, epoch, done_before + left), done_before)
            trained = train_epoch(run, limit)
            if trained["stopped"]:
                save_stopped(run, epoch, trained)
                break
            last = trained["planned_end"] or epoch + 1 == run.trainer.epochs
            val, val_ema = evaluate_epoch(run, epoch, last)
            record_epoch(run, epoch, trained, val, val_ema)
            chosen = chosen_weights(val, val_ema)  # the EMA's where the run keeps one: what the tools read
            is_best = chosen is not None and val_score(chosen) > progress.best_score
            if chosen is not None:
                progress.best_score = max(progress.best_score, val_score(chosen))
            check_weights(run, epoch)
            run.checkpoints.save_epoch(epoch + 1, run.step_state.step, progress, is_best)
            if budget is not None:
                budget.epoch_ended(evaluated=val is not None)
            if is_trial(cfg) and trial_stops(run, epoch, val, val_ema, last):
                break  # last.pt holds this epoch; no test split for a pruned trial
            if last:
                break
            if run.trainer.pauses_after(epoch):
                log.info("trainer.stop_after_epoch=%d reached; continue with trainer.resume=auto", epoch + 1)
                break
        run.stop.finishing = True  # a signal from here on lets the final evaluation end on every rank
        return finish(run, teacher)


def train_epoch(run: Run, limit: int | None) -> dict:
    """The epoch's training loop (vit/train/loop.py), timed for the budget."""
    if run.budget is not None:
        run.budget.epoch_starts(run.step_state.train_img_size)
    trained = train_one_epoch(
        run.step_parts, run.step_state, run.bundle.train_loader, limit_batches=limit, reporter=run.report
    )
    if run.budget is not None:
        run.budget.epoch_trained()
    return trained


def epoch_totals(run: Run, epoch: int, batches: int) -> Callable[[], tuple[int | None, int]]:
    """What the progress line of `epoch` counts towards, asked at each of its updates: (the run's epochs, the
    epoch's batches). Under trainer.budget, the current plan's: its epochs, and of the `batches` only those up to
    its last step (a re-plan moves both mid-epoch); before the first plan the epochs are not known yet (None)."""

    def totals() -> tuple[int | None, int]:
        budget = run.budget
        if budget is None:
            return run.trainer.epochs, batches
        if budget.plan is None:
            return None, batches
        steps_left = budget.total_steps() - epoch * budget.shape.steps_per_epoch  # optimizer steps
        return budget.planned_epochs(), min(batches, max(0, steps_left) * run.trainer.accum_steps)

    return totals


def trial_stops(run: Run, epoch: int, val, val_ema, last: bool) -> bool:
    """Report the epoch's score to the study (rank 0 does) and whether its pruner stops the trial; every rank
    learns the answer, so all of them stop together."""
    if val is None:  # an epoch without an evaluation (the same on every rank)
        return False
    stop = run.trial.report(epoch + 1, val, val_ema, last=last) if run.trial is not None else False
    return bool(run.dist.broadcast(stop))


def start_epoch(run: Run, epoch: int) -> int | None:
    """Point the data at `epoch` and seed its randomness; returns the epoch's batch limit. In the epoch a stop
    interrupted, the loader skips the batches trained before it and the RNG is the checkpoint's."""
    trainer, bundle, rank = run.trainer, run.bundle, run.dist.rank
    set_loader_epoch(bundle.train_loader, bundle.train_sampler, trainer.seed, epoch, rank)
    limit = trainer.limit_train_batches
    done_before = run.progress.batches_done_before(epoch)
    if done_before:
        skip_train_batches(bundle, done_before)
        limit = max(0, limit - done_before) if limit else None
        set_rng_state(run.progress.resume_rng)
    else:
        seed_everything(rank_seed(epoch_seed(trainer.seed, epoch), rank))
    if run.built.resize is not None:
        run.step_state.train_img_size = run.built.resize.size_at(epoch, run.planned_epochs())
    return limit


def set_loader_epoch(loader, sampler, seed: int, epoch: int, rank: int = 0) -> None:
    if hasattr(loader, "set_epoch"):  # the GPU-resident loader
        loader.set_epoch(epoch)
    if sampler is not None:  # the shuffle order: (seed, epoch), the same on every rank
        sampler.set_epoch(epoch)
    generator = getattr(loader, "generator", None)
    if generator is not None:  # torch DataLoader: its worker seeds come from here
        generator.manual_seed(rank_seed(epoch_seed(seed, epoch), rank))


def skip_train_batches(bundle, count: int) -> None:
    """Make the next train epoch start after its first `count` batches (a resume inside an epoch)."""
    if hasattr(bundle.train_loader, "skip_batches"):
        bundle.train_loader.skip_batches(count)
    else:  # a plain DataLoader: its sampler skips those batches' samples
        bundle.train_sampler.skip = count * bundle.train_loader.batch_size


def save_stopped(run: Run, epoch: int, trained: dict) -> None:
    """Stopped after an optimizer step: last.pt records the step (and the batches of this epoch done), so a
    resumed run continues with the next batch as the uninterrupted run would have."""
    batches_done = run.progress.batches_done_before(epoch) + trained["steps"]
    rng_ranks = run.dist.gather(rng_state())  # every rank takes part; rank 0 writes
    step = run.step_state.step
    if trained["steps"]:
        run.checkpoints.save_stop(epoch, step, run.progress, batches_done, rng_ranks)
    if run.dist.is_main:
        print(
            f"stopped by {run.stop.name or 'a signal'} in epoch {epoch + 1} after batch {batches_done} "
            f"(step {step}); last.pt in {run.checkpoints.folder} holds this step. Resume with the same command "
            "plus trainer.resume=auto",
            flush=True,
        )
        if run.stop.requeues:  # SIGUSR1: the job goes back in SLURM's queue and resumes when it starts again
            print(requeue(), flush=True)


def evaluate_epoch(run: Run, epoch: int, last: bool) -> tuple[dict | None, dict | None]:
    """The raw weights' and the EMA's validation results, or (None, None) in an epoch without evaluation
    (trainer.val_every_n_epochs: a short recipe cannot spare one every epoch; the last is always due)."""
    if not (last or run.trainer.evaluates_after(epoch)):
        return None, None
    val_loader = run.bundle.val_loader
    val = run.evaluate(val_loader)
    return val, run.evaluate(val_loader, ema=True) if run.step_parts.ema is not None else None


def record_epoch(run: Run, epoch: int, trained: dict, val: dict | None, val_ema: dict | None) -> None:
    """The epoch's history entry, TensorBoard scalars and attention maps, and its console line."""
    state, history, epochs = run.step_state, run.progress.history, run.planned_epochs()
    history.append(epoch_record(epoch, state.step, trained, val, val_ema, run.progress.elapsed()))
    scalars = epoch_scalars(trained, val, val_ema, run.device, state.skipped_steps)
    if state.train_img_size is not None:
        history[-1]["train_img_size"] = scalars["train/img_size"] = state.train_img_size
    distiller = run.built.distiller
    if distiller is not None and distiller.teacher is not None and val is not None:
        # percent of validation images where student and teacher agree
        agree = distiller.agreement(run.model, run.bundle.val_loader, *evaluation_settings(run))
        history[-1]["val_teacher_agreement"] = scalars["val/teacher_agreement"] = agree
    if run.budget is not None:
        scalars.update({"budget/planned_steps": run.budget.total_steps(), "budget/elapsed_s": run.budget.elapsed()})
    run.report.scalars(scalars, state.step)
    draw_figures(run, epoch, epochs)
    val_name = run.bundle.val_name
    run.report.line(epoch_line(epoch, epochs, trained, val, val_ema, state.train_img_size, val_name))


def draw_figures(run: Run, epoch: int | None = None, epochs: int | None = None) -> None:
    """The figures due after `epoch` of `epochs` (None: now), timed for the budget, which keeps time for them (one
    drawn outside an epoch is not part of that epoch end's cost)."""
    start = time.perf_counter()
    drawn = run.report.figures(run.model, run.bundle, run.step_state.step, epoch, epochs)
    if drawn and run.budget is not None:
        run.budget.figure_drawn(time.perf_counter() - start, in_epoch=epoch is not None)


def evaluation_settings(run: Run) -> tuple:
    """(device, amp dtype, batch limit, process group): how the teacher's passes evaluate, as `run.evaluate` does."""
    return run.device, run.step_parts.amp_dtype, run.trainer.limit_val_batches, run.dist


def check_weights(run: Run, epoch: int) -> None:
    """Non-finite steps too few to stop the loop may still have ruined the weights: never checkpoint those."""
    if not weights_finite(run.model, run.dist):
        raise NonFiniteLossError(
            f"the weights are not finite after epoch {epoch + 1} (step {run.step_state.step}); the checkpoints of "
            f"epoch {epoch} are kept"
        )


def evaluate_teacher(run: Run) -> dict | None:
    """distill.teacher: its top-1 on the validation split, logged before the student trains."""
    distiller = run.built.distiller
    if distiller is None or distiller.teacher is None:
        return None
    result = distiller.evaluate_teacher(run.bundle.val_loader, *evaluation_settings(run))
    log.info("teacher top-1 on the %s split: %.2f%% (%d images)", run.bundle.val_name, *result.values())
    run.report.scalars({"distill/teacher_top1": result["top1"]}, run.step_state.step)
    return result


def finish(run: Run, teacher: dict | None) -> dict:
    """After the last epoch (or a stop): the test split set aside by data.holdout, metrics.json, hparams."""
    cfg, bundle, state, report = run.cfg, run.bundle, run.step_state, run.report
    metrics = run_metrics(run)
    if run.trial is not None:
        metrics["search"] = run.trial.record()
    if teacher is not None:
        metrics["teacher"] = {"source": str(cfg.distill.teacher), **teacher}
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
    if run.budget is not None:
        final_lr = run.step_parts.optimizer.param_groups[0]["lr"]
        metrics["budget"] = run.budget.record(state.step, metrics["wall_time_s"], final_lr)
        report.scalars({"budget/wall_s": metrics["wall_time_s"], "budget/trained_steps": state.step}, state.step)
        report.line(budget_line(metrics["budget"], stopped=run.stop.name is not None))
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
        report.hparams(flat_hparams(run.built.resolved), {score: final, f"best_{score}": best})
    return metrics


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


def hydra_output_dir() -> Path | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return None


# Set by the command line (train.py, vit-train): its process exists for the run, so the run's clock starts with
# the process. A `run()` called from a notebook or a test starts its clock at the call.
_count_from_process_start = False


def count_from_process_start() -> None:
    global _count_from_process_start
    _count_from_process_start = True


def startup_seconds() -> float:
    """Seconds the command-line process lived before its first `run` (imports, config composition); 0 for later
    runs (a multirun sweep's), for `run()` called from Python, and where /proc is not there."""
    global _count_from_process_start
    if not _count_from_process_start:
        return 0.0
    _count_from_process_start = False
    try:  # field 22 of /proc/self/stat: the start time in clock ticks after boot; /proc/uptime: now after boot
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
