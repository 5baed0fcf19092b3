"""docs/tutorial.md, followed as a reader would, against the test database.

In a folder of its own: the page's ``myapp/*.py`` snippets are written to the files their
first line names; its ``sh`` lines run in order (``alembic`` and ``sa-outbox`` are this
interpreter's ``python -m alembic`` / ``python -m sa_outbox``; the long-running ``sa-outbox
worker`` is stopped by SIGTERM once its job is done, ``sa-outbox relay`` runs ``--once``);
the ``tutorial-place-order`` block runs in a process of its own; ``sa-outbox status`` prints
what the page's console block shows. Every block of the page is used, so none can rot.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateSchema, DropSchema

from .helpers import wait_until
from .test_docs import blocks
from .test_docs_operations import console_commands, normalised

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorial.md"
SCHEMA = f"docs_tutorial_{os.getpid()}"
#: Snippets that are files of the reader's project; the first line of each names it.
FILES = ("tutorial-models", "tutorial-shop", "tutorial-tasks", "tutorial-relay")


def snippet(name: str) -> str:
    [code] = [b.code for b in blocks(PAGE) if b.snippet == name]
    return code


@pytest.fixture
def project(database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(SCHEMA))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    for name in FILES:
        code = snippet(name)
        path = code.splitlines()[0].removeprefix("# ")
        assert path.startswith("myapp/"), f"{name}: the first line must name its file"
        (tmp_path / path).write_text(code)
    yield url.render_as_string(hide_password=False), tmp_path
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
    admin.dispose()


def environment(project: tuple[str, Path]) -> dict[str, str]:
    url, cwd = project
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"}
    env.pop("SA_OUTBOX_DATABASE_URL", None)
    return env


def run(argv: list[str], project: tuple[str, Path]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=project[1],
        env=environment(project),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout}{done.stderr}"
    return done


def configure_env_py(cwd: Path) -> None:
    """The page's env.py lines in place of ``target_metadata = None``, as it says."""
    env_py = cwd / "migrations" / "env.py"
    lines = snippet("tutorial-env").splitlines()
    assert lines[0].startswith("# migrations/env.py")
    source = env_py.read_text()
    assert source.count("target_metadata = None") == 1
    env_py.write_text(source.replace("target_metadata = None", "\n".join(lines[1:])))


def run_worker_until_done(argv: list[str], project: tuple[str, Path], log: Path) -> str:
    engine = create_engine(project[0])

    def succeeded() -> bool:
        with engine.connect() as conn:
            return conn.scalar(text("SELECT count(*) FROM jobs WHERE status = 'succeeded'")) == 1

    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, *argv],
            cwd=project[1],
            env=environment(project),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(succeeded, "the tutorial's job to succeed")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        engine.dispose()
    assert worker.returncode == 0, log.read_text()
    return log.read_text()


def test_the_tutorial_runs_as_written(project: tuple[str, Path], tmp_path: Path) -> None:
    url, cwd = project
    found = list(blocks(PAGE))
    used = {*FILES, "tutorial-env", "tutorial-place-order"}
    assert {b.snippet for b in found if b.snippet} == used, "a snippet this test does not run"
    assert not [b for b in found if b.info == "python" and not b.snippet]

    outputs: dict[str, str] = {}
    for block in found:
        if block.language == "sh":
            for line in filter(None, block.code.splitlines()):
                argv = shlex.split(line)
                if argv[:2] == ["pip", "install"]:
                    continue  # the test's environment has the library installed
                if argv[0] == "alembic":
                    run(["-m", "alembic", *argv[1:]], project)
                    if argv[1] == "init":
                        configure_env_py(cwd)
                elif argv[:2] == ["sa-outbox", "worker"]:
                    log = tmp_path / "worker.log"
                    outputs["worker"] = run_worker_until_done(
                        ["-m", "sa_outbox", *argv[1:]], project, log
                    )
                elif argv[:2] == ["sa-outbox", "relay"]:
                    done = run(["-m", "sa_outbox", *argv[1:], "--once"], project)
                    outputs["relay"] = done.stdout
                else:
                    raise AssertionError(
                        f"docs/tutorial.md: a command this test cannot run: {line}"
                    )
        elif block.snippet == "tutorial-place-order":
            run(["-c", block.code], project)

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert {"orders", "jobs", "outbox", "alembic_version"} <= set(
                inspect(conn).get_table_names()
            )
            assert conn.scalar(text("SELECT count(*) FROM orders")) == 1
            assert (
                conn.scalar(text("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")) == 1
            )
    finally:
        engine.dispose()
    assert "receipt for order 1 (key receipt:1)" in outputs["worker"]
    assert "published OrderPlaced" in outputs["relay"]

    [(line, command, expected)] = console_commands(PAGE)
    done = run(["-m", "sa_outbox", *shlex.split(command)[1:]], project)
    assert normalised(done.stdout) == normalised(expected), (
        f"docs/tutorial.md:{line}\n{done.stdout}"
    )
