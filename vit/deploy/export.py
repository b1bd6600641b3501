"""Write a trained classifier to a file a server can run: ONNX, TorchScript or a torch.export program, with a
side JSON (`<file>.json`: preprocessing constants, class names, input/output names, batch size), for a fixed
or a dynamic batch size.

With `seq_len` (a ViT with the standard patch embedding) the file takes NaFlex batches of that many tokens
instead of image tensors (vit/naflex.py): three inputs, `patches` (batch, seq_len, p * p * 3) float32,
`patch_coord` (batch, seq_len, 2) int64 and `patch_valid` (batch, seq_len) bool, so each image goes in at its own
shape, padded. The model is traced with its grids read from the coordinates inside the graph
(vit/models/naflex_tokens.py), so the file serves every shape up to seq_len tokens, not only the example's; the check
runs it on images of several shapes and lengths packed together.

An ONNX file is checked before it is kept: onnxruntime runs it on a batch of images and its logits must match
the PyTorch model's (max |diff| <= `atol`, 1e-4 in fp32); the file is written beside its final name and renamed
only then. TorchScript and exported programs are loaded back and checked the same way with PyTorch. An INT8 ONNX
file (vit/deploy/quantize.py) is quantized from the checked float one and kept only if its top-1 on labelled
images is within `max_drop` points of the float file's.
"""

from __future__ import annotations

import copy
import datetime
import errno
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vit.deploy.preprocessing import Preprocessing
from vit.deploy.quantize import Int8Report, quantize_checked
from vit.deploy.runtime import side_json_path
from vit.errors import CheckFailed, UserError

INPUT_NAME, OUTPUT_NAME = "images", "logits"
NAFLEX_INPUTS = ("patches", "patch_coord", "patch_valid")  # a NaFlex export's inputs, vit/naflex.py's keys
ONNX_OPSET = 17  # onnxruntime runs it everywhere; LayerNormalization is a single op from 17 on
ATOL = 1e-4  # fp32: the largest |onnxruntime - PyTorch| logit difference an export may have


class ExportError(UserError):
    """An export that cannot be done as asked: one line naming the setting or path (exit code 2)."""


class VerificationError(CheckFailed):
    """The exported file does not compute what the PyTorch model computes (exit code 1, nothing kept)."""

    what = "export check failed"


def require_export_extra() -> None:
    """onnx and onnxruntime come with the optional `export` extra; say how to get them if they are missing."""
    missing = []
    for module in ("onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ExportError(
            f"format=onnx needs {' and '.join(missing)}, which the optional 'export' extra installs: "
            "pip install -e '.[export]' (make install does it)"
        )


def check_format(fmt: str) -> ExportFormat:
    """The entry of `format=<fmt>`, its packages checked: ExportError naming the format otherwise."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"format={fmt} is not a known format; choose from {', '.join(EXPORT_FORMATS)}")
    if EXPORT_FORMATS[fmt].needs_export_extra:
        require_export_extra()
    return EXPORT_FORMATS[fmt]


def default_output(weights_path: str | Path, fmt: str) -> Path:
    """`.../best.pt` -> `.../best.onnx` (or .torchscript.pt, .pt2) beside it; `81.5_T2T_ViT_7.pth.tar` ->
    `81.5_T2T_ViT_7.onnx`."""
    path = Path(weights_path)
    stem = path.name
    for suffix in (".pth.tar", ".safetensors", ".pth", ".pt", ".bin", ".tar"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    return path.with_name(stem + EXPORT_FORMATS[fmt].suffix)


def check_writable(path: Path) -> None:
    """The folder of `path` exists (or can be made) and takes a file; else ExportError naming the path."""
    from vit.records.files import write_error_reason

    folder = path.parent
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, f"{str(path)!r} is a folder")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ExportError(f"cannot write the export to {str(path)!r}: {write_error_reason(err, folder)}") from err


@dataclass
class ExportResult:
    path: Path
    side_json: Path
    max_abs_diff: float
    checked_with: str  # "onnxruntime" or "torch"
    checked_batches: list[int]
    int8: Int8Report | None = None  # the INT8 file's accuracy check against the float file


@dataclass
class Int8Request:
    """quantize=...: the mode (resolved), the labelled images to check on, the calibration images (int8-static)
    and the largest top-1 drop, in points, for which the INT8 file is kept."""

    mode: str
    check: tuple[np.ndarray, np.ndarray | None]
    calibration: np.ndarray | None
    max_drop: float
    split: str = "val"  # the name of the split the check images come from


# A model's inputs: an image batch (B, 3, H, W), or a NaFlex batch's three tensors in NAFLEX_INPUTS' order.
Inputs = torch.Tensor | tuple[torch.Tensor, ...]


def as_args(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def input_names(inputs: Inputs) -> list[str]:
    return list(NAFLEX_INPUTS) if isinstance(inputs, tuple) else [INPUT_NAME]


class NaFlexInputs(nn.Module):
    """A model taking a NaFlex batch as the three tensors an exported file has for inputs (exporters take tensors,
    not a dict). In eval mode from the start: the ONNX exporter gives every submodule the top module's training
    flag back after the export, and a wrapper left in training mode would turn drop path on in the model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, patches: torch.Tensor, patch_coord: torch.Tensor, patch_valid: torch.Tensor) -> torch.Tensor:
        return self.model(dict(zip(NAFLEX_INPUTS, (patches, patch_coord, patch_valid), strict=True)))


def write_onnx(model: nn.Module, example: Inputs, path: Path, dynamic: bool) -> None:
    # The TorchScript-based exporter (dynamo=False): torch >= 2.9's default torch.export-based exporter needs the
    # onnxscript package on top of onnx, and this one exports ViT and T2T-ViT (SDPA, Unfold, einsum) to opset 17
    # with onnxruntime matching PyTorch to ~1e-6. Its deprecation warning is silenced here, not its errors.
    names = input_names(example)
    axes = {name: {0: "batch"} for name in [*names, OUTPUT_NAME]} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            as_args(example),
            str(path),
            input_names=names,
            output_names=[OUTPUT_NAME],
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def run_onnx(path: Path, inputs: Inputs) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {name: tensor.numpy() for name, tensor in zip(input_names(inputs), as_args(inputs), strict=True)}
    return session.run(None, feed)[0]


def write_torchscript(model: nn.Module, example: Inputs, path: Path, dynamic: bool) -> None:
    # A trace: its batch size is free anyway (`dynamic` needs nothing more).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about shape checks, fixed for the traced sizes
        traced = torch.jit.trace(model, as_args(example), check_trace=False)
    torch.jit.save(traced, str(path))


def run_torchscript(path: Path, inputs: Inputs) -> np.ndarray:
    with torch.no_grad():
        return torch.jit.load(str(path)).eval()(*as_args(inputs)).numpy()


def write_program(model: nn.Module, example: torch.Tensor, path: Path, dynamic: bool) -> None:
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=4096)}} if dynamic else None
    program = torch.export.export(model, (example,), dynamic_shapes=shapes)
    torch.export.save(program, str(path))


def run_program(path: Path, images: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.export.load(str(path)).module()(images).numpy()


@dataclass(frozen=True)
class ExportFormat:
    """How a format is written, and run back for its check by the runtime a user would run it with."""

    suffix: str  # the file's ending, after the weights file's stem
    write: Callable[[nn.Module, Inputs, Path, bool], None]  # (model, example batch, path, dynamic batch)
    run: Callable[[Path, Inputs], np.ndarray]  # (path, images (B, 3, H, W) or a NaFlex batch) -> logits (B, classes)
    runtime: str  # what checks it, in the side JSON
    runtime_words: str  # the same, in the script's last line
    opset: int | None = None  # ONNX's operator set
    quantizable: bool = False  # quantize=int8 can write it (onnxruntime's quantization)
    needs_export_extra: bool = False  # onnx and onnxruntime, the optional `export` extra
    traces: bool = True  # written by tracing the model, which a NaFlex export needs (seq_len)


# format=<name> -> its entry: adding a format is one entry here (and, to serve it, a runtime in
# vit/deploy/runtime.py).
EXPORT_FORMATS: dict[str, ExportFormat] = {
    "onnx": ExportFormat(".onnx", write_onnx, run_onnx, "onnxruntime", "onnxruntime", ONNX_OPSET, True, True),
    "torchscript": ExportFormat(
        ".torchscript.pt", write_torchscript, run_torchscript, "torch", "PyTorch (loaded back)"
    ),
    "exported-program": ExportFormat(
        ".pt2", write_program, run_program, "torch", "PyTorch (loaded back)", traces=False
    ),
}
DEFAULT_FORMAT = next(iter(EXPORT_FORMATS))


def run_exported(path: Path, fmt: str, inputs: Inputs) -> np.ndarray:
    """Logits of the exported file on `inputs` (images (B, 3, H, W), or a NaFlex batch's three tensors), by the
    runtime a user would run it with."""
    return EXPORT_FORMATS[fmt].run(path, inputs)


def check_sizes(batch: int | None, images: int) -> list[int]:
    """The batch sizes an export is checked on: two for a dynamic export (1 and up to 8), the fixed one otherwise."""
    return [batch] if batch else sorted({1, max(3, min(images, 8))})


def check_batches(images: torch.Tensor, batch: int | None, size: int) -> tuple[Inputs, dict[int, Inputs]]:
    """(example, checks): the example the export traces (batch 2 for a dynamic export, neither of the checked
    sizes) and each checked batch size's images (the images repeated to the largest)."""
    checks = check_sizes(batch, len(images))
    pool = images if len(images) >= max(checks) else images.repeat(-(-max(checks) // len(images)), 1, 1, 1)
    example = pool[: batch or 2].contiguous()
    if example.shape[1:] != (3, size, size):
        raise ExportError(f"images of shape {tuple(example.shape[1:])} do not fit the model's (3, {size}, {size})")
    return example, {n: pool[:n].contiguous() for n in checks}


def naflex_batches(
    images: list[torch.Tensor], batch: int | None, seq_len: int, patch: int
) -> tuple[Inputs, dict[int, Inputs]]:
    """`check_batches` for a NaFlex export: `images` (3, H_i, W_i) at their own shapes, each at most `seq_len`
    patches. Every other image of a check goes in smaller too (resized, its aspect kept, to at most seq_len / 4
    patches), so each checked batch mixes grids and lengths and is mostly padding in places; the example holds
    two images of their own shapes. Each batch is packed to seq_len tokens."""
    from vit.data.loading.naflex_loader import grid_for
    from vit.naflex import pack

    checks = check_sizes(batch, len(images))
    pool = [images[i % len(images)] for i in range(max(checks))]
    small = max(1, seq_len // 4)
    for i in range(1, len(pool), 2):
        height, width = grid_for(tuple(pool[i].shape[-2:]), patch, small)
        pool[i] = F.interpolate(pool[i][None], size=(height, width), mode="bilinear", antialias=True)[0]

    def packed(chosen: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(pack(chosen, (patch, patch), seq_len=seq_len)[key] for key in NAFLEX_INPUTS)

    example = packed([images[i % len(images)] for i in range(batch or 2)])
    return example, {n: packed(pool[:n]) for n in checks}


def write_checked(
    model: nn.Module, path: Path, fmt: str, batch: int | None, batches: tuple[Inputs, dict[int, Inputs]], atol: float
) -> tuple[float, list[int]]:
    """Export into a temporary file beside `path`, traced on `batches`' example, compare its logits with PyTorch's
    on each checked batch and move it to `path` only when they agree within `atol`. Returns (largest |diff|,
    checked batch sizes)."""
    example, checks = batches
    # Hidden, and ending as `path` does: torch.export.save warns about a file not ending in .pt2.
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        with torch.no_grad():
            EXPORT_FORMATS[fmt].write(model, example, tmp, batch is None)
        worst = 0.0
        for chunk in checks.values():
            with torch.no_grad():
                expected = model(*as_args(chunk)).numpy()
            got = run_exported(tmp, fmt, chunk)
            if got.shape != expected.shape:
                raise VerificationError(f"the exported file gives logits of shape {got.shape}, not {expected.shape}")
            worst = max(worst, float(np.abs(got - expected).max()))
        if not worst <= atol:
            raise VerificationError(
                f"the {fmt} file's logits differ from PyTorch's by up to {worst:.3g} (> {atol:g}) on batches of "
                f"{list(checks)}; nothing was written"
            )
        os.replace(tmp, path)
    except OSError as err:
        from vit.records.files import write_error_reason

        raise ExportError(f"cannot write the export to {str(path)!r}: {write_error_reason(err, path.parent)}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return worst, list(checks)


def write_int8(model, path: Path, fmt: str, batch, batches, atol: float, int8: Int8Request):
    """The float export written beside `path` and checked against PyTorch, quantized into `path` (kept only
    within its top-1 bar), the float file removed: (worst diff, checks, the INT8 report)."""
    entry = check_format(fmt)
    if not entry.quantizable:
        quantizable = ", ".join(name for name, e in EXPORT_FORMATS.items() if e.quantizable)
        raise ExportError(f"quantize={int8.mode} needs format={quantizable}, not format={fmt}")
    float_path = path.with_name(f".{path.name}.float-{os.getpid()}{entry.suffix}")
    try:
        worst, checks = write_checked(model, float_path, fmt, batch, batches, atol)
        report = quantize_checked(
            float_path, path, int8.mode, INPUT_NAME, int8.check, int8.calibration, int8.max_drop, int8.split
        )
    finally:
        float_path.unlink(missing_ok=True)
    return worst, checks, report


def export_model(
    model: nn.Module,
    path: str | Path,
    fmt: str,
    preprocessing: Preprocessing,
    classes: list[str] | None,
    images: torch.Tensor,
    *,
    batch: int | None = None,
    model_name: str = "",
    source: str = "",
    weights: str = "",
    atol: float = ATOL,
    int8: Int8Request | None = None,
    seq_len: int | None = None,
) -> ExportResult:
    """Export `model` (fp32, eval) to `path` in `fmt` for a fixed `batch` (None: dynamic), check it on
    `images` (normalised, (N, 3, H, W)) against the PyTorch logits, then write the side JSON. With `int8` (ONNX
    only) the checked float file is quantized and `path` is the INT8 file, kept only within its top-1 bar. With
    `seq_len` the file takes NaFlex batches of that many tokens, and `images` is a list of (3, H_i, W_i) images at
    their own shapes (each at most seq_len patches)."""
    entry = check_format(fmt)
    path = Path(path)
    check_writable(path)
    # Exported from an fp32 CPU copy in eval mode: the caller's model keeps its device, dtype and mode.
    model = copy.deepcopy(model).float().eval().cpu()
    size = preprocessing.img_size
    exported = model
    if seq_len is not None:
        patch = naflex_refusal(model, fmt, int8, seq_len)
        batches = naflex_batches(list(images), batch, seq_len, patch)
        exported = NaFlexInputs(model)  # the three tensors in, the dict the model reads
    else:
        if tuple(getattr(model, "img_size", (size, size))) != (size, size) and hasattr(model, "set_input_size"):
            # A dynamic-size ViT exported at another size: its position table resampled once for that size (ONNX
            # has no antialiased bicubic resize to do it in the graph).
            model.set_input_size(size)
        batches = check_batches(images, batch, size)
    report = None
    if int8 is None:
        worst, checks = write_checked(exported, path, fmt, batch, batches, atol)
    else:
        worst, checks, report = write_int8(exported, path, fmt, batch, batches, atol, int8)
    names = list(classes) if classes else [str(i) for i in range(int(getattr(model, "num_classes", 0)))]
    meta = {
        "format": fmt,
        "file": path.name,
        "model": model_name,
        "source": source,
        "weights": weights,  # which of the source's weights (vit/deploy/loaded_model.py's EMA_RULE): ema, raw, ...
        "input": input_description(batch, size, seq_len, batches[0]),
        "output": {"name": OUTPUT_NAME, "shape": ["batch" if batch is None else batch, len(names)]},
        "batch": "dynamic" if batch is None else batch,
        "preprocessing": preprocessing.to_dict(),
        "classes": names,
        "opset": entry.opset,
        # the float export's check against PyTorch (for an INT8 file: the float file it was quantized from)
        "checked": {"runtime": entry.runtime, "batches": checks, "max_abs_diff": worst},
        "quantization": report.to_dict() if report is not None else None,
        "torch": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if seq_len is not None:
        meta["preprocessing"]["seq_len"] = seq_len  # each image resized, its aspect kept, to at most this many patches
    side = side_json_path(path)
    try:
        side.write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as err:
        raise ExportError(f"cannot write {str(side)!r}: {err.strerror or err}") from err
    return ExportResult(path, side, worst, meta["checked"]["runtime"], checks, report)


def naflex_format_refusal(fmt: str, quantize: str | None) -> None:
    """What a NaFlex export (seq_len) cannot write, before any weights are read: ExportError naming it."""
    if not EXPORT_FORMATS[fmt].traces:
        traced = "|".join(name for name, entry in EXPORT_FORMATS.items() if entry.traces)
        raise ExportError(f"seq_len= exports NaFlex batches by tracing the model: it needs format={traced}, not {fmt}")
    if quantize is not None:
        raise ExportError(f"seq_len= with quantize={quantize}: INT8 NaFlex files are not built; export the float file")


def naflex_refusal(model: nn.Module, fmt: str, int8: Int8Request | None, seq_len: int) -> int:
    """The patch size of a model a NaFlex export (seq_len) can write, or a one-line error naming what cannot be."""
    from vit.deploy.preprocessing import naflex_patch_size

    naflex_format_refusal(fmt, None if int8 is None else int8.mode)
    return naflex_patch_size(model, seq_len)


def input_description(batch: int | None, size: int, seq_len: int | None, example: Inputs) -> dict:
    """The side JSON's `input`: the image tensor's name, shape and dtype; or a NaFlex file's three inputs."""
    rows = "batch" if batch is None else batch
    if seq_len is None:
        return {"name": INPUT_NAME, "shape": [rows, 3, size, size], "dtype": "float32"}
    patches, coord, valid = example
    return {
        "names": list(NAFLEX_INPUTS),
        "shapes": [[rows, seq_len, patches.shape[-1]], [rows, seq_len, 2], [rows, seq_len]],
        "dtypes": ["float32", "int64", "bool"],
        "seq_len": seq_len,
        "patch_size": math.isqrt(patches.shape[-1] // 3),
        "layout": (
            "each image's patches in row-major order over its own grid, each flattened as (row, column, channel), "
            "then padding; patch_coord: each patch's (row, column) on that grid; patch_valid: true for a patch"
        ),
    }
