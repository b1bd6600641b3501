"""The config's top-level keys, `task` and `optimized_metric`: what a run trains for and the score it returns to a
Hydra sweeper. They sit at the root of the composed config, not in a group: `task=mae`, `optimized_metric=val_loss`
(configs/config.yaml starts from these defaults, stored as `schema/run`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vit.settings.schema import Settings, knob

# The scores a run can return to a sweeper, each measured on the validation split (the holdout that data.holdout
# sets aside), never on the test split, which a search must not see: `<result>_<key>`, the result `val` (the
# weights as trained) or `val_ema` (their EMA), the key top1, top5 or loss (vit/search/trial.py reads them so).
Metric = Literal["val_top1", "val_top5", "val_loss", "val_ema_top1", "val_ema_top5", "val_ema_loss"]


@dataclass(frozen=True)
class RunSettings(Settings):
    group: ClassVar[str] = ""  # the root of the config

    # classify (the data's labels; a teacher or a distillation token makes it distillation) | mae (masked-autoencoder
    # pretraining, no labels: docs/MAE.md); vit/tasks/ holds one Task per kind
    task: Literal["classify", "mae"] = knob("classify")
    # null: the task's own score (val_top1; val_loss with task=mae, which has no top-1). A search maximises or
    # minimises it as its name says.
    optimized_metric: Metric | None = knob(None)

    @classmethod
    def of(cls, node):
        """The run's settings read from the whole composed config (or a checkpoint's dict of it): only the root's
        own keys, the groups left to their classes."""
        if isinstance(node, cls):
            return node
        return super().of({name: node[name] for name in cls.kinds() if name in node})
