"""A job's span: the handler runs in it when the job carries a trace context (docs/tracing.md).

The span is a child of the context the job was enqueued in (its ``traceparent`` header),
of kind CONSUMER, named ``process <kind>``, with the OpenTelemetry messaging attributes
that fit a job queue. A job without a trace context runs in no span of the worker's: the
worker continues traces, it does not start them. Without OpenTelemetry installed, a job
costs one test of a constant.

Examples:
    >>> import uuid
    >>> from sa_outbox.queue import ClaimedJob
    >>> job = ClaimedJob(uuid.UUID(int=1), "default", "send-email", {}, 0, None, 1, 8, None,
    ...                  uuid.UUID(int=2), "w1", None, None)
    >>> job_span(job, "w1") is None  # no headers: no span
    True
"""

from __future__ import annotations

from .._tracing import AVAILABLE, TRACEPARENT, TraceSpan, start_span
from ..queue import ClaimedJob
from .errors import JobCancelled, Snooze

__all__ = ["end_job_span", "job_attributes", "job_span"]


def job_attributes(job: ClaimedJob, worker_id: str) -> dict[str, str | int | bool]:
    """The span attributes of ``job`` (OpenTelemetry's messaging conventions, and ours).

    Examples:
        >>> import uuid
        >>> from sa_outbox.queue import ClaimedJob
        >>> job = ClaimedJob(uuid.UUID(int=1), "emails", "send-email", {}, 0, None, 2, 8,
        ...                  None, uuid.UUID(int=2), "w1", None, None)
        >>> job_attributes(job, "w1")["sa_outbox.job.attempt"]
        2
    """
    return {
        "messaging.system": "sa-outbox",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "messaging.client.id": worker_id,
        "sa_outbox.job.kind": job.kind,
        "sa_outbox.job.attempt": job.attempts,
        "sa_outbox.job.max_attempts": job.max_attempts,
    }


def job_span(job: ClaimedJob, worker_id: str) -> TraceSpan | None:
    """The started span of ``job``, or ``None`` when it carries no trace context (or
    OpenTelemetry is absent)."""
    headers = job.headers
    if not AVAILABLE or headers is None or TRACEPARENT not in headers:
        return None
    return start_span(
        headers, f"process {job.kind}", kind="consumer", attributes=job_attributes(job, worker_id)
    )


def end_job_span(span: TraceSpan, error: BaseException | None, cancelled: bool) -> None:
    """Record how the handler ended, then end the span.

    A raised exception is recorded and sets the status to error, except a `Snooze` (the job
    asked to run later) and a `JobCancelled` the worker asked for (``cancelled``: shutdown,
    lost lease, timeout, cancellation), which are no failure of the handler's.
    """
    try:
        if isinstance(error, Snooze):
            span.set_attribute("sa_outbox.job.snoozed", True)
        elif isinstance(error, JobCancelled) and cancelled:
            span.set_attribute("sa_outbox.job.cancelled", True)
        elif error is not None:
            span.fail(error)
    finally:
        span.end()
