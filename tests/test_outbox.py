"""The outbox's claim → publish → mark contract against a real PostgreSQL (article, section 5)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sa_outbox import FakeClock, LeaseLost, Outbox

from .conftest import OutboxEvent
from .helpers import event_rows


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def outbox(clock: FakeClock) -> Outbox:
    return Outbox(OutboxEvent, clock=clock)


def append(conn: object, outbox: Outbox, n: int, aggregate: str = "1") -> list[object]:
    return [
        outbox.append(
            conn,
            event_type="OrderPlaced",
            aggregate_type="order",  # type: ignore[arg-type]
            aggregate_id=aggregate,
            payload={"n": i},
            headers={"trace": f"t{i}"},
        )
        for i in range(n)
    ]


def test_events_keep_the_order_they_were_added_in(engine: Engine, outbox: Outbox) -> None:
    with Session(engine) as session, session.begin():
        ids = append(session, outbox, 20)
    with engine.begin() as conn:
        events = outbox.claim(conn, batch=100)
    assert [e.id for e in events] == ids
    assert [e.payload["n"] for e in events] == list(range(20))
    assert events[0].headers == {"trace": "t0"} and events[0].message_id == str(ids[0])
    assert all(e.attempts == 1 for e in events)


def test_rollback_leaves_no_event(engine: Engine, outbox: Outbox) -> None:
    with engine.connect() as conn, conn.begin() as tx:
        append(conn, outbox, 3)
        tx.rollback()
    assert event_rows(engine) == []


def test_claim_does_not_mark_published_and_mark_is_fenced(
    engine: Engine, outbox: Outbox, clock: FakeClock
) -> None:
    with engine.begin() as conn:
        [event_id] = append(conn, outbox, 1)
    with engine.begin() as conn:
        [first] = outbox.claim(conn, lease=30)
    [row] = event_rows(engine)
    assert row.published_at is None and row.relay_token == first.relay_token
    with engine.begin() as conn:  # a second relay sees nothing while the lease lives
        assert outbox.claim(conn) == []
    clock.advance(31)  # the first relay died between publish and mark
    with engine.begin() as conn:
        [second] = outbox.claim(conn)
    assert second.id == event_id and second.attempts == 2  # re-published: at-least-once
    with engine.begin() as conn, pytest.raises(LeaseLost, match="outbox event"):
        outbox.mark_published(conn, first.id, first.relay_token)
    with engine.begin() as conn:
        outbox.mark_published(conn, second.id, second.relay_token)
    [row] = event_rows(engine)
    assert row.published_at == clock.now() and row.relay_token is None
    with engine.begin() as conn:
        assert outbox.claim(conn) == []


def test_mark_published_many(engine: Engine, outbox: Outbox, clock: FakeClock) -> None:
    with engine.begin() as conn:
        append(conn, outbox, 3)
    with engine.begin() as conn:
        events = outbox.claim(conn, batch=2)
        result = outbox.mark_published_many(conn, [(e.id, e.relay_token) for e in events])
    assert result.done == [e.id for e in events] and result.lost == []
    with engine.begin() as conn:
        [rest] = outbox.claim(conn)
        again = outbox.mark_published_many(
            conn, [(events[0].id, events[0].relay_token), (rest.id, rest.relay_token)]
        )
    assert (again.done, again.lost) == ([rest.id], [events[0].id])
    assert all(r.published_at is not None for r in event_rows(engine))


def test_prune_removes_only_old_published_events(
    engine: Engine, outbox: Outbox, clock: FakeClock
) -> None:
    with engine.begin() as conn:
        append(conn, outbox, 4)
    with engine.begin() as conn:
        events = outbox.claim(conn, batch=3)
        outbox.mark_published_many(conn, [(e.id, e.relay_token) for e in events[:2]])
    clock.advance(dt.timedelta(days=2))
    with engine.begin() as conn:
        assert outbox.prune(conn, older_than=dt.timedelta(days=3)) == 0
        assert outbox.prune(conn, older_than=dt.timedelta(days=1), batch=1) == 1
        assert outbox.prune(conn, older_than=dt.timedelta(days=1)) == 1
    rows = event_rows(engine)
    assert len(rows) == 2 and all(r.published_at is None for r in rows)  # unpublished stay


def test_append_events_inserts_many_in_input_order(engine: Engine, clock: FakeClock) -> None:
    from sa_outbox.statements import NewEvent, append_events

    events = [NewEvent(f"E{i}", "order", i % 3, {"i": i}, {"h": i}) for i in range(50)]
    stmt, ids = append_events(OutboxEvent, events, clock=clock)
    with engine.begin() as conn:
        assert {row.id for row in conn.execute(stmt)} == set(ids)
    rows = event_rows(engine)
    assert [r.id for r in rows] == ids  # seq follows input order
    assert [r.event_type for r in rows] == [f"E{i}" for i in range(50)]
    assert rows[7].payload == {"i": 7} and rows[7].headers == {"h": 7}
    assert rows[7].aggregate_id == "1" and rows[7].created_at == clock.now()
