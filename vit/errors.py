"""The errors an entry point turns into one line on stderr and an exit code (vit/cli/__init__.py lists the codes):

- `UserError`: bad input a user can fix, a setting, file or path: `<kind> error: <message>`, exit code 2. Each
  layer subclasses it for its own kind of input (DataError, ConfigError, CheckpointError, UsageError...), naming
  the kind the line starts with.
- `CheckFailed`: the input was good but what it asked for did not hold (an export that does not compute what the
  PyTorch model computes; a training that diverged, which has exit code 3 of its own): `<what>: <message>`
  (`export check failed: ...`, `training stopped: ...`), exit code 1.

Anything else is a bug and keeps its traceback. This module sits below every layer and imports nothing of the
project."""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input, named in the message with how to fix it: one line, exit code 2."""

    kind = ""  # the word before "error:" in train.py's line: "config", "data", "checkpoint", "output"
    exit_code = 2


class UsageError(UserError):
    """A bad command-line argument of a script (an unknown key, a value of the wrong form, a missing one)."""

    kind = "usage"


class CheckFailed(RuntimeError):
    """Good input, but what it asked for did not hold: one line `<what>: <message>`, exit code 1."""

    what = "check failed"
    exit_code = 1


def one_line(err: BaseException) -> str:
    """The line an entry point prints: `<kind> error: <message>` for bad input (`error: <message>` for an error of
    no kind, a missing file), `<what>: <message>` for a failed check."""
    if isinstance(err, CheckFailed):
        return f"{err.what}: {err}"
    word = getattr(err, "kind", "")
    return f"{word} error: {err}" if word else f"error: {err}"


def exit_with(err: BaseException) -> NoReturn:
    """Print `one_line(err)` on stderr and exit with its code. SystemExit is not an Exception, so Hydra's own error
    handler lets it through with this code."""
    print(one_line(err), file=sys.stderr, flush=True)
    raise SystemExit(getattr(err, "exit_code", 2))


class ConfigError(UserError):
    """A setting that cannot work, named with its key and value: `model.depth=0 must be >= 1`."""

    kind = "config"


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`: the one-line form of every setting's check."""
    if not ok:
        raise ConfigError(message)
