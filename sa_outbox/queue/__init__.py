"""Layer 3, executors: run the statement builder's statements and return typed results.

May import: ``sa_outbox.statements``, ``sa_outbox.schema`` and the foundation modules. Not
the runtimes (worker, relay, maintenance) nor the integrations, which build on this layer.

- ``_executors``: each operation written once, as a generator of statements, driven by a
  sync or an asyncio runner (`SyncConn` / `AsyncConn`: a Connection, Session, Engine or
  their asyncio twins);
- ``_job_queue``: `JobQueue` / `AsyncJobQueue`; ``_outbox``: `Outbox` / `AsyncOutbox`;
- ``_copy``: bulk enqueue through ``COPY``; ``_results``: the typed result records.

Example:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> from sa_outbox.schema import JobMixin
    >>> class Base(DeclarativeBase): pass
    >>> class Job(JobMixin, Base): __tablename__ = "jobs"
    >>> JobQueue(Job)
    JobQueue('jobs')
"""

from ._job_queue import AsyncJobQueue, JobQueue
from ._outbox import AsyncOutbox, Outbox
from ._results import (
    BatchResult,
    CancelResult,
    ClaimedEvent,
    ClaimedJob,
    EnqueueResult,
    ParkedEvent,
    ReclaimedJob,
    RejectedEvent,
    RetryResult,
)

__all__ = [
    "AsyncJobQueue",
    "AsyncOutbox",
    "BatchResult",
    "CancelResult",
    "ClaimedEvent",
    "ClaimedJob",
    "EnqueueResult",
    "JobQueue",
    "Outbox",
    "ParkedEvent",
    "ReclaimedJob",
    "RejectedEvent",
    "RetryResult",
]
