"""Workflows seen whole: the jobs linked by ``after=`` (`JobDependencyMixin`), grouped by
the workflow each dependant joined, the id of the job that started it."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import (
    DateTime,
    Select,
    Text,
    Update,
    Uuid,
    case,
    delete,
    distinct,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningDelete

from .._clock import Clock
from ..schema import JobStatus
from ._common import now_of, table_of, uuid_array

#: The states a workflow's jobs are counted in (``waiting``: not in the job table yet).
WORKFLOW_STATES = ("waiting", *(status.value for status in JobStatus))


#: A workflow's state: ``running`` while a job of it waits, is pending or runs; once all
#: have finished, ``failed`` if one of them failed, else ``cancelled`` if one was cancelled,
#: else ``succeeded``.
WORKFLOW_OUTCOMES = ("running", "succeeded", "failed", "cancelled")


def _members(deps: Any) -> Any:
    """Every workflow's jobs: the jobs that waited (their rows) and the one that started it."""
    d = table_of(deps)
    roots = select(d.c.workflow_id, d.c.workflow_id.label("job_id")).distinct()
    return union_all(select(d.c.workflow_id, d.c.job_id), roots).subquery("members")


def select_workflows(jobs: object, deps: object, *, limit: int) -> Select[Any]:
    """One row per workflow, the most recently active first: ``workflow_id, jobs``, a count
    per state of `WORKFLOW_STATES`, ``started`` and ``updated``.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> list(select_workflows(Job, JobDependency, limit=20).selected_columns.keys())[:3]
        ['workflow_id', 'jobs', 'waiting']
    """
    t = table_of(jobs)
    members = _members(deps)
    counts = [
        func.count().filter(t.c.id.is_(None)).label("waiting"),
        *(func.count().filter(t.c.status == status).label(status.value) for status in JobStatus),
    ]
    updated = func.max(t.c.updated_at)
    return (
        select(
            members.c.workflow_id,
            func.count().label("jobs"),
            *counts,
            func.min(t.c.created_at).label("started"),
            updated.label("updated"),
        )
        .select_from(members.outerjoin(t, t.c.id == members.c.job_id))
        .group_by(members.c.workflow_id)
        .order_by(updated.desc().nulls_last(), members.c.workflow_id)
        .limit(limit)
    )


def count_workflows_by_state(jobs: object, deps: object) -> Select[Any]:
    """How many workflows are in each state of `WORKFLOW_OUTCOMES`: ``state, workflows``,
    one row per state that has any. Reads the whole dependencies table (for ``sa-outbox
    status``, not for a scrape every few seconds: `count_waiting_dependants` is cheap).

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> list(count_workflows_by_state(Job, JobDependency).selected_columns.keys())
        ['state', 'workflows']
    """
    t = table_of(jobs)
    members = _members(deps)
    unfinished = t.c.id.is_(None) | t.c.status.in_([JobStatus.PENDING, JobStatus.RUNNING])
    per_workflow = (
        select(
            func.bool_or(unfinished).label("unfinished"),
            func.bool_or(t.c.status == JobStatus.FAILED).label("failed"),
            func.bool_or(t.c.status == JobStatus.CANCELLED).label("cancelled"),
        )
        .select_from(members.outerjoin(t, t.c.id == members.c.job_id))
        .group_by(members.c.workflow_id)
        .subquery("per_workflow")
    )
    state = case(
        (per_workflow.c.unfinished, literal("running", Text)),
        (per_workflow.c.failed, literal("failed", Text)),
        (per_workflow.c.cancelled, literal("cancelled", Text)),
        else_=literal("succeeded", Text),
    )
    return select(state.label("state"), func.count().label("workflows")).group_by(state)


def count_waiting_dependants(deps: object) -> Select[Any]:
    """``jobs, workflows``: how many jobs wait for others (not released yet) and in how many
    workflows; one row, read through the waiting rows' partial index.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "released_at IS NULL" in str(count_waiting_dependants(JobDependency))
        True
    """
    d = table_of(deps)
    jobs: Any = func.count().label("jobs")
    workflows = func.count(distinct(d.c.workflow_id)).label("workflows")
    return select(jobs, workflows).where(d.c.released_at.is_(None))


def select_workflow_of(deps: object, job_id: uuid.UUID) -> Select[Any]:
    """The workflow a job belongs to: its dependency row's, or its own id (one row).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "coalesce" in str(select_workflow_of(JobDependency, uuid.UUID(int=1)))
        True
    """
    d = table_of(deps)
    own = select(d.c.workflow_id).where(d.c.job_id == job_id).scalar_subquery()
    return select(func.coalesce(own, literal(job_id, Uuid)))


def select_workflow(jobs: object, deps: object, workflow_id: uuid.UUID) -> Select[Any]:
    """Every job of one workflow, the one that started it first, then in the order they
    were added: ``id, parents`` (empty for the first), ``kind, status`` (``NULL`` while
    waiting), ``attempts, max_attempts, created_at, updated_at, released_at, last_error``.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> stmt = select_workflow(Job, JobDependency, uuid.UUID(int=1))
        >>> list(stmt.selected_columns.keys())[:4]
        ['id', 'parents', 'kind', 'status']
    """
    t, d = table_of(jobs), table_of(deps)
    no_parents = literal([], ARRAY(Uuid()))
    members = union_all(
        select(
            literal(workflow_id, Uuid).label("job_id"),
            no_parents.label("parents"),
            null().label("kind"),
            null().cast(DateTime(timezone=True)).label("added"),
            null().cast(DateTime(timezone=True)).label("released_at"),
        ),
        select(
            d.c.job_id,
            d.c.parents,
            d.c.job["kind"].astext,
            d.c.created_at,
            d.c.released_at,
        ).where(d.c.workflow_id == workflow_id),
    ).subquery("members")
    return (
        select(
            members.c.job_id.label("id"),
            members.c.parents,
            func.coalesce(t.c.kind, members.c.kind, literal("?", Text)).label("kind"),
            t.c.status,
            t.c.attempts,
            t.c.max_attempts,
            func.coalesce(t.c.created_at, members.c.added).label("created_at"),
            t.c.updated_at,
            members.c.released_at,
            t.c.last_error,
        )
        .select_from(members.outerjoin(t, t.c.id == members.c.job_id))
        .order_by(members.c.added.asc().nulls_first(), members.c.job_id)
    )


#: The states a workflow's retry sends back (a job stopping, still held by its worker, is
#: left until it has stopped).
RETRIED_STATES = (JobStatus.FAILED, JobStatus.CANCELLED)


def _retriable(t: Any) -> Any:
    return t.c.status.in_(RETRIED_STATES) & t.c.lease_until.is_(None)


def lock_workflow_retries(jobs: object, deps: object, workflow_id: uuid.UUID) -> Select[Any]:
    """The jobs of a workflow that its retry sends back, locked ``FOR UPDATE``: the failed
    and cancelled ones no worker holds, with ``id, status``, ``parents_succeeded`` (every
    job it waited for succeeded, or it waited for none: it can run again now) and
    ``unique`` (it has a unique key, whose guard decides).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> stmt = lock_workflow_retries(Job, JobDependency, uuid.UUID(int=1))
        >>> list(stmt.selected_columns.keys())
        ['id', 'status', 'parents_succeeded', 'unique']
    """
    t, d = table_of(jobs), table_of(deps)
    parent = t.alias("parent")
    each = func.unnest(d.c.parents).table_valued("id").render_derived(name="parent_ids")
    unsettled = (
        select(func.count())
        .select_from(each.outerjoin(parent, parent.c.id == each.c.id))
        .where(parent.c.status.is_distinct_from(JobStatus.SUCCEEDED))
        .scalar_subquery()
    )
    members = select(d.c.job_id).where(d.c.workflow_id == workflow_id)
    return (
        select(
            t.c.id,
            t.c.status,
            (func.coalesce(unsettled, 0) == 0).label("parents_succeeded"),
            t.c.unique_key.is_not(None).label("unique"),
        )
        .select_from(t.outerjoin(d, d.c.job_id == t.c.id))
        .where(or_(t.c.id == workflow_id, t.c.id.in_(members)), _retriable(t))
        .order_by(t.c.id)
        .with_for_update(of=t)
    )


def requeue_workflow_jobs(
    jobs: object, ids: list[uuid.UUID], *, clock: Clock | None = None
) -> Update:
    """Send these failed or cancelled jobs (`lock_workflow_retries`) back to ``pending``
    now, with all their attempts; ``last_error`` is kept for the record. Returns ``id,
    queue`` of each.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "lease_until IS NULL" in str(requeue_workflow_jobs(Job, [uuid.UUID(int=1)]))
        True
    """
    t = table_of(jobs)
    now = now_of(clock)
    return (
        update(t)
        .where(t.c.id == func.any(uuid_array(ids)), _retriable(t))
        .values(status=JobStatus.PENDING, attempts=0, run_at=now, updated_at=now)
        .returning(t.c.id, t.c.queue)
    )


def delete_released_jobs(jobs: object, ids: list[uuid.UUID]) -> ReturningDelete[Any]:
    """Take these failed or cancelled jobs out of the job table, for `wait_again`: their
    values are still in their dependency row, which inserts them when released. Returns
    the ids deleted.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> str(delete_released_jobs(Job, [uuid.UUID(int=1)])).startswith("DELETE FROM jobs")
        True
    """
    t = table_of(jobs)
    return delete(t).where(t.c.id == func.any(uuid_array(ids)), _retriable(t)).returning(t.c.id)


def wait_again(deps: object, ids: list[uuid.UUID]) -> Update:
    """Make these released dependants wait again (``released_at`` back to ``NULL``): the
    release decides them anew once their parents finish. Returns the ids.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "released_at=NULL" in str(wait_again(JobDependency, [uuid.UUID(int=1)]))
        True
    """
    d = table_of(deps)
    return (
        update(d)
        .where(d.c.job_id == func.any(uuid_array(ids)), d.c.released_at.is_not(None))
        .values(released_at=null())
        .returning(d.c.job_id)
    )
