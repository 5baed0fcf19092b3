"""Jobs that wait for other jobs: enqueue a dependant, release the dependants whose parents
finished, read a job's parents' results.

A dependant waits in the dependencies table (`JobDependencyMixin`), never in the job table,
so the claim does not meet it. `release_dependants` decides, from the parents' states as
they are now, which waiting jobs go into the job table (``pending``, or ``cancelled`` /
``failed`` by their ``on_failure`` policy) and moves them there in one statement; a worker
runs it after each write that finished jobs and, as a sweep, now and then.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    DateTime,
    Insert,
    Integer,
    Interval,
    Select,
    Text,
    TextClause,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    select,
    true,
    update,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import JSONB, insert

from .._clock import Clock
from .._exceptions import InvalidArgument
from ..schema import ON_FAILURE, JobStatus
from ._common import now_of, table_of, uuid_array
from ._job_results import RESULT_STEP

#: The error recorded on a dependant released as ``cancelled`` or ``failed`` by its
#: ``on_failure``, followed by ``: `` and the ids of the jobs that did not succeed.
PARENT_FAILED = "a job it waits for did not succeed (it failed or was cancelled)"
#: The error recorded on a job cancelled by hand while it waited.
CANCELLED_WAITING = "cancelled while it waited for other jobs"

_FINISHED_BADLY = (JobStatus.FAILED, JobStatus.CANCELLED)


def lock_waiting_parents(deps: object, parents: Sequence[uuid.UUID]) -> Select[Any]:
    """The ids among ``parents`` that are themselves still waiting (in the dependencies
    table), locked ``FOR SHARE`` until the transaction ends: their release waits for it.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> from sqlalchemy.dialects import postgresql
        >>> stmt = lock_waiting_parents(JobDependency, [uuid.UUID(int=1)])
        >>> "FOR SHARE" in str(stmt.compile(dialect=postgresql.dialect()))
        True
    """
    d = table_of(deps)
    return (
        select(d.c.job_id)
        .where(d.c.job_id == any_(uuid_array(list(parents))), d.c.released_at.is_(None))
        .with_for_update(read=True)
    )


def lock_parent_jobs(jobs: object, parents: Sequence[uuid.UUID]) -> Select[Any]:
    """The ids among ``parents`` in the job table, locked ``FOR SHARE`` until the
    transaction ends: a worker's write that finishes one of them waits for it, so it then
    sees the dependant this transaction adds.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> from sqlalchemy.dialects import postgresql
        >>> stmt = lock_parent_jobs(Job, [uuid.UUID(int=1)])
        >>> "FOR SHARE" in str(stmt.compile(dialect=postgresql.dialect()))
        True
    """
    t = table_of(jobs)
    return (
        select(t.c.id).where(t.c.id == any_(uuid_array(list(parents)))).with_for_update(read=True)
    )


def insert_dependant(
    deps: object,
    values: dict[str, Any],
    parents: Sequence[uuid.UUID],
    on_failure: str,
    *,
    clock: Clock | None = None,
) -> Insert:
    """A job that waits for ``parents``: its row in the dependencies table, holding the
    job's checked values (``values``, as `job_template_values` returns them) until its
    release. Its earliest start (``run_at``, or now + ``delay``) is fixed now; it joins its
    first parent's workflow (that parent's id, when it waited for nothing).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> from sa_outbox.statements import NewJob
        >>> from sa_outbox.statements._job_enqueue import job_template_values
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> values = job_template_values(NewJob("ship", {"order": 7}))
        >>> stmt = insert_dependant(JobDependency, values, [uuid.UUID(int=1)], "cancel")
        >>> "jsonb_build_object" in str(stmt)
        True
    """
    d = table_of(deps)
    now = now_of(clock)
    not_before = func.coalesce(
        bindparam("job_run_at", values["job_run_at"], type_=DateTime(timezone=True)),
        now + bindparam("job_delay", values["job_delay"], type_=Interval()),
    )
    job = func.jsonb_build_object(
        literal("queue", Text),
        bindparam("job_queue", values["job_queue"], type_=Text),
        literal("kind", Text),
        bindparam("job_kind", values["job_kind"], type_=Text),
        literal("payload", Text),
        cast(bindparam("job_payload", values["job_payload"], type_=Text), JSONB),
        literal("priority", Text),
        bindparam("job_priority", values["job_priority"], type_=Integer),
        literal("max_attempts", Text),
        bindparam("job_max_attempts", values["job_max_attempts"], type_=Integer),
        literal("headers", Text),
        cast(bindparam("job_headers", values["job_headers"], type_=Text), JSONB),
        literal("lock_key", Text),
        bindparam("job_lock_key", values["job_lock_key"], type_=Text),
        literal("not_before", Text),
        not_before,
    )
    first = bindparam("first_parent", parents[0], type_=d.c.job_id.type)
    joined = select(d.c.workflow_id).where(d.c.job_id == first).scalar_subquery()
    return insert(d).values(
        job_id=bindparam("job_id", values["job_id"], type_=d.c.job_id.type),
        workflow_id=func.coalesce(joined, first),
        parents=uuid_array(list(parents)),
        on_failure=bindparam("on_failure", on_failure, type_=Text),
        job=job,
        created_at=now,
    )


def release_dependants(
    jobs: object,
    deps: object,
    *,
    parents: Sequence[uuid.UUID] | None = None,
    job_ids: Sequence[uuid.UUID] | None = None,
    after: uuid.UUID | None = None,
    limit: int | None = None,
    cancel: bool = False,
    skip_locked: bool = False,
    clock: Clock | None = None,
) -> Insert:
    """Release the waiting jobs whose fate their parents now decide; returns ``id,
    status`` of each job it put into the job table.

    A waiting job is released ``pending`` once every parent has succeeded; when a parent
    failed or was cancelled, it is released ``cancelled`` or ``failed`` at once by its
    ``on_failure`` policy, or, with ``run``, ``pending`` once every parent has finished. A
    parent this statement cannot see (added to a batch since its snapshot, or pruned) is
    not finished: the dependant waits. ``cancel=True`` releases the chosen rows
    ``cancelled`` whatever their parents (`JobQueue.cancel` of a waiting job).

    Which waiting rows it looks at (all, or up to ``limit``, in ``job_id`` order, locked
    ``FOR UPDATE``, or ``SKIP LOCKED``): those with one of ``parents`` among their parents (a GIN
    index walk: after a write that finished those jobs), those in ``job_ids``, or all of
    them after ``after`` (a sweep, page by page). Each is released once: the row's
    ``released_at`` is set in the statement that inserts the job.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> stmt = release_dependants(Job, JobDependency, parents=[uuid.UUID(int=1)])
        >>> "&&" in str(stmt)
        True
    """
    t, d = table_of(jobs), table_of(deps)
    now = now_of(clock)
    chosen = select(d.c.job_id, d.c.parents, d.c.on_failure, d.c.job).where(
        d.c.released_at.is_(None)
    )
    if parents is not None:
        chosen = chosen.where(d.c.parents.overlap(uuid_array(list(parents))))
    if job_ids is not None:
        chosen = chosen.where(d.c.job_id == any_(uuid_array(list(job_ids))))
    if after is not None:
        chosen = chosen.where(d.c.job_id > after)
    waiting = (
        chosen.order_by(d.c.job_id)
        .limit(limit)
        .with_for_update(of=d, skip_locked=skip_locked)
        .cte("waiting")
    )
    each = func.unnest(waiting.c.parents).table_valued("id").render_derived(name="parent_ids")
    parent = t.alias("parent")
    unsuccessful = parent.c.status.in_(_FINISHED_BADLY)
    states = (
        select(
            waiting.c.job_id,
            func.count().filter(parent.c.status == JobStatus.SUCCEEDED).label("succeeded"),
            func.count().filter(unsuccessful).label("unsuccessful"),
            func.count().label("total"),
            func.string_agg(cast(each.c.id, Text), literal(", ", Text))
            .filter(unsuccessful)
            .label("unsuccessful_ids"),
        )
        .select_from(waiting.join(each, true()).outerjoin(parent, parent.c.id == each.c.id))
        .group_by(waiting.c.job_id)
        .cte("states")
    )
    outcome = case(
        (literal(cancel), literal("cancel", Text)),
        (
            and_(states.c.unsuccessful > 0, waiting.c.on_failure != "run"),
            waiting.c.on_failure,
        ),
        (states.c.succeeded + states.c.unsuccessful == states.c.total, literal("run", Text)),
        else_=null(),
    )
    error = case(
        (literal(cancel), literal(CANCELLED_WAITING, Text)),
        else_=func.concat(literal(PARENT_FAILED + ": ", Text), states.c.unsuccessful_ids),
    )
    decided = (
        select(waiting.c.job_id, waiting.c.job, outcome.label("outcome"), error.label("error"))
        .select_from(waiting.join(states, states.c.job_id == waiting.c.job_id))
        .cte("decided")
    )
    released = (
        update(d)
        .where(d.c.job_id == decided.c.job_id, decided.c.outcome.is_not(None))
        .values(released_at=now)
        .returning(d.c.job_id, decided.c.job, decided.c.outcome, decided.c.error)
        .cte("released")
    )
    job = released.c.job
    status = case(
        (released.c.outcome == "run", JobStatus.PENDING),
        (released.c.outcome == "cancel", JobStatus.CANCELLED),
        else_=JobStatus.FAILED,
    )
    columns: dict[str, Any] = {
        "id": released.c.job_id,
        "queue": job["queue"].astext,
        "kind": job["kind"].astext,
        "payload": job["payload"],
        "status": cast(status, t.c.status.type),
        "priority": cast(job["priority"].astext, Integer),
        "run_at": func.greatest(now, cast(job["not_before"].astext, DateTime(timezone=True))),
        "max_attempts": cast(job["max_attempts"].astext, Integer),
        "last_error": case((released.c.outcome == "run", null()), else_=released.c.error),
        "created_at": now,
        "updated_at": now,
    }
    if "headers" in t.c:
        columns["headers"] = func.nullif(job["headers"], cast(literal("null"), JSONB))
    if "lock_key" in t.c:
        columns["lock_key"] = job["lock_key"].astext
    rows = select(*columns.values())
    return insert(t).from_select(list(columns), rows).returning(t.c.id, t.c.status)


def select_parent_results(deps: object, steps: object, job_id: uuid.UUID) -> Select[Any]:
    """A dependant's parents, in the order it named them, each with its recorded result
    (``NULL`` when it recorded none): ``id, result`` rows.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = select_parent_results(JobDependency, JobStep, uuid.UUID(int=1))
        >>> list(stmt.selected_columns.keys())
        ['id', 'result']
    """
    d, s = table_of(deps), table_of(steps)
    each = (
        func.unnest(d.c.parents)
        .table_valued("id", with_ordinality="n")
        .render_derived(name="parent_ids")
    )
    named = bindparam("result_step", RESULT_STEP, type_=Text)
    return (
        select(each.c.id, s.c.result)
        .select_from(
            d.join(each, true()).outerjoin(s, and_(s.c.job_id == each.c.id, s.c.name == named))
        )
        .where(d.c.job_id == job_id)
        .order_by(each.c.n)
    )


def select_parent_statuses(jobs: object, deps: object, job_id: uuid.UUID) -> Select[Any]:
    """The status of each job a dependant waited for: ``id, status`` rows (a parent that
    is no longer in the job table has none).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> stmt = select_parent_statuses(Job, JobDependency, uuid.UUID(int=1))
        >>> list(stmt.selected_columns.keys())
        ['id', 'status']
    """
    t, d = table_of(jobs), table_of(deps)
    parents = select(func.unnest(d.c.parents)).where(d.c.job_id == job_id).scalar_subquery()
    return select(t.c.id, t.c.status).where(t.c.id.in_(parents))


def lock_waiting(deps: object, job_id: uuid.UUID) -> Select[Any]:
    """Lock a dependant's row ``FOR UPDATE`` while it still waits: its id, or no row when it
    was released (or is unknown). Adding jobs to a batch takes it first.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "FOR UPDATE" in str(lock_waiting(JobDependency, uuid.UUID(int=1)))
        True
    """
    d = table_of(deps)
    return (
        select(d.c.job_id).where(d.c.job_id == job_id, d.c.released_at.is_(None)).with_for_update()
    )


def add_parents(deps: object, job_id: uuid.UUID, parents: Sequence[uuid.UUID]) -> Update:
    """Make a waiting dependant wait for ``parents`` too (a batch's new jobs); run it after
    `lock_waiting` found the row.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "array_cat" in str(add_parents(JobDependency, uuid.UUID(int=1), [uuid.UUID(int=2)]))
        True
    """
    d = table_of(deps)
    return (
        update(d)
        .where(d.c.job_id == job_id, d.c.released_at.is_(None))
        .values(parents=func.array_cat(d.c.parents, uuid_array(list(parents))))
    )


def select_dependants(deps: object, parents: Sequence[uuid.UUID]) -> Select[Any]:
    """The jobs that wait, or waited, for one of ``parents``: ``job_id, released_at`` rows,
    in no order and unlocked (`release_dependants` then takes the waiting ones by id, in
    order). Only the GIN index of ``parents`` serves it: a condition on ``released_at``
    here would let the planner walk the waiting rows' index instead, every one of them,
    when many wait for one job (its statistics then say any job is waited for by half).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "&&" in str(select_dependants(JobDependency, [uuid.UUID(int=1)]))
        True
    """
    d = table_of(deps)
    return select(d.c.job_id, d.c.released_at).where(d.c.parents.overlap(uuid_array(list(parents))))


def select_waiting(deps: object, ids: Sequence[uuid.UUID]) -> Select[Any]:
    """Which of these ids are jobs still waiting for others: ``job_id`` rows.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "released_at IS NULL" in str(select_waiting(JobDependency, [uuid.UUID(int=1)]))
        True
    """
    d = table_of(deps)
    return select(d.c.job_id).where(
        d.c.job_id == any_(uuid_array(list(ids))), d.c.released_at.is_(None)
    )


def waiting_page(deps: object, *, after: uuid.UUID | None, limit: int) -> Select[Any]:
    """The next ``limit`` waiting jobs' ids after ``after``, in order (a sweep's page),
    walking the partial index of the waiting rows.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> "ORDER BY" in str(waiting_page(JobDependency, after=None, limit=100))
        True
    """
    d = table_of(deps)
    page = select(d.c.job_id).where(d.c.released_at.is_(None))
    if after is not None:
        page = page.where(d.c.job_id > after)
    return page.order_by(d.c.job_id).limit(limit)


def index_walks_only() -> TextClause:
    """``SET LOCAL enable_seqscan = off``: for a transaction of its own that releases
    dependants (a worker's, after its write). When many waiting jobs share one parent, the
    planner reckons any parent matches half of them and reads the whole table for each
    release; the index walk it then skips finds the few (or none) in a fraction of a
    millisecond. Never in a caller's transaction: it lasts until its end.

    Examples:
        >>> str(index_walks_only())
        'SET LOCAL enable_seqscan = off'
    """
    return sql_text("SET LOCAL enable_seqscan = off")


def check_on_failure(value: object) -> str:
    """An ``on_failure`` policy, checked (a one-line error naming the choices).

    Examples:
        >>> check_on_failure("run")
        'run'
    """
    if value not in ON_FAILURE:
        raise InvalidArgument(f"on_failure must be one of {', '.join(ON_FAILURE)}; got {value!r}")
    return str(value)
