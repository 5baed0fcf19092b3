"""Sessions: ``nox -s tests`` (the test command), ``nox -s lint``, ``nox -s typecheck``,
``nox -s generated`` (the synchronous runtimes are what ``tools/async_to_sync.py`` generates
from the asyncio ones), and ``nox -s docs`` (the documentation site) and ``nox -s bench`` (the
benchmark suite); docs and bench are not run by default.

The tests run against ``$SA_OUTBOX_TEST_DATABASE_URL`` when it is set, else against an
embedded PostgreSQL (pgserver, installed by the ``test`` extra). ``tests`` runs on the Python
that runs nox (3.11 or newer); ``compat`` runs it on the other
supported Pythons and SQLAlchemy versions (3.12 with SQLAlchemy 2.0, 3.13 with 2.1), which
must be installed; CI runs both. Each session has its own virtualenv; ``nox -r``
reuses them between runs.

Example:
    nox -s tests                          # SQLAlchemy 2.1 on nox's Python (3.11+)
    nox -s compat                         # Python 3.12 + SQLAlchemy 2.0, 3.13 + 2.1
    nox -s tests -- -k demo -x            # arguments after -- go to pytest
    nox -s lint typecheck                 # ruff, lint-imports, mypy --strict
    nox -s generated                      # tools/async_to_sync.py --check
    nox -s docs                           # mkdocs build --strict into site/
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "generated", "tests"]
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"  # the tools' sessions (lint, typecheck, generated, docs, bench)
ROOT = Path(__file__).parent
#: What ruff checks; a folder a clone lacks (git keeps no empty folder) is left out.
LINT_PATHS = [
    path
    for path in (
        "sa_outbox",
        "alembic_ext",
        "tests",
        "noxfile.py",
        "conftest.py",
        "examples",
        "benchmarks",
        "tools",
    )
    if (ROOT / path).exists()
]
#: The environment the tests read; passed through explicitly so the sessions stay hermetic.
PASSTHROUGH_ENV = ("SA_OUTBOX_TEST_DATABASE_URL", "SA_OUTBOX_BENCH_DATABASE_URL")


def _passthrough_env() -> dict[str, str]:
    return {name: os.environ[name] for name in PASSTHROUGH_ENV if os.environ.get(name)}


def _run_tests(session: nox.Session, sqlalchemy: str) -> None:
    session.install(".[test]")
    session.install(f"sqlalchemy[asyncio]~={sqlalchemy}.0")
    session.run(
        "python",
        "-c",
        "import sys, sqlalchemy; print('Python', sys.version.split()[0], "
        "'SQLAlchemy', sqlalchemy.__version__)",
    )
    # pyproject.toml's [tool.pytest.ini_options] collects tests/ and sa_outbox's doctests.
    session.run("pytest", *session.posargs, env=_passthrough_env())


@nox.session
def tests(session: nox.Session) -> None:
    """Run pytest (tests/ and the doctests of sa_outbox) with SQLAlchemy 2.1, on the Python
    that runs nox."""
    _run_tests(session, "2.1")


@nox.session(default=False)
@nox.parametrize(("python", "sqlalchemy"), [("3.12", "2.0"), ("3.13", "2.1")])
def compat(session: nox.Session, sqlalchemy: str) -> None:
    """The suite on the other supported Pythons, SQLAlchemy 2.0 on one of them."""
    _run_tests(session, sqlalchemy)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and lint-imports (the layers in pyproject.toml)."""
    session.install("ruff>=0.6", "import-linter>=2.1")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)
    # The import-layer check (docs/architecture.md): grimp reads the sources from the clone.
    session.run("lint-imports", env={"PYTHONPATH": str(ROOT)})


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on sa_outbox and alembic_ext (configured in pyproject.toml), and on
    tools/async_to_sync.py."""
    session.install(".[test,typecheck]")
    session.run("mypy", "--strict", "-p", "sa_outbox", "-p", "alembic_ext")
    session.run("mypy", "--strict", "tools/async_to_sync.py")


@nox.session(python=PYTHON)
def generated(session: nox.Session) -> None:
    """Fail, printing a diff, when a file ``tools/async_to_sync.py`` generates (the
    synchronous runtimes, from the asyncio ones) differs from a fresh generation: edited by
    hand, or its source edited without regenerating it."""
    session.install("ruff>=0.6")  # the tool formats what it generates
    session.run("python", "tools/async_to_sync.py", "--check")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs.yml) into site/, warnings as errors.

    mkdocstrings reads the docstrings from the sources, so a broken link between pages or a
    docstring it cannot render fails the session. Arguments after -- go to ``mkdocs build``.
    """
    session.install(".[docs]")
    session.run("mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site"), *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The benchmark suite (docs/benchmarks.md); arguments after -- go to it (--quick, --out…).

    It uses the database sa_outbox_bench on the server of ``$SA_OUTBOX_BENCH_DATABASE_URL``
    (default postgresql://postgres@127.0.0.1:5432), and ``pgbench`` from PATH.
    """
    session.install(".[bench]")
    session.run("python", "-m", "benchmarks", *session.posargs, env=_passthrough_env())
