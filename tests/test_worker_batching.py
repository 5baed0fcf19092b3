"""The worker's hot path: jobs claimed ahead of a free handler (prefetch), and the batched
completion statement built once and run again with new pairs.

Step by step on a `FakeClock` as in tests/test_worker.py: handlers that must stay running
block on an event the test sets, nothing sleeps to synchronise, no test asserts timings, and
every test ends by counting the jobs in the table.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.dialects import postgresql

from sa_outbox import (
    Backoff,
    CountingMetrics,
    FakeClock,
    InvalidArgument,
    JobApp,
    JobContext,
    JobOutcome,
    JobQueue,
    NewJob,
    Reclaimer,
    Worker,
)
from sa_outbox import statements as st

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
WAIT = 10.0  # seconds a test waits for an event before it fails (never reached when green)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def make_worker(engine: Engine, clock: FakeClock) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(app: JobApp, **options: Any) -> Worker:
        options.setdefault("clock", clock)
        options.setdefault("timer", lambda: clock.now().timestamp())
        options.setdefault("listen", False)
        options.setdefault("install_signal_handlers", False)
        worker = Worker(app, engine, **options)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def enqueue(engine: Engine, kind: str, n: int = 1) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = JobQueue(Job).enqueue_many(conn, [NewJob(kind, {"n": i}) for i in range(n)])
    return [r.id for r in results if r.id is not None]


def test_short_jobs_are_claimed_ahead_once_handlers_have_returned(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    ran: list[int] = []
    app = JobApp(Job, handlers={"short": lambda job: ran.append(job.payload["n"])})
    enqueue(engine, "short", 30)
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=1, batch=10, metrics=metrics)

    assert worker.claim() == 1  # no handler has returned yet: only the free one
    assert worker.wait_for_handlers(WAIT)
    # The handler took no (fake) time: the next claim fills a batch, 9 of them queued
    # behind the one handler thread, which runs them one after another.
    assert worker.claim() == 10
    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 10

    assert sorted(ran) == sorted(set(ran)) and len(ran) == 11
    assert jobs_by_status(engine) == {"succeeded": 11, "pending": 19}
    assert metrics.totals["acknowledged"] == 11
    assert metrics.totals["transactions"] == 3


def test_prefetch_zero_claims_only_for_free_handlers(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job, handlers={"short": lambda job: None})
    enqueue(engine, "short", 3)
    worker = make_worker(app, concurrency=1, batch=10, prefetch=0)

    claimed = []
    while claimed_now := worker.run_once(WAIT):
        claimed.append(claimed_now)

    assert claimed == [1, 1, 1]
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_prefetch_is_checked(engine: Engine) -> None:
    app = JobApp(Job, handlers={"short": lambda job: None})
    with pytest.raises(InvalidArgument, match="prefetch must be between 0"):
        Worker(app, engine, prefetch=-1)


def test_long_jobs_are_not_claimed_ahead(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    def slow(job: JobContext) -> None:
        clock.advance(5)  # five (fake) seconds per job: far beyond the prefetch horizon

    app = JobApp(Job, handlers={"slow": slow})
    enqueue(engine, "slow", 4)
    worker = make_worker(app, concurrency=1, batch=10)

    assert worker.run_once(WAIT) == 1
    assert worker.run_once(WAIT) == 1  # 5 s per job: no job waits behind another
    assert jobs_by_status(engine) == {"succeeded": 2, "pending": 2}


def test_stopping_releases_queued_jobs_without_counting_an_attempt(engine: Engine) -> None:
    started = threading.Event()
    ran: list[int] = []

    def polite(job: JobContext) -> None:
        ran.append(job.payload["n"])
        started.set()
        job.cancel.wait(WAIT)  # returns as soon as shutdown is asked

    app = JobApp(Job, handlers={"polite": polite})
    enqueue(engine, "polite", 4)
    worker = Worker(
        app,
        engine,
        concurrency=1,
        batch=4,
        prefetch=3,
        grace=WAIT,
        listen=False,
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(WAIT)
    worker.stop()
    thread.join(WAIT)
    assert not thread.is_alive()

    assert len(ran) == 1  # the queued three never started
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 3}
    assert all(job_row(engine, i).attempts == 0 for i in _pending_ids(engine))


def _pending_ids(engine: Engine) -> list[uuid.UUID]:
    t = Job.__table__
    with engine.connect() as conn:
        return list(conn.execute(t.select().where(t.c.status == "pending")).scalars())


def test_a_queued_job_whose_lease_was_lost_never_runs(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    release = threading.Event()
    ran: list[int] = []

    def blocking(job: JobContext) -> None:
        ran.append(job.payload["n"])
        job.cancel.wait(WAIT)
        release.wait(WAIT)

    app = JobApp(Job, handlers={"blocking": blocking}, backoff=Backoff(base=1, max=1, jitter=0))
    enqueue(engine, "blocking", 2)
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=1, batch=2, prefetch=1, metrics=metrics, lease=30)

    assert worker.claim() == 2  # one running, one queued behind it
    clock.advance(31)  # both leases expire; a reclaimer gives the jobs back
    assert len(Reclaimer(app, engine, clock=clock).run_once()) == 2
    beat = worker.heartbeat()
    assert beat is not None and len(beat.lost) == 2
    release.set()
    assert worker.wait_for_handlers(WAIT)
    worker.flush()

    assert ran == [ran[0]]  # the queued job never ran
    assert metrics.outcomes("blocking")[JobOutcome.LOST] == 2
    assert jobs_by_status(engine) == {"pending": 2}
    assert {job_row(engine, i).attempts for i in _pending_ids(engine)} == {1}


def test_the_batched_completion_is_built_once_and_run_again_with_new_pairs(
    engine: Engine,
) -> None:
    queue = JobQueue(Job)  # the database's clock: the statement is reused
    enqueue(engine, "job", 5)
    with engine.begin() as conn:
        jobs = queue.claim(conn, worker_id="w", batch=5)
    first, second = jobs[:2], jobs[2:]
    stale = (second[0].id, uuid.uuid4())
    with engine.begin() as conn:
        done = queue.complete_many(conn, [(j.id, j.lease_token) for j in first])
        assert sorted(done.done) == sorted(j.id for j in first) and done.lost == []
        again = queue.complete_many(conn, [(j.id, j.lease_token) for j in second] + [stale])
        assert sorted(again.done) == sorted(j.id for j in second)
        assert again.lost == [stale[0]]
    with pytest.raises(InvalidArgument, match="at least one"), engine.begin() as conn:
        queue.complete_many(conn, [])
    assert jobs_by_status(engine) == {"succeeded": 5}


def test_the_claim_names_pending_in_its_sql_for_the_partial_index() -> None:
    sql = str(
        st.claim_jobs(Job, worker_id="w", batch=20, queues="default").compile(
            dialect=postgresql.dialect()  # type: ignore[no-untyped-call]
        )
    )
    # A generic plan of the prepared claim can use the ready index (WHERE status =
    # 'pending') only if the predicate is in the text, not a bound parameter.
    assert "jobs.status = 'pending'" in sql
