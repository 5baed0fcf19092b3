"""The documentation site's sources (mkdocs.yml, docs/reference/): nothing public is left out.

The API reference is a page per public package under docs/reference/, each made of
``::: module`` directives (mkdocstrings), optionally limited to ``members:``. A new public
module, or a name added to an ``__all__``, that no directive covers fails here, not silently
on the site. ``nox -s docs`` builds the site itself (``mkdocs build --strict``); the tests
that read the built reference build it here too, when mkdocs is installed (the ``docs``
extra): no heading comes from an example, no page opens with notes for contributors.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import alembic_ext
import sa_outbox

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
#: Public by name, documented elsewhere: the command line (``sa-outbox --help``,
#: docs/operations.md) and ``python -m sa_outbox``.
NOT_IN_THE_REFERENCE = {"sa_outbox.cli", "sa_outbox.__main__"}

_DIRECTIVE = re.compile(r"^::: (?P<module>[\w.]+)\n(?P<options>(?:[ ]{4}.*\n)*)", re.M)


def directives() -> dict[str, list[str] | None]:
    """``module -> the members it lists`` (None: all of them) over every reference page."""
    found: dict[str, list[str] | None] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for match in _DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            module = match["module"]
            assert module not in found, f"{page.name}: {module} is documented twice"
            options = match["options"]
            if re.search(r"^\s+members: false$", options, re.M):
                found[module] = []
            elif re.search(r"^\s+members:$", options, re.M):
                found[module] = re.findall(r"^\s+- (\w+)$", options, re.M)
            else:
                found[module] = None
    return found


def public_modules() -> list[str]:
    """Every module of sa_outbox and alembic_ext none of whose path parts starts with ``_``."""
    names = []
    for package in (sa_outbox, alembic_ext):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return [name for name in names if not name.startswith(tuple(NOT_IN_THE_REFERENCE))]


def documented_names() -> set[str]:
    names: set[str] = set()
    for module, members in directives().items():
        names.update(members if members is not None else importlib.import_module(module).__all__)
    return names


def test_every_public_package_has_a_reference_directive() -> None:
    documented = directives()
    packages = [
        name for name in public_modules() if hasattr(importlib.import_module(name), "__path__")
    ]
    missing = [name for name in packages if name not in documented]
    assert not missing, f"no ::: directive in docs/reference/ for {missing}"
    unknown = [name for name in documented if name not in public_modules()]
    assert not unknown, f"docs/reference/ documents modules that are not public: {unknown}"


def test_every_name_of_every_public_all_is_in_the_reference() -> None:
    documented = documented_names()
    missing = {}
    for name in public_modules():
        exported = set(getattr(importlib.import_module(name), "__all__", ())) - {"__version__"}
        if exported - documented:
            missing[name] = sorted(exported - documented)
    assert not missing, f"public names no page of docs/reference/ shows: {missing}"


def test_the_members_a_directive_lists_exist() -> None:
    for module, members in directives().items():
        exported = set(importlib.import_module(module).__all__)
        assert set(members or ()) <= exported, f"{module}: {set(members or ()) - exported}"


def test_every_page_is_in_the_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:\n") :]
    in_nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)$", nav, re.M))
    on_disk = {
        path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")
    } - {"README.md"}
    assert on_disk - in_nav == set(), "pages mkdocs.yml's nav leaves out"
    assert in_nav - on_disk == set(), "nav entries with no page"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``nox -s docs`` builds it (strict), into a temporary folder."""
    pytest.importorskip("mkdocs", reason="building the site needs the docs extra")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra has it")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


class _Headings(HTMLParser):
    """The text of every ``h1``…``h6`` of a page, and of every ``code`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.code: list[str] = []
        self._open: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if re.fullmatch(r"h[1-6]|code", tag):
            self._open.append((tag, []))

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            _, parts = self._open.pop()
            text = "".join(parts).replace("\u00b6", "").strip()  # without the permalink
            (self.code if tag == "code" else self.headings).append(text)

    def handle_data(self, data: str) -> None:
        for _, parts in self._open:
            parts.append(data)


def read_page(path: Path) -> _Headings:
    page = _Headings()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def example_comments() -> set[str]:
    """The ``#`` comments of the plain-code (not doctest) parts of every Examples section,
    as Markdown would have made a heading of them: ``-> True``, ``behind PgBouncer …``."""
    griffe = pytest.importorskip("griffe", reason="the docs extra has it (mkdocstrings)")
    comments: set[str] = set()

    def walk(obj: object) -> None:
        if getattr(obj, "is_alias", False):
            return
        docstring = getattr(obj, "docstring", None)
        if docstring is not None:
            for section in docstring.parse("google"):
                if section.kind is griffe.DocstringSectionKind.examples:
                    for kind, text in section.value:
                        if kind is griffe.DocstringSectionKind.text:
                            comments.update(
                                line.strip().lstrip("#").strip()
                                for line in text.splitlines()
                                if re.match(r"\s*#+ ", line)
                            )
        for member in getattr(obj, "members", {}).values():
            walk(member)

    for package in ("sa_outbox", "alembic_ext"):
        walk(griffe.load(package, search_paths=[str(ROOT)], docstring_parser="google"))
    return comments


def test_no_heading_of_the_reference_comes_from_a_comment_in_an_example(site: Path) -> None:
    """A plain-code example's ``# -> True`` renders as code (docs/griffe_examples.py), not
    as a Markdown heading in the page and its table of contents."""
    comments = example_comments()
    assert "-> True" in comments and len(comments) > 10  # the check has something to find
    pages = sorted((site / "reference").glob("*/index.html"))
    assert len(pages) == len(list(REFERENCE.glob("*.md"))) - 1  # every page but the index
    shown_as_code = set()
    for path in pages:
        page = read_page(path)
        from_comments = [h for h in page.headings if h in comments or h.startswith("->")]
        assert not from_comments, f"{path.parent.name}: headings {from_comments}"
        shown_as_code.update(c for c in comments if any(f"# {c}" in code for code in page.code))
    assert "-> True" in shown_as_code and "-> 0" in shown_as_code


def test_the_reference_pages_hold_no_notes_for_contributors(site: Path) -> None:
    """Layers, what a package may import and its private modules are for whoever changes
    sa-outbox: docs/architecture.md has them, not the reference a user reads."""
    for path in sorted((site / "reference").glob("*/index.html")):
        text = re.sub(r"<[^>]+>", " ", path.read_text(encoding="utf-8"))
        assert "May import" not in text, path.parent.name
        assert not re.search(r"\bLayer \d", text), path.parent.name
    architecture = (site / "architecture" / "index.html").read_text(encoding="utf-8")
    assert "may import" in architecture
