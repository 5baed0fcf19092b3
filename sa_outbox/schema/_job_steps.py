"""`JobStepMixin`: the table of durable steps' results, one row per (job, step) completed."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, ClassVar

from sqlalchemy import DateTime, Text, Uuid, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, declared_attr

from ._columns import _NO_INIT, _column, _Spec
from ._mixins import _dataclass_variant

_STEP_COLUMNS: dict[str, _Spec] = {
    "job_id": (Uuid, {"primary_key": True}, {}),
    "name": (Text, {"primary_key": True}, {}),
    "result": (lambda: JSONB(none_as_null=False), {"nullable": False}, {}),
    "created_at": (
        lambda: DateTime(timezone=True),
        {"nullable": False, "server_default": func.now()},
        _NO_INIT,
    ),
}


class JobStepMixin:
    """One row per step of a job that completed: its name and its result (JSON).

    A handler written as named steps (`JobContext.step`) records each step's result here
    when the step completes, fenced by the job's lease token, so a retry after a crash
    returns the recorded result instead of running the step again. A step given a Session
    commits its own rows and this row in one transaction. A plain table (no enum, no
    trigger): ``alembic revision --autogenerate`` renders it with ``op.create_table``.
    `JobApp(Job, steps=JobStep)` tells the worker to use it; retention prunes a job's steps
    with the job.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class JobStep(JobStepMixin, Base):
        ...     __tablename__ = "job_steps"
        >>> [c.name for c in JobStep.__table__.columns]
        ['job_id', 'name', 'result', 'created_at']
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None

    job_id: Mapped[uuid.UUID] = _column(_STEP_COLUMNS, "job_id")
    name: Mapped[str] = _column(_STEP_COLUMNS, "name")
    #: What the step returned, as JSON (``null`` for ``None``).
    result: Mapped[Any] = _column(_STEP_COLUMNS, "result")
    created_at: Mapped[dt.datetime] = _column(_STEP_COLUMNS, "created_at")

    @declared_attr.directive
    def __table_args__(cls) -> dict[str, Any]:
        schema = cls.__dict__.get("__table_schema__", getattr(cls, "__table_schema__", None))
        return {} if schema is None else {"schema": schema}


JobStepDataclassMixin = _dataclass_variant(
    JobStepMixin,
    _STEP_COLUMNS,
    """`JobStepMixin` for a ``MappedAsDataclass`` base.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass
        >>> class Base(MappedAsDataclass, DeclarativeBase):
        ...     pass
        >>> class JobStep(JobStepDataclassMixin, Base):
        ...     __tablename__ = "job_steps"
        >>> [c.name for c in JobStep.__table__.columns]
        ['job_id', 'name', 'result', 'created_at']
    """,
)
