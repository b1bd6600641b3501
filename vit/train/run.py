"""`run(cfg)`: one training run from a composed config, start (or resume) to `metrics.json`.

Order of events: validate the config and build the model (no data touched yet) -> data -> optimizer,
schedule, EMA, AMP, compile -> resume -> for each epoch: train, evaluate (raw and EMA), log, checkpoint.

Run directory (Hydra's, or `output_dir`): .hydra/ (written by Hydra), tb/ (TensorBoard events),
checkpoints/{last,best}.pt, metrics.json.

Under `torchrun` (see vit/train/distributed.py) every rank runs this same function on its shard of the data;
rank 0's run directory is the run's, and only rank 0 writes into it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from timm.utils import ModelEmaV3

from vit.data import build_data
from vit.models import complexity
from vit.train.checkpoint import (
    atomic_save,
    atomic_write_text,
    check_run_dir,
    find_resume_checkpoint,
    load_checkpoint,
    restore_training_state,
    rng_state,
    set_rng_state,
    training_state,
)
from vit.train.compile import compile_blocks, eager
from vit.train.config import ConfigError, build_model_from_config, resolve_device, validate
from vit.train.distill import build_distiller, check_teacher_classes, load_teacher
from vit.train.distributed import Distributed, setup_distributed
from vit.train.finetune import freeze, load_pretrained_weights, read_pretrained
from vit.train.logger import Console, TensorBoard, attention_image, flat_hparams
from vit.train.loop import NonFiniteLossError, StepContext, evaluate, train_one_epoch, weights_finite
from vit.train.optim import build_optimizer, build_scheduler, scaled_lr
from vit.train.progressive import allow_recompiles, resize_schedule
from vit.train.signals import StopSignal

log = logging.getLogger("vit.train")

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}
ATTENTION_IMAGES = 4  # fixed validation images whose attention maps go to TensorBoard


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """Every epoch draws its randomness from (seed, epoch) alone, so a resumed run repeats exactly what an
    uninterrupted one would have done."""
    return seed * 100_003 + epoch


def rank_seed(seed: int, rank: int) -> int:
    """Rank 0 draws what a single process would; other ranks draw other augmentations and drop-path masks."""
    return seed + 1_000_033 * rank


def set_loader_epoch(loader, sampler, seed: int, epoch: int, rank: int = 0) -> None:
    if hasattr(loader, "set_epoch"):  # the GPU-resident loader
        loader.set_epoch(epoch)
    if sampler is not None:  # the shuffle order: (seed, epoch), the same on every rank
        sampler.set_epoch(epoch)
    generator = getattr(loader, "generator", None)
    if generator is not None:  # torch DataLoader: its worker seeds come from here
        generator.manual_seed(rank_seed(epoch_seed(seed, epoch), rank))


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


def run(
    cfg: DictConfig,
    output_dir: str | Path | None = None,
    train_loader_wrapper: Callable[[Iterable], Iterable] | None = None,
) -> dict:
    """Train as `cfg` says; write checkpoints, TensorBoard events and metrics.json into the run directory
    (`output_dir`, else Hydra's). Returns the metrics written to metrics.json.
    `train_loader_wrapper`: wraps the train loader (the end-to-end benchmark's real and static epochs,
    vit/analysis/e2e.py)."""
    # Wall time counts from the process start (imports, config composition) for the first run of a train.py process:
    # the recipes' time goals are "process start to final evaluation". Other runs count from here.
    wall_start = time.perf_counter() - startup_seconds()
    validate(cfg)
    own_dir = Path(output_dir) if output_dir is not None else hydra_output_dir()
    if own_dir is None:
        raise ConfigError("no run directory: call run(cfg, output_dir=...) or start through train.py")
    dist = setup_distributed(resolve_device(cfg.trainer.device))
    if not dist.is_main:  # the console is rank 0's; other ranks speak only of problems
        logging.getLogger("vit").setLevel(logging.WARNING)
    # Each torchrun worker's Hydra names its directory by its own clock: rank 0's is the run's.
    run_dir = Path(dist.broadcast(str(own_dir)))
    if dist.is_main:
        check_run_dir(run_dir, create=True)  # a file in the way, a read-only or full disk: OutputError, no data read
    elif own_dir != run_dir and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()  # the empty directory this worker's Hydra made for itself
    # Deterministic mode is process-wide: put it back afterwards, so later work in this process (tests, notebooks)
    # is not slowed or broken by it.
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        return _train(cfg, run_dir, wall_start, dist, train_loader_wrapper)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        dist.close()


def _train(cfg: DictConfig, run_dir: Path, wall_start: float, dist: Distributed, train_loader_wrapper=None) -> dict:
    tcfg = cfg.trainer
    device = dist.device(resolve_device(tcfg.device))
    seed = int(tcfg.seed)
    seed_everything(seed)
    if tcfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device.type == "cuda":  # sys/gpu_mem_gib is this run's peak, also after earlier runs of a multirun sweep
        torch.cuda.reset_peak_memory_stats(device)

    # The model first: a bad model setting fails here, before any data is read. With `num_classes: null` the
    # data decides, and the model is rebuilt with its class count (same seed, so the same initial weights).
    num_classes_cfg = cfg.model.get("num_classes")
    resize = resize_schedule(tcfg.get("progressive_resize"), cfg.data.img_size, cfg.model.get("patch_size") or 1)
    dynamic = resize is not None  # progressive resizing: the ViT takes the smaller images too
    model = build_model_from_config(cfg.model, num_classes=num_classes_cfg or 1000, dynamic_img_size=dynamic)
    # model.pretrained: read and checked against this model before any data is read. A resumed run continues from
    # its own checkpoint and does not read them again.
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resume_path = dist.broadcast(resume_checkpoint_path(tcfg.resume, run_dir, resolved) if dist.is_main else None)
    pretrained = read_pretrained(cfg.model, model) if resume_path is None else None
    # distill.teacher: read before any data, and again on resume (checkpoints hold the student only).
    teacher = load_teacher(cfg.get("distill") or {})
    if teacher is not None:
        check_teacher_classes(teacher, cfg.data.get("num_classes"))
    bundle = build_data(cfg.data, device=device, seed=seed, rank=dist.rank, world_size=dist.world_size)
    if train_loader_wrapper is not None:
        bundle.train_loader = train_loader_wrapper(bundle.train_loader)
    if num_classes_cfg is None and getattr(model, "num_classes", None) != bundle.num_classes:
        seed_everything(seed)
        model = build_model_from_config(cfg.model, num_classes=bundle.num_classes, dynamic_img_size=dynamic)
    if pretrained is not None:
        load_pretrained_weights(model, pretrained, bundle.class_to_idx)
    freeze(model, cfg.model.get("freeze"))  # frozen parameters get no optimizer state and no weight decay
    model = model.to(device)
    distiller = build_distiller(cfg.get("distill") or {}, teacher, model, bundle, int(cfg.data.img_size), device)
    cost = complexity(model)
    log.info("%s: %.2f M params, %.3f GMACs per image", cfg.model.name, cost.params / 1e6, cost.macs / 1e9)

    accum = int(tcfg.accum_steps)
    global_batch = int(cfg.data.batch_size) * accum * dist.world_size  # data.batch_size is per process
    lr = scaled_lr(cfg.optim, global_batch=global_batch)
    optimizer = build_optimizer(model, cfg.optim, lr, device)
    train_batches = len(bundle.train_loader)
    if tcfg.limit_train_batches:
        train_batches = min(train_batches, int(tcfg.limit_train_batches))
    epochs = int(tcfg.epochs)
    steps_per_epoch = max(1, math.ceil(train_batches / accum))
    scheduler = build_scheduler(optimizer, cfg.sched, epochs, steps_per_epoch, cfg.optim.get("weight_decay_end"))
    amp_dtype = AMP_DTYPES[tcfg.amp] if device.type == "cuda" else None  # CPU runs in fp32
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    # EMA warmup (timm): the decay ramps up over the first steps, so short runs get a useful average too.
    ema = ModelEmaV3(model, decay=float(tcfg.ema_decay), use_warmup=bool(tcfg.ema_warmup)) if tcfg.ema else None
    use_compile = device.type == "cuda" if str(tcfg.compile) == "auto" else bool(tcfg.compile)
    ddp = None
    if dist.enabled:  # broadcasts rank 0's weights; all-reduces (averages) the gradients in backward
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    step_model = ddp if ddp is not None else model
    if use_compile and resize is not None:
        allow_recompiles(len(set(resize.sizes(epochs))))
    # Progressive resizing: one static-shape graph per image size (dynamic shapes would cost speed every step).
    compile_dynamic = False if dynamic else None
    compiled = step_model
    if use_compile and tcfg.get("compile_scope", "model") == "blocks":  # in place: same state dict, EMA untouched
        compile_blocks(model, mode=tcfg.compile_mode, dynamic=compile_dynamic)
    elif use_compile:
        compiled = torch.compile(step_model, mode=tcfg.compile_mode, dynamic=compile_dynamic)
    ctx = StepContext(
        model=compiled,
        raw_model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=bundle.train_criterion,
        device=device,
        amp_dtype=amp_dtype,
        scaler=scaler,
        mixup_fn=bundle.mixup_fn,
        ema=ema,
        grad_clip=float(tcfg.grad_clip) if tcfg.grad_clip else None,
        accum_steps=accum,
        log_every=int(tcfg.log_every_n_steps),
        max_bad_steps=int(tcfg.max_bad_steps),
        dist=dist,
        ddp=ddp,
        distill=distiller,
    )
    parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler, "ema": ema}

    start_epoch, best_top1, history = 0, -1.0, []
    skip_batches, resume_rng = 0, None  # a checkpoint written inside an epoch: batches done, RNG to go on with
    if resume_path is not None:
        state = load_checkpoint(resume_path)
        restore_training_state(state, path=resume_path, class_to_idx=bundle.class_to_idx, **parts)
        start_epoch, ctx.step = int(state["epoch"]), int(state["step"])
        best_top1 = float(state.get("best_top1", -1.0))
        history = list(state.get("history", []))
        # The time of the earlier processes counts too (not the pause between them): the run's clock goes on from the
        # moment the checkpoint was written (inside an epoch too), else from the last finished epoch.
        wall_start -= float(state.get("elapsed_s") or (history[-1] if history else {}).get("elapsed_s") or 0.0)
        skip_batches = int(state.get("batches_into_epoch") or 0)
        rng_ranks = state.get("rng_ranks") or []
        resume_rng = rng_ranks[dist.rank] if len(rng_ranks) == dist.world_size else state.get("rng")
        where = f" + {skip_batches} batches" if skip_batches else ""
        log.info("resumed from %s at epoch %d%s (step %d)", resume_path, start_epoch, where, ctx.step)

    main = dist.is_main  # only rank 0 writes: events, checkpoints, console lines, metrics.json
    tb = TensorBoard(str(run_dir / "tb"), enabled=main)
    console = Console(str(tcfg.progress), enabled=main)
    ckpt_dir = run_dir / "checkpoints"
    fixed_images = first_val_images(bundle.val_loader, ATTENTION_IMAGES)
    attn_every = int(tcfg.attn_maps_every_n_epochs or 0)
    stop_after = int(tcfg.stop_after_epoch) if tcfg.stop_after_epoch else None
    limit_val = tcfg.limit_val_batches
    eval_flip = bool(tcfg.get("eval_flip", False))
    val_every = int(tcfg.get("val_every_n_epochs") or 1)
    teaching = distiller is not None and distiller.teacher is not None
    if teaching:  # a bad teacher shows here, before the student trains
        teacher_val = distiller.evaluate_teacher(bundle.val_loader, device, amp_dtype, limit_val, dist)
        log.info("teacher top-1 on the %s split: %.2f%% (%d images)", bundle.val_name, *teacher_val.values())
        tb.scalars({"distill/teacher_top1": teacher_val["top1"]}, ctx.step)

    def on_log(step_in_epoch: int, values: dict) -> None:  # every log_every_n_steps, with values already on the host
        tb.scalars(values, ctx.step)
        console.update(step_in_epoch, ctx.step, values["train/loss"], values["train/lr"], values["train/img_per_s"])

    stop = StopSignal()
    ctx.stop_requested = stop.requested
    previous_handlers = stop.install()
    try:
        for epoch in range(start_epoch, epochs):
            set_loader_epoch(bundle.train_loader, bundle.train_sampler, seed, epoch, dist.rank)
            limit_train = tcfg.limit_train_batches
            done_before = skip_batches if epoch == start_epoch else 0
            if done_before:  # inside this epoch: the loader skips what was trained, the RNG is the checkpoint's
                skip_train_batches(bundle, done_before)
                limit_train = max(0, int(limit_train) - done_before) if limit_train else None
                set_rng_state(resume_rng)
            else:
                seed_everything(rank_seed(epoch_seed(seed, epoch), dist.rank))
            if resize is not None:
                ctx.train_img_size = resize.size_at(epoch, epochs)
            console.start_epoch(epoch, epochs, train_batches)

            train = train_one_epoch(ctx, bundle.train_loader, limit_batches=limit_train, on_log=on_log)
            if train["stopped"]:
                # Stopped after an optimizer step: last.pt records the step (and the batches of this epoch done),
                # so a resumed run continues with the next batch as the uninterrupted run would have.
                batches_done = done_before + train["steps"]
                rng_ranks = dist.gather(rng_state())
                if tcfg.save_checkpoints and main and train["steps"]:
                    state = training_state(
                        **parts,
                        epoch=epoch,
                        step=ctx.step,
                        best_top1=best_top1,
                        class_to_idx=bundle.class_to_idx,
                        config=resolved,
                        history=history,
                    )
                    state.update(batches_into_epoch=batches_done, rng=rng_ranks[0], rng_ranks=rng_ranks)
                    state["elapsed_s"] = time.perf_counter() - wall_start
                    atomic_save(state, ckpt_dir / "last.pt")
                if main:
                    print(
                        f"stopped by {stop.name or 'a signal'} in epoch {epoch + 1} after batch {batches_done} "
                        f"(step {ctx.step}); last.pt in {ckpt_dir} holds this step. Resume with the same command "
                        "plus trainer.resume=auto",
                        flush=True,
                    )
                break
            # trainer.val_every_n_epochs: a short recipe cannot spare an evaluation every epoch; the last is always due.
            val, val_ema = None, None
            last_here = epoch + 1 == epochs or (stop_after is not None and epoch + 1 >= stop_after)
            if (epoch + 1) % val_every == 0 or last_here:
                val = evaluate(model, bundle.val_loader, device, amp_dtype, limit_val, dist=dist, flip=eval_flip)
                if ema is not None:
                    val_ema = evaluate(
                        ema.module, bundle.val_loader, device, amp_dtype, limit_val, dist=dist, flip=eval_flip
                    )
            history.append(epoch_record(epoch, ctx.step, train, val, val_ema, time.perf_counter() - wall_start))
            scalars = epoch_scalars(train, val, val_ema, device, ctx.skipped_steps)
            if ctx.train_img_size is not None:
                history[-1]["train_img_size"] = scalars["train/img_size"] = ctx.train_img_size
            if teaching and val is not None:  # percent of validation images where student and teacher agree
                agree = distiller.agreement(model, bundle.val_loader, device, amp_dtype, limit_val, dist)
                history[-1]["val_teacher_agreement"] = scalars["val/teacher_agreement"] = agree
            tb.scalars(scalars, ctx.step)
            attn_due = attn_every and ((epoch + 1) % attn_every == 0 or epoch + 1 == epochs)
            one_prefix = getattr(model, "num_prefix_tokens", 1) == 1  # the figure reads one cls token's attention
            if main and attn_due and fixed_images is not None and one_prefix:
                with eager():  # blocks compiled in place (compile_scope=blocks) run eagerly for the figure
                    image = attention_image(model, fixed_images, bundle.mean, bundle.std)
                tb.image("attention/heads_and_rollout", image, ctx.step)
            console.end_epoch(
                f"epoch {epoch + 1}/{epochs}: train loss {train['loss']:.4f}, {train['img_per_s']:,.0f} img/s"
                + (f" at {ctx.train_img_size} px" if ctx.train_img_size is not None else "")
                + f", {train['seconds']:.1f}s"
                + (f"; {bundle.val_name} top-1 {val['top1']:.2f}%" if val else "")
                + (f" (EMA {val_ema['top1']:.2f}%)" if val_ema else "")
            )
            is_best = val is not None and val["top1"] > best_top1
            if val is not None:
                best_top1 = max(best_top1, val["top1"])
            if not weights_finite(model):  # non-finite steps too few to stop the loop, but the weights are lost
                raise NonFiniteLossError(
                    f"the weights are not finite after epoch {epoch + 1} (step {ctx.step}); the checkpoints of "
                    f"epoch {epoch} are kept"
                )
            if tcfg.save_checkpoints and main:
                state = training_state(
                    **parts,
                    epoch=epoch + 1,
                    step=ctx.step,
                    best_top1=best_top1,
                    class_to_idx=bundle.class_to_idx,
                    config=resolved,
                    history=history,
                )
                state["elapsed_s"] = time.perf_counter() - wall_start
                atomic_save(state, ckpt_dir / "last.pt")
                if is_best:
                    atomic_save(state, ckpt_dir / "best.pt")
            if stop_after is not None and epoch + 1 >= stop_after and epoch + 1 < epochs:
                log.info("trainer.stop_after_epoch=%d reached; continue with trainer.resume=auto", stop_after)
                break
    except BaseException:
        tb.close()
        raise
    finally:
        stop.restore(previous_handlers)

    metrics = run_metrics(cfg, history, cost, bundle, use_compile, device)
    metrics["val_split"] = bundle.val_name
    if teaching:
        metrics["teacher"] = {"source": str(cfg.distill.teacher), **teacher_val}
    if bundle.test_loader is not None and history and history[-1]["epoch"] == epochs:
        # data.holdout: epochs and settings are chosen on the holdout; the test split is looked at once, here.
        metrics["test"] = final_test(model, ema, bundle, device, amp_dtype, limit_val, dist, eval_flip)
        tb.scalars({f"test/{k}": v for k, v in metrics["test"].items() if k != "split"}, ctx.step)
        console.end_epoch(
            f"{bundle.test_name} split after training: top-1 {metrics['test']['top1']:.2f}%"
            + (f" (EMA {metrics['test']['ema_top1']:.2f}%)" if ema is not None else "")
        )
    # Process start (or the first run's start, over resumes) to the end of the final evaluation.
    metrics["wall_time_s"] = time.perf_counter() - wall_start
    metrics["stopped_by_signal"] = stop.name
    metrics["world_size"] = dist.world_size
    # With torch.compile the first step holds the compilation (reported apart from the img/s of later steps).
    metrics["first_step_seconds"] = ctx.first_step_seconds
    if use_compile and ctx.first_step_seconds is not None:
        log.info("first step (compilation included): %.1f s", ctx.first_step_seconds)
    if not main:
        return metrics
    try:
        atomic_write_text(json.dumps(metrics, indent=2), run_dir / "metrics.json")  # a failed write keeps the old one
    except BaseException:
        tb.close()  # the events so far are kept; the metrics error is the one reported
        raise
    tb.hparams(
        flat_hparams(resolved),
        {"val_top1": metrics["final"].get("val_top1") or 0.0, "best_val_top1": metrics["best"]["val_top1"] or 0.0},
    )
    tb.close()
    return metrics


def resume_checkpoint_path(setting, run_dir: Path, resolved: dict) -> Path | None:
    """`trainer.resume`: null -> None; a path -> that file; auto -> this run's last.pt, else (in Hydra's
    outputs/<date>/<time> layout only) the newest last.pt of an earlier run with the same model and data config,
    so rerunning the same command continues it. A run folder chosen by hand resumes from its own files only."""
    if not setting:
        return None
    if setting != "auto":
        return Path(str(setting))
    runs_root = run_dir.parent.parent if run_dir.parent.parent.name == "outputs" else None
    match = {"model": resolved["model"], "data": resolved["data"]}
    if (resolved.get("distill") or {}).get("teacher"):  # a distillation run continues the one with its teacher
        match["distill"] = resolved["distill"]
    path = find_resume_checkpoint(run_dir, runs_root, match)
    if path is None:
        log.info("trainer.resume=auto: no checkpoint of this run found, starting fresh")
    return path


def skip_train_batches(bundle, count: int) -> None:
    """Make the next train epoch start after its first `count` batches (a resume inside an epoch)."""
    if hasattr(bundle.train_loader, "skip_batches"):  # the GPU-resident loader
        bundle.train_loader.skip_batches(count)
    else:  # the torch loader: its sampler skips those batches' samples
        bundle.train_sampler.skip = count * bundle.train_loader.batch_size


def first_val_images(loader, count: int) -> torch.Tensor | None:
    """The first `count` validation images (B, 3, H, W): the same pictures every epoch and after a resume."""
    try:
        images, _ = next(iter(loader))
    except StopIteration:
        return None
    return images[:count]


def epoch_record(epoch: int, step: int, train: dict, val: dict | None, val_ema: dict | None, elapsed_s: float) -> dict:
    """One entry of the run's history (metrics.json, checkpoints): epoch counted from 1; `elapsed_s` is the run's
    wall time at the end of this epoch's evaluation (from the process start, over resumes). An epoch without an
    evaluation (trainer.val_every_n_epochs) has val_top1/val_top5/val_loss null."""
    record = {
        "epoch": epoch + 1,
        "step": step,
        "elapsed_s": elapsed_s,
        "train_loss": train["loss"],
        "train_img_per_s": train["img_per_s"],
        "epoch_seconds": train["seconds"],
        "val_top1": val["top1"] if val else None,
        "val_top5": val["top5"] if val else None,
        "val_loss": val["loss"] if val else None,
    }
    if val_ema:
        record.update(val_ema_top1=val_ema["top1"], val_ema_top5=val_ema["top5"], val_ema_loss=val_ema["loss"])
    return record


def epoch_scalars(
    train: dict, val: dict | None, val_ema: dict | None, device: torch.device, skipped_steps: int
) -> dict:
    """The once-per-epoch TensorBoard scalars (the per-step ones come from the loop's `on_log`)."""
    scalars = {
        "time/epoch_s": train["seconds"],
        "train/epoch_img_per_s": train["img_per_s"],
        "train/epoch_loss": train["loss"],
    }
    if val:
        scalars.update({f"val/{k}": val[k] for k in ("top1", "top5", "loss")})
    if val_ema:
        scalars.update({f"val_ema/{k}": val_ema[k] for k in ("top1", "top5", "loss")})
    if device.type == "cuda":
        scalars["sys/gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if skipped_steps:
        scalars["train/skipped_steps"] = skipped_steps
    return scalars


def final_test(model, ema, bundle, device, amp_dtype, limit, dist, flip: bool) -> dict:
    """Top-1/top-5/loss of the final weights (and the EMA's) on the test split that data.holdout set aside."""
    result = evaluate(model, bundle.test_loader, device, amp_dtype, limit, dist=dist, flip=flip)
    test = {"split": bundle.test_name, "top1": result["top1"], "top5": result["top5"], "loss": result["loss"]}
    if ema is not None:
        ema_result = evaluate(ema.module, bundle.test_loader, device, amp_dtype, limit, dist=dist, flip=flip)
        test.update(ema_top1=ema_result["top1"], ema_top5=ema_result["top5"], ema_loss=ema_result["loss"])
    return test


def run_metrics(cfg, history: list[dict], cost, bundle, compiled: bool, device) -> dict:
    """metrics.json: final and best epoch, mean throughput, model size, and the whole history."""
    evaluated = [r for r in history if r.get("val_top1") is not None]
    best = max(evaluated, key=lambda r: r["val_top1"]) if evaluated else {}
    return {
        "model": cfg.model.name,
        "params": cost.params,
        "macs": cost.macs,
        "epochs_done": len(history),
        "final": history[-1] if history else {},
        "best": {"val_top1": best.get("val_top1"), "epoch": best.get("epoch")},
        "train_img_per_s": float(np.mean([r["train_img_per_s"] for r in history])) if history else None,
        "loader": bundle.loader_kind,
        "loader_reason": bundle.loader_reason,
        "compiled": compiled,
        "device": str(device),
        "history": history,
    }
