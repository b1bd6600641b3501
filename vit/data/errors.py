"""`DataError`, the data layer's kind of user error: below every module of vit/data, so each can raise it."""

from __future__ import annotations

from vit.errors import UserError


class DataError(UserError):
    """A data setting that cannot work: one message naming the key, value or path, and how to fix it."""

    kind = "data"
