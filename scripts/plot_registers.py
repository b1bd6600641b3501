"""Registers against their absence: the attention maps and the image tokens' norms of two or more trained models.

usage: python scripts/plot_registers.py checkpoints=<a.pt>,<b.pt>[,...] image=<file or dir> [names=base,reg4]
    [layer=-1] [max_images=4] [stats_images=<max_images>] [out=registers.png]

"Vision Transformers Need Registers" (Darcet et al. 2024) found that large ViTs trained long write global
information into a few background patch tokens, whose output norms are then ~10x the others' and which light up
in the attention maps; register tokens take that role instead. For each model this draws, per image, the
head-averaged attention of `layer` over the image's tokens (the cls token's, or the image tokens' mean without
one; registers hidden) and the norm of every image token after the last block. It prints, per model, the ratio of
the largest token norm to the median one (averaged over the images) and the share of attention the registers
take, so whether the artifact is there is read as a number, not only off the picture; both over `stats_images`
images of the folder (the figure draws the first `max_images`).

Example (two runs of the CPU proxy, docs/ABLATIONS.md):

    python scripts/plot_registers.py checkpoints=runs/base/last.pt,runs/reg4/last.pt names=base,reg4 \
        image=cifar10/test/ship max_images=4 out=docs/img/registers.png
"""

from __future__ import annotations

import sys

import torch

from vit.analysis.inputs import denormalise, load_images, load_model
from vit.analysis.plots import registers_figure
from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.tasks.figures import attention_views

ARGS = {
    "checkpoints": None,
    "image": None,
    "names": "",
    "layer": "-1",
    "max_images": "4",
    "stats_images": "",
    "out": "registers.png",
}


@torch.no_grad()
def token_norms(model, images: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each image token at the last block's output, (B, gh, gw): the prefix tokens left out."""
    outputs = []
    handle = model.blocks[-1].register_forward_hook(lambda mod, inp, out: outputs.append(out))
    try:
        model.eval()(images)
    finally:
        handle.remove()
    tokens = outputs[0][:, model.num_prefix_tokens :]  # (B, N, C)
    return tokens.norm(dim=-1).reshape(-1, *model.grid_size)


def main(argv: list[str]) -> int:
    args = parse_args(argv, ARGS, required=("checkpoints", "image"), lists=("checkpoints", "names"))
    checkpoints = args["checkpoints"]
    names = args["names"] or [f"model {i + 1}" for i in range(len(checkpoints))]
    if len(names) != len(checkpoints):
        raise UsageError(f"names={args['names']!r} gives {len(names)} names for {len(checkpoints)} checkpoints")
    try:
        layer, max_images = int(args["layer"]), int(args["max_images"])
        stats_images = int(args["stats_images"] or max_images)
    except ValueError:
        raise UsageError("layer=, max_images= and stats_images= must be integers") from None
    if min(max_images, stats_images) < 1:
        raise UsageError(f"max_images={max_images} and stats_images={stats_images} must be at least 1")
    panels, lines, pictures = [], [], None
    for name, checkpoint in zip(names, checkpoints, strict=True):
        model, config, _ = load_model(checkpoint)
        _, images = load_images(args["image"], config, limit=max(max_images, stats_images))
        try:
            views = attention_views(model, images[:stats_images], layer)
        except IndexError as err:
            raise UsageError(str(err)) from err
        norms = token_norms(model, images[:stats_images])  # (B, gh, gw)
        flat = norms.flatten(1)
        ratio = (flat.max(dim=1).values / flat.median(dim=1).values).mean().item()
        registers = getattr(model, "num_reg_tokens", 0)
        share = (
            f", registers take {100 * views['register_share'].mean().item():.0f}% of the attention" if registers else ""
        )
        lines.append(f"{name}: largest/median token norm {ratio:.2f}{share}")
        attention = views["heads"][:max_images].mean(dim=1).numpy()  # (B, H, W): the head mean
        panels.append((name, attention, norms[:max_images].numpy()))
        pictures = denormalise(images[:max_images], config) if pictures is None else pictures
    note = f"layer {layer}, over {stats_images} images; " + "; ".join(lines)
    out = registers_figure(pictures, panels, args["out"], note)
    for line in lines:
        print(line)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
