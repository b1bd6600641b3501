"""The one base of the errors a user can fix: a bad setting, file or path. Every entry point (train.py, the
scripts) prints such an error as one line on stderr and exits with code 2; anything else is a bug and keeps
its traceback. Each layer subclasses it for its own kind of input (DataError, ConfigError, CheckpointError...),
so this module sits below all of them and imports nothing of the project."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input, named in the message with how to fix it: one line, exit code 2."""
