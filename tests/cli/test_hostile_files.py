"""Every entry point given a bad file where it expects one: a missing path, a folder, an empty file, a truncated
file, a file of another kind and a pickle that carries code. Each is one line on stderr naming the path, exit code
2, never a traceback, and the pickle's code never runs.

The installed commands run in this process through their `console()`, the scripts through their `__main__` block
(runpy), as `python scripts/<name>.py` runs them;
train.py's Hydra task runs on the composed config, as Hydra hands it over (tests/cli/test_bad_input.py runs the real
command line on a code-carrying checkpoint)."""

import importlib
import io
import os
import pickle
import runpy
import sys
import tarfile

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from trainer_utils import QUICK_SYNTHETIC, REPO, TINY_MODEL, compose_config, make_tree

from vit.cli.train import train_task
from vit.tasks.build import build_model_from_config

run_module = importlib.import_module("vit.train.run")

KINDS = ("missing", "folder", "empty", "truncated", "other", "pickle")


class _RunsCode:
    """Unpickling this calls os.makedirs(marker): the proof that a loader ran code from a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{(kind, suffix): path} for each hostile kind as a checkpoint (.pt), an image (.jpg) and an archive
    (.tar.gz); the good checkpoint, image folder and tree they stand in for; the pickle's marker path."""
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "code_ran"
    cfg = compose_config([*QUICK_SYNTHETIC, *TINY_MODEL])
    model = build_model_from_config(cfg.model, num_classes=10)
    classes = {f"class_{i}": i for i in range(10)}
    good_pt = root / "good.pt"
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, good_pt)
    images = root / "images"
    images.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(images / "a.jpg")
    jpeg = (images / "a.jpg").read_bytes()
    tree = make_tree(root / "tree", per_class=2)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(tree, arcname="tree")
    goods = {".pt": good_pt.read_bytes(), ".jpg": jpeg, ".tar.gz": archive.getvalue()}
    torch_code = io.BytesIO()
    torch.save({"model": _RunsCode(str(marker))}, torch_code)  # as a checkpoint: a zip archive with the pickle
    codes = {".pt": torch_code.getvalue(), ".jpg": pickle.dumps(_RunsCode(str(marker)))}
    codes[".tar.gz"] = codes[".jpg"]
    out = {}
    for suffix, good in goods.items():
        stem = suffix.replace(".", "_")
        out["missing", suffix] = root / f"missing{stem}" / f"nothing{suffix}"
        out["folder", suffix] = root / f"folder{suffix}"
        out["folder", suffix].mkdir()
        for kind, data in (
            ("empty", b""),
            ("truncated", good[: len(good) // 2]),
            ("other", b"name,label\ncat.jpg,0\n" * 20),  # a CSV under the expected suffix
            ("pickle", codes[suffix]),
        ):
            path = out[kind, suffix] = root / f"{kind}{suffix}"
            path.write_bytes(data)
    return {"bad": out, "pt": good_pt, "images": images, "tree": tree, "marker": marker, "root": root}


def script(name, argv, monkeypatch, capsys):
    """(exit code, stderr) of `python scripts/<name>.py argv...`, or of the installed command whose module is
    vit/cli/<name>.py, run in this process."""
    path = REPO / "scripts" / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(path) if path.is_file() else name, *argv])
    with pytest.raises(SystemExit) as exit_info:
        if path.is_file():
            runpy.run_path(str(path), run_name="__main__")
        else:
            importlib.import_module(f"vit.cli.{name}").console()
    return exit_info.value.code, capsys.readouterr().err


def assert_one_line(code, err, path, marker):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "error" in lines[0] and os.path.basename(str(path)) in lines[0], lines[0]
    assert not marker.exists(), "the pickle's code ran"


# (script, arguments with {bad} for the hostile file, the hostile file's suffix)
SCRIPT_SLOTS = [
    ("evaluate", ["checkpoint={bad}"], ".pt"),
    ("evaluate", ["model=vit_tiny", "model.depth=2", "model.pretrained={bad}"], ".pt"),
    ("predict", ["checkpoint={bad}", "image={images}"], ".pt"),
    ("predict", ["checkpoint={pt}", "image={bad}"], ".jpg"),
    ("export", ["checkpoint={bad}", "output={root}/out.onnx"], ".pt"),
    ("export", ["checkpoint={pt}", "format=torchscript", "output={root}/out.ts", "image={bad}"], ".jpg"),
    ("visualize_attention", ["checkpoint={bad}", "image={images}", "out={root}/att.png"], ".pt"),
    ("visualize_attention", ["checkpoint={pt}", "image={bad}", "out={root}/att.png"], ".jpg"),
    ("average", ["checkpoints={bad},{pt}", "out={root}/avg.pt"], ".pt"),
    ("shards", ["source={bad}", "out={root}/shards"], ".tar.gz"),
    ("cifar_jpegs", ["root={bad}", "out={root}/jpegs"], ".tar.gz"),
]


def _slot(args) -> str:
    """Which argument takes the bad file: its key (every tool takes key=value only)."""
    arg = next(a for a in args if "{bad}" in a)
    return arg.split("=")[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "args", "suffix"), SCRIPT_SLOTS, ids=[f"{n}-{_slot(a)}" for n, a, _ in SCRIPT_SLOTS])
def test_a_script_given_a_bad_file_says_one_line(files, name, args, suffix, kind, monkeypatch, capsys):
    bad = files["bad"][kind, suffix]
    fill = {"bad": bad, "pt": files["pt"], "images": files["images"], "root": files["root"]}
    argv = [a.format(**fill) for a in args]
    if name == "cifar_jpegs" and kind in ("folder", "empty", "truncated", "other", "pickle"):
        # root= is a folder holding cifar-10-batches-py/: the bad file is that folder's data
        target = files["root"] / f"cifar_{kind}"
        batches = target / "cifar-10-batches-py"
        batches.mkdir(parents=True, exist_ok=True)
        if kind != "folder":
            for part in ("data_batch_1", "test_batch", "batches.meta"):
                (batches / part).write_bytes(bad.read_bytes())
        argv[0], bad = f"root={target}", target
    code, err = script(name, argv, monkeypatch, capsys)
    assert_one_line(code, err, bad, files["marker"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("overrides", "suffix"),
    [
        (["data=imagefolder", "data.root={bad}"], ".tar.gz"),
        ([*QUICK_SYNTHETIC, "trainer.resume={bad}"], ".pt"),
        ([*QUICK_SYNTHETIC, "model.pretrained={bad}"], ".pt"),
    ],
    ids=["data.root", "trainer.resume", "model.pretrained"],
)
def test_training_given_a_bad_file_says_one_line(files, overrides, suffix, kind, tmp_path, monkeypatch, capsys):
    bad = files["bad"][kind, suffix]
    cfg = compose_config([*TINY_MODEL, "trainer.device=cpu", *[o.format(bad=bad) for o in overrides]])
    monkeypatch.setattr(run_module, "hydra_output_dir", lambda: tmp_path)  # the folder Hydra would have made
    with pytest.raises(SystemExit) as exit_info:
        train_task(cfg)
    assert_one_line(exit_info.value.code, capsys.readouterr().err, bad, files["marker"])
