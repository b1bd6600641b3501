"""The one private Hydra function the trainer's command line reads, pinned: `vit/cli/train.py` parses the command
line with `hydra._internal.utils.get_args_parser` (the parser `hydra.main` itself uses) so that its pre-check sees
the same flags and overrides Hydra will. Hydra has no public equivalent; if an upgrade moves or changes it, these
tests fail before a user meets a traceback, naming what changed."""

from vit.cli.train import parse_command_line


def test_hydras_parser_is_where_the_command_line_reads_it():
    from hydra._internal.utils import get_args_parser

    flags = get_args_parser().parse_args(["-m", "model=vit_small", "trainer.epochs=2"])
    assert flags.multirun and flags.overrides == ["model=vit_small", "trainer.epochs=2"]
    # every flag the pre-check reads before deciding to check the overrides itself
    for name in ("config_path", "config_dir", "config_name", "help", "hydra_help", "info", "shell_completion"):
        assert hasattr(flags, name), f"hydra's parser no longer gives flags.{name}"
    assert hasattr(flags, "experimental_rerun")


def test_the_pre_check_reads_overrides_and_leaves_hydras_own_flags_to_hydra():
    flags, overrides = parse_command_line(["data=synthetic", "trainer.epochs=1"])
    assert overrides == ["data=synthetic", "trainer.epochs=1"] and not flags.multirun
    assert parse_command_line(["--help"]) is None  # Hydra prints its help
    assert parse_command_line(["--info"]) is None
    assert parse_command_line(["--no-such-flag"]) is None  # Hydra says what is wrong with it
