"""The model a finished run is evaluated, exported or served with: a checkpoint of this trainer (its config
builds the model), or a model name with a source of foreign weights (`model=vit_small model.pretrained=<source>`).

The weights come from vit/weights/read.py's `read_weights`, the project's one reader (timm names, files of
ours, state-dict files); this module builds the model for them and says which preprocessing they prescribe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from vit import CONFIG_DIR
from vit.config.compose import Edit, apply_edits, as_kwargs
from vit.deploy.preprocessing import Preprocessing, from_data_config, from_timm
from vit.errors import UsageError, UserError
from vit.weights.fit import PretrainedError, Weights
from vit.weights.read import NoEmaError, read_weights, source_forms, source_kind, source_name


class WeightsError(UserError):
    """Weights that cannot be used as asked: one line naming the setting, file or mismatch (exit code 2)."""


# Which weights of a checkpoint every tool after training reads (vit-eval, vit-predict, vit-export, vit-average):
# one rule, the one `model.pretrained=<last.pt>` starts a run with, so that the accuracy vit-eval reports is that of
# the model vit-export writes and vit-predict runs. Each tool's --help states it (`with_ema_rule`).
EMA_CHOICES = ("auto", "true", "false")
EMA_RULE = (
    "ema=auto (the default) reads the EMA weights where the checkpoint holds them (a run trained with "
    "trainer.ema=true; a state-dict file's state_dict_ema or model_ema), else its raw ones, as "
    "model.pretrained=<checkpoint> starts a run; ema=true the EMA weights, refused in one line where there are "
    "none; ema=false the raw weights. The output names the weights used."
)


def ema_option(value: object, key: str = "ema") -> bool | None:
    """`ema=auto|true|false` (EMA_RULE) as `read_weights` takes it: None for auto (and when not given), True, False.
    Anything else is one line naming the key."""
    if value is None or str(value).lower() == "auto":
        return None
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise UsageError(f"{key}={value!r} must be one of {', '.join(EMA_CHOICES)} ({EMA_RULE.split(';')[0]})")


def with_ema_rule(usage: str) -> str:
    """A tool's --help text with EMA_RULE in place of its `{ema_rule}` mark (the rule is written once), that
    paragraph wrapped to the width of the rest."""
    import textwrap

    def filled(text: str) -> str:
        return textwrap.fill(" ".join(text.replace("{ema_rule}", EMA_RULE).split()), width=116)

    return "\n\n".join(filled(text) if "{ema_rule}" in text else text for text in usage.split("\n\n"))


@dataclass
class LoadedModel:
    model: nn.Module  # eval mode, fp32, on the CPU
    name: str  # registry name of the model
    classes: list[str] | None  # class names in output order, when the weights carry them
    preprocessing: Preprocessing | None  # what the weights prescribe (our data config, timm's config), if anything
    source: str  # the file or name the weights came from, for reports
    config: dict | None = None  # the resolved training config (checkpoints of ours)
    which: str = ""  # which of its weights were read (`which_weights`): "ema" or "raw" for a checkpoint of ours
    untrained_head: str | None = None  # why its classifier is not the weights' own (`untrained_head`); None: it is


def read_source(
    source: str, use_ema: bool | None = None, key: str = "model.pretrained", file: str | None = None
) -> Weights:
    """`read_weights(source, ema=use_ema, file=file)`, its errors naming the setting as `key=source` (`file`: the
    weights of a `timm:<name>` source, model.pretrained_file)."""
    try:
        return read_weights(source, ema=use_ema, file=file)
    except FileNotFoundError:
        if file is not None:
            raise WeightsError(f"model.pretrained_file={file}: no such file") from None
        if key == "checkpoint":  # a checkpoint of ours: timm names and other files go with model.pretrained=
            raise WeightsError(f"checkpoint {source!r} does not exist") from None
        raise WeightsError(f"{key}={source}: no such file ({source_forms()})") from None
    except NoEmaError as err:  # names the checkpoint and why it has no EMA weights
        raise WeightsError(str(err)) from None
    except PretrainedError as err:  # unknown timm name or tag, no network and nothing cached, an unreadable file
        raise WeightsError(f"{key}={source}: {err}") from err


def prescribed_preprocessing(weights: Weights) -> Preprocessing | None:
    """What the weights say their images look like: timm's pretrained config of a timm source, the data config of a
    checkpoint of ours; None for a bare state dict."""
    if weights.timm_model is not None:
        return from_timm(weights.timm_model)
    if weights.config is not None and "data" in weights.config:
        return from_data_config(weights.config["data"])
    return None


def class_names(weights: Weights) -> list[str] | None:
    class_to_idx = weights.class_to_idx or {}
    return sorted(class_to_idx, key=class_to_idx.get) if class_to_idx else None


def which_weights(weights: Weights, use_ema: bool | None, file: str | None = None) -> str:
    """For the report, which weights were read (EMA_RULE): "ema" or "raw" of a checkpoint of ours (and of a file
    whose EMA weights ema=true found); for another file, which of its weights come first; timm's release for a
    `timm:<name>` source without a file."""
    if weights.config is not None:
        return "ema" if weights.ema else "raw"
    if use_ema is True:
        return "ema"  # checked by `require_ema`
    if weights.timm_model is not None and file is None:
        return "timm's release"
    return "raw if the file holds them, else ema" if use_ema is False else "ema if the file holds them, else raw"


def require_ema(found: Weights, given: str, file: str | None) -> None:
    """ema=true on weights that are not a checkpoint of ours (read_weights refuses one without EMA weights): a
    state-dict file must hold them under state_dict_ema or model_ema, said in one line where it does not. The file
    is read once more for this, only when ema=true is given."""
    from vit.weights.files import WeightsFileError, read_weights_file
    from vit.weights.read import WRAPPER_KEYS

    if found.config is not None:
        return
    path = file or (given if found.timm_model is None else None)
    if path is None:
        raise WeightsError(f"ema=true: {given} is timm's release, one set of weights with no EMA: leave ema out")
    ema_keys = [key for key in WRAPPER_KEYS if "ema" in key]  # state_dict_ema, model_ema
    try:
        obj = read_weights_file(path)
    except WeightsFileError as err:
        raise WeightsError(str(err)) from None
    if not (isinstance(obj, dict) and any(isinstance(obj.get(k), dict) and obj[k] for k in ema_keys)):
        raise WeightsError(
            f"ema=true: {path} holds no EMA weights (no {' or '.join(ema_keys)} in it): leave ema out, or ema=false"
        )


def model_from_config(config: dict, state_dict: dict, num_classes: int | None, edits: Sequence[Edit]) -> nn.Module:
    """The model a checkpoint of ours was trained as; `edits` (model.<key>= arguments, Hydra's meaning) change keys
    that keep the weights (model.attn_backend=math, model.img_size for another resolution)."""
    from omegaconf import OmegaConf

    from vit.tasks.build import build_model_from_config

    model_cfg = OmegaConf.create(config["model"])
    OmegaConf.set_struct(model_cfg, True)
    apply_edits(model_cfg, list(edits), "model", "the checkpoint's model config")
    OmegaConf.set_struct(model_cfg, False)
    model = build_model_from_config(model_cfg, num_classes=num_classes)
    try:
        model.load_state_dict({k: v.float() for k, v in state_dict.items()})
    except RuntimeError as err:  # an override that changes a weight's shape
        given = " ".join(edit.text for edit in edits)
        detail = " ".join(str(err).split())[:300]
        raise WeightsError(f"the checkpoint's weights do not fit model overrides {given}: {detail}") from err
    return model


def untrained_head(found: Weights, model: nn.Module) -> str | None:
    """Why the model's classifier is not one the weights trained, in words; None where it is. Read off the result
    (the model's head against the weights' `head.weight`), so every way vit/weights/fit.py has of initialising a
    classifier the weights do not fit (none in them, another class count, other classes) is caught alike."""
    import torch

    weight = getattr(getattr(model, "head", None), "weight", None)
    if weight is None:
        return "the model has no classifier (model.num_classes=0)"
    fresh = "so the model's head is freshly initialised and names random classes"
    theirs = found.state_dict.get("head.weight")
    if theirs is None:
        return f"the weights hold no classifier (an encoder only), {fresh} ({weight.shape[0]} of them)"
    if theirs.shape != weight.shape:
        return f"the weights' classifier has {theirs.shape[0]} classes and the model {weight.shape[0]}, {fresh}"
    if not torch.equal(weight.detach(), theirs.to(weight.dtype)):
        return f"the weights' classifier was trained on other classes, {fresh}"
    return None


def build_model(
    found: Weights,
    given: str,
    model_name: str | None = None,
    edits: Sequence[Edit] = (),
    img_size: int | None = None,
    use_ema: bool | None = None,
    file: str | None = None,
) -> LoadedModel:
    """The model for the weights read from `given`: a checkpoint of ours builds the model its config describes;
    other weights need `model_name`, built with the registry's defaults, `edits`, the weights' class count and
    `img_size` (else the preprocessing's), then loaded through the model.pretrained source checks. Its
    `untrained_head` says whether the classifier is the weights' own."""
    loaded = built_model(found, given, model_name, edits, img_size, use_ema, file)
    loaded.untrained_head = untrained_head(found, loaded.model)
    return loaded


def built_model(
    found: Weights,
    given: str,
    model_name: str | None,
    edits: Sequence[Edit],
    img_size: int | None,
    use_ema: bool | None,
    file: str | None,
) -> LoadedModel:
    """`build_model`'s model, by the kind of weights."""
    from vit.models import create_model, list_models
    from vit.tasks import task_of
    from vit.weights.read import load_pretrained

    if found.config is not None and not task_of(found.config).classifier:
        task = task_of(found.config).name
        raise WeightsError(
            f"checkpoint {given!r} is a {'masked-autoencoder ' if task == 'mae' else ''}pretraining run (task={task}) "
            "and has no classifier: "
            f"fine-tune it first (train.py model.pretrained={given} ...)"
        )
    if found.config is not None:  # ours: the config inside builds the model
        name = found.config["model"].get("name")
        if model_name and model_name != name:
            raise WeightsError(f"model={model_name} but checkpoint {given!r} holds a {name}")
        classes, which = class_names(found), which_weights(found, use_ema, file)
        model = model_from_config(found.config, found.state_dict, len(classes or []) or None, edits)
        return LoadedModel(model.eval(), name, classes, prescribed_preprocessing(found), given, found.config, which)
    if found.timm_model is not None:  # timm:<name>: timm's architecture for it (vit/models/foundation.py)
        loaded = timm_named_model(found, given, model_name, as_kwargs(edits), img_size, file)
        loaded.which = which_weights(found, use_ema, file)
        return loaded
    if not model_name:
        raise WeightsError(
            f"checkpoint {given!r} is not a checkpoint of this trainer (no config inside): name the model and give "
            f"the file as its weights, model=<name> model.pretrained={given}"
        )
    if model_name not in list_models():
        raise WeightsError(f"model={model_name} is not a known model; known models: {', '.join(list_models())}")
    kwargs = as_kwargs(edits)
    head = found.state_dict.get("head.weight")
    if "num_classes" not in kwargs and head is not None:
        kwargs["num_classes"] = int(head.shape[0])
    prescribed = prescribed_preprocessing(found)
    if "img_size" not in kwargs and (img_size or prescribed):
        kwargs["img_size"] = int(img_size or prescribed.img_size)
    try:
        model = create_model(model_name, **kwargs)
        # Width, depth and heads checked first (naming the model.<key> to set), then every key and shape.
        load_pretrained(model, Weights(found.state_dict, given, found.num_heads))
    except (ValueError, TypeError) as err:
        raise WeightsError(f"model={model_name} with model.pretrained={given}: {err}") from err
    model.float()
    which = which_weights(found, use_ema, file)
    return LoadedModel(model.eval(), model_name, class_names(found), prescribed, given, which=which)


def timm_named_model(
    found: Weights, given: str, model_name: str | None, overrides: Mapping, img_size: int | None, file: str | None
) -> LoadedModel:
    """The model of `model.pretrained=timm:<name>` as training builds it: timm's architecture for `<name>` with the
    kept overrides on top (an architecture setting given beside it is named in one line), the weights' class count,
    and `img_size` (else timm's); `model=<name>` is optional and only says which settings were given."""
    from vit.models import list_models
    from vit.tasks.build import build_model_from_config, model_label
    from vit.weights.read import load_pretrained

    head = found.state_dict.get("head.weight")
    # Without model=<name>, any ViT of the registry: timm's architecture replaces its settings.
    name = model_name or list_models("vit_*")[0]
    model_cfg = {"name": name, **overrides, "pretrained": given, "pretrained_file": file}
    if img_size and "img_size" not in overrides:
        model_cfg["img_size"] = int(img_size)
    if model_cfg.get("num_classes") is None and head is not None:
        model_cfg["num_classes"] = int(head.shape[0])
    model = build_model_from_config(model_cfg)
    try:
        # The file and the timm name it was given for: a wrong file's message names the file and the name's fix.
        weights = Weights(found.state_dict, found.where, found.num_heads, file=found.file, timm_model=found.timm_model)
        load_pretrained(model, weights)
    except (ValueError, TypeError) as err:
        raise WeightsError(f"model.pretrained={given}: {err}") from err
    model.float()
    label = model_label(model_cfg)  # timm:<name>: the architecture built, whatever model=<name> was given
    return LoadedModel(model.eval(), label, class_names(found), prescribed_preprocessing(found), given)


DATA_CONFIGS_DIR = CONFIG_DIR / "data"


def compose_data_config(name: str, edits: Sequence[Edit]):
    """configs/data/<name>.yaml composed with the `data.<key>` arguments, by Hydra."""
    from vit.config.compose import compose
    from vit.errors import ConfigError

    known = sorted(p.stem for p in DATA_CONFIGS_DIR.glob("*.yaml"))
    if name not in known:
        raise WeightsError(f"data={name} is not a known data config; known: {', '.join(known)}")
    try:
        return compose([f"data={name}", *(edit.text for edit in edits)]).data
    except ConfigError as err:  # an unknown key, a value that does not parse
        raise WeightsError(f"data overrides {' '.join(edit.text for edit in edits)}: {err}") from None


def preprocessing_option(value: str | None, data_cfg) -> Preprocessing | None:
    """`preprocess=timm:<name>` (timm's pretrained config of those weights) or `preprocess=data` (the data
    config's validation transform); None when not given."""
    if not value:
        return None
    if value == "data":
        return from_data_config(data_cfg)
    if source_kind(value) == "timm":  # the weight source's prefix names timm's pretrained config too
        try:
            return from_timm(source_name(value))
        except ValueError as err:
            raise WeightsError(f"preprocess={value}: {err}") from err
    raise WeightsError(f"preprocess={value!r} must be 'data' or timm:<model name>")


def resolve(options, default_data: str = "imagefolder") -> tuple[LoadedModel, Preprocessing, object]:
    """The weights, the preprocessing to feed them and the data config, from a script's options: ours from the
    checkpoint (its data config, with data.<key> overrides), foreign ones from model=/model.pretrained= with
    data=<config> (default `default_data`). The preprocessing is `preprocess=` if given, else what the weights
    prescribe (our data config, timm's config of a timm: source), else the data config's."""
    from omegaconf import OmegaConf

    checkpoint, source = options.get("checkpoint"), options.source
    if checkpoint and source:
        raise WeightsError("give checkpoint=<our checkpoint> or model=<name> model.pretrained=<source>, not both")
    given = checkpoint or source
    if not given:
        raise WeightsError("checkpoint=<path> or model=<name> model.pretrained=<source> is required")
    key = "checkpoint" if checkpoint else "model.pretrained"
    use_ema = ema_choice(options)
    options.take_model("freeze")  # a training setting, not the model's
    file = options.take_model("pretrained_file")  # the weights of a timm:<name> source, offline
    if file is not None and checkpoint:
        raise WeightsError(
            "model.pretrained_file gives the weights of model.pretrained=timm:<name>, not of a checkpoint"
        )
    file = None if file is None else str(file)
    found = read_source(given, use_ema=use_ema, key=key, file=file)  # read once
    if use_ema is True:
        require_ema(found, given, file)
    if found.config is not None and "data" in found.config and not options.get("data"):
        data_cfg = OmegaConf.create(found.config["data"])
        OmegaConf.set_struct(data_cfg, True)
        apply_edits(data_cfg, options.data, "data", "the checkpoint's data config")
        OmegaConf.set_struct(data_cfg, False)  # the struct mode was for the edits (a set key must exist)
    else:
        data_cfg = compose_data_config(options.get("data") or default_data, options.data)
    explicit = preprocessing_option(options.get("preprocess"), data_cfg)
    img_size = explicit.img_size if explicit else None
    if img_size is None and found.config is None and found.timm_model is None:
        img_size = int(data_cfg.img_size)
    weights = build_model(found, given, options.get("model"), options.model_edits, img_size, use_ema, file=file)
    if explicit is not None:
        pre = explicit
    elif weights.preprocessing is not None and found.config is None:
        pre = weights.preprocessing  # timm's config for a timm: source
    else:
        pre = from_data_config(data_cfg)  # ours (with any data.* override) or a foreign file
    check_input_size(weights.model, pre.img_size)
    return weights, pre, data_cfg


def ema_choice(options) -> bool | None:
    """`ema=` of a tool's options by EMA_RULE (None: auto), or the trainer's name for the same choice,
    `model.pretrained_ema=`, beside model.pretrained=; both given and disagreeing is one line."""
    given = ema_option(options.get("ema"))
    trainer_name = options.take_model("pretrained_ema")
    if trainer_name is None:
        return given
    as_trainer = ema_option(trainer_name, "model.pretrained_ema")
    if options.get("ema") is not None and given != as_trainer:
        raise WeightsError(
            f"ema={options.get('ema')} and model.pretrained_ema={trainer_name} disagree: give one of them"
        )
    return as_trainer


def check_input_size(model, img_size: int) -> None:
    """Images of another size than the model's need `model.dynamic_img_size=true` (a ViT's position table is then
    resampled to their grid, as timm does): said before any image is read."""
    own = tuple(getattr(model, "img_size", ()))
    dynamic = getattr(getattr(model, "embed", None), "dynamic_img_size", False)
    if not own or own == (img_size, img_size) or dynamic:
        return
    raise WeightsError(
        f"the images are {img_size} px (data.img_size={img_size}) and the model takes {own[0]} px: add "
        f"model.dynamic_img_size=true to run a ViT at another size (a T2T-ViT takes its own size only)"
    )
