"""Cancelling jobs: `JobQueue.cancel` and what a worker does with a job cancelled under it.

Real PostgreSQL; workers driven step by step on a `FakeClock` (SQL clock and local timer);
a handler that must stay running waits on its token or an event. No sleeping to
synchronise, no timing assertions; every test counts the jobs at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import (
    AsyncJobQueue,
    AsyncWorker,
    Backoff,
    FakeClock,
    InvalidArgument,
    JobApp,
    JobContext,
    JobQueue,
    JobStatus,
    NewJob,
    Pruner,
    Retention,
    Snooze,
    Worker,
)
from sa_outbox.worker import CancelReason, CountingMetrics, JobOutcome, Reclaimer

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0


@pytest.fixture
def worker_options(worker_options: dict[str, Any]) -> dict[str, Any]:
    return {**worker_options, "reclaim": False}


def enqueue(engine: Engine, queue: JobQueue, kind: str, n: int = 1, **kw: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = queue.enqueue_many(conn, [NewJob(kind, {"n": i}, **kw) for i in range(n)])
    return [r.id for r in results if r.id is not None]


def test_cancel_reports_each_id_and_waiting_jobs_never_run(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    ran: list[uuid.UUID] = []
    app = JobApp(Job, handlers={"work": lambda job: ran.append(job.id)})
    due, later, done, held, retried = (enqueue(engine, queue, "work")[0] for _ in range(5))
    with engine.begin() as conn:
        queue.enqueue(conn, "work", {}, delay=3600)  # a scheduled job nobody cancels
        [scheduled] = enqueue(engine, queue, "work", delay=600)
        claimed = {j.id: j for j in queue.claim(conn, worker_id="w", batch=5)}
    assert set(claimed) == {due, later, done, held, retried}
    with engine.begin() as conn:
        queue.complete(conn, done, claimed[done].lease_token)
        queue.retry(conn, retried, claimed[retried].lease_token, error="boom", delay=60)
        queue.release_many(conn, [(i, claimed[i].lease_token) for i in (due, later)])
    unknown = uuid.uuid4()

    with engine.begin() as conn:
        result = queue.cancel(conn, [due, scheduled, retried, held, done, unknown, due])
    assert result.cancelled == [due, scheduled, retried]  # waiting: will never run
    assert result.cancelling == [held]  # running: its worker stops it
    assert result.finished == [done]
    assert result.unknown == [unknown]
    with engine.begin() as conn:  # again: all finished now, the running one included
        again = queue.cancel(conn, str(due))
    assert (again.cancelled, again.finished) == ([], [due])

    row = job_row(engine, held)
    assert (row.status, row.lease_token) == ("cancelled", claimed[held].lease_token)
    assert job_row(engine, retried).last_error == "boom"  # left as it was
    clock.advance(7200)
    worker = make_worker(app)
    assert worker.drain(timeout=WAIT) == 2  # `later` and the scheduled job nobody cancelled
    assert due not in ran and scheduled not in ran and retried not in ran
    with engine.connect() as conn:
        assert queue.counts(conn)[JobStatus.CANCELLED] == 4
    assert jobs_by_status(engine) == {"succeeded": 3, "cancelled": 4}


def test_cancel_refuses_bad_ids_and_changes_nothing(engine: Engine, queue: JobQueue) -> None:
    [job_id] = enqueue(engine, queue, "work")
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match="at least one job id"):
            queue.cancel(conn, [])
        with pytest.raises(InvalidArgument, match="job id"):
            queue.cancel(conn, [job_id, "not-a-uuid"])
        with pytest.raises(InvalidArgument, match="sequence of job ids"):
            queue.cancel(conn, 42)  # type: ignore[arg-type]
    assert jobs_by_status(engine) == {"pending": 1}


def test_a_running_job_is_stopped_at_the_next_heartbeat_and_ends_cancelled(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    started = threading.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("export")
    def export(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)
        reasons.append(job.cancel.reason)
        job.enqueue("follow-up", {})  # must not be written: the job did not complete
        raise RuntimeError("interrupted")  # not retried: the job is cancelled

    [job_id] = enqueue(engine, queue, "export")
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)
    assert worker.claim() == 1
    assert started.wait(WAIT)
    with engine.begin() as conn:
        assert queue.cancel(conn, [job_id]).cancelling == [job_id]
    beat = worker.heartbeat()
    assert beat is not None and beat.lost == [job_id]
    assert worker.wait_for_handlers(WAIT)
    assert reasons == [CancelReason.CANCELLED]
    worker.flush()
    row = job_row(engine, job_id)
    assert (row.status, row.lease_token, row.worker_id, row.last_error) == (
        "cancelled",
        None,
        None,
        None,
    )
    assert metrics.outcomes("export")[JobOutcome.CANCELLED] == 1
    assert metrics.outcomes("export")[JobOutcome.RETRIED] == 0
    clock.advance(3600)
    assert worker.drain(timeout=WAIT) == 0
    assert jobs_by_status(engine) == {"cancelled": 1}


@pytest.mark.parametrize("ending", ["returns", "snoozes", "fails"])
def test_a_result_after_an_unnoticed_cancel_never_overwrites_it(
    engine: Engine,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
    ending: str,
) -> None:
    started, go = threading.Event(), threading.Event()
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("quick")
    def quick(job: JobContext) -> Snooze | None:
        started.set()
        assert go.wait(WAIT)
        if ending == "snoozes":
            return Snooze(60)
        if ending == "fails":
            raise ConnectionError("down")
        job.enqueue("follow-up", {})
        return None

    [job_id] = enqueue(engine, queue, "quick")
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)
    assert worker.claim() == 1
    assert started.wait(WAIT)
    with engine.begin() as conn:
        queue.cancel(conn, [job_id])
    go.set()  # the handler finishes before any heartbeat saw the cancellation
    assert worker.wait_for_handlers(WAIT)
    worker.flush()
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.lease_token, row.last_error) == (
        "cancelled",
        1,
        None,
        None,
    )
    assert metrics.outcomes("quick")[JobOutcome.CANCELLED] == 1
    assert jobs_by_status(engine) == {"cancelled": 1}  # no follow-up job either


def test_the_reclaimer_never_resurrects_a_cancelled_job(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    app = JobApp(Job, backoff=NO_JITTER)
    [job_id] = enqueue(engine, queue, "work")
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="dead", lease=30)
        queue.cancel(conn, [job_id])
    clock.advance(3600)  # its worker died: the lease expired long ago
    assert Reclaimer(app, engine, clock=clock).run_once() == []
    row = job_row(engine, job_id)
    assert (row.status, row.lease_token) == ("cancelled", job.lease_token)
    with engine.begin() as conn:
        assert queue.claim(conn, worker_id="w") == []
        assert queue.heartbeat_many(conn, [(job.id, job.lease_token)]).lost == [job_id]
    assert jobs_by_status(engine) == {"cancelled": 1}


def test_cancelled_jobs_are_pruned_after_their_window(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    ids = enqueue(engine, queue, "work", 3)
    with engine.begin() as conn:
        queue.cancel(conn, ids[:2])
    pruner = Pruner(engine, jobs=Job, retention=Retention(cancelled=3600), clock=clock)
    assert pruner.run_once().cancelled == 0
    clock.advance(3601)
    report = pruner.run_once()
    assert (report.cancelled, report.deleted) == (2, 2)
    assert jobs_by_status(engine) == {"pending": 1}


def test_cancel_waits_for_a_claim_in_progress_then_cancels_the_running_job(
    engine: Engine, queue: JobQueue
) -> None:
    [job_id] = enqueue(engine, queue, "work")
    outcome: list[Any] = []
    with engine.connect() as claimer:
        claiming = claimer.begin()
        [job] = queue.claim(claimer, worker_id="w")  # row locked, not committed yet

        def cancel() -> None:
            with engine.begin() as conn:
                outcome.append(queue.cancel(conn, [job_id]))

        thread = threading.Thread(target=cancel)
        thread.start()
        with engine.connect() as watcher:  # wait until the cancel waits on the claim's lock
            for _ in range(10_000):
                waiting = watcher.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%doomed%'"
                    )
                ).scalar()
                if waiting or not thread.is_alive():
                    break
                watcher.rollback()
                threading.Event().wait(0.01)
        claiming.commit()
    thread.join(WAIT)
    [result] = outcome
    assert result.cancelling == [job_id] and result.cancelled == []
    row = job_row(engine, job_id)
    assert (row.status, row.lease_token) == ("cancelled", job.lease_token)
    assert jobs_by_status(engine) == {"cancelled": 1}


async def test_async_worker_stops_a_cancelled_job(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    started = asyncio.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("stream")
    async def stream(job: JobContext) -> None:
        started.set()
        async with asyncio.timeout(WAIT):
            await job.cancel.wait_async()
        reasons.append(job.cancel.reason)
        job.cancel.raise_if_cancelled()

    aqueue = AsyncJobQueue(Job, clock=clock)
    async with async_engine.begin() as conn:
        job_id = (await aqueue.enqueue(conn, "stream", {})).id
        waiting_id = (await aqueue.enqueue(conn, "stream", {}, delay=60)).id
    metrics = CountingMetrics()
    worker = make_async_worker(app, metrics=metrics)
    assert await worker.claim() == 1
    await asyncio.wait_for(started.wait(), WAIT)
    async with async_engine.begin() as conn:
        result = await aqueue.cancel(conn, [job_id, waiting_id])
    assert (result.cancelling, result.cancelled) == ([job_id], [waiting_id])
    await worker.heartbeat()
    assert await worker.wait_for_handlers(WAIT)
    await worker.flush()
    assert reasons == [CancelReason.CANCELLED]
    assert metrics.outcomes("stream")[JobOutcome.CANCELLED] == 1
    assert job_row(engine, job_id).lease_token is None
    clock.advance(120)
    assert await worker.drain(timeout=WAIT) == 0
    assert jobs_by_status(engine) == {"cancelled": 2}
