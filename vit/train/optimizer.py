"""The optimisation of a run: the optimizer with decay/no-decay parameter groups (and layer-wise decay), its
learning rate scaled to the global batch, the per-step schedule, and `build_optimisation`, which gathers them with
the AMP scaler, EMA, DDP and torch.compile into the `StepSettings` every training step reads."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from omegaconf import DictConfig
from timm.scheduler import CosineLRScheduler
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn

from vit.engine.build import is_mae
from vit.engine.compile import compile_blocks
from vit.engine.device import announce, choose_precision
from vit.engine.distributed import Distributed
from vit.train.loop import StepSettings
from vit.train.progressive import ResizeSchedule, allow_recompiles
from vit.train.settings import TrainerSettings


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only: norms, biases (1-d), position embeddings and the cls token
    (`model.no_weight_decay()`) would only be pulled towards zero. Frozen parameters are left out."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name in skip or name.endswith(".bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# timm's layer grouping for its ViT (`VisionTransformer.group_matcher`), which our ViT's parameter names follow:
# layer 0 the stem (cls and distillation tokens, position table, patch embedding; T2T-ViT's tokens-to-token module),
# layer i + 1 the block `blocks.i`, the final norm with the last block, and everything unmatched (head, fc_norm)
# in the top layer.
LAYER_MATCHER = {
    "stem": r"^cls_token|dist_token|reg_token|pos_embed|rope|patch_embed|tokens_to_token",
    "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
}


class _Grouped:
    """What timm's `param_groups_layer_decay` asks of a model: its parameters and a `group_matcher`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def named_parameters(self):
        return self.model.named_parameters()

    def group_matcher(self, coarse: bool = False) -> dict:
        return LAYER_MATCHER


def layer_decay_groups(model: nn.Module, weight_decay: float, layer_decay: float) -> list[dict]:
    """BEiT/MAE layer-wise learning-rate decay through timm's `param_groups_layer_decay`: with L blocks the head
    gets `lr_scale` 1, block i `layer_decay ** (L - i)`, the stem `layer_decay ** (L + 1)`; the schedule multiplies
    each group's rate by its `lr_scale`. Weight decay as in `param_groups`. Groups are ordered by scale, highest
    first, so the logged `train/lr` (group 0) is the head's rate."""
    from timm.optim import param_groups_layer_decay

    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    groups = param_groups_layer_decay(
        _Grouped(model), weight_decay=weight_decay, no_weight_decay_list=sorted(skip), layer_decay=layer_decay
    )
    return sorted(groups, key=lambda g: -g["lr_scale"])


def scaled_lr(optim_cfg: Mapping, global_batch: int) -> float:
    """`optim.lr` is given for `optim.lr_batch` images (512 by default) and scaled linearly: a global batch
    of 256 trains with half of it (Goyal et al. 2017)."""
    return float(optim_cfg["lr"]) * global_batch / float(optim_cfg.get("lr_batch") or 512)


def build_optimizer(model: nn.Module, optim_cfg: Mapping, lr: float, device: torch.device) -> torch.optim.Optimizer:
    layer_decay = optim_cfg.get("layer_decay")
    if layer_decay is not None:
        groups = layer_decay_groups(model, float(optim_cfg["weight_decay"]), float(layer_decay))
    else:
        groups = param_groups(model, float(optim_cfg["weight_decay"]))
    if optim_cfg["name"] == "sgd":
        momentum = float(optim_cfg.get("momentum") or 0.9)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    # The fused kernel updates every parameter in one launch on CUDA.
    return torch.optim.AdamW(
        groups,
        lr=lr,
        betas=tuple(optim_cfg.get("betas") or (0.9, 0.999)),
        eps=float(optim_cfg.get("eps") or 1e-8),
        fused=device.type == "cuda",
    )


class WeightDecayCosine:
    """Weight decay moving along a cosine from `start` (step 0) to `end` (last step), as DINO and DeiT III raise
    it late in training. Only the groups that decay are touched; the value is a function of the step alone, and
    the optimizer's state dict carries the current one across a resume."""

    def __init__(self, optimizer: torch.optim.Optimizer, start: float, end: float, total_steps: int) -> None:
        self.groups = [group for group in optimizer.param_groups if group["weight_decay"] > 0]
        self.start, self.end, self.total = start, end, max(1, total_steps)

    def value(self, step: int) -> float:
        progress = min(step / self.total, 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1 + math.cos(math.pi * progress))

    def step_update(self, num_updates: int) -> None:
        for group in self.groups:
            group["weight_decay"] = self.value(num_updates)


class Schedules:
    """The learning-rate scheduler plus per-step extras, stepped together; its state is the lr scheduler's."""

    def __init__(self, lr: Scheduler, *extras) -> None:
        self.lr, self.extras = lr, extras

    def step_update(self, num_updates: int) -> None:
        self.lr.step_update(num_updates=num_updates)
        for extra in self.extras:
            extra.step_update(num_updates)

    def state_dict(self) -> dict:
        return self.lr.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.lr.load_state_dict(state)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    sched_cfg: Mapping,
    epochs: int,
    steps_per_epoch: int,
    weight_decay_end: float | None = None,
) -> Scheduler | Schedules:
    """timm's cosine schedule counted in optimizer steps (`t_in_epochs=False`), stepped every update:
    `warmup` steps rising linearly from warmup_lr_init to the peak, then a cosine over the remaining steps that
    reaches min_lr with the last one (`warmup_prefix`: the cosine's t counts from the end of the warmup)."""
    total = max(2, epochs * steps_per_epoch)
    warmup = min(total - 1, int(math.ceil(float(sched_cfg["warmup_epochs"]) * steps_per_epoch)))
    base_lr = optimizer.param_groups[0]["lr"]
    constant = sched_cfg["name"] == "constant"
    lr = CosineLRScheduler(
        optimizer,
        # "constant": a cosine too long to move. (2 at least: timm warns that a 1-step cosine does nothing.)
        t_initial=max(2, total - warmup) if not constant else 10**12,
        lr_min=float(sched_cfg.get("min_lr") or 0.0) if not constant else base_lr,
        warmup_t=warmup,
        warmup_lr_init=float(sched_cfg.get("warmup_lr_init") or 0.0),
        warmup_prefix=True,
        t_in_epochs=False,
    )
    if any("lr_scale" in group for group in optimizer.param_groups):
        lr.step_update(num_updates=0)  # layer decay: the first step runs at the scaled rates too (no-op otherwise)
    if weight_decay_end is None:
        return lr
    start = max(group["weight_decay"] for group in optimizer.param_groups)
    return Schedules(lr, WeightDecayCosine(optimizer, start, float(weight_decay_end), total))


def batches_per_epoch(bundle, trainer: TrainerSettings) -> int:
    """Training batches per epoch and process (trainer.limit_train_batches caps them)."""
    batches = len(bundle.train_loader)
    return min(batches, trainer.limit_train_batches) if trainer.limit_train_batches else batches


def build_optimisation(
    cfg: DictConfig, trainer: TrainerSettings, parts, device: torch.device, dist: Distributed
) -> StepSettings:
    """What every step reads, from the built model and data (`parts`, vit/train/setup.py's ModelAndData)."""
    model, bundle = parts.model, parts.bundle
    global_batch = int(cfg.data.batch_size) * trainer.accum_steps * dist.world_size  # data.batch_size: per process
    optimizer = build_optimizer(model, cfg.optim, scaled_lr(cfg.optim, global_batch=global_batch), device)
    steps_per_epoch = max(1, math.ceil(batches_per_epoch(bundle, trainer) / trainer.accum_steps))
    scheduler = build_scheduler(
        optimizer, cfg.sched, trainer.epochs, steps_per_epoch, cfg.optim.get("weight_decay_end")
    )
    precision = choose_precision(trainer.amp, device, model)
    announce(precision)
    # EMA warmup (timm): the decay ramps up over the first steps, so short runs get a useful average too.
    ema = ModelEmaV3(model, decay=trainer.ema_decay, use_warmup=trainer.ema_warmup) if trainer.ema else None
    ddp = None
    if dist.enabled:  # broadcasts rank 0's weights; all-reduces (averages) the gradients in backward
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    use_compile = trainer.use_compile(device.type)
    step_model = ddp if ddp is not None else model
    return StepSettings(
        train_model=compiled_model(model, step_model, trainer, parts.resize) if use_compile else step_model,
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
        log_every=trainer.log_every_n_steps,
        max_bad_steps=trainer.max_bad_steps,
        dist=dist,
        ddp=ddp,
        distill=parts.distiller,
        compiled=use_compile,
        masked_pretraining=is_mae(cfg),
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
