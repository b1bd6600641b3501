"""vit-cifar-jpegs on a tiny CIFAR-10 root written here (the python pickle batches torchvision reads,
no network): the class-folder tree and its archive, each image where its label says, and data=imagefolder reads
both."""

import hashlib
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import CIFAR10
from trainer_utils import compose_config, load_script

from vit.data import build_data

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# One flat colour a class: after JPEG every pixel stays within a few levels of it.
COLOURS = np.array([[25 * c, 255 - 25 * c, (80 * c) % 256] for c in range(10)], dtype=np.uint8)


def _script():
    return load_script("cifar_jpegs")


def _batch(labels: list[int]) -> dict:
    """CIFAR's pickle batch: 'data' (N, 3072) uint8, the 1024 red, then green, then blue values of each image."""
    images = np.stack([np.broadcast_to(COLOURS[label], (32, 32, 3)) for label in labels])  # (N, 32, 32, 3)
    return {"data": images.transpose(0, 3, 1, 2).reshape(len(labels), 3072).copy(), "labels": labels}


@pytest.fixture()
def cifar_root(tmp_path, monkeypatch):
    """5 training batches of 10 images (one a class) and a test batch of 20 (two a class), torchvision's md5
    checks pointed at these files."""
    folder = tmp_path / "torchvision" / CIFAR10.base_folder
    folder.mkdir(parents=True)
    files = {f"data_batch_{i}": _batch(list(range(10))) for i in range(1, 6)}
    files["test_batch"] = _batch(list(range(10)) * 2)
    files["batches.meta"] = {"label_names": CLASSES}
    md5 = {}
    for name, content in files.items():
        (folder / name).write_bytes(pickle.dumps(content))
        md5[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5["batches.meta"]})
    return tmp_path / "torchvision"


def test_writes_the_class_folders_and_the_archive_data_imagefolder_reads(cifar_root, tmp_path):
    out, archive = tmp_path / "out", tmp_path / "cifar10-jpeg.tar.gz"
    assert _script().main([f"root={cifar_root}", f"out={out}", f"tar={archive}"]) == 0
    tree = out / "cifar10"
    for split, per_class in (("train", 5), ("test", 2)):
        assert sorted(p.name for p in (tree / split).iterdir()) == sorted(CLASSES)
        for label, name in enumerate(CLASSES):
            files = sorted((tree / split / name).glob("*.jpg"))
            assert [p.name for p in files] == [f"{i:04d}.jpg" for i in range(per_class)]
            pixels = np.asarray(Image.open(files[-1]).convert("RGB"), dtype=int)
            assert pixels.shape == (32, 32, 3) and np.abs(pixels - COLOURS[label]).max() <= 8, (split, name)
    with tarfile.open(archive) as packed:
        names = packed.getnames()
    assert "cifar10/train/cat/0004.jpg" in names and "cifar10/test/truck/0001.jpg" in names and len(names) == 93

    for root in (tree, archive):
        overrides = ["data=imagefolder", f"data.root={root}", "data.num_workers=0", "data.batch_size=10"]
        bundle = build_data(compose_config([*overrides, "data.loader=torch", f"data.cache_dir={tmp_path}/c"]).data)
        assert bundle.class_to_idx == {name: i for i, name in enumerate(CLASSES)}
        assert (bundle.num_train, bundle.num_val, bundle.val_name) == (50, 20, "test")


def test_a_root_without_cifar_exits_2_naming_it(tmp_path, capsys):
    from vit.cli.args import run_script

    assert run_script(_script().main, [f"root={tmp_path / 'empty'}", f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"root='{tmp_path / 'empty'}': no readable CIFAR-10" in err[0]
    assert "download=true" in err[0]


def test_a_download_without_network_says_so_not_a_write_failure(tmp_path, monkeypatch, capsys):
    """Offline, torchvision's download raises URLError (an OSError): that is a network failure, not an unwritable
    `out` folder."""
    import urllib.error

    import torchvision.datasets.cifar as cifar

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cifar, "download_and_extract_archive", offline)
    from vit.cli.args import run_script

    argv = [f"root={tmp_path / 'root'}", f"out={tmp_path / 'out'}", "download=true"]
    assert run_script(_script().main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"usage error: download=true: cannot fetch CIFAR-10 into root='{tmp_path}")
    assert "name resolution" in err[0] and "cannot write" not in err[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["quality=96"], "quality='96' must be an integer in 1..95"),
        (["download=sure"], "download='sure' must be true or false"),
        (["--tar", "x.tar.gz"], "argument '--tar' must look like key=value"),
        (["tarball=x.tar.gz"], "unknown argument 'tarball'"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_with_exit_code_2(args, named, tmp_path, capsys):
    from vit.cli.args import run_script

    assert run_script(_script().main, [f"root={tmp_path}", f"out={tmp_path / 'out'}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("usage error: ") and named in err[0], err
    assert not (tmp_path / "out").exists()
