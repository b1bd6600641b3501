"""Every script in scripts/ and lab/ answers `--help` (and `-h`) with exit code 0 and a usage line naming
itself, before it reads any data, and so does every installed command. The lists are the folders themselves (in lab/,
the files that run as a program; the others are the modules its scripts share) and pyproject.toml's
[project.scripts], so a new script or command without `--help` fails here."""

import importlib
import runpy
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
LAB_SCRIPTS = [p for p in (REPO / "lab").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
SCRIPTS = sorted([*(REPO / "scripts").glob("*.py"), *LAB_SCRIPTS])
COMMANDS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_folders_hold_the_scripts():
    assert len(SCRIPTS) >= 20, [s.name for s in SCRIPTS]
    assert {"vit-train", "vit-eval", "vit-export", "vit-predict", "vit-average", "vit-shards"} <= set(COMMANDS)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_answers_help_with_its_usage(script, flag, monkeypatch, capsys):
    # In this process (torch is imported once for all scripts), run as `python scripts/<name>.py --help` would.
    monkeypatch.setattr(sys, "argv", [str(script), flag])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert stop.value.code in (0, None), f"{script.name} {flag} exited {stop.value.code}"
    usage = [line for line in out.splitlines() if line.strip().lower().startswith("usage:")]
    assert usage and script.name in out, f"{script.name} {flag} printed no usage naming it:\n{out}"


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"vit-train"}))  # vit-train: Hydra's own --help
def test_installed_command_answers_help_with_its_usage(command, monkeypatch, capsys):
    module, _, function = COMMANDS[command].partition(":")
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as stop:
        getattr(importlib.import_module(module), function)()
    out = capsys.readouterr().out
    assert stop.value.code in (0, None), f"{command} --help exited {stop.value.code}"
    usage = [line for line in out.splitlines() if line.strip().lower().startswith("usage:")]
    assert usage and command in usage[0], f"{command} --help printed no usage line naming it:\n{out}"
