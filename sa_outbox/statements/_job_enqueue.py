"""Statements that add one job: `enqueue_job`, and the template every job of a queue shares
(`enqueue_job_template`, and its values: `job_template_values` for a `NewJob`, which
`enqueue_job_values` builds from its keywords) (article, section 3).

What the optional columns of a job table change in an ``INSERT`` (``headers``,
``lock_key``, the unique columns, the ``ON CONFLICT``) is here too, for `enqueue_jobs`
(``_job_batch``) and the executors to share.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Interval,
    Text,
    bindparam,
    cast,
    func,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB, Insert, insert
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.sql.dml import ReturningInsert
from sqlalchemy.sql.selectable import TextualSelect

from .._clock import Clock
from .._exceptions import InvalidArgument
from .._ids import uuid7
from .._json import compact_json
from .._validation import MAX_DEDUPLICATION_KEY_LENGTH, is_name, optional_key
from ..schema import JobStatus
from ..schema._partition_ddl import partition_interval_of
from ._common import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Dumps,
    interval,
    jsonb,
    now_of,
    serialise,
    table_of,
)
from ._job_defaults import _MAX_INT, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ._job_headers import job_headers_text
from ._job_record import NewJob, check_job
from ._job_unique import Unique, refuse_unique_on, unique_key_sql


def on_conflict_skip(stmt: Insert, target: Any, unique: bool = False) -> Insert:
    """``stmt``, an INSERT into the job table ``target``, skipping a job whose key is taken."""
    t = table_of(target)
    if unique:
        # Two unique indexes may refuse the row, {t}_dedup_idx and {t}_unique_idx, and an
        # ON CONFLICT names one at most: without a target it skips a conflict on any (the
        # third, the primary key, never conflicts: ids are new UUIDv7).
        refuse_unique_on(t)
        return stmt.on_conflict_do_nothing()
    if partition_interval_of(t) is not None:
        # No unique index can hold the key across partitions: the table's dedup trigger
        # skips the row instead, and RETURNING leaves it out as ON CONFLICT would.
        return stmt
    return stmt.on_conflict_do_nothing(
        index_elements=[t.c.kind, t.c.deduplication_key],
        index_where=t.c.deduplication_key.is_not(None),
    )


def has_headers(table: Any) -> bool:
    """Whether a job table has the ``headers`` column (a table made before it was added, and
    not migrated yet, has not: docs/upgrading.md).

    Examples:
        >>> from sqlalchemy import Column, MetaData, Table, Text
        >>> has_headers(Table("jobs", MetaData(), Column("kind", Text)))
        False
    """
    return "headers" in table.c


def _headers_values(t: Any, text: str | None, given: bool) -> dict[str, Any]:
    """The ``headers`` value of an INSERT into ``t``: none on a table without the column,
    where headers the caller ``given`` are refused (the trace context alone is dropped)."""
    if has_headers(t):
        return {"headers": None if text is None else jsonb(text)}
    if given:
        raise no_headers_column(t)
    return {}


def no_headers_column(table: Any) -> InvalidArgument:
    """The error for headers given to a job table without the ``headers`` column."""
    return InvalidArgument(
        f"job table {table.fullname} has no headers column: add it with a migration "
        "(alembic revision --autogenerate, see docs/upgrading.md)"
    )


def has_lock_key(table: Any) -> bool:
    """Whether a job table has the serial keys' ``lock_key`` column (a table made before
    serial keys, not migrated yet, has not: docs/upgrading.md).

    Examples:
        >>> from sqlalchemy import Column, MetaData, Table, Text
        >>> has_lock_key(Table("jobs", MetaData(), Column("kind", Text)))
        False
    """
    return "lock_key" in table.c


def no_lock_key_column(table: Any) -> InvalidArgument:
    """The error for a serial key given to a job table without the ``lock_key`` column."""
    return InvalidArgument(
        f"job table {table.fullname} has no lock_key column: add the serial keys with a "
        "migration (alembic revision --autogenerate, see docs/upgrading.md)"
    )


def _lock_key_values(t: Any, lock_key: str | None) -> dict[str, Any]:
    if has_lock_key(t):
        return {"lock_key": lock_key}
    if lock_key is not None:
        raise no_lock_key_column(t)
    return {}


def enqueue_job(
    target: object,
    kind: str,
    payload: Any,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    deduplication_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    lock_key: str | None = None,
    unique: Unique | None = None,
    clock: Clock | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> ReturningInsert[Any]:
    """``INSERT … ON CONFLICT (kind, deduplication_key) DO NOTHING RETURNING id``.

    No row comes back when a job of the same kind already holds the deduplication key. The
    payload is serialised here, once, so a bad one fails before any SQL is sent. On a
    partitioned table (``__partition_interval__``) the statement has no ``ON CONFLICT``: the
    table's dedup trigger skips a taken key, with the same result (docs/partitions.md).
    ``headers`` (str to str, at most `MAX_HEADERS_BYTES` as JSON) are stored as they are:
    this builder reads no trace context (the executors add it, see docs/tracing.md).
    ``lock_key`` makes it a serial job: the jobs of one key run one at a time, in commit
    order (the table's serial trigger orders them; docs/concurrency.md).
    A ``unique`` job (`Unique`, docs/unique.md) gets its key and states, and the statement
    an ``ON CONFLICT DO NOTHING`` without a target, which skips it when either its
    deduplication key or its unique key is taken; it is refused on a partitioned table and
    on one without the unique columns.

    Examples:
        >>> from sqlalchemy.dialects import postgresql
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(enqueue_job(Job, "index-book", {"book_id": 1},
        ...                       deduplication_key="index-book:1")
        ...           .compile(dialect=postgresql.dialect()))
        >>> "ON CONFLICT (kind, deduplication_key) WHERE deduplication_key IS NOT NULL" in sql
        True
    """
    job = check_job(
        NewJob(
            kind,
            payload,
            queue,
            priority,
            run_at,
            delay,
            max_attempts,
            deduplication_key,
            headers,
            lock_key,
            unique,
        ),
        dumps=dumps,
        max_payload_bytes=max_payload_bytes,
    )
    t = table_of(target)
    now = now_of(clock)
    when: Any = job.run_at if job.run_at is not None else now
    if job.delay is not None:
        when = now + interval(job.delay)
    stmt = insert(t).values(
        id=job.id,
        queue=job.queue,
        kind=job.kind,
        payload=jsonb(job.payload),
        status=JobStatus.PENDING,
        priority=job.priority,
        run_at=when,
        max_attempts=job.max_attempts,
        deduplication_key=job.deduplication_key,
        created_at=now,
        updated_at=now,
        **_headers_values(t, job.headers, headers is not None),
        **_lock_key_values(t, job.lock_key),
        **_unique_values(t, job.unique, now),
    )
    return on_conflict_skip(stmt, t, job.unique is not None).returning(t.c.id)


def _unique_values(t: Any, parts: tuple[str, int | None, str] | None, now: Any) -> dict[str, Any]:
    """The ``unique_key`` and ``unique_states`` values of a unique job (none for another)."""
    if parts is None:
        return {}
    refuse_unique_on(t)
    digest, period, states = parts
    return {
        "unique_key": unique_key_sql(
            bindparam(None, digest, type_=Text()), bindparam(None, period, type_=BigInteger()), now
        ),
        "unique_states": cast(bindparam(None, states, type_=Text()), t.c.unique_states.type),
    }


#: The bind parameters of `enqueue_job_template`, in the order of its columns.
ENQUEUE_PARAMETERS = (
    "job_id",
    "job_queue",
    "job_kind",
    "job_payload",
    "job_priority",
    "job_run_at",
    "job_delay",
    "job_max_attempts",
    "job_deduplication_key",
    "job_headers",
    "job_lock_key",
)
#: The bind parameters of `enqueue_job_template` with ``unique=True``: these and three more.
UNIQUE_ENQUEUE_PARAMETERS = (
    *ENQUEUE_PARAMETERS,
    "job_unique_digest",
    "job_unique_period",
    "job_unique_states",
)
_ZERO = dt.timedelta()


def enqueue_job_template(
    target: object, *, clock: Clock | None = None, unique: bool = False
) -> ReturningInsert[Any]:
    """`enqueue_job`'s statement with every value of a job a named bind parameter.

    One shape serves every job: build it once, then run it with the values
    `enqueue_job_values` checks and returns, so SQLAlchemy's compiled cache is hit and no
    statement is built per job. ``run_at`` is ``coalesce(:job_run_at, now + :job_delay)``;
    ``job_headers`` is JSON text or ``None`` (on a table without the ``headers`` column the
    statement has no such parameter, and the value is ignored); so is ``job_lock_key``
    without the ``lock_key`` column. ``unique=True``: the
    statement of unique jobs, which takes the ``job_unique_*`` values too
    (`UNIQUE_ENQUEUE_PARAMETERS`) and skips a conflict on any unique index; the statement of
    ordinary jobs is not changed by it.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt = enqueue_job_template(Job)
        >>> values = enqueue_job_values("send-email", {"to": "ana@example.com"})
        >>> sorted(values) == sorted(ENQUEUE_PARAMETERS)
        True
        >>> # with engine.begin() as conn: conn.execute(stmt, values).first()
    """
    t = table_of(target)
    now = now_of(clock)
    c = t.c
    timestamp, delay = DateTime(timezone=True), Interval()
    run_at = func.coalesce(
        bindparam("job_run_at", type_=timestamp),
        now + cast(bindparam("job_delay", type_=delay), delay),
    )
    stmt = insert(t).values(
        id=bindparam("job_id", type_=c.id.type),
        queue=bindparam("job_queue", type_=c.queue.type),
        kind=bindparam("job_kind", type_=c.kind.type),
        payload=cast(bindparam("job_payload", type_=Text()), JSONB),
        status=JobStatus.PENDING,
        priority=bindparam("job_priority", type_=c.priority.type),
        run_at=run_at,
        max_attempts=bindparam("job_max_attempts", type_=c.max_attempts.type),
        deduplication_key=bindparam("job_deduplication_key", type_=c.deduplication_key.type),
        created_at=now,
        updated_at=now,
        **(
            {"headers": cast(bindparam("job_headers", type_=Text()), JSONB)}
            if has_headers(t)
            else {}
        ),
        **({"lock_key": bindparam("job_lock_key", type_=Text())} if has_lock_key(t) else {}),
        **(
            {
                "unique_key": unique_key_sql(
                    bindparam("job_unique_digest", type_=Text()),
                    bindparam("job_unique_period", type_=BigInteger()),
                    now,
                ),
                "unique_states": cast(
                    bindparam("job_unique_states", type_=Text()), c.unique_states.type
                ),
            }
            if unique
            else {}
        ),
    )
    return on_conflict_skip(stmt, t, unique).returning(t.c.id)


def precompiled(stmt: ReturningInsert[Any]) -> TextualSelect:
    """``stmt`` as the PostgreSQL text it compiles to, with the same bind parameters (typed,
    constants kept) and RETURNING columns: a statement SQLAlchemy's compiled cache keeps.

    For SQLAlchemy 2.0, whose ``INSERT … ON CONFLICT`` has no cache key (2.1 caches it), so
    that a statement built once is not compiled again at every execution. The text names
    its table as compiled: a ``schema_translate_map`` no longer applies to it.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt = precompiled(enqueue_job_template(Job))
        >>> stmt._generate_cache_key() is not None
        True
    """
    dialect = postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
    # No ``:name::TYPE`` casts in the text (text() would not see such a name as a parameter):
    # the dialect that runs it renders its own.
    dialect.bind_typing = BindTyping.NONE
    compiled = stmt.compile(dialect=dialect)
    names = compiled.bind_names
    binds = [
        bindparam(name, param.value, type_=param.type, unique=False)
        if param.value is not None
        else bindparam(name, type_=param.type)
        for param, name in names.items()
    ]
    # Any other colon (in a quoted name, say) is escaped, so text() reads only these names.
    known = "|".join(re.escape(name) for name in names.values())
    sql = re.sub(rf":(?!(?:{known})(?!\w))", r"\\:", compiled.string)
    columns = [column for column in stmt.exported_columns]
    return text(sql).bindparams(*binds).columns(*columns)


def enqueue_job_values(
    kind: str,
    payload: Any,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    deduplication_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    lock_key: str | None = None,
    unique: Unique | None = None,
    trace_headers: Mapping[str, str] | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> dict[str, Any]:
    """The values of `enqueue_job_template`'s parameters for one job, checked as
    `enqueue_job` checks them (bad input raises here, before any SQL), with a new id.

    ``trace_headers`` (the current trace context, as the executors pass it) join
    ``headers`` under them: the caller's own headers win a clash. A ``unique`` job's values
    hold the ``job_unique_*`` parameters too: run them with
    ``enqueue_job_template(…, unique=True)``.

    Examples:
        >>> values = enqueue_job_values("index-book", {"book_id": 1}, delay=30)
        >>> values["job_payload"], values["job_delay"]
        ('{"book_id":1}', datetime.timedelta(seconds=30))
    """
    job = NewJob(
        kind,
        payload,
        queue,
        priority,
        run_at,
        delay,
        max_attempts,
        deduplication_key,
        headers,
        lock_key,
        unique,
    )
    return job_template_values(
        job, trace_headers=trace_headers, dumps=dumps, max_payload_bytes=max_payload_bytes
    )


def job_template_values(
    job: NewJob,
    *,
    trace_headers: Mapping[str, str] | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> dict[str, Any]:
    """`enqueue_job_values` for a `NewJob`: the values of `enqueue_job_template`'s
    parameters, checked (bad input raises here), with a new id.

    Examples:
        >>> values = job_template_values(NewJob("index-book", {"book_id": 1}, priority=3))
        >>> values["job_payload"], values["job_priority"]
        ('{"book_id":1}', 3)
    """
    kind, queue, priority, attempts = job.kind, job.queue, job.priority, job.max_attempts
    deduplication_key, headers = job.deduplication_key, job.headers
    if (  # the usual job, accepted by identity and type tests alone (as `is_plain_job`)
        is_name(kind)
        and is_name(queue)
        and type(priority) is int
        and -_MAX_INT <= priority <= _MAX_INT
        and type(attempts) is int
        and 1 <= attempts <= _MAX_INT
        and job.run_at is None
        and job.delay is None
        and (deduplication_key is None or type(deduplication_key) is str)
        and job.lock_key is None
        and job.unique is None
    ):
        if deduplication_key is not None:
            deduplication_key = optional_key(
                deduplication_key, "deduplication_key", MAX_DEDUPLICATION_KEY_LENGTH
            )
        return {
            "job_id": uuid7(),
            "job_queue": queue,
            "job_kind": kind,
            "job_payload": serialise(job.payload, f"job kind {kind!r}", dumps, max_payload_bytes),
            "job_priority": priority,
            "job_run_at": None,
            "job_delay": _ZERO,
            "job_max_attempts": attempts,
            "job_deduplication_key": deduplication_key,
            "job_headers": None
            if headers is None and trace_headers is None
            else job_headers_text(headers, trace_headers, f"job kind {kind!r}"),
            "job_lock_key": None,
        }
    checked = check_job(
        job, dumps=dumps, max_payload_bytes=max_payload_bytes, trace_headers=trace_headers
    )
    values = {
        "job_id": checked.id,
        "job_queue": checked.queue,
        "job_kind": checked.kind,
        "job_payload": checked.payload,
        "job_priority": checked.priority,
        "job_run_at": checked.run_at,
        "job_delay": _ZERO if checked.delay is None else checked.delay,
        "job_max_attempts": checked.max_attempts,
        "job_deduplication_key": checked.deduplication_key,
        "job_headers": checked.headers,
        "job_lock_key": checked.lock_key,
    }
    if checked.unique is not None:
        digest, period, states = checked.unique
        values["job_unique_digest"] = digest
        values["job_unique_period"] = period
        values["job_unique_states"] = states
    return values
