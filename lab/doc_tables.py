"""Regenerate the docs' tables of measured figures from their records (docs/results/), or check them.

usage: python lab/doc_tables.py [check=false]

Each table between `<!-- table: <name> -->` and `<!-- /table -->` in README.md and docs/*.md is rebuilt by
lab/record_tables.py from the record folder its name maps to (the line under each table names the folder).
With check=true nothing is written: each document whose tables differ from what their records give is named, as is
each table of measured figures that is neither generated nor listed in docs/results/README.md among the figures
measured before records were kept; the exit code is then 1 (the default test suite runs this).
"""

from __future__ import annotations

import sys

from record_tables import REPO, regenerate, unaccounted

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def main(argv: list[str]) -> int:
    args = parse_args(argv, {"check": "false"})
    if args["check"] not in ("true", "false"):
        raise UsageError(f"check={args['check']!r} must be true or false")
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        try:
            fresh = regenerate(text)
        except KeyError as err:
            raise UsageError(
                f"{doc.relative_to(REPO)}: no table named {err.args[0]!r} in lab/record_tables.py"
            ) from None
        if fresh == text:
            continue
        stale.append(doc.relative_to(REPO).as_posix())
        if args["check"] == "false":
            doc.write_text(fresh)
    verb = "differ from their records" if args["check"] == "true" else "regenerated"
    print(f"{', '.join(stale)}: tables {verb}" if stale else "every generated table matches its records")
    problems = unaccounted(DOCS)
    for problem in problems:
        print(problem)
    return 1 if problems or (stale and args["check"] == "true") else 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
