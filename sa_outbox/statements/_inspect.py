"""Read-only statements that show a running queue: counts, ages, workers, listings.

Pure builders, like the rest of the query builder: they return SQL, never run it. What an
operator asks (``sa-outbox status``, ``jobs list``, ``queues``) and what a dashboard or a
metrics exporter would ask is one of these, run by ``sa_outbox.queue._inspect``.

Statuses are read as text (``CAST(status AS TEXT)``), so a status added to the enum later
is counted too, not an error.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    Interval,
    Select,
    Text,
    bindparam,
    cast,
    column,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy import text as sql_text
from sqlalchemy.sql.elements import TextClause

from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import count, duration, name_filter
from ..schema import JobStatus
from ._common import as_uuid, in_names, interval, now_of, table_of

#: What a worker started by ``sa-outbox worker`` puts before its id in ``application_name``.
WORKER_APPLICATION_PREFIX = "sa-outbox worker "

#: The columns of a job that a listing shows (``last_error`` only as its first line).
_JOB_LISTED = (
    "id",
    "queue",
    "kind",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "run_at",
    "lease_until",
    "worker_id",
    "created_at",
    "updated_at",
)

_EVENT_LISTED = (
    "id",
    "seq",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "attempts",
    "relay_until",
    "published_at",
    "parked_at",
    "created_at",
)


def _first_line(column: Any) -> Any:
    return func.split_part(column, literal("\n", Text), 1).label("error_line")


def _status_text(t: Any) -> Any:
    return cast(t.c.status, Text)


def _status_literal(t: Any, status: JobStatus) -> Any:
    """``status`` written into the SQL, so that a generic plan still matches a partial
    index's ``WHERE status = '…'`` (a bound parameter would not)."""
    return literal_column(f"'{status.value}'", t.c.status.type)


def count_jobs_by_queue_kind_status(target: object) -> Select[Any]:
    """``queue, kind, status, count(*)`` of every job, grouped and in that order.

    Reads the whole table (there is no index for it): fine for a status report, but run it
    no more often than every few seconds on a table of millions of rows.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "GROUP BY jobs.queue, jobs.kind" in str(count_jobs_by_queue_kind_status(Job))
        True
    """
    t = table_of(target)
    status = _status_text(t)
    return (
        select(t.c.queue, t.c.kind, status.label("status"), func.count().label("jobs"))
        .group_by(t.c.queue, t.c.kind, status)
        .order_by(t.c.queue, t.c.kind, status)
    )


def job_alarms(
    target: object, *, failed_within: dt.timedelta | float = 3600, clock: Clock | None = None
) -> Select[Any]:
    """One row of what needs an operator: ``oldest_ready_age``, ``failed_recently``,
    ``expired_leases``.

    ``oldest_ready_age`` is how long the oldest ready pending job (``run_at`` passed) has
    waited (NULL when none is ready); ``failed_recently`` counts jobs that went to ``failed``
    within ``failed_within`` (by ``updated_at``); ``expired_leases`` counts ``running`` jobs
    whose lease has expired (their worker died or stalled; the reclaimer will take them).
    Each part is served by one of the table's partial indexes.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(job_alarms(Job, failed_within=600))
        >>> "lease_until <" in sql and "min(jobs.run_at)" in sql
        True
    """
    window = duration(failed_within, "failed_within")
    t = table_of(target)
    now = now_of(clock)
    oldest = select(now - func.min(t.c.run_at)).where(
        t.c.status == JobStatus.PENDING, t.c.run_at <= now
    )
    failed = select(func.count()).where(
        t.c.status == JobStatus.FAILED, t.c.updated_at >= now - interval(window)
    )
    expired = select(func.count()).where(t.c.status == JobStatus.RUNNING, t.c.lease_until < now)
    return select(
        oldest.scalar_subquery().label("oldest_ready_age"),
        failed.scalar_subquery().label("failed_recently"),
        expired.scalar_subquery().label("expired_leases"),
    )


def workers_holding_jobs(target: object, *, clock: Clock | None = None) -> Select[Any]:
    """The workers that hold ``running`` jobs now: ``worker_id, running, expired,
    lease_until`` (the latest lease), by worker id.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "GROUP BY jobs.worker_id" in str(workers_holding_jobs(Job))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    return (
        select(
            t.c.worker_id,
            func.count().label("running"),
            func.count().filter(t.c.lease_until < now).label("expired"),
            func.max(t.c.lease_until).label("lease_until"),
        )
        .where(t.c.status == JobStatus.RUNNING)
        .group_by(t.c.worker_id)
        .order_by(t.c.worker_id)
    )


_CONNECTED_WORKERS = f"""\
SELECT substr(a.application_name, {len(WORKER_APPLICATION_PREFIX) + 1}) AS worker_id,
       count(*) AS connections, min(a.backend_start) AS connected_since,
       string_agg(DISTINCT host(a.client_addr), ', ') AS client_addr
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND starts_with(a.application_name, :worker_prefix)
GROUP BY a.application_name
ORDER BY a.application_name"""


def connected_workers() -> TextClause:
    """The workers connected to this database now, from ``pg_stat_activity``.

    A worker started by ``sa-outbox worker`` names its connections ``application_name =
    'sa-outbox worker <worker_id>'`` (`WORKER_APPLICATION_PREFIX`); a process of your own can
    do the same (``connect_args={"application_name": ...}``). Rows: ``worker_id,
    connections, connected_since, client_addr``. PostgreSQL keeps 63 bytes of the name, so a
    very long worker id shows cut. Needs no privilege: every role sees the names of every
    session (``pg_stat_activity`` hides only other roles' queries).

    Examples:
        >>> connected_workers().compile().params
        {'worker_prefix': 'sa-outbox worker '}
    """
    return sql_text(_CONNECTED_WORKERS).bindparams(
        bindparam("worker_prefix", WORKER_APPLICATION_PREFIX, type_=Text)
    )


def outbox_alarms(target: object, *, clock: Clock | None = None) -> Select[Any]:
    """One row: ``backlog`` (unpublished, not parked: what relays still have to publish),
    ``oldest_backlog_age`` (NULL when the backlog is empty) and ``parked``.

    Both counts walk a partial index (the relay's ready index and the parked index), never
    the published history.

    Examples:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "parked_at IS NOT NULL" in str(outbox_alarms(OutboxEvent))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    unpublished = t.c.published_at.is_(None)
    backlog = select(func.count(), now - func.min(t.c.created_at)).where(
        unpublished, t.c.parked_at.is_(None)
    )
    parked = select(func.count()).where(unpublished, t.c.parked_at.is_not(None))
    waiting = backlog.subquery("backlog")
    columns = list(waiting.c)
    return select(
        columns[0].label("backlog"),
        columns[1].label("oldest_backlog_age"),
        parked.scalar_subquery().label("parked"),
    ).select_from(waiting)


def select_jobs(
    target: object,
    *,
    statuses: str | tuple[str, ...] | list[str] | None = None,
    kinds: str | tuple[str, ...] | list[str] | None = None,
    queues: str | tuple[str, ...] | list[str] | None = None,
    limit: int = 50,
    before: tuple[dt.datetime, uuid.UUID] | None = None,
) -> Select[Any]:
    """A listing of jobs, most recently updated first (then by id, descending), with
    ``error_line``: the first line of ``last_error`` (the full text is for `select_job`).

    Filters combine with AND. ``before``: the ``(updated_at, id)`` of the previous page's last
    job (keyset pagination, no OFFSET). Each status is read through its index, up to
    ``limit`` rows, and the branches merged: a page costs about ``limit`` rows per status.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(select_jobs(Job, statuses="failed", kinds="send-email", limit=20))
        >>> "split_part(jobs.last_error" in sql and "ORDER BY jobs.updated_at DESC" in sql
        True
        >>> select_jobs(Job, statuses=["failed", "lost"])
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: unknown job status 'lost' (one of: pending, running, succeeded, failed, cancelled)
    """  # noqa: E501 - a doctest's expected output is one line
    size = count(limit, "limit")
    t = table_of(target)
    known = [str(s) for s in JobStatus]
    status_names = name_filter(statuses, "statuses") or known
    unknown = [name for name in status_names if name not in known]
    if unknown:
        raise InvalidArgument(f"unknown job status {unknown[0]!r} (one of: {', '.join(known)})")
    filters = []
    for listed, names in ((t.c.kind, kinds), (t.c.queue, queues)):
        if (wanted := name_filter(names, f"{listed.name}s")) is not None:
            filters.append(in_names(listed, wanted))
    if before is not None:
        at, last = before
        filters += [t.c.updated_at <= at, or_(t.c.updated_at < at, t.c.id < as_uuid(last, "id"))]
    # Each status compared with the enum column itself: a branch walks its index newest first.
    branches = [
        select(*(t.c[name] for name in _JOB_LISTED), _first_line(t.c.last_error))
        .where(t.c.status == literal(JobStatus(status), t.c.status.type), *filters)
        .order_by(t.c.updated_at.desc(), t.c.id.desc())
        .limit(size)
        for status in status_names
    ]
    if len(branches) == 1:
        return branches[0]
    merged = union_all(*branches).subquery("listed")
    return select(merged).order_by(merged.c.updated_at.desc(), merged.c.id.desc()).limit(size)


def _select_by_id(target: object, row_id: object, what: str) -> Select[Any]:
    """Every column of the row ``row_id`` (``what`` names it in the error of a bad id)."""
    chosen = as_uuid(row_id, what)
    t = table_of(target)
    return select(t).where(t.c.id == chosen)


def select_job(target: object, job_id: object) -> Select[Any]:
    """Every column of one job (zero rows when there is none with that id).

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "WHERE jobs.id = :id_1" in str(select_job(Job, uuid.UUID(int=1)))
        True
        >>> select_job(Job, "42")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: job id is not a UUID: '42'
    """
    return _select_by_id(target, job_id, "job id")


def select_job_statuses(target: object, job_ids: list[Any]) -> Select[Any]:
    """``id, status`` (as text) of the jobs among ``job_ids`` that exist.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "CAST(jobs.status AS TEXT)" in str(select_job_statuses(Job, [uuid.UUID(int=1)]))
        True
    """
    chosen = [as_uuid(i, "job id") for i in job_ids]
    t = table_of(target)
    return select(t.c.id, _status_text(t).label("status")).where(t.c.id.in_(chosen))


def job_kind_exists(target: object, kind: str) -> Select[Any]:
    """``EXISTS`` a job of ``kind`` (any status): tells an unknown kind from an idle one.

    It stops at the first row found; for a kind no job has, on a large table, it reads the
    whole table (no index holds every job by kind).

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "EXISTS" in str(job_kind_exists(Job, "send-email"))
        True
    """
    names = name_filter(kind, "kind")
    assert names is not None
    t = table_of(target)
    return select(exists().where(t.c.kind == names[0]))


def latest_deduplication_key(target: object, kind: str, prefix: str) -> Select[Any]:
    """The greatest ``deduplication_key`` of a job of ``kind`` that starts with ``prefix``
    (``NULL`` when none does), in any status. It walks the ``(kind, deduplication_key)``
    unique index; the periodic jobs' keys end with their tick in UTC ISO 8601, so the
    greatest key is the latest tick.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "max(jobs.deduplication_key)" in str(latest_deduplication_key(Job, "k", "p:"))
        True
    """
    names = name_filter(kind, "kind")
    assert names is not None
    if not isinstance(prefix, str):
        raise InvalidArgumentType(f"prefix must be a str, got {type(prefix).__name__}")
    t = table_of(target)
    return select(func.max(t.c.deduplication_key)).where(
        t.c.kind == names[0],
        t.c.deduplication_key.startswith(prefix, autoescape=True),
    )


def job_queue_exists(target: object, queue: str) -> Select[Any]:
    """``EXISTS`` a job of ``queue`` (any status): tells a mistyped queue name from an idle
    queue. Like `job_kind_exists`, a name no job has reads the whole table.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "EXISTS" in str(job_queue_exists(Job, "emails"))
        True
    """
    names = name_filter(queue, "queue")
    assert names is not None
    t = table_of(target)
    return select(exists().where(t.c.queue == names[0]))


def queue_throughput(
    target: object, *, within: dt.timedelta | float = 300, clock: Clock | None = None
) -> Select[Any]:
    """Per queue, the jobs finished within ``within``: ``queue, succeeded, failed``.

    Counted from ``updated_at`` of ``succeeded`` and ``failed`` jobs (the time they
    finished), which the retention index ``(status, updated_at)`` serves; jobs already
    pruned are not counted.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "GROUP BY jobs.queue" in str(queue_throughput(Job, within=60))
        True
    """
    window = duration(within, "within")
    t = table_of(target)
    now = now_of(clock)
    succeeded = t.c.status == JobStatus.SUCCEEDED
    failed = t.c.status == JobStatus.FAILED
    return (
        select(
            t.c.queue,
            func.count().filter(succeeded).label("succeeded"),
            func.count().filter(failed).label("failed"),
        )
        .where(or_(succeeded, failed), t.c.updated_at >= now - interval(window))
        .group_by(t.c.queue)
        .order_by(t.c.queue)
    )


#: The most minutes `job_throughput_by_minute` covers (a day).
MAX_THROUGHPUT_MINUTES = 24 * 60


def job_throughput_by_minute(
    target: object, *, minutes: int = 30, clock: Clock | None = None
) -> Select[Any]:
    """The jobs finished in each of the last ``minutes`` minutes: ``minute, succeeded,
    failed``, one row per minute (zeros included), oldest first; the last row is the minute
    now is in, still running.

    ``minute`` is the start of the minute (``date_trunc('minute', …)``). Counted from
    ``updated_at`` of ``succeeded`` and ``failed`` jobs, as `queue_throughput` counts: the
    retention index ``(status, updated_at)`` serves it, reading only the window's rows.
    Jobs already pruned are not counted, and neither are retries: a retried job's row
    changes again at its next claim, so the table keeps no count of them.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "generate_series" in str(job_throughput_by_minute(Job, minutes=30))
        True
        >>> job_throughput_by_minute(Job, minutes=0)
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: minutes must be between 1 and 1440, got 0
    """
    span = count(minutes, "minutes", maximum=MAX_THROUGHPUT_MINUTES)
    t = table_of(target)
    # Constants written into the SQL, not bound: the statement then prepares as it is (a
    # bound interval or unit has no type a PREPARE could infer).
    unit = literal_column("'minute'", Text)
    one_minute = literal_column("interval '1 minute'", Interval)
    last = func.date_trunc(unit, now_of(clock), type_=DateTime(timezone=True))
    first = last - literal_column(f"interval '{span - 1} minutes'", Interval)
    succeeded = t.c.status == _status_literal(t, JobStatus.SUCCEEDED)
    failed = t.c.status == _status_literal(t, JobStatus.FAILED)
    bucket = func.date_trunc(unit, t.c.updated_at, type_=DateTime(timezone=True))
    done = (
        select(
            bucket.label("minute"),
            func.count().filter(succeeded).label("succeeded"),
            func.count().filter(failed).label("failed"),
        )
        .where(or_(succeeded, failed), t.c.updated_at >= first, t.c.updated_at < last + one_minute)
        .group_by(bucket)
        .subquery("done")
    )
    series = (
        func.generate_series(first, last, one_minute)
        .table_valued(column("minute", DateTime(timezone=True)))
        .render_derived(name="minutes")
    )
    return (
        select(
            series.c.minute,
            func.coalesce(done.c.succeeded, 0).label("succeeded"),
            func.coalesce(done.c.failed, 0).label("failed"),
        )
        .select_from(series)
        .outerjoin(done, done.c.minute == series.c.minute)
        .order_by(series.c.minute)
    )


def select_running_jobs(
    target: object, *, limit: int = 50, clock: Clock | None = None
) -> Select[Any]:
    """Up to ``limit`` ``running`` jobs, the soonest lease end first (so expired leases
    lead): ``id, queue, kind, worker_id, attempts, max_attempts, lease_until, lease_left``.

    ``lease_left`` is ``lease_until - now``: negative when the lease expired (the worker
    died or stalled; the reclaimer will take the job). The reclaimer's partial index
    ``(lease_until) WHERE status = 'running'`` serves the order, so a large table costs
    about ``limit`` rows (more only when many share the last lease end shown: a batch
    claimed together, whose ties are sorted by ``id``).

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "ORDER BY jobs.lease_until" in str(select_running_jobs(Job, limit=10))
        True
    """
    size = count(limit, "limit")
    t = table_of(target)
    now = now_of(clock)
    return (
        select(
            t.c.id,
            t.c.queue,
            t.c.kind,
            t.c.worker_id,
            t.c.attempts,
            t.c.max_attempts,
            t.c.lease_until,
            (t.c.lease_until - now).label("lease_left"),
        )
        .where(t.c.status == _status_literal(t, JobStatus.RUNNING))  # the index's predicate
        .order_by(t.c.lease_until, t.c.id)
        .limit(literal_column(str(size), Integer()))
    )


def select_events(target: object, *, parked: bool = False, limit: int = 50) -> Select[Any]:
    """A listing of unpublished outbox events in ``seq`` order, with ``error_line``.

    ``parked=False`` lists the relay's backlog (unpublished, not parked), ``parked=True``
    the parked events (what the broker kept rejecting).

    Examples:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "outbox.parked_at IS NOT NULL" in str(select_events(OutboxEvent, parked=True))
        True
    """
    size = count(limit, "limit")
    t = table_of(target)
    state = t.c.parked_at.is_not(None) if parked else t.c.parked_at.is_(None)
    return (
        select(*(t.c[name] for name in _EVENT_LISTED), _first_line(t.c.last_error))
        .where(t.c.published_at.is_(None), state)
        .order_by(t.c.seq)
        .limit(size)
    )


def select_event(target: object, event_id: object) -> Select[Any]:
    """Every column of one outbox event (zero rows when there is none with that id).

    Examples:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> select_event(OutboxEvent, "x")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: event id is not a UUID: 'x'
    """
    return _select_by_id(target, event_id, "event id")


def select_event_states(target: object, event_ids: list[Any]) -> Select[Any]:
    """``id, published_at, parked_at`` of the events among ``event_ids`` that exist.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "outbox.parked_at" in str(select_event_states(OutboxEvent, [uuid.UUID(int=1)]))
        True
    """
    chosen = [as_uuid(i, "event id") for i in event_ids]
    if not chosen:
        raise InvalidArgument("event_ids must name at least one event")
    t = table_of(target)
    return select(t.c.id, t.c.published_at, t.c.parked_at).where(t.c.id.in_(chosen))
