"""vit/progress.py: silent for a short stretch, one line per interval in a log, a bar on a terminal; the items pass
through unchanged either way."""

import sys

import vit.progress as progress_module
from vit.progress import progress


class Clock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_log_gets_one_line_per_interval_and_a_short_stretch_none(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    monkeypatch.setattr(progress_module.time, "perf_counter", Clock(step=4.0))  # each item 4 s
    assert list(progress(range(10), 10, "decoding 2,560 images", unit="batches")) == list(range(10))
    lines = capsys.readouterr().err.splitlines()
    # The clock reads 4 s per call: lines after items 3, 6 and 9 (12 s, 24 s, 36 s since the last line).
    assert lines == [
        "decoding 2,560 images: 3 / 10 batches (30%), 12 s",
        "decoding 2,560 images: 6 / 10 batches (60%), 24 s",
        "decoding 2,560 images: 9 / 10 batches (90%), 36 s",
    ]
    monkeypatch.setattr(progress_module.time, "perf_counter", Clock(step=0.01))
    assert list(progress(range(10), 10, "quick")) == list(range(10))
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_a_bar(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert list(progress(iter("abc"), 3, "evaluating")) == ["a", "b", "c"]
    assert "evaluating" in capsys.readouterr().err


def test_a_log_line_during_a_bar_is_written_above_it_and_the_handlers_come_back(monkeypatch, capsys):
    import logging

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)  # as Hydra's console handler, on the (captured) stderr
    console.setFormatter(logging.Formatter("LOG %(message)s"))
    monkeypatch.setattr(root, "handlers", [console])
    monkeypatch.setattr(root, "level", logging.INFO)
    for item in progress(range(3), 3, "evaluating"):
        if item == 1:
            logging.getLogger("vit.test").info("hello from the log")
    written = capsys.readouterr().err
    before = written[: written.index("LOG hello from the log")]
    # tqdm.write clears the bar's line (a carriage return after blanks) before the record: not printed after the bar
    assert before.endswith("\r") and before.rstrip("\r").endswith(" "), repr(written)
    assert root.handlers == [console]
