"""The optimizer of a run: decay/no-decay parameter groups (and layer-wise decay), the fallback optimizer's groups
under Muon, the learning rate scaled to the global batch, and the per-step schedule. What assembles them with the
precision, the EMA and the wrapped model into what each step reads is vit/train/assemble.py."""

from __future__ import annotations

import inspect
import logging
import math
import re
from collections.abc import Collection, Mapping
from fnmatch import fnmatch

import torch
from timm.scheduler import CosineLRScheduler
from timm.scheduler.scheduler import Scheduler
from torch import nn

from vit.errors import ConfigError
from vit.settings import OptimSettings, SchedSettings, TrainerSettings
from vit.weights.files import first_line

log = logging.getLogger("vit.train")

# The optim.name values whose step on sharded weights (trainer.strategy=fsdp) is their step on whole ones: each of
# timm's optimizers that builds on a CPU was stepped twice on a tiny ViT sharded over 2 processes and on its whole
# copy (tests/train/test_fsdp.py). These agreed to fp32 tolerance. The rest did not and are refused under fsdp:
# the cautious variants (c*), AdamP and SGDP, Adafactor's family, Kron, NovoGrad, MARS, AdaMuon and NAdaMuon raised
# on an in-place operation over sharded tensors; timm's Adafactor ran but ended 0.02 apart (its factored moments
# are plain tensors of the whole shape); bitsandbytes' and apex's need CUDA and were not tried.
# fmt: off
SHARDED_OPTIMIZERS = frozenset({
    "adabelief", "adadelta", "adagrad", "adam", "adamax", "adamc", "adamw", "adamwlegacy", "adan", "adanw", "adopt",
    "adoptc", "adoptw", "lamb", "lambc", "lambcd", "lambcw", "lambw", "laprop", "lapropc", "larc", "lars", "lion",
    "lionc", "madgrad", "madgradw", "momentum", "muon", "nadam", "nadamc", "nadamlegacy", "nadamw", "nesterov",
    "nesterovw", "nlarc", "nlars", "nmuon", "radabelief", "radam", "radamlegacy", "radamw", "rmsprop", "rmsproptf",
    "rmsproptfc", "rmsproptfw", "sgd", "sgdc", "sgdw",
})
# fmt: on


def param_groups(model: nn.Module, weight_decay: float, fallback: Collection[str] = ()) -> list[dict]:
    """Weight decay on weight matrices only: norms, biases (1-d), position embeddings and the cls token
    (`model.no_weight_decay()`) would only be pulled towards zero. Frozen parameters are left out. The parameters
    whose names match a `fallback` pattern (fnmatch, as timm's) get groups of their own marked `use_fallback`
    (the AdamW half of a hybrid optimizer, Muon: `MUON_FALLBACK`)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    groups = {(decays, falls_back): [] for decays in (True, False) for falls_back in (False, True)}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decays = not (param.ndim <= 1 or name in skip or name.endswith(".bias"))
        groups[decays, any(fnmatch(name, pattern) for pattern in fallback)].append(param)
    return [
        {"params": params, "weight_decay": weight_decay if decays else 0.0}
        | ({"use_fallback": True} if falls_back else {})
        for (decays, falls_back), params in groups.items()
        if params or not falls_back  # the two plain groups always (group 0 decays), fallback groups where they hold any
    ]


# timm's layer grouping for its ViT and Eva (`group_matcher`), which our ViT's parameter names follow: layer 0 the
# stem (cls, register and distillation tokens, position table, rotary frequencies, patch embedding, the norm before
# the blocks; T2T-ViT's tokens-to-token module), layer i + 1 the block `blocks.i`, the final norm with the last
# block, and everything unmatched (head, fc_norm, the attention pool) in the top layer. The stem is matched first,
# so `norm_pre` is not taken for the final `norm`.
LAYER_MATCHER = {
    "stem": r"^cls_token|dist_token|reg_token|pos_embed|rope|patch_embed|norm_pre|tokens_to_token",
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


def layer_decay_groups(
    model: nn.Module, weight_decay: float, layer_decay: float, fallback: Collection[str] = ()
) -> list[dict]:
    """BEiT/MAE layer-wise learning-rate decay through timm's `param_groups_layer_decay`: with L blocks the head
    gets `lr_scale` 1, block i `layer_decay ** (L - i)`, the stem `layer_decay ** (L + 1)`; the schedule multiplies
    each group's rate by its `lr_scale`. Weight decay and `fallback` as in `param_groups`. Groups are ordered by
    scale, highest first, so the logged `train/lr` (group 0) is the head's rate."""
    from timm.optim import param_groups_layer_decay

    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    hybrid = {"fallback_list": tuple(fallback)} if fallback else {}  # (a keyword timm has had since it has Muon)
    groups = param_groups_layer_decay(
        _Grouped(model), weight_decay=weight_decay, no_weight_decay_list=sorted(skip), layer_decay=layer_decay, **hybrid
    )
    return sorted(groups, key=lambda g: -g["lr_scale"])


# Muon (timm's `Muon` class: optim.name=muon, nmuon, adamuon, nadamuon) orthogonalises the update of each weight
# matrix and hands every other parameter to an AdamW (NAdamW with Nesterov) inside the same optimizer. timm routes a
# parameter by its group's `use_fallback` flag, else by its shape (`_is_suitable_for_muon` in timm/optim/muon.py):
# Muon takes a tensor with at least two dimensions > 1, neither of its first two of size 1, whose 2-d view (a conv
# kernel (out, in, k, k) seen as (out, in * k * k)) has both sides >= 4 and a side ratio <= 128. On a ViT:
#   - the blocks' qkv, proj, fc1 and fc2 matrices (MAE's decoder_embed and decoder blocks too): Muon;
#   - norms, biases, layer-scale gammas (1-d): AdamW by shape;
#   - pos_embed, cls/reg/dist tokens (1, N, D), MAE's mask token and decoder position table, the learned rotary
#     frequencies: AdamW (no_weight_decay() names, flagged here; most would also fall back by shape);
#   - the patch embedding (a (D, 3, p, p) conv, the conv stems, SPT's linear, T2T's tokens-to-token module) and the
#     classifier heads (head, head_dist, CCT's sequence-pool score `seq_pool`; MAE's decoder_pred): AdamW, flagged
#     here. By shape timm would give the patch kernel and most heads (10 x 192: yes) to Muon; Muon is meant for
#     the hidden layers, with the input embedding and the output layer left to AdamW (Jordan et al. 2024, the Muon
#     write-up and modded-nanogpt).
# Both halves run at the group's learning rate (timm's fallback_lr_scale 1), so the schedule and the layer decay
# apply to both.
MUON_FALLBACK = ("patch_embed.*", "tokens_to_token.*", "seq_pool.*", "head.*", "head_dist.*", "decoder_pred.*")


def fallback_patterns(model: nn.Module, optimizer_class: type) -> tuple[str, ...]:
    """The parameter names the AdamW half of a hybrid optimizer takes (`MUON_FALLBACK` plus the model's
    `no_weight_decay()` names); none for any other optimizer."""
    import timm.optim

    muon = getattr(timm.optim, "Muon", None)  # absent from older timm versions
    if muon is None or not (isinstance(optimizer_class, type) and issubclass(optimizer_class, muon)):
        return ()
    return (*MUON_FALLBACK, *sorted(getattr(model, "no_weight_decay", lambda: set())()))


def scaled_lr(optim: OptimSettings | Mapping, global_batch: int) -> float:
    """`optim.lr` is given for `optim.lr_batch` images (512 by default) and scaled linearly: a global batch
    of 256 trains with half of it (Goyal et al. 2017)."""
    optim = OptimSettings.of(optim)
    return optim.lr * global_batch / (optim.lr_batch or 512)


def optimizer_class(name: str) -> type:
    """timm's class for `optim.name` (the raw class, its registry defaults such as sgd's nesterov not bound); a
    name whose package is missing (bitsandbytes, apex) or that needs CUDA is a ConfigError."""
    from timm.optim import get_optimizer_class

    try:
        return get_optimizer_class(name, bind_defaults=False)
    except (ImportError, AssertionError) as err:
        raise ConfigError(f"optim.name={name}: {first_line(err)}") from err


# The settings a config of configs/optim/ chooses for its own optimizer, which differ between optimizers by an order
# of magnitude (Lion's rate is a tenth of AdamW's and its weight decay ten times higher: configs/optim/lion.yaml).
TUNED_FOR_THE_OPTIMIZER = ("lr", "weight_decay")


def kept_settings_warning(optim: OptimSettings | Mapping, group: str | None, given: Collection[str]) -> str | None:
    """The warning line for `optim.name=<other>` beside the config group `optim=<group>` (adamw by default): the
    group's rate and weight decay were chosen for the group's own optimizer and would carry over without a word.
    `given`: the keys set on the command line (the user's choice, never warned about). None where the name is the
    group's own, where both keys were given, or where the group is unknown (a run composed without Hydra)."""
    from omegaconf import OmegaConf

    from vit import CONFIG_DIR

    group_file = CONFIG_DIR / "optim" / f"{group}.yaml"
    if not group or not group_file.is_file():
        return None
    optim = OptimSettings.of(optim)
    own = OmegaConf.load(group_file).get("name", OptimSettings.name)  # the group's optimizer
    if optim.name == own:
        return None
    kept = [key for key in TUNED_FOR_THE_OPTIMIZER if f"optim.{key}" not in given]
    if not kept:
        return None
    values = " and ".join(f"optim.{key}={getattr(optim, key):g}" for key in kept)
    setting = " and ".join(f"optim.{key}" for key in kept)
    if (CONFIG_DIR / "optim" / f"{optim.name}.yaml").is_file():
        advice = f"optim={optim.name} sets a rate and weight decay chosen for it (or set {setting})"
    else:
        advice = f"set {setting} for {optim.name}"
    return f"optim.name={optim.name} runs with {values}, chosen for {own} (the config group optim={group}); {advice}"


def optimizer_kwargs(optim: OptimSettings, opt_class: type, device: torch.device) -> dict:
    """What `create_optimizer_v2` gets besides the groups and the rate: optim.betas, eps and momentum where set,
    then optim.kwargs as given. A key left null is not passed: the optimizer's own default applies (timm's factory
    gives momentum 0.9 to every optimizer that takes one, and drops betas or eps for one that takes none). torch's
    Adam and AdamW run fused, on CUDA and on the CPU alike: one kernel updates every parameter, several times faster
    than torch's default per-tensor loop, and far faster on a busy CPU (docs/BENCHMARKS.md, "The optimizer step on
    the CPU"). SGD's fused kernel, not measured, is `+optim.kwargs.fused=true`."""
    named = {"betas": optim.betas, "eps": optim.eps, "momentum": optim.momentum}
    kwargs = {key: value for key, value in named.items() if value is not None}
    kwargs.update({key: value for key, value in optim.kwargs.items() if value is not None})
    if device.type in ("cuda", "cpu") and opt_class in (torch.optim.Adam, torch.optim.AdamW):
        kwargs.setdefault("fused", True)
    return kwargs


def build_optimizer(
    model: nn.Module, optim: OptimSettings | Mapping, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """timm's `create_optimizer_v2` for `optim.name`, on our parameter groups: given a list of groups it passes them
    to the optimizer as they are (its own grouping, filter_bias_and_bn and layer_decay, applies to a model only),
    so each group keeps its weight_decay and lr_scale; its weight_decay argument (0) is only the constructor's
    default for a group without one, and ours all have one. A keyword the optimizer does not take is a ConfigError
    naming `optim.kwargs.<key>`."""
    from timm.optim import create_optimizer_v2

    optim = OptimSettings.of(optim)
    name = optim.name
    opt_class = optimizer_class(name)
    fallback = fallback_patterns(model, opt_class)
    if optim.layer_decay is not None:
        groups = layer_decay_groups(model, optim.weight_decay, optim.layer_decay, fallback)
    else:
        groups = param_groups(model, optim.weight_decay, fallback)
    kwargs = optimizer_kwargs(optim, opt_class, device)
    try:
        optimizer = create_optimizer_v2(groups, opt=name, lr=lr, **kwargs)
    except TypeError as err:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if unexpected is None:
            raise
        takes = [p for p in inspect.signature(opt_class).parameters if p not in ("self", "params")]
        raise ConfigError(
            f"optim.kwargs.{unexpected.group(1)} is not a setting of optim.name={name} "
            f"({opt_class.__name__} takes: {', '.join(takes)})"
        ) from err
    except ValueError as err:  # the optimizer's own range checks: "Invalid beta parameter at index 1: 1.5"
        raise ConfigError(f"optim.name={name}: {first_line(err)}") from err
    if fallback:  # timm's Muon, as its factory built it, with its Newton-Schulz iterations batched (vit/train/muon.py)
        from vit.train.muon import BatchedMuon

        optimizer = BatchedMuon.of(optimizer, device)
    return optimizer


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
    sched: SchedSettings | Mapping,
    epochs: int,
    steps_per_epoch: int,
    weight_decay_end: float | None = None,
) -> Scheduler | Schedules:
    """timm's cosine schedule counted in optimizer steps (`t_in_epochs=False`), stepped every update:
    `warmup` steps rising linearly from warmup_lr_init to the peak, then a cosine over the remaining steps that
    reaches min_lr with the last one (`warmup_prefix`: the cosine's t counts from the end of the warmup)."""
    sched = SchedSettings.of(sched)
    total = max(2, epochs * steps_per_epoch)
    warmup = min(total - 1, int(math.ceil(sched.warmup_epochs * steps_per_epoch)))
    base_lr = optimizer.param_groups[0]["lr"]
    constant = sched.name == "constant"
    lr = CosineLRScheduler(
        optimizer,
        # "constant": a cosine too long to move. (2 at least: timm warns that a 1-step cosine does nothing.)
        t_initial=max(2, total - warmup) if not constant else 10**12,
        lr_min=(sched.min_lr or 0.0) if not constant else base_lr,
        warmup_t=warmup,
        warmup_lr_init=sched.warmup_lr_init or 0.0,
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
