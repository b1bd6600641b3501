"""`augment_settings`: the `data.augment` node read into its typed settings (`AugmentSettings`, vit/settings/data.py,
where each key's default, type and range is declared once), with the policy checked against the policies' registry;
every problem one DataError naming the key and value (exit code 2). A key a hand-built config leaves out takes its
declared default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from vit.data.augment.policies import build_policy
from vit.data.errors import DataError
from vit.errors import ConfigError
from vit.settings.data import AugmentSettings


def augment_settings(node: Mapping | AugmentSettings | None) -> AugmentSettings:
    """The node checked and read: an unknown key, a value of the wrong type or range, or a policy no entry of the
    registry builds, is a DataError naming it."""
    if isinstance(node, AugmentSettings):
        spec = node
    else:
        known = [f.name for f in fields(AugmentSettings)]
        for key in dict(node or {}):
            if key not in known:
                raise DataError(f"data.augment.{key} is not a known key (known: {', '.join(known)})")
        try:
            spec = AugmentSettings.of(node)
        except ConfigError as err:
            raise DataError(str(err)) from None
    build_policy(spec.auto_augment, 32, (0.5, 0.5, 0.5))  # refuses a bad policy string up front
    return spec
