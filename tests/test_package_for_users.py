"""The package holds what its users import: every public function, class and constant defined at the top of a module
of vit/ is used by the package itself, by what a user runs beside it (train.py, scripts/, the sweeper's plugin, the
configs' `_target_`s, the installed commands of pyproject.toml) or is named in the docs a user reads (README.md,
docs/*.md) as something to call. A name that only the project's measuring tools (lab/) or nothing at all use fails
here: lab/ keeps its own helpers (lab/records.py), and dead code leaves the package."""

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def public_names(path: Path) -> list[str]:
    """The module's top-level functions, classes and UPPER_CASE constants that do not start with `_`."""
    names = []
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    return [name for name in names if not name.startswith("_")]


def word_counts(paths: list[Path]) -> Counter[str]:
    """How often each word occurs in all of `paths` together."""
    return Counter(word for path in paths for word in WORD.findall(path.read_text()))


def users_files() -> list[Path]:
    """Everything that is the product or a user's text of it; lab/ and tests/ are not among them."""
    return [
        *sorted((REPO / "vit").rglob("*.py")),
        *sorted((REPO / "scripts").glob("*.py")),
        *sorted((REPO / "hydra_plugins").rglob("*.py")),
        *sorted((REPO / "configs").rglob("*.yaml")),
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "train.py",
        REPO / "pyproject.toml",
        REPO / "README.md",
    ]


def test_every_public_name_of_the_package_has_a_user():
    counts = word_counts(users_files())
    unused = []
    for module in sorted((REPO / "vit").rglob("*.py")):
        for name in public_names(module):
            # its own definition is one occurrence in its module: a use is any other, there or elsewhere
            if counts[name] - 1 < 1:
                unused.append(f"{module.relative_to(REPO)}: {name}")
    assert not unused, "defined in vit/ and used by no user of the package (lab/ and tests/ do not count): " + (
        ", ".join(unused)
    )


def test_a_name_only_lab_uses_is_found(tmp_path):
    """The check's own reading: a helper that only a measurement script calls has no user."""
    module = tmp_path / "helpers.py"
    module.write_text("def record_row(x):\n    return x\n\n\ndef used():\n    return 1\n\n\nCALLS = used()\n")
    lab_script = tmp_path / "bench.py"
    lab_script.write_text("from helpers import record_row\nrecord_row(1)\n")
    counts = word_counts([module])  # the package's side only: the lab script is not a user
    names = public_names(module)
    assert names == ["record_row", "used", "CALLS"]
    assert [n for n in names if counts[n] - 1 < 1] == ["record_row", "CALLS"]
