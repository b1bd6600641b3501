"""Attention maps of a trained model over images.

    python scripts/visualize_attention.py checkpoint=<path> image=<file or dir> [layer=-1] [out=attention.png]
        [max_images=4] [ema=false]

A PNG grid: the input, the cls-token attention of every head of `layer` upsampled over the image, and the
attention rollout over all layers (Abnar & Zuidema 2020); for a T2T-ViT with transformer tokens also the
attention each token receives in the first T2T stage.
"""

from __future__ import annotations

import sys

import torch

from vit.analysis.attention_maps import cls_attention, rollout, upsample
from vit.analysis.figures import attention_grid_figure
from vit.analysis.inputs import UsageError, denormalise, load_images, load_model, parse_args, run_script
from vit.models import capture_attention

ARGS = {"checkpoint": None, "image": None, "layer": "-1", "out": "attention.png", "max_images": "4", "ema": "false"}


def main(argv: list[str]) -> int:
    args = parse_args(argv, ARGS, required=("checkpoint", "image"))
    model, config, _ = load_model(args["checkpoint"], use_ema=args["ema"].lower() == "true")
    paths, images = load_images(args["image"], config, limit=int(args["max_images"]))
    with torch.no_grad(), capture_attention(model) as maps:
        model(images)
    tokens = maps[-1].shape[-1]
    encoder = [m for m in maps if m.shape[-1] == tokens]  # T2T models also record their token stages
    layer = int(args["layer"])
    if not -len(encoder) <= layer < len(encoder):
        raise UsageError(f"layer={layer} is out of range: the model has {len(encoder)} attention layers")
    grid = model.grid_size if hasattr(model, "grid_size") else model.patch_embed.grid_size
    size = tuple(images.shape[-2:])
    heads = upsample(cls_attention(encoder[layer], grid), size)  # (B, heads, H, W)
    rolled = upsample(rollout(encoder)[:, 0, 1:].reshape(-1, 1, *grid), size)  # (B, 1, H, W)
    token_maps = None
    if len(maps) > len(encoder):  # first T2T stage: attention received per token, mean over queries
        first = maps[0].mean(dim=(1, 2))  # (B, N0)
        side = int(first.shape[-1] ** 0.5)
        token_maps = upsample(first.reshape(-1, 1, side, side), size)
    out = attention_grid_figure(
        denormalise(images, config), heads, rolled, args["out"], [p.name for p in paths], token_maps
    )
    print(f"wrote {out} (layer {layer}, {heads.shape[1]} heads, {len(paths)} images)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
