"""Bad input gets a clear error naming what was wrong, before any SQL exists."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import (
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobMixin,
    JobQueue,
    NewJob,
    Outbox,
    PayloadNotSerializable,
    PayloadTooLarge,
)
from sa_outbox import statements as st

from .conftest import Job, OutboxEvent
from .helpers import event_rows, jobs_by_status

T = uuid.UUID(int=1)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: st.claim_jobs(Job, worker_id="w", batch=0), InvalidArgument, "batch"),
        (lambda: st.claim_jobs(Job, worker_id="w", batch=-5), InvalidArgument, "batch"),
        (lambda: st.claim_jobs(Job, worker_id="w", batch=True), InvalidArgumentType, "batch"),
        (lambda: st.claim_jobs(Job, worker_id="w", lease=-1), InvalidArgument, "lease"),
        (lambda: st.claim_jobs(Job, worker_id="w", lease=0), InvalidArgument, "lease"),
        (lambda: st.claim_jobs(Job, worker_id="w", lease="30s"), InvalidArgumentType, "lease"),
        (lambda: st.claim_jobs(Job, worker_id="w", queues=3), InvalidArgumentType, "queues"),
        (lambda: st.claim_jobs(Job, worker_id="w", queues={"a": 1}), InvalidArgumentType, "queues"),
        (lambda: st.claim_jobs(Job, worker_id="w", queues=[]), InvalidArgument, "queues"),
        (lambda: st.claim_jobs(Job, worker_id="w", kinds=[1]), InvalidArgumentType, "kinds"),
        (lambda: st.claim_jobs(Job, worker_id=""), InvalidArgument, "worker_id"),
        (lambda: st.claim_jobs(object(), worker_id="w"), InvalidArgumentType, "Table"),
        (lambda: st.claim_jobs(Job, worker_id="w", clock="now"), InvalidArgumentType, "clock"),
        (lambda: st.enqueue_job(Job, "", {}), InvalidArgument, "kind"),
        (lambda: st.enqueue_job(Job, "k", {}, queue=None), InvalidArgumentType, "queue"),
        (lambda: st.enqueue_job(Job, "k", {}, max_attempts=0), InvalidArgument, "max_attempts"),
        (
            lambda: st.enqueue_job(Job, "k", {}, run_at=dt.datetime(2030, 1, 1)),
            InvalidArgument,
            "timezone-aware",
        ),
        (
            lambda: st.enqueue_job(Job, "k", {}, delay=5, run_at=dt.datetime.now(dt.UTC)),
            InvalidArgument,
            "not both",
        ),
        (lambda: st.enqueue_jobs(Job, []), InvalidArgument, "at least one"),
        (lambda: st.complete_job(Job, "not-a-uuid", T), InvalidArgument, "job id"),
        (lambda: st.complete_jobs(Job, [(T,)]), InvalidArgumentType, "pair"),
        (lambda: st.complete_jobs(Job, []), InvalidArgument, "at least one"),
        (
            lambda: st.prune_jobs(Job, older_than=1, statuses=["pending"]),
            InvalidArgument,
            "only finished",
        ),
        (
            lambda: st.prune_jobs(Job, older_than=1, statuses=["done"]),
            InvalidArgument,
            "unknown job status",
        ),
        (lambda: st.claim_events(OutboxEvent, batch=10_001), InvalidArgument, "batch"),
        (
            lambda: st.append_event(
                OutboxEvent, event_type="E", aggregate_type="a", aggregate_id=None, payload={}
            ),
            InvalidArgumentType,
            "aggregate_id",
        ),
        (
            lambda: st.append_event(
                OutboxEvent,
                event_type="E",
                aggregate_type="a",
                aggregate_id=1,
                payload={},
                headers=[1],
            ),
            InvalidArgumentType,
            "headers",
        ),
        (lambda: FakeClock(dt.datetime(2030, 1, 1)), InvalidArgument, "timezone-aware"),
        (lambda: FakeClock().advance(-1), InvalidArgument, "forward"),
    ],
)
def test_bad_arguments_are_refused_before_sql(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_errors_are_value_and_type_errors() -> None:
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(InvalidArgumentType, TypeError)
    assert issubclass(PayloadNotSerializable, TypeError)
    assert issubclass(PayloadTooLarge, ValueError)


@pytest.mark.parametrize("name", ["jobs; drop table x", "1jobs", "j" * 64, "jobs-x", ""])
def test_invalid_table_names_are_refused(name: str) -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(InvalidArgument, match="not a valid identifier"):
        type("BadJob", (JobMixin, Base), {"__tablename__": name})


def test_invalid_schema_name_is_refused() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(InvalidArgument, match="__table_schema__"):
        type("BadJob", (JobMixin, Base), {"__tablename__": "jobs", "__table_schema__": "a b"})


def test_unserialisable_payload_names_the_kind_and_inserts_nothing(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "fine", {})
        with pytest.raises(PayloadNotSerializable, match=r"'send-email'.*set"):
            queue.enqueue(conn, "send-email", {"to": {"a", "b"}})
        with pytest.raises(PayloadNotSerializable, match="'money'"):
            queue.enqueue_many(conn, [NewJob("ok", {}), NewJob("money", decimal.Decimal("1.5"))])
        with pytest.raises(PayloadNotSerializable, match="not JSON-serialisable"):
            queue.enqueue(conn, "nan", float("nan"))
    assert jobs_by_status(engine) == {"pending": 1}  # the good one, and nothing else


def test_payload_too_large(engine: Engine) -> None:
    queue = JobQueue(Job, max_payload_bytes=100)
    outbox = Outbox(OutboxEvent, max_payload_bytes=100)
    with engine.begin() as conn:
        with pytest.raises(PayloadTooLarge, match=r"'big'.*over the limit of 100"):
            queue.enqueue(conn, "big", "x" * 200)
        with pytest.raises(PayloadTooLarge, match="'Big'"):
            outbox.append(
                conn, event_type="Big", aggregate_type="a", aggregate_id=1, payload="x" * 200
            )
    assert jobs_by_status(engine) == {} and event_rows(engine) == []


def test_custom_dumps_serialises_what_json_cannot(engine: Engine) -> None:
    import json

    def dumps(value: object) -> str:
        return json.dumps(value, default=str)

    queue = JobQueue(Job, dumps=dumps)
    with engine.begin() as conn:
        queue.enqueue(conn, "money", {"amount": decimal.Decimal("1.50")})
        [job] = queue.claim(conn, worker_id="w")
    assert job.payload == {"amount": "1.50"}
