"""`JobMixin` / `OutboxMixin` / `InboxMixin` (and their dataclass variants) for the user's own
base."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, cast

from sqlalchemy import (
    Table,
    inspect,
)
from sqlalchemy.orm import Mapped, MappedAsDataclass, declared_attr

from .._exceptions import InvalidArgumentType
from ._columns import (
    _INBOX_COLUMNS,
    _JOB_COLUMNS,
    _OUTBOX_COLUMNS,
    _column,
    _inherits_a_table,
    _schema_args,
    _Spec,
    _table_name,
    _table_options,
    inbox_table_args,
    job_table_args,
    outbox_table_args,
)
from ._event_types import prepare_event_class
from ._notify_trigger import NotifyTrigger
from ._outbox_triggers import OutboxTriggers
from ._serial_trigger import SerialTrigger
from ._status import TABLE_KIND_INFO_KEY, JobStatus
from ._storage import RECOMMENDED_JOB_STORAGE, RECOMMENDED_OUTBOX_STORAGE

_C = TypeVar("_C")


class JobMixin:
    """The job table's columns and indexes, for a plain declarative base.

    ``metadata.create_all`` also creates the table's NOTIFY trigger (one notification per
    inserting statement), which wakes workers up when jobs arrive.

    Examples:
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
    #: String headers (the W3C trace context it was enqueued in, and the caller's own).
    headers: Mapped[dict[str, str] | None] = _column(_JOB_COLUMNS, "headers")
    #: Serial key: jobs sharing it run one at a time, in commit order (`lock_seq`).
    lock_key: Mapped[str | None] = _column(_JOB_COLUMNS, "lock_key")
    lock_seq: Mapped[int | None] = _column(_JOB_COLUMNS, "lock_seq")
    #: A unique job's key (a digest of what makes it unique, and its time window), else NULL.
    unique_key: Mapped[str | None] = _column(_JOB_COLUMNS, "unique_key")
    #: The states in which a unique job holds its key (docs/unique.md), else NULL.
    unique_states: Mapped[list[JobStatus] | None] = _column(_JOB_COLUMNS, "unique_states")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        setup, options = _table_options(cls, "job", RECOMMENDED_JOB_STORAGE)
        partitioned = setup.interval is not None
        # NotifyTrigger, SerialTrigger: create_all also creates the statement-level NOTIFY
        # trigger and the serial keys' ordering trigger; TableSetup: the storage settings,
        # or the partitions and the dedup trigger.
        indexes = job_table_args(_table_name(cls), partitioned=partitioned)
        return (*indexes, NotifyTrigger(), SerialTrigger(), setup, options)


class OutboxMixin:
    """The outbox table's columns and indexes, for a plain declarative base.

    ``metadata.create_all`` also creates the table's two triggers (`OutboxTriggers`): one
    makes ``seq`` follow commit order within an aggregate, the other wakes relays up.

    Examples:
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
        # constructor before SQLAlchemy maps it.
        if "__tablename__" not in cls.__dict__ and any(
            "__table__" in base.__dict__ for base in cls.__mro__[1:]
        ):
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


class InboxMixin:
    """The consumer's inbox: one row per message handled, for a plain declarative base.

    The primary key ``(source, message_id)`` de-duplicates: a message id is unique per
    producer (``source``: the name you give the producer, such as ``"orders"``), and
    ``received_at`` is when the message was first accepted, which retention counts from.
    A plain table: no enum, no trigger, no partitions. `sa_outbox.Inbox` records a message
    in the consumer's own transaction; ``alembic_ext``'s ``op.create_inbox`` creates it.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class InboxEntry(InboxMixin, Base):
        ...     __tablename__ = "inbox"
        >>> [c.name for c in InboxEntry.__table__.primary_key.columns]
        ['source', 'message_id']
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None

    source: Mapped[str] = _column(_INBOX_COLUMNS, "source")
    message_id: Mapped[str] = _column(_INBOX_COLUMNS, "message_id")
    received_at: Mapped[dt.datetime] = _column(_INBOX_COLUMNS, "received_at")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        options = {**_schema_args(cls), "info": {TABLE_KIND_INFO_KEY: "inbox"}}
        return (*inbox_table_args(_table_name(cls)), options)


_CLASS_SETTINGS = frozenset(
    {"__table_schema__", "__allow_unmapped__", "__partition_interval__", "__table_storage__"}
)


def _dataclass_variant(mixin: type[_C], specs: dict[str, _Spec], doc: str) -> type[_C]:
    # MappedAsDataclass bases refuse attributes inherited from a non-dataclass mixin, and plain
    # bases refuse dataclass arguments: the same columns, re-declared with dataclass kwargs.
    # Required fields (no default) must come first in a dataclass; otherwise the mixin's own
    # order (a stable sort of the annotations in order, not of a set, whose order changes
    # with the hash seed: the inbox's composite primary key follows the columns' order).
    names = sorted(
        (name for name in mixin.__annotations__ if name not in _CLASS_SETTINGS),
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

    Examples:
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

    Examples:
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


InboxDataclassMixin = _dataclass_variant(
    InboxMixin,
    _INBOX_COLUMNS,
    """`InboxMixin` for a ``MappedAsDataclass`` base.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass
        >>> class Base(MappedAsDataclass, DeclarativeBase):
        ...     pass
        >>> class InboxEntry(InboxDataclassMixin, Base):
        ...     __tablename__ = "inbox"
        >>> InboxEntry(source="orders", message_id="0190").message_id
        '0190'
    """,
)


def resolve_table(target: object) -> Table:
    """The `Table` behind a mapped class, an ORM entity or a `Table` itself.

    Examples:
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
        f"expected a Table or a mapped class using JobMixin/OutboxMixin/InboxMixin, got {target!r}"
    )
