"""Loading weights into our models: timm model names, local weight files, the official T2T-ViT release files, and
the checkpoints of this trainer.

Building a model and loading weights into it are kept apart (as in timm): `create_model` builds, this module
reads a source, checks that its architecture is the model's (width, depth, heads where the source records them),
adapts what may differ (position table, patch kernel, classifier size, wrapper keys) and loads the rest exactly.
Files are read with `torch.load(weights_only=True)` or safetensors: never arbitrary pickle.

Sources (`load_pretrained(model, source)`, the trainer's `model.pretrained=<source>`):
    timm:<name>[.<tag>]            timm's own download and cache (Hugging Face hub or timm's URL)
    <file>.safetensors|.pth|.pt|.bin   a state dict in timm's layout, bare or under one of WRAPPER_KEYS
    <file>.pth.tar                 an official T2T-ViT release: {"state_dict_ema": ..., "state_dict": ...}
    last.pt / best.pt              a checkpoint of this trainer: its EMA weights when it holds them
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]

# Keys under which training scripts nest the weights, in order of preference (EMA weights first, as the
# official T2T-ViT release evaluates them); RAW_FIRST when the raw weights are asked for.
WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")
RAW_FIRST = ("state_dict", "model", "state_dict_ema", "model_ema")
SOURCE_FORMS = "timm:<name>, a .safetensors/.pth/.pt/.bin file, a .pth.tar release file or a last.pt/best.pt"

# Per model class: a function (state_dict, model) -> state_dict that renames or drops keys of a foreign
# layout before loading. Registered by the modules that define those classes.
_CHECKPOINT_FILTERS: dict[type, Callable[[StateDict, nn.Module], StateDict]] = {}


class PretrainedError(ValueError):
    """A source that cannot be read or does not fit the model: one line naming the source and the problem."""


@dataclass
class Pretrained:
    """Weights read from a source, before they are fitted to a model."""

    state_dict: StateDict
    where: str  # the source as given, for messages
    num_heads: int | None = None  # where the source records it (timm models, this trainer's checkpoints)
    which: str = ""  # which weights of a source holding several ("its EMA weights")
    class_to_idx: dict | None = None  # the classes its head was trained on, where the source records them
    reset_head: bool = False  # replace the classifier even where its size fits (trained on other classes)


def register_checkpoint_filter(model_class: type, fn: Callable[[StateDict, nn.Module], StateDict]) -> None:
    _CHECKPOINT_FILTERS[model_class] = fn


# --- reading ---------------------------------------------------------------------------------------------------


def read_state_dict(path: str | Path, use_ema: bool = True) -> StateDict:
    """The state dict of a weight file (see `read_file`)."""
    return read_file(path, use_ema).state_dict


def read_file(path: str | Path, use_ema: bool = True) -> Pretrained:
    """Read a .safetensors file or a torch file (weights_only), unwrapping `{"state_dict_ema": ...}`-style
    containers, this trainer's checkpoints and a DataParallel/DDP/compile `module.` prefix. `use_ema`: of a file
    holding EMA and raw weights, the EMA ones."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {str(path)!r} does not exist")
    if path.stat().st_size == 0:
        raise PretrainedError(f"cannot read {str(path)!r}: the file is empty (0 bytes)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            obj = load_file(str(path))
        except Exception as err:  # truncated or not a safetensors file
            raise PretrainedError(f"cannot read safetensors file {str(path)!r}: {_first_line(err)}") from err
        return Pretrained(unwrap_state_dict(obj, source=str(path)), str(path))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated file, pickled code, not a torch file at all
        from vit.train.checkpoint import read_error_reason  # here: vit.train imports this package

        reason = read_error_reason(err)
        if reason.startswith("not a torch checkpoint") and path.open("rb").read(2) == b"PK":  # a cut zip archive
            reason = f"the file is truncated or corrupted ({_first_line(err)})"
        raise PretrainedError(f"cannot read {str(path)!r} with weights_only=True: {reason}") from err
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
    return obj


def read_source(source: str | Path, use_ema: bool = True) -> Pretrained:
    """`timm:<name>` through timm, anything else as a file."""
    if str(source).startswith("timm:"):
        return timm_weights(str(source)[len("timm:") :])
    return read_file(source, use_ema)


# --- timm ------------------------------------------------------------------------------------------------------


def timm_state_dict(name: str) -> StateDict:
    """Weights of a pretrained timm model (timm downloads them where a network exists)."""
    return timm_weights(name).state_dict


def timm_weights(name: str) -> Pretrained:
    """A pretrained timm model's weights and head count. An unknown name or tag, and a download that cannot
    happen (no network, nothing cached), are one PretrainedError naming the cache looked in."""
    import timm

    check_timm_name(name)
    cache, cached = timm_cache(name)
    online = host_reachable(timm_host(name))
    if not (cached or online):
        raise PretrainedError(
            f"cannot download the weights of {name} (no network: {timm_host(name)} is unreachable, or offline "
            f"mode is on) and they are not in timm's cache {cache}; download them where a network exists, or give a "
            "file: model.pretrained=/path/to/weights.safetensors"
        )
    try:
        with offline_hub(not online):  # cached, no network: read the cache without retrying the hub
            model = timm.create_model(name, pretrained=True)
    except Exception as err:  # the download or the cached file failed in timm / huggingface_hub
        raise PretrainedError(
            f"timm could not load the weights of {name} ({_first_line(err)}); looked in {cache}; give a file "
            "instead: model.pretrained=/path/to/weights.safetensors"
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
    from huggingface_hub import constants
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is not None and not cfg.hf_hub_id and cfg.url:
        return urlparse(cfg.url).hostname or ""
    return urlparse(constants.ENDPOINT).hostname or ""


def host_reachable(host: str, timeout: float = 3.0) -> bool:
    """A TCP connection to `host`:443 opens, and the hub's offline mode (HF_HUB_OFFLINE=1) is off."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or not host:
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def offline_hub(enabled: bool) -> Iterator[None]:
    """The hub's offline mode for a cached file without a network: huggingface_hub would otherwise retry
    its HEAD request for most of a minute before falling back to the cache."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = before or enabled
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


# --- fitting ---------------------------------------------------------------------------------------------------


def encoder_shape(state_dict: StateDict) -> tuple[int, int] | None:
    """(width, depth) of a ViT/T2T-ViT state dict, from `cls_token` (1, 1, C) and the `blocks.<i>.` indices;
    None when it is not one."""
    cls = state_dict.get("cls_token")
    depths = {int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))}
    if cls is None or cls.ndim != 3 or not depths:
        return None
    return int(cls.shape[-1]), max(depths) + 1


def check_architecture(weights: Pretrained, model: nn.Module) -> None:
    """Width, depth and heads of the weights are the model's: a disagreement names the config keys, before any
    tensor is compared."""
    shape = encoder_shape(weights.state_dict)
    if shape is None:
        first = ", ".join(list(weights.state_dict)[:4])
        raise PretrainedError(
            f"{weights.where} holds no ViT or T2T-ViT weights (no cls_token and blocks.<i>.* keys; its first keys: "
            f"{first})"
        )
    width, depth = shape
    ours = {"embed_dim": model.embed_dim, "depth": len(model.blocks), "num_heads": model.blocks[0].attn.num_heads}
    theirs = {"embed_dim": width, "depth": depth, "num_heads": weights.num_heads}
    differ = [k for k in ours if theirs[k] is not None and theirs[k] != ours[k]]
    if differ:
        said = ", ".join(f"model.{k}={ours[k]}" for k in differ)
        want = " ".join(f"model.{k}={theirs[k]}" for k in differ)
        raise PretrainedError(
            f"{weights.where} is a model {width} wide and {depth} deep"
            + (f" with {weights.num_heads} heads" if weights.num_heads else "")
            + f", the configured one has {said}: set {want} (or pick the model config of those weights)"
        )


def adapt_state_dict(state_dict: StateDict, model: nn.Module, reset_head: bool = False) -> StateDict:
    """Make a foreign state dict fit `model`: layout filter, position table, patch kernel, classifier size
    (`reset_head`: the model's fresh classifier whatever the size)."""
    filt = _CHECKPOINT_FILTERS.get(type(model))
    if filt is not None:
        state_dict = filt(state_dict, model)
    state_dict = dict(state_dict)
    own = model.state_dict()
    adapt_pos_embed(state_dict, own, model)
    adapt_patch_embed(state_dict, own, model)
    adapt_head(state_dict, own, reset_head)
    return state_dict


def adapt_pos_embed(state_dict: StateDict, own: StateDict, model: nn.Module) -> None:
    """A position table (1, prefix + h*w, C) of another grid: a learned one resampled bicubically onto the
    model's grid with timm's `resample_abs_pos_embed` (224/16 -> 32/4: 14x14 -> 8x8), a fixed sinusoid one
    recomputed for it."""
    from timm.layers import resample_abs_pos_embed

    pos = state_dict.get("pos_embed")
    if pos is None or "pos_embed" not in own or pos.shape == own["pos_embed"].shape:
        return
    if pos.ndim != 3 or pos.shape[-1] != own["pos_embed"].shape[-1]:
        return  # another width: named by the mismatch check
    if not getattr(model, "pos_embed", nn.Parameter(torch.empty(0))).requires_grad:
        state_dict["pos_embed"] = own["pos_embed"]
        log.info("pos_embed: fixed sinusoid table, recomputed for %d tokens", own["pos_embed"].shape[1])
        return
    prefix = getattr(model, "num_prefix_tokens", 1)
    old_patches, new_patches = pos.shape[1] - prefix, own["pos_embed"].shape[1] - prefix
    side = math.isqrt(old_patches)
    if side * side != old_patches:
        return  # not a square grid: left to the mismatch check, which names the shapes
    embed = getattr(model, "patch_embed", None)
    new_grid = list(getattr(embed, "grid_size", (math.isqrt(new_patches),) * 2))
    state_dict["pos_embed"] = resample_abs_pos_embed(pos, new_grid, [side, side], num_prefix_tokens=prefix)
    log.info(
        "pos_embed resampled from a %dx%d to a %dx%d grid: %s -> %s",
        side,
        side,
        *new_grid,
        tuple(pos.shape),
        tuple(state_dict["pos_embed"].shape),
    )


def adapt_patch_embed(state_dict: StateDict, own: StateDict, model: nn.Module) -> None:
    """A patch kernel (C, 3, p, p) of another patch size: resampled to the model's with timm's
    `resample_patch_embed` (FlexiViT's pseudo-inverse resize, which keeps each patch's token as it was for
    images resized with the patch). Only the standard patch embedding; other kinds keep their own check."""
    from timm.layers import resample_patch_embed

    key = "patch_embed.proj.weight"
    theirs, mine = state_dict.get(key), own.get(key)
    if theirs is None or mine is None or theirs.shape == mine.shape:
        return
    if getattr(model, "patch_embed_kind", "standard") != "standard" or theirs.shape[:2] != mine.shape[:2]:
        return  # another width or channel count, or a shifted/overlapping kernel: named by the mismatch check
    state_dict[key] = resample_patch_embed(theirs, list(mine.shape[-2:]))
    log.info("patch_embed.proj.weight resampled from patch %s to %s", tuple(theirs.shape[-2:]), tuple(mine.shape[-2:]))


def adapt_head(state_dict: StateDict, own: StateDict, reset: bool = False) -> None:
    """A classifier of another class count (or, with `reset`, trained on other classes) is replaced by the
    model's freshly initialised one, said in one line."""
    own_head, ckpt_head = own.get("head.weight"), state_dict.get("head.weight")
    same_size = own_head is not None and ckpt_head is not None and own_head.shape == ckpt_head.shape
    if ckpt_head is None or (same_size and not reset):
        return
    want = 0 if own_head is None else own_head.shape[0]
    other = " (other classes)" if same_size else ""
    # logging's last-resort handler prints warnings to stderr even when nothing is configured.
    log.warning(
        "classifier: checkpoint has %d classes, model has %d%s; head re-initialised", ckpt_head.shape[0], want, other
    )
    for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):  # head_dist: distilled models
        if key in own:
            state_dict[key] = own[key]
        else:
            state_dict.pop(key, None)


def describe_mismatch(state_dict: StateDict, model: nn.Module, limit: int = 5) -> str | None:
    """None when `state_dict` fits `model` exactly, else a message naming the first differences."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    wrong_shape = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state_dict and state_dict[k].shape != own[k].shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys (e.g. {', '.join(missing[:limit])})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys (e.g. {', '.join(unexpected[:limit])})")
    if wrong_shape:
        parts.append(f"{len(wrong_shape)} shape mismatches ({'; '.join(wrong_shape[:limit])})")
    return "; ".join(parts) if parts else None


def fit_state_dict(weights: Pretrained, model: nn.Module) -> StateDict:
    """The source's state dict made to fit `model` (architecture checked, then adapted), or PretrainedError
    naming the first missing, unexpected or wrongly shaped keys."""
    check_architecture(weights, model)
    state_dict = adapt_state_dict(weights.state_dict, model, weights.reset_head)
    problem = describe_mismatch(state_dict, model)
    if problem:
        raise PretrainedError(f"weights from {weights.where} do not fit {type(model).__name__}: {problem}")
    return state_dict


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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].strip() if text else type(err).__name__
