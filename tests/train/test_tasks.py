"""The tasks (vit/tasks/): the config picks one, each owns its loss, evaluation and score, and nothing
outside the task modules asks which task a run is."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from trainer_utils import compose_config

from vit.tasks import TASKS, task_of
from vit.tasks.classify import Distill

VIT = Path(__file__).resolve().parents[2] / "vit"


@pytest.mark.parametrize(
    ("overrides", "name", "score", "classifier"),
    [
        ([], "classify", "val_top1", True),
        (["model.distill_token=true"], "distill", "val_top1", True),
        (["distill.type=hard", "distill.teacher=timm:resnet18"], "distill", "val_top1", True),
        (["task=mae"], "mae", "val_loss", False),
    ],
)
def test_the_config_picks_the_task(overrides, name, score, classifier):
    task = task_of(compose_config(["data=synthetic", *overrides]))
    assert (task.name, task.score, task.classifier) == (name, score, classifier)
    assert isinstance(task, TASKS[name])


def test_a_checkpoints_plain_dict_config_picks_the_same_task():
    assert task_of({"task": "mae", "model": {}}).name == "mae"
    assert task_of({"model": {"distill_token": True}}).name == "distill"
    assert task_of({}).name == "classify"


class Recorder(nn.Module):
    """A model whose output is known: logits of the batch's mean, and for MAE a (loss, pred, mask) triple."""

    def __init__(self, mae: bool = False) -> None:
        super().__init__()
        self.mae = mae

    def forward(self, images):
        if self.mae:
            return images.mean() * 2, None, None
        return images.flatten(1)[:, :3]  # (B, 3) logits


def test_each_task_computes_its_own_loss():
    images, targets = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    criterion = nn.CrossEntropyLoss()
    classify = TASKS["classify"]().loss(Recorder(), images, targets, criterion)
    assert classify == criterion(images.flatten(1)[:, :3], targets)
    mae = TASKS["mae"]().loss(Recorder(mae=True), images, targets, criterion)
    assert mae == images.mean() * 2  # the model's own loss; no label read

    class Distiller:
        def loss(self, images, outputs, targets):
            return outputs.sum() + 100.0

        def log_values(self):
            return {"train/loss_distill": 1.0}

    task = Distill().attach(Distiller())
    assert task.loss(Recorder(), images, targets, criterion) == images.flatten(1)[:, :3].sum() + 100.0
    assert task.log_values() == {"train/loss_distill": 1.0}


def test_no_module_outside_the_tasks_asks_which_task_a_run_is():
    """The loop, the epochs and the tools call the task's methods; a branch on the task's name or a flag for it
    would bring back the special cases the task objects hold."""
    asking = re.compile(r"is_mae|masked_pretraining|task\W*==\W*\"mae\"|get\(\"task\"[^)]*\)\s*==")
    found = [
        f"{p.relative_to(VIT)}:{i}"
        for p in VIT.rglob("*.py")
        if "tasks" not in p.parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert not found, found
