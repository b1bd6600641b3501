"""Export a trained model to ONNX, TorchScript or a torch.export program, checked against PyTorch.

usage: python scripts/export.py checkpoint=<best.pt> [format=onnx|torchscript|exported-program] [output=<path>]
           [batch=dynamic|<n>] [ema=false] [image=<file, folder or a,b,c>] [atol=1e-4]
       python scripts/export.py model=<name> model.pretrained=<timm:name | file> [data=imagefolder]
           [preprocess=data|timm:<name>] output=<path> ...

`output` defaults to a file beside the checkpoint (best.onnx, best.torchscript.pt, best.pt2); beside it goes
`<output>.json` with the preprocessing (image size, resize, interpolation, mean, std), the class names, the
input/output names and the batch size. `batch=dynamic` (default) exports any batch size, `batch=<n>` a fixed
one. The exported file is run on a batch of images (`image=`, else the first images of the checkpoint's
validation split, else generated ones) and its logits compared with the PyTorch model's: ONNX through
onnxruntime, the others through PyTorch; a max |diff| above `atol` fails the command (exit 1) and keeps nothing.
ONNX needs the optional extra: pip install -e '.[export]'.

Example:

    python scripts/export.py checkpoint=outputs/<date>/<time>/checkpoints/best.pt format=onnx batch=dynamic
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vit.deploy.export import (
    ATOL,
    FORMATS,
    ExportError,
    check_writable,
    default_output,
    export_model,
    require_export_extra,
)
from vit.deploy.options import UsageError, parse_options, run_main
from vit.deploy.weights import resolve

KNOWN = ("checkpoint", "model", "format", "output", "batch", "ema", "image", "data", "preprocess", "atol")
CHECK_IMAGES = 8


def check_images(image: str | None, pre, data_cfg) -> tuple[torch.Tensor, str]:
    """A batch of images to compare the export with PyTorch on, and what they are."""
    from vit.analysis.inputs import image_paths
    from vit.data import DataError
    from vit.data.datasets import build_splits, load_rgb

    transform = pre.transform()
    if image:
        paths = [p for spec in image.split(",") for p in image_paths(spec)][:CHECK_IMAGES]
        return torch.stack([transform(load_rgb(str(p))) for p in paths]), f"{len(paths)} images from image={image}"
    try:
        cfg = dict(data_cfg)
        cfg.update(scan_images=False, holdout=None, limit_val_samples=None, download=False)
        val = build_splits(cfg).val
        images = [val[i][0] for i in range(min(CHECK_IMAGES, len(val)))]
        tensors = [transform(im) for im in images]  # the datasets give PIL images
        return torch.stack(tensors), f"the first {len(tensors)} images of the {data_cfg.get('name')} validation split"
    except (DataError, OSError, KeyError, TypeError):
        generator = torch.Generator().manual_seed(0)
        size = pre.img_size
        return (
            torch.randn(CHECK_IMAGES, 3, size, size, generator=generator),
            f"{CHECK_IMAGES} generated images (the data was not found; image=<folder> checks on real ones)",
        )


def main(argv: list[str]) -> int:
    options = parse_options(argv, KNOWN)
    fmt = options.get("format", "onnx")
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt} is not a known format; choose from {', '.join(FORMATS)}")
    if fmt == "onnx":
        require_export_extra()  # before any weights are read
    batch_text = options.get("batch", "dynamic")
    batch = None if batch_text == "dynamic" else options.integer("batch")
    try:
        atol = float(options.get("atol", str(ATOL)))
    except ValueError:
        raise UsageError(f"atol={options.get('atol')!r} must be a number") from None
    given = options.get("checkpoint") or options.source
    output = options.get("output")
    if not output:
        if not given or given.startswith("timm:"):
            raise UsageError("output=<path> is required when the weights are not a local file")
        output = default_output(given, fmt)
    output = Path(output)
    check_writable(output)  # before the weights are read and the model built
    weights, pre, data_cfg = resolve(options)
    images, what = check_images(options.get("image"), pre, data_cfg)
    result = export_model(
        weights.model,
        output,
        fmt,
        pre,
        weights.classes,
        images,
        batch=batch,
        model_name=weights.name,
        source=weights.source,
        atol=atol,
    )
    runtime = "onnxruntime" if fmt == "onnx" else "PyTorch (loaded back)"
    print(
        f"wrote {result.path} ({fmt}, batch {'dynamic' if batch is None else batch}) and {result.side_json}; "
        f"checked with {runtime} on {what}, batches {result.checked_batches}: max |diff| {result.max_abs_diff:.2e} "
        f"<= {atol:g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, usage=__doc__))
