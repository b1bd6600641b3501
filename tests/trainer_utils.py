"""Helpers shared by the trainer tests: composing configs and running the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "configs")

# A model small enough that a CPU epoch over a few hundred images takes about a second.
TINY_MODEL = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"]
QUICK_SYNTHETIC = ["data=synthetic", "data.synthetic.num_train=256", "data.synthetic.num_val=64", "data.batch_size=32"]


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def run_cli(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
