"""Each setting's help: the comment beside its declaration, read from the class's source.

A field's help is its trailing comment, or without one the comment lines right above it:

    lr: float = knob(1.0e-3, low=0.0, low_open=True)  # for a global batch of lr_batch images, scaled linearly
    # null: the optimizer's own default (AdamW's betas (0.9, 0.999), eps 1e-8)
    betas: tuple[float, float] | None = knob(None, ...)

A comment line that starts with `# --` is a section heading (`# -- positions --`), not help: the fields below it
belong to that section. The help is written once, where the default and the range are declared; docs/CONFIG.md and
`python train.py --help` are generated from it (vit/config/reference.py). A subclass that declares a field again
keeps its base's help, its own comment added in brackets.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize

_TOOL_COMMENTS = ("fmt:", "noqa", "type:", "pragma")  # directives for the tools, not help


@dataclasses.dataclass(frozen=True)
class FieldHelp:
    text: str  # the comment's words, its lines joined; "" when the field has none
    section: str  # the heading of the section the field is declared in; "" outside any


@functools.cache
def field_help(cls: type) -> dict[str, FieldHelp]:
    """Every dataclass field of `cls` (its bases' too) with its help, in declaration order."""
    names = [f.name for f in dataclasses.fields(cls)]
    found: dict[str, FieldHelp] = {}
    for klass in reversed(cls.__mro__):  # the base first; a subclass's comment is added to its base's
        for name, entry in _declared_help(klass).items():
            base = found.get(name)
            if base is not None and base.text and entry.text and entry.text != base.text:
                entry = FieldHelp(f"{base.text} (here: {entry.text})", entry.section or base.section)
            elif base is not None and not entry.text:
                entry = FieldHelp(base.text, entry.section or base.section)
            found[name] = entry
    return {name: found.get(name, FieldHelp("", "")) for name in names}


def _declared_help(klass: type) -> dict[str, FieldHelp]:
    """The help of the fields `klass` itself declares, from its source (none for a class without source)."""
    if klass is object or not dataclasses.is_dataclass(klass):
        return {}
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether the line holds the comment only)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if not text.startswith(_TOOL_COMMENTS):
                comments[token.start[0]] = (text, token.line.strip().startswith("#"))
    headings = sorted((line, text[2:].strip(" -")) for line, (text, alone) in comments.items()
                      if alone and text.startswith("--"))  # fmt: skip
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        lines = range(node.lineno, node.end_lineno + 1)
        trailing = [comments[n][0] for n in lines if n in comments and not comments[n][1]]
        above, n = [], node.lineno - 1
        while n in comments and comments[n][1] and not comments[n][0].startswith("--"):
            above.insert(0, comments[n][0])
            n -= 1
        section = next((text for line, text in reversed(headings) if line < node.lineno), "")
        out[node.target.id] = FieldHelp(" ".join(trailing or above), section)
    return out
