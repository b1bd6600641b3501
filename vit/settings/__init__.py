"""The typed settings of the config groups, one frozen dataclass per group (vit/settings/schema.py says how a
declaration gives the defaults, the checks and the typed object). `SETTINGS` maps each group to its class; the
model group's settings are the model families' own config classes (vit/models), stored the same way; the root's
own keys (`task`, `optimized_metric`) are `RunSettings`."""

from vit.settings.distill import DistillSettings
from vit.settings.mae import MaeSettings
from vit.settings.optim import OptimSettings
from vit.settings.run import RunSettings
from vit.settings.sched import SchedSettings
from vit.settings.schema import Settings, knob
from vit.settings.search import SearchSettings
from vit.settings.trainer import ProgressiveResize, TrainerSettings, WidthByBudget

SETTINGS: dict[str, type[Settings]] = {
    "optim": OptimSettings,
    "sched": SchedSettings,
    "distill": DistillSettings,
    "mae": MaeSettings,
    "trainer": TrainerSettings,
    "search": SearchSettings,
}

__all__ = [
    "SETTINGS",
    "DistillSettings",
    "MaeSettings",
    "OptimSettings",
    "ProgressiveResize",
    "RunSettings",
    "SchedSettings",
    "SearchSettings",
    "Settings",
    "TrainerSettings",
    "WidthByBudget",
    "knob",
]
