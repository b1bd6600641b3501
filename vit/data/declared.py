"""The values configs/data/ declares, for a data config built by hand (a notebook, a test, a tool): a key it
leaves out means what configs/data/<name>.yaml says, so each default is written in one place, that file.

Composed configs (train.py, the scripts) already hold every key; completing them changes nothing."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from vit import CONFIG_DIR

DATA_CONFIGS = CONFIG_DIR / "data"
BASE = "cifar10"


@functools.cache
def declared(name: str) -> dict:
    """configs/data/<name>.yaml over the files its defaults list names (the way Hydra composes it). A name with no
    file gets the base file's values, cifar10.yaml (which every data config builds on); build_splits then says
    which names exist."""
    path = DATA_CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return declared(BASE)
    own = OmegaConf.load(path)
    merged = OmegaConf.create({})
    for entry in own.get("defaults") or []:
        merged = OmegaConf.merge(merged, declared(str(entry)) if entry != "_self_" else {})
    own.pop("defaults", None)
    return OmegaConf.to_container(OmegaConf.merge(merged, own))


def complete(cfg: Mapping) -> DictConfig:
    """`cfg` with every key it leaves out taken from its data config's file."""
    given = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    base = OmegaConf.create(declared(str(given.get("name"))))
    merged = OmegaConf.merge(base, given)
    OmegaConf.set_struct(merged, False)
    return merged
