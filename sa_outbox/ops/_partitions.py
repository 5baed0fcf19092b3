"""`PartitionOps`: partition maintenance's steps, each a generator over statements.

See `sa_outbox.maintenance.maintain_partitions` for what a run does; the operations yield
`COMMIT` and `ROLLBACK` between steps and are driven with ``recover=True`` (a statement's
database error rolls back and is thrown into the operation, which may go on).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import MetaData, Table
from sqlalchemy.exc import DBAPIError

from .. import statements as st
from .._clock import Clock
from .._exceptions import InvalidArgument
from .._validation import count, duration
from ..schema import TABLE_KIND_INFO_KEY, resolve_table
from ..schema._partition_ddl import (
    PartitionInterval,
    interval_start,
    next_start,
    partition_interval_of,
    partition_name,
)
from ..schema._storage import storage_of
from ._drive import COMMIT, ROLLBACK, BoundOp

__all__ = ["DEFAULT_AHEAD", "DEFAULT_LOCK_TIMEOUT", "PartitionOps", "PartitionReport"]

#: Partitions kept ready beyond the current interval's, unless told otherwise.
DEFAULT_AHEAD = 3
#: How long a partition's DDL waits for its lock before the partition is left for later.
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


class PartitionOps:
    """Partition maintenance of one partitioned job or outbox table, as two operations.

    `parent` checks the table in the database (it returns the parent table partitions
    are named from); `maintain` creates partitions ahead and drops those past
    ``retention`` (see `sa_outbox.maintenance.maintain_partitions`, which runs both
    under the table's advisory lock). Drive them with ``recover=True``.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base):
        ...     __tablename__ = "jobs"
        ...     __partition_interval__ = "day"
        >>> ops = PartitionOps(Job, ahead=2, retention=7 * 86400)
        >>> ops.table.name, ops.ahead, ops.retention
        ('jobs', 2, datetime.timedelta(days=7))
    """

    def __init__(
        self,
        table_or_model: object,
        *,
        ahead: int = DEFAULT_AHEAD,
        retention: dt.timedelta | float | None = None,
        clock: Clock | None = None,
        lock_timeout: dt.timedelta | float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self._plan = _plan(table_or_model, ahead, retention, clock, lock_timeout)

    @property
    def table(self) -> Table:
        """The partitioned table (as declared)."""
        return self._plan.table

    @property
    def ahead(self) -> int:
        """Partitions kept ready beyond the current interval's."""
        return self._plan.ahead

    @property
    def retention(self) -> dt.timedelta | None:
        """Partitions wholly older than this are dropped (``None``: none)."""
        return self._plan.retention

    def parent(self) -> BoundOp[Table]:
        """Check the table in the database; returns the parent partitions are named from."""
        return _locked_parent(self._plan)

    def maintain(self, parent: Table, locked: bool) -> BoundOp[PartitionReport]:
        """Create and drop partitions (``locked``: the caller holds the table's lock;
        otherwise the report says ``skipped`` and nothing is done)."""
        return _locked_run(self._plan, parent, locked)
