"""Bulk enqueue with COPY (`JobQueue.enqueue_copy`, `AsyncJobQueue.enqueue_copy`)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_outbox import (
    AsyncJobQueue,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobQueue,
    NewJob,
    PayloadNotSerializable,
    PayloadTooLarge,
)
from sa_outbox.statements import listen_sql

from .conftest import Job

T = Job.__table__


def rows(engine: Engine) -> list[Any]:
    """Every job, in id order (the order the ids were made in)."""
    with engine.connect() as conn:
        return list(conn.execute(select(T).order_by(T.c.id)).all())


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(T)).scalar_one())


def test_jobs_are_written_in_input_order_with_the_defaults(engine: Engine) -> None:
    queue = JobQueue(Job)
    jobs = [NewJob("resize", {"n": n}) for n in range(2500)]
    with engine.begin() as conn:
        assert queue.enqueue_copy(conn, jobs) == 2500
        before_commit = conn.execute(select(func.now())).scalar_one()
    found = rows(engine)
    assert [r.payload for r in found] == [{"n": n} for n in range(2500)]
    assert {r.id.version for r in found} == {7}
    first = found[0]
    assert (first.queue, first.kind, str(first.status), first.priority) == (
        "default",
        "resize",
        "pending",
        0,
    )
    assert (first.attempts, first.max_attempts, first.deduplication_key) == (0, 8, None)
    # The transaction's now(), as enqueue_many would write it.
    assert first.run_at == first.created_at == first.updated_at == before_commit
    # The claim takes them in the order given.
    with engine.begin() as conn:
        claimed = queue.claim(conn, worker_id="w", batch=5)
    assert [j.payload for j in claimed] == [{"n": n} for n in range(5)]


def test_fields_and_awkward_text_round_trip(engine: Engine) -> None:
    queue = JobQueue(Job)
    payload = {"text": "tab\there\nnew\\line\r", "é": ["ü", 1.5, None, True]}
    jobs = [
        NewJob("a\tkind", payload, queue="q\\1", priority=-5, max_attempts=3),
        NewJob("b", "just a string", queue="emails", priority=2**31 - 1),
        NewJob("c", [1, 2, 3]),
    ]
    with engine.begin() as conn:
        assert queue.enqueue_copy(conn, jobs) == 3
    found = rows(engine)
    assert [(r.kind, r.queue, r.payload, r.priority, r.max_attempts) for r in found] == [
        ("a\tkind", "q\\1", payload, -5, 3),
        ("b", "emails", "just a string", 2**31 - 1, 8),
        ("c", "default", [1, 2, 3], 0, 8),
    ]


def test_run_at_and_delay_follow_the_fake_clock(engine: Engine) -> None:
    clock = FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    queue = JobQueue(Job, clock=clock)
    later = dt.datetime(2030, 6, 1, 12, tzinfo=dt.UTC)
    with engine.begin() as conn:
        queue.enqueue_copy(
            conn,
            [
                NewJob("now", {}),
                NewJob("delayed", {}, delay=90),
                NewJob("at", {}, run_at=later),
                NewJob("zero", {}, delay=dt.timedelta(0)),
            ],
        )
    found = {r.kind: r for r in rows(engine)}
    start = clock.now()
    assert found["now"].run_at == start
    assert found["delayed"].run_at == start + dt.timedelta(seconds=90)
    assert found["at"].run_at == later
    assert found["zero"].run_at == start
    assert {r.created_at for r in found.values()} == {start}
    assert {r.updated_at for r in found.values()} == {start}
    # Only what is due at the fake time is claimed.
    with engine.begin() as conn:
        assert {j.kind for j in queue.claim(conn, worker_id="w", batch=10)} == {"now", "zero"}
    clock.advance(90)
    with engine.begin() as conn:
        assert [j.kind for j in queue.claim(conn, worker_id="w", batch=10)] == ["delayed"]


def test_delay_with_the_database_clock_counts_from_the_transaction_time(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue_copy(conn, [NewJob("later", {}, delay=60), NewJob("now", {})])
        now = conn.execute(select(func.now())).scalar_one()
    found = {r.kind: r for r in rows(engine)}
    assert found["later"].run_at == now + dt.timedelta(seconds=60)
    assert found["now"].run_at == found["now"].created_at == now


def test_rollback_discards_the_rows(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.connect() as conn:
        assert queue.enqueue_copy(conn, [NewJob("a", {}) for _ in range(10)]) == 10
        conn.rollback()
    assert count(engine) == 0
    with pytest.raises(RuntimeError), engine.begin() as conn:
        queue.enqueue_copy(conn, [NewJob("a", {})])
        raise RuntimeError("the unit of work fails after the enqueue")
    assert count(engine) == 0


def test_it_joins_the_transaction_of_a_connection_or_session(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.connect() as conn:  # not begun yet: enqueue_copy begins, like execute()
        queue.enqueue_copy(conn, [NewJob("a", {})])
        assert conn.in_transaction()
        conn.commit()
    with Session(engine) as session:
        queue.enqueue(session, "b", {})
        queue.enqueue_copy(session, [NewJob("c", {}), NewJob("d", {})])
        session.rollback()
    with Session(engine) as session:
        queue.enqueue_copy(session, [NewJob("e", {})])
        session.commit()
    assert sorted(r.kind for r in rows(engine)) == ["a", "e"]


def test_one_notification_per_copy(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.connect() as conn:
        channel = queue.notify_channel(conn)
    assert channel is not None
    raw = engine.raw_connection()
    listener = raw.driver_connection
    raw.detach()
    assert isinstance(listener, psycopg.Connection)
    try:
        listener.autocommit = True
        listener.execute(listen_sql(channel))
        jobs = [NewJob("a", {}, queue="emails" if n % 2 else "default") for n in range(500)]
        with engine.begin() as conn:
            queue.enqueue_copy(conn, jobs)
            queue.enqueue_copy(conn, [NewJob("b", {}, queue="emails")])
        with engine.connect() as conn:  # rolled back: no notification
            queue.enqueue_copy(conn, [NewJob("c", {}, queue="reports")])
            conn.rollback()
        listener.execute("SELECT 1")  # the notifications of the commit are in
        got = [json.loads(n.payload) for n in listener.notifies(timeout=0)]
    finally:
        listener.close()
    assert got == [["default", "emails"], ["emails"]]


@pytest.mark.parametrize(
    ("job", "error", "words"),
    [
        (NewJob("", {}), InvalidArgument, "kind must not be empty"),
        (NewJob("k", {}, queue=""), InvalidArgument, "queue must not be empty"),
        (NewJob(b"k", {}), InvalidArgumentType, "kind must be a str"),  # type: ignore[arg-type]
        (NewJob("k", {}, priority=2**31), InvalidArgument, "priority must be between"),
        (NewJob("k", {}, priority=True), InvalidArgumentType, "priority must be an int"),
        (NewJob("k", {}, max_attempts=0), InvalidArgument, "max_attempts must be between"),
        (NewJob("k", {}, delay=-1), InvalidArgument, "delay must be zero or more"),
        (
            NewJob("k", {}, run_at=dt.datetime(2030, 1, 1)),
            InvalidArgument,
            "run_at must be timezone-aware",
        ),
        (
            NewJob("k", {}, delay=1, run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
            InvalidArgument,
            "give run_at or delay, not both",
        ),
        (NewJob("k", {"x": object()}), PayloadNotSerializable, "not JSON-serialisable"),
        (NewJob("k", float("nan")), PayloadNotSerializable, "not JSON-serialisable"),
        (NewJob("k", "x" * 300), PayloadTooLarge, "over the limit of 256"),
        (NewJob("k", {}, deduplication_key="k:1"), InvalidArgument, "use enqueue_many"),
        ("not a job", InvalidArgumentType, "must be a NewJob, got str"),
    ],
)
def test_bad_input_raises_naming_the_job_before_any_row_is_sent(
    engine: Engine, job: Any, error: type[Exception], words: str
) -> None:
    queue = JobQueue(Job, max_payload_bytes=256)
    jobs = [NewJob("fine", {}), NewJob("fine", {}), job, NewJob("fine", {})]
    with engine.begin() as conn:
        queue.enqueue(conn, "before", {})
    with engine.begin() as conn:
        with pytest.raises(error, match=r"^jobs\[2\]: ") as caught:
            queue.enqueue_copy(conn, jobs)
        # The transaction is still usable: nothing was sent.
        assert conn.execute(select(func.count()).select_from(T)).scalar_one() == 1
    message = str(caught.value)
    if "use enqueue_many" in words:
        assert "deduplication_key 'k:1'" in message and "enqueue_many" in message
    else:
        assert words in message, message
    assert count(engine) == 1


def test_a_circular_payload_is_refused(engine: Engine) -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with engine.begin() as conn, pytest.raises(PayloadNotSerializable, match="Circular"):
        JobQueue(Job).enqueue_copy(conn, [NewJob("k", loop)])
    assert count(engine) == 0


def test_no_jobs_is_an_error(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(InvalidArgument, match="at least one job"):
        JobQueue(Job).enqueue_copy(conn, [])


def test_a_dumps_of_its_own_and_its_size_limit_are_used(engine: Engine) -> None:
    queue = JobQueue(Job, dumps=lambda value: json.dumps({"wrapped": value}, indent=1))
    with engine.begin() as conn:
        queue.enqueue_copy(conn, [NewJob("k", [1, "two"])])
    assert [r.payload for r in rows(engine)] == [{"wrapped": [1, "two"]}]
    small = JobQueue(Job, max_payload_bytes=10)
    with engine.begin() as conn, pytest.raises(PayloadTooLarge, match=r"jobs\[0\]"):
        small.enqueue_copy(conn, [NewJob("k", "ééééé")])  # 12 bytes in UTF-8
    assert count(engine) == 1


def test_a_driver_other_than_psycopg_is_refused_before_any_sql() -> None:
    other = create_engine("sqlite://")
    try:
        with other.connect() as conn, pytest.raises(InvalidArgument, match="psycopg 3"):
            JobQueue(Job).enqueue_copy(conn, [NewJob("k", {})])
    finally:
        other.dispose()


def test_ids_keep_increasing_across_enqueue_paths(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "one", {})
        queue.enqueue_copy(conn, [NewJob("copy", {"n": n}) for n in range(3)])
        queue.enqueue_many(conn, [NewJob("many", {"n": n}) for n in range(2)])
        queue.enqueue_copy(conn, [NewJob("copy2", {})])
    assert [r.kind for r in rows(engine)] == [
        "one",
        "copy",
        "copy",
        "copy",
        "many",
        "many",
        "copy2",
    ]


async def test_async_copy_counts_order_and_rollback(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    queue = AsyncJobQueue(Job)
    async with async_engine.begin() as conn:
        assert await queue.enqueue_copy(conn, [NewJob("a", {"n": n}) for n in range(1200)]) == 1200
    assert [r.payload["n"] for r in rows(engine)] == list(range(1200))
    async with async_engine.connect() as conn:
        await queue.enqueue_copy(conn, [NewJob("gone", {})])
        assert conn.in_transaction()
        await conn.rollback()
    async with AsyncSession(async_engine) as session:
        await queue.enqueue_copy(session, [NewJob("s", {}), NewJob("s", {})])
        await session.commit()
    assert count(engine) == 1202


async def test_async_fake_clock_bad_input_and_dedup(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    clock = FakeClock(dt.datetime(2031, 3, 1, tzinfo=dt.UTC))
    queue = AsyncJobQueue(Job, clock=clock)
    async with async_engine.begin() as conn:
        await queue.enqueue_copy(conn, [NewJob("d", {}, delay=dt.timedelta(minutes=5))])
        with pytest.raises(InvalidArgument, match=r"^jobs\[1\]: .*enqueue_many"):
            await queue.enqueue_copy(
                conn, [NewJob("ok", {}), NewJob("dup", {}, deduplication_key="x")]
            )
    (row,) = rows(engine)
    assert row.run_at == clock.now() + dt.timedelta(minutes=5)
    assert row.created_at == clock.now()


async def test_async_copy_notifies_once(engine: Engine, async_engine: AsyncEngine) -> None:
    queue = AsyncJobQueue(Job)
    async with async_engine.connect() as conn:
        channel = await queue.notify_channel(conn)
    assert channel is not None
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as listener:
        await listener.execute(listen_sql(channel))
        async with async_engine.begin() as conn:
            await queue.enqueue_copy(conn, [NewJob("a", {}, queue="q1") for _ in range(300)])
        await listener.execute("SELECT 1")
        got = [json.loads(n.payload) async for n in listener.notifies(timeout=0)]
    assert got == [["q1"]]
