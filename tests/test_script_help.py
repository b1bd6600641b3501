"""Every script in scripts/ answers `--help` (and `-h`) with exit code 0 and a usage line naming itself, before it
reads any data. The list is the folder itself, so a new script without `--help` fails here."""

import runpy
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


def test_the_folder_holds_the_scripts():
    assert len(SCRIPTS) >= 10, [s.name for s in SCRIPTS]


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
