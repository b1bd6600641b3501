"""Run an exported ONNX classifier with onnxruntime, without the training code: the side JSON beside the file
(`<file>.json`) gives the preprocessing and the class names, the images go through PIL and numpy only (the
trainer's own image reader, vit/data/images.py, which needs no torch).

    from vit.deploy.runtime import OnnxClassifier
    classifier = OnnxClassifier("best.onnx")
    probs = classifier.predict_proba(["cat.jpg", "dog.png"])  # (2, classes), numpy

The preprocessing is the same arithmetic as torchvision's Resize(shorter side) + CenterCrop + ToTensor +
Normalize on PIL images (the tests hold the two to 1e-6), so the file's logits equal the PyTorch model's.
"""

from __future__ import annotations

import json
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
            f"{str(path)!r} does not exist: an exported model needs its side JSON (written by scripts/export.py)"
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
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    mean = np.asarray(pre["mean"], dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(pre["std"], dtype=np.float32).reshape(3, 1, 1)
    return (array - mean) / std


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

    def logits(self, images: np.ndarray) -> np.ndarray:
        """(B, 3, H, W) float32, already preprocessed -> (B, classes). A fixed-batch export is fed in its
        batch size, the last chunk padded with zeros."""
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

    def preprocess(self, paths: list[str | Path]) -> np.ndarray:
        return np.stack([preprocess(read_rgb(p), self.meta["preprocessing"]) for p in paths])

    def predict_proba(self, paths: list[str | Path], chunk: int = 64) -> np.ndarray:
        parts = [self.logits(self.preprocess(paths[i : i + chunk])) for i in range(0, len(paths), chunk)]
        return softmax(np.concatenate(parts))
