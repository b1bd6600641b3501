"""The model settings' defaults for the trainer's configs, from the code: Hydra imports every module of the
`hydra_plugins` package when it starts, before it reads a config, and this one stores, for each registered model,
a config `model/registry/<name>` holding every setting of that model with the value `create_model(name)` uses
(the config dataclass's defaults, the registry's width, depth and heads). configs/model/<name>.yaml starts from it
(`registry/<name>@_here_` in its defaults list), so `model.qk_norm=true` and every other setting is a key the
command line can set, while the YAML lists only what the training recipe chooses."""

from hydra.core.config_store import ConfigStore

from vit.models.registry import list_models, model_defaults

# Settings of the models that are not config keys: the data are RGB images.
NOT_CONFIG_KEYS = ("in_chans",)


def store_model_defaults() -> None:
    store = ConfigStore.instance()
    for name in list_models():
        settings = {k: v for k, v in model_defaults(name).items() if k not in NOT_CONFIG_KEYS}
        store.store(group="model/registry", name=name, node={"name": name, **settings}, provider="vit")


store_model_defaults()
