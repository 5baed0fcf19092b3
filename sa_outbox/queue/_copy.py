"""Bulk enqueue with PostgreSQL's ``COPY``: `JobQueue.enqueue_copy` and its asyncio twin.

``COPY … FROM STDIN`` is the fastest way into a table (about 1.5x ``INSERT … SELECT FROM
unnest`` and 1.75x ``executemany`` for batches of 1,000 on the benchmark machine), but it
takes rows as they are: no ``ON CONFLICT``, no ``RETURNING``. Hence the contract:

- Every job is checked first (the same rules as `enqueue_jobs`), so bad input raises,
  naming the job's index and field, before any SQL is sent; nothing half-written. The
  whole stream is encoded to UTF-8 before the COPY starts, so a lone surrogate is bad
  input too, not a COPY aborted halfway.
- The usual job costs little to check: a job whose ``kind``, ``queue``, ``priority`` and
  ``max_attempts`` are the very objects of a job checked before it (``NewJob("send", …)``
  in a loop) needs identity tests only; the ids are made a block at a time
  (`uuid7_hex`) and the payloads serialised by `fast_compact_json`'s C encoder, called
  directly: about 0.4 µs per job on the benchmark machine, against some 7 µs for the
  round trips and commit of a 1,000-row COPY (docs/performance.md, "Bulk enqueue (W3)").
- Jobs with a ``deduplication_key``, and unique jobs (`Unique`), are refused. A conflict
  would abort the whole COPY (and the caller's transaction); skipping it would need a
  staging table — ``CREATE TEMP TABLE`` per call, which writes the system catalogs every
  time — then the same ``INSERT … SELECT … ON CONFLICT … RETURNING`` `enqueue_many` already
  runs, at its speed. Deduplicated and unique jobs go through `enqueue_many`, which also
  says which ones were inserted.
- Ids are UUIDv7 made here, in input order, so jobs of one priority and time are claimed in
  the order given; the count of rows written is returned (the ids are not: building a
  ``uuid.UUID`` per job costs more than writing it).
- The rows go through the psycopg 3 connection under the SQLAlchemy connection, inside the
  caller's transaction: nothing commits here, a rollback discards them, and the table's
  statement-level NOTIFY trigger fires once for the COPY, as for one ``INSERT``.

Text COPY, not binary: measured on 1,000-row batches they are within noise of each other,
and text needs no type declaration for the enum column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from .._clock import Clock, DatabaseClock
from .._exceptions import InvalidArgument, InvalidArgumentType, PayloadNotSerializable
from .._ids import uuid7_hex
from .._json import DEEP_TEXT, MAX_DEPTH, prebuilt_encoder
from .._tracing import current_trace_headers
from ..statements import NewJob, check_job, is_plain_job
from ..statements._common import Dumps, now_of, refuse_unstorable
from ..statements._job_headers import job_headers_text

if TYPE_CHECKING:
    from ..ops import AsyncConn, JobOps, SyncConn

__all__ = ["CopyPlan", "copy_jobs_async", "copy_jobs_sync", "plan_copy"]

_MAX_INT = 2**31 - 1
_COLUMNS = "id, queue, kind, payload, status, priority, max_attempts"
_HEADERS_COLUMN = ", headers"
_NULL = "\\N"  # COPY's text format for NULL
_TIME_COLUMNS = ", run_at, created_at, updated_at"
_FIELDS = ("id", "queue", "kind", "payload")  # the text fields of a line, in COPY's order
_When = tuple["dt.datetime | None", "dt.timedelta | None"]
_NO_WHEN: _When = (None, None)
_NO_ID = uuid.UUID(int=0)  # check_job passes it through: the line has its own id
_UNSET = object()


@dataclasses.dataclass(frozen=True, slots=True)
class CopyPlan:
    """The ``COPY`` statement and its rows, checked and written in COPY's text format.

    ``lines`` hold each row up to ``max_attempts``, escaped; when ``timed``, each row also
    gets ``run_at, created_at, updated_at`` from "now" (read once, see `data`), and
    ``times`` holds each row's own ``run_at`` or ``delay`` if any job has one. ``body`` is
    the whole stream, encoded, when it needs no "now".
    """

    sql: str
    lines: list[str]
    timed: bool
    times: list[_When] | None
    body: bytes | None

    @property
    def needs_now(self) -> bool:
        """Whether `data` needs the clock's "now" (else the columns' defaults give it)."""
        return self.timed

    def data(self, now: dt.datetime | None) -> bytes:
        """The whole COPY stream, UTF-8: one line per job, in input order."""
        if self.body is not None:
            return self.body
        assert now is not None
        stamp = now.isoformat()
        if self.times is None:  # every row runs now: the times are the same on each line
            end = f"\t{stamp}\t{stamp}\t{stamp}\n"
            return (end.join(self.lines) + end).encode()
        return "".join(
            f"{line}\t{_when(run_at, delay, now)}\t{stamp}\t{stamp}\n"
            for line, (run_at, delay) in zip(self.lines, self.times, strict=True)
        ).encode()


def _when(run_at: dt.datetime | None, delay: dt.timedelta | None, now: dt.datetime) -> str:
    return (run_at if run_at is not None else now if delay is None else now + delay).isoformat()


def _escaped(value: str) -> str:
    """``value`` as a field of COPY's text format (backslash escapes for \\, tab, newlines)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return value


def _usual(job: object) -> bool:
    """Whether ``job`` is plain for `enqueue_jobs` (`is_plain_job`: exactly a `NewJob` that
    `check_job` accepts as it is, no optional field set) and its names need no COPY escaping."""
    return is_plain_job(job) and _escaped(job.kind) is job.kind and _escaped(job.queue) is job.queue


def plan_copy(
    jobs: Iterable[NewJob],
    *,
    clock: Clock | None,
    dumps: Dumps,
    max_payload_bytes: int,
    quote_table: str,
    ids: list[str] | None = None,
    headers: bool = False,
    trace_headers: Mapping[str, str] | None = None,
) -> CopyPlan:
    """Check every job (raising ``jobs[i]: …``) and build the ``COPY`` and its rows; no I/O.

    Ids are UUIDv7 in input order (``ids``, 32 hex digits each, replace them in tests).
    ``headers``: the table has the ``headers`` column, which the rows then fill: each job's
    own headers over ``trace_headers``, or NULL (without it, a job with headers is refused).

    The usual job — exactly a `NewJob`, str names and int fields that need no escaping,
    no run_at, delay or deduplication key, a payload that serialises to a str short
    enough — costs a few identity tests: a job whose ``kind``, ``queue``, ``priority``
    and ``max_attempts`` are the very objects of the job before it (``NewJob("send",
    {...})`` in a loop) was checked with it. Any other job goes through the checks
    `enqueue_jobs` runs, which accept it or say what is wrong.

    Examples:
        >>> from sa_outbox._json import fast_compact_json
        >>> plan = plan_copy([NewJob("send", {"to": "ana"}), NewJob("send", [])],
        ...                  clock=None, dumps=fast_compact_json, max_payload_bytes=1024,
        ...                  quote_table="jobs", ids=["0" * 32, "1" * 32])
        >>> plan.sql
        'COPY jobs (id, queue, kind, payload, status, priority, max_attempts) FROM STDIN'
        >>> for line in plan.data(None).decode().splitlines():
        ...     print(line.split("\\t"))
        ['00000000000000000000000000000000', 'default', 'send', '{"to":"ana"}', 'pending', '0', '8']
        ['11111111111111111111111111111111', 'default', 'send', '[]', 'pending', '0', '8']
    """
    jobs = list(jobs)
    if not jobs:
        raise InvalidArgument("enqueue_copy needs at least one job")
    if ids is None:
        ids = uuid7_hex(len(jobs))
    elif len(ids) != len(jobs):
        raise InvalidArgument(f"got {len(ids)} ids for {len(jobs)} jobs")
    # With the database's clock and no run_at/delay, the columns' defaults (now()) give the
    # rows the transaction's time, as enqueue_many would; otherwise "now" is read first.
    timed = not (clock is None or isinstance(clock, DatabaseClock))
    encoder = prebuilt_encoder(dumps)
    raw = encoder is None  # another dumps may write a NUL as it is, not as an escape
    join = "".join
    fits = max_payload_bytes // 4  # a str of this many characters fits in any UTF-8 encoding
    lines: list[str] = []
    append = lines.append
    times: list[_When] | None = None  # made at the first job with a run_at or delay
    # The job the current head and tail were made for: its fields' objects, by identity.
    kind: Any = _UNSET
    queue: Any = _UNSET
    priority: Any = _UNSET
    attempts: Any = _UNSET
    head = tail = ""
    trace = trace_headers if headers else None
    # A usual job's headers: the trace context alone, the same on every line.
    end = ""
    if headers:
        end = "\t" + (_NULL if not trace else _escaped(job_headers_text(None, trace, "jobs") or ""))
    for job_id, job in zip(ids, jobs, strict=True):
        try:
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
                if not _usual(job):
                    times = _append_checked(
                        job, job_id, dumps, max_payload_bytes, lines, times, headers, trace
                    )
                    continue
                kind, queue = job.kind, job.queue
                priority, attempts = job.priority, job.max_attempts
                head = f"\t{queue}\t{kind}\t"
                tail = f"\tpending\t{priority}\t{attempts}{end}"
            payload: Any
            try:
                payload = (
                    join(encoder(job.payload, 0)) if encoder is not None else dumps(job.payload)
                )
            except (TypeError, ValueError, RecursionError):
                payload = None  # check_job says what is wrong with it
            if type(payload) is not str or len(payload) > fits:  # check_job says what is wrong
                times = _append_checked(
                    job, job_id, dumps, max_payload_bytes, lines, times, headers, trace
                )
                continue
            if (  # `may_be_unstorable_utf8`, inline (the whole stream's encoding is checked)
                "\\u" in payload
                or (raw and "\x00" in payload)
                or (
                    len(payload) > DEEP_TEXT and payload.count("[") + payload.count("{") > MAX_DEPTH
                )
            ):  # raises if it holds what jsonb refuses; often it does not (many brackets, say)
                refuse_unstorable(payload, job.payload, f"job kind {job.kind!r}")
            if encoder is None:
                payload = _escaped(payload)  # another dumps may write tabs and newlines
            elif "\\" in payload:  # compact JSON escapes the others itself
                payload = payload.replace("\\", "\\\\")
            append(f"{job_id}{head}{payload}{tail}")
            if times is not None:
                times.append(_NO_WHEN)
        except (InvalidArgument, InvalidArgumentType) as exc:
            # Same class (PayloadTooLarge, PayloadNotSerializable, …), with the job's index
            # (one line per job so far).
            raise type(exc)(f"jobs[{len(lines)}]: {exc}") from exc
        except UnicodeEncodeError as exc:  # check_job measured a payload with a lone surrogate
            raise PayloadNotSerializable(_not_utf8_text(len(lines), "payload", exc)) from exc
    text = "\n".join(lines) + "\n"
    try:
        body = text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: psycopg would fail mid-COPY
        raise _not_utf8(text, exc, jobs, dumps, max_payload_bytes) from exc
    columns = _COLUMNS + (_HEADERS_COLUMN if headers else "")
    if timed or times is not None:
        columns += _TIME_COLUMNS
    return CopyPlan(
        f"COPY {quote_table} ({columns}) FROM STDIN",
        lines,
        timed or times is not None,
        times,
        None if timed or times is not None else body,
    )


def _append_checked(
    job: object,
    job_id: str,
    dumps: Dumps,
    max_payload_bytes: int,
    lines: list[str],
    times: list[_When] | None,
    headers: bool = False,
    trace: Mapping[str, str] | None = None,
) -> list[_When] | None:
    """Check ``job`` as `enqueue_jobs` does, append its line; returns ``times``."""
    if not isinstance(job, NewJob):
        raise InvalidArgumentType(f"must be a NewJob, got {type(job).__name__}")
    checked = check_job(
        job, dumps=dumps, max_payload_bytes=max_payload_bytes, job_id=_NO_ID, trace_headers=trace
    )
    if checked.unique is not None:
        raise InvalidArgument(
            "is unique (Unique): COPY cannot skip a job whose unique key is held (no ON "
            "CONFLICT); enqueue unique jobs with enqueue_many, which also tells which ones "
            "were inserted"
        )
    if checked.deduplication_key is not None:
        raise InvalidArgument(
            f"has deduplication_key {checked.deduplication_key!r}: COPY cannot skip a key "
            "already taken (no ON CONFLICT); enqueue deduplicated jobs with enqueue_many, "
            "which also tells which ones were inserted"
        )
    if checked.lock_key is not None:
        raise InvalidArgument(
            f"has lock_key {checked.lock_key!r}: COPY does not take serial jobs; enqueue "
            "them with enqueue_many"
        )
    if not headers and job.headers is not None:
        raise InvalidArgument(
            "has headers, but the job table has no headers column: add it with a migration "
            "(alembic revision --autogenerate, see docs/upgrading.md)"
        )
    line = (
        f"{job_id}\t{_escaped(checked.queue)}\t{_escaped(checked.kind)}\t"
        f"{_escaped(checked.payload)}\tpending\t{int(checked.priority)}\t"
        f"{int(checked.max_attempts)}"
    )
    if headers:
        line += "\t" + (_NULL if checked.headers is None else _escaped(checked.headers))
    lines.append(line)
    if times is None and (checked.run_at is not None or checked.delay is not None):
        times = [_NO_WHEN] * (len(lines) - 1)
    if times is not None:
        times.append((checked.run_at, checked.delay))
    return times


def _not_utf8(
    text: str, exc: UnicodeEncodeError, jobs: list[NewJob], dumps: Dumps, max_payload_bytes: int
) -> InvalidArgument | InvalidArgumentType:
    """The error for a field UTF-8 cannot encode, naming its job's index and field (and,
    as `check_job` says it, the path of the bad value in a payload)."""
    line_start = text.rfind("\n", 0, exc.start) + 1
    index = text.count("\n", 0, line_start)
    try:
        check_job(jobs[index], dumps=dumps, max_payload_bytes=max_payload_bytes, job_id=_NO_ID)
    except (InvalidArgument, InvalidArgumentType) as checked:
        return type(checked)(f"jobs[{index}]: {checked}")
    field = _FIELDS[min(text.count("\t", line_start, exc.start), len(_FIELDS) - 1)]
    what = _not_utf8_text(index, field, exc)
    return PayloadNotSerializable(what) if field == "payload" else InvalidArgument(what)


def _not_utf8_text(index: int, field: str, exc: UnicodeEncodeError) -> str:
    return f"jobs[{index}]: {field} is not valid UTF-8 text ({exc.reason})"


def _check_driver(dialect: Any) -> None:
    if dialect.name != "postgresql" or dialect.driver not in ("psycopg", "psycopg_async"):
        raise InvalidArgument(
            "enqueue_copy needs PostgreSQL through psycopg 3 (a postgresql+psycopg:// URL), "
            f"got {dialect.name}+{dialect.driver}"
        )


def _plan(dialect: Any, ops: JobOps, jobs: Iterable[NewJob]) -> CopyPlan:
    """`plan_copy` for ``ops``' table, options and the current trace context."""
    _check_driver(dialect)
    return plan_copy(
        jobs,
        clock=ops.clock,
        dumps=ops.dumps,
        max_payload_bytes=ops.max_payload_bytes,
        quote_table=dialect.identifier_preparer.format_table(ops.table),
        headers=ops.has_headers,
        trace_headers=current_trace_headers(),
    )


def copy_jobs_sync(conn: SyncConn, ops: JobOps, jobs: Iterable[NewJob]) -> int:
    """Check ``jobs``, then COPY them into ``ops``' table in the transaction of ``conn``;
    returns rows written."""
    table, clock = ops.table, ops.clock
    if isinstance(conn, Session):
        connection = conn.connection(bind_arguments={"clause": table})
    elif isinstance(conn, Connection):
        connection = conn
    else:
        raise InvalidArgumentType(
            f"conn must be a Connection or Session, got {type(conn).__name__}"
        )
    plan = _plan(connection.dialect, ops, jobs)
    if not connection.in_transaction():
        connection.begin()  # what execute() would do: the caller commits or rolls back
    now = connection.execute(select(now_of(clock))).scalar_one() if plan.needs_now else None
    data = plan.data(now)
    driver = connection.connection.driver_connection
    assert driver is not None
    with driver.cursor() as cursor:
        with cursor.copy(plan.sql) as copy:
            copy.write(data)
        return int(cursor.rowcount)


async def copy_jobs_async(conn: AsyncConn, ops: JobOps, jobs: Iterable[NewJob]) -> int:
    """`copy_jobs_sync` on an `AsyncConnection` / `AsyncSession`."""
    table, clock = ops.table, ops.clock
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(conn, AsyncSession):
        connection = await conn.connection(bind_arguments={"clause": table})
    elif isinstance(conn, AsyncConnection):
        connection = conn
    else:
        raise InvalidArgumentType(
            f"conn must be an AsyncConnection or AsyncSession, got {type(conn).__name__}"
        )
    plan = _plan(connection.dialect, ops, jobs)
    if not connection.in_transaction():
        await connection.begin()
    now = None
    if plan.needs_now:
        now = (await connection.execute(select(now_of(clock)))).scalar_one()
    data = plan.data(now)
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None
    async with driver.cursor() as cursor:
        async with cursor.copy(plan.sql) as copy:
            await copy.write(data)
        return int(cursor.rowcount)
