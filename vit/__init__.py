"""Train, ablate and understand Vision Transformers and Tokens-to-Token ViTs (README.md).

`CONFIG_DIR` is the one place the Hydra config tree is found: inside the installed package (a wheel ships the
repository's configs/ as vit/configs, pyproject.toml maps it), else the checkout's configs/ beside vit/ (an
editable install, or running from the repository). Both are the same files: configs/ stays the tree a user reads
and edits at the top of the repository."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _config_dir() -> Path:
    packaged = Path(str(resources.files(__name__))) / "configs"  # a wheel install
    if (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "configs"  # a checkout


CONFIG_DIR = _config_dir()
