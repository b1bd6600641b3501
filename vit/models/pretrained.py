"""Loading weights into our models: timm model names, local .pth/.pt/.safetensors files.

Building a model and loading weights into it are kept apart (as in timm): `create_model` builds, this module
adapts a foreign state dict (position-embedding grid, classifier size, wrapper keys) and loads it.
Files are read with `torch.load(weights_only=True)` or safetensors: never arbitrary pickle.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from vit.models.pos_embed import resample_pos_embed

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]

# Keys under which training scripts nest the weights, in order of preference (EMA weights first, as the
# official T2T-ViT release evaluates them).
WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")

# Per model class: a function (state_dict, model) -> state_dict that renames or drops keys of a foreign
# layout before loading. Registered by the modules that define those classes.
_CHECKPOINT_FILTERS: dict[type, Callable[[StateDict, nn.Module], StateDict]] = {}


def register_checkpoint_filter(model_class: type, fn: Callable[[StateDict, nn.Module], StateDict]) -> None:
    _CHECKPOINT_FILTERS[model_class] = fn


def read_state_dict(path: str | Path) -> StateDict:
    """Read a state dict from a .safetensors file or a torch file (weights_only), unwrapping
    `{"state_dict_ema": ...}`-style containers and a DataParallel/DDP/compile `module.` prefix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj = load_file(str(path))
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated file, pickled code, not a torch file at all
            raise ValueError(f"cannot read checkpoint {str(path)!r} with weights_only=True: {err}") from err
    return unwrap_state_dict(obj, source=str(path))


def unwrap_state_dict(obj: object, source: str = "checkpoint") -> StateDict:
    if isinstance(obj, dict):
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), dict) and obj[key]:
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{source} holds no state dict (expected tensors, optionally under {WRAPPER_KEYS})")
    for prefix in ("module.", "_orig_mod."):
        if obj and all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return obj


def timm_state_dict(name: str) -> StateDict:
    """Weights of a pretrained timm model (timm downloads them where a network exists)."""
    import timm

    return timm.create_model(name, pretrained=True).state_dict()


def adapt_state_dict(state_dict: StateDict, model: nn.Module) -> StateDict:
    """Make a foreign state dict fit `model`: layout filter, position-embedding grid, classifier size."""
    filt = _CHECKPOINT_FILTERS.get(type(model))
    if filt is not None:
        state_dict = filt(state_dict, model)
    state_dict = dict(state_dict)
    own = model.state_dict()

    pos = state_dict.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape:
        if not getattr(model, "pos_embed", nn.Parameter(torch.empty(0))).requires_grad:
            # A fixed sinusoid table is recomputed for the new size, not interpolated.
            state_dict["pos_embed"] = own["pos_embed"]
            log.info("pos_embed: fixed table, recomputed for %s tokens", own["pos_embed"].shape[1])
        else:
            prefix = getattr(model, "num_prefix_tokens", 1)
            new_patches = own["pos_embed"].shape[1] - prefix
            side = math.isqrt(new_patches)
            new_grid = getattr(getattr(model, "patch_embed", None), "grid_size", (side, side))
            state_dict["pos_embed"] = resample_pos_embed(pos, tuple(new_grid), num_prefix_tokens=prefix)
            log.info("pos_embed resampled from %s to %s", tuple(pos.shape), tuple(state_dict["pos_embed"].shape))

    own_head, ckpt_head = own.get("head.weight"), state_dict.get("head.weight")
    if ckpt_head is not None and (own_head is None or own_head.shape != ckpt_head.shape):
        want = 0 if own_head is None else own_head.shape[0]
        # logging's last-resort handler prints warnings to stderr even when nothing is configured.
        log.warning(
            "classifier: checkpoint has %d classes, model has %d; head re-initialised",
            ckpt_head.shape[0],
            want,
        )
        for key in ("head.weight", "head.bias"):
            if key in own:
                state_dict[key] = own[key]
            else:
                state_dict.pop(key, None)
    return state_dict


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


def load_pretrained(model: nn.Module, source: str | Path | StateDict) -> nn.Module:
    """Load weights from `source` into `model` and return it.

    `source` is a timm model name prefixed `timm:` (e.g. "timm:vit_small_patch16_224.augreg_in21k_ft_in1k"),
    a .pth/.pt/.pth.tar/.safetensors file, or a state dict. Position embeddings are resampled to the model's
    grid; a classifier of another size is re-initialised (and said so).
    """
    if isinstance(source, dict):
        state_dict, where = unwrap_state_dict(source), "state dict"
    elif str(source).startswith("timm:"):
        state_dict, where = timm_state_dict(str(source)[len("timm:") :]), str(source)
    else:
        state_dict, where = read_state_dict(source), str(source)
    state_dict = adapt_state_dict(state_dict, model)
    problem = describe_mismatch(state_dict, model)
    if problem:
        raise ValueError(f"weights from {where} do not fit {type(model).__name__}: {problem}")
    model.load_state_dict(state_dict, strict=True)
    return model
