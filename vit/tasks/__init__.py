"""What a run trains for: one `Task` object per kind, which owns what differs between them (its model, its loss,
its evaluation and score, its config checks, what it draws). The trainer's loop, its epochs and its end call the
task; none of them asks which task it is.

- `classify`: `task=classify` (the default). A classifier; the loss is the data's criterion on the labels (with
  Mixup and label smoothing); the score val_top1.
- `distill`: `task=classify` with a teacher (`distill.type` hard or soft) or `model.distill_token=true`. A
  classifier; the loss is `Distiller.loss` (vit/train/distill.py), the labels' term and the teacher's; val_top1.
- `mae`: `task=mae`. The masked autoencoder around the encoder; the loss is the reconstruction of the hidden
  patches; the score val_loss (no labels are read).

Beside them, what every task's run shares and the trainer, the evaluation tool, export and the analysis read:
the model built from the config's `model` group (build.py), the evaluation pass (evaluation.py) and the figures a
run draws (figures.py). Above the models, the data, the weights, the runtime and the composed config (vit/config),
below the search, the trainer (vit/train, which runs the tasks) and the tools.

Adding a task: one module here with a `Task` subclass, one row in TASKS, its name among `task`'s choices
(vit/settings/run.py) and its config in configs/task/.
"""

from __future__ import annotations

from collections.abc import Mapping

from vit.settings import RunSettings
from vit.tasks.base import Task
from vit.tasks.classify import Classify, Distill
from vit.tasks.mae import MaskedAutoencoder

# The config's `task` choices (RunSettings), and distill: classify with a teacher or a distillation token.
TASKS: dict[str, type[Task]] = {"classify": Classify, "distill": Distill, "mae": MaskedAutoencoder}


def task_of(cfg: Mapping) -> Task:
    """The task a run's config (a DictConfig or the dict a checkpoint holds) trains for."""
    name = RunSettings.of(cfg).task
    teacher = ((cfg.get("distill") or {}).get("type") or "none") != "none"
    if name == "classify" and (teacher or (cfg.get("model") or {}).get("distill_token")):
        name = "distill"
    return TASKS[name]()


__all__ = ["TASKS", "Task", "task_of"]
