"""Write docs/CONFIG.md: every key of every config group with its default, what it takes, its range and what it
does, generated from the declarations (vit/settings/ and the models' config classes in vit/models/, the comment
beside each field), then every installed command's keys (each command's KEYS table, vit/cli/tool_keys.py).

usage: python scripts/config_reference.py [out=<file>]

Without `out=` it prints the page. tests/cli/test_config_reference.py fails when docs/CONFIG.md differs from what
this writes, so after changing a setting's default, range or comment run:

    python scripts/config_reference.py out=docs/CONFIG.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.cli.args import parse_args, run_script
from vit.cli.tool_keys import reference_page


def main(argv: list[str]) -> int:
    options = parse_args(argv, {"out": None})
    page = reference_page()
    if options["out"] is None:
        print(page, end="")
    else:
        Path(options["out"]).write_text(page)
        print(f"wrote {options['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
