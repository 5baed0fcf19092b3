"""What ``sa-outbox demo`` runs: the job queue and the outbox, end to end, on real PostgreSQL.

The demo declares its own models on its own declarative base, in the schema
``sa_outbox_demo`` (dropped and created again at every run, and left behind afterwards so
the rows can be looked at), then walks the path an application takes:

1. one transaction enqueues the jobs with `JobQueue.enqueue_many` (one of them repeats a
   deduplication key and is skipped; one carries a payload its handler rejects) and appends
   an outbox event;
2. a worker loop claims batches of 20 and commits, runs each job's handler outside any
   transaction, then acknowledges the whole batch with one `JobQueue.complete_many`
   (`JobQueue.fail` for the rejected job, with its error);
3. a relay step claims the outbox event, publishes it to an in-process list standing in for
   a broker, and marks it published with its relay token.

Examples:
    from sqlalchemy import create_engine
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1/test")
    report = run_demo(engine, jobs=100)
    report.counts[JobStatus.SUCCEEDED], report.counts[JobStatus.FAILED]
    # -> (100, 1)
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.schema import CreateSchema, DropSchema

from .._exceptions import InvalidArgument
from ..queue import ClaimedJob, JobQueue, Outbox
from ..schema import JobMixin, JobStatus, OutboxMixin
from ..statements import NewJob

__all__ = [
    "CLAIM_BATCH",
    "DEMO_SCHEMA",
    "MAX_DEMO_JOBS",
    "DemoReport",
    "FailedJob",
    "PermanentJobError",
    "PublishedMessage",
    "demo_schema_lock",
    "format_report",
    "run_demo",
]

#: The schema the demo owns: dropped and created again at every run.
DEMO_SCHEMA = "sa_outbox_demo"
#: How many jobs one claim takes.
CLAIM_BATCH = 20
#: The most jobs one demo run enqueues (they travel in one statement).
MAX_DEMO_JOBS = 100_000
#: Key of the PostgreSQL advisory lock a demo holds while it owns `DEMO_SCHEMA`, so two demos
#: on one database take turns instead of dropping each other's tables.
_SCHEMA_LOCK_KEY = 0x5A_0B_0DE3
#: The payload the demo's ``send-email`` handler rejects for good.
BAD_RECIPIENT = "not-an-address"


class Base(DeclarativeBase):
    """The demo's own declarative base, as an application has its own."""


class Job(JobMixin, Base):
    """The demo's job table, ``sa_outbox_demo.jobs``."""

    __tablename__ = "jobs"
    __table_schema__ = DEMO_SCHEMA


class OutboxEvent(OutboxMixin, Base):
    """The demo's outbox table, ``sa_outbox_demo.outbox``."""

    __tablename__ = "outbox"
    __table_schema__ = DEMO_SCHEMA


class PermanentJobError(Exception):
    """Raised by a handler when retrying cannot help (a bad payload): the job ends ``failed``.

    Any other exception a handler raises counts as transient: the job is retried with backoff.

    Examples:
        >>> str(PermanentJobError("invalid recipient"))
        'invalid recipient'
    """


Handler = Callable[[Any], None]


@dataclasses.dataclass(frozen=True, slots=True)
class FailedJob:
    """A job that ended ``failed``, as read back from the table.

    Examples:
        >>> FailedJob(uuid.UUID(int=1), "send-email", "invalid recipient").kind
        'send-email'
    """

    id: uuid.UUID
    kind: str
    last_error: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class PublishedMessage:
    """What the demo's in-process broker received for one outbox event.

    Examples:
        >>> PublishedMessage("0190", "DemoJobsEnqueued", {"jobs": 3}).event_type
        'DemoJobsEnqueued'
    """

    message_id: str
    event_type: str
    payload: Any


@dataclasses.dataclass(frozen=True, slots=True)
class DemoReport:
    """What a demo run did, with the job counts read back from the database at the end.

    Examples:
        >>> report = DemoReport(enqueued=3, deduplicated=1, worked=3, seconds=0.5,
        ...                     counts={}, failed=[], published=[], lost=0)
        >>> report.jobs_per_second
        6.0
    """

    enqueued: int
    deduplicated: int
    worked: int
    seconds: float
    counts: Mapping[JobStatus, int]
    failed: Sequence[FailedJob]
    published: Sequence[PublishedMessage]
    lost: int

    @property
    def jobs_per_second(self) -> float:
        """Jobs worked (claimed, handled, acknowledged) per second of the worker loop."""
        return self.worked / self.seconds if self.seconds > 0 else 0.0


def send_email(payload: Any) -> None:
    """The demo's ``send-email`` handler: rejects a recipient that is not an address.

    Examples:
        >>> send_email({"to": "ana@example.com"})
        >>> send_email({"to": "nobody"})
        Traceback (most recent call last):
        ...
        sa_outbox.cli._demo.PermanentJobError: invalid recipient 'nobody': not an e-mail address
    """
    recipient = str(payload["to"])
    if "@" not in recipient:
        raise PermanentJobError(f"invalid recipient {recipient!r}: not an e-mail address")


def resize_image(payload: Any) -> None:
    """The demo's ``resize-image`` handler: checks the requested width.

    Examples:
        >>> resize_image({"image_id": 7, "width": 320})
    """
    if int(payload["width"]) <= 0:
        raise PermanentJobError(f"image {payload['image_id']}: width must be positive")


HANDLERS: Mapping[str, Handler] = {"send-email": send_email, "resize-image": resize_image}


def demo_jobs(count: int) -> list[NewJob]:
    """``count`` good jobs, then one that repeats a deduplication key, then one bad job.

    Examples:
        >>> for job in demo_jobs(2):
        ...     print(job.kind, job.deduplication_key, job.payload)
        send-email welcome:user0 {'to': 'user0@example.com'}
        resize-image None {'image_id': 1, 'width': 320}
        send-email welcome:user0 {'to': 'user0@example.com'}
        send-email None {'to': 'not-an-address'}
    """
    jobs = [
        NewJob("send-email", {"to": f"user{i}@example.com"}, deduplication_key=f"welcome:user{i}")
        if i % 2 == 0
        else NewJob("resize-image", {"image_id": i, "width": 320})
        for i in range(count)
    ]
    jobs.append(
        NewJob("send-email", {"to": "user0@example.com"}, deduplication_key="welcome:user0")
    )
    jobs.append(NewJob("send-email", {"to": BAD_RECIPIENT}))
    return jobs


@contextmanager
def demo_schema_lock(engine: Engine) -> Iterator[None]:
    """Hold the advisory lock that gives one demo at a time the ``sa_outbox_demo`` schema.

    Examples:
        with demo_schema_lock(engine):
            pass
    """
    with engine.connect() as conn:
        conn.execute(select(func.pg_advisory_lock(_SCHEMA_LOCK_KEY)))
        conn.commit()
        try:
            yield
        finally:
            conn.execute(select(func.pg_advisory_unlock(_SCHEMA_LOCK_KEY)))
            conn.commit()


def _reset_schema(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(DropSchema(DEMO_SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(DEMO_SCHEMA))
        Base.metadata.create_all(conn)


def _work(queue: JobQueue, engine: Engine, worker_id: str) -> tuple[int, int]:
    """Claim, handle and acknowledge until nothing is ready; returns (worked, lost)."""
    worked = lost = 0
    while True:
        with engine.begin() as conn:
            claimed = queue.claim(conn, worker_id=worker_id, batch=CLAIM_BATCH)
        if not claimed:
            return worked, lost
        acks: list[tuple[uuid.UUID, uuid.UUID]] = []
        failed: list[tuple[ClaimedJob, str]] = []
        retried: list[tuple[ClaimedJob, str]] = []
        for job in claimed:  # outside any transaction
            handler = HANDLERS.get(job.kind)
            try:
                if handler is None:
                    raise PermanentJobError(f"unknown job kind {job.kind!r}")
                handler(job.payload)
            except PermanentJobError as exc:
                failed.append((job, str(exc)))
            except Exception as exc:  # transient: back to pending, after the backoff
                retried.append((job, f"{type(exc).__name__}: {exc}"))
            else:
                acks.append((job.id, job.lease_token))
        with engine.begin() as conn:
            if acks:
                lost += len(queue.complete_many(conn, acks).lost)
            for job, error in failed:
                queue.fail(conn, job.id, job.lease_token, error=error)
            for job, error in retried:
                queue.retry(conn, job.id, job.lease_token, error=error)
        worked += len(claimed)


def _relay(outbox: Outbox, engine: Engine) -> list[PublishedMessage]:
    """Claim → publish → mark, in that order, for every unpublished event."""
    broker: list[PublishedMessage] = []
    while True:
        with engine.begin() as conn:
            events = outbox.claim(conn, batch=100)
        if not events:
            return broker
        for event in events:
            broker.append(PublishedMessage(event.message_id, event.event_type, event.payload))
        with engine.begin() as conn:
            for event in events:
                outbox.mark_published(conn, event.id, event.relay_token)


def run_demo(engine: Engine, *, jobs: int, worker_id: str | None = None) -> DemoReport:
    """Run the demo on ``engine`` with ``jobs`` good jobs; see the module docstring.

    The schema ``sa_outbox_demo`` is dropped and created again first; the run holds an
    advisory lock, so concurrent demos on the same database wait for each other.

    Examples:
        report = run_demo(engine, jobs=10)
        report.enqueued, report.deduplicated
        # -> (11, 1)
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_DEMO_JOBS:
        raise InvalidArgument(f"jobs must be an int between 1 and {MAX_DEMO_JOBS}, got {jobs!r}")
    worker = worker_id or f"demo-{socket.gethostname()}-{os.getpid()}"
    queue, outbox = JobQueue(Job), Outbox(OutboxEvent)
    with demo_schema_lock(engine):
        _reset_schema(engine)
        with engine.begin() as conn:  # one unit of work: the jobs and the event, or nothing
            results = queue.enqueue_many(conn, demo_jobs(jobs))
            enqueued = sum(result.inserted for result in results)
            outbox.append(
                conn,
                event_type="DemoJobsEnqueued",
                aggregate_type="demo-run",
                aggregate_id=uuid.uuid4(),
                payload={"jobs": enqueued},
            )
        started = time.perf_counter()
        worked, lost = _work(queue, engine, worker)
        seconds = time.perf_counter() - started
        published = _relay(outbox, engine)
        with engine.connect() as conn:
            counts = queue.counts(conn)
            failed = [
                FailedJob(row.id, row.kind, row.last_error)
                for row in conn.execute(
                    select(Job.id, Job.kind, Job.last_error)
                    .where(Job.status == JobStatus.FAILED)
                    .order_by(Job.id)
                )
            ]
    return DemoReport(
        enqueued=enqueued,
        deduplicated=len(results) - enqueued,
        worked=worked,
        seconds=seconds,
        counts=counts,
        failed=failed,
        published=published,
        lost=lost,
    )


def format_report(report: DemoReport, *, database: str, inspectable: bool = True) -> str:
    """The human summary ``sa-outbox demo`` prints (``inspectable``: the tables outlive it).

    Examples:
        >>> report = DemoReport(
        ...     enqueued=3, deduplicated=1, worked=3, seconds=0.5,
        ...     counts={JobStatus.PENDING: 0, JobStatus.RUNNING: 0, JobStatus.SUCCEEDED: 2,
        ...             JobStatus.FAILED: 1},
        ...     failed=[FailedJob(uuid.UUID(int=1), "send-email", "invalid recipient")],
        ...     published=[PublishedMessage("0190-e2", "DemoJobsEnqueued", {"jobs": 3})],
        ...     lost=0)
        >>> print(format_report(report, database="postgresql+psycopg://app@db/app"))
        sa-outbox demo on postgresql+psycopg://app@db/app, schema sa_outbox_demo
          enqueued   3 jobs + 1 outbox event in one transaction; 1 duplicate key skipped
          worked     3 jobs in 0.50 s = 6 jobs/s (1 worker, claims of 20, batched acks)
          jobs       pending 0, running 0, succeeded 2, failed 1, cancelled 0
          failed     send-email 00000000-0000-0000-0000-000000000001: invalid recipient
          published  event 0190-e2 (DemoJobsEnqueued) to the in-process broker: claim, publish, mark
          look       SELECT status, count(*) FROM sa_outbox_demo.jobs GROUP BY status;
    """
    skipped = report.deduplicated
    lines = [
        f"sa-outbox demo on {database}, schema {DEMO_SCHEMA}",
        f"  enqueued   {report.enqueued:,} jobs + 1 outbox event in one transaction; "
        f"{skipped} duplicate key{'' if skipped == 1 else 's'} skipped",
        f"  worked     {report.worked:,} jobs in {report.seconds:.2f} s = "
        f"{report.jobs_per_second:,.0f} jobs/s (1 worker, claims of {CLAIM_BATCH}, batched acks)",
        "  jobs       " + ", ".join(f"{s} {report.counts.get(s, 0):,}" for s in JobStatus),
    ]
    if report.lost:
        lines.append(f"  lost       {report.lost} leases expired before their acknowledgement")
    lines += [f"  failed     {job.kind} {job.id}: {job.last_error}" for job in report.failed]
    lines += [
        f"  published  event {message.message_id} ({message.event_type}) to the in-process "
        "broker: claim, publish, mark"
        for message in report.published
    ]
    if inspectable:
        look = f"SELECT status, count(*) FROM {DEMO_SCHEMA}.jobs GROUP BY status;"
        lines.append(f"  look       {look}")
    return "\n".join(lines)
