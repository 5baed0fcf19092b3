"""Statements that cancel jobs, and those a worker uses to notice and end a cancellation.

A cancelled job is ``cancelled``, a finished state nothing claims, retries or reclaims. A
``pending`` job becomes ``cancelled`` at once (it has no lease). A ``running`` one becomes
``cancelled`` too, but keeps its ``lease_token``, ``lease_until`` and ``worker_id``: every
write of its worker (heartbeat, completion, retry, failure, snooze, release) is fenced by
``status = 'running'`` and the token, so none of them can undo the cancellation, and the
heartbeat reports the job lost. The worker then asks `held_cancelled_jobs` which of its lost
jobs were cancelled, cancels their handlers' tokens (reason ``cancelled``), and once a
handler has returned, `finish_cancelled_jobs` clears the lease. A ``cancelled`` row with a
``lease_token`` is therefore a cancellation asked for that its worker has not ended yet.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from sqlalchemy import Select, Update, func, select, update

from .._clock import Clock
from .._exceptions import InvalidArgument
from ..schema import JobStatus
from ._common import (
    as_uuid,
    id_token_pairs,
    locked_in_id_order,
    now_of,
    table_of,
    unnest_pairs,
    uuid_array,
)
from ._job_claim import _RELEASED

#: The states `cancel_jobs` changes; the others are finished and left alone.
CANCELLABLE = (JobStatus.PENDING, JobStatus.RUNNING)


def job_ids(ids: object, what: str = "job ids") -> list[uuid.UUID]:
    """Check a collection of job ids (UUIDs or their text), at least one; duplicates dropped."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise InvalidArgument(f"{what} must be a sequence of job ids, got {ids!r}")
    checked = list(dict.fromkeys(as_uuid(i, "job id") for i in ids))
    if not checked:
        raise InvalidArgument(f"{what} must hold at least one job id")
    return checked


def cancel_jobs(target: object, ids: Sequence[object], *, clock: Clock | None = None) -> Update:
    """Cancel jobs by id: ``pending`` and ``running`` ones become ``cancelled``.

    Returns ``id, previous`` (the status each had: ``pending`` ones will never run,
    ``running`` ones are stopped by their worker at its next heartbeat). Ids not returned
    were finished already, or are unknown (see `job_statuses`). The rows are locked in
    ``id`` order first (``FOR UPDATE``, waiting for a claim or a completion in progress),
    so the status changed is the current one: a job completed meanwhile is left alone.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(cancel_jobs(Job, [uuid.uuid4()]))
        >>> "ORDER BY jobs.id FOR UPDATE" in sql and "RETURNING jobs.id, doomed.previous" in sql
        True
    """
    wanted = job_ids(ids)
    t = table_of(target)
    now = now_of(clock)
    doomed = (
        select(t.c.id, t.c.status.label("previous"))
        .where(t.c.id == func.any(uuid_array(wanted)), t.c.status.in_(CANCELLABLE))
        .order_by(t.c.id)
        .with_for_update(of=t)
        .cte("doomed")
    )
    return (
        update(t)
        .where(t.c.id == doomed.c.id)
        .values(status=JobStatus.CANCELLED, updated_at=now)
        .returning(t.c.id, doomed.c.previous)
    )


def job_statuses(target: object, ids: Sequence[object]) -> Select[tuple[uuid.UUID, JobStatus]]:
    """``SELECT id, status`` of the given jobs (ids missing from the rows are unknown).

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "SELECT jobs.id, jobs.status" in str(job_statuses(Job, [uuid.uuid4()]))
        True
    """
    wanted = job_ids(ids)
    t = table_of(target)
    return select(t.c.id, t.c.status).where(t.c.id == func.any(uuid_array(wanted)))


def held_cancelled_jobs(
    target: object, pairs: Iterable[tuple[object, object]]
) -> Select[tuple[uuid.UUID, uuid.UUID]]:
    """Which of these (id, lease token) pairs were cancelled while running: ``id, token``.

    A worker runs it for the jobs its heartbeat found lost; a pair returned is still the
    row's token, so the job was cancelled (not reclaimed and taken by another worker).

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> pair = (uuid.uuid4(), uuid.uuid4())
        >>> "jobs.status = :status_1" in str(held_cancelled_jobs(Job, [pair]))
        True
    """
    ids, tokens = id_token_pairs(pairs, "cancelled pairs")
    t = table_of(target)
    held = unnest_pairs(ids, tokens, "pairs")
    return select(t.c.id, held.c.token).where(
        t.c.id == held.c.id, t.c.lease_token == held.c.token, t.c.status == JobStatus.CANCELLED
    )


def finish_cancelled_jobs(
    target: object, pairs: Iterable[tuple[object, object]], *, clock: Clock | None = None
) -> Update:
    """End cancellations: clear the lease of ``cancelled`` rows still under these tokens.

    The worker writes it once the handler of a job cancelled while running has returned
    (whatever it returned: the job stays ``cancelled``). Fenced by the token, locked in
    ``id`` order like the other batched writes; returns ``id, token`` of the pairs ended.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> pair = (uuid.uuid4(), uuid.uuid4())
        >>> "lease_token=:lease_token" in str(finish_cancelled_jobs(Job, [pair]))
        True
    """
    ids, tokens = id_token_pairs(pairs, "cancelled pairs")
    t = table_of(target)
    now = now_of(clock)
    held = locked_in_id_order(
        t, unnest_pairs(ids, tokens, "pairs"), "held", t.c.status == JobStatus.CANCELLED
    )
    return (
        update(t)
        .where(t.c.id == held.c.id)
        .values(updated_at=now, **_RELEASED)
        .returning(t.c.id, held.c.token)
    )
