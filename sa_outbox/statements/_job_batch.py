"""`enqueue_jobs`: many jobs in one ``INSERT … SELECT FROM jsonb_to_recordset(…)``, the jobs
sent as one JSON document that this module writes (each job checked as `check_job` does,
the usual one in a few identity tests)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Interval,
    Text,
    Uuid,
    bindparam,
    cast,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningInsert
from sqlalchemy.sql.elements import ColumnClause

from .._clock import Clock
from .._exceptions import InvalidArgument
from .._ids import uuid7_ints
from .._json import DEEP_TEXT, MAX_DEPTH, compact_json, prebuilt_encoder
from .._validation import is_utf8
from ..schema import JobStatus
from ._common import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Dumps,
    now_of,
    refuse_unstorable,
    table_of,
)
from ._job_enqueue import (
    has_headers,
    has_lock_key,
    no_headers_column,
    no_lock_key_column,
    on_conflict_skip,
)
from ._job_headers import job_headers_text
from ._job_record import NewJob, check_job, is_plain_job
from ._job_unique import refuse_unique_on, unique_key_sql


def enqueue_jobs(
    target: object,
    jobs: Iterable[NewJob],
    *,
    trace_headers: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> tuple[ReturningInsert[Any], list[uuid.UUID]]:
    """One ``INSERT … SELECT FROM jsonb_to_recordset(…) ON CONFLICT DO NOTHING RETURNING id``.

    Returns the statement and the ids given to the jobs, in input order: the ids the
    statement returns are those that were inserted; the others collided with a
    deduplication key (an earlier job, or an earlier one in the same batch). One statement
    shape serves any number of jobs, so it compiles once. The jobs travel as one JSON
    document (one object per job, payloads embedded as they were serialised): one string
    parameter for the driver to send, where arrays would be adapted element by element.
    ``trace_headers`` join every job's own ``headers``, under them (see `enqueue_job_values`).
    When a job of the batch is ``unique`` (`Unique`), the statement carries the unique
    columns and its ``ON CONFLICT DO NOTHING`` has no target: a job is then skipped when
    its deduplication key or its unique key is taken, by an earlier job or one earlier in
    the batch.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt, ids = enqueue_jobs(Job, [NewJob("a", {}), NewJob("b", [1, 2])])
        >>> len(ids)
        2
    """
    jobs = list(jobs)
    t = table_of(target)
    with_headers = has_headers(t)
    # One block of ids for the batch: the same UUIDv7 sequence, a tenth of the cost.
    values = uuid7_ints(len(jobs))
    trace = trace_headers if with_headers else None
    document, unique = _jobs_document(jobs, values, dumps, max_payload_bytes, trace)
    if not jobs:
        raise InvalidArgument("enqueue_jobs needs at least one job")
    if not with_headers and any(job.headers is not None for job in jobs):
        raise no_headers_column(t)
    with_lock_key = has_lock_key(t)
    if not with_lock_key and any(job.lock_key is not None for job in jobs):
        raise no_lock_key_column(t)
    if unique:
        refuse_unique_on(t)
    now = now_of(clock)
    rows = (
        func.jsonb_to_recordset(cast(bindparam(None, document, type_=Text()), JSONB))
        .table_valued(
            column("id", Uuid()),
            column("queue", Text()),
            column("kind", Text()),
            column("payload", JSONB()),
            column("priority", Integer()),
            column("run_at", DateTime(timezone=True)),
            column("delay", Interval()),
            column("max_attempts", Integer()),
            column("dedup", Text()),
            *([column("headers", JSONB())] if with_headers else []),
            *([column("lock_key", Text())] if with_lock_key else []),
            *(_unique_fields() if unique else []),
        )
        .render_derived(name="new_jobs", with_types=True)
    )
    run_at = func.coalesce(
        rows.c.run_at, now + func.coalesce(rows.c.delay, literal(dt.timedelta()))
    )
    source = select(
        rows.c.id,
        rows.c.queue,
        rows.c.kind,
        # A JSON null payload comes out of the recordset as SQL NULL: it is jsonb 'null'.
        func.coalesce(rows.c.payload, literal_column("'null'::jsonb", JSONB())),
        literal(JobStatus.PENDING.value).cast(t.c.status.type),
        rows.c.priority,
        run_at,
        rows.c.max_attempts,
        rows.c.dedup,
        now,
        now,
        *([rows.c.headers] if with_headers else []),
        *([rows.c.lock_key] if with_lock_key else []),
        *(
            [
                unique_key_sql(rows.c.unique_digest, rows.c.unique_period, now),
                cast(rows.c.unique_states, t.c.unique_states.type),
            ]
            if unique
            else []
        ),
    )
    columns = [
        "id",
        "queue",
        "kind",
        "payload",
        "status",
        "priority",
        "run_at",
        "max_attempts",
        "deduplication_key",
        "created_at",
        "updated_at",
        *(["headers"] if with_headers else []),
        *(["lock_key"] if with_lock_key else []),
        *(["unique_key", "unique_states"] if unique else []),
    ]
    skipping = on_conflict_skip(insert(t).from_select(columns, source), t, unique)
    stmt = skipping.returning(t.c.id)
    return stmt, [uuid.UUID(int=value) for value in values]


def _unique_fields() -> list[ColumnClause[Any]]:
    """The unique jobs' fields of `enqueue_jobs`' recordset (`_checked_object` writes them)."""
    return [
        column("unique_digest", Text()),
        column("unique_period", BigInteger()),
        column("unique_states", Text()),
    ]


# A JSON string literal as compact_json writes one (UTF-8 kept, only what JSON escapes).
_json_str = json.encoder.encode_basestring


_UNSET: Any = object()


_NO_ID = uuid.UUID(int=0)


def _jobs_document(
    jobs: list[NewJob],
    ids: list[int],
    dumps: Dumps,
    limit: int,
    trace: Mapping[str, str] | None = None,
) -> tuple[str, bool]:
    """The jobs as the JSON array `enqueue_jobs` sends: checked in order, as `check_job` does;
    and whether one of them is unique (its object then holds the ``unique_*`` fields).

    A plain job (`is_plain_job`) whose fields are the very objects of the plain job checked
    before it (``NewJob("send", {...})`` in a loop) needs identity tests only, and its
    payload goes through the C encoder of `fast_compact_json` directly (and a payload
    `may_be_unstorable` doubts, through `refuse_unstorable`); any other job goes through
    `check_job`, which accepts it or raises. ``trace`` becomes the ``headers`` of every job,
    under the job's own.
    """
    encoder = prebuilt_encoder(dumps)
    raw = encoder is None  # another dumps may write a NUL as it is, not as an escape
    join = "".join
    fits = limit // 4  # a str of this many characters fits in any UTF-8 encoding
    objects: list[str] = []
    append = objects.append
    kind = queue = priority = attempts = _UNSET
    head = tail = ""
    # The trace context is the same for every job: serialised once (its values are the
    # propagator's ASCII, so a plain job's headers need no check).
    end = "}" if not trace else f',"headers":{job_headers_text(None, trace, "jobs")}}}'
    unique = False
    for job_id, job in zip(ids, jobs, strict=True):
        if not (
            type(job) is NewJob
            and job.kind is kind
            and job.queue is queue
            and job.priority is priority
            and job.max_attempts is attempts
            and job.run_at is None
            and job.delay is None
            and job.deduplication_key is None
            and job.headers is None
            and job.lock_key is None
            and job.unique is None
        ):
            if not is_plain_job(job):
                append(_checked_object(job, job_id, dumps, limit, trace))
                unique = unique or job.unique is not None
                continue
            kind, queue = job.kind, job.queue
            priority, attempts = job.priority, job.max_attempts
            head = f',"queue":{_json_str(queue)},"kind":{_json_str(kind)},"payload":'
            tail = f',"priority":{priority},"max_attempts":{attempts}{end}'
        payload: Any
        try:
            payload = join(encoder(job.payload, 0)) if encoder is not None else dumps(job.payload)
        except (TypeError, ValueError, RecursionError):
            payload = None  # check_job says what is wrong with it
        if type(payload) is not str or len(payload) > fits:
            append(_checked_object(job, job_id, dumps, limit, trace))  # says what is wrong
            continue
        if (  # `may_be_unstorable`, inline: it runs for every job
            "\\u" in payload
            or (raw and "\x00" in payload)
            or (len(payload) > DEEP_TEXT and payload.count("[") + payload.count("{") > MAX_DEPTH)
            or (not payload.isascii() and not is_utf8(payload))
        ):  # raises if it holds what jsonb refuses; often it does not (many brackets, say)
            refuse_unstorable(payload, job.payload, f"job kind {job.kind!r}")
        append(f'{{"id":"{job_id:032x}"{head}{payload}{tail}')
    return f"[{','.join(objects)}]", unique


def _checked_object(
    job: NewJob, job_id: int, dumps: Dumps, limit: int, trace: Mapping[str, str] | None
) -> str:
    """One job of `_jobs_document` through `check_job`: its JSON object, or its error."""
    c = check_job(job, dumps=dumps, max_payload_bytes=limit, job_id=_NO_ID, trace_headers=trace)
    text = (
        f'{{"id":"{job_id:032x}","queue":{_json_str(c.queue)},"kind":{_json_str(c.kind)},'
        f'"payload":{c.payload},"priority":{int(c.priority)},'
        f'"max_attempts":{int(c.max_attempts)}'
    )
    if c.run_at is not None:
        text += f',"run_at":"{c.run_at.isoformat()}"'
    if c.delay is not None:
        delay = c.delay
        text += f',"delay":"{delay.days} days {delay.seconds} s {delay.microseconds} us"'
    if c.deduplication_key is not None:
        text += f',"dedup":{_json_str(c.deduplication_key)}'
    if c.headers is not None:
        text += f',"headers":{c.headers}'
    if c.lock_key is not None:
        text += f',"lock_key":{_json_str(c.lock_key)}'
    if c.unique is not None:
        digest, period, states = c.unique
        text += f',"unique_digest":"{digest}","unique_states":"{states}"'
        if period is not None:
            text += f',"unique_period":{period}'
    return text + "}"
