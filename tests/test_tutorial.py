"""docs/tutorial/: every page's Python blocks run in order, in one namespace a page, in a fresh folder; each page
asserts what it shows, so a page that stops being true fails here."""

import re
from pathlib import Path

import pytest
import torch

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial"
PAGES = sorted(TUTORIAL.glob("[0-9][0-9]_*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_index_lists_every_page():
    index = (TUTORIAL / "README.md").read_text()
    assert len(PAGES) == 11 and all(f"]({page.name})" in index for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
def test_the_page_runs_and_holds(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall(page.read_text())
    assert blocks, f"{page.name} has no python block"
    namespace: dict = {"__name__": f"tutorial_{page.stem}"}
    threads = torch.get_num_threads()
    try:
        for n, code in enumerate(blocks):
            exec(compile(code, f"{page.name} block {n + 1}", "exec"), namespace)  # noqa: S102 - the page's own code
    finally:
        torch.set_num_threads(threads)
    assert capsys.readouterr().out, f"{page.name} prints nothing"  # every page shows its shapes
