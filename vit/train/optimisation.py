"""The optimisation phase of a run: optimizer (with its learning rate scaled to the global batch), schedule,
AMP scaler, EMA, DDP and torch.compile, gathered into the `StepSettings` every training step reads."""

from __future__ import annotations

import math

import torch
from timm.utils import ModelEmaV3

from vit.train.compile import compile_blocks
from vit.train.config import is_mae
from vit.train.loop import StepSettings
from vit.train.optim import build_optimizer, build_scheduler, scaled_lr
from vit.train.precision import announce, choose_precision
from vit.train.progressive import allow_recompiles
from vit.train.setup import Setup


def batches_per_epoch(setup: Setup) -> int:
    """Training batches per epoch and process (trainer.limit_train_batches caps them)."""
    batches = len(setup.bundle.train_loader)
    limit = setup.cfg.trainer.limit_train_batches
    return min(batches, int(limit)) if limit else batches


def build_optimisation(setup: Setup) -> StepSettings:
    cfg, tcfg, model, device, dist = setup.cfg, setup.cfg.trainer, setup.model, setup.device, setup.dist
    accum = int(tcfg.accum_steps)
    global_batch = int(cfg.data.batch_size) * accum * dist.world_size  # data.batch_size is per process
    optimizer = build_optimizer(model, cfg.optim, scaled_lr(cfg.optim, global_batch=global_batch), device)
    steps_per_epoch = max(1, math.ceil(batches_per_epoch(setup) / accum))
    scheduler = build_scheduler(
        optimizer, cfg.sched, int(tcfg.epochs), steps_per_epoch, cfg.optim.get("weight_decay_end")
    )
    precision = choose_precision(tcfg.amp, device, model)
    announce(precision)
    # EMA warmup (timm): the decay ramps up over the first steps, so short runs get a useful average too.
    ema = ModelEmaV3(model, decay=float(tcfg.ema_decay), use_warmup=bool(tcfg.ema_warmup)) if tcfg.ema else None
    ddp = None
    if dist.enabled:  # broadcasts rank 0's weights; all-reduces (averages) the gradients in backward
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    use_compile = device.type == "cuda" if str(tcfg.compile) == "auto" else bool(tcfg.compile)
    return StepSettings(
        train_model=compiled_model(setup, ddp if ddp is not None else model, use_compile),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=setup.bundle.train_criterion,
        device=device,
        precision=precision,
        scaler=torch.amp.GradScaler(device.type) if precision.dtype == torch.float16 else None,
        mixup_fn=setup.bundle.mixup_fn,
        ema=ema,
        grad_clip=float(tcfg.grad_clip) if tcfg.grad_clip else None,
        accum_steps=accum,
        log_every=int(tcfg.log_every_n_steps),
        max_bad_steps=int(tcfg.max_bad_steps),
        dist=dist,
        ddp=ddp,
        distill=setup.distiller,
        compiled=use_compile,
        masked_pretraining=is_mae(cfg),
    )


def compiled_model(setup: Setup, step_model: torch.nn.Module, use_compile: bool) -> torch.nn.Module:
    """What the step calls: `step_model` (the model or its DDP wrapper), compiled whole, or with its blocks
    compiled in place (trainer.compile_scope=blocks: same state dict, the EMA untouched)."""
    tcfg = setup.cfg.trainer
    if not use_compile:
        return step_model
    if setup.resize is not None:
        allow_recompiles(len(set(setup.resize.sizes(int(tcfg.epochs)))))
    # Progressive resizing: one static-shape graph per image size (dynamic shapes would cost speed every step).
    dynamic = False if setup.resize is not None else None
    if tcfg.compile_scope == "blocks":
        compile_blocks(setup.model, mode=tcfg.compile_mode, dynamic=dynamic)
        return step_model
    return torch.compile(step_model, mode=tcfg.compile_mode, dynamic=dynamic)
