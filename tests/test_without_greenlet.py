"""Without greenlet (SQLAlchemy 2.1 no longer installs it; the ``asyncio`` extra brings it),
everything on the sync path imports and runs, and an async feature says in one line which
extra to install.

Each check runs in a child process where ``import greenlet`` fails, as in a plain
``pip install sa-outbox``; CI's smoke step (``.ci/smoke``) also installs the built wheel with
no extras in a fresh virtualenv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from sa_outbox import MissingExtra
from sa_outbox._asyncio_ext import create_async_engine, extension

WITHOUT_GREENLET = "import sys; sys.modules['greenlet'] = None\n"


def _run(
    code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_GREENLET + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_greenlet_really_is_missing_in_the_child() -> None:
    found = _run("import greenlet")
    assert found.returncode != 0
    assert "ImportError" in found.stderr or "ModuleNotFoundError" in found.stderr


def test_the_package_and_every_subpackage_import() -> None:
    found = _run(
        """
        import importlib, pkgutil, sa_outbox
        skipped = {"sa_outbox.dashboard", "sa_outbox.metrics", "sa_outbox.publishers"}
        for info in pkgutil.walk_packages(sa_outbox.__path__, "sa_outbox."):
            if info.name.split(".")[1].startswith("_"):
                continue
            if any(info.name == s or info.name.startswith(s + ".") for s in skipped):
                continue  # extras of their own (Flask, prometheus_client, brokers)
            importlib.import_module(info.name)
        print("imported")
        """
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "imported"


def test_the_command_line_answers_help() -> None:
    found = _run("import runpy; runpy.run_module('sa_outbox', run_name='__main__')", "--help")
    assert found.returncode == 0, found.stderr
    assert "usage: sa-outbox" in found.stdout


def test_a_sync_worker_and_a_sync_relay_run(database_url: str) -> None:
    schema = f"no_greenlet_{uuid.uuid4().hex[:8]}"
    found = _run(
        f"""
        from sqlalchemy import create_engine, text
        from sqlalchemy.orm import DeclarativeBase, Session
        from sa_outbox import JobApp, JobMixin, JobQueue, NewJob, Outbox, OutboxMixin, Relay, Worker
        from sa_outbox.publishers.callable import CallablePublisher

        class Base(DeclarativeBase):
            pass

        class Job(JobMixin, Base):
            __tablename__ = "jobs"
            __table_schema__ = "{schema}"

        class OutboxEvent(OutboxMixin, Base):
            __tablename__ = "outbox"
            __table_schema__ = "{schema}"

        engine = create_engine(sys.argv[1])
        with engine.begin() as conn:
            conn.execute(text('CREATE SCHEMA "{schema}"'))
        try:
            Base.metadata.create_all(engine)
            with engine.begin() as conn:
                jobs = [NewJob(kind="add", payload={{"n": n}}) for n in range(3)]
                JobQueue(Job).enqueue_many(conn, jobs)
            done = []
            app = JobApp(Job)
            app.handler("add")(lambda job: done.append(job.payload["n"]))
            with Worker(app, engine, listen=False, install_signal_handlers=False) as worker:
                worker.drain()
            with Session(engine) as session, session.begin():
                Outbox(OutboxEvent).append(session, event_type="Added", aggregate_type="sum",
                                           aggregate_id=1, payload={{}})
            sent = []
            with Relay(engine, OutboxEvent, CallablePublisher(sent.append)) as relay:
                report = relay.run_once()
            print(sorted(done), report.published, len(sent))
        finally:
            with engine.begin() as conn:
                conn.execute(text('DROP SCHEMA "{schema}" CASCADE'))
            engine.dispose()
        """,
        database_url,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["[0,", "1,", "2]", "1", "1"]


def test_an_async_engine_without_greenlet_says_what_to_install() -> None:
    found = _run(
        """
        from sa_outbox import MissingExtra
        from sa_outbox._asyncio_ext import create_async_engine
        try:
            create_async_engine("postgresql+psycopg://app@db.internal/app")
        except MissingExtra as error:
            print(error)
        """
    )
    assert found.returncode == 0, found.stderr
    lines = found.stdout.strip().splitlines()
    assert len(lines) == 1
    assert 'pip install "sa-outbox[asyncio]"' in lines[0]


def test_the_asyncio_extension_loads_where_greenlet_is_installed() -> None:
    assert extension().__name__ == "sqlalchemy.ext.asyncio"
    engine = create_async_engine("postgresql+psycopg://app@db.internal/app")
    assert type(engine).__name__ == "AsyncEngine"


def test_missing_extra_is_an_import_error_under_the_root() -> None:
    assert issubclass(MissingExtra, ImportError)
    with pytest.raises(ImportError):
        raise MissingExtra("x")
