"""The trainer's config (configs/config.yaml) with Hydra overrides, composed as train.py composes it: for the tools
that rebuild a data config or check a command line before Hydra runs; the config groups' defaults, from the code, in
Hydra's ConfigStore (`register_configs`), which every composition reads; and a tool's `model.<key>`/`data.<key>`
arguments applied to a config it did not compose (a checkpoint's), with the meaning Hydra gives them (`apply_edits`)."""

from __future__ import annotations

from dataclasses import dataclass

from vit import CONFIG_DIR as PACKAGE_CONFIG_DIR
from vit.errors import ConfigError, UsageError

CONFIG_DIR = str(PACKAGE_CONFIG_DIR)  # a str: Hydra takes the folder as text

# Settings of the models that are not config keys: the data are RGB images.
NOT_CONFIG_KEYS = ("in_chans",)
_registered = False
_ABSENT = object()


def register_configs() -> None:
    """Store the defaults the config tree's YAML files start from, once per process, before anything is composed
    (train.py's entry point does it before Hydra runs, `compose` before it composes):
    - for each group of vit/settings (optim, sched, distill, mae, trainer, search), `<group>/schema/defaults`: every
      key of the group with the default its settings class declares; for each dataset, `data/schema/<name>`; the
      root's own keys (task, optimized_metric), `schema/run`;
    - for each registered model, `model/registry/<name>`: every setting with the value `create_model(name)` uses
      (the config dataclass's defaults, the registry's width, depth and heads); and `model/shared/finetune`, the
      keys that say how a model starts (vit/settings/model_start.py).
    A group's YAML file starts from these (`schema/defaults@_here_`, `registry/<name>@_here_` in its defaults
    list) and lists only what it chooses, so a new knob is declared once, in its settings or config class, and is
    a key the command line can set."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    from vit.data.sources.registry import DATASETS, data_defaults
    from vit.models.registry import list_models, model_defaults
    from vit.settings import SETTINGS, RunSettings
    from vit.settings.model_start import ModelStartSettings

    store = ConfigStore.instance()
    store.store(group="schema", name="run", node=RunSettings.defaults(), provider="vit")
    store.store(group="model/shared", name="finetune", node=ModelStartSettings.defaults(), provider="vit")
    for group, settings in SETTINGS.items():
        store.store(group=f"{group}/schema", name="defaults", node=settings.defaults(), provider="vit")
    for name in DATASETS:
        store.store(group="data/schema", name=name, node=data_defaults(name), provider="vit")
    for name in list_models():
        settings = {k: v for k, v in model_defaults(name).items() if k not in NOT_CONFIG_KEYS}
        store.store(group="model/registry", name=name, node={"name": name, **settings}, provider="vit")
    _registered = True


def compose(overrides: list[str], config_name: str = "config", with_hydra: bool = False):
    """The config train.py would run with these overrides (`model=vit_tiny`, `data.root=...`); with_hydra: with its
    `hydra` node too. One Hydra refuses (an unknown key or group choice, a value that does not parse) raises
    ConfigError with the first line of Hydra's reason."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="compose"):
            return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)
    except (HydraException, OmegaConfBaseException, ValueError) as err:  # ValueError: a null group choice
        raise ConfigError(str(err).strip().splitlines()[0]) from None


@dataclass(frozen=True)
class Edit:
    """One override of a key of the model's or the data's config, as Hydra reads it."""

    kind: str  # "set" (key=value), "add" (+key=value), "force" (++key=value), "delete" (~key)
    key: str  # the path below the group: depth, augment.re_prob
    value: object  # as Hydra types it (int, float, bool, str, list, dict, None)
    text: str  # the argument as given: model.depth=4


EDIT_KINDS = {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force", "DEL": "delete"}  # Hydra's override types


def edit_of(override, arg: str, group: str) -> Edit:
    """One override parsed by Hydra's OverridesParser (`override`, from the text `arg`) of a key under `group`, as an
    Edit of that group's config; a sweep (a comma-separated value) is a UsageError naming it."""
    if override.is_sweep_override():
        raise UsageError(f"argument {arg!r}: a comma-separated value is a sweep in Hydra's grammar (this command "
                         f"runs once); write a list as [a,b], or quote text holding a comma")  # fmt: skip
    kind = EDIT_KINDS[override.type.name]
    value = None if kind == "delete" else override.value()
    return Edit(kind, override.key_or_group[len(group) + 1 :], value, arg)


def as_kwargs(edits: list[Edit]) -> dict:
    """The edits as a model's constructor arguments (no config to apply them to: a model named by the registry); a
    deleted key is left out, so the constructor's default holds."""
    from omegaconf import OmegaConf

    kwargs = OmegaConf.create({})
    for edit in edits:
        if edit.kind != "delete":
            OmegaConf.update(kwargs, edit.key, edit.value, merge=True, force_add=True)
        elif OmegaConf.select(kwargs, edit.key, default=_ABSENT) is not _ABSENT:
            _delete(kwargs, edit.key)
    return OmegaConf.to_container(kwargs)


def _delete(node, key: str) -> None:
    """Delete the dotted `key` (augment.re_prob) from the config `node`."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    del (OmegaConf.select(node, parent) if parent else node)[leaf]


def apply_edits(node, edits: list[Edit], group: str, what: str) -> None:
    """`edits` onto `node` (a config, changed in place) as Hydra applies overrides: `key=value` sets a key the
    config has, `+key=value` adds one it lacks, `++key=value` sets or adds, `~key` deletes one it has; anything
    else is a UsageError naming the argument and `what` the config is (the checkpoint's model config)."""
    from omegaconf import OmegaConf, open_dict

    for edit in edits:
        present = OmegaConf.select(node, edit.key, default=_ABSENT) is not _ABSENT
        if edit.kind == "delete" and not present:
            raise UsageError(f"argument {edit.text!r}: {what} has no {group}.{edit.key} to delete")
        if edit.kind == "add" and present:
            raise UsageError(f"argument {edit.text!r}: {what} has {group}.{edit.key} already; set it with "
                             f"{edit.text.lstrip('+')}")  # fmt: skip
        if edit.kind == "set" and not present:
            raise UsageError(f"argument {edit.text!r}: {what} has no {group}.{edit.key}; add it with +{edit.text}")
        with open_dict(node):
            if edit.kind == "delete":
                _delete(node, edit.key)
            else:
                OmegaConf.update(node, edit.key, edit.value, merge=True, force_add=True)
