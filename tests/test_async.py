"""The asyncio executors run the same operations on AsyncConnection and AsyncSession."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from sa_outbox import AsyncJobQueue, AsyncOutbox, Backoff, FakeClock, JobStatus, LeaseLost, NewJob

from .conftest import Job, OutboxEvent


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_async_lease_loss_scenario(async_engine: AsyncEngine, clock: FakeClock) -> None:
    queue = AsyncJobQueue(Job, clock=clock, backoff=Backoff(jitter=0))
    async with async_engine.begin() as conn:
        created = await queue.enqueue(conn, "work", {"x": 1}, deduplication_key="only-once")
        dup = await queue.enqueue(conn, "work", {"x": 1}, deduplication_key="only-once")
    assert created.inserted and not dup.inserted
    async with async_engine.begin() as conn:
        [a] = await queue.claim(conn, worker_id="A", lease=30)
    clock.advance(31)
    async with async_engine.begin() as conn:
        [back] = await queue.reclaim_expired(conn)
        assert back.status == JobStatus.PENDING
    clock.advance(Backoff(jitter=0).delay(1))
    async with async_engine.begin() as conn:
        [b] = await queue.claim(conn, worker_id="B")
    async with async_engine.begin() as conn:
        with pytest.raises(LeaseLost):
            await queue.complete(conn, a.id, a.lease_token)
        with pytest.raises(LeaseLost):
            await queue.heartbeat(conn, a.id, a.lease_token)
        await queue.heartbeat(conn, b.id, b.lease_token)
        await queue.complete(conn, b.id, b.lease_token)
        assert (await queue.counts(conn))[JobStatus.SUCCEEDED] == 1


async def test_async_session_and_batched_operations(
    async_engine: AsyncEngine, clock: FakeClock
) -> None:
    queue = AsyncJobQueue(Job, clock=clock)
    async with AsyncSession(async_engine) as session, session.begin():
        results = await queue.enqueue_many(session, [NewJob("k", {"i": i}) for i in range(6)])
    assert all(r.inserted for r in results)
    async with AsyncSession(async_engine) as session, session.begin():
        jobs = await queue.claim(session, worker_id="w", batch=6)
        assert [j.id for j in jobs] == [r.id for r in results]
        beat = await queue.heartbeat_many(session, [(j.id, j.lease_token) for j in jobs])
        assert beat.all_done
        retried = await queue.retry(session, jobs[0].id, jobs[0].lease_token, error="e", delay=0)
        assert retried.status == JobStatus.PENDING
        await queue.fail(session, jobs[1].id, jobs[1].lease_token, error="bad")
        done = await queue.complete_many(session, [(j.id, j.lease_token) for j in jobs])
        assert done.lost == [jobs[0].id, jobs[1].id] and len(done.done) == 4
        assert await queue.requeue_failed(session) == [jobs[1].id]
    clock.advance(8 * 86400)
    async with async_engine.begin() as conn:
        assert await queue.prune(conn, older_than=86400) == 4


async def test_async_concurrent_claimers_take_each_job_once(
    async_engine: AsyncEngine, clock: FakeClock
) -> None:
    queue = AsyncJobQueue(Job, clock=clock)
    async with async_engine.begin() as conn:
        await queue.enqueue_many(conn, [NewJob("k", {}) for _ in range(200)])

    async def claimer(name: str) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        while True:
            async with async_engine.begin() as conn:
                jobs = await queue.claim(conn, worker_id=name, batch=9)
            if not jobs:
                return got
            got += [j.id for j in jobs]

    results = await asyncio.gather(*(claimer(f"w{i}") for i in range(6)))
    everything = [i for chunk in results for i in chunk]
    assert len(everything) == 200 and len(set(everything)) == 200


async def test_async_outbox(async_engine: AsyncEngine, clock: FakeClock) -> None:
    outbox = AsyncOutbox(OutboxEvent, clock=clock)
    async with async_engine.begin() as conn:
        first = await outbox.append(
            conn, event_type="E", aggregate_type="a", aggregate_id=1, payload={}
        )
        second = await outbox.append(
            conn, event_type="E", aggregate_type="a", aggregate_id=uuid.UUID(int=7), payload=[1]
        )
    async with async_engine.begin() as conn:
        events = await outbox.claim(conn)
        assert [e.id for e in events] == [first, second]
        assert events[1].aggregate_id == str(uuid.UUID(int=7))
        await outbox.mark_published(conn, events[0].id, events[0].relay_token)
        with pytest.raises(LeaseLost):
            await outbox.mark_published(conn, events[0].id, events[0].relay_token)
        result = await outbox.mark_published_many(conn, [(events[1].id, events[1].relay_token)])
        assert result.all_done
        clock.advance(10)
        assert await outbox.prune(conn, older_than=5) == 2
