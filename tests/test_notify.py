"""The job table's NOTIFY trigger: created by ``create_all`` and by ``op.create_job_queue``,
removed (with its function) by ``drop_all`` and ``op.drop_job_queue``; its channel."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, MetaData, Table, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase

import alembic_ext  # noqa: F401  (registers op.create_job_queue)
from sa_outbox import JobMixin, JobQueue, NewJob
from sa_outbox.schema._notify_trigger import job_notify_channel
from sa_outbox.statements import listen_sql, parse_notify_payload

from .helpers import notifications_during

WAIT = 10.0


@pytest.fixture
def schema(engine: Engine) -> Iterator[str]:
    name = f"notify_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {name}"))
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))


def trigger_objects(engine: Engine, schema: str) -> tuple[list[str], list[str]]:
    with engine.connect() as conn:
        triggers = conn.execute(
            text(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = :schema AND NOT t.tgisinternal ORDER BY 1"
            ),
            {"schema": schema},
        ).scalars()
        functions = conn.execute(
            text(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = :schema ORDER BY 1"
            ),
            {"schema": schema},
        ).scalars()
        return list(triggers), list(functions)


def notifications(engine: Engine, model: Any, enqueue: Any) -> list[Any]:
    """Run ``enqueue(conn)`` and return the payloads the table's channel received."""

    def committed() -> None:
        with engine.begin() as conn:
            enqueue(conn)

    _, payloads = notifications_during(engine, model, committed)
    return [json.loads(p) for p in payloads]


def test_create_all_creates_the_trigger_and_drop_all_its_function(
    engine: Engine, schema: str
) -> None:
    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "background_jobs"
        __table_schema__ = schema

    Base.metadata.create_all(engine)
    # The NOTIFY trigger, and the serial keys' trigger beside it (docs/concurrency.md).
    both = ["background_jobs_notify", "background_jobs_serial"]
    assert trigger_objects(engine, schema) == (both, both)
    queue = JobQueue(Job)
    got = notifications(
        engine,
        Job,
        lambda conn: queue.enqueue_many(conn, [NewJob("k", {}, queue="q") for _ in range(20)]),
    )
    assert got == [["q"]]
    Base.metadata.drop_all(engine)
    assert trigger_objects(engine, schema) == ([], [])


def test_alembic_operations_create_and_drop_the_trigger(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        Operations(MigrationContext.configure(conn)).create_job_queue("jobs", schema=schema)
    both = ["jobs_notify", "jobs_serial"]
    assert trigger_objects(engine, schema) == (both, both)

    metadata = MetaData()
    jobs = Table("jobs", metadata, autoload_with=engine, schema=schema)
    got = notifications(
        engine,
        jobs,
        lambda conn: conn.execute(
            text(f"INSERT INTO {schema}.jobs (kind, payload, queue) VALUES ('k', '{{}}', 'mail')")
        ),
    )
    assert got == [["mail"]]

    with engine.begin() as conn:
        Operations(MigrationContext.configure(conn)).drop_job_queue("jobs", schema=schema)
    assert trigger_objects(engine, schema) == ([], [])


def test_a_table_without_a_schema_notifies_on_the_schema_it_lives_in(
    engine: Engine, schema: str, database_url: str
) -> None:
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    on_path = create_engine(url)

    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "jobs"

    try:
        Base.metadata.create_all(on_path)
        with on_path.connect() as conn:
            assert JobQueue(Job).notify_channel(conn) == f"{schema}.jobs"
        got = notifications(on_path, Job, lambda conn: JobQueue(Job).enqueue(conn, "k", {}))
        assert got == [["default"]]
    finally:
        on_path.dispose()


def test_a_channel_name_too_long_for_postgresql_is_hashed_the_same_in_sql_and_python(
    engine: Engine,
) -> None:
    schema = "s" * 40 + uuid.uuid4().hex[:8]
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))

    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "jobs_of_a_long_name"
        __table_schema__ = schema

    try:
        Base.metadata.create_all(engine)
        with engine.connect() as conn:
            channel = JobQueue(Job).notify_channel(conn)
        assert channel == job_notify_channel(schema, "jobs_of_a_long_name")
        assert channel is not None and channel.startswith("sa_outbox_") and len(channel) == 42
        got = notifications(engine, Job, lambda conn: JobQueue(Job).enqueue(conn, "k", {}))
        assert got == [["default"]]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def test_notification_payloads() -> None:
    assert parse_notify_payload('["a","b"]') == frozenset({"a", "b"})
    assert parse_notify_payload("") is None
    assert parse_notify_payload("not json") is None
    assert parse_notify_payload('{"a": 1}') is None
    assert listen_sql('we"ird') == 'LISTEN "we""ird"'
