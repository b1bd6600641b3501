"""Each extension axis has one registry, and only it lists the axis's names: the kinds of weight source
(vit/weights/read.py's WEIGHT_SOURCES) and the export formats (vit/deploy/export.py's EXPORT_FORMATS). Every
other module asks the registry, so adding a source or a format is one entry."""

import ast
from pathlib import Path

import pytest

from vit.deploy.export import EXPORT_FORMATS
from vit.weights.read import WEIGHT_SOURCES

VIT = Path(__file__).resolve().parents[2] / "vit"
REGISTRY_OF_SOURCES = VIT / "weights" / "read.py"
REGISTRY_OF_FORMATS = VIT / "deploy" / "export.py"


def modules_with_constant(text: str, root: Path = VIT) -> list[str]:
    """The modules under `root` with a string constant equal to `text` (a docstring or a message that mentions
    it inside other words is not a listing)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(tree)):
            found.append(str(path.relative_to(root.parent)))
    return found


@pytest.mark.parametrize("prefix", [e.prefix for e in WEIGHT_SOURCES.values() if e.prefix])
def test_weight_source_prefixes_are_listed_once(prefix):
    assert modules_with_constant(prefix) == [str(REGISTRY_OF_SOURCES.relative_to(VIT.parent))]


@pytest.mark.parametrize("name", sorted(EXPORT_FORMATS))
def test_export_format_names_are_listed_once(name):
    assert modules_with_constant(name) == [str(REGISTRY_OF_FORMATS.relative_to(VIT.parent))]


def test_a_second_listing_is_found(tmp_path):
    package = tmp_path / "vit" / "tools"
    package.mkdir(parents=True)
    (package / "a.py").write_text('def f(fmt):\n    return fmt == "onnx"\n')
    (package / "b.py").write_text('"""Writes onnx files."""\nX = f"timm:{1}"\n')
    assert modules_with_constant("onnx", tmp_path / "vit") == ["vit/tools/a.py"]
    assert modules_with_constant("timm:", tmp_path / "vit") == ["vit/tools/b.py"]


def test_a_new_source_is_one_entry(tmp_path, monkeypatch):
    """A source kind added to the registry is read by `read_weights` and found by `source_kind`, with no other
    change."""
    from vit.weights.fit import Weights
    from vit.weights.read import WeightSource, read_weights, source_kind

    def read_hub(name, ema, instead):
        return Weights({"w": __import__("torch").zeros(1)}, f"hub:{name}")

    entries = {"hub": WeightSource("hub:", read_hub, "hub:<name>"), **WEIGHT_SOURCES}
    monkeypatch.setattr("vit.weights.read.WEIGHT_SOURCES", entries)
    assert source_kind("hub:tiny") == "hub" and source_kind("x.pt") == "file"
    assert read_weights("hub:tiny").where == "hub:tiny"
