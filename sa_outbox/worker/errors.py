"""The exceptions of the worker runtime, under `SaOutboxError` like every other.

A handler raises `PermanentError` (or a subclass) when retrying cannot help: the job goes to
``failed`` at once. The worker itself records `UnknownJobKind` (no handler for the kind),
`InvalidPayload` (the kind's ``parse`` refused the payload) and `JobTimeout` (the kind's
timeout passed: retried like any transient error) in ``last_error``. `JobCancelled` is what
`CancelToken.raise_if_cancelled` raises inside a handler; `StepsUnavailable`, a durable
step called where it cannot run; `SignalTimeout`, a signal that did not come in time.
`JobFailed`, `ResultTimeout` and `JobNotFound` are what waiting for a job's result
(`JobResults.result`) raises when it did not succeed, did not finish in time, or is unknown.
`Snooze` is not an error: a handler returns or raises it to run its job again later,
without counting a failure.

Examples:
    >>> from sa_outbox import SaOutboxError
    >>> issubclass(UnknownJobKind, PermanentError) and issubclass(PermanentError, SaOutboxError)
    True
"""

from __future__ import annotations

import datetime as dt
import uuid

from .._exceptions import SaOutboxError
from ..schema import JobStatus
from ..statements._job_settle import MAX_SNOOZE, snooze_delay

__all__ = [
    "DatabaseUnreachable",
    "InvalidPayload",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "PermanentError",
    "ResultTimeout",
    "SignalTimeout",
    "Snooze",
    "StepsUnavailable",
    "UnknownJobKind",
]


class DatabaseUnreachable(SaOutboxError):
    """A worker could not use its database at start-up: a wrong URL, role or password, or
    no answer within ``startup_timeout``. Outages after the first connection are ridden out.

    Examples:
        >>> str(DatabaseUnreachable("Worker cannot use postgresql://app@db:5999/app: refused"))
        'Worker cannot use postgresql://app@db:5999/app: refused'
    """


class PermanentError(SaOutboxError):
    """Raise it from a handler when retrying cannot help: the job fails at once.

    Any other exception is transient: the job goes back to ``pending`` after its backoff,
    until ``max_attempts``.

    Examples:
        >>> def charge(job):
        ...     if job.payload["amount"] <= 0:
        ...         raise PermanentError(f"nothing to charge: {job.payload['amount']}")
    """


class UnknownJobKind(PermanentError):
    """A claimed job whose kind no handler is registered for.

    Examples:
        >>> str(UnknownJobKind("no handler for job kind 'x'"))
        "no handler for job kind 'x'"
    """


class InvalidPayload(PermanentError):
    """A payload the kind's ``parse`` function refused.

    Examples:
        >>> str(InvalidPayload("payload of job kind 'x' is invalid: 'to' is missing"))
        "payload of job kind 'x' is invalid: 'to' is missing"
    """


class JobTimeout(SaOutboxError):
    """A job that ran longer than its kind's timeout; it is retried like a transient error.

    Examples:
        >>> str(JobTimeout("job kind 'slow' ran longer than its timeout of 30 s"))
        "job kind 'slow' ran longer than its timeout of 30 s"
    """


class JobCancelled(SaOutboxError):
    """Raised by `CancelToken.raise_if_cancelled` once the job's token is cancelled.

    A handler that lets it propagate after a shutdown or a lost lease gives the job back
    without counting the attempt (the worker releases it, fenced by its token).

    Examples:
        >>> str(JobCancelled("shutdown"))
        'shutdown'
    """


class Snooze(SaOutboxError):
    """Return or raise it from a handler: run the job again in ``seconds``, as if new.

    The job goes back to ``pending`` with ``run_at = now + seconds`` (on the queue's clock);
    it is not a failure: the attempt the claim counted is given back (the next run sees the
    same ``job.attempts``), ``last_error`` is left as it is, and no backoff applies. The
    write is fenced by the job's lease token like every result, and batched with the
    others. ``seconds`` is a number of seconds (finite, from 0 to one year) or a
    ``timedelta``; anything else raises `InvalidArgument` / `InvalidArgumentType` here, in
    the handler, which then fails the job with that message (nothing is lost: the job is
    ``failed``, with the reason in ``last_error``).

    Examples:
        >>> Snooze(90).delay
        datetime.timedelta(seconds=90)
        >>> Snooze(-1)
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: snooze delay must be zero or more, got -1 s
    """

    #: The longest snooze accepted.
    MAX = MAX_SNOOZE

    def __init__(self, seconds: dt.timedelta | float) -> None:
        self.delay: dt.timedelta = snooze_delay(seconds)
        super().__init__(f"snoozed for {self.delay.total_seconds():g} s")

    def __repr__(self) -> str:
        return f"Snooze({self.delay.total_seconds():g})"


class StepsUnavailable(PermanentError):
    """`JobContext.step` / `JobContext.astep` called where it cannot run: no steps table on
    the `JobApp`, or ``step`` in an asyncio worker (``astep`` in a thread one). A mistake in
    the code, not in the job: the job fails at once.

    Examples:
        >>> isinstance(StepsUnavailable("no steps table"), PermanentError)
        True
    """


class SignalTimeout(PermanentError):
    """`JobContext.receive_signal` waited its whole ``timeout`` and no signal came. Catch it
    to act on the silence (a reminder, a compensation); uncaught, it fails the job at once.

    Examples:
        >>> isinstance(SignalTimeout("no signal 'approved'"), PermanentError)
        True
    """


class JobFailed(SaOutboxError):
    """`JobResults.result` waited for a job that finished without succeeding: it ``failed``
    (``error`` is its last error) or was ``cancelled`` (``status`` says which).

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobStatus
        >>> err = JobFailed(uuid.UUID(int=1), JobStatus.FAILED, "ValueError: bad card")
        >>> print(err)
        job 00000000-0000-0000-0000-000000000001 failed: ValueError: bad card
    """

    def __init__(self, job_id: uuid.UUID, status: JobStatus, error: str | None) -> None:
        self.job_id = job_id
        self.status = status
        self.error = error
        why = f": {error}" if error else ""
        super().__init__(f"job {job_id} {status.value}{why}")


class ResultTimeout(SaOutboxError, TimeoutError):
    """`JobResults.result`'s ``timeout`` passed before the job finished (it still runs, or
    waits its turn: waiting again later is fine).

    Examples:
        >>> isinstance(ResultTimeout("job 1 did not finish within 5 s"), TimeoutError)
        True
    """


class JobNotFound(SaOutboxError, LookupError):
    """`JobResults.result` was asked for a job that is not in the table: never enqueued (or
    rolled back), or pruned by retention.

    Examples:
        >>> isinstance(JobNotFound("no job 1"), LookupError)
        True
    """


class Slept(Snooze):
    """A `Snooze` whose write the handler made itself (a wait for a signal releases its job
    under the job's row lock): the worker writes nothing more for this run.

    Examples:
        >>> Slept(30).delay
        datetime.timedelta(seconds=30)
    """
