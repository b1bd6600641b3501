"""Attention maps of a trained model over images.

usage: python scripts/visualize_attention.py checkpoint=<path> image=<file or dir> [layer=-1]
    [out=attention.png] [max_images=4] [ema=false]

A PNG grid: the input, the cls-token attention of every head of `layer` upsampled over the image, and the
attention rollout over all layers (Abnar & Zuidema 2020); for a T2T-ViT with transformer tokens also the
attention each token receives in the first T2T stage. A model without a cls token shows the image tokens' mean
attention instead; register tokens are hidden from the maps, and a line under the figure gives their share.
`layer` counts from 0 (negative: from the last), `ema=true` draws the checkpoint's EMA weights, `max_images` caps
the images read from a folder.

Example:

    python scripts/visualize_attention.py checkpoint=outputs/<date>/<time>/checkpoints/best.pt image=cifar10/test/cat \
        layer=-1 max_images=4 out=attention.png
"""

from __future__ import annotations

import sys

from vit.analysis.inputs import denormalise, load_images, load_model
from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.tasks.figures import attention_grid_figure, attention_views, register_note

ARGS = {"checkpoint": None, "image": None, "layer": "-1", "out": "attention.png", "max_images": "4", "ema": "false"}


def integer(args: dict, key: str) -> int:
    try:
        return int(args[key])
    except ValueError:
        raise UsageError(f"{key}={args[key]!r} must be an integer") from None


def main(argv: list[str]) -> int:
    args = parse_args(argv, ARGS, required=("checkpoint", "image"))
    layer, max_images = integer(args, "layer"), integer(args, "max_images")
    if max_images < 1:
        raise UsageError(f"max_images={max_images} must be at least 1")
    model, config, _ = load_model(args["checkpoint"], use_ema=args["ema"].lower() == "true")
    paths, images = load_images(args["image"], config, limit=max_images)  # (B, 3, H, W), normalised
    try:
        views = attention_views(model, images, layer)
    except IndexError as err:
        raise UsageError(str(err)) from err
    heads = views["heads"]
    titles = [p.name for p in paths]
    note = register_note(views, getattr(model, "num_reg_tokens", 0))
    out = attention_grid_figure(
        denormalise(images, config), heads, views["rollout"], args["out"], titles, views.get("token_stage"), note
    )
    print(f"wrote {out} (layer {layer}, {heads.shape[1]} heads, {len(paths)} images)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
