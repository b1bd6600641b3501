"""What a masked autoencoder (a task=mae run) sees and predicts: original, masked and reconstructed images.

usage: python scripts/plot_mae.py checkpoint=<last.pt of a task=mae run> image=<file or dir> [max_images=6]
    [mask_ratio=<the run's>] [seed=0] [out=mae_reconstructions.png]

Each row is one image through the model's validation transform: the image, the patches the encoder sees (the
hidden ones grey), and the reconstruction (the predicted pixels of the hidden patches beside the visible ones).
With norm_pix_loss the model predicts each patch normalised, so a hidden patch is drawn with its true patch's
mean and spread: the figure shows the structure the model predicts, not its brightness. The masks come from
`seed` (the same every time). Prints the reconstruction loss over these images, on the hidden patches only.

Example (the CPU pretraining run of docs/MAE.md):

    python scripts/plot_mae.py checkpoint=runs/mae/checkpoints/last.pt image=cifar10/test max_images=6 \\
        out=docs/img/mae_reconstructions.png
"""

from __future__ import annotations

import sys

import torch

from vit.analysis.inputs import load_images, load_model
from vit.cli.args import parse_args, run_script
from vit.data.sources.registry import mean_std
from vit.errors import UsageError
from vit.tasks.figures import reconstruction_views

ARGS = {"checkpoint": None, "image": None, "max_images": "6", "mask_ratio": "", "seed": "0", "out": "mae.png"}


def main(argv: list[str]) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args = parse_args(argv, ARGS, required=("checkpoint", "image"))
    try:
        max_images, seed = int(args["max_images"]), int(args["seed"])
        ratio = float(args["mask_ratio"]) if args["mask_ratio"] else None
    except ValueError:
        raise UsageError("max_images= and seed= must be integers, mask_ratio= a number") from None
    if max_images < 1:
        raise UsageError(f"max_images={max_images} must be at least 1")
    model, config, _ = load_model(args["checkpoint"])
    if config.get("task") != "mae":
        raise UsageError(f"checkpoint={args['checkpoint']!r} is not a task=mae run: it has no decoder to draw")
    if ratio is not None:
        if not 0.0 < ratio < 1.0:
            raise UsageError(f"mask_ratio={ratio} must be in (0, 1)")
        model.mask_ratio = ratio
    paths, images = load_images(args["image"], config, limit=max_images)
    mean, std = mean_std(config["data"])
    original, masked, recon = reconstruction_views(model, images, mean, std, seed=seed)
    noise = torch.rand(images.shape[0], model.patch_embed.num_patches, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        loss = model(images, noise=noise)[0].item()
    rows = len(paths)
    fig, axes = plt.subplots(rows, 3, figsize=(6, 2 * rows), squeeze=False)
    for row in range(rows):
        for col, (title, picture) in enumerate((("image", original), ("masked", masked), ("reconstruction", recon))):
            ax = axes[row, col]
            ax.imshow(picture[row].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(title, fontsize=9)
    fig.suptitle(f"mask ratio {model.mask_ratio:g}, reconstruction loss {loss:.3f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args["out"], dpi=120)
    plt.close(fig)
    print(f"{rows} images, mask ratio {model.mask_ratio:g}: reconstruction loss {loss:.4f} -> {args['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
