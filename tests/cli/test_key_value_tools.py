"""vit-average and vit-shards take `key=value` arguments like every other tool (vit/cli/args.py): a bare path, the
form they once took, is one line naming the key=value form to write instead, exit code 2, before anything is read
or written; the key=value forms do the work."""

import importlib
import json
import sys

import pytest
import torch
from trainer_utils import load_script, make_tree

from vit.cli.args import run_script


def tool(name: str):
    return load_script(name)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run folder whose checkpoints/ holds two kept epochs of a tiny model, with EMA weights (written directly: no
    training)."""
    from omegaconf import OmegaConf
    from trainer_utils import compose_config

    from vit.tasks.build import build_model_from_config

    cfg = compose_config(["data=synthetic", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"])
    config = OmegaConf.to_container(cfg, resolve=True)
    folder = tmp_path_factory.mktemp("run")
    (folder / "checkpoints").mkdir()
    for epoch in (1, 2):
        torch.manual_seed(epoch)
        raw = build_model_from_config(cfg.model, num_classes=10).state_dict()
        ema = {k: v + 1.0 if v.is_floating_point() else v for k, v in raw.items()}
        state = {"model": raw, "ema": ema, "config": config, "class_to_idx": {f"class_{i}": i for i in range(10)}}
        torch.save({**state, "epoch": epoch, "step": epoch}, folder / "checkpoints" / f"epoch_{epoch:04d}.pt")
    return folder


@pytest.mark.parametrize(
    ("script", "args", "write"),
    [
        ("average", ["{run}", "last=2"], "write run={run}"),
        (
            "average",
            ["{run}/checkpoints/epoch_0001.pt", "{run}/checkpoints/epoch_0002.pt"],
            "write checkpoints={run}/checkpoints/epoch_0001.pt,{run}/checkpoints/epoch_0002.pt",
        ),  # fmt: skip
        ("shards", ["{tree}", "{tmp}/shards", "samples_per_shard=5"], "write source={tree} out={tmp}/shards"),
        ("shards", ["source={tree}", "{tmp}/shards"], "write out={tmp}/shards"),
    ],
)
def test_a_bare_path_names_the_key_value_form_to_write(run_folder, tmp_path, capsys, script, args, write):
    fill = {"run": run_folder, "tree": tmp_path / "tree", "tmp": tmp_path}
    (tmp_path / "tree").mkdir()
    argv = [a.format(**fill) for a in args]
    assert run_script(tool(script).main, argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("usage error: argument ") and write.format(**fill) in lines[0], lines
    assert not (tmp_path / "shards").exists() and not (run_folder / "checkpoints" / "averaged.pt").exists()


def test_vit_average_takes_a_run_folder_or_checkpoint_files_as_key_value(run_folder, tmp_path, capsys):
    folder = run_folder / "checkpoints"
    a, b = (torch.load(folder / f"epoch_000{n}.pt", weights_only=True) for n in (1, 2))
    out = tmp_path / "run.pt"
    assert run_script(tool("average").main, [f"run={run_folder}", f"out={out}"]) == 0
    assert "averaged the ema weights of 2 checkpoints" in capsys.readouterr().out  # ema=auto: the EMA ones
    averaged = torch.load(out, weights_only=True)["model"]
    torch.testing.assert_close(averaged["head.weight"], (a["ema"]["head.weight"] + b["ema"]["head.weight"]) / 2)
    files = f"checkpoints={folder / 'epoch_0001.pt'},{folder / 'epoch_0002.pt'}"
    out = tmp_path / "files.pt"
    assert run_script(tool("average").main, [files, "ema=false", f"out={out}"]) == 0
    averaged = torch.load(out, weights_only=True)["model"]
    torch.testing.assert_close(averaged["head.weight"], (a["model"]["head.weight"] + b["model"]["head.weight"]) / 2)
    for argv, needle in (
        ([], "give run=<run folder> or checkpoints=<a.pt,b.pt,...>"),
        ([f"run={run_folder}", files], "not both"),
        ([f"run={tmp_path / 'none'}"], "run=" + str(tmp_path / "none") + ": no such folder"),
        ([f"run={run_folder}", "weights=raw"], "unknown argument 'weights'"),
    ):
        assert run_script(tool("average").main, argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], lines


def test_vit_shards_takes_source_and_out_as_key_value(tmp_path, capsys):
    tree = make_tree(tmp_path / "tree", per_class=4, size=16)
    out = tmp_path / "shards"
    assert run_script(tool("shards").main, [f"source={tree}", f"out={out}", "samples_per_shard=5"]) == 0
    info = json.loads((out / "_info.json").read_text())
    assert info["splits"]["train"]["num_samples"] == 12 and info["splits"]["val"]["num_samples"] == 6
    assert run_script(tool("shards").main, [f"out={tmp_path / 'other'}"]) == 2
    assert "source=<...> is required" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "module"), [("vit-average", "average"), ("vit-shards", "shards")])
def test_the_help_shows_the_key_value_form_only(command, module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit):
        importlib.import_module(f"vit.cli.{module}").console()
    usage = [line for line in capsys.readouterr().out.splitlines() if "vit-average " in line or "vit-shards " in line]
    after = [
        line.split(name, 1)[1].split()[0] for line in usage for name in ("vit-average ", "vit-shards ") if name in line
    ]
    assert usage and all("=" in word for word in after), usage  # the first argument after the command: key=value
