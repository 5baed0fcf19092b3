"""Pausing and resuming a queue: the claim itself never takes a job of a paused queue.

Real PostgreSQL; workers driven step by step on a `FakeClock`. Every test counts the jobs
by status at the end.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.operations.ops import CreateTableOp
from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import (
    AsyncQueueControl,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobQueue,
    NewJob,
    QueueControl,
    QueuePauseMixin,
    Worker,
)
from sa_outbox.schema import JobMixin
from sa_outbox.statements import claim_jobs, complete_and_claim_jobs

from .conftest import TEST_SCHEMA, Job
from .helpers import autogenerate_in, jobs_by_status, notifications_during

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class ControlBase(DeclarativeBase):
    pass


class PausedQueue(QueuePauseMixin, ControlBase):
    __tablename__ = "paused_queues"
    __table_schema__ = TEST_SCHEMA


@pytest.fixture
def control(engine: Engine) -> Iterator[QueueControl]:
    ControlBase.metadata.create_all(engine)
    yield QueueControl(PausedQueue, jobs=Job)
    ControlBase.metadata.drop_all(engine)


@pytest.fixture
def queue(clock: FakeClock) -> JobQueue:
    return JobQueue(Job, clock=clock)


@pytest.fixture
def worker_options(worker_options: dict[str, Any]) -> dict[str, Any]:
    return {**worker_options, "reclaim": False}


def enqueue(engine: Engine, jobs: JobQueue, kind: str, n: int, **kw: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = jobs.enqueue_many(conn, [NewJob(kind, {"n": i}, **kw) for i in range(n)])
    return [r.id for r in results if r.id is not None]


def pending_by_queue(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT queue, count(*) FROM {TEST_SCHEMA}.jobs"
                " WHERE status = 'pending' GROUP BY queue"
            )
        ).all()
    return {q: n for q, n in rows}


def test_pause_and_resume_report_what_they_changed(engine: Engine, control: QueueControl) -> None:
    with engine.begin() as conn:
        assert control.pause(conn, "emails", paused_by="ana") is True
        assert control.pause(conn, "emails") is False  # paused already: unchanged
        assert control.pause(conn, "not-created-yet") is True  # any name may be paused
    with engine.connect() as conn:
        paused = control.paused(conn)
    assert [(p.queue, p.paused_by) for p in paused] == [
        ("emails", "ana"),
        ("not-created-yet", None),
    ]
    with engine.begin() as conn:
        assert control.resume(conn, "emails") is True
        assert control.resume(conn, "emails") is False
        assert control.resume(conn, "never-paused") is False
    with engine.connect() as conn:
        assert [p.queue for p in control.paused(conn)] == ["not-created-yet"]


def test_bad_input_is_refused_naming_it(engine: Engine, control: QueueControl) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match="queue must not be empty"):
            control.pause(conn, "")
        with pytest.raises(InvalidArgumentType, match="queue must be a str"):
            control.resume(conn, 7)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentType, match="paused_by must be a str"):
            control.pause(conn, "emails", paused_by=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="expected a Table or a mapped class"):
        QueueControl(object(), jobs=Job)
    app = JobApp(Job)
    app.handler("a")(lambda payload: None)
    with pytest.raises(InvalidArgumentType, match="expected a Table or a mapped class"):
        Worker(app, engine, pauses="paused_queues", install_signal_handlers=False)
    with engine.connect() as conn:
        assert control.paused(conn) == []


def test_a_worker_never_claims_a_paused_queue_and_takes_it_up_on_resume(
    engine: Engine,
    control: QueueControl,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
) -> None:
    ran: list[str] = []
    app = JobApp(Job)
    app.handler("a")(lambda payload: ran.append("a"))
    enqueue(engine, queue, "a", 3, queue="emails")
    enqueue(engine, queue, "a", 2, queue="default")
    # Started before the pause and never told of it: the claim's SQL is what holds.
    worker = make_worker(app, pauses=PausedQueue, batch=10)
    with engine.begin() as conn:
        control.pause(conn, "emails")
    assert worker.drain() >= 2
    assert pending_by_queue(engine) == {"emails": 3}
    assert jobs_by_status(engine) == {"pending": 3, "succeeded": 2}
    enqueue(engine, queue, "a", 1, queue="emails", priority=5)  # higher priority: still waits
    assert worker.claim() == 0
    with engine.begin() as conn:
        control.resume(conn, "emails")
    worker.drain()
    assert ran == ["a"] * 6
    assert jobs_by_status(engine) == {"succeeded": 6}


def test_a_worker_without_pauses_ignores_the_table(
    engine: Engine,
    control: QueueControl,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
) -> None:
    app = JobApp(Job)
    app.handler("a")(lambda payload: None)
    enqueue(engine, queue, "a", 2, queue="emails")
    with engine.begin() as conn:
        control.pause(conn, "emails")
    make_worker(app).drain()
    assert jobs_by_status(engine) == {"succeeded": 2}


SHAPES: dict[str, dict[str, Any]] = {
    "nothing named": {},
    "one queue": {"queues": "emails"},
    "several queues": {"queues": ["emails", "default", "reports"]},
    "one kind": {"kinds": "a"},
    "several kinds": {"kinds": ["a", "b"]},
    "queues and kinds": {"queues": ["emails", "default"], "kinds": ["a", "b"]},
    "many queues (IN)": {"queues": ["emails", "default", *(f"q{i}" for i in range(70))]},
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_claim_shape_skips_the_paused_queues(
    engine: Engine, control: QueueControl, queue: JobQueue, clock: FakeClock, shape: str
) -> None:
    for name in ("emails", "default"):
        for kind in ("a", "b"):
            enqueue(engine, queue, kind, 3, queue=name, priority=1 if name == "emails" else 0)
    with engine.begin() as conn:
        control.pause(conn, "emails")
        claimed = conn.execute(
            claim_jobs(
                Job, worker_id="w", batch=20, paused=PausedQueue, clock=clock, **SHAPES[shape]
            )
        ).all()
    named = SHAPES[shape]
    queues = [named["queues"]] if isinstance(named.get("queues"), str) else named.get("queues")
    kinds = [named["kinds"]] if isinstance(named.get("kinds"), str) else named.get("kinds")
    expected = 0 if queues is not None and "default" not in queues else 3 * len(kinds or "ab")
    assert len(claimed) == expected
    assert {row.queue for row in claimed} <= {"default"}
    assert pending_by_queue(engine)["emails"] == 6  # none of the paused queue's jobs moved
    assert jobs_by_status(engine) == {
        "pending": 12 - expected,
        **({"running": expected} if expected else {}),
    }


def test_the_combined_complete_and_claim_skips_them_too(
    engine: Engine, control: QueueControl, queue: JobQueue, clock: FakeClock
) -> None:
    enqueue(engine, queue, "a", 2, queue="emails")
    with engine.begin() as conn:
        control.pause(conn, "emails")
        pairs = [(uuid.uuid4(), uuid.uuid4())]
        stmt = complete_and_claim_jobs(
            Job, pairs, worker_id="w", batch=10, kinds=["a"], paused=PausedQueue, clock=clock
        )
        assert conn.execute(stmt).all() == []
    assert jobs_by_status(engine) == {"pending": 2}


def test_resume_wakes_the_workers_of_the_queue(engine: Engine, control: QueueControl) -> None:
    def pause() -> bool:
        with engine.begin() as conn:
            return control.pause(conn, "emails")

    def resume() -> bool:
        with engine.begin() as conn:
            return control.resume(conn, "emails")

    assert notifications_during(engine, Job, pause) == (True, [])
    assert notifications_during(engine, Job, resume) == (True, ['["emails"]'])
    assert notifications_during(engine, Job, resume) == (False, [])  # nothing was paused
    assert jobs_by_status(engine) == {}


async def test_async_control(
    engine: Engine, async_engine: AsyncEngine, control: QueueControl, queue: JobQueue
) -> None:
    controls = AsyncQueueControl(PausedQueue, jobs=Job)
    enqueue(engine, queue, "a", 1, queue="emails")
    async with async_engine.begin() as conn:
        assert await controls.pause(conn, "emails") is True
    async with async_engine.connect() as conn:
        assert [p.queue for p in await controls.paused(conn)] == ["emails"]
    async with async_engine.begin() as conn:
        assert await controls.resume(conn, "emails") is True
        assert await controls.paused(conn) == []
    assert jobs_by_status(engine) == {"pending": 1}


def test_autogenerate_adds_the_table_to_an_existing_install(database_url: str) -> None:
    """An install made before pausing existed: its jobs table and nothing else. Autogenerate
    finds only the new table, creates it, then finds nothing; pausing works on it."""
    schema = f"pause_upgrade_{uuid.uuid4().hex[:8]}"

    class Old(DeclarativeBase):
        pass

    class OldJob(JobMixin, Old):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class New(DeclarativeBase):
        metadata = MetaData()

    class NewJobs(JobMixin, New):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class NewPaused(QueuePauseMixin, New):
        __tablename__ = "paused_queues"
        __table_schema__ = schema

    def changes(connection: Any) -> Any:
        return autogenerate_in(connection, New.metadata, schema)

    pg = create_engine(database_url)
    try:
        with pg.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        Old.metadata.create_all(pg)
        with pg.begin() as conn:
            found = changes(conn).ops
            assert [type(op) for op in found] == [CreateTableOp], found
            assert found[0].table_name == "paused_queues"
            operations = Operations(MigrationContext.configure(conn))
            for op in found:
                operations.invoke(op)
        with pg.begin() as conn:
            assert changes(conn).is_empty()
            controls = QueueControl(NewPaused, jobs=NewJobs)
            assert controls.pause(conn, "emails") is True
            JobQueue(NewJobs).enqueue(conn, "a", {}, queue="emails")
            assert (
                conn.execute(claim_jobs(NewJobs, worker_id="w", batch=5, paused=NewPaused)).all()
                == []
            )
            controls.resume(conn, "emails")
            assert (
                len(conn.execute(claim_jobs(NewJobs, worker_id="w", paused=NewPaused)).all()) == 1
            )
    finally:
        with pg.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pg.dispose()
