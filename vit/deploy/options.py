"""`key=value` arguments of the evaluate/export scripts, Hydra style: plain keys, `model.<key>=` (the model's
constructor arguments, `model.pretrained=` the weights) and `data.<key>=` (the data config's keys)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from vit.args import UsageError, run_script

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no")


@dataclass
class Options:
    values: dict[str, str] = field(default_factory=dict)
    model: dict[str, object] = field(default_factory=dict)  # model.<key>=..., typed as YAML reads them
    source: str | None = None  # model.pretrained=...
    data: list[str] = field(default_factory=list)  # data.<key>=... as dotlist items (without "data.")

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.values.get(key)
        if value is None:
            return default
        if value.lower() in TRUE:
            return True
        if value.lower() in FALSE:
            return False
        raise UsageError(f"{key}={value!r} must be true or false")

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.values.get(key)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise UsageError(f"{key}={value!r} must be an integer >= {minimum}")
        return number


def parse_options(argv: list[str], known: tuple[str, ...], data_keys: bool = True) -> Options:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    options = Options()
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise UsageError(f"argument {arg!r} must look like key=value")
        if key == "model.pretrained":
            options.source = value
        elif key.startswith("model.") and key.count(".") == 1:
            try:
                options.model.update(OmegaConf.to_container(OmegaConf.from_dotlist([arg[len("model.") :]])))
            except OmegaConfBaseException as err:
                raise UsageError(f"cannot read {arg!r}: {err}") from None
        elif key.startswith("data.") and data_keys:
            options.data.append(arg[len("data.") :])
        elif key in known:
            options.values[key] = value
        else:
            extra = ", model.<key>, model.pretrained" + (", data.<key>" if data_keys else "")
            raise UsageError(f"unknown argument {key!r}; known: {', '.join(known)}{extra}")
    return options


def run_main(main: Callable[[list[str]], int], argv: list[str] | None = None, usage: str = "") -> int:
    """Run a script's `main` through vit/args.py's `run_script` (`--help` prints `usage`; a bad setting, file or
    path is one line on stderr and exit code 2, the weights' and the export's errors included); an export that does
    not match PyTorch is exit code 1."""
    from vit.deploy.export import VerificationError
    from vit.deploy.quantize import QuantizationRefused

    def checked(args: list[str]) -> int:
        try:
            return main(args)
        except (VerificationError, QuantizationRefused) as err:
            print(f"export check failed: {err}", file=sys.stderr)
            return 1

    return run_script(checked, argv, usage=usage)  # WeightsError, ExportError: UserErrors, exit code 2
