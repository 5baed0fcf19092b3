"""Behind PgBouncer in transaction mode (tests/pgbouncer.py starts one of the session's own).

The paths a user meets there: enqueue (no prepared statements), the worker and the relay
(LISTEN needs a direct connection, ``listen_url=``; without one they warn, once, and poll),
Alembic migrations. Waits are on events (a handler ran, a warning was logged), never on time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import alembic_ext  # noqa: F401 - registers op.create_job_queue & co.
from sa_outbox import AsyncWorker, JobApp, JobQueue, Outbox, Relay, Worker, connect_args
from sa_outbox._pooler import through_pooler
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.relay._listen import SyncListener

from .conftest import Job, OutboxEvent
from .helpers import jobs_by_status

DOCS = Path(__file__).resolve().parents[1] / "docs"
WAIT = 15.0  # seconds a test waits for an event before it fails (never reached when green)


@pytest.fixture
def pooled(engine: Engine, pgbouncer_url: str) -> Iterator[Engine]:
    """An engine through PgBouncer, as a user configures it: no prepared statements. More
    client connections than PgBouncer's two server connections, so they really share."""
    eng = create_engine(
        pgbouncer_url, pool_size=8, connect_args=connect_args(transaction_pooler=True)
    )
    yield eng
    eng.dispose()


@pytest.fixture
async def apooled(engine: Engine, pgbouncer_url: str) -> AsyncIterator[AsyncEngine]:
    url = make_url(pgbouncer_url).set(drivername="postgresql+psycopg_async")
    eng = create_async_engine(url, connect_args=connect_args(transaction_pooler=True))
    yield eng
    await eng.dispose()


def psycopg_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_a_pooled_connection_is_told_from_a_direct_one(
    database_url: str, pgbouncer_url: str
) -> None:
    with psycopg.connect(psycopg_url(pgbouncer_url), autocommit=True) as conn:
        assert through_pooler(conn)
    with psycopg.connect(psycopg_url(database_url), autocommit=True) as conn:
        assert not through_pooler(conn)


def test_enqueue_through_pgbouncer_from_many_threads(pooled: Engine, engine: Engine) -> None:
    queue = JobQueue(Job)
    errors: list[BaseException] = []

    def enqueue_many() -> None:
        try:
            for i in range(40):  # past psycopg's prepare threshold (5) many times over
                with pooled.begin() as conn:
                    assert queue.enqueue(conn, "ping", {"i": i}).inserted
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue_many) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 4)
    assert errors == []
    assert jobs_by_status(engine) == {"pending": 240}


class Records(logging.Handler):
    """Log records as they come, with an event per match: a test waits on it."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.WARNING)
        self.needle = needle
        self.matched: list[str] = []
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.needle in message:
            self.matched.append(message)
            self.event.set()


@pytest.fixture
def warnings_about_listen_url() -> Iterator[Records]:
    records = Records("listen_url=")
    root = logging.getLogger("sa_outbox")
    root.addHandler(records)
    yield records
    root.removeHandler(records)


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, name="pooled-worker", daemon=True)
    thread.start()
    return thread


def test_a_worker_behind_pgbouncer_wakes_up_through_a_direct_listen_url(
    pooled: Engine, database_url: str, engine: Engine, warnings_about_listen_url: Records
) -> None:
    ran = threading.Event()
    app = JobApp(Job, handlers={"ping": lambda job: ran.set()})
    worker = Worker(
        app,
        pooled,
        listen_url=database_url,
        poll_interval=3600,  # only a notification can start the job
        install_signal_handlers=False,
        reclaim=False,
    )
    thread = run_in_thread(worker)
    try:
        assert worker.listening.wait(WAIT)
        with pooled.begin() as conn:  # enqueued through PgBouncer, NOTIFY at its commit
            JobQueue(Job).enqueue(conn, "ping", {})
        assert ran.wait(WAIT)
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert worker.listener is None  # stopped
    assert warnings_about_listen_url.matched == []
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_a_worker_listening_through_pgbouncer_warns_once_and_polls(
    pooled: Engine, engine: Engine, warnings_about_listen_url: Records
) -> None:
    ran = threading.Event()
    app = JobApp(Job, handlers={"ping": lambda job: ran.set()})
    worker = Worker(app, pooled, poll_interval=0.2, install_signal_handlers=False, reclaim=False)
    thread = run_in_thread(worker)
    try:
        assert warnings_about_listen_url.event.wait(WAIT)
        listener = worker.listener
        assert listener is not None and listener.deaf.is_set()
        assert not worker.listening.is_set()  # it cannot hear: not "listening"
        with pooled.begin() as conn:
            JobQueue(Job).enqueue(conn, "ping", {})
        assert ran.wait(WAIT)  # polling still runs it
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    [message] = warnings_about_listen_url.matched
    assert "connection pooler" in message and "docs/pgbouncer.md" in message


async def test_an_async_worker_behind_pgbouncer_wakes_up_through_a_direct_listen_url(
    apooled: AsyncEngine, database_url: str, engine: Engine
) -> None:
    ran = asyncio.Event()

    async def ping(job: Any) -> None:
        ran.set()

    app = JobApp(Job, handlers={"ping": ping})
    worker = AsyncWorker(
        app,
        apooled,
        listen_url=database_url,
        poll_interval=3600,
        install_signal_handlers=False,
        reclaim=False,
    )
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.listening.wait(), WAIT)
        async with apooled.begin() as conn:
            await conn.run_sync(lambda sync: JobQueue(Job).enqueue(sync, "ping", {}))
        await asyncio.wait_for(ran.wait(), WAIT)
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
    assert jobs_by_status(engine) == {"succeeded": 1}


async def test_an_async_worker_listening_through_pgbouncer_warns(
    apooled: AsyncEngine, engine: Engine, warnings_about_listen_url: Records
) -> None:
    app = JobApp(Job, handlers={"ping": lambda job: None})
    worker = AsyncWorker(
        app, apooled, poll_interval=0.2, install_signal_handlers=False, reclaim=False
    )
    task = asyncio.create_task(worker.run())
    try:
        assert await asyncio.to_thread(warnings_about_listen_url.event.wait, WAIT)
        assert worker.listener is not None and worker.listener.deaf.is_set()
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
    assert len(warnings_about_listen_url.matched) == 1


def add_event(engine: Engine, key: str) -> None:
    with engine.begin() as conn:
        Outbox(OutboxEvent).append(
            conn, event_type="order.placed", aggregate_type="order", aggregate_id=key, payload={}
        )


def test_a_relay_behind_pgbouncer_wakes_up_through_a_direct_listen_url(
    pooled: Engine, database_url: str, warnings_about_listen_url: Records
) -> None:
    published = threading.Event()
    seen: list[Any] = []

    def record(event: Any) -> None:
        seen.append(event)
        published.set()

    relay = Relay(
        pooled, OutboxEvent, CallablePublisher(record), poll_interval=3600, listen_url=database_url
    )
    relay.run_once()  # nothing yet
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        assert relay.listening.wait(WAIT)
        add_event(pooled, "a1")  # through PgBouncer; its NOTIFY reaches the direct connection
        assert published.wait(WAIT)
    finally:
        relay.stop()
        thread.join(WAIT)
        relay.close()
    assert not thread.is_alive()
    assert len(seen) == 1
    assert warnings_about_listen_url.matched == []


def test_a_relay_listening_through_pgbouncer_warns_once(
    pooled: Engine, warnings_about_listen_url: Records
) -> None:
    relay = Relay(pooled, OutboxEvent, CallablePublisher(lambda event: None), poll_interval=0.2)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        assert warnings_about_listen_url.event.wait(WAIT)
        add_event(pooled, "b1")  # still published, by polling
    finally:
        relay.stop()
        thread.join(WAIT)
        relay.close()
    [message] = warnings_about_listen_url.matched
    assert message.startswith("relay ") and "connection pooler" in message


def test_a_relay_listener_on_a_direct_connection_sends_no_probe(
    engine: Engine, database_url: str
) -> None:
    relay = Relay(engine, OutboxEvent, CallablePublisher(lambda event: None))
    listener = SyncListener.open(engine, relay._ops, make_url(database_url))
    assert listener is not None
    try:
        assert listener._probe is None and not listener.deaf()
    finally:
        listener.close()


def test_alembic_migrations_run_through_pgbouncer(pgbouncer_url: str, engine: Engine) -> None:
    schema = f"pgb_{uuid.uuid4().hex[:10]}"
    pooled = create_engine(pgbouncer_url, connect_args=connect_args(transaction_pooler=True))
    try:
        with pooled.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
            op: Any = Operations(MigrationContext.configure(conn))
            op.create_job_queue("jobs", schema=schema)
            op.create_outbox("outbox", schema=schema)
        with pooled.connect() as conn:
            found = conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = :s ORDER BY 1"),
                {"s": schema},
            ).scalars()
            assert list(found) == ["jobs", "outbox"]
        with pooled.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            op.drop_outbox("outbox", schema=schema)
            op.drop_job_queue("jobs", schema=schema)
        with pooled.connect() as conn:
            left = conn.execute(
                text("SELECT count(*) FROM pg_tables WHERE schemaname = :s"), {"s": schema}
            ).scalar()
            assert left == 0
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pooled.dispose()


def test_connect_args_refuses_session_options_behind_a_pooler() -> None:
    from sa_outbox import InvalidArgument

    with pytest.raises(InvalidArgument, match="ALTER ROLE"):
        connect_args(transaction_pooler=True, statement_timeout=60)


def test_the_cli_engines_prepare_nothing_behind_a_pooler_only(
    database_url: str, pgbouncer_url: str
) -> None:
    from sa_outbox.cli._common import _engine
    from sa_outbox.cli._common import database_url as cli_url

    for url, expected in ((pgbouncer_url, None), (database_url, 5)):
        eng = _engine(cli_url(url))
        try:
            with eng.connect() as conn:
                driver = conn.connection.driver_connection
                assert getattr(driver, "prepare_threshold", "missing") == expected, url
                for i in range(10):  # past psycopg's threshold: prepared only when direct
                    conn.execute(text("SELECT :i"), {"i": i})
        finally:
            eng.dispose()


def test_listen_url_comes_from_the_option_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sa_outbox.cli._common import ENV_LISTEN_URL, given_listen_url
    from sa_outbox.cli._main import build_parser

    monkeypatch.delenv(ENV_LISTEN_URL, raising=False)
    assert given_listen_url(None) is None
    monkeypatch.setenv(ENV_LISTEN_URL, "postgres://app@direct:5432/app")
    assert given_listen_url(None) == "postgresql+psycopg://app@direct:5432/app"
    assert given_listen_url("postgresql://app@other/app") == "postgresql+psycopg://app@other/app"
    for command in ("worker", "relay"):
        args = build_parser().parse_args([command, "x:y", "--listen-url", "postgresql://a@b/c"])
        assert args.listen_url == "postgresql://a@b/c"


def test_the_docs_pooled_worker_runs_behind_pgbouncer(
    pooled: Engine,
    pgbouncer_url: str,
    database_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from .test_docs import blocks

    [block] = [b for b in blocks(DOCS / "pgbouncer.md") if b.snippet == "pooled-worker"]
    monkeypatch.setenv("DATABASE_URL", pgbouncer_url)
    monkeypatch.setenv("DIRECT_DATABASE_URL", database_url)
    page: dict[str, Any] = {"Job": Job}
    exec(block.compiled(), page)
    worker = page["worker"]
    try:
        assert worker.listen_url.port == make_url(database_url).port
        with pooled.begin() as conn:
            for i in range(8):
                JobQueue(Job).enqueue(conn, "send-email", {"to": f"u{i}@example.com"})
        assert worker.drain(WAIT) == 8
    finally:
        worker.close()
        page["engine"].dispose()
    assert capsys.readouterr().out.count("sending to") == 8
    assert jobs_by_status(engine) == {"succeeded": 8}
