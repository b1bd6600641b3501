"""The first phases of a run: set up torch, then build the model and the data (with pretrained weights, the
teacher and the distillation loss). The model comes before the data, so a bad model setting or weights file
fails before any image is read."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from vit.data import DataBundle, build_data
from vit.errors import ConfigError
from vit.models import Complexity, complexity
from vit.records.files import atomic_write_text
from vit.runtime.device import Precision, resolve_device
from vit.runtime.distributed import Distributed
from vit.runtime.host_memory import set_malloc
from vit.search.trial import TrialReport
from vit.settings import TrainerSettings, WidthByBudget
from vit.settings.trainer import MallocMode
from vit.tasks import Task, task_of
from vit.tasks.build import built_config_file, pretrained_architecture
from vit.train.callbacks import Callbacks
from vit.train.checkpoints import Checkpointer, RunProgress
from vit.train.distill import build_distiller, check_teacher_classes, load_teacher
from vit.train.finetune import freeze, load_pretrained_weights, read_pretrained
from vit.train.long_overrides import LONG_GROUPS, apply_long_overrides
from vit.train.optimizer import batches_per_epoch
from vit.train.progressive import ResizeSchedule, resize_schedule
from vit.train.report import Reporter
from vit.train.resume import keep_resumed_width, recorded_config, resume_checkpoint_path
from vit.train.signals import StopSignal
from vit.train.step_parts import StepParts, StepState
from vit.train.thread_fit import choose_threads
from vit.train.width_choice import WidthChoice, pick_width, set_width, time_resumed_width

log = logging.getLogger("vit.train")


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
    """The loader's order and its workers' seeds for `epoch`, from (seed, epoch) alone."""
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


def setup_torch(trainer: TrainerSettings, dist: Distributed) -> torch.device:
    """This rank's device, the global seed, determinism or TF32, and a fresh peak-memory count."""
    device = dist.device(resolve_device(trainer.device))
    seed_everything(trainer.seed)
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device.type == "cuda":  # sys/gpu_mem_gib is this run's peak, also after earlier runs of a multirun sweep
        torch.cuda.reset_peak_memory_stats(device)
    return device


@dataclass
class RunSetup:
    """The first phases' product: the model (on its device, with pretrained weights and the teacher) and the data."""

    resolved: dict  # the config with interpolations resolved and the model as built (`recorded_config`)
    model: nn.Module  # on the device; the module whose weights the checkpoints hold
    bundle: DataBundle
    distiller: object | None  # vit/train/distill.py's Distiller, with or without a teacher
    task: Task  # what the run trains for (vit/tasks/): its model, loss, evaluation and score
    cost: Complexity
    resume_path: Path | None
    resize: ResizeSchedule | None  # trainer.progressive_resize
    threads: int  # torch's intra-op threads (trainer.threads)
    threads_reason: str
    width_choice: dict | None = None  # trainer.width_by_budget: the width picked, why, and what was timed
    precision: Precision | None = None  # the precision trainer.width_by_budget timed the faster, where it timed two
    host_memory: str | None = None  # trainer.malloc's line: what the C allocator does with freed blocks; None: nothing


@dataclass
class Run:
    """One training run, built once (vit/train/run.py's `build_run`) and handed to every phase of the loop
    (vit/train/trainer.py): the typed trainer settings, what the first phases built (`setup`: the model and the data,
    the teacher, the task), what each step reads (`step_parts`: the optimizer, schedule, EMA and precision, with this
    run's model, device and process group, and the callbacks) and changes (`step_state`: the step count, the
    divergence counters), where the run stands (`progress`), and its writers."""

    cfg: DictConfig
    trainer: TrainerSettings
    run_dir: Path
    setup: RunSetup
    step_parts: StepParts  # the one holder of the model, the device and the process group; the properties read it
    step_state: StepState
    progress: RunProgress
    checkpoints: Checkpointer
    report: Reporter
    stop: StopSignal
    trial: TrialReport | None  # a trial of an Optuna search (vit/search/sweeper.py): rank 0 reports to its study
    # The command, code, machine and versions this process started with (vit/records/provenance.py): read when the
    # run is built, so a checkout that moves on during a long run does not put its later commit in the record.
    provenance: dict = field(default_factory=dict)

    @property
    def model(self) -> nn.Module:
        return self.step_parts.model

    @property
    def device(self) -> torch.device:
        return self.step_parts.device

    @property
    def dist(self) -> Distributed:
        return self.step_parts.dist

    @property
    def bundle(self) -> DataBundle:
        return self.setup.bundle

    @property
    def task(self) -> Task:
        return self.step_parts.task

    @property
    def budget(self):
        """trainer.budget's plan (vit/train/budget.py), None without a budget."""
        return self.step_parts.budget

    @property
    def callbacks(self) -> Callbacks:
        """What hooks into the loop besides the step (vit/train/callbacks.py)."""
        return self.step_parts.callbacks

    def evaluation_settings(self) -> tuple:
        """(device, amp dtype, batch limit, process group): how the teacher's passes evaluate, as `evaluate` does."""
        return self.device, self.step_parts.amp_dtype, self.trainer.limit_val_batches, self.dist

    def planned_epochs(self) -> int:
        """The epochs the run will train: trainer.epochs, or with a budget the epochs its plan reaches."""
        return self.budget.planned_epochs() if self.budget is not None else self.trainer.epochs

    def finished(self) -> bool:
        """Whether the last epoch is done: trainer.epochs', or the budget plan's last step."""
        history = self.progress.history
        if self.budget is not None:
            return bool(history) and self.budget.reached(self.step_state.step)
        return bool(history) and history[-1]["epoch"] == self.trainer.epochs

    def batches_per_epoch(self) -> int:
        """Training batches per epoch and process (trainer.limit_train_batches caps them)."""
        return batches_per_epoch(self.bundle, self.trainer)

    def evaluate(self, loader, *, ema: bool = False) -> dict:
        """The model's (or its EMA's) results over `loader`, as every evaluation of the run measures them: top-1,
        top-5 and loss (with trainer.eval_flip and trainer.eval_shift, over each image's test-time views), or with
        task=mae the reconstruction loss on fixed masks; trainer.limit_val_batches caps the batches, torchrun's ranks
        share them."""
        model = self.step_parts.ema.module if ema else self.model
        args = (model, loader, self.device, self.step_parts.amp_dtype, self.trainer.limit_val_batches, self.dist)
        return self.task.evaluate(*args, flip=self.trainer.eval_flip, shift=self.trainer.eval_shift)


def set_threads(setting: int | str, device: torch.device, world_size: int, resumed: bool) -> tuple[int, str]:
    """`trainer.threads` applied to torch: the count and why, logged in one line."""
    threads = choose_threads(setting, device, world_size, resumed=resumed)
    torch.set_num_threads(threads[0])
    log.info("threads: %d (%s)", *threads)
    return threads


def apply_malloc(setting: MallocMode, device: torch.device) -> str | None:
    """`trainer.malloc` applied for a run on `device`: its line, logged (a warning where the setting could not run as
    given) and returned for metrics.json; None where there is nothing to say."""
    malloc = set_malloc(setting, device.type)
    if malloc is None:
        return None
    log.log(logging.WARNING if malloc.warning else logging.INFO, "%s", malloc.text)
    return malloc.text


def build_setup(
    cfg: DictConfig,
    trainer: TrainerSettings,
    run_dir: Path,
    device: torch.device,
    dist: Distributed,
    loader_wrapper: Callable[[Iterable], Iterable] | None = None,
    budget_left: Callable[[], float] | None = None,
) -> RunSetup:
    """`budget_left()`: the seconds left of trainer.budget (trainer.width_by_budget times the widths against it)."""
    seed = trainer.seed
    use_timm_preprocessing(cfg)
    composed = OmegaConf.to_container(cfg.model, resolve=True)  # before trainer.width_by_budget sets the width
    width_choice = keep_resumed_width(cfg, trainer, run_dir, dist)
    # With `num_classes: null` the data decides, and the model is rebuilt with its class count (same seed, so the
    # same initial weights).
    num_classes_cfg = cfg.model.get("num_classes")
    resize = resize_schedule(trainer.progressive_resize, cfg.data.img_size, cfg.model.get("patch_size") or 1)
    # progressive resizing, NaFlex batches (data.naflex): the ViT takes images of the other sizes too
    dynamic = resize is not None or (cfg.data.get("naflex") or {}).get("seq_lens") is not None
    task = task_of(cfg)
    model = task.build_model(cfg, num_classes=num_classes_cfg or 1000, dynamic_img_size=dynamic)
    # model.pretrained: read and checked against this model before any data is read. A resumed run continues from
    # its own checkpoint and does not read them again.
    resolved = recorded_config(cfg)
    if dist.is_main:
        write_built_configs(run_dir, resolved, {"model": composed}, {"model"})
    resume_path = resume_checkpoint_path(trainer.resume, run_dir, resolved, composed) if dist.is_main else None
    resume_path = dist.broadcast(resume_path)
    pretrained = read_pretrained(cfg.model, model) if resume_path is None else None
    # distill.teacher: read before any data, and again on resume (checkpoints hold the student only).
    teacher = load_teacher(cfg.get("distill"))
    if teacher is not None:
        check_teacher_classes(teacher, cfg.data.get("num_classes"))
    host_memory = apply_malloc(trainer.malloc, device)  # before the data and the steps allocate
    bundle = build_train_data(cfg, seed, dist, loader_wrapper, device)
    threads = set_threads(trainer.threads, device, dist.world_size, resumed=resume_path is not None)
    configured = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in LONG_GROUPS}
    width_choice, precision = width_and_precision(cfg, trainer, width_choice, task, bundle, device, dist, resize,
                                                  budget_left)  # fmt: skip
    # what trainer.width_by_budget changed: the width, and for a long run its long_overrides
    changed = {g for g, before in configured.items() if OmegaConf.to_container(cfg[g], resolve=True) != before}
    if "data" in changed:  # its long_overrides set data keys: the loaders as a run configured with them builds them
        bundle = build_train_data(cfg, seed, dist, loader_wrapper, device)
    rebuild = num_classes_cfg is None and getattr(model, "num_classes", None) != bundle.num_classes and task.classifier
    if rebuild or "model" in changed:  # the same seed, so the initial weights of a run configured with this model
        seed_everything(seed)
        classes = bundle.num_classes if rebuild else num_classes_cfg or 1000
        model = task.build_model(cfg, num_classes=classes, dynamic_img_size=dynamic, announce=False)
    if changed:
        resolved = recorded_config(cfg)
        if dist.is_main:
            write_built_configs(run_dir, resolved, {**configured, "model": composed}, changed)
    if pretrained is not None:
        load_pretrained_weights(model, pretrained, bundle.class_to_idx)
    whiten_stem(model, bundle.train_loader, dist, "model.pretrained" if pretrained is not None else
                "the checkpoint it resumes" if resume_path is not None else None)  # fmt: skip
    freeze(model, cfg.model.get("freeze"))  # frozen parameters get no optimizer state and no weight decay
    use_grad_checkpointing(model, trainer.grad_checkpointing)
    model = model.to(device)
    distiller = build_distiller(cfg.get("distill"), teacher, model, bundle, cfg.data.img_size, device)
    if distiller is not None:  # the distill task's loss is the distiller's
        task.attach(distiller)
    cost = complexity(model)
    # The model built: `timm:<name>` for one built from a timm name, not the model config it was composed with.
    label = resolved["model"]["name"]
    log.info("%s: %.2f M params, %.3f GMACs per image", label, cost.params / 1e6, cost.macs / 1e9)
    record = width_choice.record() if width_choice is not None else None
    return RunSetup(resolved, model, bundle, distiller, task, cost, resume_path, resize, *threads, record, precision,
                    host_memory)  # fmt: skip


def whiten_stem(model: nn.Module, loader: Iterable, dist: Distributed, weights_from: str | None,
                images: int = 4096) -> None:  # fmt: skip
    """model.stem_whitening: the stem's first convolution starts from the whitening of the first `images` training
    images' patches, as the loader gives them (`ConvStemEmbed.whiten`); rank 0's filters on every rank. Not where
    the weights come from elsewhere (`weights_from`), which the log says."""
    embed = getattr(model, "patch_embed", None)
    if not getattr(embed, "whitening", False):
        return
    if weights_from is not None:
        log.info("model.stem_whitening: not applied, the weights come from %s", weights_from)
        return
    batches, seen = [], 0
    for batch, _ in loader:  # (B, 3, H, W) normalised; stopping early leaves the loader's epoch as it was
        batches.append(batch)
        seen += len(batch)
        if seen >= images:
            break
    whitened = embed.whiten(torch.cat(batches)[:images])
    conv = embed.stem[0].conv
    with torch.no_grad():
        conv.weight.copy_(dist.broadcast(conv.weight.detach().cpu()))
    log.info("model.stem_whitening: the stem's first convolution starts from the whitening of %s training "
             "images' %dx%d patches (%d of its %d channels)", f"{min(seen, images):,}", *conv.kernel_size, whitened,
             conv.out_channels)  # fmt: skip


def build_train_data(cfg: DictConfig, seed: int, dist: Distributed, loader_wrapper, device: torch.device):
    """The data as cfg.data says, this rank's share, its training loader wrapped by `loader_wrapper` where given."""
    bundle = build_data(cfg.data, device=device, seed=seed, rank=dist.rank, world_size=dist.world_size)
    if loader_wrapper is not None:
        bundle.train_loader = loader_wrapper(bundle.train_loader)
    return bundle


def write_built_configs(run_dir: Path, resolved: dict, composed: dict, groups: set[str]) -> None:
    """Where a group's config the run trains with (of `resolved`, the run's `recorded_config`) is not the one
    `composed` holds for it (the model of model.pretrained=timm:<name> or of a width trainer.width_by_budget picked,
    a group its long_overrides set), the run folder says which it is: `built_config_file(group)`."""
    for group in sorted(groups):
        built = resolved[group]
        if built == composed[group]:
            continue
        if group == "model" and built.get("pretrained"):
            why = f"model.pretrained={built.get('pretrained')} fixes the architecture"
        elif group == "model" and built.get("embed_dim") != composed[group].get("embed_dim"):
            why = f"trainer.width_by_budget picked model.embed_dim={built.get('embed_dim')}"
        else:
            why = "trainer.width_by_budget.long_overrides set it"
        header = (
            f"# The {group} config this run trained with: {why}, so config.yaml's {group} keys are not what was "
            f"trained. Checkpoints hold this as config.{group}.\n"
        )
        path = run_dir / built_config_file(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(header + OmegaConf.to_yaml(OmegaConf.create(built)), path)


def use_timm_preprocessing(cfg: DictConfig) -> None:
    """model.pretrained=timm:<name>: the images are prepared as timm's weights expect (its pretrained_cfg): each of
    data.crop_pct, data.interpolation and the pair data.mean / data.std left null takes timm's value (SigLIP's
    0.5 / 0.5, CLIP's own; DINOv2's crop 1.0, DeiT III's 0.9; bicubic), one line saying which were taken and which
    the config set. Written into the config before it is resolved, so checkpoints, evaluation, export and resume
    see the same values."""
    arch = pretrained_architecture(cfg.model) if task_of(cfg).classifier else None
    if arch is None:
        return
    data, taken, given = cfg.data, [], []
    for key, value in (("crop_pct", arch.crop_pct), ("interpolation", arch.interpolation)):
        if data.get(key) is None:
            data[key] = value
            taken.append(f"data.{key}={value}")
        else:
            given.append(f"data.{key}={data[key]}")
    if data.get("mean") is None and data.get("std") is None:
        data.mean, data.std = list(arch.mean), list(arch.std)
        taken.append(f"data.mean={list(arch.mean)} data.std={list(arch.std)}")
    else:
        given.append("data.mean/data.std")
    kept = f"; as the config sets: {', '.join(given)}" if given else ""
    log.info("%s: timm's preprocessing of %s%s", " ".join(taken) or "nothing taken", arch.name, kept)


def use_grad_checkpointing(model: nn.Module, enabled: bool) -> None:
    """trainer.grad_checkpointing: the encoder blocks keep no activations for the backward pass and run again in
    it (less memory for about one more forward pass of time); the gradients are those of the plain model."""
    if not enabled:
        return
    if not hasattr(model, "set_grad_checkpointing"):
        raise ConfigError(f"trainer.grad_checkpointing=true: {type(model).__name__} cannot recompute its blocks")
    model.set_grad_checkpointing(True)
    log.info("gradient checkpointing: the encoder blocks are recomputed in the backward pass")


def width_and_precision(cfg: DictConfig, trainer: TrainerSettings, kept: WidthChoice | None, task: Task, bundle,
                        device, dist, resize, budget_left) -> tuple[WidthChoice | None, Precision | None]:  # fmt: skip
    """trainer.width_by_budget: the width (`kept`, a resumed run's, else chosen by `choose_width`) and the precision
    timed the faster at it where two were timed (vit/train/width_choice.py), rank 0's on every rank."""
    if kept is None:
        kept = choose_width(cfg, trainer, task, bundle, device, dist, resize, budget_left)
    elif dist.is_main:
        kept = time_resumed_width(cfg, trainer, kept, task, bundle, device)
    timed = kept.precision if kept is not None else None
    timed = dist.broadcast((timed.name, timed.reason) if timed is not None else None)
    return kept, Precision(*timed) if timed is not None else None


def choose_width(cfg: DictConfig, trainer: TrainerSettings, task: Task, bundle, device, dist, resize,
                 budget_left: Callable[[], float] | None) -> WidthChoice | None:  # fmt: skip
    """trainer.width_by_budget: the width timed and picked on rank 0 (vit/train/width_choice.py), written into the
    config on every rank (the choice's record: rank 0's). Without trainer.budget, off with one line."""
    setting = trainer.width_by_budget
    if setting.long_overrides and setting.long_epochs is None:
        log.warning("trainer.width_by_budget.long_overrides=%s is unused: trainer.width_by_budget.long_epochs is null",
                    list(setting.long_overrides))  # fmt: skip
    if setting.widths is None:
        for key in ("min_epochs", "long_epochs"):
            if getattr(setting, key) != getattr(WidthByBudget(), key):  # set, and weighing nothing
                log.warning("trainer.width_by_budget.%s=%g is unused: it weighs the widths of "
                            "trainer.width_by_budget.widths, which is null (the model is %d wide as configured)",
                            key, getattr(setting, key), cfg.model.embed_dim)  # fmt: skip
        return None
    if budget_left is None:
        width = cfg.model.embed_dim
        without = ", without its long_overrides" if setting.long_epochs is not None else ""
        log.info("trainer.width_by_budget: off without trainer.budget; the model is %d wide as configured%s", width,
                 without)  # fmt: skip
        return None
    batches = batches_per_epoch(bundle, trainer)
    choice = pick_width(cfg, trainer, task, bundle, device, batches, resize, budget_left) if dist.is_main else None
    width, long = dist.broadcast((choice.width, choice.long) if choice is not None else None)
    set_width(cfg, width)
    if long:
        apply_long_overrides(cfg, setting.long_overrides)
    return choice
