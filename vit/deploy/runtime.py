"""Run an exported ONNX classifier with onnxruntime, without the training code: the side JSON beside the file
(`<file>.json`) gives the preprocessing and the class names, the images go through PIL and numpy only (the
trainer's own image reader, vit/data/images.py, which needs no torch).

    from vit.deploy.runtime import OnnxClassifier
    classifier = OnnxClassifier("best.onnx")
    probs = classifier.predict_proba(["cat.jpg", "dog.png"])  # (2, classes), numpy

The preprocessing is the same arithmetic as torchvision's Resize(shorter side) + CenterCrop + ToTensor +
Normalize on PIL images (the tests hold the two to 1e-6), so the file's logits equal the PyTorch model's.

A file exported with seq_len=<n> (vit/deploy/export.py) takes NaFlex batches: each image whole, resized with its
aspect ratio kept to at most n patches (`naflex_size`, the trainer's NaFlex geometry), cut into patches and packed
with padding (`pack_naflex`, vit/naflex.py's layout); `predict_proba` does it, `logits_naflex` takes the arrays.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

from vit.data.images import read_rgb

PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
PIL_FILTERS["nearest"] = Image.Resampling.NEAREST


def side_json_path(model_path: str | Path) -> Path:
    """`best.onnx` -> `best.onnx.json`: the preprocessing constants and class names of an exported model."""
    path = Path(model_path)
    return path.with_name(path.name + ".json")


def read_side_json(model_path: str | Path) -> dict:
    path = side_json_path(model_path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{str(path)!r} does not exist: an exported model needs its side JSON (written by vit-export)"
        ) from None
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {str(path)!r}: {err}") from err


def preprocess(image: Image.Image, pre: dict) -> np.ndarray:
    """One RGB PIL image -> float32 (3, img_size, img_size), normalised."""
    size, resize = int(pre["img_size"]), int(pre["resize"])
    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    if short != resize:  # torchvision: the shorter side to `resize`, the longer one scaled and truncated
        new_short, new_long = resize, int(resize * long / short)
        new_size = (new_short, new_long) if width <= height else (new_long, new_short)
        image = image.resize(new_size, PIL_FILTERS[pre["interpolation"]])
    width, height = image.size
    if width < size or height < size:
        raise ValueError(f"an image of {width}x{height} after resizing cannot be centre-cropped to {size}")
    top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return normalised(image.crop((left, top, left + size, top + size)), pre)


def normalised(image: Image.Image, pre: dict) -> np.ndarray:
    """An RGB PIL image -> float32 (3, H, W): ToTensor's scaling, then the side JSON's mean and std."""
    array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    mean = np.asarray(pre["mean"], dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(pre["std"], dtype=np.float32).reshape(3, 1, 1)
    return (array - mean) / std


def naflex_size(image_hw: tuple[int, int], patch: int, seq_len: int) -> tuple[int, int]:
    """The (height, width) in pixels an image of `image_hw` is resized to for a NaFlex file of `seq_len` tokens: the
    largest scale (to 1e-5, by bisection over (1e-6, 100)) at which the sides, each rounded up to whole patches (at
    least one), hold at most seq_len patches; timm's `get_image_size_for_seq`, which the trainer uses, in Python."""

    def sides(ratio: float) -> tuple[int, int]:
        return tuple(int(max(patch * math.ceil(side * ratio / patch), patch)) for side in image_hw)

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        mid = (low + high) / 2.0
        height, width = sides(mid)
        if (height // patch) * (width // patch) <= seq_len:
            low = mid
        else:
            high = mid
    return sides(low)


def preprocess_naflex(image: Image.Image, pre: dict, patch: int, seq_len: int) -> np.ndarray:
    """One RGB PIL image -> float32 (3, h, w), normalised: the whole image, no crop, resized with its aspect ratio
    kept to at most `seq_len` patches (`naflex_size`), as the PyTorch tools' seq_len=<n> does."""
    height, width = naflex_size((image.height, image.width), patch, seq_len)
    if (width, height) != image.size:
        image = image.resize((width, height), PIL_FILTERS[pre["interpolation"]])
    return normalised(image, pre)


def pack_naflex(images: list[np.ndarray], patch: int, seq_len: int) -> dict[str, np.ndarray]:
    """Images (3, h_i, w_i), sides whole numbers of patches, at most seq_len of them -> a NaFlex batch: `patches`
    (B, seq_len, p * p * 3) float32, each image's patches in row-major order, each flattened as (row, column,
    channel), then zeros; `patch_coord` (B, seq_len, 2) int64; `patch_valid` (B, seq_len) bool."""
    batch = len(images)
    patches = np.zeros((batch, seq_len, patch * patch * 3), dtype=np.float32)
    coord = np.zeros((batch, seq_len, 2), dtype=np.int64)
    valid = np.zeros((batch, seq_len), dtype=bool)
    for i, image in enumerate(images):
        rows, cols = image.shape[1] // patch, image.shape[2] // patch
        count = rows * cols
        if count > seq_len:
            raise ValueError(f"an image of {rows} x {cols} patches does not fit seq_len={seq_len}")
        # (3, rows * p, cols * p) -> (rows, cols, p, p, 3) -> (rows * cols, p * p * 3)
        cut = image.reshape(3, rows, patch, cols, patch).transpose(1, 3, 2, 4, 0).reshape(count, -1)
        patches[i, :count] = cut
        grid = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), axis=-1).reshape(count, 2)
        coord[i, :count] = grid
        valid[i, :count] = True
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class OnnxClassifier:
    """An exported ONNX file with its side JSON: images or arrays in, logits or probabilities out."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX file {str(self.path)!r} does not exist")
        self.meta = read_side_json(self.path)
        self.classes: list[str] = list(self.meta.get("classes") or [])
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        batch = self.meta.get("batch", "dynamic")
        self.fixed_batch = None if batch == "dynamic" else int(batch)
        described = self.meta.get("input") or {}
        # a NaFlex file (exported with seq_len): its token count and patch side; None for an image-tensor file
        self.seq_len = described.get("seq_len")
        self.patch_size = described.get("patch_size")

    def logits(self, images: np.ndarray) -> np.ndarray:
        """(B, 3, H, W) float32, already preprocessed -> (B, classes). A fixed-batch export is fed in its
        batch size, the last chunk padded with zeros."""
        if self.seq_len is not None:
            raise ValueError(f"{self.path} takes NaFlex batches of {self.seq_len} tokens: use logits_naflex")
        images = np.ascontiguousarray(images, dtype=np.float32)
        step = self.fixed_batch or max(1, len(images))
        outputs = []
        for start in range(0, len(images), step):
            chunk = images[start : start + step]
            if self.fixed_batch and len(chunk) < step:
                pad = np.zeros((step - len(chunk), *chunk.shape[1:]), dtype=np.float32)
                outputs.append(self.session.run(None, {self.input_name: np.concatenate([chunk, pad])})[0][: len(chunk)])
            else:
                outputs.append(self.session.run(None, {self.input_name: chunk})[0])
        return np.concatenate(outputs) if outputs else np.zeros((0, len(self.classes)), dtype=np.float32)

    def logits_naflex(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """A NaFlex batch (`pack_naflex`) -> (B, classes), for a file exported with seq_len. A fixed-batch file is
        fed in its batch size, the last chunk filled up with copies of its first image."""
        size = len(batch["patches"])
        step = self.fixed_batch or max(1, size)
        outputs = []
        for start in range(0, size, step):
            chunk = {key: value[start : start + step] for key, value in batch.items()}
            count = len(chunk["patches"])
            if count < step:
                chunk = {
                    key: np.concatenate([value, np.repeat(value[:1], step - count, 0)]) for key, value in chunk.items()
                }
            outputs.append(self.session.run(None, chunk)[0][:count])
        return np.concatenate(outputs) if outputs else np.zeros((0, len(self.classes)), dtype=np.float32)

    def preprocess(self, paths: list[str | Path]) -> np.ndarray:
        return np.stack([preprocess(read_rgb(p), self.meta["preprocessing"]) for p in paths])

    def run(self, paths: list[str | Path]) -> np.ndarray:
        """The logits of image files, (B, classes): each through the file's own kind of input."""
        if self.seq_len is None:
            return self.logits(self.preprocess(paths))
        pre, patch = self.meta["preprocessing"], int(self.patch_size)
        images = [preprocess_naflex(read_rgb(p), pre, patch, int(self.seq_len)) for p in paths]
        return self.logits_naflex(pack_naflex(images, patch, int(self.seq_len)))

    def predict_proba(self, paths: list[str | Path], chunk: int = 64) -> np.ndarray:
        parts = [self.run(paths[i : i + chunk]) for i in range(0, len(paths), chunk)]
        return softmax(np.concatenate(parts))
