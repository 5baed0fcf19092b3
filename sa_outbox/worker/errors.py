"""The exceptions of the worker runtime, under `SaOutboxError` like every other.

A handler raises `PermanentError` (or a subclass) when retrying cannot help: the job goes to
``failed`` at once. The worker itself records `UnknownJobKind` (no handler for the kind),
`InvalidPayload` (the kind's ``parse`` refused the payload) and `JobTimeout` (the kind's
timeout passed: retried like any transient error) in ``last_error``. `JobCancelled` is what
`CancelToken.raise_if_cancelled` raises inside a handler.

Example:
    >>> from sa_outbox import SaOutboxError
    >>> issubclass(UnknownJobKind, PermanentError) and issubclass(PermanentError, SaOutboxError)
    True
"""

from __future__ import annotations

from .._exceptions import SaOutboxError

__all__ = [
    "DatabaseUnreachable",
    "InvalidPayload",
    "JobCancelled",
    "JobTimeout",
    "PermanentError",
    "UnknownJobKind",
]


class DatabaseUnreachable(SaOutboxError):
    """A worker could not use its database at start-up: a wrong URL, role or password, or
    no answer within ``startup_timeout``. Outages after the first connection are ridden out.

    Example:
        >>> str(DatabaseUnreachable("Worker cannot use postgresql://app@db:5999/app: refused"))
        'Worker cannot use postgresql://app@db:5999/app: refused'
    """


class PermanentError(SaOutboxError):
    """Raise it from a handler when retrying cannot help: the job fails at once.

    Any other exception is transient: the job goes back to ``pending`` after its backoff,
    until ``max_attempts``.

    Example:
        >>> def charge(job):
        ...     if job.payload["amount"] <= 0:
        ...         raise PermanentError(f"nothing to charge: {job.payload['amount']}")
    """


class UnknownJobKind(PermanentError):
    """A claimed job whose kind no handler is registered for.

    Example:
        >>> str(UnknownJobKind("no handler for job kind 'x'"))
        "no handler for job kind 'x'"
    """


class InvalidPayload(PermanentError):
    """A payload the kind's ``parse`` function refused.

    Example:
        >>> str(InvalidPayload("payload of job kind 'x' is invalid: 'to' is missing"))
        "payload of job kind 'x' is invalid: 'to' is missing"
    """


class JobTimeout(SaOutboxError):
    """A job that ran longer than its kind's timeout; it is retried like a transient error.

    Example:
        >>> str(JobTimeout("job kind 'slow' ran longer than its timeout of 30 s"))
        "job kind 'slow' ran longer than its timeout of 30 s"
    """


class JobCancelled(SaOutboxError):
    """Raised by `CancelToken.raise_if_cancelled` once the job's token is cancelled.

    A handler that lets it propagate after a shutdown or a lost lease gives the job back
    without counting the attempt (the worker releases it, fenced by its token).

    Example:
        >>> str(JobCancelled("shutdown"))
        'shutdown'
    """
