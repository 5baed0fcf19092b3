"""`RateLimitLogMixin`: the table of recent claims that rate limits count."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import BigInteger, DateTime, Identity, Index, Text
from sqlalchemy.orm import Mapped, declared_attr, mapped_column


class RateLimitLogMixin:
    """One row per job claimed under a rate limit, kept for one period of that limit.

    A claim of a rate-limited kind counts the rows of its scope newer than ``now - period``,
    takes at most the rest of the allowance, adds a row per job it took and deletes the rows
    that fell out of the window, all in the claim's own statement (see `JobApp.limit`). The
    table never holds more than a period's worth of claims per scope. A plain table, so
    ``alembic revision --autogenerate`` renders it with ``op.create_table``.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class RateLog(RateLimitLogMixin, Base):
        ...     __tablename__ = "job_rate_log"
        >>> [c.name for c in RateLog.__table__.columns]
        ['id', 'scope', 'claimed_at']
        >>> [i.name for i in RateLog.__table__.indexes]
        ['job_rate_log_scope_idx']
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    #: What was limited: ``kind:<the kind>``.
    scope: Mapped[str] = mapped_column(Text, nullable=False)
    claimed_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        schema = cls.__dict__.get("__table_schema__", getattr(cls, "__table_schema__", None))
        index = Index(f"{cls.__tablename__}_scope_idx", "scope", "claimed_at")  # type: ignore[attr-defined]
        return (index,) if schema is None else (index, {"schema": schema})
