"""docs/architecture.md tells the truth, and the import-layer check catches a wrong import.

Every module path, ``path:function`` and dotted name the page gives must exist; every
module of the package is named on the page by its path; every subpackage has its layer and
what it may import on the page (not in its docstring, which is for users); the page's
counts are today's (``python -m tests.architecture_counts``); a module over 600 lines says
in its docstring why it stays whole; and ``lint-imports`` run on a copy of the package with
one upward import added must fail, naming the contract it broke.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sa_outbox

from . import architecture_counts

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "architecture.md").read_text()
CODE = re.findall(r"`([^`\s]+)`", PAGE)
#: A module by its path, optionally with a function or class in it: ``sa_outbox/x/_y.py:Z.f``.
PATH_REFERENCE = re.compile(r"`((?:sa_outbox|alembic_ext)/[\w/]+\.py)(?::([\w.]+))?`")
LAYERS = "sa_outbox: imports point down the layers"
ALEMBIC = "alembic_ext builds on the schema and statement layers only"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize(
    "dotted",
    sorted({c for c in CODE if re.fullmatch(r"(sa_outbox|alembic_ext)(\.\w+)+", c)}),
)
def test_every_name_on_the_page_exists(dotted):
    assert _resolve(dotted) is not None


@pytest.mark.parametrize(
    "path",
    sorted(
        {
            c
            for c in CODE
            if re.match(r"(sa_outbox|alembic_ext|docs|tests)/", c) and not re.search(r"[*<]", c)
        }
    ),
)
def test_every_path_on_the_page_exists(path):
    assert (ROOT / path.split(":")[0]).exists(), path


@pytest.mark.parametrize(
    "reference",
    sorted({f"{path}:{name}" for path, name in PATH_REFERENCE.findall(PAGE) if name}),
)
def test_every_function_named_by_its_path_exists(reference):
    path, name = reference.split(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    found: object = module
    for part in name.split("."):
        found = getattr(found, part)
    assert found is not None


def test_the_page_names_every_module_of_the_package():
    """Every module that exists, by its path (``sa_outbox/worker/_core.py``, alone or as
    ``sa_outbox/worker/_core.py:Core``); a subpackage's ``__init__.py`` is named by its
    folder (`test_the_page_names_every_subpackage`)."""
    named = {path for path, _name in PATH_REFERENCE.findall(PAGE)}
    missing = [path for path in architecture_counts.module_paths() if path not in named]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_no_module_over_the_limit_without_a_reason():
    """A module over 600 lines says in its docstring why it stays whole."""
    silent = [
        f"{path} ({lines} lines)"
        for path, lines, says in architecture_counts.long_modules()
        if not says
    ]
    assert not silent, (
        f"over {architecture_counts.MAX_LINES} lines, and no sentence beginning "
        f"{architecture_counts.WHOLE_MARK!r} in the docstring: {silent}"
    )


def test_the_size_check_reads_the_docstring_only(tmp_path, monkeypatch):
    """The reason counts in the module's docstring, not in a comment or a later string."""
    package = tmp_path / "sa_outbox"
    package.mkdir()
    body = "\n" * architecture_counts.MAX_LINES
    (package / "_long.py").write_text(
        f'"""A long module."""\n# {architecture_counts.WHOLE_MARK}\n{body}'
    )
    (package / "_kept.py").write_text(
        f'"""Long. {architecture_counts.WHOLE_MARK} reasons."""\n{body}'
    )
    (package / "_short.py").write_text('"""Short."""\n')
    monkeypatch.setattr(architecture_counts, "ROOT", tmp_path)
    monkeypatch.setattr(architecture_counts, "PACKAGE", package)
    assert sorted((path, says) for path, _lines, says in architecture_counts.long_modules()) == [
        ("sa_outbox/_kept.py", True),
        ("sa_outbox/_long.py", False),
    ]


def test_the_counts_on_the_page_are_todays():
    """The *Counts* table's "today" column is what ``tests/architecture_counts.py``
    counts; when the code changes a count, the page changes with it."""
    table = PAGE[PAGE.index("## Counts") :]
    for row, number in architecture_counts.counts().items():
        found = re.search(rf"^\| {re.escape(row)} \| [^|]+ \| (\d+) \|", table, re.M)
        assert found, f"no row {row!r} in the table of counts"
        assert int(found[1]) == number, (
            f"{row}: the page says {found[1]}, the code has {number} "
            "(python -m tests.architecture_counts lists them)"
        )


def test_the_page_names_every_subpackage():
    subpackages = [m.name for m in pkgutil.iter_modules(sa_outbox.__path__) if m.ispkg]
    assert subpackages
    for name in subpackages:
        assert f"sa_outbox/{name}/" in PAGE, name


def test_every_subpackage_has_its_layer_here_and_not_in_its_docstring():
    """The page's table gives each subpackage its layer and what it may import, and
    *Inside each package* its private modules; the docstrings, which the API reference
    renders, are for users and leave that out."""
    table = PAGE[PAGE.index("## The layers") : PAGE.index("Siblings on one line")]
    inside = PAGE[PAGE.index("## Inside each package") : PAGE.index("## Sync and asyncio")]
    for info in pkgutil.iter_modules(sa_outbox.__path__):
        if not info.ispkg:
            continue
        row = re.search(rf"^\|[^|\n]*\| `sa_outbox/{info.name}/` \|[^\n]*\|[^\n|]+\|$", table, re.M)
        assert row, f"no row for sa_outbox/{info.name}/ in the table of layers"
        assert f"`sa_outbox/{info.name}/`" in inside, info.name
        if info.name == "cli":  # not in the API reference (docs/reference/): --help is
            continue
        doc = importlib.import_module(f"sa_outbox.{info.name}").__doc__ or ""
        assert not re.match(r"Layer \d", doc), info.name
        assert "may import" not in doc.lower(), info.name


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    return subprocess.run(
        [lint, "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    for name in ("sa_outbox", "alembic_ext"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_layers_hold_today(package_copy):
    result = _lint_imports(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the statement builder importing a runtime: an upward import
        ("sa_outbox/statements/_common.py", "from ..worker import Worker", LAYERS),
        # the worker importing its sibling, the relay
        ("sa_outbox/worker/_settings.py", "from ..relay import Relay", LAYERS),
        # an import hidden in a function is still an import
        (
            "sa_outbox/schema/_mixins.py",
            "def _later():\n    from ..queue import JobQueue\n",
            LAYERS,
        ),
        ("alembic_ext/_tables.py", "from sa_outbox.worker import Worker", ALEMBIC),
    ],
)
def test_a_wrong_import_breaks_the_check(package_copy, module, line, contract):
    target = package_copy / module
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    result = _lint_imports(package_copy)
    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout, result.stdout
