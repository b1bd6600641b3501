"""Each kind of extension has one registry, and its names are listed there only: a name written as a string in any
other module of vit/ (`if name == "cifar10":`) is a second list that the next entry would have to be added to as
well. configs/ and the docs may name them; so may the tests."""

import ast
from pathlib import Path

import pytest

from vit.data.augment.policies import POLICIES
from vit.data.sources.registry import DATASETS

VIT = Path(__file__).resolve().parents[1] / "vit"

# (module, string) pairs where the same string means something else than the registry's entry, and why.
SAME_WORD_OTHER_MEANING = {
    ("vit.data.augment.batched_policy", "cifar10"): "AutoAugment's CIFAR-10 sub-policies (torchvision's name)",
    ("vit.data.augment.policies", "cifar10"): "the AutoAugment sub-policies chosen for small images",
    ("vit.settings.data", "autoaug"): "a default value (data.augment.auto_augment's), not a branch on the name",
    ("vit.deploy.loaded_model", "imagefolder"): "the data= config evaluation and export compose when none is given",
    ("vit.cli.cifar_jpegs", "cifar10"): "the folder the CIFAR-10 JPEGs are written into (<out>/cifar10/train/...)",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(VIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def modules_naming(names, root: Path = VIT) -> dict[str, list[str]]:
    """name -> the modules under `root` that hold it as a string constant."""
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path) if root == VIT else str(path.relative_to(root))
        for name in string_constants(path) & set(names):
            found[name].append(module)
    return found


def listed_elsewhere(names, registry_module: str) -> dict[str, list[str]]:
    """name -> the modules other than the registry's that name it (less SAME_WORD_OTHER_MEANING)."""
    found = modules_naming(names)
    for name, modules in found.items():
        assert registry_module in modules, f"{name!r} is registered but not written in {registry_module}"
    return {
        name: others
        for name, modules in found.items()
        if (others := [m for m in modules if m != registry_module and (m, name) not in SAME_WORD_OTHER_MEANING])
    }


def test_dataset_names_listed_once():
    elsewhere = listed_elsewhere(DATASETS, "vit.data.sources.registry")
    assert not elsewhere, (
        f"dataset names written outside vit/data/sources/registry.py ({elsewhere}): read them from DATASETS (an "
        "entry's property, not an if on its name)"
    )


def test_policy_names_listed_once():
    elsewhere = listed_elsewhere(POLICIES, "vit.data.augment.policies")
    assert not elsewhere, (
        f"augmentation policy names written outside vit/data/augment/policies.py ({elsewhere}): read them from POLICIES"
    )


@pytest.mark.parametrize(
    "line", ['if cfg.name == "cifar10":\n    pass\n', 'STREAMED = ("webdataset",)\n', 'if kind == "rand":\n    pass\n']
)
def test_the_check_sees_a_name_written_elsewhere(tmp_path, line):
    (tmp_path / "loader.py").write_text(line)
    found = modules_naming([*DATASETS, *POLICIES], tmp_path)
    assert ["loader.py"] in found.values()


def test_every_other_meaning_is_still_there():
    """An entry of SAME_WORD_OTHER_MEANING whose string is gone from its module is removed, so the list only
    shrinks."""
    for module, name in SAME_WORD_OTHER_MEANING:
        path = VIT.parent / (module.replace(".", "/") + ".py")
        assert name in string_constants(path), f"{module} no longer writes {name!r}: remove its entry"
