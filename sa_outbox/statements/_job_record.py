"""A new job: the `NewJob` record, and the checks every way of enqueuing one runs.

`check_job` is the one place that says whether a job is good input (`enqueue_job`,
`enqueue_job_values`, `enqueue_jobs` and the ``COPY`` path of `JobQueue.enqueue_copy` all
call it), and `is_plain_job` the one place that says when those checks can be skipped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, TypeGuard

from .._exceptions import InvalidArgument
from .._ids import uuid7
from .._json import compact_json
from .._validation import (
    MAX_DEDUPLICATION_KEY_LENGTH,
    aware_datetime,
    count,
    duration,
    is_name,
    name,
    optional_key,
)
from ._common import DEFAULT_MAX_PAYLOAD_BYTES, Dumps, serialise
from ._job_defaults import _MAX_INT, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ._job_headers import job_headers_text
from ._job_unique import Unique, unique_parts


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `enqueue_jobs`; the same fields as `enqueue_job` takes.

    Examples:
        >>> NewJob("send-email", {"to": "ana@example.com"}, deduplication_key="welcome:ana").queue
        'default'
    """

    kind: str
    payload: Any
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    run_at: dt.datetime | None = None
    delay: dt.timedelta | float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    deduplication_key: str | None = None
    #: String headers of the job's own (str to str); the current trace context joins them.
    headers: Mapping[str, str] | None = None
    #: Serial key: jobs sharing it run one at a time, in the order they were committed.
    lock_key: str | None = None
    #: What makes the job unique (`Unique`, docs/unique.md); ``None``: an ordinary job.
    unique: Unique | None = None

    def __init__(
        self,
        kind: str,
        payload: Any,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        deduplication_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        lock_key: str | None = None,
        unique: Unique | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass, but setting each slot through its
        # own descriptor instead of object.__setattr__: 40 % less, for jobs built by the
        # thousand. dataclass keeps an __init__ written in the class.
        _set_kind(self, kind)
        _set_payload(self, payload)
        _set_queue(self, queue)
        _set_priority(self, priority)
        _set_run_at(self, run_at)
        _set_delay(self, delay)
        _set_max_attempts(self, max_attempts)
        _set_deduplication_key(self, deduplication_key)
        _set_headers(self, headers)
        _set_lock_key(self, lock_key)
        _set_unique(self, unique)


(
    _set_kind,
    _set_payload,
    _set_queue,
    _set_priority,
    _set_run_at,
    _set_delay,
    _set_max_attempts,
    _set_deduplication_key,
    _set_headers,
    _set_lock_key,
    _set_unique,
) = (NewJob.__dict__[field.name].__set__ for field in dataclasses.fields(NewJob))


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedJob:
    """A `NewJob` as `check_job` accepted it: its values as the statements write them.

    Examples:
        >>> job = check_job(NewJob("send-email", {"to": "ana"}, delay=30))
        >>> job.payload, job.delay
        ('{"to":"ana"}', datetime.timedelta(seconds=30))
    """

    id: uuid.UUID
    kind: str
    #: The payload serialised (JSON text, checked to be storable in ``jsonb``).
    payload: str
    queue: str
    priority: int
    run_at: dt.datetime | None
    delay: dt.timedelta | None
    max_attempts: int
    deduplication_key: str | None
    #: The headers as JSON text (the job's own over the trace context), or None (NULL).
    headers: str | None
    lock_key: str | None
    #: The unique key's digest, period and states (`Unique`), or None: not a unique job.
    unique: tuple[str, int | None, str] | None


def check_job(
    job: NewJob,
    *,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    job_id: uuid.UUID | None = None,
    trace_headers: Mapping[str, str] | None = None,
) -> CheckedJob:
    """Check ``job`` as every enqueue does, and return its values as a `CheckedJob`.

    Bad input raises `InvalidArgument` (or a subclass: `PayloadTooLarge`, …) naming the
    field. ``job_id`` is the id it gets (a new UUIDv7 when None); ``trace_headers`` join
    the job's own ``headers``, under them.

    Examples:
        >>> check_job(NewJob("send-email", {"to": "ana"}, queue="mail")).queue
        'mail'
        >>> check_job(NewJob("send-email", {}, priority="high"))
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgumentType: priority must be an int, got str
    """
    kind = name(job.kind, "kind")
    if job.run_at is not None and job.delay is not None:
        raise InvalidArgument(f"job kind {kind!r}: give run_at or delay, not both")
    payload = serialise(job.payload, f"job kind {kind!r}", dumps, max_payload_bytes)
    queue = name(job.queue, "queue")
    return CheckedJob(
        id=uuid7() if job_id is None else job_id,
        kind=kind,
        payload=payload,
        queue=queue,
        priority=count(job.priority, "priority", minimum=-_MAX_INT, maximum=_MAX_INT),
        run_at=None if job.run_at is None else aware_datetime(job.run_at, "run_at"),
        delay=None if job.delay is None else duration(job.delay, "delay", allow_zero=True),
        max_attempts=count(job.max_attempts, "max_attempts", maximum=_MAX_INT),
        deduplication_key=optional_key(
            job.deduplication_key, "deduplication_key", MAX_DEDUPLICATION_KEY_LENGTH
        ),
        headers=job_headers_text(job.headers, trace_headers, f"job kind {kind!r}"),
        lock_key=optional_key(job.lock_key, "lock_key", MAX_DEDUPLICATION_KEY_LENGTH),
        unique=None
        if job.unique is None
        else unique_parts(job.unique, kind, queue, payload, f"job kind {kind!r}"),
    )


def is_plain_job(job: object) -> TypeGuard[NewJob]:
    """Whether ``job`` is exactly a `NewJob` that `check_job` accepts as it is, with no
    optional field set: valid names, int fields in range, no run_at, delay, deduplication
    key, headers, lock key or unique (a subclass, or a bool, is not plain).

    The bulk paths (`enqueue_jobs`, ``COPY``) skip `check_job` for such a job and
    serialise only its payload.

    Examples:
        >>> is_plain_job(NewJob("send-email", {"to": "ana"}))
        True
        >>> is_plain_job(NewJob("send-email", {"to": "ana"}, deduplication_key="ana"))
        False
    """
    if type(job) is not NewJob:
        return False
    kind, queue, priority, attempts = job.kind, job.queue, job.priority, job.max_attempts
    return (
        is_name(kind)
        and is_name(queue)
        and type(priority) is int
        and -_MAX_INT <= priority <= _MAX_INT
        and type(attempts) is int
        and 1 <= attempts <= _MAX_INT
        and job.run_at is None
        and job.delay is None
        and job.deduplication_key is None
        and job.headers is None
        and job.lock_key is None
        and job.unique is None
    )
