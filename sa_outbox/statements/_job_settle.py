"""Statements that settle jobs otherwise: retry, fail, snooze, release, reclaim, requeue, prune
(article, sections 7 and 8), and the counts by status.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Delete,
    Select,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.sql.elements import ColumnElement

from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import count, duration, name_filter, storable_text
from ..schema import JobStatus
from ._common import (
    as_uuid,
    id_token_pairs,
    in_names,
    interval,
    locked_in_id_order,
    now_of,
    table_of,
    unnest_pairs,
    uuid_array,
)
from ._job_claim import _RELEASED, _running
from ._job_defaults import _FINISHED, DEFAULT_BACKOFF
from ._job_unique import has_unique_columns


def retry_job(
    target: object,
    job_id: object,
    token: object,
    *,
    error: str | None = None,
    delay: dt.timedelta | float | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
    clock: Clock | None = None,
) -> Update:
    """Send a failed attempt back to ``pending`` after a delay, or to ``failed`` at max_attempts.

    The delay is ``delay`` when given, else ``backoff`` computed in SQL from the row's own
    ``attempts`` (the formula the reclaimer uses). Fenced by status and token; returns
    ``id, status, run_at``.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "CASE WHEN" in str(retry_job(Job, uuid.uuid4(), uuid.uuid4(), error="timeout"))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    wait = (
        backoff.sql_delay(t.c.attempts)
        if delay is None
        else interval(duration(delay, "delay", allow_zero=True))
    )
    exhausted = t.c.attempts >= t.c.max_attempts
    return (
        update(t)
        .where(*_running(t, job_id, token))
        .values(
            status=_failed_if(exhausted, t),
            run_at=case((exhausted, t.c.run_at), else_=now + wait),
            last_error=_error_text(error),
            updated_at=now,
            **_RELEASED,
        )
        .returning(t.c.id, t.c.status, t.c.run_at)
    )


def fail_job(
    target: object,
    job_id: object,
    token: object,
    *,
    error: str | None = None,
    clock: Clock | None = None,
) -> Update:
    """Mark a job ``failed`` at once (a permanent error), fenced by status and token.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "last_error" in str(fail_job(Job, uuid.uuid4(), uuid.uuid4(), error="bad payload"))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    return (
        update(t)
        .where(*_running(t, job_id, token))
        .values(status=JobStatus.FAILED, last_error=_error_text(error), updated_at=now, **_RELEASED)
        .returning(t.c.id)
    )


def release_jobs(
    target: object, pairs: Iterable[tuple[object, object]], *, clock: Clock | None = None
) -> Update:
    """Give claimed jobs back to ``pending`` without counting their attempt (a graceful stop).

    For many (id, token) pairs in one ``UPDATE … FROM unnest(…)``, fenced like a completion:
    only rows still ``running`` under their token change. ``attempts`` goes back down by the
    one the claim added, ``run_at`` is kept (the job keeps its place in line) and the lease is
    cleared, so the next worker takes the job at once and ``max_attempts`` still counts
    only real attempts. Returns ``id, token, queue`` of the pairs released.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(release_jobs(Job, [(uuid.uuid4(), uuid.uuid4())]))
        >>> "attempts=greatest(jobs.attempts - :attempts_1, :greatest_1)" in sql
        True
    """
    ids, tokens = id_token_pairs(pairs, "release pairs")
    t = table_of(target)
    now = now_of(clock)
    held = locked_in_id_order(
        t, unnest_pairs(ids, tokens, "pairs"), "held", t.c.status == JobStatus.RUNNING
    )
    return (
        update(t)
        .where(t.c.id == held.c.id)
        .values(
            status=JobStatus.PENDING,
            attempts=func.greatest(t.c.attempts - 1, 0),
            updated_at=now,
            **_RELEASED,
        )
        .returning(t.c.id, held.c.token, t.c.queue)
    )


#: The longest a handler may snooze its job: past this, enqueue a job for later instead.
MAX_SNOOZE = dt.timedelta(days=365)


def snooze_delay(value: object) -> dt.timedelta:
    """Check a snooze's delay: a timedelta or a finite number of seconds, from 0 to
    `MAX_SNOOZE`; returns it as a timedelta.

    Examples:
        >>> snooze_delay(90)
        datetime.timedelta(seconds=90)
        >>> snooze_delay(float("nan"))
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: snooze delay must be a finite number of \
seconds, got nan
    """
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise InvalidArgumentType(
            f"snooze delay must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"snooze delay must be a finite number of seconds, got {value}")
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if seconds < 0:
        raise InvalidArgument(f"snooze delay must be zero or more, got {seconds:g} s")
    if seconds > MAX_SNOOZE.total_seconds():
        raise InvalidArgument(
            f"snooze delay must be at most {MAX_SNOOZE.days} days "
            f"({MAX_SNOOZE.total_seconds():g} s), got {seconds:g} s"
        )
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=value)


def snooze_job(
    target: object,
    job_id: object,
    token: object,
    *,
    delay: dt.timedelta | float,
    clock: Clock | None = None,
) -> Update:
    """Send a running job back to ``pending`` at ``now + delay`` without counting a failure.

    A handler's `Snooze`: the attempt the claim counted is given back (``attempts - 1``), so
    ``max_attempts`` counts only failed runs and crashes; ``last_error`` is left as it is.
    Fenced by status and token like every result write; returns ``id, run_at``.

    Examples:
        >>> import uuid
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(snooze_job(Job, uuid.uuid4(), uuid.uuid4(), delay=60))
        >>> "attempts=greatest(jobs.attempts - :attempts_1, :greatest_1)" in sql
        True
    """
    wait = snooze_delay(delay)
    t = table_of(target)
    now = now_of(clock)
    return (
        update(t)
        .where(*_running(t, job_id, token))
        .values(
            status=JobStatus.PENDING,
            run_at=now + interval(wait),
            attempts=func.greatest(t.c.attempts - 1, 0),
            updated_at=now,
            **_RELEASED,
        )
        .returning(t.c.id, t.c.run_at)
    )


def _failed_if(exhausted: Any, t: Any) -> Any:
    """``CASE WHEN exhausted THEN 'failed' ELSE 'pending' END``, typed as the status enum."""
    return case(
        (exhausted, cast(literal(JobStatus.FAILED.value), t.c.status.type)),
        else_=cast(literal(JobStatus.PENDING.value), t.c.status.type),
    )


def _error_text(error: object) -> Any:
    if error is None:
        return None
    if not isinstance(error, str):
        error = str(error)
    # An exception's message may hold a NUL or a lone surrogate: escaped, not a failed write.
    return bindparam(None, storable_text(error), type_=Text)


def reclaim_expired_jobs(
    target: object,
    *,
    backoff: Backoff = DEFAULT_BACKOFF,
    limit: int = 1000,
    clock: Clock | None = None,
) -> Update:
    """Return expired leases to ``pending`` with backoff, or to ``failed`` at max_attempts.

    A job whose worker died (or stalled past its lease) comes back after the same delay a
    retry would give it, so a job that kills every worker that takes it cannot loop hot; at
    ``max_attempts`` it ends ``failed`` with the reason in ``last_error``. Takes at most
    ``limit`` rows, skipping rows locked by a concurrent completion. Returns
    ``id, status, worker_id, attempts`` of each reclaimed job.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "lease_until <" in str(reclaim_expired_jobs(Job))
        True
    """
    size = count(limit, "limit")
    t = table_of(target)
    now = now_of(clock)
    # 'running' inline, as the claim's 'pending': a generic plan of the prepared statement
    # can then use the partial expired-lease index (WHERE status = 'running').
    running = literal_column(f"'{JobStatus.RUNNING.value}'", t.c.status.type)
    expired = (
        select(t.c.id, t.c.worker_id)
        .where(t.c.status == running, t.c.lease_until < now)
        .order_by(t.c.lease_until)
        .limit(size)
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    exhausted = t.c.attempts >= t.c.max_attempts
    reason = func.concat(
        "lease expired at ", t.c.lease_until, " while held by worker ", t.c.worker_id
    )
    return (
        update(t)
        .where(t.c.id == expired.c.id)
        .values(
            status=_failed_if(exhausted, t),
            run_at=case((exhausted, t.c.run_at), else_=now + backoff.sql_delay(t.c.attempts)),
            last_error=reason,
            updated_at=now,
            **_RELEASED,
        )
        .returning(t.c.id, t.c.status, expired.c.worker_id, t.c.attempts)
    )


_Filters = Callable[[Any], list[ColumnElement[bool]]]


def _failed_filters(
    ids: Sequence[object] | None,
    kinds: str | Sequence[str] | None,
    queues: str | Sequence[str] | None,
) -> _Filters:
    """The conditions that pick the failed jobs to retry by hand, checked now, for a table
    or an alias of it (the guard of unique jobs applies them to an alias)."""
    kind_names = name_filter(kinds, "kinds")
    queue_names = name_filter(queues, "queues")
    wanted = None
    if ids is not None:
        if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise InvalidArgument("ids must be a sequence of job ids")
        wanted = [as_uuid(i, "job id") for i in ids]

    def conditions(t: Any) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = [t.c.status == JobStatus.FAILED]
        if wanted is not None:
            found.append(t.c.id == func.any(uuid_array(wanted)))
        if kind_names is not None:
            found.append(in_names(t.c.kind, kind_names))
        if queue_names is not None:
            found.append(in_names(t.c.queue, queue_names))
        return found

    return conditions


def _gave_up_key(t: Any) -> ColumnElement[bool]:
    """A unique job whose status is not among its ``unique_states``: it holds no key."""
    return and_(t.c.unique_key.is_not(None), not_(t.c.status == any_(t.c.unique_states)))


def _holds_key(holder: Any, key: Any) -> ColumnElement[bool]:
    """``holder`` holds ``key``: the predicate of ``{t}_unique_idx``, which serves it."""
    return and_(holder.c.unique_key == key, holder.c.status == any_(holder.c.unique_states))


def _retrying(t: Table, filters: _Filters) -> Update:
    """``UPDATE t WHERE <filters>``, and for a table with unique jobs the guard that keeps
    a retried job from taking a key already held (`retry_failed_jobs`)."""
    stmt = update(t).where(*filters(t))
    if not has_unique_columns(t):
        return stmt
    # Of the failed jobs that gave up their key, the first of each key, if no job holds
    # that key: one pass over the jobs the filters pick, and an anti-join on the unique
    # index, computed once (a hashed subplan), not a search per row.
    candidate = t.alias("candidate")
    ranked = (
        select(
            candidate.c.id,
            candidate.c.unique_key,
            func.row_number()
            .over(partition_by=candidate.c.unique_key, order_by=candidate.c.id)
            .label("rank"),
        )
        .where(*filters(candidate), _gave_up_key(candidate))
        .subquery("ranked")
    )
    holder = t.alias("holder")
    free = select(ranked.c.id).where(
        ranked.c.rank == 1, ~exists().where(_holds_key(holder, ranked.c.unique_key))
    )
    return stmt.where(
        or_(
            t.c.unique_key.is_(None),
            t.c.status == any_(t.c.unique_states),  # failed among its states: keeps its key
            t.c.id.in_(free.scalar_subquery()),
        )
    )


def select_unique_held_failed_jobs(
    target: object,
    *,
    ids: Sequence[object] | None = None,
    kinds: str | Sequence[str] | None = None,
    queues: str | Sequence[str] | None = None,
) -> Select[tuple[uuid.UUID, uuid.UUID, JobStatus]]:
    """The failed unique jobs (picked by the filters of `retry_failed_jobs`) whose key
    another job holds: ``id, held_by, held_by_status``, by ``id``.

    Run after `retry_failed_jobs` / `requeue_failed_jobs` in the same transaction, it lists
    the jobs they skipped, and the job that holds each one's key (which may be one they
    just retried, the first of several failed jobs sharing a key). The holders are found
    through ``{t}_unique_idx``. On a table without the unique columns, it selects nothing.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(select_unique_held_failed_jobs(Job, kinds="send-email"))
        >>> "holder.status = ANY (holder.unique_states)" in sql
        True
    """
    filters = _failed_filters(ids, kinds, queues)
    t = table_of(target)
    held = t.alias("held")
    holder = t.alias("holder")
    stmt = select(
        held.c.id,
        holder.c.id.label("held_by"),
        holder.c.status.label("held_by_status"),
    )
    if not has_unique_columns(t):
        return stmt.where(false())
    return (
        stmt.join_from(held, holder, _holds_key(holder, held.c.unique_key))
        .where(*filters(held), _gave_up_key(held))
        .order_by(held.c.id)
    )


def requeue_failed_jobs(
    target: object,
    *,
    ids: Sequence[object] | None = None,
    kinds: str | Sequence[str] | None = None,
    queues: str | Sequence[str] | None = None,
    reset_attempts: bool = True,
    clock: Clock | None = None,
) -> Update:
    """Send ``failed`` jobs back to ``pending`` now, by hand (article, section 7).

    Filters combine with AND; with none, every failed job is requeued. ``last_error`` is
    kept for the record; ``attempts`` restarts at 0 unless ``reset_attempts=False``.
    A unique job whose key another job holds is skipped, as `retry_failed_jobs` says.
    Returns the ids requeued.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "status = :status_1" in str(requeue_failed_jobs(Job, kinds="send-email"))
        True
    """
    t = table_of(target)
    stmt = _retrying(t, _failed_filters(ids, kinds, queues))
    now = now_of(clock)
    values: dict[str, Any] = {"status": JobStatus.PENDING, "run_at": now, "updated_at": now}
    if reset_attempts:
        values["attempts"] = 0
    return stmt.values(**values).returning(t.c.id)


def retry_failed_jobs(
    target: object,
    *,
    ids: Sequence[object] | None = None,
    kinds: str | Sequence[str] | None = None,
    queues: str | Sequence[str] | None = None,
    clock: Clock | None = None,
) -> Update:
    """Retry ``failed`` jobs by hand, as River's ``JobRetry`` and Oban's ``retry_job`` do.

    Each job goes back to ``pending`` with ``run_at = now``; ``attempts`` is kept (the
    history stays true, and the next failure backs off from where it was) and
    ``max_attempts`` is raised to ``attempts + 1`` when it was reached, so an exhausted job
    gets exactly one more attempt and one that failed early (a permanent error) gets the
    attempts it had left. ``last_error`` is kept until the next attempt. Fenced by
    ``status = 'failed'``: a pending, running or finished job is never touched. Filters
    combine with AND (none: every failed job). For a fresh start with all attempts, see
    `requeue_failed_jobs`. Returns ``id, queue`` of the jobs retried.

    A unique job (docs/unique.md) that failed outside its ``unique_states`` gave up its
    key: it is skipped (left ``failed``) while another job holds that key, and of several
    such jobs sharing a key only the first (by id) goes back, so the statement never meets
    the unique index. `select_unique_held_failed_jobs` says which were skipped, and why.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> sql = str(retry_failed_jobs(Job, kinds="send-email"))
        >>> "max_attempts=greatest(jobs.max_attempts, jobs.attempts + :attempts_1)" in sql
        True
    """
    t = table_of(target)
    stmt = _retrying(t, _failed_filters(ids, kinds, queues))
    now = now_of(clock)
    return stmt.values(
        status=JobStatus.PENDING,
        run_at=now,
        max_attempts=func.greatest(t.c.max_attempts, t.c.attempts + 1),
        updated_at=now,
        **_RELEASED,
    ).returning(t.c.id, t.c.queue)


def prune_jobs(
    target: object,
    *,
    older_than: dt.timedelta | float,
    statuses: Iterable[JobStatus | str] = (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
    ),
    batch: int = 1000,
    clock: Clock | None = None,
    steps: object | None = None,
    dependencies: object | None = None,
) -> Delete:
    """Delete one batch of finished jobs last updated more than ``older_than`` ago.

    Only finished jobs (``succeeded``, ``failed``, ``cancelled``) may be pruned. Rows are
    picked with ``FOR UPDATE SKIP LOCKED`` so a prune never waits on (or holds up) the
    queue; run it until it deletes fewer than ``batch`` rows. Given ``steps`` (the
    `JobStepMixin` table), the recorded steps of the jobs deleted go in the same statement;
    the row count is still the jobs'. So do their rows in ``dependencies`` (the
    `JobDependencyMixin` table: the record of what they waited for), and a job another
    still waits for there is kept until that one is released.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "DELETE FROM jobs" in str(prune_jobs(Job, older_than=7 * 86400))
        True
    """
    window = duration(older_than, "older_than", allow_zero=True)
    size = count(batch, "batch")
    wanted = []
    for status in statuses:
        try:
            wanted.append(JobStatus(status))
        except ValueError:
            raise InvalidArgument(f"unknown job status {status!r}") from None
    if not wanted or not set(wanted) <= _FINISHED:
        raise InvalidArgument(
            "only finished jobs (succeeded, failed, cancelled) can be pruned, "
            f"got {[str(s) for s in wanted]}"
        )
    t = table_of(target)
    now = now_of(clock)
    doomed = (
        select(t.c.id)
        .where(t.c.status.in_(sorted(set(wanted))), t.c.updated_at < now - interval(window))
        .limit(size)
        .with_for_update(skip_locked=True)
    )
    if dependencies is not None:
        d = table_of(dependencies)
        awaited = select(d.c.job_id).where(
            d.c.released_at.is_(None), d.c.parents.contains(array([t.c.id]))
        )
        doomed = doomed.where(~awaited.exists())
    if steps is None and dependencies is None:
        return delete(t).where(t.c.id.in_(doomed.scalar_subquery()))
    picked = doomed.cte("doomed")
    stmt = delete(t).where(t.c.id.in_(select(picked.c.id)))
    for name, other in (("doomed_steps", steps), ("doomed_dependencies", dependencies)):
        if other is not None:
            o = table_of(other)
            stmt = stmt.add_cte(delete(o).where(o.c.job_id.in_(select(picked.c.id))).cte(name))
    return stmt


def count_jobs_by_status(target: object) -> Select[tuple[JobStatus, int]]:
    """``SELECT status, count(*) … GROUP BY status``.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "GROUP BY" in str(count_jobs_by_status(Job))
        True
    """
    t = table_of(target)
    return select(t.c.status, func.count()).group_by(t.c.status)
