"""Which run a new run continues: the config as checkpoints record it (`recorded_config`), the checkpoint
trainer.resume names or trainer.resume=auto finds (this run's last.pt, else an earlier run of the same command),
and, under trainer.width_by_budget, the width of that checkpoint, which a resumed run keeps instead of timing."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vit.runtime.distributed import Distributed
from vit.settings import TrainerSettings
from vit.tasks import task_of
from vit.tasks.build import built_model_config
from vit.train.checkpoints import checkpoint_config, find_resume_checkpoint
from vit.train.long_overrides import apply_long_overrides, long_edits
from vit.train.signals import restart_count
from vit.train.width_choice import WidthChoice, set_width
from vit.weights.read import CheckpointError

log = logging.getLogger("vit.train")


def recorded_config(cfg: DictConfig) -> dict:
    """The run's config as its checkpoints store it and trainer.resume=auto compares it: resolved, its model the one
    built. With model.pretrained=timm:<name> that is timm's architecture under `model.name=timm:<name>`
    (vit/tasks/build.py's `built_model_config`), not the model config it was composed with, so evaluation, export,
    predict, a resume and a fine-tuning from the checkpoint rebuild and name the model trained. The same command
    gives the same record, so resume=auto still finds its run."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if task_of(cfg).classifier:  # task=mae builds its encoder from the config's own keys (build_mae_from_config)
        resolved["model"] = built_model_config(resolved["model"])
    return resolved


def resume_checkpoint_path(setting, run_dir: Path, resolved: dict, composed_model: dict | None = None) -> Path | None:
    """`trainer.resume`: null -> None; a path -> that file; auto -> this run's last.pt, else (in Hydra's
    outputs/<date>/<time> layout only) the newest last.pt of an earlier run with the same model and data config,
    so rerunning the same command continues it. A run folder chosen by hand resumes from its own files only.
    `resolved` is the config as checkpoints record it (`recorded_config`); `composed_model`, the model config as
    composed, is what the checkpoints of a model.pretrained=timm:<name> run written before the model built was
    recorded hold: such a run is still found."""
    restarted = restart_count()
    if not setting and restarted is not None:  # torchrun's elastic restart or SLURM's requeue: continue unasked
        log.info("%s=%d: this launch is a restart, so it resumes as trainer.resume=auto would", *restarted)
        setting = "auto"
    if not setting:
        return None
    if setting != "auto":
        return Path(str(setting))
    match = resume_match(resolved)
    path = find_resume_checkpoint(run_dir, runs_root_of(run_dir), match)
    if path is None and composed_model is not None and composed_model != match["model"]:
        path = find_resume_checkpoint(run_dir, runs_root_of(run_dir), {**match, "model": composed_model})
    if path is None:
        log.info("trainer.resume=auto: no checkpoint of this run found, starting fresh")
    return path


def runs_root_of(run_dir: Path) -> Path | None:
    """Where trainer.resume=auto looks for earlier runs of the same command: Hydra's outputs/ in its
    outputs/<date>/<time> layout; None for a run folder chosen by hand."""
    return run_dir.parent.parent if run_dir.parent.parent.name == "outputs" else None


def resume_match(resolved: dict) -> dict:
    """What an earlier run's checkpoint must record to be continued by trainer.resume=auto: the model and data
    config, and a distillation run's teacher."""
    match = {"model": resolved["model"], "data": resolved["data"]}
    if (resolved.get("distill") or {}).get("teacher"):  # a distillation run continues the one with its teacher
        match["distill"] = resolved["distill"]
    return match


def keep_resumed_width(
    cfg: DictConfig, trainer: TrainerSettings, run_dir: Path, dist: Distributed
) -> WidthChoice | None:
    """trainer.width_by_budget on a resumed run: the width of the checkpoint it continues (trainer.resume's file,
    or the one trainer.resume=auto finds at one of the widths), and its long_overrides where that checkpoint's run
    trained with them, written into the config with one line; no timing."""
    widths = trainer.width_by_budget.widths
    setting = trainer.resume or ("auto" if restart_count() is not None else None)
    if widths is None or not setting:
        return None
    overrides = trainer.width_by_budget.long_overrides if trainer.width_by_budget.long_epochs is not None else ()
    found = resumed_width(cfg, str(setting), run_dir, widths, overrides) if dist.is_main else None
    found = dist.broadcast(found)
    if found is None:
        return None
    width, path, long = found
    set_width(cfg, width)
    if long:
        apply_long_overrides(cfg, overrides)
    also = f"; with its long_overrides, as that run trained ({' '.join(overrides)})" if long else ""
    log.info("trainer.width_by_budget: %d wide, the width of %s, which this run continues%s", width, path, also)
    return WidthChoice(width, f"the width of {path}, which this run continues", long=long if overrides else None)


def resumed_width(
    cfg: DictConfig, setting: str, run_dir: Path, widths: tuple[int, ...], overrides: tuple[str, ...]
) -> tuple[int, str, bool] | None:
    """(width, checkpoint, whether its run trained with `overrides`) of the checkpoint trainer.resume=`setting`
    continues, where its width is one of `widths`; None where there is none yet (or it cannot be read: resuming
    it says why)."""
    path = run_dir / "checkpoints" / "last.pt" if setting == "auto" else Path(setting)
    if path.exists():
        try:
            saved = checkpoint_config(path)
        except CheckpointError:
            return None
        width = (saved.get("model") or {}).get("embed_dim")
        if width not in widths:
            return None
        return width, str(path), bool(overrides) and holds_overrides(cfg, saved, overrides)
    if setting != "auto":
        return None
    for width in sorted(widths, reverse=True):
        for long in (True, False) if overrides else (False,):
            trial = copy.deepcopy(cfg)
            set_width(trial, width)
            if long:
                apply_long_overrides(trial, overrides)
            path = find_resume_checkpoint(run_dir, runs_root_of(run_dir), resume_match(recorded_config(trial)))
            if path is not None:
                return width, str(path), long
    return None


def holds_overrides(cfg: DictConfig, saved: dict, overrides: tuple[str, ...]) -> bool:
    """Whether the checkpoint's config `saved` has every key `overrides` set at the value they give it."""
    trial = copy.deepcopy(cfg)
    apply_long_overrides(trial, overrides)
    saved_cfg = OmegaConf.create(saved)
    for group, edit in long_edits(overrides):
        key = f"{group}.{edit.key}"
        if OmegaConf.select(trial, key, default=None) != OmegaConf.select(saved_cfg, key, default=None):
            return False
    return True
