"""Every tool reads its arguments in the grammar train.py reads its overrides (Hydra's override grammar,
vit/cli/args.py): quoted values, null, lists, `~key`; `model.<key>`/`data.<key>` at any depth with `+`, `++` and `~`
meaning what they mean in train.py (vit/config/compose.py's apply_edits on a checkpoint's own config); a
comma-separated value is a list only for a key that takes several, as a sweep is each of its values. Every refusal
is one line naming the argument, exit code 2."""

import json
import sys

import pytest
from omegaconf import OmegaConf
from test_key_value_tools import run_folder, tool  # noqa: F401 (the shared fixture)

from vit.cli.args import parse_args, run_script
from vit.config.compose import apply_edits, as_kwargs

KNOWN = {"out": None, "flip": "false", "json": "x.json", "shift": "2", "checkpoints": None}


def test_values_read_as_in_train_py():
    args = parse_args(["out='a b/c@d.pt'", "flip=true", "json=null", "~shift"], KNOWN, lists=("checkpoints",))
    assert (args["out"], args["flip"], args["json"], args["shift"]) == ("a b/c@d.pt", "true", None, "2")
    assert args.flag("flip") is True
    for given in ("checkpoints=[a.pt,b.pt]", "checkpoints=a.pt,b.pt", "checkpoints=[a.pt, b.pt]"):
        assert parse_args([given], KNOWN, lists=("checkpoints",))["checkpoints"] == ["a.pt", "b.pt"], given
    assert parse_args(["checkpoints=a.pt"], KNOWN, lists=("checkpoints",))["checkpoints"] == ["a.pt"]
    assert parse_args([], {"seeds": "0,1"}, lists=("seeds",)).whole_numbers("seeds") == [0, 1]  # a default list


def test_model_and_data_keys_at_any_depth_with_add_and_delete():
    argv = ["model.a.b=2", "+model.c=x", "~model.d", "++model.e=[1,2]", "model.pretrained=timm:vit_tiny"]
    argv.append("data.root=/x")
    args = parse_args(argv, KNOWN, model_keys=True, data_keys=True)
    kinds = [(e.kind, e.key) for e in args.model_edits]
    assert kinds == [("set", "a.b"), ("add", "c"), ("delete", "d"), ("force", "e")]
    assert args.model == {"a": {"b": 2}, "c": "x", "e": [1, 2]}  # the deleted key: the constructor's default
    assert args.source == "timm:vit_tiny" and [(e.key, e.value) for e in args.data] == [("root", "/x")]
    assert args.take_model("c") == "x" and "c" not in args.model


def test_edits_onto_a_config_mean_what_hydra_means():
    node = OmegaConf.create({"a": 1, "b": {"c": 2}, "d": None})
    OmegaConf.set_struct(node, True)
    argv = ["model.b.c=3", "+model.e=4", "++model.a=5", "++model.f=6", "~model.d", "model.b.c=null"]
    edits = parse_args(argv, {}, model_keys=True).model_edits
    apply_edits(node, edits, "model", "the checkpoint's model config")
    assert OmegaConf.to_container(node) == {"a": 5, "b": {"c": None}, "e": 4, "f": 6}
    assert as_kwargs(edits) == {"b": {"c": None}, "e": 4, "a": 5, "f": 6}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["out=a,b"], "out takes one value, and a comma-separated value is a sweep"),
        (["out=[a,b]"], "out takes one value, not a list"),
        (["+flip=true"], "flip is a key of this command already; write flip=true"),
        (["+other=1"], "unknown argument 'other'"),
        (["out=/tmp/a#b.pt"], "quote a value holding special characters: out='/tmp/a#b.pt'"),
        (["model.depth=2,4"], "'model.depth=2,4': a comma-separated value is a sweep"),
        (["model.x=1"], "has no model.x; add it with +model.x=1"),
        (["+model.a=1"], "has model.a already; set it with model.a=1"),
        (["~model.y"], "has no model.y to delete"),
        (["path"], "argument 'path' must look like key=value"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(argv, needle, capsys):
    def main(argv):
        args = parse_args(argv, KNOWN, model_keys=True)
        apply_edits(OmegaConf.create({"a": 0}, flags={"struct": True}), args.model_edits, "model", "the config")

    assert run_script(main, argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_vit_eval_applies_model_and_data_edits_to_the_checkpoints_config(run_folder, capsys):  # noqa: F811
    checkpoint = run_folder / "checkpoints" / "epoch_0002.pt"
    base = [f"checkpoint={checkpoint}", "ema=false", "device=cpu", "data.limit_val_samples=20"]
    for argv, needle in (
        (["model.no_such_key=1"], "has no model.no_such_key; add it with +model.no_such_key=1"),
        (["+data.limit_val_samples=10"], "has data.limit_val_samples already"),
    ):
        assert run_script(tool("evaluate").main, [*base, *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], lines
    assert run_script(tool("evaluate").main, [*base, "model.attn_backend=math"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 20  # the data edit applied to the checkpoint's config


COMMANDS = ("evaluate", "export", "predict", "average", "consolidate", "shards", "cifar_jpegs")


@pytest.mark.parametrize("module", COMMANDS)
def test_help_lists_every_declared_key(module, capsys, monkeypatch):
    """--help shows the keys section built from the command's declarations (KEYS), each key as key=<what it takes>."""
    command = tool(module)
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as stop:
        command.console()
    assert stop.value.code in (0, None)
    out = capsys.readouterr().out
    keys = out.split("\nkeys (", 1)[1]
    for name, key in command.KEYS.items():
        assert f"  {key.form(name)} " in keys, (name, keys)


def test_a_declared_number_is_checked_as_it_is_read(tmp_path, capsys):
    argv = [f"source={tmp_path}", f"out={tmp_path / 'shards'}", "samples_per_shard=many"]
    assert run_script(tool("shards").main, argv) == 2
    assert capsys.readouterr().err.strip() == "usage error: samples_per_shard='many' must be an integer >= 1"


def test_a_checkpoint_config_older_than_a_key_still_evaluates(run_folder, tmp_path, capsys):  # noqa: F811
    """The struct mode checks the command's edits only: a checkpoint written before data.num_workers existed still
    evaluates (this machine's workers set on its config), and the key is refused as an edit, with the + form."""
    import torch

    state = torch.load(run_folder / "checkpoints" / "epoch_0002.pt", weights_only=True)
    del state["config"]["data"]["num_workers"]
    old = tmp_path / "old.pt"
    torch.save(state, old)
    base = [f"checkpoint={old}", "ema=false", "device=cpu", "data.limit_val_samples=20"]
    assert run_script(tool("evaluate").main, base) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 20
    assert run_script(tool("evaluate").main, [*base, "data.num_workers=0"]) == 2
    assert "add it with +data.num_workers=0" in capsys.readouterr().err
    assert run_script(tool("evaluate").main, [*base, "+data.num_workers=0"]) == 0
