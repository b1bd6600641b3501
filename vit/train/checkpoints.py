"""The run's checkpoints: what they hold, what is written when, and how a resumed run takes up where one stopped.

A checkpoint is a dict of tensors and plain containers, written atomically (vit/records/files.py) and read with
`weights_only=True` (vit/weights/read.py):
    model, optimizer, scheduler, scaler, ema: state dicts (ema/scaler may be None)
    rng: torch/CUDA/numpy/python generator states
    epoch (finished epochs), step (optimizer steps), best_score (`RunProgress` below),
    class_to_idx, config (resolved, plain),
    history (one dict of metrics per finished epoch)
    budget: trainer.budget's plan and measured epoch-end costs (vit/train/budget.py), None without a budget

checkpoints/last.pt after every epoch and at a stop inside an epoch (a signal: it then holds the batches done
and every rank's RNG, so the resumed run goes on with the next batch); best.pt when the validation score
improves (top-1; with task=mae, the reconstruction loss falls); with `trainer.keep_last=N` also epoch_0001.pt,
epoch_0002.pt, ... of which the newest N are kept (an older one is removed only after the newer one and last.pt
are written in full). Every file holds the same `training_state`, so any of them resumes a run, seeds a
fine-tuning, or goes into vit-average."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vit.records.files import atomic_save
from vit.runtime.sharding import is_sharded
from vit.train.sharded import remove_unnamed, resume_sharded, save_sharded
from vit.train.step_parts import StepParts, StepState
from vit.weights.files import WeightsFileError, first_line, read_weights_file
from vit.weights.read import CheckpointError, load_checkpoint
from vit.weights.sharded import TRAINING_FILE, is_sharded_checkpoint


def training_state(
    *, model, optimizer, scheduler, scaler, ema, epoch: int, step: int, best_score: float, class_to_idx, config, history
) -> dict:
    """Everything a resumed run needs to continue exactly where this one is (the layout in the module doc)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": ema.module.state_dict() if ema is not None else None,
        "rng": rng_state(),
        "epoch": epoch,
        "step": step,
        "best_score": best_score,
        "class_to_idx": dict(class_to_idx),
        "config": config,
        "history": list(history),
    }


def sharded_rest(scheduler, epoch: int, step: int, best_score: float, class_to_idx) -> dict:
    """What a sharded checkpoint's training.pt holds besides config, history and budget: `training_state` less the
    tensors DCP writes (model, optimizer, EMA) and the scaler (fp16 does not run sharded)."""
    return {
        "scheduler": scheduler.state_dict(),
        "scaler": None,
        "rng": rng_state(),
        "epoch": epoch,
        "step": step,
        "best_score": best_score,
        "class_to_idx": dict(class_to_idx),
    }


def restore_training_state(
    state: dict,
    *,
    model,
    optimizer,
    scheduler,
    scaler,
    ema,
    path,
    class_to_idx: Mapping[str, int] | None = None,
    optim_name: str,
) -> None:
    """Load a `training_state` dict into freshly built objects, after `check_resumable`'s checks. A sharded
    checkpoint read whole (its optimizer state keyed by parameter name) loads into an unsharded run too."""
    weights = state["model"]
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"checkpoint {str(path)!r}: its 'model' entry is not a state dict of tensors")
    check_resumable(state, weights, model, path, class_to_idx, optim_name)
    model.load_state_dict(weights)
    with state_that_does_not_fit(path):
        if state.get("optimizer_keys") == "names":  # vit/train/sharded.py: keyed by name, not by position
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, state["optimizer"])
        else:
            optimizer.load_state_dict(state["optimizer"])
    restore_rest(state, scheduler=scheduler, scaler=scaler, path=path)
    if ema is not None and state.get("ema"):
        ema.module.load_state_dict(state["ema"])


def restore_rest(state: dict, *, scheduler, scaler, path) -> None:
    """What a checkpoint holds besides the weights and the optimizer: the schedule, the fp16 scale, the RNG."""
    with state_that_does_not_fit(path):
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if state.get("rng"):
        set_rng_state(state["rng"])


@contextlib.contextmanager
def state_that_does_not_fit(path):
    """An optimizer or schedule state the run's objects refuse: one CheckpointError naming the file."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its optimizer or schedule state does not fit this run: {first_line(err)}"
        ) from err


def check_resumable(state: dict, weights: Mapping, model, path, class_to_idx, optim_name: str) -> None:
    """Before any weight is loaded: a model that does not fit `weights` (tensors, or meta tensors of the saved
    shapes) names the file and the first differing keys and shapes (another model, another class count), a
    checkpoint trained on other classes than the data's `class_to_idx` (other names, or the same names in another
    order) names the first index where they part, and one trained with another `optim.name` than the run's
    `optim_name` names both."""
    from vit.weights.fit import describe_mismatch

    missing = [key for key in ("optimizer", "scheduler") if not state.get(key)]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds no {' or '.join(missing)} state: a resume needs a last.pt or best.pt "
            "written by this trainer (a file of weights alone cannot continue a training)"
        )
    saved_config = state.get("config") or {}
    problem = describe_mismatch(weights, model)
    if problem is not None:
        saved = saved_config.get("model", {}).get("name", "another model")
        raise CheckpointError(
            f"checkpoint {str(path)!r} ({saved}) does not fit the configured {type(model).__name__}: {problem}"
        )
    saved_classes = state.get("class_to_idx")
    if saved_classes and class_to_idx:  # older checkpoints, and data without class names, have no map to compare
        difference = class_difference(saved_classes, class_to_idx, path)
        if difference is not None:
            same = set(saved_classes) == set(class_to_idx)
            trained_on = f"the same {len(saved_classes)} classes in another order" if same else "other classes"
            raise CheckpointError(
                f"checkpoint {str(path)!r} was trained on {trained_on} than the data's: {difference}; a resume needs "
                "the data it was trained on"
            )
    saved_optim = (saved_config.get("optim") or {}).get("name")
    if saved_optim and str(saved_optim) != str(optim_name):
        # The other optimizer's state (momentum buffers for AdamW's moments) would fail at the first step, or load
        # and mean something else (timm's muon and adamuon, sgd and momentum share a class).
        raise CheckpointError(
            f"checkpoint {str(path)!r} was trained with optim.name={saved_optim}, this run uses "
            f"optim.name={optim_name}: resume with optim.name={saved_optim}"
        )


def class_difference(saved: Mapping, data: Mapping[str, int], path) -> str | None:
    """The first index at which the checkpoint's class map and the data's name different classes ("index 3 is
    'cat' in the checkpoint but 'dog' in the data"), or None where they agree."""
    try:
        saved_names = {int(index): name for name, index in saved.items()}
    except (AttributeError, TypeError, ValueError):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its class_to_idx is not a map of class names to indices"
        ) from None
    data_names = {index: name for name, index in data.items()}
    for index in sorted(saved_names.keys() | data_names.keys()):
        ours, theirs = saved_names.get(index), data_names.get(index)
        if ours != theirs:
            return (
                f"index {index} is {'unused' if ours is None else repr(ours)} in the checkpoint but "
                f"{'unused' if theirs is None else repr(theirs)} in the data"
            )
    return None


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(gauss)))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def find_resume_checkpoint(run_dir: Path, runs_root: Path | None, config_match: dict | None) -> Path | None:
    """`trainer.resume=auto`: this run's last.pt, else the newest last.pt under `runs_root` whose saved
    model and data config equal this run's (so rerunning the same command continues it)."""
    own = run_dir / "checkpoints" / "last.pt"
    if own.exists():  # a file, or a link to a sharded checkpoint's folder
        return own
    if runs_root is None or not runs_root.is_dir():
        return None
    candidates = sorted(runs_root.glob("**/checkpoints/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        if config_match is None:
            return candidate
        try:
            saved = checkpoint_config(candidate)
        except CheckpointError:
            continue
        if all(saved.get(k) == v for k, v in config_match.items()):
            return candidate
    return None


def checkpoint_config(path: Path) -> dict:
    """The config a checkpoint records (of a sharded one, read from its training.pt alone)."""
    source = path / TRAINING_FILE if is_sharded_checkpoint(path) else path
    try:
        state = read_weights_file(source, "checkpoint")
    except WeightsFileError as err:
        raise CheckpointError(str(err)) from None
    return (state.get("config") if isinstance(state, dict) else None) or {}


log = logging.getLogger("vit.train")

EPOCH_FILE = re.compile(r"epoch_(\d+)\.pt")


@dataclass
class RunProgress:
    """Where the run stands between epochs: what the epoch loop reads and changes, and checkpoints record."""

    wall_start: float  # time.perf_counter() reading the run's clock counts from (earlier processes' time included)
    start_epoch: int = 0  # the first epoch this process trains
    # The best validation score so far: top-1 (classification) or minus the reconstruction loss (task=mae).
    best_score: float = -math.inf
    history: list[dict] = field(default_factory=list)  # one record per finished epoch (vit/train/metrics.py)
    skip_batches: int = 0  # batches of `start_epoch` trained before a stop inside it
    resume_rng: dict | None = None  # this rank's RNG at that stop
    budget_state: dict | None = None  # the budget's plan in the checkpoint resumed from (vit/train/budget.py)
    startup_s: float = 0.0  # this process's start-up before the run, inside wall_start's count (not saved)

    def elapsed(self) -> float:
        return time.perf_counter() - self.wall_start

    def batches_done_before(self, epoch: int) -> int:
        """Batches of `epoch` trained by an earlier process (a stop inside the epoch this one resumes)."""
        return self.skip_batches if epoch == self.start_epoch else 0


def training_parts(step_parts: StepParts) -> dict:
    """What a checkpoint saves and a resume loads, by `training_state`'s names."""
    return dict(
        model=step_parts.model,
        optimizer=step_parts.optimizer,
        scheduler=step_parts.scheduler,
        scaler=step_parts.scaler,
        ema=step_parts.ema,
    )


class Checkpointer:
    """Writes the run's checkpoints: one file each, by rank 0 alone; under trainer.strategy=fsdp one folder each,
    every rank writing its shards (vit/train/sharded.py). `enabled=False` writes nothing."""

    def __init__(
        self, folder: Path, *, enabled: bool, keep_last: int | None, step_parts: StepParts, class_to_idx, config
    ) -> None:
        self.folder, self.keep_last = folder, keep_last
        self.sharded = is_sharded(step_parts.model)
        self.main = step_parts.dist.is_main
        self.enabled = enabled and (self.main or self.sharded)  # every rank takes part in a sharded write
        self.parts, self.step_parts = training_parts(step_parts), step_parts
        self.class_to_idx, self.config = class_to_idx, config

    def state(self, epoch: int, step: int, progress: RunProgress) -> dict:
        """The checkpoint's dict; a sharded run's without the tensors of model, optimizer and EMA (DCP's part)."""
        if self.sharded:
            state = sharded_rest(self.parts["scheduler"], epoch, step, progress.best_score, self.class_to_idx)
            state.update(config=self.config, history=list(progress.history))
        else:
            state = training_state(
                **self.parts,
                epoch=epoch,
                step=step,
                best_score=progress.best_score,
                class_to_idx=self.class_to_idx,
                config=self.config,
                history=progress.history,
            )
        state["elapsed_s"] = progress.elapsed()
        budget = self.step_parts.budget
        state["budget"] = budget.state_dict() if budget is not None else None
        return state

    def save_epoch(self, epochs_done: int, step: int, progress: RunProgress, is_best: bool) -> None:
        """After an epoch (`epochs_done` counted from 1): last.pt, best.pt if `is_best`, the kept epoch files."""
        if not self.enabled:
            return
        state = self.state(epochs_done, step, progress)
        last = self.folder / "last.pt"
        epoch_file = self.folder / f"epoch_{epochs_done:04d}.pt"
        if self.sharded:
            names = ["last.pt", *([epoch_file.name] if self.keep_last else []), *(["best.pt"] if is_best else [])]
            save_sharded(self.folder, self.step_parts.dist, self.parts, state, step, names)
        elif self.keep_last:
            atomic_save(state, epoch_file)
            link_or_save(epoch_file, last, state)  # the same bytes: a second name, not a second write
        else:
            atomic_save(state, last)
        if is_best and not self.sharded:
            link_or_save(last, self.folder / "best.pt", state)
        if self.keep_last and self.main:
            self.remove_old_epochs()

    def save_stop(self, epoch: int, step: int, progress: RunProgress, batches_done: int, rng_ranks: list) -> Path:
        """A stop inside epoch `epoch` (from 0) after `batches_done` of its batches: last.pt says so."""
        last = self.folder / "last.pt"
        if self.enabled:
            state = self.state(epoch, step, progress)
            state.update(batches_into_epoch=batches_done, rng=rng_ranks[0], rng_ranks=rng_ranks)
            if self.sharded:
                save_sharded(self.folder, self.step_parts.dist, self.parts, state, step, ["last.pt"])
            else:
                atomic_save(state, last)
        return last

    def remove_old_epochs(self) -> None:
        """Keep the newest `keep_last` epoch files (by epoch number); last.pt and best.pt are other names."""
        numbered = sorted(
            (int(match.group(1)), path)
            for path in self.folder.glob("epoch_*.pt")
            if (match := EPOCH_FILE.fullmatch(path.name))
        )
        for _, path in numbered[: max(0, len(numbered) - self.keep_last)]:
            path.unlink(missing_ok=True)
        if self.sharded:
            remove_unnamed(self.folder)  # the folders only the removed epoch files named


def link_or_save(source: Path, target: Path, state: dict) -> None:
    """Give the file `source` the name `target` too (atomically replacing it); where the file system has no hard
    links, write `state` to `target` instead."""
    temporary = target.with_name(f".{target.name}.link")
    try:
        temporary.unlink(missing_ok=True)
        os.link(source, temporary)
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)
        atomic_save(state, target)


def resume(
    path: Path, step_parts: StepParts, state: StepState, class_to_idx, wall_start: float, optim_name: str
) -> RunProgress:
    """Load the checkpoint at `path` into the model, optimizer, schedule, scaler and EMA; return where the run
    stands. The time of the earlier processes counts too (not the pause between them): the run's clock goes on
    from the moment the checkpoint was written (inside an epoch too), else from the last finished epoch."""
    parts = training_parts(step_parts)
    if is_sharded(step_parts.model):  # each rank reads its own shards (vit/train/sharded.py)

        def check(rest: dict, shapes: dict) -> None:
            check_resumable(rest, shapes, step_parts.model, path, class_to_idx, optim_name)

        saved = resume_sharded(path, parts, check)
        restore_rest(saved, scheduler=step_parts.scheduler, scaler=step_parts.scaler, path=path)
    else:
        saved = load_checkpoint(path)
        restore_training_state(saved, path=path, class_to_idx=class_to_idx, optim_name=optim_name, **parts)
    history = list(saved.get("history", []))
    elapsed = float(saved.get("elapsed_s") or (history[-1] if history else {}).get("elapsed_s") or 0.0)
    rng_ranks = saved.get("rng_ranks") or []
    dist = step_parts.dist
    progress = RunProgress(
        wall_start=wall_start - elapsed,
        start_epoch=int(saved["epoch"]),
        best_score=float(saved.get("best_score", saved.get("best_top1", -math.inf))),  # older files: best_top1
        history=history,
        skip_batches=int(saved.get("batches_into_epoch") or 0),
        resume_rng=rng_ranks[dist.rank] if len(rng_ranks) == dist.world_size else saved.get("rng"),
        budget_state=saved.get("budget"),
    )
    state.step = int(saved["step"])
    if progress.skip_batches:  # stopped inside an epoch: it goes on with the next batch of that epoch
        where = f"in epoch {progress.start_epoch + 1} after its first {progress.skip_batches} batches"
    else:
        where = f"after epoch {progress.start_epoch}"
    log.info("resumed from %s %s (step %d)", path, where, state.step)
    return progress
