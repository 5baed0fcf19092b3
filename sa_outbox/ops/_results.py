"""Typed results of the operations (`sa_outbox.ops`), public in `sa_outbox.queue`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ..schema import JobStatus


@dataclasses.dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What an enqueue did: ``inserted`` is False when the deduplication key was taken, or a
    unique job's key was held (`Unique`); ``id`` is then ``None``.

    Examples:
        >>> EnqueueResult(id=None, inserted=False).inserted
        False
    """

    id: uuid.UUID | None
    inserted: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker holds: finish it with its ``id`` and ``lease_token``.

    Examples:
        >>> job = ClaimedJob(id=uuid.UUID(int=1), queue="default", kind="send-email",
        ...                  payload={}, priority=0, run_at=None, attempts=1, max_attempts=8,
        ...                  lease_until=None, lease_token=uuid.UUID(int=2), worker_id="w1",
        ...                  deduplication_key=None, created_at=None)
        >>> job.is_last_attempt
        False
    """

    id: uuid.UUID
    queue: str
    kind: str
    payload: Any
    priority: int
    run_at: dt.datetime
    attempts: int
    max_attempts: int
    lease_until: dt.datetime
    lease_token: uuid.UUID
    worker_id: str
    deduplication_key: str | None
    created_at: dt.datetime
    #: The job's string headers (its trace context among them), ``None`` when it has none.
    headers: dict[str, str] | None = None

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now would end in ``failed``."""
        return self.attempts >= self.max_attempts


@dataclasses.dataclass(frozen=True, slots=True)
class RetryResult:
    """Where a retried job went: back to ``pending`` at ``run_at``, or to ``failed``.

    Examples:
        >>> RetryResult(uuid.UUID(int=1), JobStatus.FAILED, None).status
        <JobStatus.FAILED: 'failed'>
    """

    id: uuid.UUID
    status: JobStatus
    run_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ReclaimedJob:
    """A job whose lease expired, and the state the reclaimer gave it.

    Examples:
        >>> ReclaimedJob(uuid.UUID(int=1), JobStatus.PENDING, "w1", 1).worker_id
        'w1'
    """

    id: uuid.UUID
    status: JobStatus
    worker_id: str | None
    attempts: int


class RetriedJobs(list[uuid.UUID]):
    """The ids of the failed jobs a retry by hand sent back to ``pending`` (a list), and in
    ``skipped`` those it left ``failed`` because their unique key is held (docs/unique.md).

    ``skipped`` maps each skipped job's id to the id of the job that holds its key: a live
    duplicate (pending, running, or finished in one of its ``unique_states``), or one of the
    jobs this retry sent back, the first of several failed duplicates.

    Examples:
        >>> retried = RetriedJobs([uuid.UUID(int=1)], {uuid.UUID(int=2): uuid.UUID(int=1)})
        >>> retried == [uuid.UUID(int=1)], len(retried.skipped)
        (True, 1)
    """

    skipped: dict[uuid.UUID, uuid.UUID]

    def __init__(
        self,
        retried: Iterable[uuid.UUID] = (),
        skipped: Mapping[uuid.UUID, uuid.UUID] | None = None,
    ) -> None:
        super().__init__(retried)
        self.skipped = dict(skipped or {})

    def __repr__(self) -> str:
        return f"RetriedJobs({list(self)!r}, skipped={self.skipped!r})"


@dataclasses.dataclass(frozen=True, slots=True)
class CancelResult:
    """What `JobQueue.cancel` did with each id it was given.

    ``cancelled``: jobs that were waiting (``pending``, due or scheduled) and will never
    run; ``cancelling``: jobs that were running, now ``cancelled`` too, whose worker stops
    the handler at its next heartbeat; ``finished``: jobs already ``succeeded``,
    ``failed`` or ``cancelled``, left alone; ``unknown``: no such job. Each list keeps the
    order of the ids given.

    Examples:
        >>> CancelResult(cancelled=[uuid.UUID(int=1)], cancelling=[], finished=[],
        ...              unknown=[uuid.UUID(int=2)]).unknown
        [UUID('00000000-0000-0000-0000-000000000002')]
    """

    cancelled: list[uuid.UUID]
    cancelling: list[uuid.UUID]
    finished: list[uuid.UUID]
    unknown: list[uuid.UUID]


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """A batch (`JobQueue.enqueue_batch`): its callback job's ``id``, which is the batch's,
    and the ids of its jobs so far.

    Examples:
        >>> Batch(id=uuid.UUID(int=9), jobs=[uuid.UUID(int=1)]).id
        UUID('00000000-0000-0000-0000-000000000009')
    """

    id: uuid.UUID
    jobs: list[uuid.UUID]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRetry:
    """What `JobQueue.retry_workflow` did: the workflow's ``id`` (the job that started it),
    the jobs ``requeued`` (pending now, all their attempts back: what they waited for had
    succeeded), the ones ``waiting`` again (for a job requeued here, or still unfinished),
    and the ``skipped`` ones (a unique job whose key another job holds now).

    Examples:
        >>> WorkflowRetry(uuid.UUID(int=1), [uuid.UUID(int=1)], [uuid.UUID(int=2)], []).waiting
        [UUID('00000000-0000-0000-0000-000000000002')]
    """

    id: uuid.UUID
    requeued: list[uuid.UUID]
    waiting: list[uuid.UUID]
    skipped: list[uuid.UUID]


@dataclasses.dataclass(frozen=True, slots=True)
class JobResult:
    """Where a job stands and what it returned: ``value`` is its handler's return value
    once it ``succeeded`` (``None`` before, or when the handler returned ``None``);
    ``error`` the last error recorded (a failed or retried job's).

    Examples:
        >>> done = JobResult(id=uuid.UUID(int=1), status=JobStatus.SUCCEEDED, value={"total": 42},
        ...                  error=None)
        >>> done.finished, done.value["total"]
        (True, 42)
    """

    id: uuid.UUID
    status: JobStatus
    value: Any
    error: str | None
    #: True while the job waits for other jobs (``after=``): ``pending``, not yet in the
    #: job table.
    waiting: bool = False

    @property
    def finished(self) -> bool:
        """True once the job ``succeeded``, ``failed`` or was ``cancelled``: it stays so."""
        return self.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclasses.dataclass(frozen=True, slots=True)
class BatchResult:
    """Which rows of a batched fenced write matched (``done``) and which had lost (``lost``).

    Examples:
        >>> BatchResult(done=[uuid.UUID(int=1)], lost=[]).all_done
        True
    """

    done: list[uuid.UUID]
    lost: list[uuid.UUID]

    @property
    def all_done(self) -> bool:
        return not self.lost


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedEvent:
    """An outbox event this relay holds: publish it, then mark it with ``relay_token``.

    Examples:
        >>> ClaimedEvent(uuid.UUID(int=1), 1, "OrderPlaced", "order", "42", {}, {}, 1, None,
        ...              uuid.UUID(int=2), None).message_id
        '00000000-0000-0000-0000-000000000001'
    """

    id: uuid.UUID
    seq: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: Any
    headers: dict[str, Any]
    attempts: int
    relay_until: dt.datetime | None
    relay_token: uuid.UUID
    created_at: dt.datetime | None

    @property
    def message_id(self) -> str:
        """The stable id consumers de-duplicate on (the outbox row's id)."""
        return str(self.id)


@dataclasses.dataclass(frozen=True, slots=True)
class RejectedEvent:
    """Where a rejected event went: back off until ``relay_until``, or ``parked``.

    Examples:
        >>> RejectedEvent(uuid.UUID(int=1), parked=True, attempts=10, relay_until=None).parked
        True
    """

    id: uuid.UUID
    parked: bool
    attempts: int
    relay_until: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ParkedEvent:
    """An event the relay parked after the broker kept rejecting it, with its last error.

    Examples:
        >>> ParkedEvent(uuid.UUID(int=1), 7, "OrderPlaced", "order", "42", 10,
        ...             "message too large", None, None).last_error
        'message too large'
    """

    id: uuid.UUID
    seq: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    attempts: int
    last_error: str | None
    parked_at: dt.datetime | None
    created_at: dt.datetime | None
