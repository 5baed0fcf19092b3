"""`AsyncWorker` against a real PostgreSQL: the same behaviour as `Worker`, on asyncio.

Step by step with a `FakeClock` where time matters; ``asyncio.Event`` where a handler must
stay running. No sleeping to synchronise, no timing assertions, jobs counted at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import (
    AsyncWorker,
    Backoff,
    FakeClock,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    PermanentError,
)
from sa_outbox.worker import AsyncReclaimer, CancelReason, CountingMetrics, JobOutcome

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0


def enqueue(
    engine: Engine, kind: str, n: int = 1, clock: FakeClock | None = None, **kw: Any
) -> list[Any]:
    with engine.begin() as conn:
        results = JobQueue(Job, clock=clock).enqueue_many(
            conn, [NewJob(kind, {"n": i}, **kw) for i in range(n)]
        )
    return [r.id for r in results]


async def test_async_and_sync_handlers_run_and_are_acknowledged_in_batches(
    engine: Engine, clock: FakeClock, make_async_worker: Callable[..., AsyncWorker]
) -> None:
    ran: list[tuple[str, int]] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("coroutine")
    async def coroutine(job: JobContext) -> None:
        await asyncio.sleep(0)
        ran.append((job.kind, job.payload["n"]))
        job.enqueue("plain", {"n": 100 + job.payload["n"]})

    @app.handler("plain")
    def plain(job: JobContext) -> None:  # runs in a thread
        assert threading.current_thread() is not threading.main_thread()
        ran.append((job.kind, job.payload["n"]))

    @app.handler("refused")
    async def refused(job: JobContext) -> None:
        raise PermanentError("never")

    enqueue(engine, "coroutine", 12, clock=clock)
    enqueue(engine, "refused", clock=clock)
    metrics = CountingMetrics()
    worker = make_async_worker(app, concurrency=5, metrics=metrics)
    assert await worker.drain(timeout=WAIT) == 25  # 12 + 1 + the 12 follow-ups
    assert sorted(n for kind, n in ran if kind == "coroutine") == list(range(12))
    assert sorted(n for kind, n in ran if kind == "plain") == list(range(100, 112))
    assert jobs_by_status(engine) == {"succeeded": 24, "failed": 1}
    assert metrics.outcomes()[JobOutcome.SUCCEEDED] == 24
    assert metrics.totals["transactions"] < 25


async def test_a_transient_error_is_retried_after_the_backoff(
    engine: Engine, clock: FakeClock, make_async_worker: Callable[..., AsyncWorker]
) -> None:
    app = JobApp(Job)

    @app.handler("flaky", backoff=Backoff(base=3, max=60, jitter=0))
    async def flaky(job: JobContext) -> None:
        if job.attempts == 1:
            raise ConnectionError("API down")

    [job_id] = enqueue(engine, "flaky", clock=clock)
    worker = make_async_worker(app)
    await worker.drain(timeout=WAIT)
    row = job_row(engine, job_id)
    assert (row.status, row.run_at) == ("pending", T0 + dt.timedelta(seconds=3))
    assert row.last_error.startswith("ConnectionError: API down\nTraceback")
    clock.advance(3)
    await worker.drain(timeout=WAIT)
    assert (job_row(engine, job_id).status, job_row(engine, job_id).attempts) == ("succeeded", 2)
    assert jobs_by_status(engine) == {"succeeded": 1}


async def test_a_timeout_cancels_the_coroutine_and_retries_the_job(
    engine: Engine, clock: FakeClock, make_async_worker: Callable[..., AsyncWorker]
) -> None:
    started = asyncio.Event()
    seen: list[str] = []
    app = JobApp(Job)

    @app.handler("slow", timeout=5, backoff=NO_JITTER)
    async def slow(job: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            seen.append(f"cancelled ({job.cancel.reason})")
            raise

    [job_id] = enqueue(engine, "slow", clock=clock)
    worker = make_async_worker(app)
    assert await worker.claim() == 1
    await asyncio.wait_for(started.wait(), WAIT)
    clock.advance(5)
    assert worker.check_timeouts() == 1
    assert await worker.wait_for_handlers(WAIT)
    await worker.flush()
    assert seen == ["cancelled (timeout)"]
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("pending", 1)
    assert "JobTimeout: job kind 'slow' ran longer than its timeout of 5 s" in row.last_error
    assert jobs_by_status(engine) == {"pending": 1}


async def test_a_lost_lease_wakes_the_handler_waiting_on_its_token(
    engine: Engine,
    clock: FakeClock,
    async_engine: AsyncEngine,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    started = asyncio.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("work")
    async def work(job: JobContext) -> None:
        started.set()
        await asyncio.wait_for(job.cancel.wait_async(), WAIT)
        reasons.append(job.cancel.reason)

    [job_id] = enqueue(engine, "work", clock=clock)
    metrics = CountingMetrics()
    worker = make_async_worker(app, lease=30, metrics=metrics)
    await worker.claim()
    await asyncio.wait_for(started.wait(), WAIT)
    clock.advance(31)
    [reclaimed] = await AsyncReclaimer(app, async_engine, clock=clock).run_once()
    assert reclaimed.id == job_id
    result = await worker.heartbeat()
    assert result is not None and result.lost == [job_id]
    assert await worker.wait_for_handlers(WAIT)
    await worker.flush()
    assert reasons == [CancelReason.LEASE_LOST]
    assert metrics.outcomes()[JobOutcome.LOST] == 1
    assert jobs_by_status(engine) == {"pending": 1}


async def test_stop_releases_what_does_not_finish_within_the_grace_period(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    started = {"polite": asyncio.Event(), "stubborn": asyncio.Event()}
    app = JobApp(Job)

    @app.handler("polite")
    async def polite(job: JobContext) -> None:
        started["polite"].set()
        await asyncio.wait_for(job.cancel.wait_async(), WAIT)

    @app.handler("stubborn")
    async def stubborn(job: JobContext) -> None:
        started["stubborn"].set()
        await asyncio.Event().wait()  # ignores its token; cancelled after the grace period

    ids = {kind: enqueue(engine, kind)[0] for kind in started}
    worker = AsyncWorker(app, async_engine, grace=1.0, listen=False, install_signal_handlers=False)
    run = asyncio.create_task(worker.run())
    for event in started.values():
        await asyncio.wait_for(event.wait(), WAIT)
    worker.stop()
    await asyncio.wait_for(run, WAIT)
    assert job_row(engine, ids["polite"]).status == "succeeded"
    row = job_row(engine, ids["stubborn"])
    assert (row.status, row.attempts, row.lease_token) == ("pending", 0, None)
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 1}


async def test_an_async_worker_wakes_up_on_notify(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    ran = asyncio.Event()

    async def ping(job: JobContext) -> None:
        ran.set()

    worker = AsyncWorker(
        JobApp(Job, handlers={"ping": ping}),
        async_engine,
        poll_interval=3600,
        reclaim=False,
        install_signal_handlers=False,
    )
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.listening.wait(), WAIT)
        await asyncio.to_thread(enqueue, engine, "ping")
        await asyncio.wait_for(ran.wait(), WAIT)
    finally:
        worker.stop()
        await asyncio.wait_for(run, WAIT)
    assert jobs_by_status(engine) == {"succeeded": 1}


async def test_the_async_worker_vacuums_its_table_past_the_threshold(
    engine: Engine, database_url: str, clock: FakeClock
) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from sa_outbox import VacuumPolicy

    from .conftest import TEST_SCHEMA

    # One pooled connection does all the worker's writes: its statistics are forced out
    # below, so the dead-tuple count is exact (see tests/test_vacuum.py).
    one = create_async_engine(database_url, pool_size=1, max_overflow=0)
    app = JobApp(Job)
    app.register("noop", lambda job: None)
    worker = AsyncWorker(
        app,
        one,
        clock=clock,
        timer=lambda: clock.now().timestamp(),
        listen=False,
        install_signal_handlers=False,
        vacuum=VacuumPolicy(threshold=100),
    )
    try:
        enqueue(engine, "noop", 150, clock=clock)
        assert await worker.drain(10.0) == 150
        async with one.connect() as conn:
            await conn.execute(text("SELECT pg_stat_force_next_flush()"))
        report = await worker.vacuum()
    finally:
        worker.close()
        await one.dispose()
    assert report is not None and report.vacuumed == [f"{TEST_SCHEMA}.jobs"]
    assert jobs_by_status(engine) == {"succeeded": 150}
    assert await AsyncWorker(app, one, vacuum=None, listen=False).vacuum() is None
