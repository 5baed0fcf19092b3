"""Errors by what they mean (issue 18, item 3; issue 17's fast fail on a bad URL).

A worker retries what may pass (the connection, a restart, a deadlock), fails the one job
whose values the database or the library refused, and stops at start-up, in one line, when
its URL names a database it cannot use. Real PostgreSQL errors throughout; each test counts
the jobs at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from sa_outbox import (
    AsyncWorker,
    DatabaseUnreachable,
    FakeClock,
    InvalidArgument,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    Worker,
)
from sa_outbox._sqlstate import is_bad_data, is_configuration_error, is_transient, sqlstate_of
from sa_outbox.worker import ALL_KINDS

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
WAIT = 10.0
TABLE = Job.__table__.fullname


def enqueue(engine: Engine, kind: str, n: int, clock: FakeClock) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = JobQueue(Job, clock=clock).enqueue_many(
            conn, [NewJob(kind, {"n": i}) for i in range(n)]
        )
    return [r.id for r in results if r.id is not None]


def _error(engine: Engine, sql: str) -> DBAPIError:
    with engine.connect() as conn, pytest.raises(DBAPIError) as raised:
        conn.execute(text(sql))
    return raised.value


# -- what an error means -----------------------------------------------------------------


def test_errors_are_classified_by_sqlstate(engine, database_url):
    division = _error(engine, "SELECT 1 / 0")
    assert (sqlstate_of(division), is_bad_data(division), is_transient(division)) == (
        "22012",
        True,
        False,
    )
    too_long = _error(
        engine,
        f"INSERT INTO {TABLE} (id, kind, queue, payload, deduplication_key) "
        "SELECT gen_random_uuid(), 'k', 'default', '{}', string_agg(md5(random()::text), '') "
        "FROM generate_series(1, 200)",
    )
    assert sqlstate_of(too_long) == "54000" and is_bad_data(too_long)
    assert not is_transient(too_long)
    missing = _error(engine, "SELECT * FROM no_such_table_anywhere")
    assert not is_transient(missing) and not is_bad_data(missing)
    for retryable in (
        psycopg.errors.DeadlockDetected(),
        psycopg.errors.SerializationFailure(),
        psycopg.errors.AdminShutdown(),
        psycopg.errors.CannotConnectNow(),
        psycopg.errors.LockNotAvailable(),
        psycopg.errors.QueryCanceled(),
    ):
        assert is_transient(retryable), type(retryable).__name__

    url = make_url(database_url)
    no_database = create_engine(url.set(database="sa_outbox_no_such_database"))
    with pytest.raises(OperationalError) as raised:
        no_database.connect()
    no_database.dispose()
    assert is_configuration_error(raised.value) and not is_transient(raised.value)
    refused = create_engine(url.set(port=1))
    with pytest.raises(OperationalError) as raised:
        refused.connect()
    refused.dispose()
    assert is_transient(raised.value) and not is_configuration_error(raised.value)


# -- one job's bad values fail that job, not the worker ----------------------------------


def test_a_follow_up_the_database_refuses_fails_only_the_job_that_made_it(
    engine, clock, make_worker
):
    # A constraint of the user's own refuses one follow-up at commit: before, the whole
    # batch's write failed and run() stopped; now that one job fails, with the reason.
    with engine.begin() as conn:
        conn.execute(
            text(f"ALTER TABLE {TABLE} ADD CONSTRAINT small_priority CHECK (priority < 100)")
        )
    try:
        app = JobApp(Job)

        @app.handler("parent")
        def parent(job: JobContext) -> None:
            job.enqueue(
                "child", {"of": job.payload["n"]}, priority=500 if job.payload["n"] == 3 else 1
            )

        @app.handler("child")
        def child(job: JobContext) -> None:
            pass

        ids = enqueue(engine, "parent", 6, clock)
        worker = make_worker(app, kinds=["parent"], batch=6, concurrency=1)
        assert worker.drain(timeout=WAIT) == 6
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {TABLE} DROP CONSTRAINT small_priority"))
    culprit = job_row(engine, ids[3])
    assert (culprit.status, culprit.attempts) == ("failed", 1)
    assert "small_priority" in culprit.last_error
    assert jobs_by_status(engine) == {"succeeded": 5, "failed": 1, "pending": 5}


def test_input_the_library_refuses_in_a_handler_fails_the_job_at_once(engine, clock, make_worker):
    app = JobApp(Job)

    @app.handler("parent")
    def parent(job: JobContext) -> None:
        job.enqueue("child", {"ratio": float("nan")})  # not JSON: refused before any SQL

    [job_id] = enqueue(engine, "parent", 1, clock)
    make_worker(app).drain(timeout=WAIT)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("failed", 1)  # not retried: it would fail again
    assert row.last_error.startswith("sa_outbox._exceptions.PayloadNotSerializable")
    assert jobs_by_status(engine) == {"failed": 1}


def test_an_exception_message_postgresql_cannot_store_is_written_escaped(
    engine, clock, make_worker
):
    app = JobApp(Job)

    @app.handler("odd")
    def odd(job: JobContext) -> None:
        raise ValueError("bad byte \x00 and a lone \ud800 surrogate")

    [job_id] = enqueue(engine, "odd", 1, clock)
    make_worker(app).drain(timeout=WAIT)
    row = job_row(engine, job_id)
    assert row.status == "pending" and row.attempts == 1  # retried, as any exception
    assert row.last_error.startswith("ValueError: bad byte \\x00 and a lone \\ud800 surrogate")
    assert jobs_by_status(engine) == {"pending": 1}


# -- a wrong URL fails at start-up, in one line -----------------------------------------


def _noop_app() -> JobApp:
    return JobApp(Job, handlers={"noop": lambda job: None})


def test_a_worker_whose_database_does_not_exist_stops_at_once(engine, database_url, clock):
    [job_id] = enqueue(engine, "noop", 1, clock)
    wrong = create_engine(
        make_url(database_url).set(database="sa_outbox_no_such_database", password="s3cret")
    )
    worker = Worker(_noop_app(), wrong, startup_timeout=600, install_signal_handlers=False)
    try:
        with pytest.raises(DatabaseUnreachable) as raised:
            worker.run()  # a configuration error is not retried: no 600 s wait
    finally:
        wrong.dispose()
    message = str(raised.value)
    assert "\n" not in message and "s3cret" not in message
    assert 'database "sa_outbox_no_such_database" does not exist' in message
    assert message.startswith("Worker cannot use postgresql+psycopg://")
    assert job_row(engine, job_id).status == "pending"


def test_a_worker_that_cannot_reach_its_server_gives_up_after_startup_timeout(
    engine, database_url, clock
):
    [job_id] = enqueue(engine, "noop", 1, clock)
    nowhere = create_engine(make_url(database_url).set(port=1))
    worker = Worker(_noop_app(), nowhere, startup_timeout=0.3, install_signal_handlers=False)
    try:
        with pytest.raises(DatabaseUnreachable, match=r"within 0.3 s \(startup_timeout\)"):
            worker.run()
    finally:
        nowhere.dispose()
    assert job_row(engine, job_id).status == "pending"


def test_an_async_worker_whose_database_does_not_exist_stops_at_once(database_url):
    url = make_url(database_url).set(database="sa_outbox_no_such_database")

    async def run() -> None:
        wrong = create_async_engine(url)
        try:
            await AsyncWorker(_noop_app(), wrong, install_signal_handlers=False).run()
        finally:
            await wrong.dispose()

    with pytest.raises(DatabaseUnreachable, match="does not exist"):
        asyncio.run(run())


def test_a_worker_claims_the_kinds_it_handles_unless_told_every_kind(engine):
    app = JobApp(Job, handlers={"b": lambda job: None, "a": lambda job: None})
    assert Worker(app, engine).settings.kinds == ("a", "b")
    assert Worker(app, engine, kinds="a").settings.kinds == ("a",)
    assert Worker(app, engine, kinds=ALL_KINDS).settings.kinds is None
    assert Worker(app, engine, kinds=["*"]).settings.kinds is None  # the CLI's --kinds '*'
    with pytest.raises(InvalidArgument, match="the JobApp has no handlers"):
        Worker(JobApp(Job), engine)


def test_a_worker_that_fails_gives_back_the_jobs_it_holds(engine, clock):
    # A trigger of the user's refuses one completion with an error no worker can ride out
    # (raise_exception, P0001): run() fails. The jobs it had claimed, running or waiting for
    # a handler, go back to pending with no attempt counted, instead of waiting out their
    # lease and losing an attempt each (issue 18, item 7).
    schema = Job.__table__.schema
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE FUNCTION {schema}.refuse() RETURNS trigger "
                "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER refuse BEFORE UPDATE ON {TABLE} FOR EACH ROW "
                "WHEN (NEW.status = 'succeeded' AND NEW.kind = 'boom') "
                f"EXECUTE FUNCTION {schema}.refuse()"
            )
        )
    app = JobApp(Job)
    app.register("boom", lambda job: None)
    app.register("wait", lambda job: job.cancel.wait(WAIT))
    with engine.begin() as conn:
        JobQueue(Job, clock=clock).enqueue_many(
            conn, [NewJob("boom", {})] + [NewJob("wait", {"n": i}) for i in range(5)]
        )
    worker = Worker(
        app,
        engine,
        concurrency=2,
        batch=6,
        prefetch=4,
        listen=False,
        reclaim=False,
        vacuum=None,
        clock=clock,
        install_signal_handlers=False,
    )
    try:
        with pytest.raises(Exception, match="refused by a trigger"):
            worker.run()
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER refuse ON {TABLE}"))
            conn.execute(text(f"DROP FUNCTION {schema}.refuse()"))
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT kind, status, attempts FROM {TABLE}")).all()
    assert sorted(tuple(row) for row in rows) == [
        ("boom", "running", 1),  # its completion never committed: its lease will expire
        *[("wait", "pending", 0)] * 5,  # running or claimed ahead: given back, no attempt
    ]
