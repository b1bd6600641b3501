"""Fitting weights read from a source to a model: the architecture checked, what may differ adapted, the rest exact.

`vit/weights/read.py` reads a source (a timm name, a weight file, a checkpoint of this trainer) into
`Weights`; this module checks that the weights are the model's architecture (width, depth, heads where the source
records or implies them; for a model built from a timm name, that they are that name's), adapts the position
table (resampled to the model's grid), the patch kernel (resampled to its patch size) and a classifier of another
size (replaced by the model's own), and names every key that still does not fit.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import torch
from torch import nn

from vit.errors import UserError
from vit.models.pos_embed import resample_1d

log = logging.getLogger("vit.weights.fit")  # what is adapted; the trainer quiets it while checking, says it at the load

StateDict = dict[str, torch.Tensor]


class PretrainedError(UserError):
    """A source that cannot be read or does not fit the model: one line naming the source and the problem."""

    kind = "checkpoint"


@dataclass
class Weights:
    """Weights as read from a source (vit/weights/read.py's `read_weights`), before they are fitted to a model."""

    state_dict: StateDict
    where: str  # the source as given, for messages
    num_heads: int | None = None  # where the source records it (timm models, this trainer's checkpoints)
    which: str = ""  # which weights of a source holding several ("its EMA weights")
    class_to_idx: dict | None = None  # the classes its head was trained on, where the source records them
    reset_head: bool = False  # replace the classifier even where its size fits (trained on other classes)
    timm_model: str | None = None  # the timm model (and tag) the weights were released for, when the source says
    config: dict | None = None  # a checkpoint of this trainer: its resolved config (model, data, trainer, ...)
    ema: bool | None = None  # a checkpoint of this trainer: whether these are its EMA weights; None for other sources
    file: str | None = None  # the file read in place of timm's download (model.pretrained_file), for messages


def encoder_shape(state_dict: StateDict) -> tuple[int, int] | None:
    """(width, depth) of a ViT/T2T-ViT state dict, from the first block's `norm1` (C,) and the `blocks.<i>.`
    indices; None when it is not one."""
    norm = state_dict.get("blocks.0.norm1.weight")
    depths = {int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))}
    if norm is None or norm.ndim != 1 or not depths:
        return None
    return int(norm.shape[0]), max(depths) + 1


def implied_heads(state_dict: StateDict, width: int) -> int | None:
    """The number of heads a state dict itself implies: width / head width where a qk-norm's (head_dim,) weight
    gives the head width; None otherwise (qkv is (3C, C) for any count)."""
    q_norm = state_dict.get("blocks.0.attn.q_norm.weight")
    if q_norm is None or q_norm.ndim != 1 or not q_norm.shape[0] or width % q_norm.shape[0]:
        return None
    return width // int(q_norm.shape[0])


def check_architecture(weights: Weights, model: nn.Module) -> None:
    """Width, depth and heads of the weights are the model's: a disagreement names the config keys, or for a model
    whose architecture comes from a timm name (`model.timm_name`, vit/tasks/build.py) says the weights are not
    that name's, before any tensor is compared."""
    shape = encoder_shape(weights.state_dict)
    if shape is None:
        first = ", ".join(list(weights.state_dict)[:4])
        raise PretrainedError(
            f"{weights.where} holds no ViT or T2T-ViT weights (no blocks.<i>.* keys with a blocks.0.norm1; its first "
            f"keys: {first})"
        )
    width, depth = shape
    heads = weights.num_heads or implied_heads(weights.state_dict, width)
    ours = {"embed_dim": model.embed_dim, "depth": len(model.blocks), "num_heads": model.blocks[0].attn.num_heads}
    theirs = {"embed_dim": width, "depth": depth, "num_heads": heads}
    differ = [k for k in ours if theirs[k] is not None and theirs[k] != ours[k]]
    if not differ:
        return
    held = f"a model {width} wide and {depth} deep" + (f" with {heads} heads" if heads else "")
    timm_name = getattr(model, "timm_name", None)
    if timm_name:
        raise PretrainedError(not_the_timm_weights(weights, timm_name, held, ours))
    said = ", ".join(f"model.{k}={ours[k]}" for k in differ)
    want = " ".join(f"model.{k}={theirs[k]}" for k in differ)
    raise PretrainedError(
        f"{weights.where} is {held}, the configured one has {said}: set {want} (or pick the model config of those "
        "weights)"
    )


def not_the_timm_weights(weights: Weights, timm_name: str, held: str, ours: dict) -> str:
    """The message for weights of another shape than the model of `timm_name`: the name fixes the architecture, so
    no model.<key> can fit them; the fixes that can are the name's own weights or the weights' own name."""
    from vit.weights.timm_names import timm_names_fitting

    names = timm_names_fitting(weights.state_dict, like=timm_name)
    own = (
        f"model.pretrained=timm:{names[0]} (timm's models with its keys and shapes: {', '.join(names)})"
        if names
        else "model.pretrained=timm:<the name of the model it holds> (no timm ViT read here has its keys and shapes)"
    )
    name_shape = f"{ours['embed_dim']} wide and {ours['depth']} deep with {ours['num_heads']} heads"
    return (
        f"{weights.file or weights.where} does not hold the weights of timm:{timm_name}: it holds {held}, "
        f"timm:{timm_name} is {name_shape}; give the file of timm:{timm_name}'s weights as model.pretrained_file, or "
        f"the file's own model as {own}"
    )


def adapt_state_dict(state_dict: StateDict, model: nn.Module, reset_head: bool = False) -> StateDict:
    """Make a foreign state dict fit `model`: position table, patch kernel, classifier size (`reset_head`: the
    model's fresh classifier whatever the size)."""
    state_dict = dict(state_dict)
    own = model.state_dict()
    drop_mae_decoder(state_dict, own)
    adapt_final_norm(state_dict, own)
    adapt_pos_embed(state_dict, own, model)
    adapt_factorized(state_dict, own)
    adapt_patch_embed(state_dict, own, model)
    adapt_head(state_dict, own, reset_head)
    return state_dict


# The parts of a masked autoencoder (vit/models/mae.py, the official MAE code) that only pretraining uses.
MAE_DECODER_KEYS = ("mask_token", "decoder_")


def drop_mae_decoder(state_dict: StateDict, own: StateDict) -> None:
    """A masked autoencoder's weights into a model without its decoder (a classifier to fine-tune): the decoder
    and mask token are left behind, said in one line; the encoder is a ViT's and loads as such."""
    if any(k.startswith(MAE_DECODER_KEYS) for k in own):
        return
    dropped = [k for k in state_dict if k.startswith(MAE_DECODER_KEYS)]
    for key in dropped:
        del state_dict[key]
    if dropped:
        log.info("masked autoencoder weights: the encoder loads, the decoder (%d tensors) is left out", len(dropped))


def adapt_final_norm(state_dict: StateDict, own: StateDict) -> None:
    """Weights trained with the final LayerNorm before the pooling (`norm`, token pooling, MAE's encoder) into a
    model that normalises after it (`fc_norm`, average pooling): the model's fresh `fc_norm`, the source's `norm`
    left out, as MAE's fine-tuning does it; said in one line."""
    theirs_before = "norm.weight" in state_dict and "fc_norm.weight" not in state_dict
    ours_after = "fc_norm.weight" in own and "norm.weight" not in own
    if not (theirs_before and ours_after):
        return
    for key in ("norm.weight", "norm.bias"):
        state_dict.pop(key, None)
    for key in ("fc_norm.weight", "fc_norm.bias"):
        state_dict[key] = own[key]
    log.info("final norm: the weights normalise before the pooling, the model after it (fc_norm, initialised)")


def adapt_pos_embed(state_dict: StateDict, own: StateDict, model: nn.Module) -> None:
    """A position table (1, prefix + h*w, C) of another grid: a learned one resampled onto the model's grid with
    timm's `resample_abs_pos_embed` (224/16 -> 32/4: 14x14 -> 8x8; bicubic, or the model's `pos_embed_interp`), a
    fixed sinusoid one recomputed for it."""
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
    prefix = 0 if getattr(model, "no_embed_class", False) else getattr(model, "num_prefix_tokens", 1)
    old_patches, new_patches = pos.shape[1] - prefix, own["pos_embed"].shape[1] - prefix
    side = math.isqrt(old_patches)
    if side * side != old_patches:
        return  # not a square grid: left to the mismatch check, which names the shapes
    new_grid = list(getattr(model, "grid_size", (math.isqrt(new_patches),) * 2))  # the tokenizer's grid
    mode = getattr(getattr(model, "config", None), "pos_embed_interp", "bicubic")  # as the model resamples it
    state_dict["pos_embed"] = resample_abs_pos_embed(
        pos, new_grid, [side, side], num_prefix_tokens=prefix, interpolation=mode
    )
    log.info(
        "pos_embed resampled (%s) from a %dx%d to a %dx%d grid: %s -> %s",
        mode,
        side,
        side,
        *new_grid,
        tuple(pos.shape),
        tuple(state_dict["pos_embed"].shape),
    )


def adapt_factorized(state_dict: StateDict, own: StateDict) -> None:
    """A factorized pair (`pos_embed_y` (1, H, C), `pos_embed_x` (1, W, C)) of another grid: each table resampled
    linearly to the model's side, as the model resamples them for another grid in its forward."""
    for key in ("pos_embed_y", "pos_embed_x"):
        table = state_dict.get(key)
        if table is None or key not in own or table.shape == own[key].shape:
            continue
        if table.ndim != 3 or table.shape[-1] != own[key].shape[-1]:
            continue  # another width: named by the mismatch check
        state_dict[key] = resample_1d(table, own[key].shape[1])
        log.info("%s resampled (linear) from %d to %d rows", key, table.shape[1], own[key].shape[1])


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
    if ckpt_head is None and own_head is not None and "head.bias" not in state_dict:
        # Weights without a classifier (a masked autoencoder, an encoder saved with num_classes=0): the model's own.
        log.warning("classifier: the weights have none; head initialised for %d classes", own_head.shape[0])
        for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
            if key in own:
                state_dict[key] = own[key]
        return
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


def fit_state_dict(weights: Weights, model: nn.Module) -> StateDict:
    """The source's state dict made to fit `model` (architecture checked, then adapted), or PretrainedError
    naming the first missing, unexpected or wrongly shaped keys."""
    check_architecture(weights, model)
    state_dict = adapt_state_dict(weights.state_dict, model, weights.reset_head)
    problem = describe_mismatch(state_dict, model)
    if problem:
        raise PretrainedError(f"weights from {weights.where} do not fit {type(model).__name__}: {problem}")
    return state_dict
