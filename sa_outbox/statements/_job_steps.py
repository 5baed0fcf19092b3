"""Durable steps: read a job's recorded step results, and record one fenced by its lease."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    DateTime,
    Float,
    Insert,
    Select,
    Text,
    bindparam,
    cast,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.elements import ColumnElement

from .._clock import Clock
from ..schema import JobStatus
from ._common import interval, now_of, table_of


def select_job_steps(steps: object, job_id: object) -> Select[tuple[str, Any]]:
    """The recorded steps of one job: ``name, result`` rows.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> print(select_job_steps(JobStep, uuid.UUID(int=1)))  # doctest: +NORMALIZE_WHITESPACE
        SELECT job_steps.name, job_steps.result FROM job_steps
        WHERE job_steps.job_id = :job_id_1
    """
    s = table_of(steps)
    return select(s.c.name, s.c.result).where(s.c.job_id == job_id)


def list_job_steps(steps: object, job_id: object) -> Select[Any]:
    """Every row one job has in the steps table, in the order they were recorded: ``name,
    result, created_at`` (its durable steps, its ``@result``, sleeps and signals).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> "ORDER BY job_steps.created_at" in str(list_job_steps(JobStep, uuid.UUID(int=1)))
        True
    """
    s = table_of(steps)
    return (
        select(s.c.name, s.c.result, s.c.created_at)
        .where(s.c.job_id == job_id)
        .order_by(s.c.created_at, s.c.name)
    )


def record_job_step(
    jobs: object, steps: object, job_id: object, token: object, name: str, result_json: str
) -> Insert:
    """Record step ``name`` of a job with its result (JSON text), if the job is still
    ``running`` under ``token``; returns ``job_id, result`` when it did, no row when the lease
    was lost (or the step was recorded already).

    The job's row is locked ``FOR SHARE`` until the transaction ends, so a reclaim cannot
    take the job between this check and the commit: what the step wrote in the same
    transaction commits with its record, under a lease still held, or not at all.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.dialects import postgresql
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = record_job_step(Job, JobStep, uuid.uuid4(), uuid.uuid4(), "charge", "42")
        >>> sql = str(stmt.compile(dialect=postgresql.dialect()))
        >>> "FOR SHARE" in sql and "ON CONFLICT" in sql
        True
    """
    return _record(
        jobs,
        steps,
        job_id,
        token,
        name,
        cast(bindparam("step_result", result_json, type_=Text), JSONB),
    )


def record_job_sleep(
    jobs: object,
    steps: object,
    job_id: object,
    token: object,
    name: str,
    delay: dt.timedelta,
    *,
    clock: Clock | None = None,
) -> Insert:
    """Record durable sleep ``name`` of a job: its wake-up time, ``now + delay`` on the
    statement's clock, as the step's result (a JSON string), fenced as `record_job_step`;
    returns the recorded ``result``, no row when the lease was lost.

    Examples:
        >>> import datetime as dt, uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = record_job_sleep(Job, JobStep, uuid.uuid4(), uuid.uuid4(), "cool-off",
        ...                         dt.timedelta(hours=1))
        >>> "to_jsonb" in str(stmt)
        True
    """
    wake = func.to_jsonb(now_of(clock) + interval(delay))
    return _record(jobs, steps, job_id, token, name, wake)


def sleep_left(wake: str, *, clock: Clock | None = None) -> Select[Any]:
    """Seconds from now (the statement's clock) until ``wake``, an ISO time as
    `record_job_sleep` records it; zero or less once it has passed.

    Examples:
        >>> "extract" in str(sleep_left("2030-01-01T00:00:00+00:00")).lower()
        True
    """
    until = cast(bindparam("wake", wake, type_=Text), DateTime(timezone=True))
    return select(cast(func.extract("epoch", until - now_of(clock)), Float))


def _record(
    jobs: object,
    steps: object,
    job_id: object,
    token: object,
    name: str,
    result: ColumnElement[Any],
) -> Insert:
    t, s = table_of(jobs), table_of(steps)
    held = (
        select(t.c.id)
        .where(t.c.id == job_id, t.c.lease_token == token, t.c.status == JobStatus.RUNNING)
        .with_for_update(read=True)
        .cte("held")
    )
    rows = select(held.c.id, bindparam("step_name", name, type_=Text), result)
    return (
        insert(s)
        .from_select(["job_id", "name", "result"], rows)
        .on_conflict_do_nothing(index_elements=["job_id", "name"])
        .returning(s.c.job_id, s.c.result)
    )


#: The step-name prefixes of a signal sent to a job and of the job's wait for one; step
#: names of your own may not start with ``@``.
SIGNAL_PREFIX = "@signal:"
WAIT_PREFIX = "@wait:"


def send_job_signal(
    jobs: object,
    steps: object,
    job_id: object,
    name: str,
    payload_json: str,
    *,
    clock: Clock | None = None,
) -> Select[Any]:
    """Send signal ``name`` (a JSON payload) to a pending or running job: one row,
    ``sent`` (1, or 0 when the job is finished, unknown or has that signal already: the
    first one sent stays) and ``woken`` (1 when the job was waiting for it, asleep: it is
    due now).

    The signal is recorded as the job's step ``@signal:{name}``, so one sent before the
    job waits is found when it does. Run it in the sender's transaction, after `lock_job`
    (in READ COMMITTED, this statement then sees a wait that committed meanwhile): it
    commits with the sender's rows.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.dialects import postgresql
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = send_job_signal(Job, JobStep, uuid.uuid4(), "approved", "{}")
        >>> list(stmt.selected_columns.keys())
        ['sent', 'woken']
    """
    t, s = table_of(jobs), table_of(steps)
    now = now_of(clock)
    target = (
        select(t.c.id)
        .where(t.c.id == job_id, t.c.status.in_([JobStatus.PENDING, JobStatus.RUNNING]))
        .cte("target")
    )
    rows = select(
        target.c.id,
        bindparam("signal_name", SIGNAL_PREFIX + name, type_=Text),
        cast(bindparam("signal_payload", payload_json, type_=Text), JSONB),
    )
    sent = (
        insert(s)
        .from_select(["job_id", "name", "result"], rows)
        .on_conflict_do_nothing(index_elements=["job_id", "name"])
        .returning(s.c.job_id)
        .cte("sent")
    )
    waiting = select(s.c.job_id).where(
        s.c.job_id == t.c.id, s.c.name == bindparam("wait_name", WAIT_PREFIX + name, type_=Text)
    )
    woken = (
        update(t)
        .where(
            t.c.id.in_(select(sent.c.job_id)),
            t.c.status == JobStatus.PENDING,
            t.c.run_at > now,
            waiting.exists(),
        )
        .values(run_at=now, updated_at=now)
        .returning(t.c.id)
        .cte("woken")
    )
    return select(
        select(func.count()).select_from(sent).scalar_subquery().label("sent"),
        select(func.count()).select_from(woken).scalar_subquery().label("woken"),
    )


def select_job_signal(steps: object, job_id: object, name: str) -> Select[Any]:
    """The payload of signal ``name`` sent to a job: one row, or none if not sent yet.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> "job_steps.result" in str(select_job_signal(JobStep, uuid.uuid4(), "approved"))
        True
    """
    s = table_of(steps)
    signal = bindparam("signal_name", SIGNAL_PREFIX + name, type_=Text)
    return select(s.c.result).where(s.c.job_id == job_id, s.c.name == signal)


def lock_held_job(jobs: object, job_id: object, token: object) -> Select[Any]:
    """Lock a job's row ``FOR UPDATE`` if it is still ``running`` under ``token``: its id,
    or no row when the lease was lost. A wait for a signal runs under it, so that a sender
    (`lock_job`) comes strictly before or after the wait.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "FOR UPDATE" in str(lock_held_job(Job, uuid.uuid4(), uuid.uuid4()))
        True
    """
    t = table_of(jobs)
    return (
        select(t.c.id)
        .where(t.c.id == job_id, t.c.lease_token == token, t.c.status == JobStatus.RUNNING)
        .with_for_update()
    )


def lock_job(jobs: object, job_id: object) -> Select[Any]:
    """Lock a job's row ``FOR UPDATE``, whatever its state: a signal's sender takes it
    before `send_job_signal`, which then sees what a wait that held it committed.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "FOR UPDATE" in str(lock_job(Job, uuid.uuid4()))
        True
    """
    t = table_of(jobs)
    return select(t.c.id).where(t.c.id == job_id).with_for_update()
