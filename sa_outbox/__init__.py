"""sa-outbox: a job queue and a transactional outbox in your own PostgreSQL, through SQLAlchemy.

Layers (imports point down; docs/architecture.md draws them): `sa_outbox.schema` (models)
→ `sa_outbox.statements` (the query builder, no I/O) → `sa_outbox.queue` (`JobQueue`,
`Outbox`: thin executors) → `sa_outbox.events` (the unit of work) and
`sa_outbox.maintenance` → `sa_outbox.worker` and `sa_outbox.relay` → `sa_outbox.publishers`
→ `sa_outbox.cli`. This module only re-exports the public names.

Example:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> import sa_outbox
    >>> class Base(DeclarativeBase):
    ...     pass
    >>> class Job(sa_outbox.JobMixin, Base):
    ...     __tablename__ = "jobs"
    >>> sa_outbox.JobQueue(Job)
    JobQueue('jobs')
"""

from ._backoff import Backoff
from ._clock import Clock, DatabaseClock, FakeClock
from ._connect_args import connect_args
from ._embedded import embedded_database_url
from ._exceptions import (
    InvalidArgument,
    InvalidArgumentType,
    LeaseLost,
    PayloadNotSerializable,
    PayloadTooLarge,
    SaOutboxError,
)
from .events import UnknownEventType, decode_event, enqueue, event_types, install
from .maintenance import (
    AsyncPruner,
    AsyncVacuumer,
    HealthReport,
    PartitionReport,
    Pruner,
    PruneReport,
    Retention,
    TableHealth,
    Vacuumer,
    VacuumPolicy,
    VacuumReport,
    XminHolder,
    amaintain_partitions,
    maintain_partitions,
    table_health,
)
from .queue import (
    AsyncJobQueue,
    AsyncOutbox,
    BatchResult,
    ClaimedEvent,
    ClaimedJob,
    EnqueueResult,
    JobQueue,
    Outbox,
    ParkedEvent,
    ReclaimedJob,
    RejectedEvent,
    RetryResult,
)
from .relay import (
    AsyncRelay,
    EventsRejected,
    Publisher,
    PublishError,
    PublisherUnavailable,
    Relay,
    RelayReport,
)
from .schema import JobDataclassMixin, JobMixin, JobStatus, OutboxDataclassMixin, OutboxMixin
from .statements import NewJob
from .worker import (
    ALL_KINDS,
    AsyncReclaimer,
    AsyncWorker,
    CancelReason,
    CancelToken,
    CountingMetrics,
    DatabaseUnreachable,
    InvalidPayload,
    JobApp,
    JobCancelled,
    JobContext,
    JobOutcome,
    JobTimeout,
    PermanentError,
    Reclaimer,
    Schedule,
    Supervisor,
    UnknownJobKind,
    Worker,
    WorkerMetrics,
    periodic_tick,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "ALL_KINDS",
    "AsyncJobQueue",
    "AsyncOutbox",
    "AsyncPruner",
    "AsyncReclaimer",
    "AsyncRelay",
    "AsyncVacuumer",
    "AsyncWorker",
    "Backoff",
    "BatchResult",
    "CancelReason",
    "CancelToken",
    "ClaimedEvent",
    "ClaimedJob",
    "Clock",
    "CountingMetrics",
    "DatabaseClock",
    "DatabaseUnreachable",
    "EnqueueResult",
    "EventsRejected",
    "FakeClock",
    "HealthReport",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidPayload",
    "JobApp",
    "JobCancelled",
    "JobContext",
    "JobDataclassMixin",
    "JobMixin",
    "JobOutcome",
    "JobQueue",
    "JobStatus",
    "JobTimeout",
    "LeaseLost",
    "NewJob",
    "Outbox",
    "OutboxDataclassMixin",
    "OutboxMixin",
    "ParkedEvent",
    "PartitionReport",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "PermanentError",
    "PruneReport",
    "Pruner",
    "PublishError",
    "Publisher",
    "PublisherUnavailable",
    "ReclaimedJob",
    "Reclaimer",
    "RejectedEvent",
    "Relay",
    "RelayReport",
    "Retention",
    "RetryResult",
    "SaOutboxError",
    "Schedule",
    "Supervisor",
    "TableHealth",
    "UnknownEventType",
    "UnknownJobKind",
    "VacuumPolicy",
    "VacuumReport",
    "Vacuumer",
    "Worker",
    "WorkerMetrics",
    "XminHolder",
    "__version__",
    "amaintain_partitions",
    "connect_args",
    "decode_event",
    "embedded_database_url",
    "enqueue",
    "event_types",
    "install",
    "maintain_partitions",
    "periodic_tick",
    "table_health",
]
