"""The worker: `Worker` (threads) and `AsyncWorker` (asyncio).

Register handlers by kind on a `JobApp`, then run a worker on it, from Python or with
``sa-outbox worker myapp.tasks:app``. See docs/worker.md.

Examples:
    from sa_outbox import JobApp, JobContext, Worker

    app = JobApp(Job)

    @app.handler("send-email", timeout=30)
    def send_email(job: JobContext) -> None:
        mailer.send(job.payload["to"], idempotency_key=str(job.id))

    Worker(app, engine, queues=["default", "emails"], concurrency=16).run()
"""

from ._driver import ALL_KINDS
from ._results_async import AsyncJobResults
from ._results_sync import JobResults
from .aio import AsyncWorker
from .context import CancelReason, CancelToken, JobContext
from .errors import (
    DatabaseUnreachable,
    InvalidPayload,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobTimeout,
    PermanentError,
    ResultTimeout,
    SignalTimeout,
    Snooze,
    StepsUnavailable,
    UnknownJobKind,
)
from .metrics import CountingMetrics, JobOutcome, WorkerMetrics
from .reclaimer import AsyncReclaimer, Reclaimer
from .registry import Handler, HandlerSpec, JobApp, backoff_wait
from .schedule import Schedule, ScheduleStatus, Tick, periodic_tick, schedule_status
from .supervisor import Supervisor
from .sync import Worker

__all__ = [
    "ALL_KINDS",
    "AsyncJobResults",
    "AsyncReclaimer",
    "AsyncWorker",
    "CancelReason",
    "CancelToken",
    "CountingMetrics",
    "DatabaseUnreachable",
    "Handler",
    "HandlerSpec",
    "InvalidPayload",
    "JobApp",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobOutcome",
    "JobResults",
    "JobTimeout",
    "PermanentError",
    "Reclaimer",
    "ResultTimeout",
    "Schedule",
    "ScheduleStatus",
    "SignalTimeout",
    "Snooze",
    "StepsUnavailable",
    "Supervisor",
    "Tick",
    "UnknownJobKind",
    "Worker",
    "WorkerMetrics",
    "backoff_wait",
    "periodic_tick",
    "schedule_status",
]
