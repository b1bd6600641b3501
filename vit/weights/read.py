"""The one reader of weights. `read_weights(source, ema=...)` turns every source the project takes into `Weights`
(vit/weights/fit.py): a timm name, a checkpoint of this trainer, or a state-dict file. Fine-tuning
(`model.pretrained`), the distillation teacher (`distill.teacher`), evaluation, export, predict and the analysis
scripts only adapt what it returns; `load_pretrained` fits it to a model. Files are read by
vit/weights/files.py (`torch.load(weights_only=True)` or safetensors: never arbitrary pickle).

The kinds of source, in `WEIGHT_SOURCES` (the one place a kind is named):
    timm:<name>[.<tag>]                 timm's own download and cache (Hugging Face hub or timm's URL)
    <file>                              a last.pt/best.pt of this trainer (its config, classes and EMA inside), or
                                        a state dict in timm's layout (.safetensors/.pth/.pt/.bin), bare or under
                                        one of WRAPPER_KEYS, such as an official T2T-ViT release (.pth.tar)

`ema`: of a source holding EMA and raw weights, True takes the EMA ones (a checkpoint of ours must hold them),
False the raw ones, None the EMA ones where there are any.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from vit.errors import UserError
from vit.hub import host_reachable, hub_host, offline_hub
from vit.weights.files import WeightsFileError, first_line, read_weights_file
from vit.weights.fit import PretrainedError, StateDict, Weights, fit_state_dict
from vit.weights.timm_names import timm_keys_to_ours


class CheckpointError(UserError):
    """A checkpoint that cannot be read or does not fit the run: one message naming file and mismatch."""

    kind = "checkpoint"


def load_checkpoint(path: str | Path) -> dict:
    try:
        state = read_weights_file(path, "checkpoint")
    except WeightsFileError as err:
        raise CheckpointError(str(err)) from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {str(path)!r} holds no 'model' state dict")
    return state


def no_ema_message(state: dict, source: str | Path) -> str:
    """Why a checkpoint of this trainer has no EMA weights to evaluate with `ema=true`, in one line."""
    averaged = state.get("averaged_from")
    if averaged:  # vit-average: the average (of EMA or raw weights) is the model's weights
        return (
            f"checkpoint {str(source)!r} holds no separate EMA weights: it is the average of the "
            f"{averaged.get('weights', 'raw')} weights of {len(averaged.get('files', []))} checkpoints "
            "(vit-average), and those are its model weights; leave ema=true out"
        )
    trained = ((state.get("config") or {}).get("trainer") or {}).get("ema")
    why = "trained with trainer.ema=false" if not trained else "the file holds none"
    return f"checkpoint {str(source)!r} has no EMA weights ({why})"


# Keys under which training scripts nest the weights, in order of preference (EMA weights first, as the
# official T2T-ViT release evaluates them); RAW_FIRST when the raw weights are asked for.
WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")
RAW_FIRST = ("state_dict", "model", "state_dict_ema", "model_ema")
GIVE_A_FILE = "model.pretrained=/path/to/weights.safetensors"  # what a failed timm download suggests instead


class NoEmaError(PretrainedError):
    """`ema=True` for a checkpoint of this trainer that holds no EMA weights: the message says why."""


@dataclass(frozen=True)
class WeightSource:
    """A kind of source: how to recognise it and how to read it."""

    prefix: str  # what a source of this kind starts with; "" for a path
    read: Callable[[str, bool | None, str], Weights]  # (source, ema, the setting a failed download suggests)
    form: str  # how to give it, for messages (`source_forms`)


def read_weights(
    source: str | Path, ema: bool | None = None, instead: str = GIVE_A_FILE, file: str | Path | None = None
) -> Weights:
    """The weights of `source` (see the module's docstring). A missing file is FileNotFoundError (the caller names
    its setting and the forms it takes); anything else wrong is one PretrainedError line. `instead`: the setting
    that gives a file in place of a timm download that cannot happen. `file`: for a `timm:<name>` source, the
    file that holds its weights (read instead of timm's download; `model.pretrained_file`)."""
    text = str(source)
    if file is not None:
        if source_kind(text) != "timm":
            raise PretrainedError(f"a weights file is given for a timm:<name> source, not for {text!r}")
        return read_timm_file(source_name(text), str(file), ema)
    return WEIGHT_SOURCES[source_kind(text)].read(source_name(text), ema, instead)


def source_forms() -> str:
    """How a source is given, every kind's form, for messages: "timm:<name>[.<tag>] or a last.pt/best.pt ..."."""
    return " or ".join(entry.form for entry in WEIGHT_SOURCES.values())


def source_kind(source: str) -> str:
    """The kind in WEIGHT_SOURCES whose prefix `source` starts with; a path when none does."""
    return next(kind for kind, entry in WEIGHT_SOURCES.items() if source.startswith(entry.prefix))


def source_name(source: str) -> str:
    """What follows the kind's prefix: timm's model name of `timm:<name>`, a path as it is."""
    return source[len(WEIGHT_SOURCES[source_kind(source)].prefix) :]


def names_a_source(source: object) -> bool:
    """Whether a setting's value can name a source: a non-empty string that is more than a kind's prefix."""
    return isinstance(source, str) and source_name(source.strip()) != ""


def load_pretrained(model: nn.Module, source: str | Path | StateDict | Weights, ema: bool | None = None) -> nn.Module:
    """Load weights from `source` into `model` and return it.

    `source` is anything `read_weights` reads, a state dict or `Weights`. The position table is resampled to the
    model's grid, the patch kernel to its patch size, and a classifier of another size re-initialised (each said
    in a log line); everything else must fit exactly.
    """
    if isinstance(source, Weights):
        weights = source
    elif isinstance(source, dict):
        weights = Weights(unwrap_state_dict(source, ema=ema), "state dict")
    else:
        weights = read_weights(source, ema)
    model.load_state_dict(fit_state_dict(weights, model), strict=True)
    return model


# --- files -------------------------------------------------------------------------------------------------------


def read_file(path: str, ema: bool | None, instead: str = "") -> Weights:
    """A checkpoint of this trainer, or a state dict unwrapped from `{"state_dict_ema": ...}`-style containers and
    a DataParallel/DDP/compile `module.` prefix."""
    if not Path(path).exists():
        raise FileNotFoundError(path)
    try:
        obj = read_weights_file(path)
    except WeightsFileError as err:
        raise PretrainedError(str(err)) from None
    if is_our_checkpoint(obj):
        return checkpoint_weights(obj, path, ema)
    weights = Weights(unwrap_state_dict(obj, path, ema), path)
    weights.which = "raw weights first where it holds EMA ones too" if ema is False else ""
    return weights


def is_our_checkpoint(obj: object) -> bool:
    """A checkpoint of this trainer (vit/train/checkpoints.py, vit-average): its weights under
    "model", beside the config that built them."""
    return isinstance(obj, dict) and isinstance(obj.get("model"), dict) and isinstance(obj.get("config"), dict)


def checkpoint_weights(state: dict, where: str, ema: bool | None) -> Weights:
    """A checkpoint of this trainer: its EMA weights (`ema` True, or None and it holds them) or its raw ones; its
    config, class map and number of heads come along."""
    averaged = state.get("ema")
    has_ema = isinstance(averaged, dict) and bool(averaged)
    if ema and not has_ema:
        raise NoEmaError(no_ema_message(state, where))
    use_ema = has_ema and ema is not False
    which = "its EMA weights" if use_ema else "its raw weights" + (" (it holds no EMA)" if ema is None else "")
    config = state["config"]
    heads = (config.get("model") or {}).get("num_heads")
    return Weights(
        unwrap_state_dict(averaged if use_ema else state["model"], where),
        where,
        int(heads) if heads else None,
        which,
        state.get("class_to_idx") or None,
        config=config,
        ema=use_ema,
    )


def unwrap_state_dict(obj: object, source: str = "checkpoint", ema: bool | None = None) -> StateDict:
    """The state dict inside `obj`: under one of WRAPPER_KEYS (the EMA ones first unless `ema` is False), without a
    `module.`/`_orig_mod.` prefix, in our key layout."""
    if isinstance(obj, dict):
        for key in RAW_FIRST if ema is False else WRAPPER_KEYS:
            if isinstance(obj.get(key), dict) and obj[key]:
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise PretrainedError(f"{source} holds no state dict (expected tensors, optionally under {WRAPPER_KEYS})")
    for prefix in ("module.", "_orig_mod."):
        if all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return timm_keys_to_ours(obj)


# --- timm --------------------------------------------------------------------------------------------------------


def read_timm(name: str, ema: bool | None = None, instead: str = GIVE_A_FILE) -> Weights:
    """A pretrained timm model's weights and head count. An unknown name or tag, and a download that cannot
    happen (no network, nothing cached), are one PretrainedError naming the cache looked in and, as `instead`,
    the setting that gives a file in its place."""
    import timm

    check_timm_name(name)
    cache, cached = timm_cache(name)
    online = host_reachable(timm_host(name))
    if not (cached or online):
        raise PretrainedError(
            f"cannot download the weights of {name} (no network: {timm_host(name)} is unreachable, or offline "
            f"mode is on) and they are not in timm's cache {cache}; download them where a network exists, or give a "
            f"file: {instead}"
        )
    try:
        with offline_hub(not online):  # cached, no network: read the cache without retrying the hub
            model = timm.create_model(name, pretrained=True)
    except Exception as err:  # the download or the cached file failed in timm / huggingface_hub
        raise PretrainedError(
            f"timm could not load the weights of {name} ({first_line(err)}); looked in {cache}; give a file "
            f"instead: {instead}"
        ) from err
    blocks = getattr(model, "blocks", None)
    heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    return Weights(timm_keys_to_ours(model.state_dict()), f"timm:{name}", heads, timm_model=name)


def read_timm_file(name: str, path: str, ema: bool | None) -> Weights:
    """The weights of timm's `name` from a file (`model.pretrained_file`, as timm's
    `pretrained_cfg_overlay=dict(file=...)`): a state dict in timm's layout, read as any weights file. The number
    of heads is the file's own where it records or implies one (vit/weights/fit.py's `implied_heads`), never the
    name's: the file may hold another model, and a message would then give it the name's heads."""
    check_timm_name(name, need_weights=False)
    weights = read_file(path, ema)
    return replace(weights, where=f"{path} (timm:{name})", timm_model=name, file=path)


def check_timm_name(name: str, need_weights: bool = True) -> None:
    """`vit_small_patch16_224` or `vit_small_patch16_224.augreg_in21k`: a timm model with pretrained weights (any
    timm model and tag with `need_weights=False`: the weights come from a file)."""
    import timm

    base = name.split(".", 1)[0]
    if not timm.is_model(base):
        close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise PretrainedError(f"timm has no model {base!r}{hint}")
    if not need_weights:
        return
    tags = timm.list_pretrained(f"{base}.*")
    if not tags:
        raise PretrainedError(f"timm has no pretrained weights for {base!r}")
    if "." in name and name not in tags:
        raise PretrainedError(f"timm has no pretrained weights {name!r}; known tags: {', '.join(tags[:6])}")


def timm_cache(name: str) -> tuple[str, bool]:
    """(the cache timm reads `name`'s weights from, whether they are there): the Hugging Face hub cache for
    weights on the hub, torch hub's checkpoints folder for those behind a URL."""
    from huggingface_hub import constants, try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is not None and cfg.hf_hub_id:
        repo = cfg.hf_hub_id.split("@")[0]
        files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        found = [try_to_load_from_cache(repo, f, cache_dir=constants.HF_HUB_CACHE) for f in files]
        return constants.HF_HUB_CACHE, any(isinstance(f, str) for f in found)
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    url = getattr(cfg, "url", None) or ""
    return str(folder), bool(url) and (folder / Path(urlparse(url).path).name).is_file()


def timm_host(name: str) -> str:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is not None and not cfg.hf_hub_id and cfg.url:
        return urlparse(cfg.url).hostname or ""
    return hub_host()


# The kinds of source, tried in order: the first whose prefix the source starts with reads it.
WEIGHT_SOURCES: dict[str, WeightSource] = {
    "timm": WeightSource("timm:", read_timm, "timm:<name>[.<tag>]"),
    "file": WeightSource("", read_file, "a file (a last.pt/best.pt of this trainer, .safetensors, .pth, .pth.tar)"),
}
