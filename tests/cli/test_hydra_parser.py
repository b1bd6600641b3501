"""The trainer's pre-check reads the command line as Hydra does, without Hydra's private parser: its list of Hydra's
flags (vit/cli/overrides.py, HYDRA_FLAGS) is compared here with the parser `hydra.main` itself uses, so a Hydra
release that adds, renames or removes a flag fails this test (the pre-check would step aside for a flag it does not
know, and leave the whole command line to Hydra)."""

import pytest

from vit.cli.overrides import HYDRA_FLAGS, hydra_flags, parse_command_line


def option_strings(parser) -> set[str]:
    return {name for action in parser._actions for name in action.option_strings}


def test_the_flags_are_hydras():
    from hydra._internal.utils import get_args_parser  # private: read only by this test

    assert option_strings(hydra_flags()) == option_strings(get_args_parser()), "Hydra's flags changed"
    assert len(HYDRA_FLAGS) == 14


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "model=vit_small", "trainer.epochs=2"],
        ["--cfg", "job", "data=synthetic"],
        ["-cn", "config", "model=vit_tiny", "+x=1", "~experiment"],
        ["--info", "defaults"],
        ["-p", "model", "--resolve", "-r", "a=b"],
    ],
)
def test_a_command_line_reads_as_hydra_reads_it(args):
    from hydra._internal.utils import get_args_parser

    ours, theirs = hydra_flags().parse_args(args), get_args_parser().parse_args(args)
    for name in ("overrides", "multirun", "cfg", "config_name", "info", "package", "resolve", "run"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_the_pre_check_reads_overrides_and_leaves_hydras_own_flags_to_hydra():
    flags, overrides = parse_command_line(["data=synthetic", "trainer.epochs=1"])
    assert overrides == ["data=synthetic", "trainer.epochs=1"] and not flags.multirun
    assert parse_command_line(["--help"]) is None  # Hydra prints its help
    assert parse_command_line(["--info"]) is None
    assert parse_command_line(["--version"]) is None
    assert parse_command_line(["--no-such-flag"]) is None  # Hydra says what is wrong with it
