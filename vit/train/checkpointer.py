"""The run's checkpoints: what is written when, and how a resumed run takes up where one stopped.

checkpoints/last.pt after every epoch and at a stop inside an epoch (a signal: it then holds the batches done
and every rank's RNG, so the resumed run goes on with the next batch); best.pt when the validation score
improves (top-1; with task=mae, the reconstruction loss falls); with `trainer.keep_last=N` also epoch_0001.pt,
epoch_0002.pt, ... of which the newest N are kept (an older one is removed only after the newer one and last.pt
are written in full). Every file holds the same
`training_state` (vit/train/checkpoint.py), so any of them resumes a run, seeds a fine-tuning, or goes into
scripts/average_checkpoints.py."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from vit.train.checkpoint import atomic_save, load_checkpoint, restore_training_state, training_state
from vit.train.loop import StepSettings, StepState

log = logging.getLogger("vit.train")

EPOCH_FILE = re.compile(r"epoch_(\d+)\.pt")


@dataclass
class Progress:
    """Where the run stands between epochs: what the epoch loop reads and changes, and checkpoints record."""

    wall_start: float  # time.perf_counter() reading the run's clock counts from (earlier processes' time included)
    start_epoch: int = 0  # the first epoch this process trains
    # The best validation score so far: top-1 (classification) or minus the reconstruction loss (task=mae).
    best_score: float = -math.inf
    history: list[dict] = field(default_factory=list)  # one record per finished epoch (vit/train/results.py)
    skip_batches: int = 0  # batches of `start_epoch` trained before a stop inside it
    resume_rng: dict | None = None  # this rank's RNG at that stop

    def elapsed(self) -> float:
        return time.perf_counter() - self.wall_start

    def batches_done_before(self, epoch: int) -> int:
        """Batches of `epoch` trained by an earlier process (a stop inside the epoch this one resumes)."""
        return self.skip_batches if epoch == self.start_epoch else 0


def training_parts(settings: StepSettings) -> dict:
    """What a checkpoint saves and a resume loads, by `training_state`'s names."""
    return dict(
        model=settings.model,
        optimizer=settings.optimizer,
        scheduler=settings.scheduler,
        scaler=settings.scaler,
        ema=settings.ema,
    )


class Checkpointer:
    """Writes the run's checkpoints (rank 0 only; `enabled=False` writes nothing)."""

    def __init__(self, folder: Path, *, enabled: bool, keep_last: int | None, settings: StepSettings, setup) -> None:
        self.folder, self.enabled, self.keep_last = folder, enabled, keep_last
        self.parts = training_parts(settings)
        self.class_to_idx, self.config = setup.bundle.class_to_idx, setup.resolved

    def state(self, epoch: int, step: int, progress: Progress) -> dict:
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
        return state

    def save_epoch(self, epochs_done: int, step: int, progress: Progress, is_best: bool) -> None:
        """After an epoch (`epochs_done` counted from 1): last.pt, best.pt if `is_best`, the kept epoch files."""
        if not self.enabled:
            return
        state = self.state(epochs_done, step, progress)
        last = self.folder / "last.pt"
        if self.keep_last:
            epoch_file = self.folder / f"epoch_{epochs_done:04d}.pt"
            atomic_save(state, epoch_file)
            link_or_save(epoch_file, last, state)  # the same bytes: a second name, not a second write
        else:
            atomic_save(state, last)
        if is_best:
            link_or_save(last, self.folder / "best.pt", state)
        if self.keep_last:
            self.remove_old_epochs()

    def save_stop(self, epoch: int, step: int, progress: Progress, batches_done: int, rng_ranks: list) -> Path:
        """A stop inside epoch `epoch` (from 0) after `batches_done` of its batches: last.pt says so."""
        last = self.folder / "last.pt"
        if self.enabled:
            state = self.state(epoch, step, progress)
            state.update(batches_into_epoch=batches_done, rng=rng_ranks[0], rng_ranks=rng_ranks)
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


def resume(path: Path, settings: StepSettings, state: StepState, setup, wall_start: float) -> Progress:
    """Load the checkpoint at `path` into the model, optimizer, schedule, scaler and EMA; return where the run
    stands. The time of the earlier processes counts too (not the pause between them): the run's clock goes on
    from the moment the checkpoint was written (inside an epoch too), else from the last finished epoch."""
    saved = load_checkpoint(path)
    restore_training_state(saved, path=path, class_to_idx=setup.bundle.class_to_idx, **training_parts(settings))
    history = list(saved.get("history", []))
    elapsed = float(saved.get("elapsed_s") or (history[-1] if history else {}).get("elapsed_s") or 0.0)
    rng_ranks = saved.get("rng_ranks") or []
    dist = settings.dist
    progress = Progress(
        wall_start=wall_start - elapsed,
        start_epoch=int(saved["epoch"]),
        best_score=float(saved.get("best_score", saved.get("best_top1", -math.inf))),  # older files: best_top1
        history=history,
        skip_batches=int(saved.get("batches_into_epoch") or 0),
        resume_rng=rng_ranks[dist.rank] if len(rng_ranks) == dist.world_size else saved.get("rng"),
    )
    state.step = int(saved["step"])
    if progress.skip_batches:  # stopped inside an epoch: it goes on with the next batch of that epoch
        where = f"in epoch {progress.start_epoch + 1} after its first {progress.skip_batches} batches"
    else:
        where = f"after epoch {progress.start_epoch}"
    log.info("resumed from %s %s (step %d)", path, where, state.step)
    return progress
