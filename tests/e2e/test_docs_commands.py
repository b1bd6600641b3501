"""Every shell command of README.md and docs/*.md runs as written, with tiny sizes and the tests' data in place of
the docs' placeholders (tests/doc_commands.py has the extraction and the table), or is skipped with its reason.

The default run checks that every command has a rule and that every training command's overrides compose into a
config train.py accepts (a renamed key or group in the docs fails here in seconds); the `slow` test runs every
block of commands, in order, in a folder of its own."""

import os
import re
import shlex
import shutil
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from doc_commands import (
    CIFAR_JPEG,
    TINY_TRAIN,
    documented_commands,
    expand_block,
    expected_exit,
    runnable,
)
from PIL import Image
from trainer_utils import REPO, compose_config

COMMANDS = documented_commands()
BLOCKS = defaultdict(list)
for _command in COMMANDS:
    BLOCKS[_command.file, _command.block].append(_command)
PLACEHOLDER_FILES = {
    "python": sys.executable,
    "bin": str(Path(sys.executable).parent),
    "repo": str(REPO),
    "vit_small_file": "vit_small.safetensors",
    "resnet18_file": "resnet18.safetensors",
}


def test_the_docs_commands_are_found():
    files = {c.file for c in COMMANDS}
    assert {"README.md", "docs/FINETUNE.md", "docs/DISTILLATION.md", "docs/DATA.md", "docs/SEARCH.md"} <= files
    texts = [c.text for c in COMMANDS]
    assert ".venv/bin/python train.py model=vit_tiny" in texts
    assert any(t.startswith('.venv/bin/python -c "from vit.models import create_model, complexity\nm =') for t in texts)
    assert all("\\\n" not in t and not t.endswith("\\") for t in texts)  # continuations joined


def test_every_command_is_run_or_skipped_with_a_reason():
    """A command matching no rule would run with the docs' placeholders in it: each `<...>` must be replaced."""
    for commands in BLOCKS.values():
        for command, text, reason in expand_block(commands):
            if reason is not None:
                continue
            ran = runnable(text, {}, {**PLACEHOLDER_FILES, "mae_run": "mae", "run": "outputs/run"})
            left = re.findall(r"<[^>]*>", ran)
            assert not left, f"{command.id}: placeholders without a substitution {left} in {ran!r}"
            assert "/path/to/" not in ran and "..." not in ran.split(" -c ")[0], f"{command.id}: {ran!r}"


def _first_of_sweep(value: str) -> str:
    """A multirun's `key=a,b,c` as its first run's `key=a` (a list value in brackets stays whole)."""
    key, _, values = value.partition("=")
    return f"{key}={values.split(',')[0]}" if "," in values and not values.startswith("[") else value


def test_every_training_command_composes():
    """The overrides of every train.py command of the docs, the skipped ones too, as train.py checks and composes
    them: an unknown key or group choice, or a value that does not parse, fails here."""
    from vit.cli.overrides import check_group_choices, check_override_keys, without_null_groups

    accepted = []
    for commands in BLOCKS.values():
        for command, text, _ in expand_block(commands):
            if not re.search(r"\btrain\.py\b", text):
                continue
            ran = runnable(text, {}, {**PLACEHOLDER_FILES, "mae_run": "mae", "run": "outputs/run"})
            args = shlex.split(ran.split("train.py", 1)[1])
            overrides = [_first_of_sweep(a) for a in args if a != "-m" and not a.startswith("hydra.")]
            overrides = without_null_groups(overrides)
            try:
                check_group_choices(overrides)
                check_override_keys(overrides)
            except SystemExit as refused:
                if refused.code != expected_exit(text):
                    pytest.fail(f"{command.id}: train.py refuses {command.text!r}")
                continue
            assert expected_exit(text) == 0, f"{command.id}: its doc says it fails, and it composes"
            accepted.append((command, overrides))
    # Each set of group choices composed once (trainer_utils.compose_config), each distinct command once.
    for overrides, command in {tuple(overrides): command for command, overrides in reversed(accepted)}.items():
        try:
            compose_config(list(overrides))
        except Exception as err:  # Hydra's and OmegaConf's errors for a key or value it refuses
            pytest.fail(f"{command.id}: {str(err).splitlines()[0]} in {command.text!r}")
    checked = len(accepted)
    assert checked > 60


# --- running them -----------------------------------------------------------------------------------------------


def _tiny_cifar(folder: Path) -> Path:
    """CIFAR-10's layout (cifar10/train/<class>/, cifar10/test/<class>/) with 32 training and 10 test JPEGs of
    32 px a class, as a .tar.gz: what the docs call data/cifar10-jpeg.tar.gz."""
    rng = np.random.default_rng(0)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    tree = folder / "tree" / "cifar10"
    for split, count in (("train", 32), ("test", 10)):
        for c, name in enumerate(classes):
            (tree / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(rng.normal(25 * c, 40, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(tree / split / name / f"{i:04d}.jpg", quality=90)
    archive = folder / CIFAR_JPEG
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="cifar10")
    return tree


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder as a user has it after the README's first steps: the CIFAR-10 JPEG archive in data/, a trained run
    in outputs/<date>/<time>, a few images, and the weight files the docs name."""
    import subprocess

    import timm
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("docs")
    work = root / "work"
    tree = _tiny_cifar(work)
    (work / "images").mkdir()
    shutil.copy(tree / "test" / "cat" / "0000.jpg", work / "images" / "a.jpg")
    Image.open(tree / "test" / "ship" / "0000.jpg").save(work / "images" / "b.png")
    shutil.rmtree(work / "tree")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = f"{sys.executable} {REPO}/train.py model=vit_tiny data=imagefolder data.root={CIFAR_JPEG} data.img_size=32"
    base += f" data.patch_size=4 data.holdout=20 {TINY_TRAIN} trainer.keep_last=2"
    mae = f"{sys.executable} {REPO}/train.py experiment=cifar10_mae_proxy data=imagefolder data.root={CIFAR_JPEG}"
    mae += f" data.holdout=20 {TINY_TRAIN} hydra.run.dir={root}/mae_run"
    for cmd in (f"{base} hydra.run.dir=outputs/2026-01-01/00-00-00", mae):
        done = subprocess.run(cmd, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    files = dict(PLACEHOLDER_FILES, mae_run=str(root / "mae_run"))
    files["vit_small_file"] = str(root / "vit_small.safetensors")  # one block deep, as every training here
    vit_small = timm.create_model("vit_small_patch16_224", num_classes=10, depth=1)
    save_file(vit_small.state_dict(), files["vit_small_file"])
    files["resnet18_file"] = str(root / "resnet18.safetensors")
    resnet = {k: v.contiguous() for k, v in timm.create_model("resnet18", num_classes=10).state_dict().items()}
    save_file(resnet, files["resnet18_file"])
    del torch
    return work, files


def _runs(folder: Path) -> set[Path]:
    return {p for p in (folder / "outputs").glob("*/*") if p.is_dir()}


def _run_for(text: str, made: set[Path], base_run: Path) -> Path:
    """What `outputs/<date>/<time>` means in a command: the newest run the block made with the command's model
    (MAE pretraining, then its fine-tuning), else the workspace's trained ViT-Ti run."""
    from omegaconf import OmegaConf

    wanted = re.search(r"\bmodel=(\w+)", text)

    def model_of(run: Path) -> str | None:
        config = run / ".hydra" / "config.yaml"
        return OmegaConf.load(config).model.name if config.is_file() else None

    fitting = [r for r in made if wanted is None or model_of(r) == wanted.group(1)]
    return max(fitting, key=lambda r: r.stat().st_mtime) if fitting else base_run


DOC_NAMES = sorted({file for file, _ in BLOCKS}, key=lambda f: (f != "README.md", f))


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOC_NAMES)
def test_a_documents_commands_run(doc, workspace, tmp_path):
    """Every command of the doc in order, in one folder, as a reader of it would: exit code 0 (or the code its doc
    gives). The folder is removed afterwards (the runs of one doc take up to a few hundred MB)."""
    import subprocess

    work, files = workspace
    folder = tmp_path / "work"
    shutil.copytree(work, folder, symlinks=True)
    base_run = folder / "outputs" / "2026-01-01" / "00-00-00"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    ran, skipped = 0, []
    try:
        for key in [k for k in BLOCKS if k[0] == doc]:
            before = _runs(folder)
            for command, text, reason in expand_block(BLOCKS[key]):
                if reason is not None:
                    skipped.append(f"{command.id}: {reason}")
                    continue
                run_dir = _run_for(text, _runs(folder) - before, base_run).relative_to(folder)
                line = runnable(text, {}, {**files, "run": str(run_dir)})
                done = subprocess.run(
                    ["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True, timeout=600
                )
                expected = expected_exit(text)
                assert done.returncode == expected, (
                    f"{command.id}: {line}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
                )
                ran += 1
                if expected:
                    break  # what came after it in the block needs its output
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{doc}: {ran} commands ran; skipped:\n" + "\n".join(skipped))
    if not ran:
        pytest.skip("; ".join(sorted({s.split(": ", 1)[1] for s in skipped})))
