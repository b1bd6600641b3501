"""The project installs as a wheel, trains and evaluates from any folder: the wheel carries the Hydra config tree
(configs/ as vit/configs), every subpackage and the Hydra plugins (the models' defaults, the sweeper), and
`vit-train` / `vit-eval` run from a folder outside the checkout."""

import json
import os
import subprocess
import sys
import zipfile

import pytest
import tomllib
from trainer_utils import REPO


def test_the_wheel_lists_every_package_of_the_checkout():
    """pyproject.toml names the packages the wheel carries; a package missing there installs nothing of it, and only
    the slow wheel test below would notice (it did: vit.tasks)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("vit", "hydra_plugins")
        for init in (REPO / top).rglob("__init__.py")
    }
    # vit.configs is configs/ (package-dir); hydra_plugins is Hydra's namespace package, without an __init__.py
    assert sorted(found - listed) == [] and sorted(listed - found - {"vit.configs", "hydra_plugins"}) == []


@pytest.mark.slow  # 25 s: builds and installs the wheel, then trains and evaluates
def test_the_wheel_installs_trains_and_evaluates_outside_the_checkout(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # No build isolation: the venv's setuptools builds it, no download. -v: pip shows the build backend's own output
    # (quiet, it hides it), where setuptools' packaging warnings appear.
    built = subprocess.run([*pip, "-v", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-w", str(wheels)],
                           check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    # configs/'s subfolders are data: setuptools once took each for an unlisted package, one "Package would be
    # ignored" warning of some 40 lines per folder on every build and install (pyproject.toml: include-package-data)
    assert "would be ignored" not in built.stdout + built.stderr
    assert "is absent from the `packages` configuration" not in built.stdout + built.stderr
    (wheel,) = wheels.glob("vit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "vit/configs/config.yaml" in names and "vit/configs/model/vit_tiny.yaml" in names
    # every YAML file of the config tree, the sub-folders' too (configs/model/shared/, configs/hydra/sweeper/)
    configs = {f"vit/configs/{p.relative_to(REPO / 'configs').as_posix()}" for p in (REPO / "configs").rglob("*.yaml")}
    assert sorted(configs - set(names)) == []
    assert "vit/__init__.py" in names and "hydra_plugins/vit_sweeper/__init__.py" in names
    # the groups' defaults are stored by vit/config/compose.py's register_configs; the plugin folder holds the sweeper
    assert {n.split("/")[1] for n in names if n.startswith("hydra_plugins/")} == {"vit_sweeper"}
    assert "vit/settings/trainer.py" in names
    for module in ("vit/weights/read.py", "vit/data/sources/registry.py", "vit/data/augment/policies.py",
                   "vit/data/loading/build.py"):  # fmt: skip
        assert module in names, module
    subprocess.run([*pip, "-q", "install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(site)}  # the dependencies from this environment, the project from the wheel

    where = subprocess.run([sys.executable, "-c", "import vit; print(vit.__file__); print(vit.CONFIG_DIR)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert where.stdout.split() == [str(site / "vit" / "__init__.py"), str(site / "vit" / "configs")], where.stderr
    train = [
        str(site / "bin" / "vit-train"),
        "data=synthetic",
        "trainer=debug",
        "trainer.device=cpu",
        "hydra.run.dir=run",
    ]
    done = subprocess.run(train, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (elsewhere / "run" / "metrics.json").is_file() and (elsewhere / "run" / "checkpoints" / "last.pt").is_file()
    helped = subprocess.run([str(site / "bin" / "vit-eval"), "--help"], cwd=elsewhere, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert helped.returncode == 0 and "usage: vit-eval" in helped.stdout
    evaluated = subprocess.run([str(site / "bin" / "vit-eval"), "checkpoint=run/checkpoints/last.pt"], cwd=elsewhere,
                               env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads(evaluated.stdout)
    assert result["count"] > 0 and 0.0 <= result["top1"] <= 100.0 and result["model"] == "vit_tiny"
