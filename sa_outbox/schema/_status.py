"""The ``job_status`` enum: `JobStatus` and its SQLAlchemy type, in the table's schema."""

from __future__ import annotations

import enum
from typing import Any, TypeGuard, cast

from sqlalchemy import (
    Enum,
    Table,
    event,
)

#: Name of the PostgreSQL enum type of ``jobs.status`` (created in the table's schema).
JOB_STATUS_TYPE_NAME = "job_status"


#: Key of ``Table.info`` where the mixins record what a table is: ``"job"`` or ``"outbox"``
#: (``alembic_ext`` reads it to render its own operations for these tables).
TABLE_KIND_INFO_KEY = "sa_outbox"


class JobStatus(enum.StrEnum):
    """The five states of a job.

    ``pending`` (waiting for its ``run_at``, new, retried or snoozed), ``running`` (claimed
    under a lease), and three finished states, which retention prunes and nothing changes
    again: ``succeeded``, ``failed`` (a permanent error, or ``max_attempts`` reached) and
    ``cancelled`` (by `JobQueue.cancel`; a job cancelled while running keeps its lease token
    until its worker notices, at its next heartbeat, and ends it).

    Examples:
        >>> JobStatus("running") is JobStatus.RUNNING
        True
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


def job_status_enum(*, create_type: bool = True) -> Enum:
    """The ``job_status`` column type; it takes the schema of the table it is attached to.

    Examples:
        >>> job_status_enum().enums
        ['pending', 'running', 'succeeded', 'failed', 'cancelled']
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
        if _is_job_status(col.type):
            col.type.schema = table.schema
        elif _is_job_status(item := getattr(col.type, "item_type", None)):
            # An array of them (``unique_states``): the copies of a mixin's column share
            # their array's element type, so each table's column gets one of its own.
            own: Any = cast(Any, item).copy()
            own.schema = table.schema
            own.create_type = False  # the status column creates the type (copy() forgets)
            array: Any = col.type.copy()
            array.item_type = own
            col.type = array


def _is_job_status(type_: object) -> TypeGuard[Enum]:
    return isinstance(type_, Enum) and type_.enum_class is JobStatus
