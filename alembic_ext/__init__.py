"""sa-outbox for Alembic: operations for the library's tables, and an autogenerate hook.

One line in ``env.py`` sets it up (it registers ``op.create_job_queue``,
``op.drop_job_queue``, ``op.create_outbox``, ``op.drop_outbox``, ``op.create_inbox``,
``op.drop_inbox``, ``op.set_table_storage``, ``op.add_job_status_values``,
``op.create_serial_trigger``, ``op.drop_serial_trigger``,
their renderers and the autogenerate hook)::

    import alembic_ext  # noqa: F401

``alembic revision --autogenerate`` then writes, for models that use `JobMixin` and
`OutboxMixin` (and ``op.create_inbox('inbox')`` for one that uses `InboxMixin`)::

    def upgrade() -> None:
        op.create_job_queue('jobs')
        op.create_outbox('outbox')

    def downgrade() -> None:
        op.drop_outbox('outbox')
        op.drop_job_queue('jobs')

The functions of the same names take ``op`` first, for migrations checked by mypy
(``alembic_ext.create_job_queue(op, "jobs")``). See ``docs/alembic.md``.

Examples:
    >>> import alembic_ext
    >>> alembic_ext.CreateJobQueueOp("jobs").reverse()
    DropJobQueueOp('jobs', schema=None)
"""

from . import autogenerate as autogenerate
from . import render as render
from .operations import (
    AddJobStatusValuesOp,
    CreateInboxOp,
    CreateJobQueueOp,
    CreateOutboxOp,
    CreateSerialTriggerOp,
    DropInboxOp,
    DropJobQueueOp,
    DropOutboxOp,
    DropSerialTriggerOp,
    SetTableStorageOp,
    SupportsInvoke,
    add_job_status_values,
    create_inbox,
    create_job_queue,
    create_outbox,
    create_serial_trigger,
    drop_inbox,
    drop_job_queue,
    drop_outbox,
    drop_serial_trigger,
    set_table_storage,
)

__all__ = [
    "AddJobStatusValuesOp",
    "CreateInboxOp",
    "CreateJobQueueOp",
    "CreateOutboxOp",
    "CreateSerialTriggerOp",
    "DropInboxOp",
    "DropJobQueueOp",
    "DropOutboxOp",
    "DropSerialTriggerOp",
    "SetTableStorageOp",
    "SupportsInvoke",
    "add_job_status_values",
    "create_inbox",
    "create_job_queue",
    "create_outbox",
    "create_serial_trigger",
    "drop_inbox",
    "drop_job_queue",
    "drop_outbox",
    "drop_serial_trigger",
    "set_table_storage",
]
