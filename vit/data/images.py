"""The one reader of image files: training (image folders, the scan for unreadable files), the single-image tools
(predict, visualize_attention, export's calibration) and the ONNX runtime all read an image through `read_rgb`,
so they see the same pixels and the same one-line reason when a file cannot be read.

It needs only PIL and numpy (no torch): the ONNX runtime (vit/deploy/runtime.py) runs without the training code.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from vit.errors import UserError

_REASON_CHARS = 120


class ImageReadError(UserError):
    """An image file that cannot be read: its path and why, in one line."""

    kind = "data"


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode as 8-bit RGB: palette, alpha (over white), CMYK, greyscale and 16/32-bit greyscale."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        image = Image.fromarray(_high_depth_to_uint8(np.asarray(image)), mode="L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    return image.convert("RGB")


def _high_depth_to_uint8(array: np.ndarray) -> np.ndarray:
    """16-bit (and 32-bit int / float) greyscale (H, W) -> uint8 (H, W) by a fixed rescale, not a clip.

    PIL's convert("L") clips every 16-bit value above 255 to white. We divide by 257 instead (65535 -> 255),
    a fixed map rather than a per-image min/max stretch, so the same raw value gives the same grey in every
    image. Mode "I" holding only 0..255 is already 8-bit; float images in [0, 1] are scaled by 255.
    """
    is_float = array.dtype.kind == "f"
    array = array.astype(np.float64)
    top = float(array.max()) if array.size else 0.0
    if is_float and top <= 1.0:
        scaled = array * 255.0
    elif top > 255:
        scaled = np.clip(array, 0, 65535) / 257.0
    else:
        scaled = array
    return np.clip(scaled.round(), 0, 255).astype(np.uint8)


def short_reason(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def decode(source: str | Path | bytes) -> Image.Image:
    """Open and fully decode a file (a path) or an encoded image (bytes, a shard's sample); raise what PIL or the
    file system raises (`problem_of` names it). A header check alone misses a truncated file."""
    if isinstance(source, bytes):
        image = Image.open(io.BytesIO(source))
        image.load()
        return image
    with open(source, "rb") as handle:  # builtins.open: the tests stand in for an unreadable file through it
        image = Image.open(handle)
        image.load()
    return image


def problem_of(err: BaseException) -> str:
    """Why `decode` failed, in a few words (also the scan's reasons, vit/data/sources/scan.py)."""
    if isinstance(err, IsADirectoryError):
        return "a folder, not an image file"
    if isinstance(err, FileNotFoundError):
        return "does not exist"
    if isinstance(err, PermissionError):
        return "permission denied"
    if isinstance(err, UnidentifiedImageError):
        return "not an image PIL can read (wrong extension, or a damaged header)"
    if isinstance(err, Image.DecompressionBombError):
        return f"too many pixels: {short_reason(err)}"
    if isinstance(err, OSError):  # "image file is truncated", "broken data stream", decoder errors
        return f"truncated or corrupt: {short_reason(err)}"
    return f"cannot decode: {type(err).__name__}: {short_reason(err)}"  # PIL raises SyntaxError, struct.error...


def read_rgb(path: str | Path) -> Image.Image:
    """The image at `path` as 8-bit RGB (`to_rgb`); a file that cannot be read raises ImageReadError naming it."""
    try:
        image = decode(path)
    except Exception as err:
        reason = "empty file (0 bytes)" if _is_empty(path) else problem_of(err)
        raise ImageReadError(f"image {str(path)!r}: {reason}") from None
    return to_rgb(image)


def _is_empty(path) -> bool:
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False
