"""The CIFAR-10 recipe configs compose as documented (`experiment=<name> data=imagefolder data.root=...`) and
train for a few steps on the CPU, with their model, augmentation and schedule settings reaching the run.

Their accuracy and wall time are measurements (docs/RESULTS.md: the GPU recipes, and cifar10_cpu on a 2-core CPU),
never asserted here."""

import pytest
import yaml
from trainer_utils import REPO, compose_config, make_tree

from vit.models import complexity, create_model
from vit.train import run
from vit.train.config import validate

RECIPES = ("cifar10_minute", "cifar10_fast", "cifar10_best", "cifar10_plain", "cifar10_cpu")
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@pytest.fixture(scope="module")
def cifar_like_tree(tmp_path_factory):
    """CIFAR-10's layout (train/ and test/ with its 10 class folders) at 32 px, 4 training images a class."""
    return make_tree(tmp_path_factory.mktemp("cifar-like"), classes=CIFAR_CLASSES, per_class=4, val="test", size=32)


def recipe_yaml(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / "experiment" / f"{name}.yaml").read_text())


def recipe_model_keys(name: str) -> dict:
    """The model keys a recipe's YAML sets, over those of the recipes it builds on (its `defaults` entries that name
    another experiment file)."""
    raw, keys = recipe_yaml(name), {}
    for parent in raw.get("defaults", []):
        if isinstance(parent, str) and (REPO / "configs" / "experiment" / f"{parent}.yaml").is_file():
            keys.update(recipe_model_keys(parent))
    return {**keys, **raw.get("model", {})}


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_with_image_folders_as_cifar10(name, cifar_like_tree):
    """`data=imagefolder` would mean 224 px and patch 16; the recipe makes it CIFAR-10's 32 px, patch 4, 10 classes,
    and its model and training keys override the groups' defaults."""
    cfg = compose_config([f"experiment={name}", "data=imagefolder", f"data.root={cifar_like_tree}"])
    validate(cfg)
    assert (cfg.data.img_size, cfg.model.patch_size, cfg.data.num_classes) == (32, 4, 10)
    assert cfg.data.holdout is None  # the recipe trains on all 50,000 images; tuning adds data.holdout itself
    raw = recipe_yaml(name)
    for group in ("model", "optim", "trainer"):
        for key, value in raw.get(group, {}).items():
            if not isinstance(value, dict):
                assert cfg[group][key] == value, f"{group}.{key}"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_a_few_steps_on_cpu(name, cifar_like_tree, tmp_path):
    overrides = [
        f"experiment={name}",
        "data=imagefolder",
        f"data.root={cifar_like_tree}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.loader=resident",  # the loader the recipes use on CUDA, here on the CPU
        "data.num_workers=0",
        "data.batch_size=8",
        "trainer.device=cpu",
        "trainer.epochs=2",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.save_checkpoints=false",
    ]
    metrics = run(compose_config(overrides), output_dir=tmp_path / "run")
    assert metrics["epochs_done"] == 2 and metrics["val_split"] == "test"
    assert metrics["final"]["train_loss"] > 0 and 0 < metrics["wall_time_s"]
    # The recipe's model is what trained: the parameter count of the same model built directly from its YAML, at
    # the width it picked where it picks one (trainer.width_by_budget: on these few images, the widest).
    model_keys = recipe_model_keys(name)
    picked = metrics["width_by_budget"]
    widths = recipe_yaml(name).get("trainer", {}).get("width_by_budget", {}).get("widths")
    assert (picked["width"] if picked else None) == (max(widths) if widths else None)
    if picked:
        heads = model_keys["num_heads"] * picked["width"] // model_keys["embed_dim"]
        model_keys = {**model_keys, "embed_dim": picked["width"], "num_heads": heads}
    expected = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, **model_keys)
    assert metrics["params"] == complexity(expected).params
    resize = recipe_yaml(name).get("trainer", {}).get("progressive_resize")
    # 2 epochs with the ramp ending by epoch end * 2: the first at the recipe's smallest size
    if resize and resize.get("min_size"):
        sizes = [r["train_img_size"] for r in metrics["history"]]
        assert sizes[0] == resize["min_size"] and sizes[-1] == 32
    else:
        assert all("train_img_size" not in r for r in metrics["history"])


def test_cpu_proxy_screens_on_a_holdout_and_reports_the_test_split_once(cifar_like_tree, tmp_path):
    """experiment=cifar10_proxy (docs/RESULTS.md, lever screening on the CPU): per-epoch numbers on a slice held out
    of the training set, the test split read once after training, EMA measured beside the raw weights."""
    cfg = compose_config(["experiment=cifar10_proxy", "data=imagefolder", f"data.root={cifar_like_tree}"])
    validate(cfg)
    assert (cfg.data.holdout, cfg.data.limit_train_samples, cfg.data.loader) == (2000, 10000, "resident")
    overrides = [
        "experiment=cifar10_proxy",
        "data=imagefolder",
        f"data.root={cifar_like_tree}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.holdout=10",  # of the tree's 40 training images
        "data.limit_train_samples=20",
        "data.num_workers=0",
        "data.batch_size=8",
        "trainer.device=cpu",
        "trainer.epochs=2",
        "trainer.save_checkpoints=false",
    ]
    metrics = run(compose_config(overrides), output_dir=tmp_path / "run")
    assert metrics["val_split"] == "holdout" and metrics["test"]["split"] == "test"
    assert metrics["loader"] == "resident" and metrics["loader_reason"] == "data.loader=resident"
    assert [r["val_top1"] is None for r in metrics["history"]] == [True, False]  # val_every_n_epochs: 2
    assert "ema_top1" in metrics["test"]
