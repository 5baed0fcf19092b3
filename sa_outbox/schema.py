"""Layer 1: the job and outbox tables, as mixins for the user's own declarative base.

The tables follow the article's schema (sections 4 and 5) with two additions: a ``queue``
column on jobs, and a monotonic ``seq`` column on the outbox, so events added by one
transaction keep the order they were added in (random UUIDs and ``now()`` do not order).

Plain declarative bases (``DeclarativeBase``, ``DeclarativeBaseNoMeta``, Flask-SQLAlchemy's
``db.Model``) take `JobMixin` / `OutboxMixin`; ``MappedAsDataclass`` bases take
`JobDataclassMixin` / `OutboxDataclassMixin`, which declare the same columns as dataclass
fields. Table names are the user's (``__tablename__``); a schema is set with
``__table_schema__`` or the metadata's own ``schema``. Index names derive from the table
name: ``{table}_ready_idx``, ``{table}_dedup_idx``, …

Example:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> class Base(DeclarativeBase):
    ...     pass
    >>> class Job(JobMixin, Base):
    ...     __tablename__ = "jobs"
    >>> class OutboxEvent(OutboxMixin, Base):
    ...     __tablename__ = "outbox"
    >>> sorted(index.name for index in Job.__table__.indexes)
    ['jobs_dedup_idx', 'jobs_expired_lease_idx', 'jobs_ready_idx', 'jobs_retention_idx']
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, cast

from sqlalchemy import (
    BigInteger,
    DateTime,
    Enum,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    Uuid,
    column,
    desc,
    event,
    inspect,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, MappedAsDataclass, declared_attr, mapped_column

from ._exceptions import InvalidArgumentType
from ._notify_trigger import NotifyTrigger
from ._outbox_triggers import OutboxTriggers
from ._partition_ddl import (
    PARTITION_INFO_KEY,
    PARTITION_INTERVALS,
    TableSetup,
    check_partition_interval,
)
from ._storage import (
    RECOMMENDED_JOB_STORAGE,
    RECOMMENDED_OUTBOX_STORAGE,
    STORAGE_INFO_KEY,
    check_storage,
)
from ._validation import MAX_IDENTIFIER_LENGTH, identifier, optional_identifier

__all__ = [
    "JOB_STATUS_TYPE_NAME",
    "PARTITION_INFO_KEY",
    "PARTITION_INTERVALS",
    "RECOMMENDED_JOB_STORAGE",
    "RECOMMENDED_OUTBOX_STORAGE",
    "STORAGE_INFO_KEY",
    "TABLE_KIND_INFO_KEY",
    "JobDataclassMixin",
    "JobMixin",
    "JobStatus",
    "OutboxDataclassMixin",
    "OutboxMixin",
    "job_status_enum",
    "job_table_args",
    "outbox_table_args",
    "resolve_table",
]

#: Name of the PostgreSQL enum type of ``jobs.status`` (created in the table's schema).
JOB_STATUS_TYPE_NAME = "job_status"

#: Key of ``Table.info`` where the mixins record what a table is: ``"job"`` or ``"outbox"``
#: (``alembic_ext`` reads it to render its own operations for these tables).
TABLE_KIND_INFO_KEY = "sa_outbox"


class JobStatus(enum.StrEnum):
    """The four states of a job.

    Example:
        >>> JobStatus("running") is JobStatus.RUNNING
        True
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def job_status_enum(*, create_type: bool = True) -> Enum:
    """The ``job_status`` column type; it takes the schema of the table it is attached to.

    Example:
        >>> job_status_enum().enums
        ['pending', 'running', 'succeeded', 'failed']
    """
    return Enum(
        JobStatus,
        name=JOB_STATUS_TYPE_NAME,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
        create_constraint=False,
        **({} if create_type else {"create_type": False}),
    )


@event.listens_for(Table, "after_parent_attach")
def _enum_follows_table_schema(table: Table, _metadata: object) -> None:
    # The job_status type lives in its table's schema, on SQLAlchemy 2.0 and 2.1 alike
    # (2.1 deprecates inherit_schema and would take the metadata's schema instead).
    for col in table.columns:
        if isinstance(col.type, Enum) and col.type.enum_class is JobStatus:
            col.type.schema = table.schema


_now = text("now()")
_C = TypeVar("_C")

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


def _column(specs: dict[str, _Spec], name: str, *, dataclass: bool = False) -> Any:
    type_factory, kwargs, dc_kwargs = specs[name]
    args: list[Any] = [type_factory()]
    options = dict(kwargs)
    if options.pop("__identity__", False):
        args.append(Identity(always=False))
    options.setdefault("nullable", name in _NULLABLE)
    if dataclass:
        options.update(dc_kwargs)
    return mapped_column(*args, **options)


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

    ``{t}_ready_idx`` serves the claim (``queue = … ORDER BY priority DESC, run_at, id``),
    ``{t}_dedup_idx`` makes ``(kind, deduplication_key)`` unique where a key is set,
    ``{t}_expired_lease_idx`` serves the reclaimer, ``{t}_retention_idx`` the pruner.
    On a ``partitioned`` table a unique index must hold ``created_at``, which would make
    the key unique per partition only: there ``{t}_dedup_idx`` is a plain index, which the
    table's dedup trigger searches (see ``sa_outbox._partition_ddl``).

    Example:
        >>> [i.name for i in job_table_args("jobs")]
        ['jobs_ready_idx', 'jobs_dedup_idx', 'jobs_expired_lease_idx', 'jobs_retention_idx']
    """
    t = identifier(table_name, "job table name")
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

    Example:
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


class JobMixin:
    """The job table's columns and indexes, for a plain declarative base.

    ``metadata.create_all`` also creates the table's NOTIFY trigger (one notification per
    inserting statement), which wakes workers up when jobs arrive.

    Example:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class Job(JobMixin, Base):
        ...     __tablename__ = "background_jobs"
        ...     __table_schema__ = "work"
        >>> Job.__table__.fullname
        'work.background_jobs'
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None
    #: ``"hour"``, ``"day"``, ``"week"`` or ``"month"``: range-partition the table by
    #: ``created_at`` (docs/partitions.md); ``None``: one plain table.
    __partition_interval__: ClassVar[str | None] = None
    #: Storage parameters (``fillfactor``, per-table autovacuum); ``None``: server defaults.
    __table_storage__: ClassVar[Mapping[str, int | float | bool] | None] = RECOMMENDED_JOB_STORAGE

    id: Mapped[uuid.UUID] = _column(_JOB_COLUMNS, "id")
    queue: Mapped[str] = _column(_JOB_COLUMNS, "queue")
    kind: Mapped[str] = _column(_JOB_COLUMNS, "kind")
    payload: Mapped[Any] = _column(_JOB_COLUMNS, "payload")
    status: Mapped[JobStatus] = _column(_JOB_COLUMNS, "status")
    priority: Mapped[int] = _column(_JOB_COLUMNS, "priority")
    run_at: Mapped[dt.datetime] = _column(_JOB_COLUMNS, "run_at")
    attempts: Mapped[int] = _column(_JOB_COLUMNS, "attempts")
    max_attempts: Mapped[int] = _column(_JOB_COLUMNS, "max_attempts")
    lease_until: Mapped[dt.datetime | None] = _column(_JOB_COLUMNS, "lease_until")
    lease_token: Mapped[uuid.UUID | None] = _column(_JOB_COLUMNS, "lease_token")
    worker_id: Mapped[str | None] = _column(_JOB_COLUMNS, "worker_id")
    deduplication_key: Mapped[str | None] = _column(_JOB_COLUMNS, "deduplication_key")
    last_error: Mapped[str | None] = _column(_JOB_COLUMNS, "last_error")
    created_at: Mapped[dt.datetime] = _column(_JOB_COLUMNS, "created_at")
    updated_at: Mapped[dt.datetime] = _column(_JOB_COLUMNS, "updated_at")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        setup, options = _table_options(cls, "job", RECOMMENDED_JOB_STORAGE)
        partitioned = setup.interval is not None
        # NotifyTrigger: create_all also creates the statement-level NOTIFY trigger;
        # TableSetup: the storage settings, or the partitions and the dedup trigger.
        indexes = job_table_args(_table_name(cls), partitioned=partitioned)
        return (*indexes, NotifyTrigger(), setup, options)


class OutboxMixin:
    """The outbox table's columns and indexes, for a plain declarative base.

    ``metadata.create_all`` also creates the table's two triggers (`OutboxTriggers`): one
    makes ``seq`` follow commit order within an aggregate, the other wakes relays up.

    Example:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class OutboxEvent(OutboxMixin, Base):
        ...     __tablename__ = "outbox"
        >>> OutboxEvent.__table__.c.seq.identity is not None
        True
    """

    __table_schema__: ClassVar[str | None] = None
    #: As on `JobMixin`: partition the table by ``created_at``, and its storage parameters.
    __partition_interval__: ClassVar[str | None] = None
    __table_storage__: ClassVar[Mapping[str, int | float | bool] | None] = (
        RECOMMENDED_OUTBOX_STORAGE
    )
    #: Domain event subclasses declare plain (unmapped) annotations as their fields.
    __allow_unmapped__: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass without a table of its own is a domain event: give it its fields and
        # constructor before SQLAlchemy maps it. Imported here: events build on statements,
        # which build on this module.
        if "__tablename__" not in cls.__dict__ and any(
            "__table__" in base.__dict__ for base in cls.__mro__[1:]
        ):
            from ._event_classes import prepare_event_class

            prepare_event_class(cls)
        super().__init_subclass__(**kwargs)

    id: Mapped[uuid.UUID] = _column(_OUTBOX_COLUMNS, "id")
    seq: Mapped[int] = _column(_OUTBOX_COLUMNS, "seq")
    aggregate_type: Mapped[str] = _column(_OUTBOX_COLUMNS, "aggregate_type")
    aggregate_id: Mapped[str] = _column(_OUTBOX_COLUMNS, "aggregate_id")
    event_type: Mapped[str] = _column(_OUTBOX_COLUMNS, "event_type")
    payload: Mapped[Any] = _column(_OUTBOX_COLUMNS, "payload")
    headers: Mapped[dict[str, Any]] = _column(_OUTBOX_COLUMNS, "headers")
    attempts: Mapped[int] = _column(_OUTBOX_COLUMNS, "attempts")
    relay_until: Mapped[dt.datetime | None] = _column(_OUTBOX_COLUMNS, "relay_until")
    relay_token: Mapped[uuid.UUID | None] = _column(_OUTBOX_COLUMNS, "relay_token")
    published_at: Mapped[dt.datetime | None] = _column(_OUTBOX_COLUMNS, "published_at")
    parked_at: Mapped[dt.datetime | None] = _column(_OUTBOX_COLUMNS, "parked_at")
    last_error: Mapped[str | None] = _column(_OUTBOX_COLUMNS, "last_error")
    created_at: Mapped[dt.datetime] = _column(_OUTBOX_COLUMNS, "created_at")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...] | None:
        if _inherits_a_table(cls):
            return None  # a domain event: it lives in its outbox model's table
        setup, options = _table_options(cls, "outbox", RECOMMENDED_OUTBOX_STORAGE)
        partitioned = setup.interval is not None
        # OutboxTriggers: create_all also creates the ordering and wake-up triggers.
        return (
            *outbox_table_args(_table_name(cls), partitioned=partitioned),
            OutboxTriggers(),
            setup,
            options,
        )


_CLASS_SETTINGS = frozenset(
    {"__table_schema__", "__allow_unmapped__", "__partition_interval__", "__table_storage__"}
)


def _dataclass_variant(mixin: type[_C], specs: dict[str, _Spec], doc: str) -> type[_C]:
    # MappedAsDataclass bases refuse attributes inherited from a non-dataclass mixin, and plain
    # bases refuse dataclass arguments: the same columns, re-declared with dataclass kwargs.
    # Required fields (no default) must come first in a dataclass.
    names = sorted(
        mixin.__annotations__.keys() - _CLASS_SETTINGS,
        key=lambda n: bool(specs[n][2]),
    )
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": mixin.__name__.replace("Mixin", "DataclassMixin"),
        "__doc__": doc,
        "__annotations__": {n: mixin.__annotations__[n] for n in names},
        "__table_args__": mixin.__dict__["__table_args__"],
        "__table_schema__": None,
    }
    namespace.update({n: _column(specs, n, dataclass=True) for n in names})
    return cast(
        "type[_C]",
        type(namespace["__qualname__"], (MappedAsDataclass, mixin), namespace),
    )


JobDataclassMixin = _dataclass_variant(
    JobMixin,
    _JOB_COLUMNS,
    """`JobMixin` for a ``MappedAsDataclass`` base: ``Job(kind=..., payload=...)``.

    Example:
        >>> from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass
        >>> class Base(MappedAsDataclass, DeclarativeBase):
        ...     pass
        >>> class Job(JobDataclassMixin, Base):
        ...     __tablename__ = "jobs"
        >>> Job(kind="send-email", payload={"to": "ana"}).queue
        'default'
    """,
)

OutboxDataclassMixin = _dataclass_variant(
    OutboxMixin,
    _OUTBOX_COLUMNS,
    """`OutboxMixin` for a ``MappedAsDataclass`` base.

    Example:
        >>> from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass
        >>> class Base(MappedAsDataclass, DeclarativeBase):
        ...     pass
        >>> class OutboxEvent(OutboxDataclassMixin, Base):
        ...     __tablename__ = "outbox"
        >>> OutboxEvent(aggregate_type="order", aggregate_id="1", event_type="placed",
        ...             payload={}).attempts
        0
    """,
)


def resolve_table(target: object) -> Table:
    """The `Table` behind a mapped class, an ORM entity or a `Table` itself.

    Example:
        >>> from sqlalchemy import MetaData, Table, Column, Integer
        >>> t = Table("t", MetaData(), Column("id", Integer, primary_key=True))
        >>> resolve_table(t) is t
        True
    """
    if isinstance(target, Table):
        return target
    table = getattr(target, "__table__", None)
    if isinstance(table, Table):
        return table
    try:
        mapper = inspect(target)
    except Exception:
        mapper = None
    local = getattr(mapper, "local_table", None)
    if isinstance(local, Table):
        return local
    raise InvalidArgumentType(
        f"expected a Table or a mapped class using JobMixin/OutboxMixin, got {target!r}"
    )
