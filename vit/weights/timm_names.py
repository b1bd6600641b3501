"""timm's families' weights under our names: NaFlexVit's and Eva's keys, layouts and split projections in ours
(`timm_keys_to_ours`), and which timm models a file of weights can be (`timm_names_fitting`, for a message that
suggests one)."""

from __future__ import annotations

import math
import re
from typing import Any

import torch

# The timm modules whose models this reads (TIMM_CLASSES): where `timm_names_fitting` looks for a file's model.
TIMM_MODULES = ("vision_transformer", "deit", "eva", "naflexvit")


# Keys that fit after adapting (vit/weights/fit.py: the table resampled to the grid, the kernel to the patch size, the
# classifier replaced): their shapes say nothing about the model a file is of.
ADAPTED = ("pos_embed", "pos_embed_y", "pos_embed_x", "patch_embed.proj.weight")


HEAD_KEYS = ("head.", "head_dist.")


def timm_names_fitting(state_dict: dict, limit: int = 3, like: str = "") -> list[str]:
    """timm's names (without tags) whose model has exactly the keys and shapes of `state_dict` (in our layout; the
    position table, the patch kernel and the classifier aside, which loading adapts): the timm models a file of
    weights can be, for a message that suggests one. Those with pretrained weights first, then those most like
    `like`; at most `limit`. Only models of the file's patch size in the modules read here are tried (a hundred or
    so), each built on the meta device without blocks first, then with one, and at its own depth only where those
    fit: about a second, on the way to an error."""
    import difflib

    import timm

    kernel = state_dict.get("patch_embed.proj.weight")
    if kernel is None or kernel.ndim != 4:
        return []
    theirs = shapes(state_dict)
    stems = [
        {k: v for k, v in theirs.items() if not k.startswith("blocks.") or k.startswith(f"blocks.{depth - 1}.")}
        for depth in (0, 1)
    ]
    names = sorted({n for m in TIMM_MODULES for n in timm.list_models(f"*patch{kernel.shape[-1]}_*", module=m)})
    pretrained = {n.split(".", 1)[0] for n in timm.list_pretrained()}
    names.sort(key=lambda n: (n not in pretrained, -difflib.SequenceMatcher(None, n, like).ratio(), n))
    found = []
    for name in names:
        if all(shapes_of(name, timm_keys_to_ours, depth=d) == stem for d, stem in enumerate(stems)):
            if shapes_of(name, timm_keys_to_ours) == theirs:
                found.append(name)
                if len(found) == limit:
                    break
    return found


def shapes(state_dict: dict) -> dict[str, tuple[int, ...]]:
    """Key -> shape, the keys loading adapts (ADAPTED, HEAD_KEYS) present but shapeless."""
    return {k: () if k in ADAPTED else tuple(v.shape) for k, v in state_dict.items() if not k.startswith(HEAD_KEYS)}


def shapes_of(name: str, to_ours, **timm_kwargs: Any) -> dict[str, tuple[int, ...]] | None:
    """`shapes` of timm's `name` in our layout (`to_ours`), built on the meta device; None where timm fails."""
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **timm_kwargs)
        return shapes(to_ours(model.state_dict()))
    except Exception:  # a model that needs other arguments, or does not build on meta: not a candidate
        return None


# timm's NaFlexVit keeps its patch projection, position table and prefix tokens in `embeds`: `embeds.proj` a Linear
# over patches flattened as (row, column, channel), (C, p * p * 3) (ours: the Conv2d `patch_embed.proj`, (C, 3, p, p),
# the same numbers reordered), `embeds.pos_embed` (1, h, w, C) (ours: (1, h * w, C), rows in row-major order),
# `embeds.cls_token`, `embeds.reg_token`, the factorized `embeds.pos_embed_y`, `embeds.pos_embed_x` (ours without the
# prefix).
NAFLEX_EMBEDS = {
    "embeds.pos_embed_y": "pos_embed_y",
    "embeds.pos_embed_x": "pos_embed_x",
    "embeds.cls_token": "cls_token",
    "embeds.reg_token": "reg_token",
    "embeds.proj.bias": "patch_embed.proj.bias",
}


# timm's Eva models (its RoPE ViTs, DINOv3, EVA-02) name some parameters apart from ours and timm's VisionTransformer:
# LayerScale `blocks.<i>.gamma_1` / `gamma_2` (ours `ls1.gamma` / `ls2.gamma`), and EVA-02 B and L's separate
# `q_proj`, `k_proj`, `v_proj` (ours: one `qkv` = [q | k | v], the biases as `q_bias` and `v_bias` where the keys
# have none, as EVA-02-Ti/S store them) and split SwiGLU `fc1_g`, `fc1_x` (ours: one `fc1` = [gate | value]).
# Every other name is ours already (`rope.freqs`, `q_bias`, `v_bias` included).
EVA_LAYER_SCALE = re.compile(r"^(blocks\.\d+\.)gamma_([12])$")


def timm_keys_to_ours(state_dict: dict) -> dict:
    """The state dict with NaFlexVit's and Eva's names, layouts and split projections in ours (see above); every
    other key as it was."""
    out = {EVA_LAYER_SCALE.sub(r"\1ls\2.gamma", NAFLEX_EMBEDS.get(k, k)): v for k, v in state_dict.items()}
    proj = out.pop("embeds.proj.weight", None)
    if proj is not None:  # (C, p * p * 3) over (row, column, channel) -> (C, 3, p, p); a Conv2d's stays as it is
        side = math.isqrt(proj.shape[1] // 3) if proj.ndim == 2 else 0
        out["patch_embed.proj.weight"] = proj.unflatten(1, (side, side, 3)).permute(0, 3, 1, 2) if side else proj
    table = out.pop("embeds.pos_embed", None)
    if table is not None:  # (1, h, w, C) -> (1, h * w, C)
        out["pos_embed"] = table.flatten(1, 2)
    for prefix in sorted({k[: -len("q_proj.weight")] for k in out if k.endswith(".attn.q_proj.weight")}):
        out[prefix + "qkv.weight"] = torch.cat([out.pop(f"{prefix}{p}_proj.weight") for p in "qkv"])  # (3C, C)
        q, k, v = (out.pop(f"{prefix}{p}_proj.bias", None) for p in "qkv")
        if q is not None and k is None:  # EVA-02: no key bias
            out[prefix + "q_bias"], out[prefix + "v_bias"] = q, v
        elif q is not None:
            out[prefix + "qkv.bias"] = torch.cat([q, k, v])
    for prefix in sorted({k[: -len("fc1_g.weight")] for k in out if k.endswith(".fc1_g.weight")}):
        for kind in ("weight", "bias"):
            if f"{prefix}fc1_g.{kind}" in out:
                gate, value = out.pop(f"{prefix}fc1_g.{kind}"), out.pop(f"{prefix}fc1_x.{kind}")
                out[f"{prefix}fc1.{kind}"] = torch.cat([gate, value])  # [gate | value]
    return out
