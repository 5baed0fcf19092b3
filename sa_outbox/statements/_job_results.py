"""Job results: a handler's return value, recorded with its completion; reading it back; the
NOTIFY that tells waiters a job finished."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    CTE,
    Insert,
    Select,
    Text,
    Uuid,
    and_,
    any_,
    bindparam,
    cast,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, OID, insert
from sqlalchemy.sql.elements import ColumnElement

from .._exceptions import InvalidArgument
from ._common import as_uuid, table_of
from ._job_notify import _job_table_name

#: The step name under which a job's result is recorded in the steps table.
RESULT_STEP = "@result"

#: The prefix of the channel on which finished jobs are announced (then an md5 of the table).
DONE_CHANNEL_PREFIX = "sa_outbox_done_"

#: The most job ids one notification of `announce_done` names (37 bytes each, with commas:
#: under PostgreSQL's 8000-byte limit on a payload).
_NOTIFY_IDS = 200
#: The array parameters of `record_results_of`: the jobs' ids and their results' JSON text.
RESULT_IDS = "result_ids"
RESULT_TEXTS = "result_texts"


def record_job_results(steps: object, rows: Sequence[tuple[uuid.UUID, str]]) -> Insert:
    """Record the results (JSON text) of jobs that just completed, as their step
    ``@result``; a result recorded before (a job run again by hand) is replaced.

    Run it in the transaction that completes the jobs, for the ones it completed: the result
    commits with the job's ``succeeded``, or neither does.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = record_job_results(JobStep, [(uuid.UUID(int=1), '{"total": 42}')])
        >>> "unnest" in str(stmt) and "ON CONFLICT" in str(stmt)
        True
    """
    if not rows:
        raise InvalidArgument("record_job_results needs at least one (job id, result) row")
    ids = [as_uuid(job_id, "result's job id") for job_id, _ in rows]
    return _record_results(steps, ids, [text for _, text in rows], done=None)


def _record_results(
    steps: object, ids: list[uuid.UUID], texts: list[str], *, done: CTE | None
) -> Insert:
    """Upsert ``@result`` rows from the `RESULT_IDS` / `RESULT_TEXTS` arrays (given here, or
    bound at execution), only for the ids in CTE ``done`` when given."""
    s = table_of(steps)
    given = (
        func.unnest(
            bindparam(RESULT_IDS, ids, type_=ARRAY(Uuid())),
            bindparam(RESULT_TEXTS, texts, type_=ARRAY(Text())),
        )
        .table_valued("id", "result")
        .render_derived(name="given")
    )
    rows = select(
        given.c.id,
        bindparam("result_step", RESULT_STEP, type_=Text),
        cast(given.c.result, JSONB),
    )
    if done is not None:
        rows = rows.where(given.c.id.in_(select(done.c.id)))
    stmt = insert(s).from_select(["job_id", "name", "result"], rows)
    return stmt.on_conflict_do_update(
        index_elements=["job_id", "name"],
        set_={"result": stmt.excluded.result, "created_at": func.now()},
    )


def select_job_results(jobs: object, steps: object, ids: Iterable[object]) -> Select[Any]:
    """The state of jobs and their recorded results: ``id, status, last_error, result,
    recorded`` (``recorded`` false when the job has no result row: still running, failed,
    or its handler returned ``None``). A job not in the table (never, or pruned) has no row.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> stmt = select_job_results(Job, JobStep, [uuid.UUID(int=1)])
        >>> list(stmt.selected_columns.keys())
        ['id', 'status', 'last_error', 'result', 'recorded']
    """
    t, s = table_of(jobs), table_of(steps)
    wanted = [as_uuid(job_id, "job id") for job_id in ids]
    named = bindparam("result_step", RESULT_STEP, type_=Text)
    return (
        select(
            t.c.id,
            t.c.status,
            t.c.last_error,
            s.c.result,
            s.c.job_id.is_not(None).label("recorded"),
        )
        .select_from(t.outerjoin(s, and_(s.c.job_id == t.c.id, s.c.name == named)))
        .where(t.c.id == any_(bindparam("job_ids", wanted, type_=ARRAY(Uuid()))))
    )


def done_channel(jobs: object) -> ColumnElement[str]:
    """The name of the channel on which finished jobs of this table are announced:
    ``sa_outbox_done_`` and the table's oid, as the database resolves the table (NULL when
    there is no such table). Waiters and workers compute it alike, whatever their
    ``search_path``.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "to_regclass" in str(done_channel(Job))
        True
    """
    oid = cast(func.to_regclass(_job_table_name(jobs)), OID)
    return literal(DONE_CHANNEL_PREFIX, Text) + cast(oid, Text)


def job_done_channel_of(jobs: object) -> Select[tuple[str]]:
    """`done_channel` as one row (its value NULL when there is no such table).

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> job_done_channel_of(Job).compile().params
        {'param_1': 'sa_outbox_done_', 'job_table': 'jobs'}
    """
    return select(done_channel(jobs).label("channel"))


def notify_jobs_done(jobs: object, ids: Iterable[uuid.UUID]) -> Select[tuple[int]]:
    """``pg_notify`` on the table's done channel, naming the jobs that finished (succeeded,
    failed or cancelled), `_NOTIFY_IDS` per notification (`announce_done`): waiters
    (`JobResults`) listening there wake at commit.

    Examples:
        >>> import uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> notify_jobs_done(Job, [uuid.UUID(int=1)]).compile().params["done_ids"]
        [UUID('00000000-0000-0000-0000-000000000001')]
    """
    wanted = [as_uuid(job_id, "finished job id") for job_id in ids]
    if not wanted:
        raise InvalidArgument("notify_jobs_done needs at least one job id")
    given = func.unnest(bindparam("done_ids", wanted, type_=ARRAY(Uuid())))
    return announce_done(jobs, select(given.label("id")).cte("done"))


def announce_done(jobs: object, done: CTE) -> Select[tuple[int]]:
    """``pg_notify`` on the done channel for the ids in CTE ``done`` (an ``id`` column),
    at most `_NOTIFY_IDS` per notification; one row, how many were sent. For a statement
    that finishes jobs in a CTE and announces them in the same statement.

    Examples:
        >>> import uuid
        >>> from sqlalchemy import select, values, column, Uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> done = select(values(column("id", Uuid), name="v").data([(uuid.UUID(int=1),)])).cte()
        >>> "pg_notify" in str(announce_done(Job, done))
        True
    """
    numbered = select(
        done.c.id, ((func.row_number().over() - 1) // _NOTIFY_IDS).label("chunk")
    ).subquery("numbered")
    chunks = (
        select(func.string_agg(cast(numbered.c.id, Text), literal(",", Text)).label("ids"))
        .group_by(numbered.c.chunk)
        .subquery("chunks")
    )
    return select(func.count(func.pg_notify(done_channel(jobs), chunks.c.ids)).label("sent"))


def record_results_of(steps: object, done: CTE) -> Insert:
    """Record, as their step ``@result``, the results given in the `RESULT_IDS` /
    `RESULT_TEXTS` parameters (JSON text) of the jobs in CTE ``done`` (an ``id`` column: the
    ones the same statement completed); an earlier result of a job is replaced. Empty
    arrays record nothing.

    Examples:
        >>> import uuid
        >>> from sqlalchemy import select, values, column, Uuid
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobStepMixin
        >>> class Base(DeclarativeBase): pass
        >>> class JobStep(JobStepMixin, Base): __tablename__ = "job_steps"
        >>> done = select(values(column("id", Uuid), name="v").data([(uuid.UUID(int=1),)])).cte()
        >>> {"result_ids", "result_texts"} <= set(record_results_of(JobStep, done).compile().params)
        True
    """
    return _record_results(steps, [], [], done=done)


def parse_done_payload(payload: str) -> list[uuid.UUID]:
    """The job ids a done notification names (what is not an id is skipped).

    Examples:
        >>> parse_done_payload("00000000-0000-0000-0000-000000000001,nonsense")
        [UUID('00000000-0000-0000-0000-000000000001')]
    """
    ids = []
    for part in payload.split(","):
        try:
            ids.append(uuid.UUID(part))
        except ValueError:
            continue
    return ids
