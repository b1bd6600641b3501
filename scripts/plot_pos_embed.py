"""Position-embedding similarity, the grid-of-grids figure of the ViT paper.

usage: python scripts/plot_pos_embed.py checkpoint=<path> [out=pos_embed.png]

Left: the checkpoint's embeddings (learned, sinusoidal, or a factorized pair's row + column sums); right: the fixed
sinusoid table of the same shape, for comparison. Each small map shows how similar one patch position's embedding
is to every other.
`checkpoint` is a checkpoint of the trainer (best.pt, last.pt); `out` the PNG to write.

Example:

    python scripts/plot_pos_embed.py checkpoint=outputs/<date>/<time>/checkpoints/best.pt out=pos_embed.png
"""

from __future__ import annotations

import sys

from vit.analysis.inputs import load_model
from vit.analysis.plots import pos_embed_similarity_figure
from vit.analysis.pos_embed import position_similarity
from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.models import sinusoid_table


def main(argv: list[str]) -> int:
    args = parse_args(argv, {"checkpoint": None, "out": "pos_embed.png"}, required=("checkpoint",))
    model, config, _ = load_model(args["checkpoint"])
    grid = model.grid_size if hasattr(model, "grid_size") else model.patch_embed.grid_size
    kind = config["model"].get("pos_embed")
    if not model.has_position_table:
        raise UsageError(f"the model has no position table to draw (model.pos_embed={kind}: rotary, in the attention)")
    if kind != "factorized":
        kind = "learned" if model.pos_embed.requires_grad else "sinusoidal"
    prefix = 0 if getattr(model, "no_embed_class", False) else getattr(model, "num_prefix_tokens", 1)  # table rows
    table = model.position_table(grid).detach()  # (1, P + rows * columns, C); a factorized pair's sums
    ours = position_similarity(table, grid, prefix)
    rows, width = table.shape[1:]
    reference = position_similarity(sinusoid_table(rows, width), grid, prefix)
    name = config["model"]["name"]
    panels = [(f"{name}: {kind} ({grid[0]}x{grid[1]})", ours.numpy()), ("sinusoidal reference", reference.numpy())]
    out = pos_embed_similarity_figure(panels, args["out"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
