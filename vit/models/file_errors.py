"""Why a weights file could not be read, in one line: torch's own text runs to a dozen lines and suggests
weights_only=False, which would run whatever code the file carries. Used by every reader of weights (pretrained
sources here, the trainer's checkpoints, the teacher, the deploy tools)."""

from __future__ import annotations

import re


def first_line(err: BaseException) -> str:
    """An exception's first line, without terminal colour codes: error messages here are one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    return text.splitlines()[0].strip() if text else type(err).__name__


def read_error_reason(err: Exception) -> str:
    """Why torch.load(weights_only=True) refused a file."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:
        return (
            f"it holds pickled objects other than tensors and plain containers (GLOBAL {refused.group(1)}), which "
            "weights_only=True refuses without running them; a checkpoint written by this trainer holds none"
        )
    if "WeightsUnpickler error" in text:
        detail = " ".join(text.split("WeightsUnpickler error:", 1)[1].split()).split(" Check the documentation")[0]
        return f"not a checkpoint weights_only=True can read ({detail})"
    if "central directory" in text or "PytorchStreamReader" in text or isinstance(err, EOFError):
        return f"the file is truncated or corrupted ({first_line(err).split('. ')[0].rstrip('.') or 'empty'})"
    return f"not a torch checkpoint ({type(err).__name__}: {first_line(err)})"
