"""Run the statement builder's statements and return typed results.

Each runs on what you have: a Connection, Session or Engine, or their asyncio twins
(`SyncConn` / `AsyncConn`).

- `JobQueue` / `AsyncJobQueue` (bulk enqueue through ``COPY`` included); `Outbox` /
  `AsyncOutbox`;
- `QueueControl` / `AsyncQueueControl`, pausing and resuming queues;
- `Inbox` / `AsyncInbox`, a consumer's de-duplication in its own transaction;
- `queue_status`, listings of jobs (running ones with their leases) and events,
  `queue_depths`, `throughput_by_minute`, and the retries by hand (`retry_failed`,
  `retry_parked`) the CLI and the dashboard share.

Examples:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> from sa_outbox.schema import JobMixin
    >>> class Base(DeclarativeBase): pass
    >>> class Job(JobMixin, Base): __tablename__ = "jobs"
    >>> JobQueue(Job)
    JobQueue('jobs')
"""

from ..ops._results import (
    Batch,
    BatchResult,
    CancelResult,
    ClaimedEvent,
    ClaimedJob,
    EnqueueResult,
    JobResult,
    ParkedEvent,
    ReclaimedJob,
    RejectedEvent,
    RetriedJobs,
    RetryResult,
    WorkflowRetry,
)
from ._control import AsyncQueueControl, PausedQueue, QueueControl
from ._inbox import AsyncInbox, Inbox
from ._inspect import (
    ConnectedWorker,
    EventRow,
    JobCount,
    JobRow,
    JobsStatus,
    JobStepRow,
    OutboxStatus,
    QueueDepth,
    QueueStatus,
    RunningJob,
    ThroughputMinute,
    WorkerJobs,
    WorkflowsStatus,
    as_plain,
    get_event,
    get_job,
    get_job_steps,
    kind_exists,
    list_events,
    list_jobs,
    list_running_jobs,
    queue_depths,
    queue_exists,
    queue_status,
    retry_failed,
    retry_parked,
    throughput_by_minute,
)
from ._job_queue_async import AsyncJobQueue
from ._job_queue_sync import JobQueue
from ._outbox_async import AsyncOutbox
from ._outbox_sync import Outbox
from ._workflows import (
    WorkflowJob,
    WorkflowSummary,
    get_workflow,
    list_workflows,
    workflow_depths,
)

__all__ = [
    "AsyncInbox",
    "AsyncJobQueue",
    "AsyncOutbox",
    "AsyncQueueControl",
    "Batch",
    "BatchResult",
    "CancelResult",
    "ClaimedEvent",
    "ClaimedJob",
    "ConnectedWorker",
    "EnqueueResult",
    "EventRow",
    "Inbox",
    "JobCount",
    "JobQueue",
    "JobResult",
    "JobRow",
    "JobStepRow",
    "JobsStatus",
    "Outbox",
    "OutboxStatus",
    "ParkedEvent",
    "PausedQueue",
    "QueueControl",
    "QueueDepth",
    "QueueStatus",
    "ReclaimedJob",
    "RejectedEvent",
    "RetriedJobs",
    "RetryResult",
    "RunningJob",
    "ThroughputMinute",
    "WorkerJobs",
    "WorkflowJob",
    "WorkflowRetry",
    "WorkflowSummary",
    "WorkflowsStatus",
    "as_plain",
    "get_event",
    "get_job",
    "get_job_steps",
    "get_workflow",
    "kind_exists",
    "list_events",
    "list_jobs",
    "list_running_jobs",
    "list_workflows",
    "queue_depths",
    "queue_exists",
    "queue_status",
    "retry_failed",
    "retry_parked",
    "throughput_by_minute",
    "workflow_depths",
]
