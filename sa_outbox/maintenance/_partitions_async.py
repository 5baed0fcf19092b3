"""Partition maintenance: create partitions ahead, drop whole partitions past retention.

`amaintain_partitions` (on an `AsyncEngine`; `maintain_partitions` is generated from it)
works on a table declared with ``__partition_interval__`` (docs/partitions.md), on one
connection:

1. It takes the table's session-level advisory lock (`sa_outbox.statements.partition_lock`);
   if another maintainer holds it, it does nothing and says so (``report.skipped``).
2. It creates the partitions of the intervals from the one holding "now" (the clock's) to
   ``ahead`` intervals after it, each with the model's storage settings. If the ``DEFAULT``
   partition already holds rows of a range being created, those rows move into the new
   partition in the same transaction (the partition is created apart, filled from the
   default one, then attached), so nothing is lost and nothing is seen twice.
3. With a ``retention``, it drops each partition whose upper bound is older than
   ``now - retention``, but only if it holds no unfinished work (a ``pending`` or
   ``running`` job; an event neither published nor parked); such a partition is kept and
   reported. Dropping is a plain ``DETACH PARTITION`` (``CONCURRENTLY`` is refused on a
   table with a default partition), a second look for unfinished rows, then ``DROP
   TABLE``, in one short transaction under ``lock_timeout``: if the table stays locked by
   someone else longer than that, the partition is left for the next run (``busy``).

Each step is its own short transaction. Every step is written once, as a generator of
statements (`sa_outbox.ops.PartitionOps`), driven on a connection of either kind.

Examples:
    report = await amaintain_partitions(
        async_engine, Job, ahead=3, retention=dt.timedelta(days=7)
    )
    print(report.created, report.dropped, report.kept)
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import Table

from .. import statements as st
from .._clock import Clock
from .._connect_args import harden
from .._pooler import prepare_for_pooler
from ..ops import DEFAULT_AHEAD, DEFAULT_LOCK_TIMEOUT, PartitionOps, PartitionReport, arun

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["PartitionReport", "amaintain_partitions"]


async def amaintain_partitions(
    engine: AsyncEngine,
    table_or_model: object,
    *,
    ahead: int = DEFAULT_AHEAD,
    retention: dt.timedelta | float | None = None,
    clock: Clock | None = None,
    lock_timeout: dt.timedelta | float = DEFAULT_LOCK_TIMEOUT,
) -> PartitionReport:
    """Create the partitions of a partitioned job or outbox table ahead, drop old ones.

    ``ahead``: partitions kept ready beyond the current interval's. ``retention``: drop
    partitions whose whole range is older than this (``None``: drop nothing); a partition
    holding a pending or running job (an unpublished, unparked event) is kept and
    reported. ``clock`` says what "now" is (the database's by default, a `FakeClock` in
    tests). Run it from cron, a worker's schedule or ``sa-outbox partitions maintain``:
    one maintainer at a time works on a table, any other returns at once (``skipped``).

    Examples:
        report = await amaintain_partitions(async_engine, Job, retention=dt.timedelta(days=7))
        report.created, report.dropped, report.kept
    """
    ops = PartitionOps(
        table_or_model, ahead=ahead, retention=retention, clock=clock, lock_timeout=lock_timeout
    )
    harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
    prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
    async with engine.connect() as conn:
        parent: Table = await arun(conn, ops.parent(), recover=True)
        locked = bool((await conn.execute(st.partition_lock(parent))).scalar())
        await conn.commit()
        try:
            report: PartitionReport = await arun(conn, ops.maintain(parent, locked), recover=True)
        finally:
            if locked:
                await conn.rollback()
                await conn.execute(st.partition_unlock(parent))
                await conn.commit()
    return report
