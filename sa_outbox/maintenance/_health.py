"""Table health: the numbers that tell an operator the queue is rotting before it falls over.

`table_health` reads, on one connection: row counts by job status and by outbox state, dead
tuples and the last (auto)vacuum / (auto)analyze (``pg_stat_user_tables``), table and index
sizes, the age of the oldest ready pending job, and the sessions holding back the xmin
horizon (``pg_stat_activity.backend_xmin``), which keep vacuum from removing dead rows.
A partitioned table's statistics are its partitions': summed, and listed one by one.

Examples:
    with engine.connect() as conn:
        report = table_health(conn, jobs=Job, outbox=OutboxEvent)
    print(report.jobs.dead_tuples, report.oldest_xmin)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from .. import statements as st
from .._clock import Clock
from .._exceptions import InvalidArgument
from ..schema import JobStatus, resolve_table

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = ["HealthReport", "PartitionHealth", "TableHealth", "XminHolder", "table_health"]


@dataclasses.dataclass(frozen=True)
class PartitionHealth:
    """One partition's vacuum statistics and sizes (`TableHealth.partitions`).

    ``bound`` is its bound as PostgreSQL prints it (``FOR VALUES FROM (…) TO (…)``,
    ``DEFAULT``; ``None`` for a child of a table with inheritance). Statistics are ``None``
    where PostgreSQL has none yet.

    Examples:
        >>> PartitionHealth("public.jobs_default", "DEFAULT", 0, 12, None, None, None, None,
        ...                 16384, 8192, 8192).dead_tuples
        12
    """

    table: str
    bound: str | None
    live_tuples: int | None
    dead_tuples: int | None
    last_vacuum: dt.datetime | None
    last_autovacuum: dt.datetime | None
    last_analyze: dt.datetime | None
    last_autoanalyze: dt.datetime | None
    total_bytes: int
    table_bytes: int
    index_bytes: int


@dataclasses.dataclass(frozen=True)
class TableHealth:
    """One table's row counts, vacuum statistics and sizes.

    ``rows`` maps each job status (jobs) or ``published`` / ``unpublished`` / ``parked``
    (outbox) to a count. Statistics are ``None`` where PostgreSQL has none yet.
    ``oldest_pending_age`` is set for a job table only (``None`` when nothing is ready).

    For a partitioned table (the parent holds no rows), the tuples and sizes are the sums
    over its partitions, the last (auto)vacuum and (auto)analyze the most recent of any of
    them, and ``partitions`` has each partition's own (by name; empty for a plain table):
    a partition that autovacuum has not reached shows there.

    Examples:
        >>> TableHealth("jobs", {"pending": 1}, 1, 0, None, None, None, None, 8192, 0, 8192)
        ... # doctest: +ELLIPSIS
        TableHealth(table='jobs', rows={'pending': 1}, live_tuples=1, dead_tuples=0, ...)
    """

    table: str
    rows: dict[str, int]
    live_tuples: int | None
    dead_tuples: int | None
    last_vacuum: dt.datetime | None
    last_autovacuum: dt.datetime | None
    last_analyze: dt.datetime | None
    last_autoanalyze: dt.datetime | None
    total_bytes: int
    table_bytes: int
    index_bytes: int
    oldest_pending_age: dt.timedelta | None = None
    partitions: tuple[PartitionHealth, ...] = ()


@dataclasses.dataclass(frozen=True)
class XminHolder:
    """A session whose snapshot holds back the xmin horizon (vacuum keeps what it can see).

    ``xmin_age`` is in transactions (``age(backend_xmin)``); ``transaction_age`` is how long
    its transaction has been open.

    Examples:
        >>> XminHolder(4242, "idle in transaction", 12, None, None, None).pid
        4242
    """

    pid: int
    state: str | None
    xmin_age: int
    transaction_start: dt.datetime | None
    query_start: dt.datetime | None
    transaction_age: dt.timedelta | None


@dataclasses.dataclass(frozen=True)
class HealthReport:
    """`table_health`'s answer: the tables asked for and the xmin holders, oldest first.

    Examples:
        >>> HealthReport(jobs=None, outbox=None, xmin_holders=[]).oldest_xmin is None
        True
    """

    jobs: TableHealth | None
    outbox: TableHealth | None
    xmin_holders: list[XminHolder]

    @property
    def oldest_xmin(self) -> XminHolder | None:
        """The session holding the horizon furthest back, if any."""
        return self.xmin_holders[0] if self.xmin_holders else None


def table_health(
    conn: Connection,
    *,
    jobs: object | None = None,
    outbox: object | None = None,
    clock: Clock | None = None,
    holders: int = 5,
) -> HealthReport:
    """Read the health of the job table and/or the outbox table on ``conn``.

    Only reads; run it on its own connection (it opens a transaction, as any query does).
    On an `AsyncConnection`: ``await conn.run_sync(lambda c: table_health(c, jobs=Job))``.

    Examples:
        with engine.connect() as conn:
            report = table_health(conn, jobs=Job)
        report.jobs.rows["pending"], report.jobs.oldest_pending_age
    """
    if jobs is None and outbox is None:
        raise InvalidArgument("table_health needs a job model (jobs=) or an outbox (outbox=)")
    job_health = None
    if jobs is not None:
        counted: Any = conn.execute(st.count_jobs_by_status(jobs))
        found: dict[str, int] = {str(status): n for status, n in counted}
        rows = {str(s): found.get(str(s), 0) for s in JobStatus}
        age = conn.execute(st.oldest_ready_pending_age(jobs, clock=clock)).scalar()
        job_health = _stats(conn, jobs, rows, age)
    outbox_health = None
    if outbox is not None:
        published, unpublished, parked = conn.execute(st.count_events_by_state(outbox)).one()
        rows = {"published": published, "unpublished": unpublished, "parked": parked}
        outbox_health = _stats(conn, outbox, rows, None)
    found_holders = [
        XminHolder(
            pid=r.pid,
            state=r.state,
            xmin_age=r.xmin_age,
            transaction_start=r.xact_start,
            query_start=r.query_start,
            transaction_age=r.transaction_age,
        )
        for r in conn.execute(st.xmin_holders(holders))
    ]
    return HealthReport(jobs=job_health, outbox=outbox_health, xmin_holders=found_holders)


def _stats(
    conn: Connection, target: object, rows: dict[str, int], age: dt.timedelta | None
) -> TableHealth:
    r = conn.execute(st.table_stats(target)).one_or_none()
    if r is None:
        raise InvalidArgument(f"table {resolve_table(target).fullname!r} does not exist")
    partitions: tuple[PartitionHealth, ...] = ()
    if r.partitions:
        partitions = tuple(
            PartitionHealth(
                table=p.name,
                bound=p.bound,
                live_tuples=p.live_tuples,
                dead_tuples=p.dead_tuples,
                last_vacuum=p.last_vacuum,
                last_autovacuum=p.last_autovacuum,
                last_analyze=p.last_analyze,
                last_autoanalyze=p.last_autoanalyze,
                total_bytes=p.total_bytes,
                table_bytes=p.table_bytes,
                index_bytes=p.index_bytes,
            )
            for p in conn.execute(st.partition_stats(target))
        )
    return TableHealth(
        table=r.name,
        rows=rows,
        live_tuples=r.live_tuples,
        dead_tuples=r.dead_tuples,
        last_vacuum=r.last_vacuum,
        last_autovacuum=r.last_autovacuum,
        last_analyze=r.last_analyze,
        last_autoanalyze=r.last_autoanalyze,
        total_bytes=r.total_bytes,
        table_bytes=r.table_bytes,
        index_bytes=r.index_bytes,
        oldest_pending_age=age,
        partitions=partitions,
    )
