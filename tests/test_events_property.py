"""Property: committed outbox rows are exactly the events of committed work, in order.

Hypothesis draws programs of add / flush / savepoint / release / rollback-savepoint /
commit / rollback and runs each against the real database; a model of the transaction
(a stack of savepoints, each with the events added in it) predicts what must be there.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

import sa_outbox

from .conftest import TEST_SCHEMA, Order
from .helpers import event_rows
from .test_events import OrderPlaced, OrderShipped

steps = st.lists(
    st.sampled_from(
        [
            "add",
            "add",
            "add_new_order",
            "flush",
            "savepoint",
            "release",
            "rollback_to",
            "commit",
            "rollback",
        ]
    ),
    max_size=25,
)


def run(engine: Engine, program: list[str]) -> list[str]:
    """Run ``program``; return the carriers of the events that must be committed, in order."""
    factory = sessionmaker(engine)
    sa_outbox.install(factory)
    committed: list[str] = []
    counter = 0
    with factory() as session:
        session.begin()
        order = Order(customer=uuid.uuid4().hex)
        session.add(order)
        levels: list[list[str]] = [[]]  # events added at each savepoint level
        savepoints: list[Any] = []
        for step in program:
            if step in ("add", "add_new_order"):
                counter += 1
                if step == "add_new_order":
                    order = Order(customer=uuid.uuid4().hex)
                    session.add(order)
                event = OrderShipped if counter % 2 else OrderPlaced
                if event is OrderShipped:
                    session.add(OrderShipped(order=order, carrier=str(counter)))
                else:
                    session.add(OrderPlaced(order=order, total_cents=counter))
                levels[-1].append(str(counter))
            elif step == "flush":
                session.flush()
            elif step == "savepoint":
                savepoints.append(session.begin_nested())
                levels.append([])
            elif step == "release" and savepoints:
                savepoints.pop().commit()
                done = levels.pop()
                levels[-1].extend(done)
            elif step == "rollback_to" and savepoints:
                savepoints.pop().rollback()
                levels.pop()
                order = _surviving_order(session, order)
            elif step == "commit":
                session.commit()
                committed.extend(e for level in levels for e in level)
                levels, savepoints = [[]], []
                session.begin()
                order = Order(customer=uuid.uuid4().hex)
                session.add(order)
            elif step == "rollback":
                session.rollback()
                levels, savepoints = [[]], []
                session.begin()
                order = Order(customer=uuid.uuid4().hex)
                session.add(order)
        session.commit()
        committed.extend(e for level in levels for e in level)
    return committed


def _surviving_order(session: Session, order: Order) -> Order:
    # An order created inside a rolled-back savepoint is gone: later events need a live one.
    if order in session:
        return order
    fresh = Order(customer=uuid.uuid4().hex)
    session.add(fresh)
    return fresh


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(program=steps)
def test_committed_rows_are_exactly_the_committed_events_in_order(
    engine: Engine, program: list[str]
) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TEST_SCHEMA}.outbox, {TEST_SCHEMA}.orders"))
    expected = run(engine, program)
    rows = event_rows(engine)
    got = [str(r.payload.get("carrier", r.payload.get("total_cents"))) for r in rows]
    assert got == expected
