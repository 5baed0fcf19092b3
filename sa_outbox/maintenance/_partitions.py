"""Partition maintenance: create partitions ahead, drop whole partitions past retention.

`maintain_partitions` (and `amaintain_partitions` on an `AsyncEngine`) works on a table
declared with ``__partition_interval__`` (docs/partitions.md), on one connection:

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
statements, driven on a sync or an async connection.

Examples:
    report = maintain_partitions(engine, Job, ahead=3, retention=dt.timedelta(days=7))
    print(report.created, report.dropped, report.kept)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import MetaData, Table
from sqlalchemy.exc import DBAPIError

from .. import statements as st
from .._clock import Clock
from .._connect_args import harden
from .._exceptions import InvalidArgument
from .._pooler import prepare_for_pooler
from .._validation import count, duration
from ..ops import COMMIT, ROLLBACK, BoundOp, arun, run
from ..schema import TABLE_KIND_INFO_KEY, resolve_table
from ..schema._partition_ddl import (
    PartitionInterval,
    interval_start,
    next_start,
    partition_interval_of,
    partition_name,
)
from ..schema._storage import storage_of

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["PartitionReport", "amaintain_partitions", "maintain_partitions"]

#: Partitions kept ready beyond the current interval's, unless told otherwise.
DEFAULT_AHEAD = 3
DEFAULT_LOCK_TIMEOUT = dt.timedelta(seconds=5)
_LOCK_NOT_AVAILABLE = "55P03"


@dataclasses.dataclass
class PartitionReport:
    """What one maintenance run did to a table.

    ``created``: partitions created; ``moved``: rows moved from the default partition into
    each new partition that had some; ``dropped``: partitions dropped; ``kept``: partitions
    past retention kept because they hold unfinished work; ``busy``: partitions left for
    the next run because a lock was not granted within ``lock_timeout``; ``skipped``:
    another maintainer held the table's lock, so nothing was done.

    Examples:
        >>> PartitionReport("jobs", created=["jobs_p20300104"]).created
        ['jobs_p20300104']
    """

    table: str
    created: list[str] = dataclasses.field(default_factory=list)
    moved: dict[str, int] = dataclasses.field(default_factory=dict)
    dropped: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)
    busy: list[str] = dataclasses.field(default_factory=list)
    skipped: bool = False


# A maintenance generator yields statements (and is sent their results) and COMMIT /
# ROLLBACK (and is sent None); it is run with ``recover=True``: a database error of a
# statement rolls back and is thrown into it.
_Op = BoundOp[PartitionReport]


@dataclasses.dataclass(frozen=True)
class _Plan:
    table: Table
    kind: str
    interval: PartitionInterval
    storage: dict[str, int | float | bool] | None
    ahead: int
    retention: dt.timedelta | None
    clock: Clock | None
    lock_timeout: dt.timedelta


def _plan(
    target: object,
    ahead: int,
    retention: dt.timedelta | float | None,
    clock: Clock | None,
    lock_timeout: dt.timedelta | float,
) -> _Plan:
    table = resolve_table(target)
    interval = partition_interval_of(table)
    if interval is None:
        raise InvalidArgument(
            f"table {table.fullname!r} is not partitioned: give its model a "
            '__partition_interval__ ("hour", "day", "week" or "month"), see docs/partitions.md'
        )
    kind = table.info.get(TABLE_KIND_INFO_KEY)
    if kind not in ("job", "outbox"):
        raise InvalidArgument(f"table {table.fullname!r} is not a job or outbox table")
    return _Plan(
        table=table,
        kind=kind,
        interval=interval,
        storage=storage_of(table),
        ahead=count(ahead, "ahead", minimum=0, maximum=1000),
        retention=None if retention is None else duration(retention, "retention"),
        clock=clock,
        lock_timeout=duration(lock_timeout, "lock_timeout"),
    )


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def _locked_parent(plan: _Plan) -> BoundOp[Table]:
    """Check the table in the database; returns the parent as partitions are named from."""
    layout = (yield st.table_layout(plan.table)).one_or_none()
    yield COMMIT
    if layout is None:
        raise InvalidArgument(f"table {plan.table.fullname!r} does not exist")
    if layout.kind != "p":
        raise InvalidArgument(
            f"table {plan.table.fullname!r} is not partitioned in the database; create it "
            f"with op.create_job_queue / op.create_outbox(..., partition_interval=...)"
        )
    return Table(plan.table.name, MetaData(), schema=layout.schema)


def _maintain(plan: _Plan, parent: Table) -> _Op:
    report = PartitionReport(plan.table.fullname)
    now: dt.datetime = (yield st.select_now(plan.clock)).scalar_one()
    partitions = (yield st.list_partitions(parent)).all()
    yield COMMIT
    default = next((p.name for p in partitions if p.is_default), None)
    ranged = [p for p in partitions if p.lower is not None and p.upper is not None]

    lower = interval_start(now, plan.interval)
    for _ in range(plan.ahead + 1):
        upper = next_start(lower, plan.interval)
        if not any(p.lower < upper and lower < p.upper for p in ranged):
            name = partition_name(plan.table.name, lower, plan.interval)
            try:
                moved = yield from _create(plan, parent, default, name, lower, upper)
            except DBAPIError as exc:
                if _sqlstate(exc) != _LOCK_NOT_AVAILABLE:
                    raise
                report.busy.append(name)
            else:
                report.created.append(name)
                if moved:
                    report.moved[name] = moved
        lower = upper

    if plan.retention is not None:
        cutoff = now - plan.retention
        for partition in ranged:
            if partition.upper > cutoff:
                continue
            try:
                dropped = yield from _drop(plan, parent, partition.name)
            except DBAPIError as exc:
                if _sqlstate(exc) != _LOCK_NOT_AVAILABLE:
                    raise
                report.busy.append(partition.name)
            else:
                (report.dropped if dropped else report.kept).append(partition.name)
    return report


def _create(
    plan: _Plan,
    parent: Table,
    default: str | None,
    name: str,
    lower: dt.datetime,
    upper: dt.datetime,
) -> BoundOp[int]:
    """Create one partition; returns how many rows moved into it from the default one."""
    yield st.set_lock_timeout(plan.lock_timeout)
    moved = 0
    if default is not None:
        # No insert reaches the default partition while its rows are counted and moved.
        yield st.lock_partition(parent, default, "EXCLUSIVE")
        moved = (yield st.count_in_range(parent, default, lower, upper)).scalar_one()
    if moved:
        yield st.create_table_like(parent, name, plan.storage)
        yield st.move_rows(parent, default or "", name, lower, upper)
        yield st.attach_partition(parent, name, lower, upper)
    else:
        yield st.create_partition(parent, name, lower, upper, plan.storage)
    yield COMMIT
    return int(moved)


def _drop(plan: _Plan, parent: Table, name: str) -> BoundOp[bool]:
    """Drop one partition past retention unless it holds unfinished work; True if dropped."""
    # A first look without any lock, so a partition that stays costs no lock at all.
    unfinished = (yield st.has_unfinished_rows(parent, name, plan.kind)).scalar()
    yield COMMIT
    if unfinished:
        return False
    yield st.set_lock_timeout(plan.lock_timeout)
    yield st.detach_partition(parent, name)
    # Detached and locked: nothing can write to it now. Look again before dropping.
    if (yield st.has_unfinished_rows(parent, name, plan.kind)).scalar():
        yield ROLLBACK  # attached again, as it was
        return False
    yield st.drop_partition(parent, name)
    yield COMMIT
    return True


def _locked_run(plan: _Plan, parent: Table, locked: bool) -> _Op:
    if not locked:
        return PartitionReport(plan.table.fullname, skipped=True)
    return (yield from _maintain(plan, parent))


def maintain_partitions(
    engine: Engine,
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
        report = maintain_partitions(engine, Job, retention=dt.timedelta(days=7))
        report.created, report.dropped, report.kept
    """
    plan = _plan(table_or_model, ahead, retention, clock, lock_timeout)
    harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
    prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
    with engine.connect() as conn:
        parent: Table = run(conn, _locked_parent(plan), recover=True)
        locked = bool(conn.execute(st.partition_lock(parent)).scalar())
        conn.commit()
        try:
            report: PartitionReport = run(conn, _locked_run(plan, parent, locked), recover=True)
        finally:
            if locked:
                conn.rollback()
                conn.execute(st.partition_unlock(parent))
                conn.commit()
    return report


async def amaintain_partitions(
    engine: AsyncEngine,
    table_or_model: object,
    *,
    ahead: int = DEFAULT_AHEAD,
    retention: dt.timedelta | float | None = None,
    clock: Clock | None = None,
    lock_timeout: dt.timedelta | float = DEFAULT_LOCK_TIMEOUT,
) -> PartitionReport:
    """`maintain_partitions` on an `AsyncEngine`.

    Examples:
        report = await amaintain_partitions(async_engine, Job, retention=7 * 86400)
    """
    plan = _plan(table_or_model, ahead, retention, clock, lock_timeout)
    harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
    prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
    async with engine.connect() as conn:
        parent: Table = await arun(conn, _locked_parent(plan), recover=True)
        locked = bool((await conn.execute(st.partition_lock(parent))).scalar())
        await conn.commit()
        try:
            report: PartitionReport = await arun(
                conn, _locked_run(plan, parent, locked), recover=True
            )
        finally:
            if locked:
                await conn.rollback()
                await conn.execute(st.partition_unlock(parent))
                await conn.commit()
    return report
