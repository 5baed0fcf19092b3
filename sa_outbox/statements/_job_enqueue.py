"""Statements that add jobs: `NewJob`, `enqueue_job`, `enqueue_jobs` (article, section 3)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Interval,
    Text,
    Uuid,
    bindparam,
    cast,
    column,
    func,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB, Insert, insert
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.sql.dml import ReturningInsert
from sqlalchemy.sql.elements import ColumnClause
from sqlalchemy.sql.selectable import TextualSelect

from .._clock import Clock
from .._exceptions import InvalidArgument
from .._ids import uuid7, uuid7_ints
from .._json import DEEP_TEXT, MAX_DEPTH, compact_json, prebuilt_encoder
from .._validation import (
    MAX_DEDUPLICATION_KEY_LENGTH,
    aware_datetime,
    count,
    duration,
    is_name,
    is_utf8,
    name,
    optional_key,
)
from ..schema import JobStatus
from ..schema._partition_ddl import partition_interval_of
from ._common import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Dumps,
    interval,
    jsonb,
    now_of,
    refuse_unstorable,
    serialise,
    table_of,
)
from ._job_defaults import _MAX_INT, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ._job_headers import job_headers_text
from ._job_unique import Unique, refuse_unique_on, unique_key_sql, unique_parts


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `enqueue_jobs`; the same fields as `enqueue_job` takes.

    Examples:
        >>> NewJob("send-email", {"to": "ana@example.com"}, deduplication_key="welcome:ana").queue
        'default'
    """

    kind: str
    payload: Any
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    run_at: dt.datetime | None = None
    delay: dt.timedelta | float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    deduplication_key: str | None = None
    #: String headers of the job's own (str to str); the current trace context joins them.
    headers: Mapping[str, str] | None = None
    #: Serial key: jobs sharing it run one at a time, in the order they were committed.
    lock_key: str | None = None
    #: What makes the job unique (`Unique`, docs/unique.md); ``None``: an ordinary job.
    unique: Unique | None = None

    def __init__(
        self,
        kind: str,
        payload: Any,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        deduplication_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        lock_key: str | None = None,
        unique: Unique | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass, but setting each slot through its
        # own descriptor instead of object.__setattr__: 40 % less, for jobs built by the
        # thousand. dataclass keeps an __init__ written in the class.
        _set_kind(self, kind)
        _set_payload(self, payload)
        _set_queue(self, queue)
        _set_priority(self, priority)
        _set_run_at(self, run_at)
        _set_delay(self, delay)
        _set_max_attempts(self, max_attempts)
        _set_deduplication_key(self, deduplication_key)
        _set_headers(self, headers)
        _set_lock_key(self, lock_key)
        _set_unique(self, unique)


(
    _set_kind,
    _set_payload,
    _set_queue,
    _set_priority,
    _set_run_at,
    _set_delay,
    _set_max_attempts,
    _set_deduplication_key,
    _set_headers,
    _set_lock_key,
    _set_unique,
) = (NewJob.__dict__[field.name].__set__ for field in dataclasses.fields(NewJob))


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    id: uuid.UUID
    kind: str
    payload: str
    queue: str
    priority: int
    run_at: dt.datetime | None
    delay: dt.timedelta | None
    max_attempts: int
    deduplication_key: str | None
    headers: str | None  # JSON text, or None (NULL)
    lock_key: str | None
    unique: tuple[str, int | None, str] | None  # `unique_parts`, or None: not unique


def _check(
    job: NewJob,
    dumps: Dumps,
    limit: int,
    job_id: uuid.UUID | None = None,
    trace: Mapping[str, str] | None = None,
) -> _Checked:
    kind = name(job.kind, "kind")
    if job.run_at is not None and job.delay is not None:
        raise InvalidArgument(f"job kind {kind!r}: give run_at or delay, not both")
    payload = serialise(job.payload, f"job kind {kind!r}", dumps, limit)
    queue = name(job.queue, "queue")
    return _Checked(
        id=uuid7() if job_id is None else job_id,
        kind=kind,
        payload=payload,
        queue=queue,
        priority=count(job.priority, "priority", minimum=-_MAX_INT, maximum=_MAX_INT),
        run_at=None if job.run_at is None else aware_datetime(job.run_at, "run_at"),
        delay=None if job.delay is None else duration(job.delay, "delay", allow_zero=True),
        max_attempts=count(job.max_attempts, "max_attempts", maximum=_MAX_INT),
        deduplication_key=optional_key(
            job.deduplication_key, "deduplication_key", MAX_DEDUPLICATION_KEY_LENGTH
        ),
        headers=job_headers_text(job.headers, trace, f"job kind {kind!r}"),
        lock_key=optional_key(job.lock_key, "lock_key", MAX_DEDUPLICATION_KEY_LENGTH),
        unique=None
        if job.unique is None
        else unique_parts(job.unique, kind, queue, payload, f"job kind {kind!r}"),
    )


def _on_conflict_skip(stmt: Insert, target: Any, unique: bool = False) -> Insert:
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
    job = _check(
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
        dumps,
        max_payload_bytes,
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
    return _on_conflict_skip(stmt, t, job.unique is not None).returning(t.c.id)


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
    return _on_conflict_skip(stmt, t, unique).returning(t.c.id)


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
    if (  # the usual job, accepted by identity and type tests alone (as `_plain`)
        is_name(kind)
        and is_name(queue)
        and type(priority) is int
        and -_MAX_INT <= priority <= _MAX_INT
        and type(max_attempts) is int
        and 1 <= max_attempts <= _MAX_INT
        and run_at is None
        and delay is None
        and (deduplication_key is None or type(deduplication_key) is str)
        and lock_key is None
        and unique is None
    ):
        if deduplication_key is not None:
            deduplication_key = optional_key(
                deduplication_key, "deduplication_key", MAX_DEDUPLICATION_KEY_LENGTH
            )
        return {
            "job_id": uuid7(),
            "job_queue": queue,
            "job_kind": kind,
            "job_payload": serialise(payload, f"job kind {kind!r}", dumps, max_payload_bytes),
            "job_priority": priority,
            "job_run_at": None,
            "job_delay": _ZERO,
            "job_max_attempts": max_attempts,
            "job_deduplication_key": deduplication_key,
            "job_headers": None
            if headers is None and trace_headers is None
            else job_headers_text(headers, trace_headers, f"job kind {kind!r}"),
            "job_lock_key": None,
        }
    job = _check(
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
        dumps,
        max_payload_bytes,
        trace=trace_headers,
    )
    values = {
        "job_id": job.id,
        "job_queue": job.queue,
        "job_kind": job.kind,
        "job_payload": job.payload,
        "job_priority": job.priority,
        "job_run_at": job.run_at,
        "job_delay": _ZERO if job.delay is None else job.delay,
        "job_max_attempts": job.max_attempts,
        "job_deduplication_key": job.deduplication_key,
        "job_headers": job.headers,
        "job_lock_key": job.lock_key,
    }
    if job.unique is not None:
        digest, period, states = job.unique
        values["job_unique_digest"] = digest
        values["job_unique_period"] = period
        values["job_unique_states"] = states
    return values


def enqueue_jobs(
    target: object,
    jobs: Iterable[NewJob],
    *,
    trace_headers: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> tuple[ReturningInsert[Any], list[uuid.UUID]]:
    """One ``INSERT … SELECT FROM jsonb_to_recordset(…) ON CONFLICT DO NOTHING RETURNING id``.

    Returns the statement and the ids given to the jobs, in input order: the ids the
    statement returns are those that were inserted; the others collided with a
    deduplication key (an earlier job, or an earlier one in the same batch). One statement
    shape serves any number of jobs, so it compiles once. The jobs travel as one JSON
    document (one object per job, payloads embedded as they were serialised): one string
    parameter for the driver to send, where arrays would be adapted element by element.
    ``trace_headers`` join every job's own ``headers``, under them (see `enqueue_job_values`).
    When a job of the batch is ``unique`` (`Unique`), the statement carries the unique
    columns and its ``ON CONFLICT DO NOTHING`` has no target: a job is then skipped when
    its deduplication key or its unique key is taken, by an earlier job or one earlier in
    the batch.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt, ids = enqueue_jobs(Job, [NewJob("a", {}), NewJob("b", [1, 2])])
        >>> len(ids)
        2
    """
    jobs = list(jobs)
    t = table_of(target)
    with_headers = has_headers(t)
    # One block of ids for the batch: the same UUIDv7 sequence, a tenth of the cost.
    values = uuid7_ints(len(jobs))
    trace = trace_headers if with_headers else None
    document, unique = _jobs_document(jobs, values, dumps, max_payload_bytes, trace)
    if not jobs:
        raise InvalidArgument("enqueue_jobs needs at least one job")
    if not with_headers and any(job.headers is not None for job in jobs):
        raise no_headers_column(t)
    with_lock_key = has_lock_key(t)
    if not with_lock_key and any(job.lock_key is not None for job in jobs):
        raise no_lock_key_column(t)
    if unique:
        refuse_unique_on(t)
    now = now_of(clock)
    rows = (
        func.jsonb_to_recordset(cast(bindparam(None, document, type_=Text()), JSONB))
        .table_valued(
            column("id", Uuid()),
            column("queue", Text()),
            column("kind", Text()),
            column("payload", JSONB()),
            column("priority", Integer()),
            column("run_at", DateTime(timezone=True)),
            column("delay", Interval()),
            column("max_attempts", Integer()),
            column("dedup", Text()),
            *([column("headers", JSONB())] if with_headers else []),
            *([column("lock_key", Text())] if with_lock_key else []),
            *(_unique_fields() if unique else []),
        )
        .render_derived(name="new_jobs", with_types=True)
    )
    run_at = func.coalesce(
        rows.c.run_at, now + func.coalesce(rows.c.delay, literal(dt.timedelta()))
    )
    source = select(
        rows.c.id,
        rows.c.queue,
        rows.c.kind,
        # A JSON null payload comes out of the recordset as SQL NULL: it is jsonb 'null'.
        func.coalesce(rows.c.payload, literal_column("'null'::jsonb", JSONB())),
        literal(JobStatus.PENDING.value).cast(t.c.status.type),
        rows.c.priority,
        run_at,
        rows.c.max_attempts,
        rows.c.dedup,
        now,
        now,
        *([rows.c.headers] if with_headers else []),
        *([rows.c.lock_key] if with_lock_key else []),
        *(
            [
                unique_key_sql(rows.c.unique_digest, rows.c.unique_period, now),
                cast(rows.c.unique_states, t.c.unique_states.type),
            ]
            if unique
            else []
        ),
    )
    columns = [
        "id",
        "queue",
        "kind",
        "payload",
        "status",
        "priority",
        "run_at",
        "max_attempts",
        "deduplication_key",
        "created_at",
        "updated_at",
        *(["headers"] if with_headers else []),
        *(["lock_key"] if with_lock_key else []),
        *(["unique_key", "unique_states"] if unique else []),
    ]
    skipping = _on_conflict_skip(insert(t).from_select(columns, source), t, unique)
    stmt = skipping.returning(t.c.id)
    return stmt, [uuid.UUID(int=value) for value in values]


def _unique_fields() -> list[ColumnClause[Any]]:
    """The unique jobs' fields of `enqueue_jobs`' recordset (`_checked_object` writes them)."""
    return [
        column("unique_digest", Text()),
        column("unique_period", BigInteger()),
        column("unique_states", Text()),
    ]


# A JSON string literal as compact_json writes one (UTF-8 kept, only what JSON escapes).
_json_str = json.encoder.encode_basestring


_UNSET: Any = object()


_NO_ID = uuid.UUID(int=0)


def _plain(job: object) -> TypeGuard[NewJob]:
    """Whether ``job`` is exactly a `NewJob` that `_check` accepts as it is: names `name`
    accepts, int fields, no run_at, delay, deduplication key, headers or unique (a subclass,
    or a bool, is not plain)."""
    if type(job) is not NewJob:
        return False
    kind, queue, priority, attempts = job.kind, job.queue, job.priority, job.max_attempts
    return (
        is_name(kind)
        and is_name(queue)
        and type(priority) is int
        and -_MAX_INT <= priority <= _MAX_INT
        and type(attempts) is int
        and 1 <= attempts <= _MAX_INT
        and job.run_at is None
        and job.delay is None
        and job.deduplication_key is None
        and job.headers is None
        and job.lock_key is None
        and job.unique is None
    )


def _jobs_document(
    jobs: list[NewJob],
    ids: list[int],
    dumps: Dumps,
    limit: int,
    trace: Mapping[str, str] | None = None,
) -> tuple[str, bool]:
    """The jobs as the JSON array `enqueue_jobs` sends: checked in order, as `_check` does;
    and whether one of them is unique (its object then holds the ``unique_*`` fields).

    A plain job (`_plain`) whose fields are the very objects of the plain job checked
    before it (``NewJob("send", {...})`` in a loop) needs identity tests only, and its
    payload goes through the C encoder of `fast_compact_json` directly (and a payload
    `may_be_unstorable` doubts, through `refuse_unstorable`); any other job goes through
    `_check`, which accepts it or raises. ``trace`` becomes the ``headers`` of every job,
    under the job's own.
    """
    encoder = prebuilt_encoder(dumps)
    raw = encoder is None  # another dumps may write a NUL as it is, not as an escape
    join = "".join
    fits = limit // 4  # a str of this many characters fits in any UTF-8 encoding
    objects: list[str] = []
    append = objects.append
    kind = queue = priority = attempts = _UNSET
    head = tail = ""
    # The trace context is the same for every job: serialised once (its values are the
    # propagator's ASCII, so a plain job's headers need no check).
    end = "}" if not trace else f',"headers":{job_headers_text(None, trace, "jobs")}}}'
    unique = False
    for job_id, job in zip(ids, jobs, strict=True):
        if not (
            type(job) is NewJob
            and job.kind is kind
            and job.queue is queue
            and job.priority is priority
            and job.max_attempts is attempts
            and job.run_at is None
            and job.delay is None
            and job.deduplication_key is None
            and job.headers is None
            and job.lock_key is None
            and job.unique is None
        ):
            if not _plain(job):
                append(_checked_object(job, job_id, dumps, limit, trace))
                unique = unique or job.unique is not None
                continue
            kind, queue = job.kind, job.queue
            priority, attempts = job.priority, job.max_attempts
            head = f',"queue":{_json_str(queue)},"kind":{_json_str(kind)},"payload":'
            tail = f',"priority":{priority},"max_attempts":{attempts}{end}'
        payload: Any
        try:
            payload = join(encoder(job.payload, 0)) if encoder is not None else dumps(job.payload)
        except (TypeError, ValueError, RecursionError):
            payload = None  # _check says what is wrong with it
        if type(payload) is not str or len(payload) > fits:
            append(_checked_object(job, job_id, dumps, limit, trace))  # says what is wrong
            continue
        if (  # `may_be_unstorable`, inline: it runs for every job
            "\\u" in payload
            or (raw and "\x00" in payload)
            or (len(payload) > DEEP_TEXT and payload.count("[") + payload.count("{") > MAX_DEPTH)
            or (not payload.isascii() and not is_utf8(payload))
        ):  # raises if it holds what jsonb refuses; often it does not (many brackets, say)
            refuse_unstorable(payload, job.payload, f"job kind {job.kind!r}")
        append(f'{{"id":"{job_id:032x}"{head}{payload}{tail}')
    return f"[{','.join(objects)}]", unique


def _checked_object(
    job: NewJob, job_id: int, dumps: Dumps, limit: int, trace: Mapping[str, str] | None
) -> str:
    """One job of `_jobs_document` through `_check`: its JSON object, or its error."""
    c = _check(job, dumps, limit, _NO_ID, trace)
    text = (
        f'{{"id":"{job_id:032x}","queue":{_json_str(c.queue)},"kind":{_json_str(c.kind)},'
        f'"payload":{c.payload},"priority":{int(c.priority)},'
        f'"max_attempts":{int(c.max_attempts)}'
    )
    if c.run_at is not None:
        text += f',"run_at":"{c.run_at.isoformat()}"'
    if c.delay is not None:
        delay = c.delay
        text += f',"delay":"{delay.days} days {delay.seconds} s {delay.microseconds} us"'
    if c.deduplication_key is not None:
        text += f',"dedup":{_json_str(c.deduplication_key)}'
    if c.headers is not None:
        text += f',"headers":{c.headers}'
    if c.lock_key is not None:
        text += f',"lock_key":{_json_str(c.lock_key)}'
    if c.unique is not None:
        digest, period, states = c.unique
        text += f',"unique_digest":"{digest}","unique_states":"{states}"'
        if period is not None:
            text += f',"unique_period":{period}'
    return text + "}"
