"""`AsyncRelay`: its loop wakes up on NOTIFY, stops on request, and backs off from a down
broker without losing anything (the publishers' tests drive its `run_once` against brokers).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import AsyncOutbox, FakeClock, Outbox
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.queue import ClaimedEvent
from sa_outbox.relay import AsyncRelay, PublisherUnavailable

from .conftest import TEST_SCHEMA, OutboxEvent
from .helpers import event_rows

WAIT = 30.0


async def wait_until_listening(async_engine: AsyncEngine) -> None:
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND query LIKE :s"
    )
    for _ in range(int(WAIT * 100)):
        async with async_engine.connect() as conn:
            if (await conn.execute(query, {"s": f"%{TEST_SCHEMA}.outbox%"})).scalar_one():
                return
        await asyncio.sleep(0.01)  # polling a condition with a deadline, not a sleep-to-sync
    pytest.fail("the relay never listened")


async def test_async_relay_wakes_up_on_notify_and_stops(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    got: asyncio.Queue[ClaimedEvent] = asyncio.Queue()

    async def publish(event: ClaimedEvent) -> None:
        await got.put(event)

    relay = AsyncRelay(async_engine, OutboxEvent, CallablePublisher(publish), poll_interval=3600)
    runner = asyncio.create_task(relay.run())
    try:
        await wait_until_listening(async_engine)
        async with async_engine.begin() as conn:
            event_id = await AsyncOutbox(OutboxEvent).append(
                conn, event_type="E", aggregate_type="order", aggregate_id=1, payload={}
            )
        # Polling would take an hour: only the NOTIFY can wake the relay in time.
        event = await asyncio.wait_for(got.get(), WAIT)
        assert event.id == event_id
    finally:
        # stop() from another thread, as a signal handler of another loop might.
        threading.Thread(target=relay.stop).start()
        await asyncio.wait_for(runner, WAIT)
        await relay.aclose()
    [row] = event_rows(engine)
    assert row.published_at is not None


async def test_async_relay_backs_off_from_a_down_broker_and_loses_nothing(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    clock = FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    with engine.begin() as conn:
        ids = [
            Outbox(OutboxEvent).append(
                conn, event_type="E", aggregate_type="order", aggregate_id=i, payload={}
            )
            for i in range(3)
        ]
    tries = 0
    received: list[ClaimedEvent] = []
    done = asyncio.Event()

    def publish(event: ClaimedEvent) -> None:
        nonlocal tries
        tries += 1
        if tries <= 2:  # down for the first two batches
            raise PublisherUnavailable("connection refused")
        received.append(event)
        if len(received) == 3:
            done.set()

    relay = AsyncRelay(
        async_engine,
        OutboxEvent,
        CallablePublisher(publish),
        clock=clock,
        retry_initial=0.01,
        retry_max=0.01,
        listen=False,
    )
    runner = asyncio.create_task(relay.run())
    try:
        await asyncio.wait_for(done.wait(), WAIT)
    finally:
        relay.stop()
        await asyncio.wait_for(runner, WAIT)
        await relay.aclose()
    assert sorted(e.id for e in received) == sorted(ids)
    rows = event_rows(engine)
    # The two outages counted no attempt: only the publication that went through.
    assert all(r.published_at is not None and r.attempts == 1 for r in rows)


async def test_async_outbox_parks_and_requeues(engine: Engine, async_engine: AsyncEngine) -> None:
    clock = FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    outbox = AsyncOutbox(OutboxEvent, clock=clock)
    async with async_engine.begin() as conn:
        await outbox.append(conn, event_type="E", aggregate_type="o", aggregate_id=1, payload={})
    async with async_engine.begin() as conn:
        [event] = await outbox.claim(conn)
        [rejected] = await outbox.reject_many(
            conn, [(event.id, event.relay_token, "refused")], max_attempts=1
        )
    assert rejected.parked and rejected.attempts == 1
    async with async_engine.begin() as conn:
        [parked] = await outbox.parked(conn)
        assert parked.last_error == "refused"
        assert await outbox.claim(conn) == []
        assert await outbox.requeue_parked(conn, ids=[parked.id]) == [parked.id]
        [again] = await outbox.claim(conn)
        released = await outbox.release_many(conn, [(again.id, again.relay_token)], attempted=False)
    assert released.all_done
    [row] = event_rows(engine)
    assert (row.attempts, row.parked_at, row.relay_token) == (0, None, None)


async def test_the_async_relay_vacuums_the_outbox_past_its_threshold(
    engine: Engine, database_url: str
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.orm import Session

    from sa_outbox import VacuumPolicy

    with Session(engine) as session, session.begin():
        for i in range(150):
            Outbox(OutboxEvent).append(
                session,
                event_type="Placed",
                aggregate_type="order",
                aggregate_id=f"a{i}",
                payload={},
            )
    one = create_async_engine(database_url, pool_size=1, max_overflow=0)
    published: list[ClaimedEvent] = []
    relay = AsyncRelay(
        one, OutboxEvent, CallablePublisher(published.append), vacuum=VacuumPolicy(threshold=100)
    )
    try:
        while (await relay.run_once()).published:
            pass
        async with one.connect() as conn:  # the relay's one connection: exact statistics
            await conn.execute(text("SELECT pg_stat_force_next_flush()"))
        report = await relay.vacuum_once()
    finally:
        await relay.aclose()
        await one.dispose()
    assert len(published) == 150
    assert report is not None and report.vacuumed == [f"{TEST_SCHEMA}.outbox"]
