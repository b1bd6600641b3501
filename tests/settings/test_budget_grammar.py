"""`trainer.budget`'s grammar (vit/settings/trainer.py, parse_budget): a bare number is seconds; else numbers with a
unit s, m, h or d, spaces allowed between a number and its unit and between parts, never inside a number; a number
after a unit without one of its own (`1h30`) is refused, naming the duration it most likely meant."""

import pytest
from omegaconf import OmegaConf
from trainer_utils import run_cli

from vit.errors import ConfigError
from vit.settings import TrainerSettings
from vit.settings.trainer import parse_budget


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        (" 90 ", 90.0),
        ("90s", 90.0),
        ("10 m", 600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1 h 30 m", 5400.0),
        ("1.5h", 5400.0),
        (".5m", 30.0),
        ("2H", 7200.0),
        ("1d 2h", 93600.0),
    ],
)
def test_accepted_forms(value, seconds):
    assert parse_budget(value) == seconds
    assert TrainerSettings.of(OmegaConf.create({"budget": value})).budget == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1h30", "trainer.budget='1h30' is ambiguous: 30 after 1h has no unit; write 1h30m if that is what you mean"),
        ("1h 30", "trainer.budget='1h 30' is ambiguous: 30 after 1h has no unit; write 1h 30m if"),
        ("2d3", "trainer.budget='2d3' is ambiguous: 3 after 2d has no unit; write 2d3h if"),
        ("30s5", "trainer.budget='30s5' is ambiguous: 5 after 30s has no unit (units s, m, h, d"),
        ("1 0m", "trainer.budget='1 0m' is not a duration"),  # a space inside a number is not 10m
        ("10 minutes", "trainer.budget='10 minutes' is not a duration"),
        ("m30", "trainer.budget='m30' is not a duration"),
        ("-5m", "trainer.budget='-5m' is not a duration"),
        ("0", "trainer.budget='0' must be a positive duration"),
        ("0m", "trainer.budget='0m' must be a positive duration"),
        (True, "trainer.budget=True is not a duration"),
    ],
)
def test_refused_forms_are_one_line_naming_the_value(value, message):
    with pytest.raises(ConfigError) as err:
        parse_budget(value)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        TrainerSettings.check(OmegaConf.create({"budget": value}))
    assert str(err.value).startswith(message)


def test_a_trailing_number_through_the_cli_is_one_line_and_exit_2(tmp_path):
    done = run_cli(["trainer.budget=1h30", "data=synthetic"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("config error: trainer.budget='1h30' is ambiguous: 30 after 1h has no unit")
    assert "1h30m" in done.stderr and len(done.stderr.strip().splitlines()) == 1
