"""`JobDependencyMixin`: jobs that wait for other jobs, one row per dependant job."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, ClassVar

from sqlalchemy import DateTime, Index, Text, Uuid, func, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, declared_attr

from ._columns import _NO_INIT, _column, _Spec
from ._mixins import _dataclass_variant

#: What a dependant does when a job it waits for fails or is cancelled: it is cancelled,
#: it fails, or it runs anyway once every job it waits for has finished.
ON_FAILURE = ("cancel", "fail", "run")

_DEPENDENCY_COLUMNS: dict[str, _Spec] = {
    "job_id": (Uuid, {"primary_key": True}, {}),
    "workflow_id": (Uuid, {"nullable": False}, {}),
    "parents": (lambda: ARRAY(Uuid), {"nullable": False}, {}),
    "on_failure": (Text, {"nullable": False}, {}),
    "job": (JSONB, {"nullable": False}, {}),
    "released_at": (lambda: DateTime(timezone=True), {"nullable": True}, {"default": None}),
    "created_at": (
        lambda: DateTime(timezone=True),
        {"nullable": False, "server_default": func.now()},
        _NO_INIT,
    ),
}


class JobDependencyMixin:
    """One row per job enqueued to run after others (``JobQueue.enqueue(..., after=[...])``).

    The job waits here, not in the job table, so no claim ever meets it: ``job`` holds its
    values until every job in ``parents`` has succeeded, when it is released into the job
    table (``released_at`` is set then, in the same transaction), or until one of them
    failed or was cancelled, when it is released as ``cancelled`` or ``failed`` (the
    ``on_failure`` policy; ``run`` waits for all of them to finish and runs it anyway). The
    row stays after its release: it records the job's parents (`JobContext.parent_results`)
    and the workflow it joined (``workflow_id``: its first parent's, or that parent's own id,
    for ``sa-outbox workflows``), and retention prunes it with its job.

    A plain table: ``alembic revision --autogenerate`` renders it with ``op.create_table``
    and its indexes: a GIN index on ``parents`` (which jobs wait for a job that finished),
    a partial one on the waiting rows (the sweep), one on ``workflow_id``.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase):
        ...     pass
        >>> class JobDependency(JobDependencyMixin, Base):
        ...     __tablename__ = "job_dependencies"
        >>> [c.name for c in JobDependency.__table__.columns]
        ['job_id', 'workflow_id', 'parents', 'on_failure', 'job', 'released_at', 'created_at']
        >>> sorted(i.name.split("_")[-2] for i in JobDependency.__table__.indexes)
        ['parents', 'waiting', 'workflow']
    """

    #: The schema of the table; ``None`` takes the metadata's default schema.
    __table_schema__: ClassVar[str | None] = None

    #: The id the job has (in the job table once released).
    job_id: Mapped[uuid.UUID] = _column(_DEPENDENCY_COLUMNS, "job_id")
    #: The workflow it joined: the id of the job that started it (its first parent's).
    workflow_id: Mapped[uuid.UUID] = _column(_DEPENDENCY_COLUMNS, "workflow_id")
    #: The jobs it waits for.
    parents: Mapped[list[uuid.UUID]] = _column(_DEPENDENCY_COLUMNS, "parents")
    #: ``cancel``, ``fail`` or ``run``: what a parent that did not succeed does to it.
    on_failure: Mapped[str] = _column(_DEPENDENCY_COLUMNS, "on_failure")
    #: The job's values (kind, queue, payload, …) until it is released.
    job: Mapped[Any] = _column(_DEPENDENCY_COLUMNS, "job")
    #: When it went into the job table; ``NULL`` while it waits.
    released_at: Mapped[dt.datetime | None] = _column(_DEPENDENCY_COLUMNS, "released_at")
    created_at: Mapped[dt.datetime] = _column(_DEPENDENCY_COLUMNS, "created_at")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        name = cls.__dict__.get("__tablename__", getattr(cls, "__tablename__", "dependencies"))
        schema = cls.__dict__.get("__table_schema__", getattr(cls, "__table_schema__", None))
        waiting = text("released_at IS NULL")
        indexes = (
            # Not partial: a query that names released_at would let the planner pick the
            # waiting rows' index instead, and read every waiting row (`select_dependants`).
            # fastupdate off: releases update rows all the time, and a GIN pending list fed by
            # them would be read whole by every lookup.
            Index(
                f"{name}_parents_idx",
                "parents",
                postgresql_using="gin",
                postgresql_with={"fastupdate": "off"},
            ),
            Index(f"{name}_waiting_idx", "job_id", postgresql_where=waiting),
            Index(f"{name}_workflow_idx", "workflow_id"),
        )
        return (*indexes, {}) if schema is None else (*indexes, {"schema": schema})


JobDependencyDataclassMixin = _dataclass_variant(
    JobDependencyMixin,
    _DEPENDENCY_COLUMNS,
    """`JobDependencyMixin` for a ``MappedAsDataclass`` base.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass
        >>> class Base(MappedAsDataclass, DeclarativeBase):
        ...     pass
        >>> class JobDependency(JobDependencyDataclassMixin, Base):
        ...     __tablename__ = "job_dependencies"
        >>> sorted(i.name for i in JobDependency.__table__.indexes)[0]
        'job_dependencies_parents_idx'
    """,
)
