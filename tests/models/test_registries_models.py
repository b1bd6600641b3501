"""The model registry is the one place a model name is listed, a model takes one config object, and each default
of a model setting is declared once (on the config dataclass; configs/model/*.yaml set only what differs)."""

import ast
import inspect
from pathlib import Path

import pytest
import yaml

from vit.models import MaskedAutoencoder, T2TViT, TransformerClassifier, VisionTransformer
from vit.models.registry import list_models, model_defaults

REPO = Path(__file__).resolve().parents[2]
REGISTRY = REPO / "vit" / "models" / "registry.py"
# The benchmark's table of cases names the registered models it times, as configs/ and the docs do: it uses the
# registry, it does not list what a name builds.
CONSUMERS = {REPO / "vit" / "analysis" / "bench_cases.py"}


def string_constants() -> dict[Path, set[str]]:
    """Each module under vit/ and the string constants it holds (each file parsed once)."""
    found = {}
    for path in sorted((REPO / "vit").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found[path] = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return found


def test_every_model_name_is_listed_in_the_registry_only():
    names = list_models()
    assert "vit_tiny" in names and "t2t_vit_7" in names
    constants = string_constants()
    for name in names:
        listed = [p for p, strings in constants.items() if name in strings and p not in CONSUMERS]
        assert listed == [REGISTRY], f"{name!r} is listed in {[str(p.relative_to(REPO)) for p in listed]}"


def test_every_registry_row_is_a_valid_config():
    """A row's identity names settings of its config class, with values its checks accept."""
    for name in list_models():
        assert model_defaults(name)["embed_dim"] > 0


@pytest.mark.parametrize(
    ("model", "parameters"),
    [
        (TransformerClassifier, ["embed", "config"]),
        (VisionTransformer, ["config"]),
        (T2TViT, ["config"]),
        (MaskedAutoencoder, ["config"]),
    ],
)
def test_a_model_takes_its_settings_as_one_config_object(model, parameters):
    """No setting is relayed by hand from a model's signature to the encoder's: each takes the config once."""
    assert list(inspect.signature(model.__init__).parameters)[1:] == parameters


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "model").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_model_yaml_restates_no_default_of_the_code(path):
    """Each key a model config sets is data-bound (`${data...}`), or a value of the recipe that differs from the
    code's default for that model: the code's defaults come in through `registry/<name>`."""
    config = yaml.safe_load(path.read_text())
    defaults = model_defaults(config["name"])
    assert config["name"] == path.stem and f"registry/{path.stem}@_here_" in config["defaults"]
    for key, value in config.items():
        if key in ("defaults", "name") or str(value).startswith("${"):
            continue
        assert key in defaults, f"{path.name}: {key} is not a setting of {config['name']}"
        assert value != defaults[key], f"{path.name}: {key}: {value!r} restates the code's default"
