"""Bulk enqueue with COPY (`JobQueue.enqueue_copy`, `AsyncJobQueue.enqueue_copy`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import json
import pickle
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, delete, func, select
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
    _ids,
)
from sa_outbox._ids import uuid7, uuid7_hex
from sa_outbox._json import compact_json, fast_compact_json
from sa_outbox.queue import EnqueueResult
from sa_outbox.queue._copy import _COLUMNS, _append_checked, plan_copy
from sa_outbox.statements import listen_sql

from .conftest import Job
from .helpers import notifications_during

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

    def copy() -> None:
        jobs = [NewJob("a", {}, queue="emails" if n % 2 else "default") for n in range(500)]
        with engine.begin() as conn:
            queue.enqueue_copy(conn, jobs)
            queue.enqueue_copy(conn, [NewJob("b", {}, queue="emails")])
        with engine.connect() as conn:  # rolled back: no notification
            queue.enqueue_copy(conn, [NewJob("c", {}, queue="reports")])
            conn.rollback()

    _, payloads = notifications_during(engine, Job, copy)
    got = [json.loads(p) for p in payloads]
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


# -- the usual job's shortcut (identity checks, C encoder) ----------------------------------

AWKWARD_PAYLOADS: list[Any] = [
    {},
    {"text": 'quote " back\\slash \\" tab\t nl\n cr\r bell\x07', "é": "ü€😀"},
    ["\\", "\\\\", "\\t", "\\N"],
    "a plain string",
    None,
    1.5,
    [{"deep": [{"er": [None, True, False]}]}],
]


@pytest.mark.parametrize("dumps", [fast_compact_json, compact_json, lambda v: json.dumps(v)])
def test_the_usual_path_writes_what_the_checked_path_writes(dumps: Any) -> None:
    jobs = [
        NewJob(kind, payload, queue=queue, priority=priority, max_attempts=attempts)
        for kind, queue, priority, attempts in [
            ("a", "default", 0, 8),
            ("a", "default", 0, 8),
            ("b", "other", -3, 1),
            ("a", "default", 2**31 - 1, 2**31 - 1),
        ]
        for payload in AWKWARD_PAYLOADS
    ]
    ids = [f"{n:032x}" for n in range(len(jobs))]
    plan = plan_copy(
        jobs, clock=None, dumps=dumps, max_payload_bytes=1 << 20, quote_table="t", ids=ids
    )
    expected: list[str] = []
    for job_id, job in zip(ids, jobs, strict=True):
        _append_checked(job, job_id, dumps, 1 << 20, expected, None)
    assert plan.lines == expected
    assert plan.data(None) == ("\n".join(expected) + "\n").encode()
    assert not plan.needs_now and plan.sql == f"COPY t ({_COLUMNS}) FROM STDIN"


def test_payloads_round_trip_through_the_usual_path(engine: Engine) -> None:
    queue = JobQueue(Job)
    jobs = [NewJob("k", payload) for payload in AWKWARD_PAYLOADS]
    with engine.begin() as conn:
        assert queue.enqueue_copy(conn, jobs) == len(jobs)
    assert [r.payload for r in rows(engine)] == AWKWARD_PAYLOADS


class Kind(str):
    pass


class Priority(enum.IntEnum):
    HIGH = 5


@dataclasses.dataclass(frozen=True, slots=True)
class TaggedJob(NewJob):
    tag: str = ""


def test_each_new_field_object_is_checked_and_unusual_ones_take_the_checked_path(
    engine: Engine,
) -> None:
    queue = JobQueue(Job)
    jobs = [
        NewJob("a", {"n": 0}),
        NewJob("a", {"n": 1}, queue="q2"),  # a new queue: checked, then the shortcut again
        NewJob(Kind("a"), {"n": 2}),  # a str subclass
        NewJob("a", {"n": 3}, priority=Priority.HIGH),  # an int subclass
        TaggedJob("a", {"n": 4}, tag="x"),  # a NewJob subclass
        NewJob("a", {"n": 5}, delay=0),  # a time of its own, between usual jobs
        NewJob("a", {"n": 6}),
    ]
    with engine.begin() as conn:
        assert queue.enqueue_copy(conn, jobs) == 7
    found = rows(engine)
    assert [(r.payload["n"], r.kind, r.queue, r.priority) for r in found] == [
        (0, "a", "default", 0),
        (1, "a", "q2", 0),
        (2, "a", "default", 0),
        (3, "a", "default", 5),
        (4, "a", "default", 0),
        (5, "a", "default", 0),
        (6, "a", "default", 0),
    ]
    assert len({r.run_at for r in found}) == 1  # delay=0 runs at the same "now" as the others


@pytest.mark.parametrize(
    ("before", "job", "error", "words"),
    [
        # Equal to the field of the job before, but not the same object: checked anew.
        (
            NewJob("k", {}, priority=1),
            NewJob("k", {}, priority=True),
            InvalidArgumentType,
            "priority must be an int",
        ),
        (
            NewJob("k", {}, max_attempts=1),
            NewJob("k", {}, max_attempts=1.0),  # type: ignore[arg-type]
            InvalidArgumentType,
            "max_attempts must be an int",
        ),
        (NewJob("k", {}), NewJob("k", {}, queue=""), InvalidArgument, "queue must not be empty"),
        (NewJob("k", {}), NewJob("k", {}, deduplication_key="d"), InvalidArgument, "enqueue_many"),
        (NewJob("k", {}), NewJob("k", {}, delay=-1), InvalidArgument, "delay must be zero or more"),
        (
            NewJob("k", {}),
            NewJob("k", {"x": {1, 2}}),
            PayloadNotSerializable,
            "not JSON-serialisable",
        ),
    ],
)
def test_the_shortcut_never_lets_a_bad_job_through(
    engine: Engine, before: NewJob, job: NewJob, error: type[Exception], words: str
) -> None:
    jobs = [before, before, job, before]
    with engine.begin() as conn:
        with pytest.raises(error, match=r"^jobs\[2\]: ") as caught:
            JobQueue(Job).enqueue_copy(conn, jobs)
        assert conn.execute(select(func.count()).select_from(T)).scalar_one() == 0
    assert words in str(caught.value)
    assert count(engine) == 0


@pytest.mark.parametrize(
    ("job", "error", "field"),
    [
        (
            NewJob("k", {"text": "lone \ud800 surrogate"}),
            PayloadNotSerializable,
            r"payload of job kind 'k' at \$\.text:",
        ),
        (  # the checked path
            NewJob("k", "\udc00" * 100, delay=5),
            PayloadNotSerializable,
            r"payload of job kind 'k' at \$:",
        ),
        (NewJob("k\ud800", {}), InvalidArgument, r"kind 'k\\ud800'"),
        (NewJob("k", {}, queue="q\ud800"), InvalidArgument, r"queue 'q\\ud800'"),
    ],
)
def test_text_utf8_cannot_encode_is_refused_before_any_row_is_sent(
    engine: Engine, job: NewJob, error: type[Exception], field: str
) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        with pytest.raises(error, match=rf"^jobs\[2\]: {field} is not valid UTF-8 text"):
            queue.enqueue_copy(conn, [NewJob("fine", {}), NewJob("fine", {}), job])
        assert conn.execute(select(func.count()).select_from(T)).scalar_one() == 0
        queue.enqueue_copy(conn, [NewJob("after", {})])  # the transaction is still usable
    assert [r.kind for r in rows(engine)] == ["after"]


def test_a_fake_clock_stamps_usual_jobs_with_its_time(engine: Engine) -> None:
    clock = FakeClock(dt.datetime(2032, 2, 2, tzinfo=dt.UTC))
    with engine.begin() as conn:
        assert JobQueue(Job, clock=clock).enqueue_copy(conn, [NewJob("a", {}) for _ in range(3)])
    found = rows(engine)
    assert len(found) == 3
    assert {(r.run_at, r.created_at, r.updated_at) for r in found} == {(clock.now(),) * 3}


def test_uuid7_hex_ids_keep_order_version_and_variant_across_milliseconds() -> None:
    first = uuid7()
    # Three slots before the end of a millisecond (one a minute ahead, so the clock cannot
    # reach it first): the block carries into the next millisecond.
    ms = (first.int >> 80) + 60_000
    with _ids._lock:
        _ids._last_ms, _ids._counter = ms, (1 << 12) - 4
    block = uuid7_hex(10)
    after = uuid7()
    assert all(len(h) == 32 for h in block)
    values = [uuid.UUID(h) for h in block]
    assert [first, *values, after] == sorted([first, *values, after])
    assert len(set(values)) == 10
    assert {(v.version, v.variant) for v in values} == {(7, uuid.RFC_4122)}
    assert [v.int >> 80 for v in values] == [ms] * 3 + [ms + 1] * 7
    assert [(v.int >> 64) & 0xFFF for v in values[2:5]] == [(1 << 12) - 1, 0, 1]
    assert uuid7_hex(0) == []


def test_new_job_stays_a_frozen_dataclass_with_the_same_constructor() -> None:
    job = NewJob("k", {"a": 1}, "q", 2, None, 1.5, 3, "d")
    assert job == NewJob(
        kind="k",
        payload={"a": 1},
        queue="q",
        priority=2,
        delay=1.5,
        max_attempts=3,
        deduplication_key="d",
    )
    assert (NewJob("k", None).queue, NewJob("k", None).max_attempts) == ("default", 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.kind = "other"  # type: ignore[misc]
    assert dataclasses.replace(job, kind="x").kind == "x"
    assert pickle.loads(pickle.dumps(job)) == job
    assert [f.name for f in dataclasses.fields(NewJob)] == list(
        inspect.signature(NewJob).parameters
    )
    assert not hasattr(job, "__dict__")
    with pytest.raises(TypeError):
        NewJob("k")  # type: ignore[call-arg]


# -- enqueue_many: the jobs as one JSON document (jsonb_to_recordset) ----------------------

COMPARED = (
    "queue",
    "kind",
    "payload",
    "status",
    "priority",
    "run_at",
    "attempts",
    "max_attempts",
    "deduplication_key",
    "created_at",
    "updated_at",
)
AWKWARD_NAMES = ['quote " and \\ backslash', "tab\there\nnewline", "é ü € 😀", "{}[]:,"]


@pytest.mark.parametrize("dumps", [None, lambda v: json.dumps(v, indent=2, sort_keys=True)])
def test_enqueue_many_writes_what_enqueue_writes(engine: Engine, dumps: Any) -> None:
    """Field by field, a batch lands as the same jobs enqueued one at a time would."""
    clock = FakeClock(dt.datetime(2033, 3, 3, 12, tzinfo=dt.UTC))
    queue = JobQueue(Job, clock=clock, dumps=dumps)
    east = dt.timezone(dt.timedelta(hours=5, minutes=30))
    jobs = [
        NewJob("plain", {}),
        NewJob("plain", {}),
        *(
            NewJob(name, {name: [name]}, queue=name, deduplication_key=name)
            for name in AWKWARD_NAMES
        ),
        *(NewJob("p", payload) for payload in AWKWARD_PAYLOADS),
        NewJob("d", {}, delay=dt.timedelta(days=3, seconds=5, microseconds=7)),
        NewJob("d", {}, delay=0.25),
        NewJob("r", {}, run_at=dt.datetime(2034, 1, 2, 3, 4, 5, 678901, tzinfo=east)),
        NewJob(Kind("sub"), {}, priority=Priority.HIGH, max_attempts=2**31 - 1),
        TaggedJob("tagged", {}, priority=-(2**31 - 1), max_attempts=1),
    ]

    def fields(ids: list[uuid.UUID | None]) -> list[tuple[Any, ...]]:
        by_id = {r.id: r for r in rows(engine)}
        return [tuple(getattr(r, name) for name in COMPARED) for r in (by_id[i] for i in ids)]

    with engine.begin() as conn:
        results = queue.enqueue_many(conn, jobs)
    assert all(r.inserted for r in results)
    many = fields([r.id for r in results])
    with engine.begin() as conn:
        conn.execute(delete(Job))
    with engine.begin() as conn:
        one_by_one = [
            queue.enqueue(
                conn,
                job.kind,
                job.payload,
                queue=job.queue,
                priority=job.priority,
                run_at=job.run_at,
                delay=job.delay,
                max_attempts=job.max_attempts,
                deduplication_key=job.deduplication_key,
            )
            for job in jobs
        ]
    assert many == fields([r.id for r in one_by_one])
    assert many[-5][5] == clock.now() + dt.timedelta(days=3, seconds=5, microseconds=7)
    assert [row[2] for row in many[6 : 6 + len(AWKWARD_PAYLOADS)]] == AWKWARD_PAYLOADS


def test_enqueue_many_dedup_and_results_are_unchanged(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "k", {}, deduplication_key="taken")
        results = queue.enqueue_many(
            conn,
            [
                NewJob("k", {"n": 0}),
                NewJob("k", {"n": 1}, deduplication_key="taken"),
                NewJob("k", {"n": 2}, deduplication_key="new"),
                NewJob("k", {"n": 3}, deduplication_key="new"),  # an earlier one of the batch
                NewJob("other", {"n": 4}, deduplication_key="taken"),  # another kind
                NewJob("k", {"n": 5}),
            ],
        )
    assert [r.inserted for r in results] == [True, False, True, False, True, True]
    assert [r.id is None for r in results] == [False, True, False, True, False, False]
    assert results[1] == EnqueueResult(id=None, inserted=False)
    by_id = {r.id: r for r in rows(engine)}
    assert [by_id[r.id].payload["n"] for r in results if r.id is not None] == [0, 2, 4, 5]
    ids = [r.id for r in results if r.id is not None]
    assert ids == sorted(ids)  # UUIDv7 in input order


def test_enqueue_many_bad_input_still_raises_before_any_sql(engine: Engine) -> None:
    queue = JobQueue(Job, max_payload_bytes=64)
    with engine.begin() as conn:
        for jobs, error, words in [
            ([NewJob("k", {}), NewJob("k", {}, priority=True)], InvalidArgumentType, "priority"),
            ([NewJob("k", {}), NewJob("k", "x" * 65)], PayloadTooLarge, "over the limit of 64"),
            ([NewJob("k", {}), NewJob("k", {1j: 1})], PayloadNotSerializable, "serialisable"),
            ([NewJob("k", {}), NewJob("k", {}, queue="")], InvalidArgument, "queue must not"),
            ([], InvalidArgument, "at least one job"),
        ]:
            with pytest.raises(error, match=words):
                queue.enqueue_many(conn, jobs)
        assert conn.execute(select(func.count()).select_from(T)).scalar_one() == 0
