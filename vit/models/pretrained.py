"""Loading weights into our models: timm model names, local weight files, the official T2T-ViT release files, and
the checkpoints of this trainer.

Building a model and loading weights into it are kept apart (as in timm): `create_model` builds, this module
reads a source into a `Pretrained` (unwrapping wrapper keys and prefixes), and `vit/models/fit.py` checks that its
architecture is the model's, adapts what may differ (position table, patch kernel, classifier size) and leaves
the rest to load exactly. Files are read with `torch.load(weights_only=True)` or safetensors: never arbitrary
pickle.

Sources (`load_pretrained(model, source)`, the trainer's `model.pretrained=<source>`):
    timm:<name>[.<tag>]            timm's own download and cache (Hugging Face hub or timm's URL)
    <file>.safetensors|.pth|.pt|.bin   a state dict in timm's layout, bare or under one of WRAPPER_KEYS
    <file>.pth.tar                 an official T2T-ViT release: {"state_dict_ema": ..., "state_dict": ...}
    last.pt / best.pt              a checkpoint of this trainer: its EMA weights when it holds them
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

# Fitting lives in vit/models/fit.py; its names are importable from here too, where callers have always found them.
from vit.hub import host_reachable, hub_host, offline_hub
from vit.models.fit import (
    Pretrained,
    PretrainedError,
    StateDict,
    describe_mismatch,
    fit_state_dict,
)
from vit.models.weights_file import WeightsFileError, first_line, read_weights_file

__all__ = [
    "SOURCE_FORMS",
    "WRAPPER_KEYS",
    "Pretrained",
    "PretrainedError",
    "describe_mismatch",
    "eva_to_vit_keys",
    "fit_state_dict",
    "load_pretrained",
    "read_file",
    "read_source",
    "read_state_dict",
    "timm_weights",
    "unwrap_state_dict",
]

# Keys under which training scripts nest the weights, in order of preference (EMA weights first, as the
# official T2T-ViT release evaluates them); RAW_FIRST when the raw weights are asked for.
WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")
RAW_FIRST = ("state_dict", "model", "state_dict_ema", "model_ema")
SOURCE_FORMS = "timm:<name>, a .safetensors/.pth/.pt/.bin file, a .pth.tar release file or a last.pt/best.pt"

# --- reading ---------------------------------------------------------------------------------------------------


def read_state_dict(path: str | Path, use_ema: bool = True) -> StateDict:
    """The state dict of a weight file (see `read_file`)."""
    return read_file(path, use_ema).state_dict


def read_file(path: str | Path, use_ema: bool = True) -> Pretrained:
    """Read a .safetensors file or a torch file (weights_only), unwrapping `{"state_dict_ema": ...}`-style
    containers, this trainer's checkpoints and a DataParallel/DDP/compile `module.` prefix. `use_ema`: of a file
    holding EMA and raw weights, the EMA ones."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")  # the caller names the setting
    try:
        obj = read_weights_file(path)
    except WeightsFileError as err:
        raise PretrainedError(str(err)) from None
    if is_trainer_checkpoint(obj):
        return trainer_weights(obj, str(path), use_ema)
    return Pretrained(unwrap_state_dict(obj, str(path), use_ema), str(path))


def is_trainer_checkpoint(obj: object) -> bool:
    """A last.pt/best.pt of this trainer (vit/train/checkpoint.py): weights beside their config and optimizer."""
    return isinstance(obj, dict) and isinstance(obj.get("model"), dict) and "config" in obj and "optimizer" in obj


def trainer_weights(state: dict, where: str, use_ema: bool) -> Pretrained:
    """A checkpoint of this trainer: its EMA weights when it holds them and `use_ema`, else the raw ones; the
    number of heads from its saved config."""
    ema = state.get("ema")
    if use_ema and isinstance(ema, dict) and ema:
        weights, which = ema, "its EMA weights"
    else:
        weights = state["model"]
        which = "its raw weights" + (" (it holds no EMA)" if use_ema else "")
    heads = ((state.get("config") or {}).get("model") or {}).get("num_heads")
    classes = state.get("class_to_idx") or None
    return Pretrained(unwrap_state_dict(weights, where), where, int(heads) if heads else None, which, classes)


def unwrap_state_dict(obj: object, source: str = "checkpoint", use_ema: bool = True) -> StateDict:
    if isinstance(obj, dict):
        for key in WRAPPER_KEYS if use_ema else RAW_FIRST:
            if isinstance(obj.get(key), dict) and obj[key]:
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise PretrainedError(f"{source} holds no state dict (expected tensors, optionally under {WRAPPER_KEYS})")
    for prefix in ("module.", "_orig_mod."):
        if all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return eva_to_vit_keys(obj)


# timm's Eva models, its RoPE ViTs among them, name LayerScale `blocks.<i>.gamma_1` / `gamma_2`, where ours and
# timm's VisionTransformer say `blocks.<i>.ls1.gamma` / `ls2.gamma`; an Eva RoPE ViT's other names are ours already
# (`rope.freqs` included).
EVA_LAYER_SCALE = re.compile(r"^(blocks\.\d+\.)gamma_([12])$")


def eva_to_vit_keys(state_dict: dict) -> dict:
    """The state dict with Eva's LayerScale names in our layout; every other key as it was."""
    return {EVA_LAYER_SCALE.sub(r"\1ls\2.gamma", k): v for k, v in state_dict.items()}


def read_source(source: str | Path, use_ema: bool = True) -> Pretrained:
    """`timm:<name>` through timm, anything else as a file."""
    if str(source).startswith("timm:"):
        return timm_weights(str(source)[len("timm:") :])
    return read_file(source, use_ema)


# --- timm ------------------------------------------------------------------------------------------------------


def timm_weights(name: str, instead: str = "model.pretrained=/path/to/weights.safetensors") -> Pretrained:
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
    return Pretrained(model.state_dict(), f"timm:{name}", heads)


def check_timm_name(name: str) -> None:
    """`vit_small_patch16_224` or `vit_small_patch16_224.augreg_in21k`: a timm model with pretrained weights."""
    import timm

    base = name.split(".", 1)[0]
    if not timm.is_model(base):
        close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise PretrainedError(f"timm has no model {base!r}{hint}")
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


def load_pretrained(model: nn.Module, source: str | Path | StateDict | Pretrained, use_ema: bool = True) -> nn.Module:
    """Load weights from `source` into `model` and return it.

    `source` is a timm model name prefixed `timm:` (e.g. "timm:vit_small_patch16_224.augreg_in21k_ft_in1k"),
    a .safetensors/.pth/.pt/.bin/.pth.tar file, a checkpoint of this trainer, a state dict or a `Pretrained`.
    The position table is resampled to the model's grid, the patch kernel to its patch size, and a classifier
    of another size re-initialised (each said in a log line); everything else must fit exactly.
    """
    if isinstance(source, Pretrained):
        weights = source
    elif isinstance(source, dict):
        weights = Pretrained(unwrap_state_dict(source, use_ema=use_ema), "state dict")
    else:
        weights = read_source(source, use_ema)
    model.load_state_dict(fit_state_dict(weights, model), strict=True)
    return model
