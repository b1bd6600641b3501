"""INT8 ONNX: onnxruntime's quantization of an exported float ONNX file, kept only when its measured top-1 cost is
within a bar.

Two ways, both onnxruntime's (`onnxruntime.quantization`):
- `int8-dynamic`: the weights of the linear layers (MatMul, Gemm) stored as int8, per output channel; the
  activations quantized on the fly, batch by batch. Needs no calibration data.
- `int8-static`: weights and activations of the linear layers in int8, with activation ranges measured on
  `calibration` images beforehand, written in the QDQ format (QuantizeLinear/DequantizeLinear pairs around each
  quantized op, which any onnxruntime runs).
LayerNorm, softmax, GELU and the additions stay in float in both: they are where quantization error builds up in
a transformer, and they are a small part of its time. `int8` is the default way, chosen by measurement
(docs/BENCHMARKS.md, "INT8 on the CPU").

The check (`check_int8`) runs the float file and the INT8 file on labelled images of the validation split and
reports both top-1s, their agreement (the share of identical top-1 predictions), the largest logit difference and
the file sizes; `QuantizationRefused` when the top-1 drop exceeds `max_drop` points.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vit.errors import CheckFailed
from vit.progress import progress

MODES = ("int8", "int8-dynamic", "int8-static")
DEFAULT_MODE = "int8-dynamic"  # what `int8` means (docs/BENCHMARKS.md, "INT8 on the CPU")
QUANTIZED_OPS = ["MatMul", "Gemm"]  # the linear layers (and attention's two products); the rest stays float
MAX_DROP = 1.0  # top-1 points an INT8 file may lose against the float one and still be kept
CALIBRATION = 256  # images whose activation ranges set the static scales
CHUNK = 64  # images per onnxruntime call in the check and the calibration


class QuantizationRefused(CheckFailed):
    """The INT8 file loses more top-1 than `max_drop` allows: nothing is written (exit code 1)."""

    what = "export check failed"


@dataclass
class Int8Report:
    mode: str  # int8-dynamic | int8-static
    split: str  # the split the images come from (holdout, test, val, ...)
    images: int  # labelled images the two files were compared on
    float_top1: float | None  # None: the images had no labels
    int8_top1: float | None
    agreement: float  # % of images where the two files give the same top class
    max_abs_logit_diff: float
    float_bytes: int
    int8_bytes: int
    calibration_images: int | None  # int8-static only
    quantized_ops: list[str]

    @property
    def drop(self) -> float | None:
        if self.float_top1 is None or self.int8_top1 is None:
            return None
        return self.float_top1 - self.int8_top1

    def to_dict(self) -> dict:
        return {**asdict(self), "top1_drop": self.drop}

    def line(self) -> str:
        top1 = ""
        if self.float_top1 is not None and self.int8_top1 is not None:
            change = self.int8_top1 - self.float_top1
            top1 = f"top-1 {self.float_top1:.2f}% float -> {self.int8_top1:.2f}% INT8 ({change:+.2f} points), "
        return (
            f"{top1}agreement {self.agreement:.2f}% on {self.images} images, max |logit diff| "
            f"{self.max_abs_logit_diff:.3g}, {self.float_bytes / 2**20:.2f} MiB -> {self.int8_bytes / 2**20:.2f} MiB"
        )


def resolve_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"quantize={mode} is not a known mode; choose from {', '.join(MODES)}")
    return DEFAULT_MODE if mode == "int8" else mode


class _ImagesReader:
    """onnxruntime's CalibrationDataReader protocol over an array of preprocessed images."""

    def __init__(self, input_name: str, images: np.ndarray):
        self.batches = iter([{input_name: images[i : i + CHUNK]} for i in range(0, len(images), CHUNK)])

    def get_next(self):
        return next(self.batches, None)

    def rewind(self) -> None:  # noqa: D102 (part of the protocol; one pass is all the calibration needs)
        pass


def quantize_file(src: Path, dst: Path, mode: str, input_name: str, calibration: np.ndarray | None) -> None:
    """Write the INT8 version of the float ONNX file `src` to `dst` (`mode` resolved: int8-dynamic | int8-static)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(dir=dst.parent) as work:
        prepared = Path(work) / "prepared.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # shape inference and graph clean-up onnxruntime recommends before quantizing
            quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
            if mode == "int8-dynamic":
                quantize_dynamic(
                    str(prepared),
                    str(dst),
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=QUANTIZED_OPS,
                    per_channel=True,
                )
            else:
                if calibration is None or not len(calibration):
                    raise ValueError("int8-static needs calibration images")
                quantize_static(
                    str(prepared),
                    str(dst),
                    _ImagesReader(input_name, np.ascontiguousarray(calibration, dtype=np.float32)),
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=QUANTIZED_OPS,
                    per_channel=True,
                    extra_options={"ActivationSymmetric": True},
                )


def session(path: Path, threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def logits_of(path: Path, images: np.ndarray) -> np.ndarray:
    run = session(path)
    name = run.get_inputs()[0].name
    starts = range(0, len(images), CHUNK)
    what = f"checking {path.name} on {len(images):,} images"
    parts = [
        run.run(None, {name: images[i : i + CHUNK]})[0] for i in progress(starts, len(starts), what, unit="batches")
    ]
    return np.concatenate(parts)


def check_int8(
    float_path: Path,
    int8_path: Path,
    images: np.ndarray,
    labels: np.ndarray | None,
    mode: str,
    calibration_images: int | None,
    split: str = "val",
) -> Int8Report:
    """Both files on the same images: top-1 of each (with labels), agreement, largest logit difference, sizes."""
    images = np.ascontiguousarray(images, dtype=np.float32)
    reference, quantized = logits_of(float_path, images), logits_of(int8_path, images)
    top_ref, top_q = reference.argmax(1), quantized.argmax(1)
    has_labels = labels is not None and len(labels) == len(images)
    return Int8Report(
        mode=mode,
        split=split,
        images=len(images),
        float_top1=float(100.0 * (top_ref == labels).mean()) if has_labels else None,
        int8_top1=float(100.0 * (top_q == labels).mean()) if has_labels else None,
        agreement=float(100.0 * (top_ref == top_q).mean()),
        max_abs_logit_diff=float(np.abs(reference - quantized).max()),
        float_bytes=os.path.getsize(float_path),
        int8_bytes=os.path.getsize(int8_path),
        calibration_images=calibration_images,
        quantized_ops=list(QUANTIZED_OPS),
    )


def quantize_checked(
    float_path: Path,
    path: Path,
    mode: str,
    input_name: str,
    check: tuple[np.ndarray, np.ndarray | None],
    calibration: np.ndarray | None,
    max_drop: float = MAX_DROP,
    split: str = "val",
) -> Int8Report:
    """Quantize `float_path` into a temporary file beside `path`, check it on `check` (images, labels) and move it
    to `path` only when its top-1 drop is within `max_drop` points; QuantizationRefused (nothing written) if not."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        quantize_file(float_path, tmp, mode, input_name, calibration)
        calibrated = len(calibration) if mode == "int8-static" and calibration is not None else None
        report = check_int8(float_path, tmp, *check, mode, calibrated, split)
        if report.drop is not None and report.drop > max_drop:
            raise QuantizationRefused(
                f"the {mode} file loses {report.drop:.2f} top-1 points (> max_drop={max_drop:g}): {report.line()}; "
                "nothing was written"
            )
        os.replace(tmp, path)
        return report
    finally:
        tmp.unlink(missing_ok=True)
