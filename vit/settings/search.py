"""`search.*`: a run as one trial of an Optuna search (vit/search/trial.py; docs/SEARCH.md). The sweeper
(configs/hydra/sweeper/optuna.yaml) sets storage, study and trial for each run, which then reports its score to the
study after every evaluation; the pruner decides whether it goes on. All null: a plain run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vit.settings.schema import Settings, knob


@dataclass(frozen=True)
class SearchSettings(Settings):
    group: ClassVar[str] = "search"

    storage: str | None = knob(None)  # the study's database URL
    study: str | None = knob(None)  # the study's name
    trial: int | None = knob(None, low=0, why="this run's trial number in the study")  # null: no study
    # an Optuna pruner ({_target_: optuna.pruners.MedianPruner, ...}); null: no trial stops early
    pruner: dict | None = knob(None)
