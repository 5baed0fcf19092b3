"""The loop's own connection, and its statements run through psycopg's cursor.

- `run` keeps one connection for its batches instead of taking one from the pool per batch;
- a connection terminated between batches is invalidated, the write retried on a new one,
  and every job completed exactly once (the audit triggers of ``tests/worker_app.py``);
- at the driver level, the worker sends the SQL and the values SQLAlchemy would send, and
  decodes the rows to the same `ClaimedJob`s;
- with engine event listeners, SQLAlchemy runs the statements, so the listeners see them.

Real PostgreSQL; nothing sleeps to synchronise, nothing asserts a timing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from sa_outbox import Backoff, JobApp, JobContext, JobQueue, NewJob, Worker
from sa_outbox import statements as st
from sa_outbox.ops import ClaimParams
from sa_outbox.ops import JobOps as _JobOps
from sa_outbox.statements import COMPLETION_IDS, COMPLETION_TOKENS
from sa_outbox.worker import WorkerMetrics
from sa_outbox.worker._direct import HeldConnection, driver_statement

from . import worker_app
from .conftest import Job
from .helpers import jobs_by_status
from .test_worker_faults import assert_completed_exactly_once_by_final_token, counts, enqueue

WAIT = 10.0


class StopAfter(WorkerMetrics):
    """Counts acknowledgements; stops the worker once ``n`` are written."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.acknowledged = 0
        self.writes = 0
        self.errors: list[str] = []
        self.stop: Callable[[], None] = lambda: None

    def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
        self.writes += 1
        self.acknowledged += acknowledged
        if self.acknowledged >= self.n:
            self.stop()

    def database_error(self, operation: str, error: BaseException) -> None:
        self.errors.append(operation)


def run_until_done(worker: Worker, metrics: StopAfter) -> None:
    metrics.stop = worker.stop
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not finish"


@pytest.fixture
def worker_schema(engine: Engine) -> Iterator[str]:
    worker_app.create_schema(engine)
    yield worker_app.SCHEMA
    worker_app.drop_schema(engine)


def test_run_keeps_one_connection_for_its_batches(engine: Engine, database_url: str) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(200)])
    worker_engine = create_engine(database_url)
    checkouts = []
    event.listen(worker_engine, "checkout", lambda *args: checkouts.append(1))
    metrics = StopAfter(200)
    app = JobApp(Job, handlers={"noop": lambda job: None})
    worker = Worker(
        app,
        worker_engine,
        concurrency=2,
        batch=10,
        listen=False,
        reclaim=False,
        vacuum=None,
        metrics=metrics,
        install_signal_handlers=False,
    )
    try:
        run_until_done(worker, metrics)
    finally:
        worker_engine.dispose()
    assert jobs_by_status(engine) == {"succeeded": 200}
    assert metrics.writes >= 20  # batches of 10 at most
    # One for the start-up check (a wrong URL fails there), one for all of the batches.
    assert len(checkouts) == 2
    assert worker_engine.pool.checkedout() == 0


def test_a_pool_of_one_connection_is_shared_not_held(engine: Engine, database_url: str) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("flaky", {"n": i}) for i in range(40)])
    # One connection, and a short wait for it: a loop that kept it and asked for a second
    # one (a transaction for the retries, a heartbeat) would time out, again and again.
    worker_engine = create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=2)
    app = JobApp(Job)

    @app.handler("flaky", backoff=Backoff(base=0.01, max=0.01, jitter=0))
    def flaky(job: JobContext) -> None:
        if job.attempts == 1 and job.payload["n"] % 4 == 0:
            raise ConnectionError("the API is down")  # retried: a transaction

    metrics = StopAfter(50)  # 40 completions and 10 retries written
    worker = Worker(
        app,
        worker_engine,
        concurrency=2,
        batch=10,
        poll_interval=0.01,
        listen=False,
        vacuum=None,
        metrics=metrics,
        install_signal_handlers=False,
    )
    try:
        run_until_done(worker, metrics)
    finally:
        worker_engine.dispose()
    assert metrics.errors == []
    assert jobs_by_status(engine) == {"succeeded": 40}


def test_a_connection_terminated_between_batches_is_replaced_and_nothing_is_lost(
    engine: Engine, database_url: str, worker_schema: str
) -> None:
    ids = enqueue(engine, [NewJob("noop", {"n": i}) for i in range(120)])
    application = f"sa-outbox-held-{os.getpid()}"
    url = make_url(database_url).update_query_dict({"application_name": application})
    worker_engine = create_engine(url)
    app = JobApp(worker_app.Job)
    kills = []

    def terminate_the_workers_connections() -> int:
        with engine.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name = :name"
                    ),
                    {"name": application},
                ).all()
            )

    @app.handler("noop")
    def noop(job: JobContext) -> None:
        if job.payload["n"] in (30, 80) and job.attempts == 1:
            kills.append(terminate_the_workers_connections())

    metrics = StopAfter(len(ids))
    worker = Worker(
        app,
        worker_engine,
        concurrency=1,
        batch=10,
        listen=False,
        reclaim=False,
        vacuum=None,
        metrics=metrics,
        install_signal_handlers=False,
    )
    try:
        run_until_done(worker, metrics)
    finally:
        worker_engine.dispose()
    assert kills and all(n >= 1 for n in kills)  # the loop's connection, each time
    assert "write" in metrics.errors  # a write failed, was reported, and went through again
    assert counts(engine) == {"succeeded": len(ids)}
    assert_completed_exactly_once_by_final_token(engine, len(ids))


OPTIONS = [
    {"queues": ("default",), "kinds": None},
    {"queues": ("default", "emails"), "kinds": ("send", "noop")},
    {"queues": None, "kinds": ("noop",)},
]


def _steps(options: dict[str, Any]) -> list[tuple[Any, dict[str, Any] | None]]:
    pairs = [(uuid.uuid4(), uuid.uuid4()), (uuid.uuid4(), uuid.uuid4())]
    ids, tokens = [p[0] for p in pairs], [p[1] for p in pairs]
    claim = {"worker_id": "w1", "batch": 5, "lease": 30.0, **options}
    again = {COMPLETION_IDS: ids[:1], COMPLETION_TOKENS: tokens[:1]}
    return [
        (st.claim_jobs(Job, **claim), None),
        (st.complete_jobs(Job, pairs), None),
        (st.complete_jobs(Job, pairs), again),
        (st.complete_and_claim_jobs(Job, pairs, **claim), again),
    ]


def _normalise(params: dict[str, Any]) -> dict[str, Any]:
    # The direct path sends uuid[] parameters as array literals ({hex,hex}): read them back.
    out = {}
    for name, value in params.items():
        if isinstance(value, str) and value.startswith("{") and name.startswith("completion"):
            value = [uuid.UUID(part) for part in value[1:-1].split(",") if part]
        out[name] = value
    return out


@pytest.mark.parametrize("options", OPTIONS, ids=["one queue", "queues and kinds", "kinds"])
def test_the_driver_gets_the_sql_and_values_sqlalchemy_would_send(
    engine: Engine, options: dict[str, Any]
) -> None:
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append((statement, parameters))

    for stmt, values in _steps(options):
        direct = driver_statement(stmt, engine.dialect)
        assert direct is not None
        with engine.connect() as conn:
            event.listen(conn, "before_cursor_execute", capture)
            transaction = conn.begin()
            try:
                if values:
                    conn.execute(stmt, values)
                else:
                    conn.execute(stmt)
            finally:
                transaction.rollback()
        statement, parameters = sent.pop()
        assert direct.sql == statement
        assert _normalise(direct.bind(values)) == parameters


def test_the_driver_path_decodes_claimed_jobs_as_sqlalchemy_does(
    engine: Engine, database_url: str
) -> None:
    run_at = dt.datetime(2020, 5, 1, 12, 30, tzinfo=dt.UTC)
    with engine.begin() as conn:
        queue = JobQueue(Job)
        queue.enqueue(
            conn,
            "send",
            {"to": "ana@example.com", "tags": ["a", 1, None], "n": 1.5},
            priority=3,
            run_at=run_at,
            deduplication_key="welcome:ana",
        )
        queue.enqueue(conn, "send", {"n": 2})
    ops = _JobOps(Job, clock=None, backoff=None, dumps=None, max_payload_bytes=1 << 20)
    own_engine = create_engine(database_url)  # no listeners: the driver path runs
    held = HeldConnection(own_engine)
    t = Job.__table__
    try:
        jobs = held.run(ops.claim(ClaimParams(worker_id="w1", batch=5, queues=("default",))))
        with engine.connect() as conn:  # the claimed row, as SQLAlchemy reads it
            row = conn.execute(select(t).where(t.c.id == jobs[0].id)).one()
        done, more = held.run(
            ops.complete_and_claim(
                [(j.id, j.lease_token) for j in jobs],
                ClaimParams(worker_id="w1", batch=5, queues=("default",)),
            )
        )
        assert held._cursor is not None  # psycopg's cursor ran them, not SQLAlchemy
    finally:
        held.release()
        own_engine.dispose()
    assert [j.payload for j in jobs] == [
        {"to": "ana@example.com", "tags": ["a", 1, None], "n": 1.5},
        {"n": 2},
    ]  # claim order: priority first
    first = jobs[0]
    assert (first.queue, first.kind, first.priority, first.run_at) == ("default", "send", 3, run_at)
    assert (first.attempts, first.max_attempts, first.worker_id) == (1, row.max_attempts, "w1")
    assert (first.deduplication_key, first.created_at) == ("welcome:ana", row.created_at)
    assert isinstance(first.id, uuid.UUID) and isinstance(first.lease_token, uuid.UUID)
    assert first.lease_token == row.lease_token and first.lease_until == row.lease_until
    assert done == {(j.id, j.lease_token) for j in jobs} and more == []
    assert jobs_by_status(engine) == {"succeeded": 2}


def test_with_engine_listeners_sqlalchemy_runs_the_statements(
    engine: Engine, database_url: str
) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(30)])
    worker_engine = create_engine(database_url)
    claims = []

    @event.listens_for(worker_engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FOR UPDATE SKIP LOCKED" in statement:
            claims.append(statement)

    app = JobApp(Job, handlers={"noop": lambda job: None})
    worker = Worker(app, worker_engine, concurrency=2, batch=10, listen=False)
    try:
        assert worker.drain(timeout=WAIT) == 30
    finally:
        worker.close()
        worker_engine.dispose()
    assert len(claims) >= 4  # 30 jobs, 10 at most per claim, and the claim that found none
    assert jobs_by_status(engine) == {"succeeded": 30}


async def test_the_async_loop_replaces_a_terminated_connection_and_loses_nothing(
    engine: Engine, database_url: str, worker_schema: str
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from sa_outbox import AsyncWorker

    ids = enqueue(engine, [NewJob("noop", {"n": i}) for i in range(120)])
    application = f"sa-outbox-held-async-{os.getpid()}"
    url = make_url(database_url).update_query_dict({"application_name": application})
    worker_engine = create_async_engine(url)
    app = JobApp(worker_app.Job)
    kills = []

    @app.handler("noop")
    async def noop(job: JobContext) -> None:
        if job.payload["n"] in (30, 80) and job.attempts == 1:
            with engine.connect() as conn:  # a blocking call, in a test: fine
                kills.append(
                    len(
                        conn.execute(
                            text(
                                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                                " WHERE application_name = :name"
                            ),
                            {"name": application},
                        ).all()
                    )
                )

    metrics = StopAfter(len(ids))
    worker = AsyncWorker(
        app,
        worker_engine,
        concurrency=2,
        batch=10,
        listen=False,
        reclaim=False,
        vacuum=None,
        metrics=metrics,
        install_signal_handlers=False,
    )
    metrics.stop = worker.stop
    try:
        await asyncio.wait_for(worker.run(), 60)
    finally:
        await worker_engine.dispose()
    assert kills and all(n >= 1 for n in kills)
    assert "write" in metrics.errors
    assert counts(engine) == {"succeeded": len(ids)}
    assert_completed_exactly_once_by_final_token(engine, len(ids))


async def test_the_async_driver_path_claims_and_completes(
    engine: Engine, database_url: str
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from sa_outbox.worker._direct import AsyncHeldConnection

    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "send", {"to": "ana@example.com"}, deduplication_key="k")
    async_engine = create_async_engine(database_url)
    ops = _JobOps(Job, clock=None, backoff=None, dumps=None, max_payload_bytes=1 << 20)
    held = AsyncHeldConnection(async_engine)
    options = ClaimParams(worker_id="w1", batch=5, queues=("default",))
    try:
        jobs = await held.run(ops.claim(options))
        done, more = await held.run(
            ops.complete_and_claim([(j.id, j.lease_token) for j in jobs], options)
        )
        assert held._cursor is not None  # psycopg's cursor ran them, not SQLAlchemy
    finally:
        await held.release()
        await async_engine.dispose()
    assert [(j.kind, j.payload, j.deduplication_key, j.attempts) for j in jobs] == [
        ("send", {"to": "ana@example.com"}, "k", 1)
    ]
    assert done == {(jobs[0].id, jobs[0].lease_token)} and more == []
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_a_worker_the_limits_do_not_touch_completes_and_claims_in_one_statement(
    engine: Engine, database_url: str
) -> None:
    # The app limits "render"; this worker runs "noop" alone, so it writes its completions
    # and its next claim as one statement, which takes no limits.
    with engine.begin() as conn:
        queue = JobQueue(Job)
        queue.enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(60)])
        queue.enqueue_many(conn, [NewJob("render", {}) for _ in range(2)])
    worker_engine = create_engine(database_url)
    metrics = StopAfter(60)
    app = JobApp(Job, handlers={"noop": lambda job: None, "render": lambda job: None})
    app.limit(kind="render", running=1)
    worker = Worker(
        app,
        worker_engine,
        kinds=["noop"],
        concurrency=2,
        batch=10,
        listen=False,
        reclaim=False,
        vacuum=None,
        metrics=metrics,
        install_signal_handlers=False,
    )
    try:
        run_until_done(worker, metrics)
    finally:
        worker_engine.dispose()
    assert metrics.errors == []
    assert jobs_by_status(engine) == {"succeeded": 60, "pending": 2}


def test_a_keeper_chore_that_fails_is_logged_in_one_line(
    engine: Engine, make_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    # SQLAlchemy's errors go on with the statement and its parameters: the log line keeps
    # the first line only (the metrics hook still gets the whole error).
    worker = make_worker(JobApp(Job, handlers={"noop": lambda job: None}))
    with engine.connect() as conn, pytest.raises(ProgrammingError) as raised:
        conn.execute(text("SELECT * FROM no_such_table_here WHERE id = :id"), {"id": 7})
    assert "[SQL:" in str(raised.value)
    caplog.set_level("WARNING", logger="sa_outbox.worker")
    worker._chore_failed("reclaim", raised.value)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reclaim")]
    assert line.startswith("reclaim failed (ProgrammingError: (psycopg.errors.UndefinedTable)")
    assert "\n" not in line and "SELECT" not in line
