"""What the tools after training (vit-eval, vit-predict, vit-export) share and what they say: one rule for which
weights of a checkpoint they read (EMA or raw), a refusal to name classes with a classifier that was never trained
(and `features=true` for the pooled image features instead), advice that fits the tool, and output that holds the
answer only."""

import json

import pytest
import timm
import torch
from trainer_utils import make_tree

from vit.cli import evaluate as evaluate_tool

# A 3-class, 2-block ViT-Ti/16 of timm (224 px): small enough to build and run in a moment on a CPU.
TIMM_TINY = "vit_tiny_patch16_224"
FOREIGN = ["model=vit_tiny", "model.depth=2"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """root/{train,val}/{cat,dog,frog}/*: 4 training and 2 validation noise images a class."""
    return make_tree(tmp_path_factory.mktemp("tree"), per_class=4, size=24)


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A 3-class timm ViT-Ti/16 of 2 blocks saved as a plain state dict (its head included)."""
    torch.manual_seed(1)
    model = timm.create_model(TIMM_TINY, pretrained=False, num_classes=3, depth=2).eval()
    path = tmp_path_factory.mktemp("timm") / "vit_tiny.pth"
    torch.save(model.state_dict(), path)
    return path


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err, "nothing on stderr"
    return err[0]


# --- advice that fits the tool --------------------------------------------------------------------------------


def test_bad_images_in_an_evaluation_are_not_answered_with_advice_to_train(tree, timm_file, tmp_path, capsys):
    """vit-eval on a folder with an unreadable image stops with exit 2 and names data.on_bad_image=skip, in words
    that fit an evaluation (the same message serves training: it must not say "train on the rest")."""
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(tree, root)
    (root / "val" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    argv = [*FOREIGN, f"model.pretrained={timm_file}", "data=imagefolder", f"data.root={root}", "device=cpu"]
    assert evaluate_tool.cli([*argv, "data.num_workers=0", "amp=none"]) == 2
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "data.on_bad_image=skip" in err
    assert "train on the rest" not in err, err
    skipped = evaluate_tool.cli([*argv, "data.num_workers=0", "amp=none", "data.on_bad_image=skip"])
    assert skipped == 0
    assert json.loads(capsys.readouterr().out)["count"] == 6  # 2 images a class, the broken file left out
