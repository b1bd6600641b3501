"""data=hf: Hugging Face datasets, saved with save_to_disk or loaded by name through the datasets cache, train like
image folders; every bad setting is one line naming it (exit code 2 through train.py)."""

import json

import datasets
import huggingface_hub
import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage
from trainer_utils import run_cli

from vit.data.errors import DataError
from vit.data.loading.build import build_data
from vit.data.sources.registry import build_splits
from vit.weights.read import load_checkpoint

NAMES = ["cat", "dog", "frog"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """No network here: the datasets library answers from its cache at once instead of retrying the Hub (for about
    25 s). The environment for train.py's processes; in this one the libraries read it when imported, so their
    flags are set as well."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def images(count: int, seed: int) -> list[PILImage.Image]:
    """Small RGBA images (24x20): the loader must turn them into RGB as it does image files."""
    rng = np.random.default_rng(seed)
    return [PILImage.fromarray(rng.integers(0, 256, (20, 24, 4), dtype=np.uint8), "RGBA") for _ in range(count)]


def split(count: int, seed: int, image="image", label="label", names=NAMES) -> Dataset:
    label_feature = ClassLabel(names=names) if names else Value("int64")
    features = Features({image: Image(), label: label_feature})
    return Dataset.from_dict({image: images(count, seed), label: [i % 3 for i in range(count)]}, features=features)


@pytest.fixture
def saved(tmp_path):
    """A DatasetDict(train: 24 rows, test: 9 rows) written by save_to_disk."""
    path = tmp_path / "pets"
    DatasetDict(train=split(24, 0), test=split(9, 1)).save_to_disk(str(path))
    return path


def hf(**keys) -> dict:
    return {"name": "hf", "image_column": "image", "label_column": "label", "train_split": "train", **keys}


def test_saved_dataset_trains_through_train_py(saved, tmp_path):
    run_dir = tmp_path / "run"
    args = ["data=hf", f"data.path={saved}", "data.img_size=32", "data.patch_size=8", "data.batch_size=8"]
    args += ["data.num_workers=0", "model.depth=1", "model.embed_dim=32", "model.num_heads=2"]
    args += ["trainer.epochs=1", "trainer.device=cpu"]
    done = run_cli([*args, "trainer.attn_maps_every_n_epochs=0", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs_done"] == 1 and metrics["history"][-1]["epoch"] == 1
    assert metrics["val_split"] == "test"
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["class_to_idx"] == {"cat": 0, "dog": 1, "frog": 2}  # the ClassLabel names, in order
    assert state["model"]["head.weight"].shape[0] == 3


def test_splits_read_classes_targets_and_rgb_images(saved):
    splits = build_splits(hf(path=str(saved)))
    assert splits.class_to_idx == {"cat": 0, "dog": 1, "frog": 2}
    assert (len(splits.train), len(splits.val), splits.val_name) == (24, 9, "test")
    assert splits.train.targets.tolist() == [i % 3 for i in range(24)]
    image, target = splits.val[4]
    assert image.mode == "RGB" and image.size == (24, 20) and target == 1
    assert splits.root == saved.resolve()


def test_holdout_and_limit_work_on_a_lone_dataset(tmp_path):
    path = tmp_path / "lone"
    split(30, 0).save_to_disk(str(path))
    splits = build_splits(hf(path=str(path), holdout=6, limit_train_samples=12))
    assert (len(splits.train), len(splits.val), splits.val_name, splits.test) == (12, 6, "holdout", None)
    assert np.bincount(splits.val.targets).tolist() == [2, 2, 2]  # class-balanced slice of the 30 rows
    with pytest.raises(DataError, match=r"holds one Dataset, no splits: set data.holdout"):
        build_splits(hf(path=str(path)))


def test_custom_columns_and_integer_labels(tmp_path):
    path = tmp_path / "custom"
    data = {"fit": split(12, 0, "picture", "kind", names=None), "check": split(6, 1, "picture", "kind", names=None)}
    DatasetDict(data).save_to_disk(str(path))
    keys = dict(path=str(path), image_column="picture", label_column="kind", train_split="fit", val_split="check")
    splits = build_splits(hf(**keys))
    assert splits.class_to_idx == {"0": 0, "1": 1, "2": 2}  # no ClassLabel: the integers seen
    assert splits.val_name == "check" and splits.val[2][1] == 2 and splits.val[2][0].mode == "RGB"


def test_string_labels_are_numbered_in_sorted_order(tmp_path):
    path = tmp_path / "named"
    rows = {"image": images(4, 0), "label": ["owl", "bee", "owl", "cat"]}
    Dataset.from_dict(rows, features=Features({"image": Image(), "label": Value("string")})).save_to_disk(str(path))
    splits = build_splits(hf(path=str(path), holdout=1))
    assert splits.class_to_idx == {"bee": 0, "cat": 1, "owl": 2}
    assert sorted([*splits.train.targets.tolist(), *splits.val.targets.tolist()]) == [0, 1, 2, 2]


def test_img_column_is_used_when_image_is_missing(tmp_path):
    path = tmp_path / "cifar-like"
    DatasetDict(train=split(6, 0, image="img"), validation=split(3, 1, image="img")).save_to_disk(str(path))
    splits = build_splits(hf(path=str(path)))
    assert splits.val_name == "validation" and splits.train[0][0].mode == "RGB"


def test_dataset_name_loads_a_local_folder_through_the_cache(saved, tmp_path):
    files = tmp_path / "files" / "data"
    files.mkdir(parents=True)
    for name in ("train", "test"):
        split(12 if name == "train" else 6, 2).to_parquet(str(files / f"{name}-0.parquet"))
    cache = tmp_path / "hf-cache"
    splits = build_splits(hf(dataset_name=str(files.parent), cache_dir=str(cache)))
    assert splits.class_to_idx == {"cat": 0, "dog": 1, "frog": 2} and (len(splits.train), len(splits.val)) == (12, 6)
    assert splits.root is not None and splits.root.is_relative_to(cache)  # the Arrow files are in data.cache_dir


def test_resident_loader_decodes_the_split_into_the_dataset_folder(saved):
    cfg = hf(path=str(saved), img_size=16, batch_size=4, num_workers=0, loader="resident", augment={"crop": "none"})
    bundle = build_data(cfg, device="cpu")
    images, targets = next(iter(bundle.train_loader))
    assert images.shape == (4, 3, 16, 16) and bundle.num_classes == 3
    assert len(list((saved / ".vit-cache").glob("*.images.npy"))) == 2  # the train and test splits, decoded once


def unlabelled_test(tmp_path):
    path = tmp_path / "unlabelled"
    test = Dataset.from_dict(
        {"image": images(3, 1), "label": [-1, -1, -1]}, features=Features({"image": Image(), "label": Value("int64")})
    )
    DatasetDict(train=split(6, 0, names=None), test=test).save_to_disk(str(path))
    return path


def other_classes_test(tmp_path):
    path = tmp_path / "other-classes"
    DatasetDict(train=split(6, 0), test=split(3, 1, names=["ant", "bee", "cow"])).save_to_disk(str(path))
    return path


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({}, "exactly one of data.dataset_name=<Hub name> and data.path=<folder saved with save_to_disk>; neither"),
        ({"dataset_name": "a/b", "path": "x"}, "exactly one of data.dataset_name"),
        ({"path": "{tmp}"}, "is not a dataset saved with save_to_disk"),
        ({"path": "{tmp}/nowhere"}, "nowhere' does not exist"),
        (
            {"path": "{saved}", "image_column": "photo"},
            "data.image_column='photo' is not a column of split 'train'; its columns: ['image', 'label']",
        ),
        (
            {"path": "{saved}", "label_column": "y"},
            "data.label_column='y' is not a column of split 'train'; its columns: ['image', 'label']",
        ),
        (
            {"path": "{saved}", "train_split": "fit"},
            "data.train_split='fit' is not a split of the dataset; its splits: ['train', 'test']",
        ),
        ({"path": "{saved}", "val_split": "dev"}, "data.val_split='dev' is not a split"),
        ({"path": "{unlabelled}"}, "3 of the 3 rows of split 'test' have no label"),
        ({"path": "{other}"}, "the class labels of the training split (ClassLabel(names=['cat', 'dog', 'frog']))"),
        ({"dataset_name": "someone/no-such-set", "cache_dir": "{tmp}/hub"}, "not in the datasets cache {tmp}/hub"),
    ],
)
def test_bad_input_is_one_line_naming_it(keys, message, saved, tmp_path):
    where = {"tmp": str(tmp_path), "saved": str(saved), "unlabelled": str(unlabelled_test(tmp_path))}
    where["other"] = str(other_classes_test(tmp_path))
    keys = {k: v.format(**where) for k, v in keys.items()}
    with pytest.raises(DataError) as err:
        build_splits(hf(**keys))
    assert message.format(**where) in str(err.value) and "\n" not in str(err.value)


def test_uncached_hub_name_offline_exits_2_naming_the_cache(tmp_path):
    cache = tmp_path / "hub-cache"
    args = ["data=hf", "data.dataset_name=someone/no-such-set", f"data.cache_dir={cache}", "trainer.device=cpu"]
    done = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("data error: data.dataset_name='someone/no-such-set'")
    assert f"not in the datasets cache {cache} " in err[0]


def test_without_a_network_the_hub_is_not_retried(monkeypatch, tmp_path, caplog):
    """Offline mode not set, and no network: huggingface_hub would retry each request for about 30 s with a
    warning per try; the loader finds the Hub unreachable first and reads the cache in offline mode."""
    import time

    import vit.data.sources.hf as hf_module

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_module, "host_reachable", lambda host: False)
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        build_splits(hf(dataset_name="someone/no-such-set", cache_dir=str(tmp_path / "hub")))
    assert time.perf_counter() - start < 10
    assert "no network: huggingface.co is unreachable" in str(err.value) and "\n" not in str(err.value)
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    assert not datasets.config.HF_HUB_OFFLINE and not huggingface_hub.constants.HF_HUB_OFFLINE  # restored
