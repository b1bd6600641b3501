"""How a deploy script runs (evaluate, export, predict): `--help`, and the one-line errors of vit/args.py's
`run_script`, plus exit code 1 for an export that does not compute what the PyTorch model computes."""

from __future__ import annotations

import sys
from collections.abc import Callable

from vit.args import run_script


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
