"""The config groups' defaults, from the code: Hydra imports every module of the `hydra_plugins` package when it
starts, before it reads a config, and this one stores, for each group of vit/settings (optim, sched, distill,
mae, trainer), a config `<group>/schema/defaults` holding every key of the group with the default its settings
class declares, and for each dataset of `DATASETS` a config `data/schema/<name>` from its settings class. The
groups' YAML files start from these (`schema/defaults@_here_`, `schema/<name>@_here_` in their defaults lists)
and list only what they choose, so a new knob is declared once, in its settings class."""

from hydra.core.config_store import ConfigStore

from vit.data.sources.registry import DATASETS, data_defaults
from vit.settings import SETTINGS


def store_settings_defaults() -> None:
    store = ConfigStore.instance()
    for group, settings in SETTINGS.items():
        store.store(group=f"{group}/schema", name="defaults", node=settings.defaults(), provider="vit")
    for name in DATASETS:
        store.store(group="data/schema", name=name, node=data_defaults(name), provider="vit")


store_settings_defaults()
