"""The one parser of the tools' arguments, in Hydra's override grammar, and how a tool runs.

- `parse_args`: the arguments as `train.py` reads its overrides (Hydra's public override grammar): `key=value` for a
  key of the tool's table (with its default), quoted values for text with spaces or special characters, `null`,
  lists `[a,b]`; `~key` sets a key back to its default; `model.<key>=` and `data.<key>=` at any depth for the tools
  that build a model or read data, with `+model.<key>=` adding a key the config lacks, `++` setting or adding, and
  `~model.<key>` deleting one, as in train.py. A key that takes several values (`lists`) takes a list
  (`checkpoints=[a.pt,b.pt]`) or, as in a Hydra sweep, `checkpoints=a.pt,b.pt` (each of them); any other key takes
  one value, and a comma-separated value there is refused (a sweep: the tools run once). A bad argument is a
  UsageError naming it (vit/errors.py).
- `Key`: an installed command's key, declared once: its help line, default, kind (checked as it is read) and whether
  it takes several; `keys_help` lists a command's keys for its --help.
- `run_script`: `--help`/`-h` prints the tool's usage (its module docstring, then its keys) and exits 0; bad input
  is one line on stderr and exit code 2, a failed check one line and exit code 1 (vit/cli/__init__.py).
- `script_command`: the command line a measurement's record names (vit/records/provenance.py).

A command is then a docstring with a `usage:` line and an example, a `KEYS` table, a `main(argv)` and
`sys.exit(run_script(main, usage=__doc__, keys=keys_help(KEYS)))`; a script in lab/ or scripts/ may pass a plain
dict of keys and defaults instead.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vit.config.compose import Edit, as_kwargs, edit_of
from vit.errors import CheckFailed, UsageError, UserError, one_line

HELP_FLAGS = ("-h", "--help")
HELP_WIDTH = 120  # the columns of a --help line

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no")


@dataclass(frozen=True)
class Key:
    """One key an installed command takes, declared once: what `--help` says of it, its default (as text), the
    values it takes (`kind`: text, path, int, number, flag, or one of `choices`; checked as it is read) and whether
    it takes several (a list)."""

    help: str
    default: str | None = None
    kind: str = "text"
    choices: tuple[str, ...] = ()
    several: bool = False
    low: float | None = None  # the range of an int or number, where it has one
    high: float | None = None

    def form(self, name: str) -> str:
        """`name=<what it takes>` as --help shows it."""
        one = "|".join(self.choices) or {"path": "<path>", "int": "<n>", "number": "<x>", "flag": "true|false"}.get(
            self.kind, "<...>"
        )
        return f"{name}=[{one},...]" if self.several else f"{name}={one}"

    def check(self, name: str, value: str | None) -> None:
        """UsageError naming the key where `value` is not what the key takes."""
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise UsageError(f"{name}={value!r} must be one of {', '.join(self.choices)}")
        if self.kind == "flag" and value.lower() not in TRUE + FALSE:
            raise UsageError(f"{name}={value!r} must be true or false")
        if self.kind not in ("int", "number"):
            return
        try:
            number = int(value) if self.kind == "int" else float(value)
        except ValueError:
            number = None
        if (
            number is None
            or (self.low is not None and number < self.low)
            or (self.high is not None and number > self.high)
        ):
            what = "an integer" if self.kind == "int" else "a number"
            bound = lambda x: f"{x:g}"  # noqa: E731
            if self.low is not None and self.high is not None:
                what += f" in {bound(self.low)}..{bound(self.high)}"
            elif self.low is not None:
                what += f" >= {bound(self.low)}"
            raise UsageError(f"{name}={value!r} must be {what}")


def keys_help(keys: dict[str, Key], model_keys: bool = False, data_keys: bool = False) -> str:
    """The `keys:` section of a command's --help, from its declared keys."""
    rows = [(key.form(name), key.help + (f" (default: {key.default})" if key.default is not None else ""))
            for name, key in keys.items()]  # fmt: skip
    if model_keys:
        rows.append(("model.pretrained=<...>", "foreign weights: timm:<name>, or a file (with model=<name>)"))
        rows.append(
            ("model.<key>=...", "a key of the model's config, at any depth (+ adds, ++ sets or adds, ~ deletes)")
        )
    if data_keys:
        rows.append(("data.<key>=...", "a key of the data config, at any depth (+, ++ and ~ as for model.<key>)"))
    width = max(len(form) for form, _ in rows) + 2
    indent = " " * (width + 2)  # a long help goes on under its own column
    lines = [textwrap.fill(text, HELP_WIDTH, initial_indent=f"  {form.ljust(width)}", subsequent_indent=indent)
             for form, text in rows]  # fmt: skip
    return "keys (Hydra's override grammar, as train.py reads its overrides; ~<key> for the default):\n" + "\n".join(
        lines
    )


class Arguments(dict):
    """The parsed arguments: the table's keys as a dict (with their defaults; one value as text, `null` as None, a
    list key as a list of texts); with `model_keys` the model's edits (`model_edits`) and weights (`source`,
    `model.pretrained=`), with `data_keys` the data config's (`data`)."""

    def __init__(self, values: dict, declared: set[str] = frozenset()) -> None:
        super().__init__(values)
        self.declared = declared  # keys declared as Key: args[key] is None where not given
        self.model_edits: list[Edit] = []
        self.source: str | None = None
        self.data: list[Edit] = []

    def __missing__(self, key: str) -> None:
        if key in self.declared:
            return None
        raise KeyError(key)

    @property
    def model(self) -> dict:
        """The model's keys as constructor arguments (for a model named by the registry, without a config)."""
        return as_kwargs(self.model_edits)

    def take_model(self, key: str) -> object:
        """The value `model.<key>=` gave (None if not given), taken out of the model's edits: a key the tool reads
        itself (model.pretrained_file), not the model's."""
        given = [e for e in self.model_edits if e.key == key]
        self.model_edits = [e for e in self.model_edits if e.key != key]
        return given[-1].value if given and given[-1].kind != "delete" else None

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
        """`seeds=[0,1,2]` (or seeds=0,1,2): whole numbers >= 0."""
        parts = [part.strip() for part in self[key]]
        if not parts or not all(part.isdigit() for part in parts):
            raise UsageError(f"{key}={','.join(parts)!r} must be whole numbers >= 0 ({key}=[0,1,2])")
        return [int(part) for part in parts]


def _text(value: object) -> str | None:
    """One value as the tools read it: text (true/false lowercase, as written), None for null."""
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def _read(arg: str):
    """One argument through Hydra's override grammar (hydra.core.override_parser: the grammar train.py reads)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if "=" not in arg and not arg.startswith("~"):
        raise UsageError(f"argument {arg!r} must look like key=value")
    try:
        return OverridesParser.create().parse_overrides([arg])[0]
    except HydraException:
        key, _, value = arg.partition("=")
        raise UsageError(
            f"argument {arg!r} does not read in Hydra's override grammar (as train.py's overrides): quote a value "
            f"holding special characters: {key}='{value}'"
        ) from None


def _values(override, arg: str, several: bool) -> object:
    """The value of a tool's key: its text, or for a key that takes several (`several`) a list of texts."""
    key = override.key_or_group
    if override.is_sweep_override():
        if several:
            return list(override.sweep_string_iterator())
        raise UsageError(
            f"argument {arg!r}: {key} takes one value, and a comma-separated value is a sweep in Hydra's grammar "
            f"(this command runs once); quote text holding a comma: {key}='{arg.partition('=')[2]}'"
        )
    value = override.value()
    if isinstance(value, list):
        if several:
            return [_text(v) for v in value]
        raise UsageError(f"argument {arg!r}: {key} takes one value, not a list")
    if isinstance(value, dict):
        raise UsageError(f"argument {arg!r}: {key} takes one value, not a mapping")
    return [_text(value)] if several and value is not None else _text(value)


def parse_args(
    argv: list[str],
    known: dict[str, object] | tuple[str, ...],
    required: tuple[str, ...] = (),
    *,
    model_keys: bool = False,
    data_keys: bool = False,
    lists: Iterable[str] = (),
) -> Arguments:
    """The arguments in Hydra's override grammar: the keys of `known` (a dict gives their defaults, or declares
    each key as a `Key`; a tuple none, so an absent key is absent), those in `lists` (or declared several) taking
    several values (a default "a,b" is read as [a, b]), and
    `model.<key>`/`data.<key>` edits where asked for. An unknown key, a missing required one, a `+key` for a key the
    table has or an argument that does not read is a UsageError naming it."""
    declared = {name: key for name, key in known.items() if isinstance(key, Key)} if isinstance(known, dict) else {}
    lists = set(lists) | {name for name, key in declared.items() if key.several}
    defaults = {k: v for k, v in known.items() if not isinstance(v, Key)} if isinstance(known, dict) else {}
    # A declared key without a default is absent unless given: .get(name, fallback) reads the fallback.
    defaults.update({name: key.default for name, key in declared.items() if key.default is not None})
    for key in lists & defaults.keys():
        if isinstance(defaults[key], str):
            defaults[key] = [part for part in defaults[key].split(",") if part]
    args = Arguments(dict(defaults), declared=set(declared))
    for arg in argv:
        override = _read(arg)
        key = override.key_or_group
        if model_keys and key == "model.pretrained" and not override.is_delete():
            args.source = _values(override, arg, False)
        elif model_keys and key.startswith("model."):
            args.model_edits.append(edit_of(override, arg, "model"))
        elif data_keys and key.startswith("data."):
            args.data.append(edit_of(override, arg, "data"))
        elif key in known:
            if override.is_add():
                raise UsageError(f"argument {arg!r}: {key} is a key of this command already; write {arg[1:]}")
            args[key] = defaults.get(key) if override.is_delete() else _values(override, arg, key in lists)
            if key in declared and key not in lists:
                declared[key].check(key, args[key])
        else:
            groups = (", model.<key>, model.pretrained" if model_keys else "") + (", data.<key>" if data_keys else "")
            raise UsageError(f"unknown argument {key!r}; known: {', '.join(known)}{groups}")
    missing = [k for k in required if args.get(k) in (None, "", [])]
    if missing:
        raise UsageError(f"{missing[0]}=<...> is required")
    return args


def refuse_positional(argv: list[str], form: Callable[[list[str]], str]) -> None:
    """Paths given without a key (`vit-average runs/tiny`), as two tools once took them: one UsageError naming the
    `key=value` form to write instead, `form(paths)` (`run=runs/tiny`). Every tool takes `key=value` only."""
    bare = [arg for arg in argv if "=" not in arg and not arg.startswith("~")]
    if bare and not bare[0].startswith("-"):  # an option (--samples-per-shard) is parse_args' to name
        paths = [arg for arg in bare if not arg.startswith("-")]
        raise UsageError(f"argument {paths[0]!r} must look like key=value: write {form(paths)}")


def wants_help(argv: list[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in argv)


def run_script(
    main: Callable[[list[str]], int | None],
    argv: list[str] | None = None,
    usage: str | None = None,
    keys: str | None = None,
) -> int:
    """Call `main(argv)` (default: sys.argv[1:]). `--help` or `-h` prints `usage` (and `keys`, the command's
    declared keys: `keys_help`) instead; a UserError (a bad
    setting, file or path, vit/errors.py) and a missing file become one line on stderr and exit code 2, a
    CheckFailed (an export that does not match PyTorch, a quantized file that loses too much) one line and exit
    code 1."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print((usage or "").strip() + (f"\n\n{keys}" if keys else ""))
        return 0
    try:
        return main(argv) or 0
    except (UserError, FileNotFoundError, CheckFailed) as err:
        print(one_line(err), file=sys.stderr)
        return getattr(err, "exit_code", 2)
