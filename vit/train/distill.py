"""Knowledge distillation (DeiT, Touvron et al. 2021): a teacher's predictions as a second training signal.

    loss = (1 - alpha) * label_loss(cls logits, labels) + alpha * distillation_loss(dist logits, teacher logits)

`distill.type=hard`: cross-entropy against the teacher's top-1 class; `soft`: the KL divergence between the
tempered distributions, summed and scaled by tau^2 / (B * classes) as DeiT's `DistillationLoss` does. The dist
logits are those of the distillation token's head (`model.distill_token=true`), else the class head's own.

The teacher (`distill.teacher=<source>`): a timm model (`timm:<name>`, its weights from timm's download or from
`distill.teacher_file`), a last.pt/best.pt of this trainer, or a state dict file of the timm architecture
`distill.teacher_model`. It runs in eval mode under no_grad, in the run's
autocast, on the batch the student trains on (augmented, Mixup/CutMix-mixed), resized and re-normalised on the
device where its input differs (`TeacherView`). It is read before any data; checkpoints never hold it.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vit.errors import ConfigError
from vit.models.vit import VisionTransformer, ViTConfig
from vit.runtime.compile import eager
from vit.runtime.device import autocast_to
from vit.settings import DistillSettings
from vit.tasks.build import build_model_from_config
from vit.train.checkpoints import class_difference
from vit.weights.fit import PretrainedError, Weights, describe_mismatch
from vit.weights.read import CheckpointError, read_weights

log = logging.getLogger("vit.train")


@dataclass
class Teacher:
    """A loaded teacher, before it is fitted to the data: its module (eval mode, no gradients), where it came
    from, its class count (and class map, for checkpoints of ours), and the input it was trained on where the
    source says (None: unknown, the student's is used)."""

    model: nn.Module
    where: str
    num_classes: int
    class_to_idx: dict | None = None
    img_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


# --- loss --------------------------------------------------------------------------------------------------------


def distillation_term(student: torch.Tensor, teacher: torch.Tensor, kind: str, tau: float) -> torch.Tensor:
    """The distillation loss of student logits (B, K) against teacher logits (B, K): hard, the cross-entropy on
    the teacher's top-1; soft, KL(teacher_tau || student_tau) summed over the batch, times tau^2 / (B * K)."""
    if kind == "hard":
        return F.cross_entropy(student, teacher.argmax(dim=-1))
    log_student = F.log_softmax(student.float() / tau, dim=-1)  # (B, K)
    log_teacher = F.log_softmax(teacher.float() / tau, dim=-1)  # (B, K)
    kl = F.kl_div(log_student, log_teacher, reduction="sum", log_target=True)
    return kl * (tau * tau) / student.numel()


class TeacherView(nn.Module):
    """The teacher behind its input adapter: the student's normalised batch (B, 3, H, W) is re-normalised with
    the teacher's mean/std and resized to its image size (bilinear, antialiased when shrinking), on the device.
    Always in eval mode; its parameters take no gradients."""

    def __init__(self, teacher: nn.Module, img_size: int, mean, std, student_mean, student_std) -> None:
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.img_size = int(img_size)
        self.renormalise = tuple(mean) != tuple(student_mean) or tuple(std) != tuple(student_std)
        # x_teacher = (x * std_s + mean_s - mean_t) / std_t = x * scale + shift, per channel (1, 3, 1, 1)
        scale = torch.tensor(student_std) / torch.tensor(std)
        shift = (torch.tensor(student_mean) - torch.tensor(mean)) / torch.tensor(std)
        self.register_buffer("scale", scale.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", shift.view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True) -> TeacherView:
        return super().train(False)  # the teacher never trains: dropout and batch statistics stay off

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.renormalise:
            x = x * self.scale.to(x.dtype) + self.shift.to(x.dtype)
        if tuple(x.shape[-2:]) != (self.img_size, self.img_size):
            shrink = x.shape[-1] > self.img_size
            x = F.interpolate(x, size=(self.img_size,) * 2, mode="bilinear", align_corners=False, antialias=shrink)
        return self.teacher(x)  # (B, K)


class Distiller:
    """The run's distillation: the loss the training step calls (`loss`), the two terms' running means for the
    log (`log_values`), the teacher's top-1 on the validation split (`evaluate_teacher`, once) and the student's
    agreement with it (`agreement`, every evaluation)."""

    def __init__(self, base: nn.Module, teacher: TeacherView | None, kind: str, alpha: float, tau: float) -> None:
        self.base, self.teacher, self.kind = base, teacher, kind
        self.alpha, self.tau = float(alpha), float(tau)
        self.sums: torch.Tensor | None = None  # (3,) label loss, distillation loss, steps since the last log
        self.teacher_preds: tuple[torch.Tensor, torch.Tensor] | None = None  # validation (predictions, targets)

    def loss(self, images: torch.Tensor, outputs, targets: torch.Tensor) -> torch.Tensor:
        """`outputs`: the student's logits (B, K), or (cls, dist) logits from a model with the distillation token.
        `targets`: what the label criterion takes (class indices, or Mixup's soft targets)."""
        dist_out = None
        if isinstance(outputs, tuple):
            outputs, dist_out = outputs
        if self.kind == "none":  # no teacher: both heads learn the labels through their average, as timm trains DeiT
            return self.base(outputs if dist_out is None else (outputs + dist_out) / 2, targets)
        label_loss = self.base(outputs, targets)
        with torch.no_grad():
            teacher_logits = self.teacher(images)  # (B, K), in the caller's autocast
        term = distillation_term(outputs if dist_out is None else dist_out, teacher_logits, self.kind, self.tau)
        parts = torch.stack([label_loss.detach().float(), term.detach().float(), label_loss.new_ones(()).float()])
        self.sums = parts if self.sums is None else self.sums + parts
        return (1.0 - self.alpha) * label_loss + self.alpha * term

    def log_values(self) -> dict:
        """The mean label and distillation loss since the last call (this process's batches; one host sync)."""
        if self.sums is None:
            return {}
        label, term, count = self.sums.tolist()
        self.sums = None
        return {"train/loss_label": label / count, "train/loss_distill": term / count}

    def evaluate_teacher(self, loader: Iterable, device, amp_dtype, limit, dist) -> dict:
        """The teacher's top-1 on `loader` (its predictions kept for `agreement`)."""
        preds, targets = predictions(self.teacher, loader, device, amp_dtype, limit)
        self.teacher_preds = (preds, targets)
        correct, count = dist.sum_(torch.stack([(preds == targets).sum(), targets.new_tensor(targets.numel())]))
        return {"top1": 100.0 * correct.item() / max(1, count.item()), "count": int(count.item())}

    def agreement(self, model: nn.Module, loader: Iterable, device, amp_dtype, limit, dist) -> float:
        """Percent of validation images whose top-1 class is the student's and the teacher's alike."""
        preds, targets = predictions(model, loader, device, amp_dtype, limit)
        if self.teacher_preds is None or not torch.equal(self.teacher_preds[1], targets):  # another order: again
            self.teacher_preds = predictions(self.teacher, loader, device, amp_dtype, limit)
        same, count = dist.sum_(torch.stack([(preds == self.teacher_preds[0]).sum(), preds.new_tensor(preds.numel())]))
        return 100.0 * same.item() / max(1, count.item())


@torch.no_grad()
def predictions(model: nn.Module, loader: Iterable, device, amp_dtype, limit) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 predictions (n,), targets (n,)) of `model` in eval mode over this process's part of `loader`."""
    was_training = model.training
    model.eval()
    preds, targets = [], []
    autocast = autocast_to(device, amp_dtype)
    with eager():
        for i, (images, labels) in enumerate(loader):
            if limit is not None and i >= limit:
                break
            with autocast:
                preds.append(model(images.to(device, non_blocking=True)).argmax(dim=-1))
            targets.append(labels.to(device, non_blocking=True))
    model.train(was_training)
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return (torch.cat(preds) if preds else empty), (torch.cat(targets) if targets else empty)


# --- the teacher -------------------------------------------------------------------------------------------------


def load_teacher(dcfg: DistillSettings | Mapping) -> Teacher | None:
    """`distill.teacher`'s model, read and built before any data is read; None without a teacher. Any problem is
    a CheckpointError naming the setting (the trainer prints it in one line and exits with code 2)."""
    dcfg = DistillSettings.of(dcfg)
    source = dcfg.teacher
    if not source:
        return None
    setting = f"distill.teacher={str(source)!r}"
    # Offline, the one line says how to give the teacher as a file: the teacher's key, not model.pretrained.
    instead = "distill.teacher_file=/path/to/the/weights.safetensors"
    try:
        # distill.teacher_ema=true: the EMA weights where the source holds them, else its raw ones
        ema = None if dcfg.teacher_ema else False
        weights = read_weights(str(source), ema=ema, instead=instead, file=dcfg.teacher_file)
        if weights.timm_model is None and weights.config is None:
            return state_dict_teacher(weights, dcfg.teacher_model)
        if dcfg.teacher_model:  # a timm name or a checkpoint of ours says its own architecture
            log.warning(
                "distill.teacher_model=%s is not used: %s, not a bare state dict, says its own architecture",
                dcfg.teacher_model,
                setting,
            )
        return timm_teacher(weights) if weights.timm_model is not None else checkpoint_teacher(weights)
    except FileNotFoundError:
        if dcfg.teacher_file:  # the source is then timm:<name>: the missing file is this one
            raise CheckpointError(f"distill.teacher_file={dcfg.teacher_file}: no such file") from None
        raise CheckpointError(
            f"{setting}: no such file (give timm:<name>, a last.pt/best.pt of this trainer, or a state dict file "
            "with distill.teacher_model=<timm model name>)"
        ) from None
    except (PretrainedError, ConfigError) as err:
        raise CheckpointError(f"{setting}: {err}") from None


def timm_teacher(weights: Weights) -> Teacher:
    """A pretrained timm model (timm's download and cache, or `distill.teacher_file` in their place) with the input
    its pretrained config records: size, mean and std. A ViT our model builds from timm's architecture (DeiT III,
    DINOv2/v3, SigLIP, CLIP, EVA-02 ...: vit/models/foundation.py) is built as `model.pretrained=timm:<name>`
    builds it, which computes timm's numbers and reads the weights in our key layout (Eva's included); any other
    model (a ConvNet) is timm's own, with the weights' classifier size."""
    from vit.models.foundation import timm_architecture

    try:
        arch = timm_architecture(weights.timm_model)
    except ValueError:  # not a ViT our model builds
        model = timm_from_state_dict(weights.timm_model, weights.state_dict, weights.where)
        cfg = model.pretrained_cfg
        return Teacher(model, weights.where, model.num_classes, None, cfg["input_size"][-1], cfg["mean"], cfg["std"])
    head = weights.state_dict.get("head.weight")  # (classes, C); none for a backbone without a classifier
    classes = 0 if head is None else int(head.shape[0])
    model = VisionTransformer(ViTConfig(**arch.settings, num_classes=classes))
    fit_strictly(model, weights.state_dict, weights.where)
    return Teacher(model, weights.where, classes, None, arch.img_size, arch.mean, arch.std)


def state_dict_teacher(weights: Weights, timm_name: str | None) -> Teacher:
    """A state dict in the layout of the timm model `timm_name` (a file does not say its architecture)."""
    if not timm_name:
        raise PretrainedError(
            "a state dict file does not say its architecture: set distill.teacher_model=<timm model name> "
            "(e.g. resnet18), or give a last.pt/best.pt of this trainer"
        )
    model = timm_from_state_dict(str(timm_name), weights.state_dict, weights.where)
    return Teacher(model, weights.where, int(model.num_classes))


def checkpoint_teacher(weights: Weights) -> Teacher:
    """A last.pt/best.pt of this trainer: its model rebuilt from its saved config, with the weights `read_weights`
    chose (its EMA ones where it holds them, unless distill.teacher_ema=false), its image size and normalisation
    from its data config."""
    config, classes = weights.config, weights.class_to_idx or {}
    model = build_model_from_config(config.get("model") or {}, num_classes=len(classes) or None)
    fit_strictly(model, weights.state_dict, weights.where)
    data = config.get("data") or {}
    mean, std = data.get("mean"), data.get("std")
    return Teacher(model, weights.where, model.num_classes, dict(classes) or None, data.get("img_size"), mean, std)


def timm_from_state_dict(name: str, state_dict: dict, where: str) -> nn.Module:
    """timm's `name` (random init, no download) with the file's classifier size, then the file's weights."""
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise PretrainedError(f"distill.teacher_model={name!r}: timm has no such model{hint}")
    probe = timm.create_model(name, pretrained=False)
    head = probe.pretrained_cfg.get("classifier") or "head"
    head = head[0] if isinstance(head, (list, tuple)) else head  # a distilled DeiT: (head, head_dist)
    weight = state_dict.get(f"{head}.weight")
    if weight is None:
        raise PretrainedError(f"holds no {head}.weight: not the weights of timm's {name}")
    model = timm.create_model(name, pretrained=False, num_classes=int(weight.shape[0]))
    fit_strictly(model, state_dict, where)
    return model


def fit_strictly(model: nn.Module, state_dict: dict, where: str) -> None:
    problem = describe_mismatch(state_dict, model)
    if problem:
        raise PretrainedError(f"weights from {where} do not fit {type(model).__name__}: {problem}")
    model.load_state_dict(state_dict, strict=True)


def check_teacher_classes(teacher: Teacher, num_classes: int | None, class_to_idx: Mapping | None = None) -> None:
    """The teacher predicts the data's classes: the same count (and, for a checkpoint of ours, the same class
    map), else a CheckpointError naming both."""
    setting = f"distill.teacher={teacher.where!r}"
    if num_classes is not None and teacher.num_classes != int(num_classes):
        raise CheckpointError(
            f"{setting}: the teacher predicts {teacher.num_classes} classes, the data has {num_classes}; a teacher "
            "must be trained on the student's classes"
        )
    if teacher.class_to_idx and class_to_idx:
        problem = class_difference(teacher.class_to_idx, class_to_idx, teacher.where)
        if problem:
            raise CheckpointError(f"{setting}: {problem}")


def build_distiller(
    dcfg: DistillSettings | Mapping, teacher: Teacher | None, model: nn.Module, bundle, img_size: int, device
):
    """The run's `Distiller` (None: neither a teacher nor a distillation token), the teacher on `device` behind
    its input adapter, and one log line saying what the teacher sees."""
    dcfg = DistillSettings.of(dcfg)
    distilled = bool(getattr(model, "distilled", False))
    if teacher is None and not distilled:
        return None
    view = None
    if teacher is not None:
        check_teacher_classes(teacher, bundle.num_classes, bundle.class_to_idx)
        size = int(dcfg.teacher_img_size or teacher.img_size or img_size)
        mean = tuple(float(v) for v in (dcfg.teacher_mean or teacher.mean or bundle.mean))
        std = tuple(float(v) for v in (dcfg.teacher_std or teacher.std or bundle.std))
        view = TeacherView(teacher.model, size, mean, std, tuple(bundle.mean), tuple(bundle.std)).to(device)
        log.info(teacher_line(dcfg, teacher, view, img_size, mean, std, distilled))
    else:
        log.info("model.distill_token=true without a teacher: both heads learn the labels through their average")
    return Distiller(bundle.train_criterion, view, dcfg.type, dcfg.alpha, dcfg.tau)


def teacher_line(
    dcfg: DistillSettings, teacher: Teacher, view: TeacherView, img_size: int, mean, std, distilled: bool
) -> str:
    params = sum(p.numel() for p in teacher.model.parameters()) / 1e6
    kind = dcfg.type
    how = f"alpha {dcfg.alpha:g}" + (f", tau {dcfg.tau:g}" if kind == "soft" else "")
    head = "the distillation token's head" if distilled else "the class head (no distillation token)"
    sees = f"the student's batch ({img_size} px"
    sees += f", resized to {view.img_size} px on the device" if view.img_size != img_size else ""
    norm = f"mean {tuple(round(m, 4) for m in mean)} std {tuple(round(s, 4) for s in std)}"
    sees += f", re-normalised with {norm})" if view.renormalise else f", the student's normalisation {norm})"
    return (
        f"distill.type={kind} ({how}) into {head}: teacher {teacher.where} ({type(teacher.model).__name__}, "
        f"{params:.2f} M params, {teacher.num_classes} classes) sees {sees}, augmented and mixed as the student's"
    )
