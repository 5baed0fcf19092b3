"""docs/vacuum.md's two ``sa-outbox health`` outputs, from the state the page describes.

On a database of its own (the xmin horizon line names the oldest session *of the
database*, and the shared test database has other sessions): 5,000 jobs are enqueued, an
"analyst" session takes a snapshot and stays ``idle in transaction``, 4,990 jobs succeed,
and the worker's vacuum runs; the first command must print what the page shows. The
analyst is ended with ``pg_terminate_backend`` as the page says, the vacuum runs again, and
the second command must print the page's second output. Compared with the page after
replacing what cannot repeat: live-tuple estimates, sizes, pids, transaction ages, times
and ages. Row counts, dead tuples and the session's state must match as printed.
Autovacuum is off on the test's tables, so that ``autovacuum never`` holds.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, insert, select, text, update
from sqlalchemy.engine import make_url

from sa_outbox import Vacuumer, VacuumPolicy

from .helpers import wait_until
from .test_docs_operations import console_commands, models_snippet

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "vacuum.md"
DATABASE = f"docs_vacuum_{os.getpid()}"

_SIZE = r"\d+(?:\.\d)? (?:B|kB|MB|GB|TB)"  # as sa_outbox._human.size prints it
_REPLACED = [
    (re.compile(r"live tuples \d+"), "live tuples N"),
    (
        re.compile(rf"size {_SIZE} \(table {_SIZE}, indexes {_SIZE}\)"),
        "size N (table N, indexes N)",
    ),
    (re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC"), "TIME"),
    (re.compile(r"\b(?:\d+d\d{2}h|\d+h\d{2}m|\d+m\d{2}s|\d+(?:\.\d+)?s)\b"), "AGE"),
    (re.compile(r"pid \d+"), "pid N"),
    (re.compile(r"\d+ transactions old"), "N transactions old"),
]


def normalised(output: str) -> list[str]:
    lines = []
    for line in output.strip("\n").splitlines():
        for pattern, replacement in _REPLACED:
            line = pattern.sub(replacement, line)
        lines.append(line)
    return lines


@pytest.fixture
def database(database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "models.py").write_text(models_snippet())
    try:
        url = make_url(database_url).set(database=DATABASE)
        yield url.render_as_string(hide_password=False), tmp_path
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        admin.dispose()


def health(url: str, cwd: Path, command: str) -> str:
    argv = shlex.split(command)
    assert argv[:2] == ["sa-outbox", "health"], command
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"}
    env.pop("SA_OUTBOX_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "sa_outbox", *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def dead_tuples(engine: Engine) -> int:
    with engine.connect() as conn:
        query = text("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'")
        return int(conn.execute(query).scalar_one())


def test_the_health_report_before_and_after_the_analyst(
    database: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cwd = database
    models = types.ModuleType(f"docs_vacuum_models_{os.getpid()}")  # the page's models
    monkeypatch.setitem(sys.modules, models.__name__, models)
    exec(models_snippet(), models.__dict__)
    job = models.Job

    [(line1, first, shown1), (line2, second, shown2)] = console_commands(PAGE)
    engine = create_engine(url)
    analyst = psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        models.Base.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE jobs SET (autovacuum_enabled = off)"))
            conn.execute(insert(job), [{"kind": "send-email", "payload": {}}] * 5000)
        analyst.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        analyst.execute("SELECT count(*) FROM jobs").fetchone()
        with engine.begin() as conn:
            ran = select(job.id).limit(4990).scalar_subquery()
            conn.execute(update(job).where(job.id.in_(ran)).values(status="succeeded"))
        # Statistics arrive when the writer's backend flushes them (within a second idle):
        # the vacuum must see them, or its own report would be overwritten after it.
        wait_until(lambda: dead_tuples(engine) >= 4990, "the update's dead tuples to be counted")
        vacuumer = Vacuumer(engine, job, VacuumPolicy(threshold=1000, scale=0))
        assert vacuumer.run_once().vacuumed == ["public.jobs"]

        out = health(url, cwd, first)
        assert normalised(out) == normalised(shown1), f"docs/vacuum.md:{line1}\n{out}"
        assert "(idle in transaction)" in out and "dead tuples 4990" in out

        with engine.connect() as conn:  # as the page says, by the pid the report named
            [pid] = re.findall(r"held by pid (\d+)", out)
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": int(pid)})
        gone = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")

        def terminated() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(gone, {"pid": int(pid)}).scalar_one() == 0)

        wait_until(terminated, "the analyst's session to end")
        assert vacuumer.run_once().vacuumed == ["public.jobs"]

        out = health(url, cwd, second)
        assert normalised(out) == normalised(shown2), f"docs/vacuum.md:{line2}\n{out}"
        assert dead_tuples(engine) == 0
    finally:
        analyst.close()
        engine.dispose()
