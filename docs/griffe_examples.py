"""A Griffe extension for the API reference (mkdocs.yml loads it): Examples render as code.

The docstrings' ``Examples:`` sections hold two kinds of example. Doctests (``>>>``) Griffe
already renders as code. Plain code — a ``with engine.connect() as conn:`` block, a call
followed by a ``# -> True`` comment giving its value, for what a doctest cannot run — it
hands to Markdown as prose: each ``#`` comment became a heading in the page's table of
contents, and a cron string's ``*`` emphasis. This extension fences every such part of an
Examples section as Python, so an example reads as it does in the source.
"""

from __future__ import annotations

from typing import Any

from griffe import DocstringSectionKind, Extension, Object

FENCE = "```"


def as_code(text: str) -> str:
    """``text`` fenced as a Python code block (unchanged if it is fenced already)."""
    if text.lstrip().startswith(FENCE):
        return text
    return f"{FENCE}python\n{text.strip(chr(10))}\n{FENCE}"


class ExamplesAsCode(Extension):
    """Fence the text parts of every Examples section; doctest parts stay as they are."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        for section in obj.docstring.parsed:
            if section.kind is DocstringSectionKind.examples:
                section.value = [
                    (kind, as_code(text) if kind is DocstringSectionKind.text else text)
                    for kind, text in section.value
                ]
