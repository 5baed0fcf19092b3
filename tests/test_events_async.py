"""Domain events and enqueue on AsyncSession: the same hooks, through the sync session inside."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

import sa_outbox
from sa_outbox import enqueue

from .conftest import Job, Order
from .helpers import event_rows, jobs_by_status
from .test_events import OrderPlaced, OrderShipped


async def test_async_sessionmaker(engine: Engine, async_engine: AsyncEngine) -> None:
    factory = async_sessionmaker(async_engine)
    sa_outbox.install(factory, job_model=Job)
    async with factory() as session, session.begin():
        order = Order(customer="async-ana")
        session.add(order)
        session.add(OrderPlaced(order=order, total_cents=700))
        await session.flush()
        result = await enqueue(session, "send-confirmation", {"order": order.id})
        again = await enqueue(session, "x", {}, deduplication_key="k")
        duplicate = await enqueue(session, "x", {}, deduplication_key="k")
        session.add(OrderShipped(order=order, carrier="async"))
    assert result.inserted and again.inserted and not duplicate.inserted
    rows = event_rows(engine)
    assert [r.event_type for r in rows] == ["OrderPlaced", "order.shipped"]
    assert rows[0].aggregate_id == rows[1].aggregate_id != "None"
    assert jobs_by_status(engine) == {"pending": 2}


async def test_async_rollback_leaves_nothing(engine: Engine, async_engine: AsyncEngine) -> None:
    factory = async_sessionmaker(async_engine)
    sa_outbox.install(factory)
    with pytest.raises(RuntimeError):
        async with factory() as session, session.begin():
            order = Order(customer="async-bia")
            session.add_all([order, OrderPlaced(order=order, total_cents=1)])
            await session.flush()
            await enqueue(session, "k", {}, model=Job)
            raise RuntimeError("boom")
    assert event_rows(engine) == [] and jobs_by_status(engine) == {}


async def test_async_session_instance_and_subclass(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    class AppAsyncSession(AsyncSession):
        pass

    sa_outbox.install(AppAsyncSession)
    async with AppAsyncSession(async_engine) as session, session.begin():
        order = Order(customer="async-subclass")
        session.add_all([order, OrderPlaced(order=order, total_cents=1)])
    plain = AsyncSession(async_engine)
    sa_outbox.install(plain)
    async with plain, plain.begin():
        order = Order(customer="async-instance")
        plain.add_all([order, OrderPlaced(order=order, total_cents=2)])
    assert [r.payload["total_cents"] for r in event_rows(engine)] == [1, 2]
    # The plain AsyncSession class itself was not touched: other sessions stay hook-free.
    assert AsyncSession.sync_session_class.__name__ == "Session"
