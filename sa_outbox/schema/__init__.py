"""The job, outbox and inbox tables, as mixins for the user's declarative base.

The tables follow the article's schema (sections 4 and 5) with two additions: a ``queue``
column on jobs, and a monotonic ``seq`` column on the outbox, so events added by one
transaction keep the order they were added in (random UUIDs and ``now()`` do not order).

Plain declarative bases (``DeclarativeBase``, ``DeclarativeBaseNoMeta``, Flask-SQLAlchemy's
``db.Model``) take `JobMixin` / `OutboxMixin`; ``MappedAsDataclass`` bases take
`JobDataclassMixin` / `OutboxDataclassMixin`, which declare the same columns as dataclass
fields. Table names are the user's (``__tablename__``); a schema is set with
``__table_schema__`` or the metadata's own ``schema``. Index names derive from the table
name: ``{table}_ready_idx``, ``{table}_dedup_idx``, …

Beside the jobs and the outbox: `QueuePauseMixin` (the table of paused queues),
`RateLimitLogMixin` (the recent claims that rate limits count), `JobStepMixin` /
`JobStepDataclassMixin` (durable steps' recorded results), `JobDependencyMixin` /
`JobDependencyDataclassMixin` (jobs waiting for other jobs), and `InboxMixin` /
`InboxDataclassMixin` (a consumer's table of the messages it handled, keyed by
``(source, message_id)``). A dataclass variant's field defaults are the constructor's: the
columns' defaults stay the server's, as in the plain mixins.

Examples:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> class Base(DeclarativeBase):
    ...     pass
    >>> class Job(JobMixin, Base):
    ...     __tablename__ = "jobs"
    >>> class OutboxEvent(OutboxMixin, Base):
    ...     __tablename__ = "outbox"
    >>> sorted(index.name for index in Job.__table__.indexes)
    ... # doctest: +NORMALIZE_WHITESPACE
    ['jobs_dedup_idx', 'jobs_expired_lease_idx', 'jobs_ready_idx', 'jobs_ready_kind_idx',
     'jobs_ready_order_idx', 'jobs_retention_idx', 'jobs_serial_idx', 'jobs_unique_idx']
"""

from ._columns import inbox_table_args, job_table_args, outbox_table_args
from ._job_dependencies import ON_FAILURE, JobDependencyDataclassMixin, JobDependencyMixin
from ._job_steps import JobStepDataclassMixin, JobStepMixin
from ._mixins import (
    InboxDataclassMixin,
    InboxMixin,
    JobDataclassMixin,
    JobMixin,
    OutboxDataclassMixin,
    OutboxMixin,
    resolve_table,
)
from ._partition_ddl import PARTITION_INFO_KEY, PARTITION_INTERVALS
from ._queue_pause import QueuePauseMixin
from ._rate_log import RateLimitLogMixin
from ._status import JOB_STATUS_TYPE_NAME, TABLE_KIND_INFO_KEY, JobStatus, job_status_enum
from ._storage import RECOMMENDED_JOB_STORAGE, RECOMMENDED_OUTBOX_STORAGE, STORAGE_INFO_KEY

__all__ = [
    "JOB_STATUS_TYPE_NAME",
    "ON_FAILURE",
    "PARTITION_INFO_KEY",
    "PARTITION_INTERVALS",
    "RECOMMENDED_JOB_STORAGE",
    "RECOMMENDED_OUTBOX_STORAGE",
    "STORAGE_INFO_KEY",
    "TABLE_KIND_INFO_KEY",
    "InboxDataclassMixin",
    "InboxMixin",
    "JobDataclassMixin",
    "JobDependencyDataclassMixin",
    "JobDependencyMixin",
    "JobMixin",
    "JobStatus",
    "JobStepDataclassMixin",
    "JobStepMixin",
    "OutboxDataclassMixin",
    "OutboxMixin",
    "QueuePauseMixin",
    "RateLimitLogMixin",
    "inbox_table_args",
    "job_status_enum",
    "job_table_args",
    "outbox_table_args",
    "resolve_table",
]
