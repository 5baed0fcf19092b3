"""The job, outbox and inbox tables' columns and indexes (article, sections 3, 4 and 5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Identity,
    Index,
    Integer,
    Text,
    Uuid,
    column,
    desc,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import mapped_column

from .._validation import MAX_IDENTIFIER_LENGTH, identifier, optional_identifier
from ._partition_ddl import PARTITION_INFO_KEY, TableSetup, check_partition_interval
from ._status import TABLE_KIND_INFO_KEY, JobStatus, job_status_enum
from ._storage import STORAGE_INFO_KEY, check_storage

_now = text("now()")


# One spec per column: (SQLAlchemy type factory, column kwargs, dataclass kwargs).
# Plain mixins take the column kwargs; dataclass mixins add the dataclass kwargs.
_Spec = tuple[Callable[[], Any], dict[str, Any], dict[str, Any]]


_NO_INIT: dict[str, Any] = {"init": False}


_JOB_COLUMNS: dict[str, _Spec] = {
    "id": (
        lambda: Uuid(),
        {"primary_key": True, "server_default": text("gen_random_uuid()")},
        {"init": False, "default": None},
    ),
    "kind": (Text, {}, {}),
    "payload": (JSONB, {}, {}),
    "queue": (Text, {"server_default": text("'default'")}, {"default": "default"}),
    "status": (
        job_status_enum,
        {"server_default": text("'pending'")},
        {"default": JobStatus.PENDING},
    ),
    "priority": (Integer, {"server_default": text("0")}, {"default": 0}),
    "run_at": (lambda: DateTime(timezone=True), {"server_default": _now}, {"default": None}),
    "attempts": (Integer, {"server_default": text("0")}, {"default": 0}),
    "max_attempts": (Integer, {"server_default": text("8")}, {"default": 8}),
    "lease_until": (lambda: DateTime(timezone=True), {}, {"default": None}),
    "lease_token": (lambda: Uuid(), {}, {"default": None}),
    "worker_id": (Text, {}, {"default": None}),
    "deduplication_key": (Text, {}, {"default": None}),
    "last_error": (Text, {}, {"default": None}),
    "created_at": (lambda: DateTime(timezone=True), {"server_default": _now}, _NO_INIT),
    "updated_at": (lambda: DateTime(timezone=True), {"server_default": _now}, _NO_INIT),
    # Last: where an existing install's ALTER TABLE … ADD COLUMN puts it too. No server
    # default: a NULL costs no space, and most jobs carry no headers (docs/tracing.md).
    "headers": (JSONB, {"nullable": True}, {"default": None}),
    # Serial keys (docs/concurrency.md): jobs sharing a lock_key run one at a time, in the
    # order lock_seq gives them (the table's serial trigger sets it, after a per-key lock).
    "lock_key": (Text, {"nullable": True}, {"default": None}),
    "lock_seq": (BigInteger, {"nullable": True}, _NO_INIT),
    # Unique jobs (docs/unique.md): NULL on every other job, hence no server default. The
    # array's element type is the status column's, which creates it.
    "unique_key": (Text, {"nullable": True}, {"default": None}),
    "unique_states": (
        lambda: ARRAY(_created_elsewhere(job_status_enum())),
        {"nullable": True},
        {"default": None},
    ),
}


_OUTBOX_COLUMNS: dict[str, _Spec] = {
    "id": (
        lambda: Uuid(),
        {"primary_key": True, "server_default": text("gen_random_uuid()")},
        {"init": False, "default": None},
    ),
    "seq": (
        BigInteger,
        {"__identity__": True},
        _NO_INIT,
    ),
    "aggregate_type": (Text, {}, {}),
    "aggregate_id": (Text, {}, {}),
    "event_type": (Text, {}, {}),
    "payload": (JSONB, {}, {}),
    "headers": (JSONB, {"server_default": text("'{}'::jsonb")}, {"default": None}),
    "attempts": (Integer, {"server_default": text("0")}, {"default": 0}),
    "relay_until": (lambda: DateTime(timezone=True), {}, {"default": None}),
    "relay_token": (lambda: Uuid(), {}, {"default": None}),
    "published_at": (lambda: DateTime(timezone=True), {}, {"default": None}),
    "parked_at": (lambda: DateTime(timezone=True), {}, {"default": None}),
    "last_error": (Text, {}, {"default": None}),
    "created_at": (lambda: DateTime(timezone=True), {"server_default": _now}, _NO_INIT),
}


# The consumer's inbox: one row per message handled, keyed by its producer and its id.
_INBOX_COLUMNS: dict[str, _Spec] = {
    "source": (Text, {"primary_key": True}, {}),
    "message_id": (Text, {"primary_key": True}, {}),
    "received_at": (lambda: DateTime(timezone=True), {"server_default": _now}, _NO_INIT),
}


def _created_elsewhere(enum: Any) -> Any:
    """``enum``, which never emits ``CREATE TYPE`` of its own (another column creates it)."""
    enum.create_type = False
    return enum


def _column(specs: dict[str, _Spec], name: str, *, dataclass: bool = False) -> Any:
    type_factory, kwargs, dc_kwargs = specs[name]
    args: list[Any] = [type_factory()]
    options = dict(kwargs)
    if options.pop("__identity__", False):
        args.append(Identity(always=False))
    options.setdefault("nullable", name in _NULLABLE)
    if dataclass:
        options.update(dc_kwargs)
    mapped = mapped_column(*args, **options)
    # A dataclass field's default is the constructor's only. SQLAlchemy also makes it the
    # column's Python-side INSERT default, a parameter the library's statements (their
    # parameters computed once) would not pass; the server's default gives the same value.
    mapped.column.default = None
    return mapped


_NULLABLE = frozenset(
    {
        "lease_until",
        "lease_token",
        "worker_id",
        "deduplication_key",
        "last_error",
        "relay_until",
        "relay_token",
        "published_at",
        "parked_at",
    }
)


def _table_name(cls: Any) -> str:
    name = cls.__dict__.get("__tablename__") or getattr(cls, "__tablename__", None)
    return identifier(name, f"__tablename__ of {cls.__name__}")


def _schema_args(cls: Any) -> dict[str, Any]:
    schema = optional_identifier(getattr(cls, "__table_schema__", None), "__table_schema__")
    return {} if schema is None else {"schema": schema}


def _table_options(
    cls: Any, kind: str, recommended: Mapping[str, int | float | bool]
) -> tuple[TableSetup, dict[str, Any]]:
    """The `TableSetup` item and the ``Table`` keyword arguments of a mixin's table."""
    interval = check_partition_interval(
        getattr(cls, "__partition_interval__", None), f"__partition_interval__ of {cls.__name__}"
    )
    storage = check_storage(
        getattr(cls, "__table_storage__", recommended), f"__table_storage__ of {cls.__name__}"
    )
    info: dict[str, Any] = {TABLE_KIND_INFO_KEY: kind, STORAGE_INFO_KEY: storage}
    options: dict[str, Any] = {**_schema_args(cls), "info": info}
    if interval is not None:
        info[PARTITION_INFO_KEY] = interval
        options["postgresql_partition_by"] = "RANGE (created_at)"
    return TableSetup(kind, interval, storage), options


def _inherits_a_table(cls: Any) -> bool:
    """Whether a base of ``cls`` is already mapped to a table (``cls`` adds none of its own)."""
    return any("__table__" in base.__dict__ for base in cls.__mro__[1:])


def _index_name(table: str, suffix: str) -> str:
    name = f"{table}_{suffix}"
    if len(name) > MAX_IDENTIFIER_LENGTH:
        identifier(name, f"index name derived from table {table!r}")
    return name


def job_table_args(table_name: str, *, partitioned: bool = False) -> tuple[Index, ...]:
    """The indexes of a job table named ``table_name`` (article, sections 3 and 4).

    Three partial indexes hold the ready (``pending``) jobs in the claim's order,
    ``priority DESC, run_at, id``: ``{t}_ready_idx`` led by ``queue`` (a claim naming
    queues), ``{t}_ready_kind_idx`` led by ``kind`` (a claim naming kinds, as a worker does
    by default), ``{t}_ready_order_idx`` with no leading name (a claim over everything);
    whatever a claim names, it walks one of them in order and never sorts the backlog.
    ``{t}_dedup_idx`` makes ``(kind, deduplication_key)`` unique where a key is set,
    ``{t}_expired_lease_idx`` serves the reclaimer, ``{t}_retention_idx`` the pruner,
    ``{t}_serial_idx`` the claim's check that no earlier job of a serial key is unfinished.
    ``{t}_unique_idx`` makes ``unique_key`` unique among the jobs whose status is one of
    their own ``unique_states`` (unique jobs, docs/unique.md): a job leaves it when it
    reaches a state outside them.
    On a ``partitioned`` table a unique index must hold ``created_at``, which would make
    the key unique per partition only: there ``{t}_dedup_idx`` is a plain index, which the
    table's dedup trigger searches (see ``sa_outbox.schema._partition_ddl``), and there is
    no ``{t}_unique_idx`` (unique jobs are refused on such a table).

    Examples:
        >>> [i.name for i in job_table_args("jobs")]  # doctest: +NORMALIZE_WHITESPACE
        ['jobs_ready_idx', 'jobs_ready_kind_idx', 'jobs_ready_order_idx', 'jobs_dedup_idx',
         'jobs_expired_lease_idx', 'jobs_retention_idx', 'jobs_serial_idx', 'jobs_unique_idx']
    """
    t = identifier(table_name, "job table name")
    unique = () if partitioned else (unique_jobs_index(t),)
    return (
        Index(
            _index_name(t, "ready_idx"),
            "queue",
            desc(column("priority")),
            "run_at",
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            _index_name(t, "ready_kind_idx"),
            "kind",
            desc(column("priority")),
            "run_at",
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            _index_name(t, "ready_order_idx"),
            desc(column("priority")),
            "run_at",
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            _index_name(t, "dedup_idx"),
            "kind",
            "deduplication_key",
            unique=not partitioned,
            postgresql_where=text("deduplication_key IS NOT NULL"),
        ),
        Index(
            _index_name(t, "expired_lease_idx"),
            "lease_until",
            postgresql_where=text("status = 'running'"),
        ),
        Index(_index_name(t, "retention_idx"), "status", "updated_at"),
        Index(
            _index_name(t, "serial_idx"),
            "lock_key",
            "lock_seq",
            postgresql_where=text(
                "lock_key IS NOT NULL AND (status = 'pending' OR status = 'running')"
            ),
        ),
        *unique,
    )


#: The predicate of ``{t}_unique_idx``: a job holds its unique key while its status is one
#: of its ``unique_states`` (enum equality is immutable, so PostgreSQL accepts it).
UNIQUE_INDEX_WHERE = "unique_key IS NOT NULL AND status = ANY (unique_states)"


def unique_jobs_index(table_name: str) -> Index:
    """``{t}_unique_idx``: the partial unique index of unique jobs (docs/unique.md).

    Examples:
        >>> unique_jobs_index("jobs").name
        'jobs_unique_idx'
    """
    return Index(
        _index_name(table_name, "unique_idx"),
        "unique_key",
        unique=True,
        postgresql_where=text(UNIQUE_INDEX_WHERE),
    )


def outbox_table_args(table_name: str, *, partitioned: bool = False) -> tuple[Index, ...]:
    """The indexes of an outbox table named ``table_name`` (article, section 5).

    ``{t}_seq_key`` keeps ``seq`` unique (on a ``partitioned`` table ``(seq, created_at)``,
    as a unique index there must hold the partition key; ``seq`` comes from one sequence).
    ``{t}_ready_idx`` holds only the rows a relay may claim (unpublished and not parked), in
    ``seq`` order: the claim's predicate.
    ``{t}_aggregate_idx`` holds the unpublished rows by aggregate and ``seq``: the claim asks
    it whether an earlier event of the same aggregate is still unpublished, and takes the
    following events of an aggregate from it. ``{t}_parked_idx`` lists parked events;
    ``{t}_retention_idx`` serves pruning.

    Examples:
        >>> [i.name for i in outbox_table_args("outbox")]  # doctest: +NORMALIZE_WHITESPACE
        ['outbox_seq_key', 'outbox_ready_idx', 'outbox_aggregate_idx', 'outbox_parked_idx',
         'outbox_retention_idx']
    """
    t = identifier(table_name, "outbox table name")
    return (
        Index(
            _index_name(t, "seq_key"), "seq", *(["created_at"] if partitioned else []), unique=True
        ),
        Index(
            _index_name(t, "ready_idx"),
            "seq",
            postgresql_where=text("published_at IS NULL AND parked_at IS NULL"),
        ),
        Index(
            _index_name(t, "aggregate_idx"),
            "aggregate_type",
            "aggregate_id",
            "seq",
            postgresql_where=text("published_at IS NULL"),
        ),
        Index(
            _index_name(t, "parked_idx"),
            "parked_at",
            postgresql_where=text("parked_at IS NOT NULL"),
        ),
        Index(
            _index_name(t, "retention_idx"),
            "published_at",
            postgresql_where=text("published_at IS NOT NULL"),
        ),
    )


def inbox_table_args(table_name: str) -> tuple[Index, ...]:
    """The indexes of an inbox table named ``table_name`` (besides its primary key).

    The primary key ``(source, message_id)`` is what makes a second delivery of a message
    insert nothing. ``{t}_retention_idx`` on ``received_at`` serves pruning: the oldest
    entries first, without reading the rest of the table.

    Examples:
        >>> [i.name for i in inbox_table_args("inbox")]
        ['inbox_retention_idx']
    """
    t = identifier(table_name, "inbox table name")
    return (Index(_index_name(t, "retention_idx"), "received_at"),)
