"""`trainer.sweep_budget`: one wall-clock budget for a whole sweep (`train.py -m`), spent on the same training in
every job.

A budget per job (`trainer.budget`) lets each job train as many steps as fit its own time: a slower setting, or a
job that shared the machine, trains less, and the sweep then compares training lengths as well as the knob. A
sweep's budget fits the length once:

- At the sweep's start (vit/cli/sweeps.py: describe_sweep) the jobs are counted as Hydra's basic sweeper expands
  them. A job's share is the budget over the jobs, times the jobs a SLURM array runs at once on machines of their
  own (joblib's and submitit_local's jobs share this machine, whose speed they split). SWEEP_FILE holds both.
- The first job to start claims the fitting (CLAIM_FILE, made exclusively). It trains under a budget of its share,
  plans whole epochs from its measured speed and keeps that first plan (vit/train/budget.py: RunShape.sweep_plan),
  and writes the epochs to LENGTH_FILE as soon as it has planned.
- Every other job trains those epochs as `trainer.epochs`, without a budget: the same images, and the same steps
  and schedule unless the sweep changes the batch. A job started while the fitting job measures (joblib runs jobs
  side by side) waits for its plan, some seconds.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from vit.errors import ConfigError
from vit.records.files import atomic_write_text
from vit.records.sweep_files import CLAIM_FILE, LENGTH_FILE, SWEEP_FILE
from vit.settings import TrainerSettings
from vit.settings.trainer import duration
from vit.train.callbacks import Callback

log = logging.getLogger("vit.train")

WAIT_S = 0.5  # how often a waiting job looks for the length


def sweep_folder() -> Path | None:
    """The folder of the sweep this process runs a job of; None outside `train.py -m`."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:
        return None
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(str(HydraConfig.get().sweep.dir))


@dataclass
class SweepFit:
    """This job fits the sweep's length: it holds CLAIM_FILE until it writes LENGTH_FILE."""

    folder: Path
    share_s: float
    published: bool = False

    def publish(self, epochs: int, steps: int, steps_per_epoch: int) -> None:
        record = {"epochs": epochs, "steps": steps, "steps_per_epoch": steps_per_epoch, "share_s": self.share_s}
        atomic_write_text(json.dumps(record, indent=1) + "\n", self.folder / LENGTH_FILE)
        self.published = True
        self.release()

    def release(self) -> None:
        (self.folder / CLAIM_FILE).unlink(missing_ok=True)


_HELD: list[SweepFit] = []  # claims this process holds: released when its run ends, published or not


def release_claims() -> None:
    """A run ends (trained, refused or diverged): a claim it holds goes, so that a job still waiting fits the
    length itself instead of waiting for a plan that will not come."""
    while _HELD:
        _HELD.pop().release()


def fit_to_sweep(trainer: TrainerSettings, world_size: int) -> tuple[TrainerSettings, SweepFit | None]:
    """trainer.sweep_budget: the settings this job trains with (a budget of its share while it fits the sweep's
    length, the fitted epochs and no budget once another job has), and this job's claim when it fits the length."""
    if trainer.sweep_budget is None:
        return trainer, None
    budget = duration(trainer.sweep_budget)
    folder = sweep_folder()
    if folder is None:
        log.info("trainer.sweep_budget=%s outside a sweep (-m): this run takes it as trainer.budget", budget)
        return replace(trainer, budget=trainer.sweep_budget), None
    if world_size > 1:
        raise ConfigError(f"trainer.sweep_budget={budget} under torchrun: give each job trainer.epochs instead")
    try:
        sweep = json.loads((folder / SWEEP_FILE).read_text())["sweep_budget"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"trainer.sweep_budget={budget} needs a sweep whose jobs can be counted before they start (Hydra's basic "
            f"sweeper, hydra/sweeper=basic); {folder / SWEEP_FILE} was not written. Give trainer.epochs instead"
        ) from None
    length = length_or_claim(folder, patience_s=sweep["share_s"] + 60)
    of = f"{duration(sweep['share_s'])} of {budget} for {sweep['jobs']} job{'s' * (sweep['jobs'] > 1)}"
    if length is None:
        fit = SweepFit(folder, sweep["share_s"])
        _HELD.append(fit)
        log.info(
            "trainer.sweep_budget=%s: this job fits the sweep's length, whole epochs in its share (%s); every other "
            "job then trains them",
            budget,
            of,
        )
        return replace(trainer, budget=sweep["share_s"], sweep_budget=None), fit
    log.info(
        "trainer.sweep_budget=%s: this job trains the sweep's %d epochs, fitted by its first job to its share (%s)",
        budget,
        length["epochs"],
        of,
    )
    return replace(trainer, epochs=int(length["epochs"])), None  # sweep_budget kept: the forecast names it


def length_or_claim(folder: Path, patience_s: float) -> dict | None:
    """LENGTH_FILE's record once a job has written it; None when this job made CLAIM_FILE (it fits the length).
    While another job holds the claim, wait for its plan, at most `patience_s`."""
    deadline, said = time.monotonic() + patience_s, False
    while True:
        try:
            return json.loads((folder / LENGTH_FILE).read_text())
        except (OSError, ValueError):
            pass
        try:
            os.close(os.open(folder / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return None
        except FileExistsError:
            pass
        if time.monotonic() > deadline:
            raise ConfigError(
                f"trainer.sweep_budget: {folder / CLAIM_FILE} says a job fits the sweep's length, and none has "
                f"written it in {patience_s:.0f} s; if that job is gone, delete the file and run this job again"
            )
        if not said:
            log.info("trainer.sweep_budget: waiting for the job that fits the sweep's length to plan it")
            said = True
        time.sleep(WAIT_S)


class PublishLength(Callback):
    """The fitting job's budget has planned (its first plan is kept): the epochs go to LENGTH_FILE at once, and at
    the run's end if it ended before a plan (a run shorter than the steps timed before planning)."""

    def __init__(self, fit: SweepFit, budget) -> None:
        self.fit, self.budget = fit, budget

    def on_step_end(self, step: int) -> None:
        if not self.fit.published and self.budget.plan is not None:
            self.publish()

    def on_train_end(self, run, metrics: dict) -> None:
        if not self.fit.published:
            self.publish()

    def publish(self) -> None:
        budget = self.budget
        self.fit.publish(budget.planned_epochs(), budget.total_steps(), budget.shape.steps_per_epoch)
