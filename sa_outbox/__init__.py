"""sa-outbox: a job queue and a transactional outbox in your own PostgreSQL, through SQLAlchemy.

The root holds what an application types first: the models' mixins, `JobQueue` and
`Outbox`, `enqueue` and `install`, `JobApp` and `Worker`, `Relay`, the retention and vacuum
policies, the clocks and the exceptions. The rest lives in its subpackage: the typed results
and the inspection of a queue (`queue_status`, `list_jobs`, their rows) in `sa_outbox.queue`,
the upkeep reports and `table_health` in `sa_outbox.maintenance`, the worker's metrics,
cancellation and reclaimer in `sa_outbox.worker`, the relay's report and metrics in
`sa_outbox.relay`, the statements in `sa_outbox.statements`.

Examples:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> import sa_outbox
    >>> class Base(DeclarativeBase):
    ...     pass
    >>> class Job(sa_outbox.JobMixin, Base):
    ...     __tablename__ = "jobs"
    >>> sa_outbox.JobQueue(Job)
    JobQueue('jobs')
"""

import importlib as _importlib
import warnings as _warnings
from typing import Any as _Any

from ._backoff import Backoff
from ._clock import Clock, DatabaseClock, FakeClock
from ._connect_args import connect_args
from ._embedded import embedded_database_url
from ._exceptions import (
    InvalidArgument,
    InvalidArgumentType,
    LeaseLost,
    MissingExtra,
    PayloadNotSerializable,
    PayloadTooLarge,
    SaOutboxError,
)
from .events import UnknownEventType, decode_event, enqueue, event_types, install
from .maintenance import (
    AsyncPruner,
    AsyncVacuumer,
    Pruner,
    Retention,
    Vacuumer,
    VacuumPolicy,
    amaintain_partitions,
    maintain_partitions,
)
from .queue import (
    AsyncInbox,
    AsyncJobQueue,
    AsyncOutbox,
    AsyncQueueControl,
    Inbox,
    JobQueue,
    Outbox,
    QueueControl,
)
from .relay import (
    AsyncRelay,
    EventsRejected,
    Publisher,
    PublishError,
    PublisherUnavailable,
    Relay,
)
from .schema import (
    InboxDataclassMixin,
    InboxMixin,
    JobDataclassMixin,
    JobMixin,
    JobStatus,
    JobStepMixin,
    OutboxDataclassMixin,
    OutboxMixin,
    QueuePauseMixin,
    RateLimitLogMixin,
)
from .statements import ClaimLimits, Limit, NewJob, Unique
from .worker import (
    AsyncWorker,
    DatabaseUnreachable,
    InvalidPayload,
    JobApp,
    JobCancelled,
    JobContext,
    JobTimeout,
    PermanentError,
    Schedule,
    Snooze,
    Supervisor,
    UnknownJobKind,
    Worker,
    periodic_tick,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "AsyncInbox",
    "AsyncJobQueue",
    "AsyncOutbox",
    "AsyncPruner",
    "AsyncQueueControl",
    "AsyncRelay",
    "AsyncVacuumer",
    "AsyncWorker",
    "Backoff",
    "ClaimLimits",
    "Clock",
    "DatabaseClock",
    "DatabaseUnreachable",
    "EventsRejected",
    "FakeClock",
    "Inbox",
    "InboxDataclassMixin",
    "InboxMixin",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidPayload",
    "JobApp",
    "JobCancelled",
    "JobContext",
    "JobDataclassMixin",
    "JobMixin",
    "JobQueue",
    "JobStatus",
    "JobStepMixin",
    "JobTimeout",
    "LeaseLost",
    "Limit",
    "MissingExtra",
    "NewJob",
    "Outbox",
    "OutboxDataclassMixin",
    "OutboxMixin",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "PermanentError",
    "Pruner",
    "PublishError",
    "Publisher",
    "PublisherUnavailable",
    "QueueControl",
    "QueuePauseMixin",
    "RateLimitLogMixin",
    "Relay",
    "Retention",
    "SaOutboxError",
    "Schedule",
    "Snooze",
    "Supervisor",
    "Unique",
    "UnknownEventType",
    "UnknownJobKind",
    "VacuumPolicy",
    "Vacuumer",
    "Worker",
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
]

#: Names the root used to export that now live in their subpackage only: still
#: importable from here for one release, with a `DeprecationWarning` naming their home.
_MOVED: dict[str, str] = {
    "BatchResult": "sa_outbox.queue",
    "CancelResult": "sa_outbox.queue",
    "ClaimedEvent": "sa_outbox.queue",
    "ClaimedJob": "sa_outbox.queue",
    "ConnectedWorker": "sa_outbox.queue",
    "EnqueueResult": "sa_outbox.queue",
    "EventRow": "sa_outbox.queue",
    "get_event": "sa_outbox.queue",
    "get_job": "sa_outbox.queue",
    "JobCount": "sa_outbox.queue",
    "JobRow": "sa_outbox.queue",
    "JobsStatus": "sa_outbox.queue",
    "list_events": "sa_outbox.queue",
    "list_jobs": "sa_outbox.queue",
    "list_running_jobs": "sa_outbox.queue",
    "OutboxStatus": "sa_outbox.queue",
    "ParkedEvent": "sa_outbox.queue",
    "PausedQueue": "sa_outbox.queue",
    "queue_depths": "sa_outbox.queue",
    "queue_status": "sa_outbox.queue",
    "QueueDepth": "sa_outbox.queue",
    "QueueStatus": "sa_outbox.queue",
    "ReclaimedJob": "sa_outbox.queue",
    "RejectedEvent": "sa_outbox.queue",
    "RetriedJobs": "sa_outbox.queue",
    "retry_failed": "sa_outbox.queue",
    "retry_parked": "sa_outbox.queue",
    "RetryResult": "sa_outbox.queue",
    "RunningJob": "sa_outbox.queue",
    "throughput_by_minute": "sa_outbox.queue",
    "ThroughputMinute": "sa_outbox.queue",
    "WorkerJobs": "sa_outbox.queue",
    "HealthReport": "sa_outbox.maintenance",
    "PartitionHealth": "sa_outbox.maintenance",
    "PartitionReport": "sa_outbox.maintenance",
    "PruneReport": "sa_outbox.maintenance",
    "table_health": "sa_outbox.maintenance",
    "TableHealth": "sa_outbox.maintenance",
    "VacuumReport": "sa_outbox.maintenance",
    "XminHolder": "sa_outbox.maintenance",
    "RelayMetrics": "sa_outbox.relay",
    "RelayReport": "sa_outbox.relay",
    "ALL_KINDS": "sa_outbox.worker",
    "AsyncReclaimer": "sa_outbox.worker",
    "CancelReason": "sa_outbox.worker",
    "CancelToken": "sa_outbox.worker",
    "CountingMetrics": "sa_outbox.worker",
    "JobOutcome": "sa_outbox.worker",
    "Reclaimer": "sa_outbox.worker",
    "schedule_status": "sa_outbox.worker",
    "WorkerMetrics": "sa_outbox.worker",
}


def __getattr__(name: str) -> _Any:
    """An old root name, with a warning naming the subpackage to import it from.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     import sa_outbox.queue
        ...     sa_outbox.JobRow is sa_outbox.queue.JobRow
        True
        >>> print(caught[0].message)
        sa_outbox.JobRow is deprecated: import it from sa_outbox.queue
    """
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'sa_outbox' has no attribute {name!r}")
    _warnings.warn(
        f"sa_outbox.{name} is deprecated: import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_importlib.import_module(module), name)
