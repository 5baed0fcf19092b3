"""A claim that checks the paused queues still walks a ready index behind 1,000,000 jobs.

The table of tests/test_claim_plans.py (built again for this module), with a paused-queue
table beside it: nothing paused, and one queue paused that holds no ready job. Each shape's
plan, custom and generic, must read the jobs through a ready index under a ``Limit``, as
without the check; the check itself is an anti-join on the small table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox.schema import QueuePauseMixin
from sa_outbox.statements import claim_jobs, complete_and_claim_jobs

from .test_claim_plans import (
    BATCH,
    SCHEMA,
    SHAPES,
    Job,
    _branches,
    assert_walks_a_ready_index,
    big,
    nodes,
    plan_of,
)

__all__ = ["big"]  # the module's fixture, imported: the table is built for this module too


class ControlBase(DeclarativeBase):
    pass


class PausedQueue(QueuePauseMixin, ControlBase):
    __tablename__ = "paused_queues"
    __table_schema__ = SCHEMA


@pytest.fixture(scope="module", params=["nothing paused", "an empty queue paused"])
def paused(request: pytest.FixtureRequest, big: Engine) -> Iterator[Engine]:
    ControlBase.metadata.create_all(big)
    if request.param != "nothing paused":
        with big.begin() as conn:
            conn.execute(text(f"INSERT INTO {SCHEMA}.paused_queues (queue) VALUES ('idle')"))
    with big.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"ANALYZE {SCHEMA}.paused_queues"))
    yield big
    ControlBase.metadata.drop_all(big)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_paused_check_keeps_the_walk(paused: Engine, shape: str, mode: str) -> None:
    options: dict[str, Any] = SHAPES[shape]
    statement = claim_jobs(Job, worker_id="w", batch=BATCH, paused=PausedQueue, **options)
    assert_walks_a_ready_index(plan_of(paused, statement, mode), _branches(options))


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_the_workers_complete_and_claim_keeps_it_too(paused: Engine, mode: str) -> None:
    pairs = [(uuid.uuid4(), uuid.uuid4())]
    options: dict[str, Any] = SHAPES["several kinds"]
    statement = complete_and_claim_jobs(
        Job, pairs, worker_id="w", batch=BATCH, paused=PausedQueue, **options
    )
    plan = plan_of(paused, statement, mode)
    claim = next(
        node
        for _, node in nodes(plan)
        if node.get("Subplan Name") == "CTE claimed" or node.get("CTE Name") == "claimed"
    )
    assert_walks_a_ready_index(claim, _branches(options))
