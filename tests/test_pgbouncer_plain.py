"""A plain engine through PgBouncer in transaction mode: ``create_engine(pgbouncer_url)``, no
``connect_args``. Every runtime handed one checks its connections (`prepare_for_pooler`)
and runs on it without prepared statements; a prepared statement error that still happens
(a pooler the check cannot see) is ridden out, and nothing is lost or run twice.

The server pool has 2 connections (tests/pgbouncer.py): more client connections than that
really share them, so a prepared statement would meet another client's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from sa_outbox import AsyncWorker, JobApp, JobQueue, Outbox, Relay, Worker, _pooler
from sa_outbox._pooler import is_prepared_statement_error, pooler_guard
from sa_outbox.publishers.callable import CallablePublisher

from .conftest import Job, OutboxEvent
from .helpers import event_rows, jobs_by_status, wait_until

DOCS = Path(__file__).resolve().parents[1] / "docs"
N = 200  # jobs or events: the loop's statements run past psycopg's threshold (5) many times
WAIT = 60.0  # a bound that proves "did not hang", never reached when green


class Records(logging.Handler):
    """The library's warnings and errors, as they come."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def about_prepared_statements(self) -> list[str]:
        return [m for m in self.messages if "prepared statement" in m]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    root = logging.getLogger("sa_outbox")
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


@pytest.fixture
def plain(pgbouncer_url: str) -> Iterator[Engine]:
    """What a user writes: the pooler's URL, nothing else (a pool larger than PgBouncer's)."""
    eng = create_engine(pgbouncer_url, pool_size=8)
    yield eng
    eng.dispose()


def enqueue(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        for i in range(n):
            JobQueue(Job).enqueue(conn, "ping", {"i": i})


class Ran:
    """The payload numbers the handlers saw, from any thread."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, job: Any) -> None:
        with self._lock:
            self.seen.append(job.payload["i"])


def run_worker(worker: Worker, ran: Ran, n: int) -> None:
    thread = threading.Thread(target=worker.run, name="plain-pooled-worker", daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(ran.seen) >= n, f"{n} jobs ran", WAIT)
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()


def attempts(engine: Engine) -> dict[int, int]:
    t = Job.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.attempts, func.count()).group_by(t.c.attempts)).all()
    return {a: n for a, n in rows}


def test_a_worker_on_a_plain_pooled_engine_runs_every_job_once(
    plain: Engine, engine: Engine, records: Records
) -> None:
    enqueue(engine, N)
    ran = Ran()
    worker = Worker(
        JobApp(Job, handlers={"ping": ran}),
        plain,
        concurrency=4,
        batch=5,  # many small batches: the claim runs again and again
        poll_interval=0.05,
        install_signal_handlers=False,
        reclaim=False,
        listen=False,
    )
    run_worker(worker, ran, N)
    assert pooler_guard(plain).pooled >= 1 and not pooler_guard(plain).forced
    assert records.about_prepared_statements() == []
    assert sorted(ran.seen) == list(range(N))
    assert jobs_by_status(engine) == {"succeeded": N}
    assert attempts(engine) == {1: N}


def test_connections_pooled_before_the_worker_had_them_are_checked_at_checkout(
    plain: Engine,
) -> None:
    with plain.connect() as conn:  # in the pool already, prepared statements on
        before = conn.connection.driver_connection
        assert getattr(before, "prepare_threshold", None) == 5
    Worker(JobApp(Job, handlers={"ping": lambda job: None}), plain, install_signal_handlers=False)
    with plain.connect() as conn:
        assert conn.connection.driver_connection is before
        assert getattr(before, "prepare_threshold", "missing") is None


def test_a_direct_engine_keeps_its_prepared_statements(engine: Engine) -> None:
    direct = create_engine(engine.url)
    try:
        Worker(JobApp(Job, handlers={"ping": print}), direct, install_signal_handlers=False)
        for _ in range(2):  # the second checkout is not checked again
            with direct.connect() as conn:
                assert getattr(conn.connection.driver_connection, "prepare_threshold", 0) == 5
        assert pooler_guard(direct).pooled == 0
    finally:
        direct.dispose()


async def test_an_async_worker_on_a_plain_pooled_engine_runs_every_job_once(
    pgbouncer_url: str, engine: Engine, records: Records
) -> None:
    url = make_url(pgbouncer_url).set(drivername="postgresql+psycopg_async")
    plain = create_async_engine(url, pool_size=8)
    enqueue(engine, N)
    seen: list[int] = []

    async def ping(job: Any) -> None:
        await asyncio.sleep(0)
        seen.append(job.payload["i"])

    worker = AsyncWorker(
        JobApp(Job, handlers={"ping": ping}),
        plain,
        concurrency=8,
        batch=5,
        poll_interval=0.05,
        install_signal_handlers=False,
        reclaim=False,
    )  # it listens too: through the pooler it hears nothing, warns, and polls
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WAIT):
            while len(seen) < N:
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
        await plain.dispose()
    assert pooler_guard(plain).pooled >= 1
    assert records.about_prepared_statements() == []
    assert sorted(seen) == list(range(N))
    assert jobs_by_status(engine) == {"succeeded": N}
    assert attempts(engine) == {1: N}


def test_enqueue_on_a_plain_pooled_engine_from_many_threads(plain: Engine, engine: Engine) -> None:
    queue = JobQueue(Job)
    errors: list[BaseException] = []

    def enqueue_many() -> None:
        try:
            for i in range(30):  # one autocommit INSERT each, on the engine itself
                assert queue.enqueue(plain, "ping", {"i": i}).inserted
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert errors == []
    assert jobs_by_status(engine) == {"pending": 120}


def add_events(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        for i in range(n):
            Outbox(OutboxEvent).append(
                conn,
                event_type="order.placed",
                aggregate_type="order",
                aggregate_id=str(i),
                payload={"i": i},
            )


def run_relay(relay: Relay, published: list[Any], n: int) -> None:
    thread = threading.Thread(target=relay.run, name="plain-pooled-relay", daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(published) >= n, f"{n} events published", WAIT)
    finally:
        relay.stop()
        thread.join(WAIT)
        relay.close()
    assert not thread.is_alive()


def test_a_relay_on_a_plain_pooled_engine_publishes_every_event_once(
    plain: Engine, engine: Engine, records: Records
) -> None:
    add_events(engine, N)
    published: list[Any] = []
    relay = Relay(
        plain,
        OutboxEvent,
        CallablePublisher(published.append),
        batch=5,
        poll_interval=0.05,
        listen=False,
    )
    run_relay(relay, published, N)
    assert records.about_prepared_statements() == []
    assert sorted(e.payload["i"] for e in published) == list(range(N))
    assert all(row.published_at is not None for row in event_rows(engine))


# -- a pooler the check cannot see ------------------------------------------------------


@pytest.fixture
def unseen_pooler(pgbouncer_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The check at checkout says "direct" (a pooler that passes the server's pid on), and
    both of PgBouncer's server connections hold a prepared statement ``_pg3_0`` already:
    the first statement psycopg prepares on a new connection fails, whichever server
    connection it runs on."""
    monkeypatch.setattr(_pooler, "_pooled", lambda dbapi_connection, driver: False)
    conninfo = make_url(pgbouncer_url).set(drivername="postgresql")
    dsn = conninfo.render_as_string(hide_password=False)
    clients = [psycopg.connect(dsn) for _ in range(2)]
    try:
        on_both(clients, "DEALLOCATE ALL", "PREPARE _pg3_0 AS SELECT 1")
        yield
        on_both(clients, "DEALLOCATE ALL")  # for the tests that follow
    finally:
        for client in clients:
            client.close()


def on_both(clients: list[psycopg.Connection[Any]], *statements: str) -> None:
    """Run ``statements`` on each of PgBouncer's two server connections: two transactions
    open at once hold one each."""
    for client in clients:
        for statement in statements:
            client.execute(statement)
    for client in clients:
        client.commit()


def test_a_worker_survives_prepared_statement_errors_and_loses_nothing(
    unseen_pooler: None, plain: Engine, engine: Engine, records: Records
) -> None:
    enqueue(engine, N)
    ran = Ran()
    worker = Worker(
        JobApp(Job, handlers={"ping": ran}),
        plain,
        concurrency=4,
        batch=5,
        poll_interval=0.05,
        install_signal_handlers=False,
        reclaim=False,
        listen=False,
    )
    run_worker(worker, ran, N)
    assert pooler_guard(plain).forced
    [warning] = [m for m in records.about_prepared_statements() if "prepares" in m]
    assert "connect_args=sa_outbox.connect_args(transaction_pooler=True)" in warning
    assert sorted(ran.seen) == list(range(N))  # each job ran once
    assert jobs_by_status(engine) == {"succeeded": N}
    assert attempts(engine) == {1: N}


def test_a_relay_survives_prepared_statement_errors_and_loses_nothing(
    unseen_pooler: None, plain: Engine, engine: Engine, records: Records
) -> None:
    add_events(engine, N)
    published: list[Any] = []
    relay = Relay(
        plain,
        OutboxEvent,
        CallablePublisher(published.append),
        batch=5,
        poll_interval=0.05,
        listen=False,
    )
    run_relay(relay, published, N)
    assert pooler_guard(plain).forced
    assert sorted({e.payload["i"] for e in published}) == list(range(N))  # at least once
    assert all(row.published_at is not None for row in event_rows(engine))


def test_prepared_statement_errors_are_told_apart(pgbouncer_url: str) -> None:
    dsn = make_url(pgbouncer_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as missing:
            conn.execute("EXECUTE sa_outbox_nowhere")
        with pytest.raises(psycopg.Error) as other:
            conn.execute("SELECT 1/0")
    assert is_prepared_statement_error(missing.value)
    assert not is_prepared_statement_error(other.value)
    assert not is_prepared_statement_error(ValueError("prepared statement"))


def test_text_statements_run_on_a_checked_engine(plain: Engine) -> None:
    Worker(JobApp(Job, handlers={"ping": print}), plain, install_signal_handlers=False)
    for _ in range(3):  # separate transactions, on whichever server connection is free
        with plain.connect() as conn:
            for i in range(10):
                assert conn.execute(text("SELECT :i"), {"i": i}).scalar() == i


def test_the_docs_plain_pooled_worker_runs_behind_pgbouncer(
    pgbouncer_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    records: Records,
) -> None:
    from .test_docs import blocks

    [block] = [b for b in blocks(DOCS / "pgbouncer.md") if b.snippet == "plain-pooled-worker"]
    monkeypatch.setenv("DATABASE_URL", pgbouncer_url)
    page: dict[str, Any] = {"Job": Job}
    exec(block.compiled(), page)  # enqueues 20 jobs through PgBouncer, on the engine itself
    worker = page["worker"]
    try:
        assert worker.drain(WAIT) == 20
    finally:
        worker.close()
        page["engine"].dispose()
    assert capsys.readouterr().out.count("sending to") == 20
    assert records.about_prepared_statements() == []
    assert jobs_by_status(engine) == {"succeeded": 20}


async def test_an_async_worker_survives_prepared_statement_errors_and_loses_nothing(
    unseen_pooler: None, pgbouncer_url: str, engine: Engine, records: Records
) -> None:
    url = make_url(pgbouncer_url).set(drivername="postgresql+psycopg_async")
    plain = create_async_engine(url, pool_size=8)
    enqueue(engine, N)
    seen: list[int] = []

    async def ping(job: Any) -> None:
        seen.append(job.payload["i"])

    worker = AsyncWorker(
        JobApp(Job, handlers={"ping": ping}),
        plain,
        concurrency=8,
        batch=5,
        poll_interval=0.05,
        install_signal_handlers=False,
        reclaim=False,
        listen=False,
    )
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WAIT):
            while len(seen) < N:
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
        await plain.dispose()
    assert pooler_guard(plain).forced
    assert len([m for m in records.about_prepared_statements() if "prepares" in m]) == 1
    assert sorted(seen) == list(range(N))
    assert jobs_by_status(engine) == {"succeeded": N}
    assert attempts(engine) == {1: N}
