"""The config groups' defaults, from the code: Hydra imports every module of the `hydra_plugins` package when it
starts, before it reads a config, and this one stores, for each group of vit/settings (optim, sched, distill,
mae), a config `<group>/schema/defaults` holding every key of the group with the default its settings class
declares. The group's YAML files start from it (`schema/defaults@_here_` in their defaults list) and list only
what they choose, so a new knob is declared once, in its settings class."""

from hydra.core.config_store import ConfigStore

from vit.settings import SETTINGS


def store_settings_defaults() -> None:
    store = ConfigStore.instance()
    for group, settings in SETTINGS.items():
        store.store(group=f"{group}/schema", name="defaults", node=settings.defaults(), provider="vit")


store_settings_defaults()
