"""The step's parts assembled from what the first phases built (vit/train/setup.py): the optimisation (the
optimizer and its schedule from vit/train/optimizer.py, the precision, the EMA; under trainer.strategy=fsdp the model
and its EMA sharded first) and the model as the step calls it (in DistributedDataParallel under torchrun, compiled
where trainer.compile says so). `build_step_parts` returns them as the StepParts every step reads."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from timm.utils import ModelEmaV3
from torch import nn

from vit.errors import ConfigError
from vit.runtime.compile import compile_blocks
from vit.runtime.device import Precision, announce, choose_precision
from vit.runtime.distributed import Distributed
from vit.runtime.sharding import is_sharded, shard_model
from vit.settings import OptimSettings, TrainerSettings
from vit.settings.trainer import log_interval
from vit.train.optimizer import batches_per_epoch, build_optimizer, build_scheduler, scaled_lr
from vit.train.progressive import ResizeSchedule, allow_recompiles
from vit.train.step_parts import StepParts

log = logging.getLogger("vit.train")


@dataclass
class Optimisation:
    """What updates the weights: the optimizer, its schedule, the precision the steps run in and the EMA."""

    optimizer: torch.optim.Optimizer
    scheduler: object
    precision: Precision
    ema: ModelEmaV3 | None


def build_optimisation(
    cfg: DictConfig,
    trainer: TrainerSettings,
    model: nn.Module,
    bundle,
    device: torch.device,
    dist: Distributed,
    timed: Precision | None = None,
) -> Optimisation:
    """The optimizer (lr scaled to the global batch), the per-step schedule, the precision (`timed`, where
    trainer.width_by_budget timed it, else trainer.amp's rule) and the EMA. Under trainer.strategy=fsdp the model and
    its EMA are sharded first (vit/runtime/sharding.py), so that the optimizer holds the sharded parameters and its
    state is sharded alike."""
    global_batch = cfg.data.batch_size * trainer.accum_steps * dist.world_size  # data.batch_size: per process
    precision = timed or choose_precision(trainer.amp, device, model)
    announce(precision)
    # EMA warmup (timm): the decay ramps up over the first steps, so short runs get a useful average too.
    ema = ModelEmaV3(model, decay=trainer.ema_decay, use_warmup=trainer.ema_warmup) if trainer.ema else None
    if trainer.strategy == "fsdp":
        shard_run_model(model, ema, precision, trainer, dist)
    optim = OptimSettings.of(cfg.optim)
    optimizer = build_optimizer(model, optim, scaled_lr(optim, global_batch=global_batch), device)
    steps_per_epoch = max(1, math.ceil(batches_per_epoch(bundle, trainer) / trainer.accum_steps))
    scheduler = build_scheduler(optimizer, cfg.sched, trainer.epochs, steps_per_epoch, optim.weight_decay_end)
    return Optimisation(optimizer, scheduler, precision, ema)


def shard_run_model(model: nn.Module, ema, precision: Precision, trainer: TrainerSettings, dist: Distributed) -> None:
    """trainer.strategy=fsdp: the model and its EMA (a copy made before sharding) sharded over the ranks alike, so
    the EMA's update pairs each rank's shard with the same shard of the model."""
    if precision.dtype == torch.float16:
        raise ConfigError(
            "trainer.amp=fp16 cannot run under trainer.strategy=fsdp: its gradient scaler does not take sharded "
            "gradients; use trainer.amp=bf16 (or none)"
        )
    for module in (model, ema.module if ema is not None else None):
        if module is not None:
            shard_model(module, precision.dtype, trainer.reshard_after_forward)
    mode = "ZeRO-3" if trainer.reshard_after_forward else "ZeRO-2"
    log.info(
        "sharded data parallel (trainer.strategy=fsdp): each block and the root over %d process%s, %s "
        "(trainer.reshard_after_forward=%s)",
        dist.world_size,
        "es" if dist.world_size > 1 else "",
        mode,
        str(trainer.reshard_after_forward).lower(),
    )


def wrap_model(
    model: nn.Module, trainer: TrainerSettings, device: torch.device, dist: Distributed, resize
) -> tuple[nn.Module, nn.Module | None, bool]:
    """(the module the step calls, the DDP wrapper or None, whether it is compiled): under torchrun the model in
    DistributedDataParallel (which broadcasts rank 0's weights and averages the gradients in backward), compiled
    where trainer.compile says so. A sharded model (trainer.strategy=fsdp) is called as it is: its own hooks
    gather the parameters and reduce the gradients."""
    ddp = None
    if dist.enabled and not is_sharded(model):
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    use_compile = trainer.use_compile(device.type)
    if use_compile and is_sharded(model):  # trainer.compile=auto (an explicit true is refused with the config)
        log.info("trainer.compile=auto: off under trainer.strategy=fsdp (compiling a sharded model is not tested here)")
        use_compile = False
    step_model = ddp if ddp is not None else model
    train_model = compiled_model(model, step_model, trainer, resize) if use_compile else step_model
    return train_model, ddp, use_compile


def build_step_parts(
    cfg: DictConfig, trainer: TrainerSettings, setup, device: torch.device, dist: Distributed
) -> StepParts:
    """What every step reads, from what the first phases built (`setup`, vit/train/setup.py's RunSetup)."""
    model, bundle = setup.model, setup.bundle
    opt = build_optimisation(cfg, trainer, model, bundle, device, dist, setup.precision)
    optimizer, scheduler, precision, ema = opt.optimizer, opt.scheduler, opt.precision, opt.ema
    train_model, ddp, use_compile = wrap_model(model, trainer, device, dist, setup.resize)
    return StepParts(
        train_model=train_model,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=bundle.train_criterion,
        device=device,
        precision=precision,
        scaler=torch.amp.GradScaler(device.type) if precision.dtype == torch.float16 else None,
        mixup_fn=bundle.mixup_fn,
        ema=ema,
        grad_clip=trainer.grad_clip,
        accum_steps=trainer.accum_steps,
        log_every=log_interval(trainer.log_every_n_steps, trainer.epochs, batches_per_epoch(setup.bundle, trainer)),
        max_bad_steps=trainer.max_bad_steps,
        dist=dist,
        ddp=ddp,
        compiled=use_compile,
        task=setup.task,
    )


def compiled_model(
    model: nn.Module, step_model: nn.Module, trainer: TrainerSettings, resize: ResizeSchedule | None
) -> nn.Module:
    """What the step calls: `step_model` (the model or its DDP wrapper) compiled whole, or with the model's blocks
    compiled in place (trainer.compile_scope=blocks: same state dict, the EMA untouched)."""
    if resize is not None:
        allow_recompiles(len(set(resize.sizes(trainer.epochs))))
    # Progressive resizing: one static-shape graph per image size (dynamic shapes would cost speed every step).
    dynamic = False if resize is not None else None
    if trainer.compile_scope == "blocks":
        compile_blocks(model, mode=trainer.compile_mode, dynamic=dynamic)
        return step_model
    return torch.compile(step_model, mode=trainer.compile_mode, dynamic=dynamic)
