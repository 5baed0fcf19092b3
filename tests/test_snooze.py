"""`Snooze`: a handler sends its job back to ``pending`` for later, without a failure.

Real PostgreSQL, `Worker` and `AsyncWorker` driven step by step on a `FakeClock` (the SQL
clock and the local timer); a handler that must stay running waits on an event. Every test
counts the jobs at the end.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from sa_outbox import (
    AsyncWorker,
    Backoff,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    Snooze,
    Worker,
)
from sa_outbox import statements as st
from sa_outbox.worker import CountingMetrics, JobOutcome, Reclaimer

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0


def enqueue(engine: Engine, queue: JobQueue, kind: str, n: int = 1, **kw: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = queue.enqueue_many(conn, [NewJob(kind, {"n": i}, **kw) for i in range(n)])
    return [r.id for r in results if r.id is not None]


def test_a_snooze_raised_or_returned_reschedules_without_burning_an_attempt(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    runs: list[int] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("poll")
    def poll(job: JobContext) -> Snooze | None:
        runs.append(job.attempts)
        if len(runs) == 1:
            raise ConnectionError("the API is down")  # a real failure: attempt 1 counted
        if len(runs) == 2:
            raise Snooze(30)
        if len(runs) == 3:
            return Snooze(dt.timedelta(minutes=2))
        return None

    [job_id] = enqueue(engine, queue, "poll", max_attempts=2)
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)

    assert worker.drain(timeout=WAIT) == 1  # fails: retried in 1 s
    clock.advance(1)
    assert worker.drain(timeout=WAIT) == 1  # snoozes 30 s
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.run_at) == (
        "pending",
        1,
        clock.now() + dt.timedelta(seconds=30),
    )
    assert row.last_error.startswith("ConnectionError: the API is down")  # left as it was
    assert (row.lease_token, row.worker_id, row.lease_until) == (None, None, None)
    clock.advance(29)
    assert worker.drain(timeout=WAIT) == 0  # not due yet
    clock.advance(1)
    assert worker.drain(timeout=WAIT) == 1  # snoozes 2 min (returned, not raised)
    assert job_row(engine, job_id).run_at == clock.now() + dt.timedelta(minutes=2)
    clock.advance(120)
    assert worker.drain(timeout=WAIT) == 1  # succeeds: max_attempts=2 was never reached

    assert runs == [1, 2, 2, 2]  # each snooze gave its attempt back
    assert metrics.outcomes("poll")[JobOutcome.SNOOZED] == 2
    assert metrics.outcomes("poll")[JobOutcome.RETRIED] == 1
    assert metrics.outcomes("poll")[JobOutcome.SUCCEEDED] == 1
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_snoozes_are_written_in_the_batch_with_completions(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("half")
    def half(job: JobContext) -> Snooze | None:
        if job.payload["n"] % 2 and job.payload["n"] not in snoozed:
            snoozed.add(job.payload["n"])
            return Snooze(5)
        return None

    snoozed: set[int] = set()
    enqueue(engine, queue, "half", 20, max_attempts=1)
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics, batch=20, concurrency=4)
    assert worker.drain(timeout=WAIT) == 20
    assert jobs_by_status(engine) == {"succeeded": 10, "pending": 10}
    assert worker.drain(timeout=WAIT) == 0
    clock.advance(5)  # due again; max_attempts=1 still allows a run: no attempt was spent
    assert worker.drain(timeout=WAIT) == 10
    outcomes = metrics.outcomes("half")
    assert outcomes[JobOutcome.SNOOZED] == 10 and outcomes[JobOutcome.SUCCEEDED] == 20
    assert outcomes[JobOutcome.LOST] == 0 and outcomes[JobOutcome.FAILED] == 0
    assert metrics.totals["transactions"] < 30  # results written in batches, not one by one
    assert jobs_by_status(engine) == {"succeeded": 20}


@pytest.mark.parametrize(
    ("seconds", "error", "message"),
    [
        (-5, InvalidArgument, "snooze delay must be zero or more, got -5 s"),
        (float("nan"), InvalidArgument, "snooze delay must be a finite number of seconds, got nan"),
        (float("inf"), InvalidArgument, "finite number of seconds, got inf"),
        (1e12, InvalidArgument, "snooze delay must be at most 365 days"),
        (dt.timedelta(days=400), InvalidArgument, "at most 365 days"),
        ("10", InvalidArgumentType, "a timedelta or a number of seconds, got str"),
        (True, InvalidArgumentType, "got bool"),
    ],
)
def test_a_bad_snooze_fails_the_job_with_a_clear_error_and_loses_nothing(
    engine: Engine,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
    seconds: Any,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(")):
        Snooze(seconds)
    with pytest.raises(error, match="snooze delay"):
        st.snooze_job(Job, uuid.uuid4(), uuid.uuid4(), delay=seconds)

    app = JobApp(Job, backoff=NO_JITTER)
    app.register("bad", lambda job: Snooze(seconds))
    [job_id] = enqueue(engine, queue, "bad")
    make_worker(app).drain(timeout=WAIT)
    row = job_row(engine, job_id)
    assert row.status == "failed"
    assert f"{error.__name__}: snooze delay" in row.last_error
    assert jobs_by_status(engine) == {"failed": 1}


def test_a_snooze_is_fenced_by_the_lease_token(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    started, go = threading.Event(), threading.Event()
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("slow")
    def slow(job: JobContext) -> Snooze:
        started.set()
        assert go.wait(WAIT)
        return Snooze(600)

    [job_id] = enqueue(engine, queue, "slow")
    metrics = CountingMetrics()
    a = make_worker(app, lease=30, metrics=metrics, worker_id="A")
    a.claim()
    assert started.wait(WAIT)
    clock.advance(31)  # A's lease expires; the reclaimer gives the job to B
    Reclaimer(app, engine, clock=clock).run_once()
    clock.advance(NO_JITTER.delay(1))
    with engine.begin() as conn:
        [b] = queue.claim(conn, worker_id="B")
    go.set()
    assert a.wait_for_handlers(WAIT)
    a.flush()  # A's snooze matches no row: B's run is untouched
    row = job_row(engine, job_id)
    assert (row.status, row.worker_id, row.lease_token) == ("running", "B", b.lease_token)
    assert metrics.outcomes("slow")[JobOutcome.LOST] == 1
    with engine.begin() as conn:
        queue.complete(conn, b.id, b.lease_token)
    assert jobs_by_status(engine) == {"succeeded": 1}


async def test_async_worker_snoozes_async_and_thread_handlers(
    engine: Engine,
    queue: JobQueue,
    clock: FakeClock,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    runs: list[tuple[str, int]] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("async-poll")
    async def async_poll(job: JobContext) -> Snooze | None:
        runs.append((job.kind, job.attempts))
        return Snooze(10) if [kind for kind, _ in runs].count(job.kind) <= 2 else None

    @app.handler("thread-poll")
    def thread_poll(job: JobContext) -> None:
        runs.append((job.kind, job.attempts))
        if [kind for kind, _ in runs].count(job.kind) == 1:
            raise Snooze(dt.timedelta(seconds=10))

    with engine.begin() as conn:
        queue.enqueue(conn, "async-poll", {}, max_attempts=1)
        queue.enqueue(conn, "thread-poll", {}, max_attempts=1)
    metrics = CountingMetrics()
    worker = make_async_worker(app, metrics=metrics)
    assert await worker.drain(timeout=WAIT) == 2
    assert jobs_by_status(engine) == {"pending": 2}
    assert await worker.drain(timeout=WAIT) == 0
    clock.advance(10)
    assert await worker.drain(timeout=WAIT) == 2  # async snoozes again, the thread one is done
    clock.advance(10)
    assert await worker.drain(timeout=WAIT) == 1
    assert {attempts for _, attempts in runs} == {1}
    assert metrics.outcomes()[JobOutcome.SNOOZED] == 3
    assert jobs_by_status(engine) == {"succeeded": 2}
