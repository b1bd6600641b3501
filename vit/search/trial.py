"""A run as one trial of an Optuna study: the score a search optimises, and the reports that let its pruner stop
a trial early.

The search itself (which settings each trial gets, how many trials, the study's database) is the sweeper's
(vit/search/sweeper.py). The sweeper tells each run its study and trial through `search.storage`, `search.study` and
`search.trial`; the run reports its score after every evaluation through Optuna's storage API and asks the
pruner (`search.pruner`) whether to go on. Reporting from inside the run, rather than from the sweeper, is what
lets a trial stop after epoch k: Hydra's sweepers only see a job once it has returned.
"""

from __future__ import annotations

import logging
import math
import typing

from omegaconf import DictConfig

from vit.errors import ConfigError
from vit.settings import RunSettings
from vit.settings.run import Metric
from vit.tasks import task_of

log = logging.getLogger("vit.train")


def _metric_parts(name: str) -> tuple[str, str, str]:
    """`val_ema_top1` -> ("val_ema", "top1", "maximize"): the result it is read from, its key there, and whether a
    search maximises or minimises it."""
    result, key = name.rsplit("_", 1)
    return result, key, "minimize" if key == "loss" else "maximize"


# The scores a run can return to a sweeper (RunSettings.optimized_metric's choices, vit/settings/run.py), each
# measured on the validation split: name -> (result, key, direction).
METRICS = {name: _metric_parts(name) for name in typing.get_args(Metric)}


def optimized_metric(cfg: DictConfig) -> str:
    """`optimized_metric`, checked (its choices with the types): null is the task's score (val_top1; val_loss with
    task=mae, which has no top-1)."""
    name = RunSettings.of(cfg).optimized_metric
    task = task_of(cfg)
    if name is None:
        return task.score
    result, key, _ = METRICS[name]
    if not task.classifier and key != "loss":
        raise ConfigError(f"optimized_metric={name} needs labels; task={task.name} measures only the loss (val_loss)")
    if result == "val_ema" and not cfg.trainer.ema:
        raise ConfigError(f"optimized_metric={name} is the EMA's score, but trainer.ema=false")
    return name


def metric_direction(name: str) -> str:
    """'maximize' or 'minimize' for a name of METRICS (what `optimized_metric` returns)."""
    return METRICS[name][2]


def metric_value(name: str, val: dict | None, val_ema: dict | None) -> float | None:
    """The score `name` in an epoch's evaluation results (None in an epoch without an evaluation)."""
    result, key, _ = METRICS[name]
    chosen = val if result == "val" else val_ema
    return None if chosen is None or chosen.get(key) is None else float(chosen[key])


def check_search(cfg: DictConfig) -> None:
    """The `search` node: all three of storage, study and trial, or none (a plain run)."""
    optimized_metric(cfg)
    search = cfg.get("search")
    if search is None:
        return
    given = [k for k in ("storage", "study", "trial") if search.get(k) is not None]
    if given and len(given) < 3:
        missing = sorted({"storage", "study", "trial"} - set(given))
        raise ConfigError(
            f"search.{given[0]} is set but search.{missing[0]} is not: a trial needs its study's storage, name and "
            "trial number (the Optuna sweeper sets all three)"
        )


class TrialInterrupted(BaseException):  # a BaseException, as KeyboardInterrupt is: not an error of the run
    """A trial's run was stopped by a signal (Ctrl-C, SIGTERM), after writing its last.pt: not an outcome of its
    settings. It passes through Hydra's job (which keeps Exceptions only) and Optuna's loop to the sweeper, which
    queues the trial again and ends the search; the same command continues it."""


def is_trial(cfg: DictConfig) -> bool:
    search = cfg.get("search")
    return search is not None and search.get("trial") is not None


class TrialReport:
    """The study's view of this run: `report(epoch, val, val_ema)` after each evaluation returns True when the
    pruner says the trial should stop. Build with `TrialReport.of(cfg, run_dir, epochs)`, None for a run that is
    not a trial."""

    def __init__(self, trial, metric: str, pruner_name: str):
        self.trial = trial  # optuna.Trial, bound to the study's storage
        self.metric = metric
        self.pruner_name = pruner_name
        self.pruned_after_epoch: int | None = None

    @classmethod
    def of(cls, cfg: DictConfig, run_dir, epochs: int) -> TrialReport | None:
        """The trial `cfg.search` names, with its run folder and epochs asked recorded in the study (user
        attributes: a summary of the search reads them from the database alone)."""
        report = cls._load(cfg)
        if report is not None:
            report.trial.set_user_attr("run_dir", str(run_dir))
            report.trial.set_user_attr("epochs", epochs)
        return report

    @classmethod
    def _load(cls, cfg: DictConfig) -> TrialReport | None:
        if not is_trial(cfg):
            return None
        search = cfg.search
        try:
            import optuna
        except ImportError:
            raise ConfigError("search.trial is set, which needs optuna: pip install -e '.[search]'") from None
        from hydra.utils import instantiate

        pruner = instantiate(search.pruner) if search.get("pruner") is not None else optuna.pruners.NopPruner()
        storage = optuna.storages.get_storage(str(search.storage))
        try:
            study = optuna.load_study(study_name=str(search.study), storage=storage, pruner=pruner)
            study_id = storage.get_study_id_from_name(str(search.study))
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(search.trial))
        except KeyError as err:
            where = f"search.study={search.study} search.trial={search.trial}"
            raise ConfigError(f"{where}: no such trial in the study ({err})") from None
        return cls(optuna.trial.Trial(study, trial_id), optimized_metric(cfg), type(pruner).__name__)

    def report(self, epoch: int, val: dict | None, val_ema: dict | None, last: bool) -> bool:
        """Record the score of epoch `epoch` (counted from 1) as the trial's intermediate value at that step;
        True if the pruner stops the trial here. A non-finite score is not reported (Optuna refuses it); the last
        epoch is reported but not pruned (nothing would be saved, and the trial has its final score)."""
        value = metric_value(self.metric, val, val_ema)
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(value, step=epoch)
        if last or not self.trial.should_prune():
            return False
        self.pruned_after_epoch = epoch
        log.info(
            "trial %d pruned after epoch %d: %s %.4f is below the bar of the study's %s; last.pt keeps its weights",
            self.trial.number,
            epoch,
            self.metric,
            value,
            self.pruner_name,
        )
        return True

    def record(self) -> dict:
        """metrics.json's `search` entry."""
        return {
            "study": self.trial.study.study_name,
            "trial": self.trial.number,
            "metric": self.metric,
            "pruned_after_epoch": self.pruned_after_epoch,
        }
