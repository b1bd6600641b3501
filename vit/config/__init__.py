"""The composed config: the trainer's config tree (configs/) composed with Hydra's overrides, the config groups'
defaults stored in Hydra's ConfigStore from their one declaration (vit/settings, the registries of models and
datasets), and the value types of every key checked before anything reads them. Above the models and the data
(whose registries declare their groups), below everything that reads a config."""
