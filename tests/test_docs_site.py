"""The documentation site's sources (mkdocs.yml, docs/reference/): nothing public is left out.

The API reference is a page per public package under docs/reference/, each made of
``::: module`` directives (mkdocstrings), optionally limited to ``members:``. A new public
module, or a name added to an ``__all__``, that no directive covers fails here, not silently
on the site. ``nox -s docs`` builds the site itself (``mkdocs build --strict``).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

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
