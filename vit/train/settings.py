"""The trainer's settings (`configs/trainer/default.yaml`), read once into a typed, frozen object: the phases read
`run.trainer.epochs`, never `int(cfg.trainer.epochs)`. The YAML file declares the defaults; this class only types
them, so a key missing here and present there (or the reverse) fails `TrainerSettings.of` loudly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vit.train.budget import parse_budget


@dataclass(frozen=True)
class TrainerSettings:
    epochs: int  # with a budget: the upper bound
    budget: float | None  # trainer.budget in seconds (vit/train/budget.py)
    device: str  # auto | cpu | cuda
    amp: str  # auto | bf16 | fp16 | none
    threads: int | str  # auto | <n>
    compile: bool | str  # auto | true | false
    compile_mode: str
    compile_scope: str  # model | blocks
    seed: int
    deterministic: bool
    resume: str | None  # null | auto | <path>
    stop_after_epoch: int | None
    grad_clip: float | None
    accum_steps: int
    ema: bool
    ema_decay: float
    ema_warmup: bool
    limit_train_batches: int | None
    limit_val_batches: int | None
    log_every_n_steps: int
    attn_maps_every_n_epochs: int
    recon_images_every_n_epochs: int
    progress: str  # auto | bar | log
    save_checkpoints: bool
    keep_last: int | None
    grad_checkpointing: bool
    max_bad_steps: int
    val_every_n_epochs: int
    eval_flip: bool
    progressive_resize: Mapping[str, Any] | None

    @classmethod
    def of(cls, trainer: DictConfig | Mapping) -> TrainerSettings:
        """Read `cfg.trainer` (already checked by vit/train/config.py) into typed values."""
        raw = OmegaConf.to_container(trainer, resolve=True) if isinstance(trainer, DictConfig) else dict(trainer)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:  # a key added to the YAML file must be typed here too
            raise TypeError(f"TrainerSettings has no field for trainer.{unknown[0]}")
        value = dict(raw)
        for key in ("epochs", "seed", "accum_steps", "log_every_n_steps", "max_bad_steps"):
            value[key] = int(value[key])
        for key in ("limit_train_batches", "limit_val_batches", "stop_after_epoch", "keep_last"):
            value[key] = int(value[key]) if value[key] else None  # 0 and null: no limit, no stop, keep none apart
        for key in ("attn_maps_every_n_epochs", "recon_images_every_n_epochs"):
            value[key] = int(value[key] or 0)
        value["val_every_n_epochs"] = int(value["val_every_n_epochs"] or 1)
        value["grad_clip"] = float(value["grad_clip"]) if value["grad_clip"] else None
        value["ema_decay"] = float(value["ema_decay"])
        for key in ("deterministic", "ema", "ema_warmup", "save_checkpoints", "grad_checkpointing", "eval_flip"):
            value[key] = bool(value[key])
        value["budget"] = parse_budget(value["budget"])
        value["resume"] = None if value["resume"] is None else str(value["resume"])
        for key in ("device", "amp", "compile_mode", "compile_scope", "progress"):
            value[key] = str(value[key])
        return cls(**value)

    def use_compile(self, device_type: str) -> bool:
        """trainer.compile=auto compiles on CUDA only (on a CPU the compile time outweighs the gain)."""
        return device_type == "cuda" if str(self.compile) == "auto" else bool(self.compile)

    def pauses_after(self, epoch: int) -> bool:
        """trainer.stop_after_epoch: stop (with the checkpoints written) after epoch `epoch` (from 0), before the
        last one."""
        stop = self.stop_after_epoch
        return stop is not None and stop <= epoch + 1 < self.epochs

    def evaluates_after(self, epoch: int) -> bool:
        """trainer.val_every_n_epochs: evaluate after every n-th epoch, and after the last epoch of this process."""
        last_here = epoch + 1 == self.epochs or self.pauses_after(epoch)
        return last_here or (epoch + 1) % self.val_every_n_epochs == 0
