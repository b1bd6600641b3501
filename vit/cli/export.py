"""Export a trained model to ONNX, TorchScript or a torch.export program, checked against PyTorch.

usage: vit-export checkpoint=<best.pt> [format=onnx|torchscript|exported-program] [output=<path>]
           [batch=dynamic|<n>] [ema=auto|true|false] [image=<file, folder or a,b,c>] [atol=1e-4]
           [quantize=int8|int8-dynamic|int8-static] [calibration=256] [check_images=<n>] [max_drop=1.0]
           [seq_len=<tokens>]
       vit-export model=<name> model.pretrained=<timm:name | file> [data=imagefolder]
           [preprocess=data|timm:<name>] output=<path> ...

`output` defaults to a file beside the checkpoint (best.onnx, best.torchscript.pt, best.pt2); beside it goes
`<output>.json` with the preprocessing (image size, resize, interpolation, mean, std), the class names, the
input/output names and the batch size. `batch=dynamic` (default) exports any batch size, `batch=<n>` a fixed
one. The exported file is run on a batch of images (`image=`, else the first images of the checkpoint's
validation split, else generated ones) and its logits compared with the PyTorch model's: ONNX through
onnxruntime, the others through PyTorch; a max |diff| above `atol` fails the command (exit 1) and keeps nothing.
ONNX needs the optional extra: pip install -e '.[export]'.

Weights: {ema_rule} The side JSON records them ("weights").

Images at their own shapes: `seq_len=<n>` (format=onnx or torchscript, a ViT with the standard patch embedding)
writes a file that takes NaFlex batches of n tokens instead of image tensors: three inputs, `patches` (batch, n,
p * p * 3) float32, each image's patches in row-major order over its own grid, each flattened as (row, column,
channel), then padding; `patch_coord` (batch, n, 2) int64, each patch's (row, column); `patch_valid` (batch, n)
bool, true for a patch (the side JSON's "input" says the same). Each image goes in whole, resized with its aspect
ratio kept to at most n patches (vit-predict seq_len=<n> does it, and reads the file). The check runs the file on
the check images at their own shapes, every other one also at a quarter of the tokens, packed together.

`quantize=` (format=onnx) writes an INT8 file instead (default name best.int8.onnx), with onnxruntime's
quantization of the linear layers: `int8-dynamic` (int8 weights, activations quantized on the fly), `int8-static`
(activation scales calibrated on `calibration` images of the training split, QDQ format), `int8` (the default way,
chosen by measurement: vit/deploy/quantize.py). The float export is checked against PyTorch as above, then the
float and INT8 files are run on the labelled validation split (all of it, or `check_images` images drawn across
it): both top-1s, their agreement, the largest logit difference and the file sizes are printed and recorded in
the side JSON (`quantization`). When the INT8 file loses more than `max_drop` top-1 points the command fails
(exit 1) and writes nothing.

Example:

    vit-export checkpoint=outputs/<date>/<time>/checkpoints/best.pt format=onnx batch=dynamic
    vit-export checkpoint=outputs/<date>/<time>/checkpoints/best.pt quantize=int8 max_drop=0.5
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

from vit.cli.args import Key, keys_help, parse_args, run_script
from vit.cli.tool_keys import DATA, EMA, MODEL, PREPROCESS
from vit.deploy.export import (
    ATOL,
    DEFAULT_FORMAT,
    EXPORT_FORMATS,
    ExportError,
    Int8Request,
    check_format,
    check_writable,
    default_output,
    export_model,
    naflex_format_refusal,
)
from vit.deploy.loaded_model import resolve, with_ema_rule
from vit.deploy.preprocessing import check_seq_len, naflex_patch_size
from vit.deploy.quantize import CALIBRATION, MAX_DROP, resolve_mode
from vit.errors import UsageError
from vit.weights.read import source_kind

KEYS = {
    "checkpoint": Key("a checkpoint of this trainer to export", kind="path"),
    "model": MODEL,
    "format": Key("onnx, torchscript or exported-program (default: onnx)"),
    "output": Key("the exported file (default: beside the checkpoint, best.onnx ...)", kind="path"),
    "batch": Key("dynamic (any batch size) or a fixed batch size (default: dynamic)"),
    "ema": EMA,
    "image": Key("images to check the export on: files, folders (default: the validation split's)", several=True),
    "data": DATA,
    "preprocess": PREPROCESS,
    "atol": Key(f"the largest |difference| of a logit against PyTorch's (default: {ATOL:g})", kind="number", low=0),
    "quantize": Key("int8, int8-dynamic or int8-static: an INT8 ONNX file instead"),
    "calibration": Key("training images that calibrate int8-static (default: 256)", kind="int", low=1),
    "check_images": Key("validation images the INT8 file is checked on (default: all)", kind="int", low=1),
    "max_drop": Key("the most top-1 points the INT8 file may lose (default: 1.0)"),
    "seq_len": Key("a file that takes NaFlex batches of this many tokens", kind="int", low=1),
}
CHECK_IMAGES = 8


def check_images(image: list[str] | None, pre, data_cfg, naflex: tuple[int, int] | None = None) -> tuple[object, str]:
    """A batch of images to compare the export with PyTorch on, and what they are; with `naflex` (seq_len, patch
    size) a list of images at their own shapes, each at most seq_len patches."""
    from vit.analysis.inputs import image_paths
    from vit.data import DataError
    from vit.data.images import read_rgb
    from vit.data.sources.registry import build_splits

    transform = pre.transform() if naflex is None else pre.naflex_transform(*naflex)
    batch = torch.stack if naflex is None else list
    if image:
        paths = [p for spec in image for p in image_paths(spec)][:CHECK_IMAGES]
        return batch([transform(read_rgb(p)) for p in paths]), f"{len(paths)} images from image={image}"
    try:
        cfg = dict(data_cfg)
        cfg.update(scan_images=False, holdout=None, limit_val_samples=None, download=False)
        val = build_splits(cfg).val
        images = [val[i][0] for i in range(min(CHECK_IMAGES, len(val)))]
        tensors = [transform(im) for im in images]  # the datasets give PIL images
        return batch(tensors), f"the first {len(tensors)} images of the {data_cfg.get('name')} validation split"
    except (DataError, OSError, KeyError, TypeError):
        what = f"{CHECK_IMAGES} generated images (the data was not found; image=<folder> checks on real ones)"
        return generated_images(pre.img_size, naflex), what


def generated_images(size: int, naflex: tuple[int, int] | None) -> object:
    """CHECK_IMAGES random normalised images: (B, 3, size, size), or with `naflex` (seq_len, patch size) a list at
    several aspect ratios (square, wide, tall, long), each resized as its own shape would be for seq_len tokens."""
    from vit.data.loading.naflex_loader import grid_for

    generator = torch.Generator().manual_seed(0)
    if naflex is None:
        return torch.randn(CHECK_IMAGES, 3, size, size, generator=generator)
    seq_len, patch = naflex
    shapes = [(size, size), (size, 2 * size), (2 * size, size), (size, 4 * size)]
    sides = [grid_for(shapes[i % len(shapes)], patch, seq_len) for i in range(CHECK_IMAGES)]
    return [torch.randn(3, height, width, generator=generator) for height, width in sides]


def labelled_images(data_cfg, split: str, count: int | None, pre) -> tuple[np.ndarray, np.ndarray, str]:
    """`count` images of `split` (train | val) drawn across it with a fixed seed (a folder's split is sorted by
    class; its first images would be one class), or all of them, through the evaluation preprocessing, their
    labels, and the split's name (train; holdout with data.holdout, else the one it came from: test, val, ...)."""
    from vit.data import DataError
    from vit.data.sources.registry import build_splits

    cfg = dict(data_cfg)
    cfg.update(scan_images=False, limit_val_samples=None, limit_train_samples=None, download=False)
    try:
        splits = build_splits(cfg)
    except (DataError, OSError) as err:
        raise ExportError(
            f"quantize needs the model's data for the calibration and the accuracy check: {err} "
            "(data.root=<folder or archive> points at it)"
        ) from None
    dataset, name = (splits.train, "train") if split == "train" else (splits.val, splits.val_name)
    order = np.random.default_rng(0).permutation(len(dataset))[: count or len(dataset)]
    transform = pre.transform()
    images, labels = [], []
    for index in order:
        image, label = dataset[int(index)]
        images.append(transform(image).numpy())
        labels.append(int(label))
    return np.stack(images), np.asarray(labels), name


def int8_request(options, pre, data_cfg) -> Int8Request:
    """quantize=...: its mode, the labelled check images and the calibration images."""
    mode = resolve_mode(options.get("quantize"))
    images, labels, split = labelled_images(data_cfg, "val", options.integer("check_images"), pre)
    count = options.integer("calibration", CALIBRATION)
    calibration = labelled_images(data_cfg, "train", count, pre)[0] if mode == "int8-static" else None
    return Int8Request(mode, (images, labels), calibration, read_max_drop(options), split)


def read_max_drop(options) -> float:
    """The most top-1 points the INT8 file may lose; a negative bar asks for a gain (a refusal on purpose)."""
    text = options.get("max_drop", str(MAX_DROP))
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise UsageError(f"max_drop={text!r} must be a number of top-1 points")
    return value


def check_int8_options(options, fmt: str) -> None:
    """The quantize options, before any weights are read."""
    quantize = options.get("quantize")
    int8_only = [k for k in ("calibration", "check_images", "max_drop") if options.get(k) is not None]
    if quantize is None:
        if int8_only:
            raise UsageError(f"{int8_only[0]}= is a setting of quantize=int8; add quantize=int8 or leave it out")
        return
    try:
        resolve_mode(quantize)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not EXPORT_FORMATS[fmt].quantizable:
        quantizable = ", ".join(name for name, entry in EXPORT_FORMATS.items() if entry.quantizable)
        raise UsageError(f"quantize={quantize} writes ONNX: it needs format={quantizable}, not format={fmt}")
    options.integer("calibration", CALIBRATION)
    options.integer("check_images")
    read_max_drop(options)


def main(argv: list[str]) -> int:
    options = parse_args(argv, KEYS, model_keys=True, data_keys=True)
    fmt = options.get("format", DEFAULT_FORMAT)
    check_format(fmt)  # a known format with its packages installed, before any weights are read
    check_int8_options(options, fmt)
    seq_len = options.get("seq_len")
    if seq_len is not None:  # before any weights are read
        check_seq_len(seq_len)
        naflex_format_refusal(fmt, options.get("quantize"))
    batch_text = options.get("batch", "dynamic")
    batch = None if batch_text == "dynamic" else options.integer("batch")
    try:
        atol = float(options.get("atol", str(ATOL)))
    except ValueError:
        raise UsageError(f"atol={options.get('atol')!r} must be a number") from None
    given = options.get("checkpoint") or options.source
    output = options.get("output")
    if not output:
        if not given or source_kind(given) != "file":
            raise UsageError("output=<path> is required when the weights are not a local file")
        output = default_output(given, fmt)
        if options.get("quantize"):
            suffix = EXPORT_FORMATS[fmt].suffix
            output = output.with_name(output.name.removesuffix(suffix) + ".int8" + suffix)
    output = Path(output)
    check_writable(output)  # before the weights are read and the model built
    weights, pre, data_cfg = resolve(options)
    if weights.untrained_head:  # an encoder exported for its features is fine; as a classifier it names noise
        print(f"warning: {weights.source}: {weights.untrained_head}: the exported file's classes are random; "
              "fine-tune on your classes first, unless the file is for its features", file=sys.stderr)  # fmt: skip
    patch = naflex_patch_size(weights.model, seq_len)  # seq_len checked, and the model cuts square patches
    naflex = None if patch is None else (int(seq_len), patch)
    images, what = check_images(options.get("image"), pre, data_cfg, naflex)
    int8 = int8_request(options, pre, data_cfg) if options.get("quantize") else None
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
        weights=weights.which,
        atol=atol,
        int8=int8,
        seq_len=None if naflex is None else naflex[0],
    )
    runtime = EXPORT_FORMATS[fmt].runtime_words
    kind = f"{fmt}, {result.int8.mode}" if result.int8 is not None else fmt
    float_check = "the float file " if result.int8 is not None else ""
    kind += f", NaFlex batches of {naflex[0]} tokens" if naflex else ""
    print(
        f"wrote {result.path} ({kind}, batch {'dynamic' if batch is None else batch}, weights: {weights.which}) "
        f"and {result.side_json}; "
        f"{float_check}checked with {runtime} on {what}, batches {result.checked_batches}: max |diff| "
        f"{result.max_abs_diff:.2e} <= {atol:g}"
    )
    if result.int8 is not None:
        print(f"INT8 against float on the {result.int8.split} split: {result.int8.line()}")
    return 0


def console() -> None:
    """`vit-export`."""
    sys.exit(run_script(main, usage=with_ema_rule(__doc__), keys=keys_help(KEYS, model_keys=True, data_keys=True)))
