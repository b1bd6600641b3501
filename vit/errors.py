"""The one base of the errors a user can fix: a bad setting, file or path. Every entry point (train.py, the
scripts) turns such an error into one line on stderr and its exit code (2) through `exit_with`; anything else is a
bug and keeps its traceback. Each layer subclasses it for its own kind of input (DataError, ConfigError,
CheckpointError...), naming the kind the line starts with, so this module sits below all of them and imports
nothing of the project."""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input, named in the message with how to fix it: one line, exit code 2."""

    kind = ""  # the word before "error:" in train.py's line: "config", "data", "checkpoint", "output"
    exit_code = 2


def one_line(err: BaseException, kind: bool = True) -> str:
    """`<kind> error: <message>` (train.py's lines), or `error: <message>` with kind=False (the scripts')."""
    word = getattr(err, "kind", "") if kind else ""
    return f"{word} error: {err}" if word else f"error: {err}"


def exit_with(err: BaseException, kind: bool = True) -> NoReturn:
    """Print `one_line(err)` on stderr and exit with its code. SystemExit is not an Exception, so Hydra's own error
    handler lets it through with this code."""
    print(one_line(err, kind), file=sys.stderr, flush=True)
    raise SystemExit(getattr(err, "exit_code", 2))


class ConfigError(UserError):
    """A setting that cannot work, named with its key and value: `model.depth=0 must be >= 1`."""

    kind = "config"


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`: the one-line form of every setting's check."""
    if not ok:
        raise ConfigError(message)
