"""The trainer's config (configs/config.yaml) with Hydra overrides, composed as train.py composes it: for the tools
that rebuild a data config or check a command line before Hydra runs."""

from __future__ import annotations

from vit import CONFIG_DIR as PACKAGE_CONFIG_DIR
from vit.errors import ConfigError

CONFIG_DIR = str(PACKAGE_CONFIG_DIR)  # a str: Hydra takes the folder as text


def compose(overrides: list[str], config_name: str = "config", with_hydra: bool = False):
    """The config train.py would run with these overrides (`model=vit_tiny`, `data.root=...`); with_hydra: with its
    `hydra` node too. One Hydra refuses (an unknown key or group choice, a value that does not parse) raises
    ConfigError with the first line of Hydra's reason."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="compose"):
            return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)
    except (HydraException, OmegaConfBaseException, ValueError) as err:  # ValueError: a null group choice
        raise ConfigError(str(err).strip().splitlines()[0]) from None
