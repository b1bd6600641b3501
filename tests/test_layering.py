"""Imports point down the layers: the error base (vit/errors.py) below all, models and data at the bottom, reading
and fitting weights (vit/weights) and where the computation runs (vit/runtime: device, precision, the process group,
sharding, compiling) above the models; the composed config (vit/config: composition, the groups' defaults, the
value types) above the models and the data whose registries it reads; what a run writes down (vit/records: atomic
files, provenance) above the weights; the tasks (vit/tasks: what a run trains for, a model from its config, the
evaluation loop, figures) above all of them, the search (vit/search: the sweeper, a run as a trial, the study)
above the tasks, then the trainer (vit/train) and, beside
it and not importing it, the analysis and deploy tools (vit/analysis, vit/deploy); the command line (vit/cli/,
train.py, scripts/) on top, imported by nothing in vit/. The project's measuring tools (lab/) import the package as
any user does, and nothing in it imports them. Every import of every module counts, those inside functions too."""

import ast
from pathlib import Path

import pytest

VIT = Path(__file__).resolve().parents[1] / "vit"

# package -> the packages above it, which it must not import
EVERY_PACKAGE = (
    "vit.models",
    "vit.weights",
    "vit.runtime",
    "vit.data",
    "vit.config",
    "vit.records",
    "vit.tasks",
    "vit.search",
    "vit.train",
    "vit.analysis",
    "vit.deploy",
    "vit.cli",
)
TOOLS = ("vit.train", "vit.analysis", "vit.deploy", "vit.cli")
ABOVE = {
    "vit.errors": EVERY_PACKAGE,  # the one base of the errors a user can fix: below everything
    "vit.hub": EVERY_PACKAGE,  # the Hub's offline check, for the pretrained weights and the Hugging Face datasets
    "vit.progress": EVERY_PACKAGE,  # progress bars and lines for long stretches of work
    "vit.settings": EVERY_PACKAGE,  # the config groups' typed declarations: defaults, types and ranges
    "vit.naflex": EVERY_PACKAGE,  # the NaFlex batch format: the data's loaders make it, the models read it
    "vit.models": (
        "vit.weights",
        "vit.runtime",
        "vit.data",
        "vit.config",
        "vit.records",
        "vit.tasks",
        "vit.search",
        *TOOLS,
    ),
    # reading and fitting weights: above the models it fits them to, below the tasks that build models with them
    "vit.weights": ("vit.runtime", "vit.data", "vit.config", "vit.records", "vit.tasks", "vit.search", *TOOLS),
    # device, precision, the process group, sharding, compiling: above the models whose blocks they name
    "vit.runtime": ("vit.weights", "vit.data", "vit.config", "vit.records", "vit.tasks", "vit.search", *TOOLS),
    "vit.data": (
        "vit.models",
        "vit.weights",
        "vit.runtime",
        "vit.config",
        "vit.records",
        "vit.tasks",
        "vit.search",
        *TOOLS,
    ),
    # the composed config: the registries of models and datasets declare its groups; nothing it does runs a model
    "vit.config": ("vit.weights", "vit.runtime", "vit.records", "vit.tasks", "vit.search", *TOOLS),
    # atomic files and provenance: a checkpoint that cannot be written raises the weights' error
    "vit.records": ("vit.runtime", "vit.data", "vit.config", "vit.tasks", "vit.search", *TOOLS),
    # what a run trains for, the model from its config, the evaluation pass, the figures
    "vit.tasks": ("vit.search", *TOOLS),
    # Optuna's search: the sweeper launches the trainer's runs through Hydra, as the command line does, and the runs
    # report to it through vit/search/trial.py; neither imports the trainer
    "vit.search": TOOLS,
    "vit.train": ("vit.analysis", "vit.deploy", "vit.cli"),
    # Reading a checkpoint, building a model or evaluating is the tasks': the tools never import the trainer (the
    # end-to-end benchmark, lab/e2e_timing.py, measures a training run that its caller passes in).
    "vit.analysis": ("vit.train", "vit.cli"),
    "vit.deploy": ("vit.train", "vit.analysis", "vit.search", "vit.cli"),
    "vit.cli": (),  # the command line: the top
}
# A module allowed to import a layer its table forbids, and why: none today.
EXCEPTIONS: dict[str, tuple[str, ...]] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(VIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function, relative imports resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from vit import cli`
    return names


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer_of(module: str) -> str | None:
    return next((p for p in ABOVE if within(module, p)), None)


def test_every_module_has_a_layer():
    modules = [module_name(p) for p in VIT.rglob("*.py")]
    assert "vit.train.trainer" in modules and "vit.cli.train" in modules
    assert {m for m in modules if layer_of(m) is None} <= {"vit"}


@pytest.mark.parametrize("path", sorted(VIT.rglob("*.py")), ids=lambda p: str(p.relative_to(VIT)))
def test_imports_point_down(path):
    module = module_name(path)
    forbidden = ABOVE.get(layer_of(module), ("vit.cli",))
    forbidden = tuple(f for f in forbidden if f not in EXCEPTIONS.get(module, ()))
    wrong = sorted(n for n in imported(path) if any(within(n, f) for f in forbidden))
    assert not wrong, f"{module} imports {wrong}, a layer above it"


def test_the_check_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "vit" / "train"
    package.mkdir(parents=True)
    source = package / "late.py"
    source.write_text("def f():\n    from ..analysis.plots import save\n    import vit.cli\n")
    global VIT
    VIT, kept = tmp_path / "vit", VIT
    try:
        assert {"vit.analysis.plots", "vit.cli"} <= imported(source)
    finally:
        VIT = kept


def test_no_layer_below_the_command_line_may_import_it():
    below = [layer for layer in ABOVE if layer != "vit.cli"]
    assert set(below) >= {"vit.models", "vit.data", "vit.tasks", "vit.train", "vit.deploy", "vit.analysis"}
    assert all("vit.cli" in ABOVE[layer] for layer in below)


def test_the_package_imports_nothing_of_the_workshop():
    # lab/'s modules are imported by their bare names (its scripts run from lab/, the tests put it on sys.path):
    # none of those names may appear in an import of vit/, where it would work in the tests and fail in the wheel.
    lab = {path.stem for path in (VIT.parent / "lab").glob("*.py")}
    assert {"record_tables", "bench_cases", "recipes", "step_timing"} <= lab
    wrong = {
        module_name(path): sorted(name for name in imported(path) if name.partition(".")[0] in lab)
        for path in sorted(VIT.rglob("*.py"))
    }
    assert not {module: names for module, names in wrong.items() if names}


MAX_FUNCTION_LINES = 70  # a function a reader takes in at once; a longer one is split where its steps part


def test_no_function_is_longer_than_its_limit():
    long = []
    for path in sorted(VIT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(VIT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


MAX_MODULE_LINES = 450  # a module a reader takes in at one sitting; a longer one holds two jobs, split where they part


def test_no_module_is_longer_than_its_limit():
    long = [
        f"{path.relative_to(VIT)} ({count} lines)"
        for path in sorted(VIT.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long
