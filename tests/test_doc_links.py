"""Every relative link of README.md and docs/ leads somewhere: the file exists, and a `#section` names a heading of
it, spelled as GitHub spells its anchors. Moving a section between documents breaks no link silently."""

import re

import pytest
from trainer_utils import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_the_anchor_spelling_is_githubs():
    spelled = {
        "Training on NaFlex batches (`data.naflex.seq_lens`)": "training-on-naflex-batches-datanaflexseq_lens",
        "The accuracy-against-images map: measured 2026-11-29": "the-accuracy-against-images-map-measured-2026-11-29",
        "Exporting for the images' own shapes": "exporting-for-the-images-own-shapes",
    }
    assert {heading: anchor(heading) for heading in spelled} == spelled


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file_and_a_heading(doc):
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, section = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif section and path.suffix == ".md" and section not in anchors(path):
            broken.append(f"{target}: no heading '#{section}' in {path.relative_to(REPO)}")
    assert not broken, broken
