"""`QueuePauseMixin`: the control table whose rows are the paused queues."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import DateTime, Text, func
from sqlalchemy.orm import Mapped, declared_attr, mapped_column


class QueuePauseMixin:
    """One row per paused queue: a claim given this table never takes a job of those queues.

    A plain table (no enum, no trigger), so ``alembic revision --autogenerate`` renders it
    with Alembic's own ``op.create_table``. Pausing is per name: a queue needs no row
    anywhere else to be paused, so a queue may be paused before its first job exists.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class PausedQueue(QueuePauseMixin, Base):
        ...     __tablename__ = "paused_queues"
        >>> [c.name for c in PausedQueue.__table__.columns]
        ['queue', 'paused_at', 'paused_by']
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    paused_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    #: Who paused it: free text for operators.
    paused_by: Mapped[str | None] = mapped_column(Text, nullable=True)

    @declared_attr.directive
    def __table_args__(cls) -> dict[str, Any]:
        schema = cls.__dict__.get("__table_schema__", getattr(cls, "__table_schema__", None))
        return {} if schema is None else {"schema": schema}
