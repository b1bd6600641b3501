"""The one parser of the tools' `key=value` arguments, and how a tool runs.

- `parse_args`: `key=value` arguments (Hydra style) against a table of known keys and their defaults, with
  `model.<key>=` and `data.<key>=` for the tools that build a model or read data. A bad one is a UsageError
  (vit/errors.py).
- `run_script`: `--help`/`-h` prints the tool's usage (its module docstring) and exits 0; bad input is one line on
  stderr and exit code 2, a failed check one line and exit code 1 (vit/cli/__init__.py).
- `script_command`: the command line a measurement's record names (vit/engine/provenance.py).

A tool is then a docstring with a `usage:` line and an example, a `main(argv)` and
`sys.exit(run_script(main, usage=__doc__))`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from vit.errors import CheckFailed, UsageError, UserError, one_line

HELP_FLAGS = ("-h", "--help")

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no")


class Arguments(dict):
    """The parsed `key=value` arguments: the known keys as a dict (with their defaults), and with `model_keys`
    the model's constructor arguments (`model.<key>=`, typed as YAML reads them), its weights
    (`model.pretrained=`) and with `data_keys` the data config's keys (`data.<key>=`, a dotlist without "data.")."""

    def __init__(self, values: dict) -> None:
        super().__init__(values)
        self.model: dict[str, object] = {}
        self.source: str | None = None
        self.data: list[str] = []

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if str(value).lower() in TRUE:
            return True
        if str(value).lower() in FALSE:
            return False
        raise UsageError(f"{key}={value!r} must be true or false")

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise UsageError(f"{key}={value!r} must be an integer >= {minimum}")
        return number

    def number(self, key: str, default: float | None = None, minimum: float | None = None) -> float | None:
        """A real number (>= `minimum` when given)."""
        value = self.get(key)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"{key}={value!r} must be a number") from None
        if minimum is not None and number < minimum:
            raise UsageError(f"{key}={value!r} must be a number >= {minimum:g}")
        return number

    def whole_numbers(self, key: str) -> list[int]:
        """`seeds=0,1,2`: whole numbers >= 0, comma-separated."""
        value = self[key]
        parts = [part.strip() for part in str(value).split(",")]
        if not all(part.isdigit() for part in parts):
            raise UsageError(f"{key}={value!r} must be whole numbers >= 0, comma-separated ({key}=0,1,2)")
        return [int(part) for part in parts]


def parse_args(
    argv: list[str],
    known: dict[str, object] | tuple[str, ...],
    required: tuple[str, ...] = (),
    *,
    model_keys: bool = False,
    data_keys: bool = False,
) -> Arguments:
    """`key=value` arguments (Hydra style): the keys of `known` (a dict gives their defaults; a tuple none, so an
    absent key is absent), and `model.<key>=`/`data.<key>=` where asked for. An unknown key, a missing required
    one or an argument without `=` is a UsageError naming it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    args = Arguments(dict(known) if isinstance(known, dict) else {})
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise UsageError(f"argument {arg!r} must look like key=value")
        if model_keys and key == "model.pretrained":
            args.source = value
        elif model_keys and key.startswith("model.") and key.count(".") == 1:
            try:
                args.model.update(OmegaConf.to_container(OmegaConf.from_dotlist([arg[len("model.") :]])))
            except OmegaConfBaseException as err:
                raise UsageError(f"cannot read {arg!r}: {err}") from None
        elif data_keys and key.startswith("data."):
            args.data.append(arg[len("data.") :])
        elif key in known:
            args[key] = value
        else:
            groups = (", model.<key>, model.pretrained" if model_keys else "") + (", data.<key>" if data_keys else "")
            raise UsageError(f"unknown argument {key!r}; known: {', '.join(known)}{groups}")
    missing = [k for k in required if args.get(k) in (None, "")]
    if missing:
        raise UsageError(f"{missing[0]}=<...> is required")
    return args


def refuse_positional(argv: list[str], form: Callable[[list[str]], str]) -> None:
    """Paths given without a key (`vit-average runs/tiny`), as two tools once took them: one UsageError naming the
    `key=value` form to write instead, `form(paths)` (`run=runs/tiny`). Every tool takes `key=value` only."""
    bare = [arg for arg in argv if "=" not in arg]
    if bare and not bare[0].startswith("-"):  # an option (--samples-per-shard) is parse_args' to name
        paths = [arg for arg in bare if not arg.startswith("-")]
        raise UsageError(f"argument {paths[0]!r} must look like key=value: write {form(paths)}")


def script_command(script: str, argv: list[str] | None) -> list[str]:
    """The command a script's measurement record names: the process's own command line where `main` was given it
    (`argv` None, or sys.argv's arguments), else `<folder>/<name>.py` (lab/benchmark.py) and the
    arguments `main` was called with (a test calling `main` in its process)."""
    if argv is None or (Path(sys.argv[0]).name == Path(script).name and sys.argv[1:] == list(argv)):
        return list(sys.argv)
    return [f"{Path(script).resolve().parent.name}/{Path(script).name}", *argv]


def wants_help(argv: list[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in argv)


def run_script(
    main: Callable[[list[str]], int | None],
    argv: list[str] | None = None,
    usage: str | None = None,
) -> int:
    """Call `main(argv)` (default: sys.argv[1:]). `--help` or `-h` prints `usage` instead; a UserError (a bad
    setting, file or path, vit/errors.py) and a missing file become one line on stderr and exit code 2, a
    CheckFailed (an export that does not match PyTorch, a quantized file that loses too much) one line and exit
    code 1."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print((usage or "").strip())
        return 0
    try:
        return main(argv) or 0
    except (UserError, FileNotFoundError, CheckFailed) as err:
        print(one_line(err), file=sys.stderr)
        return getattr(err, "exit_code", 2)
