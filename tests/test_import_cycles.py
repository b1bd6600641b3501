"""No import circles in vit/: the graph of which module imports which, read from the source (imports inside
functions count too: a circle dodged by a late import is still a circle), has no cycle.

A circle means two modules that cannot be read, tested or moved apart; the usual way out is to move what both need
into a module below them both."""

import ast
from pathlib import Path

VIT = Path(__file__).resolve().parents[1] / "vit"

# Circles known today outside vit/data, each to be broken by moving the piece both sides need lower down (as
# vit/data's were). An entry is the circle's modules, sorted; the test fails on any circle not listed here, and on a
# listed one that is gone (so the list only shrinks).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same tree it imports. `from package import name` is an edge to the submodule
    `package.name` when there is one (Python loads `package` on the way, but that is not an import of its
    `__init__`'s contents), else to `package`; `from module import thing` is an edge to `module`."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in paths and t != module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm), each as its sorted
    modules: every module in one can reach every other, so each is one circle (or several sharing modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def path_around(graph: dict[str, set[str]], component: tuple[str, ...]) -> str:
    """One circle through the component's first module, as `a -> b -> a`, for the failure message."""
    start, members = component[0], set(component)
    trail, seen = [start], {start}
    while True:
        successors = sorted(graph[trail[-1]] & members)
        if start in successors and len(trail) > 1 or not (successors and set(successors) - seen):
            return " -> ".join([*trail, start])
        nxt = next(s for s in successors if s not in seen)
        trail.append(nxt)
        seen.add(nxt)


def test_no_import_cycles():
    graph = import_graph(VIT)
    found = cycles(graph)
    new = [path_around(graph, c) for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(new)
    gone = KNOWN_CYCLES - set(found)
    assert not gone, f"these known cycles are gone: remove them from KNOWN_CYCLES: {sorted(gone)}"


def test_the_check_finds_a_cycle_through_a_late_import(tmp_path):
    package = tmp_path / "vit" / "data"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Lazy."""\n')
    (package / "loader.py").write_text("from vit.data.stream import build\n")
    (package / "stream.py").write_text("def build():\n    from . import loader\n")
    (package / "images.py").write_text("from vit.data import loader\n")  # the submodule, not the package's __init__
    graph = import_graph(tmp_path / "vit")
    assert graph["vit.data.images"] == {"vit.data.loader"}
    assert cycles(graph) == [("vit.data.loader", "vit.data.stream")]
    assert path_around(graph, ("vit.data.loader", "vit.data.stream")) == (
        "vit.data.loader -> vit.data.stream -> vit.data.loader"
    )
