"""The one reader of weight files: trainer checkpoints (resume, evaluate, predict, export, average), pretrained
weights, a distillation teacher and the deploy tools all open a file through `read_weights_file`, so a bad file
gets the same one-line reason everywhere.

A .safetensors file is read with safetensors, anything else with `torch.load(weights_only=True)`, which refuses a
pickle that would run code without running it. torch's own text for a refused file runs to a dozen lines and
suggests weights_only=False, which would run that code: the reasons here are one line and never suggest it.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vit.errors import UserError
from vit.weights.sharded import ShardedFileError, is_sharded_checkpoint, read_sharded_checkpoint

_ZIP_MAGIC = b"PK"  # torch.save's format: a zip archive
_PICKLE_PROTO = 0x80  # the first byte of a pickle of protocol 2 or newer (torch's legacy format)


class WeightsFileError(UserError):
    """A weights file that cannot be read: its path and why, in one line."""

    kind = "checkpoint"


def first_line(err: BaseException) -> str:
    """An exception's first line, without terminal colour codes: error messages here are one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    return text.splitlines()[0].strip() if text else type(err).__name__


def read_error_reason(err: Exception, head: bytes = b"") -> str:
    """Why torch.load(weights_only=True) refused a file whose first bytes are `head`."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    refused = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", text)  # torch 2.6-2.9 and 2.10+ wordings
    if refused:
        return (
            f"it holds pickled objects other than tensors and plain containers (GLOBAL {refused.group(1)}), which "
            "weights_only=True refuses without running them; a checkpoint written by this trainer holds none"
        )
    if head and not head.startswith(_ZIP_MAGIC) and head[0] != _PICKLE_PROTO:
        return "not a torch or safetensors file (neither a zip archive nor a pickle)"
    if "WeightsUnpickler error" in text or "Weights only load failed" in text:
        lines = [" ".join(line.split()) for line in text.split("WeightsUnpickler error:")[-1].splitlines()]
        detail = next((line for line in lines if "nsupported" in line), lines[0]).split(" Check the documentation")[0]
        return f"a pickle weights_only=True refuses ({detail.rstrip('.')}); nothing in it was run"
    if head.startswith(_ZIP_MAGIC) or "central directory" in text or "PytorchStreamReader" in text:
        return f"the file is truncated or corrupted ({first_line(err).split('. ')[0].rstrip('.')})"
    if isinstance(err, EOFError):
        return "the file is truncated or corrupted (it ends early)"
    return f"not a torch checkpoint ({type(err).__name__}: {first_line(err)})"


def read_weights_file(path: str | Path, what: str = "weights file") -> object:
    """What the file at `path` holds (a state dict, a trainer checkpoint's dict...), on the CPU; a sharded
    checkpoint folder (vit/weights/sharded.py) as the dict of its single-file form. `what` names the file in the
    messages ("checkpoint", "teacher file"). Raises WeightsFileError: missing, a folder, empty, truncated, not a
    weights file, or a pickle that would run code."""
    path = Path(path)
    if is_sharded_checkpoint(path):  # trainer.strategy=fsdp's checkpoint folder: read whole, in this process
        try:
            return read_sharded_checkpoint(path, lambda file: read_weights_file(file, what))
        except ShardedFileError as err:
            raise WeightsFileError(f"cannot read sharded {what} {str(path)!r}: {err}") from None
    if path.is_dir():
        raise WeightsFileError(f"{what} {str(path)!r} is a folder, not a file (nor a sharded checkpoint)")
    if not path.is_file():
        raise WeightsFileError(f"{what} {str(path)!r} does not exist")
    if path.stat().st_size == 0:
        raise WeightsFileError(f"cannot read {what} {str(path)!r}: the file is empty (0 bytes)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # truncated or not a safetensors file
            raise WeightsFileError(f"cannot read safetensors file {str(path)!r}: {first_line(err)}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, pickled code, not a torch file at all
        with path.open("rb") as handle:
            head = handle.read(4)
        reason = read_error_reason(err, head)
        raise WeightsFileError(f"cannot read {what} {str(path)!r} with weights_only=True: {reason}") from None
