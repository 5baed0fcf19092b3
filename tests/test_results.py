"""Job results against a real PostgreSQL: a handler's return value recorded with its job's
completion, read back by id, and waited for (`JobResults` / `AsyncJobResults`), woken by the
NOTIFY the worker sends at commit; behind PgBouncer, by reading every ``poll_interval``.

The waits that must be woken by a notification are given a ``poll_interval`` and a
``recheck`` longer than the test's whole timeout: a wait that was not woken fails it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import (
    AsyncJobQueue,
    AsyncWorker,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobQueue,
    JobStatus,
    PermanentError,
    Worker,
    connect_args,
)
from sa_outbox.worker import (
    AsyncJobResults,
    JobFailed,
    JobNotFound,
    JobResults,
    Reclaimer,
    ResultTimeout,
)

from .conftest import TEST_SCHEMA, Job
from .helpers import job_row, wait_until
from .test_steps import NO_JITTER, JobStep, enqueue, steps_table

__all__ = ["steps_table"]  # a fixture, used below by name

WAIT = 20.0
#: Longer than any wait here: a wait that needed it (not woken) fails its test.
NEVER = 600.0


def results_app(seen: collections.Counter[str] | None = None) -> JobApp:
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("quote")
    def quote(job: JobContext) -> Any:
        return {"order": job.payload["order"], "total": 42.5, "items": ("a", "b")}

    @app.handler("nothing")
    def nothing(job: JobContext) -> None:
        return None

    @app.handler("bad-card")
    def bad_card(job: JobContext) -> None:
        raise PermanentError("card declined")

    @app.handler("unstorable")
    def unstorable(job: JobContext) -> Any:
        return {"when": object()}

    return app


@pytest.fixture
def results(engine: Engine, steps_table: None) -> Iterator[JobResults]:
    with JobResults(engine, Job, steps=JobStep, poll_interval=NEVER, recheck=NEVER) as waiter:
        yield waiter


def counting_reads(waiter: JobResults) -> list[uuid.UUID]:
    """Count the reads of ``waiter`` (one per wake-up), by replacing its bound method."""
    reads: list[uuid.UUID] = []
    read = waiter.read

    def counted(job_id: uuid.UUID) -> Any:
        found = read(job_id)
        reads.append(job_id)
        return found

    waiter.read = counted  # type: ignore[method-assign]
    return reads


def wait_in_thread(waiter: JobResults, job_id: uuid.UUID) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(waiter.result(job_id, timeout=WAIT))
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, got


def test_a_returned_value_commits_with_the_completion_and_is_read_back(
    engine: Engine, steps_table: None, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    quoted = enqueue(engine, queue, "quote", {"order": 7})
    silent = enqueue(engine, queue, "nothing")
    assert make_worker(results_app()).drain(timeout=WAIT) == 2

    reader = JobQueue(Job, steps=JobStep)
    with engine.connect() as conn:
        found = reader.read_result(conn, quoted)
        assert found is not None and found.finished
        assert (found.status, found.value) == (
            JobStatus.SUCCEEDED,
            {"order": 7, "total": 42.5, "items": ["a", "b"]},
        )
        nothing = reader.read_result(conn, silent)
        assert nothing is not None and nothing.status is JobStatus.SUCCEEDED
        assert nothing.value is None
        assert reader.read_result(conn, uuid.uuid4()) is None
        # the job's succeeded and its result: one transaction
        xmins = conn.execute(
            text(
                f"SELECT (SELECT xmin::text FROM {TEST_SCHEMA}.jobs WHERE id = :id), "
                f"(SELECT xmin::text FROM {TEST_SCHEMA}.job_steps WHERE job_id = :id "
                "AND name = '@result')"
            ),
            {"id": quoted},
        ).one()
        assert xmins[0] == xmins[1]
        rows = conn.execute(text(f"SELECT count(*) FROM {TEST_SCHEMA}.job_steps")).scalar_one()
        assert rows == 1  # None records nothing


def test_a_value_that_is_not_json_fails_the_job_saying_so(
    engine: Engine, steps_table: None, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    job_id = enqueue(engine, queue, "unstorable")
    assert make_worker(results_app()).drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert row.status == "failed" and row.attempts == 1
    assert f"the value returned by job {job_id} (kind 'unstorable') is not JSON" in row.last_error


def test_a_wait_is_woken_by_the_workers_notification_at_commit(
    engine: Engine,
    results: JobResults,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
) -> None:
    job_id = enqueue(engine, queue, "quote", {"order": 3})
    reads = counting_reads(results)
    thread, got = wait_in_thread(results, job_id)
    wait_until(lambda: len(reads) >= 1, "the first read")  # it read the job pending, and waits

    assert make_worker(results_app()).drain(timeout=WAIT) == 1
    thread.join(WAIT)
    assert got == [{"order": 3, "total": 42.5, "items": ["a", "b"]}]


def test_many_waits_share_one_listen_connection_and_each_gets_its_own_result(
    engine: Engine,
    results: JobResults,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
) -> None:
    ids = [enqueue(engine, queue, "quote", {"order": n}) for n in range(12)]
    reads = counting_reads(results)
    waits = [wait_in_thread(results, job_id) for job_id in ids]
    wait_until(lambda: set(reads) == set(ids), "each first read")
    with engine.connect() as conn:
        listening = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN %sa_outbox_done_%' AND datname = current_database()"
            )
        ).scalar_one()
    assert listening == 1

    assert make_worker(results_app(), batch=5).drain(timeout=WAIT) == len(ids)
    for n, (thread, got) in enumerate(waits):
        thread.join(WAIT)
        assert got == [{"order": n, "total": 42.5, "items": ["a", "b"]}]


def test_a_failed_or_cancelled_job_raises_job_failed_with_its_error(
    engine: Engine,
    results: JobResults,
    queue: JobQueue,
    clock: Any,
    make_worker: Callable[..., Worker],
) -> None:
    failing = enqueue(engine, queue, "bad-card")
    waiting = enqueue(engine, queue, "quote", {"order": 1})
    reads = counting_reads(results)
    failed_wait = wait_in_thread(results, failing)
    cancelled_wait = wait_in_thread(results, waiting)
    wait_until(lambda: set(reads) == {failing, waiting}, "both first reads")

    assert make_worker(results_app(), kinds=["bad-card"]).drain(timeout=WAIT) == 1
    with engine.begin() as conn:  # cancelled in the caller's transaction: waits wake at commit
        assert JobQueue(Job, steps=JobStep).cancel(conn, [waiting]).cancelled == [waiting]
    for thread, _ in (failed_wait, cancelled_wait):
        thread.join(WAIT)
    [failed] = failed_wait[1]
    assert isinstance(failed, JobFailed) and failed.status is JobStatus.FAILED
    assert failed.error is not None and "card declined" in failed.error
    assert str(failed).startswith(f"job {failing} failed: ")
    [cancelled] = cancelled_wait[1]
    assert isinstance(cancelled, JobFailed) and cancelled.status is JobStatus.CANCELLED


def test_a_job_the_reclaimer_fails_at_max_attempts_wakes_its_wait(
    engine: Engine, results: JobResults, clock: Any
) -> None:
    # Its worker died holding it on its last attempt: the reclaimer, not a worker, ends it
    # failed, and announces it on the done channel as a worker would.
    queue = JobQueue(Job, clock=clock)
    with engine.begin() as conn:
        job_id = queue.enqueue(conn, "quote", {"order": 1}, max_attempts=1).id
    with engine.begin() as conn:
        [claimed] = queue.claim(conn, worker_id="gone", lease=30)
    assert claimed.id == job_id
    reads = counting_reads(results)
    thread, got = wait_in_thread(results, job_id)
    wait_until(lambda: len(reads) >= 1, "the first read")

    clock.advance(31)
    [reclaimed] = Reclaimer(results_app(), engine, clock=clock).run_once()
    assert reclaimed.status is JobStatus.FAILED
    thread.join(WAIT)  # woken by the notification: its recheck is NEVER
    [failed] = got
    assert isinstance(failed, JobFailed) and failed.status is JobStatus.FAILED
    assert failed.error is not None and "lease expired at" in failed.error


def test_a_wait_ends_in_result_timeout_and_an_unknown_job_in_job_not_found(
    engine: Engine, steps_table: None, queue: JobQueue
) -> None:
    job_id = enqueue(engine, queue, "quote", {"order": 1})
    with JobResults(engine, Job, steps=JobStep) as waiter:
        with pytest.raises(ResultTimeout, match=f"^job {job_id} did not finish within 0.2 s "):
            waiter.result(job_id, timeout=0.2)
        with pytest.raises(JobNotFound, match=f"^no job .* in {TEST_SCHEMA}.jobs$"):
            waiter.result(uuid.uuid4(), timeout=5)
    assert job_row(engine, job_id).status == "pending"  # waiting changes nothing


def test_bad_arguments_are_refused_in_one_line(engine: Engine, async_engine: AsyncEngine) -> None:
    with pytest.raises(InvalidArgumentType, match=r"^JobResults needs a sync Engine"):
        JobResults(async_engine, Job, steps=JobStep)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match=r"^AsyncJobResults needs an AsyncEngine"):
        AsyncJobResults(engine, Job, steps=JobStep)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="timeout"):
        JobResults(engine, Job, steps=JobStep).result(uuid.uuid4(), timeout=-1)
    with (
        pytest.raises(InvalidArgument, match=r"^read_result needs the steps table"),
        engine.connect() as conn,
    ):
        JobQueue(Job).read_result(conn, uuid.uuid4())


async def test_async_waits_are_woken_by_the_notification(
    engine: Engine,
    async_engine: AsyncEngine,
    steps_table: None,
    queue: JobQueue,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("double")
    async def double(job: JobContext) -> int:
        return int(job.payload["n"]) * 2

    ids = [enqueue(engine, queue, "double", {"n": n}) for n in range(3)]
    async with AsyncJobResults(
        async_engine, Job, steps=JobStep, poll_interval=NEVER, recheck=NEVER
    ) as waiter:
        reads: list[uuid.UUID] = []
        first_reads = asyncio.Event()
        read = waiter.read

        async def counted(job_id: uuid.UUID) -> Any:
            found = await read(job_id)
            reads.append(job_id)
            if set(reads) == set(ids):
                first_reads.set()
            return found

        waiter.read = counted  # type: ignore[method-assign]
        waits = [asyncio.create_task(waiter.result(i, timeout=WAIT)) for i in ids]
        # each wait made its first read (its job pending) before the worker runs them
        await asyncio.wait_for(first_reads.wait(), WAIT)
        assert await make_async_worker(app).drain(timeout=WAIT) == len(ids)
        assert await asyncio.gather(*waits) == [0, 2, 4]
        found = await waiter.read(ids[2])
        assert found is not None and found.value == 4
    async with async_engine.connect() as conn:
        async_reader = AsyncJobQueue(Job, steps=JobStep)
        again = await async_reader.read_result(conn, ids[1])
        assert again is not None and again.value == 2


def test_behind_pgbouncer_a_wait_reads_every_poll_interval_and_warns_once(
    engine: Engine,
    steps_table: None,
    pgbouncer_url: str,
    queue: JobQueue,
    make_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    pooled = create_engine(pgbouncer_url, connect_args=connect_args(transaction_pooler=True))
    job_id = enqueue(engine, queue, "quote", {"order": 9})
    try:
        with JobResults(pooled, Job, steps=JobStep, poll_interval=0.2) as waiter:
            reads = counting_reads(waiter)
            thread, got = wait_in_thread(waiter, job_id)
            warned = "notifications do not reach the LISTEN connection"
            wait_until(lambda: warned in caplog.text, "the warning")  # the probe found it deaf
            polled = len(reads)
            wait_until(lambda: len(reads) > polled + 1, "two more reads")  # every 0.2 s
            assert make_worker(results_app()).drain(timeout=WAIT) == 1
            thread.join(WAIT)
        assert got == [{"order": 9, "total": 42.5, "items": ["a", "b"]}]
        assert caplog.text.count(warned) == 1
    finally:
        pooled.dispose()
