"""`JobOps`: the job queue's operations, each a generator over statements.

Each operation is written once, as a generator that yields statements and receives their
results (the sans-I/O style of psycopg 3), and turns rows into typed results; `run` drives
it on a sync Connection/Session and `arun` on an AsyncConnection/AsyncSession. None of them
commits: the caller owns the transaction (given an Engine, `JobQueue.enqueue` is one
autocommit INSERT: ``run(engine, op, autocommit=True)``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from sqlalchemy import Engine, Executable, Table

from .. import statements as st
from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import LeaseLost
from .._json import fast_compact_json
from .._tracing import current_trace_headers
from .._validation import count, name_filter
from ..schema import JobStatus, resolve_table
from ..statements._common import Dumps, id_token_pairs
from ..statements._job_cancel import job_ids
from ..statements._job_claim import COMPLETION_IDS, COMPLETION_TOKENS
from ..statements._job_enqueue import (
    has_headers,
    has_lock_key,
    job_template_values,
    no_headers_column,
    no_lock_key_column,
)
from ..statements._job_unique import refuse_unique_on
from ._cursor import NOT_RUN, DriverInsert
from ._drive import BoundOp, BoundStep, Op, Step, SyncConn
from ._params import ClaimParams
from ._results import (
    BatchResult,
    CancelResult,
    ClaimedJob,
    EnqueueResult,
    JobResult,
    ReclaimedJob,
    RetriedJobs,
    RetryResult,
)

__all__ = ["JobOps"]

Pair: TypeAlias = tuple[uuid.UUID, uuid.UUID]

T = TypeVar("T")
#: What `enqueue_many` says of a job whose deduplication key was taken (immutable: shared).
_NOT_INSERTED = EnqueueResult(id=None, inserted=False)
#: The parameter a unique job's values hold (`st.UNIQUE_ENQUEUE_PARAMETERS`).
_UNIQUE = "job_unique_digest"
_NO_OPTIONS: Mapping[str, Any] = {}


def _claim_order(job: ClaimedJob) -> tuple[int, dt.datetime, uuid.UUID]:
    return (-job.priority, job.run_at, job.id)


def _cached(
    cache: dict[ClaimParams, Executable],
    params: ClaimParams | None,
    build: Callable[[], Executable],
) -> Executable:
    """The statement ``build`` makes for ``params``, built once per distinct parameters
    (``None``: not cacheable, built afresh)."""
    if params is None:
        return build()
    try:
        stmt = cache.get(params)
    except TypeError:  # an unhashable option: let the builder say what is wrong with it
        return build()
    if stmt is None:
        stmt = build()
        if len(cache) < 64:
            cache[params] = stmt
    return stmt


def _batch(pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], done_rows: Iterable[Any]) -> BatchResult:
    # Rows come back as (id, token): the same id may appear under an old and a new token.
    done = {(row[0], row[1]) for row in done_rows}
    return BatchResult(
        done=[i for i, token in pairs if (i, token) in done],
        lost=[i for i, token in pairs if (i, token) not in done],
    )


def _payload_options(dumps: Dumps | None, max_payload_bytes: int) -> tuple[Dumps, int]:
    limit = count(max_payload_bytes, "max_payload_bytes", maximum=256 << 20)
    # fast_compact_json: compact_json's text and errors, without its per-call encoder setup.
    return dumps or fast_compact_json, limit


class JobOps:
    """The job queue's operations, each written once as a generator over statements.

    What `sa_outbox.queue.JobQueue`, the worker and its schedule run: each method returns
    an operation (`run` or `arun` drives it on a connection; none commits). The statements
    a worker repeats (its claim, its batched completion, the enqueue) are built once.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> ops = JobOps(Job)
        >>> claim = ops.claim(ClaimParams(worker_id="w1", batch=10))
        >>> next(claim) is next(ops.claim(ClaimParams(worker_id="w1", batch=10)))
        True
    """

    def __init__(
        self,
        model: object,
        *,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        dumps: Dumps | None = None,
        max_payload_bytes: int = st.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.table = resolve_table(model)
        self.has_headers = has_headers(self.table)
        self.has_lock_key = has_lock_key(self.table)
        self.has_unique = st.has_unique_columns(self.table)
        self.clock = clock
        self.backoff = backoff or st.DEFAULT_BACKOFF
        self.dumps, self.max_payload_bytes = _payload_options(dumps, max_payload_bytes)
        self._enqueue: tuple[Executable, dict[str, Any] | None] | None = None
        self._driver_insert: DriverInsert | None = None
        # The same two for unique jobs (a statement of their own, built when first needed).
        self._enqueue_unique: tuple[Executable, dict[str, Any] | None] | None = None
        self._driver_insert_unique: DriverInsert | None = None
        self._claims: dict[ClaimParams, Executable] = {}
        self._locks: dict[tuple[Any, ...], Executable | None] = {}
        self._completion: Executable | None = None
        self._complete_claims: dict[ClaimParams, Executable] = {}
        self._complete_claims_results: dict[ClaimParams, Executable] = {}

    def job_values(self, job: st.NewJob) -> dict[str, Any]:
        """The job's checked values (the payload and headers serialised, the current trace
        context among the headers): bad input raises here."""
        values = job_template_values(
            job,
            trace_headers=current_trace_headers(),
            dumps=self.dumps,
            max_payload_bytes=self.max_payload_bytes,
        )
        if values["job_headers"] is not None and not self.has_headers:
            if job.headers is not None:
                raise no_headers_column(self.table)
            values["job_headers"] = None  # a table not migrated yet: the trace is dropped
        if values["job_lock_key"] is not None and not self.has_lock_key:
            raise no_lock_key_column(self.table)
        if _UNIQUE in values:
            refuse_unique_on(self.table)
        return values

    def enqueue_values(
        self, kind: str, payload: Any, options: Mapping[str, Any] = _NO_OPTIONS
    ) -> dict[str, Any]:
        """`job_values` of ``NewJob(kind, payload, **options)``, for a caller holding keywords
        (the library itself passes a `NewJob`)."""
        return self.job_values(st.NewJob(kind, payload, **options))

    def enqueue_on_cursor(self, conn: SyncConn | Engine, values: dict[str, Any]) -> Any:
        """The enqueue on the driver's cursor (`DriverInsert`): an `EnqueueResult`, or
        `NOT_RUN` when it stepped aside (or a FakeClock's time must be bound)."""
        if self.clock is not None:
            return NOT_RUN
        table = self.table
        if _UNIQUE in values:
            if self._driver_insert_unique is None:
                self._driver_insert_unique = DriverInsert(
                    lambda: st.enqueue_job_template(table, unique=True)
                )
            insert = self._driver_insert_unique
        else:
            if self._driver_insert is None:
                self._driver_insert = DriverInsert(lambda: st.enqueue_job_template(table))
            insert = self._driver_insert
        row = insert.run(conn, values)
        if row is NOT_RUN:
            return NOT_RUN
        return EnqueueResult(id=row[0] if row else None, inserted=row is not None)

    def enqueue(self, values: dict[str, Any]) -> BoundOp[EnqueueResult]:
        # One statement built once per queue, run with these values: no statement is built
        # or compiled per job.
        row = (yield self._enqueue_step(values)).first()
        return EnqueueResult(id=row[0] if row else None, inserted=row is not None)

    def _enqueue_step(self, values: dict[str, Any]) -> Step | BoundStep:
        unique = _UNIQUE in values
        if self.clock is not None:  # a FakeClock's time is a bound value: built afresh
            return st.enqueue_job_template(self.table, clock=self.clock, unique=unique), values
        built = self._enqueue_unique if unique else self._enqueue
        if built is None:
            core = st.enqueue_job_template(self.table, unique=unique)
            if core._generate_cache_key() is None:
                # SQLAlchemy 2.0: its INSERT … ON CONFLICT has no cache key, so it would be
                # compiled at every execution; its text (compiled here, once) is cached. A
                # Session finds the engine of the text's table through the Core statement.
                built = st.precompiled(core), {"clause": core}
            else:
                built = core, None
            if unique:
                self._enqueue_unique = built
            else:
                self._enqueue = built
        stmt, bind_arguments = built
        return (stmt, values) if bind_arguments is None else (stmt, values, bind_arguments)

    def enqueue_many(
        self, jobs: Iterable[st.NewJob], *, trace: bool = True
    ) -> Op[list[EnqueueResult]]:
        """``trace=False``: the current trace context is not the jobs' (periodic jobs, and
        follow-up jobs, which took theirs when the handler enqueued them)."""
        stmt, ids = st.enqueue_jobs(
            self.table,
            jobs,
            trace_headers=current_trace_headers() if trace else None,
            clock=self.clock,
            dumps=self.dumps,
            max_payload_bytes=self.max_payload_bytes,
        )
        returned = (yield stmt).scalars().all()
        if len(returned) == len(ids):  # the returned ids are some of ids: here, all of them
            return [EnqueueResult(id=i, inserted=True) for i in ids]
        inserted = set(returned)
        return [EnqueueResult(id=i, inserted=True) if i in inserted else _NOT_INSERTED for i in ids]

    def claim(self, params: ClaimParams) -> Op[list[ClaimedJob]]:
        lock = self._limits_lock(params)
        if lock is not None:
            yield lock
        rows = (yield self._claim_statement(params)).all()
        # The claim returns ClaimedJob's fields in their order (st.claim_jobs' RETURNING).
        jobs = [ClaimedJob(*row) for row in rows]
        # RETURNING has no order of its own: hand jobs out in the claim's order.
        jobs.sort(key=_claim_order)
        return jobs

    def _limits_lock(self, params: ClaimParams) -> Executable | None:
        """`st.lock_claim_limits` for the limits this claim touches (``None``: none), built
        once per limits, queues and kinds (a worker claims with the same ones every time)."""
        limits = params.limits
        if limits is None:
            return None
        key = (limits, params.queues, params.kinds)
        if key not in self._locks:
            applied = limits.applying(
                name_filter(params.queues, "queues"), name_filter(params.kinds, "kinds")
            )
            self._locks[key] = (
                None if applied is None else st.lock_claim_limits(self.table, applied)
            )
        return self._locks[key]

    def _claim_statement(self, params: ClaimParams) -> Executable:
        # A worker claims with the same parameters again and again: with the database's
        # clock the statement holds no value that changes, so it is built (~0.4 ms) and its
        # cache key computed (~0.5 ms) once, not at every claim. A FakeClock's time is a
        # bound value: those statements are built afresh.
        return _cached(
            self._claims,
            None if self.clock is not None else params,
            lambda: st.claim_jobs(
                self.table,
                worker_id=params.worker_id,
                batch=params.batch,
                lease=params.lease,
                queues=params.queues,
                kinds=params.kinds,
                paused=params.paused,
                limits=params.limits,
                clock=self.clock,
            ),
        )

    def complete_and_claim(
        self,
        pairs: Sequence[Pair],
        params: ClaimParams,
        *,
        steps: Table | None = None,
        results: Sequence[tuple[uuid.UUID, str]] = (),
    ) -> Op[tuple[set[Pair], list[ClaimedJob]]]:
        """The batched completion and a claim in one statement (`st.complete_and_claim_jobs`;
        ``params`` without ``limits``); returns the (id, token) pairs completed and the jobs
        claimed, in the claim's order. Given ``steps``, the same statement records
        ``results`` (job id, JSON text) of the jobs it completed and announces them to the
        waiters for results."""
        stmt = _cached(
            self._complete_claims if steps is None else self._complete_claims_results,
            None if self.clock is not None else params,
            lambda: st.complete_and_claim_jobs(
                self.table,
                pairs,
                worker_id=params.worker_id,
                batch=params.batch,
                lease=params.lease,
                queues=params.queues,
                kinds=params.kinds,
                paused=params.paused,
                clock=self.clock,
                steps=steps,
            ),
        )
        ids, tokens = id_token_pairs(pairs, "completion pairs")
        values: dict[str, Any] = {COMPLETION_IDS: ids, COMPLETION_TOKENS: tokens}
        if steps is not None:
            values[st.RESULT_IDS] = [job_id for job_id, _ in results]
            values[st.RESULT_TEXTS] = [text for _, text in results]
        rows = (yield stmt, values).all()
        done: set[Pair] = set()
        jobs: list[ClaimedJob] = []
        for row in rows:
            if row[14]:  # acked: (id, token) of a completed pair
                done.add((row[0], row[9]))
            else:
                jobs.append(ClaimedJob(*row[:14]))
        jobs.sort(key=_claim_order)
        return done, jobs

    def heartbeat(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        lease: dt.timedelta | float,
        worker_id: str | None = None,
    ) -> Op[dt.datetime]:
        stmt = st.heartbeat_job(
            self.table, job_id, token, lease=lease, worker_id=worker_id, clock=self.clock
        )
        row = (yield stmt).first()
        if row is None:
            raise LeaseLost("job", job_id, token, action="heartbeat")
        return row[1]  # type: ignore[no-any-return]

    def heartbeat_many(
        self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], lease: dt.timedelta | float
    ) -> Op[BatchResult]:
        stmt = st.heartbeat_jobs(self.table, pairs, lease=lease, clock=self.clock)
        return _batch(pairs, (yield stmt))

    def complete(self, job_id: uuid.UUID, token: uuid.UUID) -> Op[None]:
        if (yield st.complete_job(self.table, job_id, token, clock=self.clock)).first() is None:
            raise LeaseLost("job", job_id, token, action="complete")

    def complete_many(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Op[BatchResult]:
        return _batch(pairs, (yield self._completion_step(pairs)))

    def complete_rows(
        self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]
    ) -> Op[set[tuple[uuid.UUID, uuid.UUID]]]:
        """The batched completion; returns the (id, token) pairs it completed."""
        return {(row[0], row[1]) for row in (yield self._completion_step(pairs))}

    def _completion_step(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Step:
        # Built (~0.5 ms) and keyed for SQLAlchemy's compiled cache once, then run again
        # with the new pairs as parameters. A FakeClock's time is a bound value: those
        # statements are built afresh.
        if self.clock is not None or self._completion is None:
            stmt = st.complete_jobs(self.table, pairs, clock=self.clock)
            if self.clock is None:
                self._completion = stmt
            return stmt
        ids, tokens = id_token_pairs(pairs, "completion pairs")
        return self._completion, {COMPLETION_IDS: ids, COMPLETION_TOKENS: tokens}

    def retry(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        error: str | None,
        delay: dt.timedelta | float | None,
    ) -> Op[RetryResult]:
        stmt = st.retry_job(
            self.table,
            job_id,
            token,
            error=error,
            delay=delay,
            backoff=self.backoff,
            clock=self.clock,
        )
        row = (yield stmt).first()
        if row is None:
            raise LeaseLost("job", job_id, token, action="retry")
        status = JobStatus(row[1])
        return RetryResult(row[0], status, row[2] if status is JobStatus.PENDING else None)

    def fail(self, job_id: uuid.UUID, token: uuid.UUID, error: str | None) -> Op[None]:
        stmt = st.fail_job(self.table, job_id, token, error=error, clock=self.clock)
        if (yield stmt).first() is None:
            raise LeaseLost("job", job_id, token, action="fail")

    def snooze(
        self, job_id: uuid.UUID, token: uuid.UUID, delay: dt.timedelta | float
    ) -> Op[dt.datetime]:
        stmt = st.snooze_job(self.table, job_id, token, delay=delay, clock=self.clock)
        row = (yield stmt).first()
        if row is None:
            raise LeaseLost("job", job_id, token, action="snooze")
        return row[1]  # type: ignore[no-any-return]

    def cancel(self, ids: object, *, notify_done: bool = False) -> Op[CancelResult]:
        """Cancel jobs (`st.cancel_jobs`); ``notify_done``: announce the ones cancelled (now
        finished, running or not) to the waiters for results (`notify_done`)."""
        wanted = job_ids([ids] if isinstance(ids, uuid.UUID | str) else ids)
        changed = {
            row[0]: JobStatus(row[1])
            for row in (yield st.cancel_jobs(self.table, wanted, clock=self.clock))
        }
        if notify_done and changed:
            yield from self.notify_done(list(changed))
        rest = [i for i in wanted if i not in changed]
        found = set()
        if rest:
            found = {row[0] for row in (yield st.job_statuses(self.table, rest))}
        return CancelResult(
            cancelled=[i for i in wanted if changed.get(i) is JobStatus.PENDING],
            cancelling=[i for i in wanted if changed.get(i) is JobStatus.RUNNING],
            finished=[i for i in rest if i in found],
            unknown=[i for i in rest if i not in found],
        )

    def send_signal(self, steps: Table, job_id: uuid.UUID, name: str, payload: Any) -> Op[bool]:
        """Signal ``name`` to a job (`st.send_job_signal`); a job it woke is notified at
        commit. True when it was recorded."""
        what = f"signal {name!r} to job {job_id}"
        text = st.serialise(payload, what, self.dumps, self.max_payload_bytes)
        # The row lock first: a wait that holds it (JobContext.receive_signal) has either
        # seen this signal or, once it commits, is asleep where the next statement wakes it.
        yield st.lock_job(self.table, job_id)
        stmt = st.send_job_signal(self.table, steps, job_id, name, text, clock=self.clock)
        sent, woken = (yield stmt).one()
        if woken:
            yield st.notify_jobs(self.table)
        return bool(sent)

    def record_results(self, steps: Table, rows: Sequence[tuple[uuid.UUID, str]]) -> Op[None]:
        """Record the results (JSON text) of jobs completed in this transaction."""
        yield st.record_job_results(steps, rows)

    def notify_done(self, ids: Sequence[uuid.UUID]) -> Op[None]:
        """Tell the waiters on the done channel that these jobs finished (at commit)."""
        yield st.notify_jobs_done(self.table, ids)

    def done_channel(self) -> Op[str | None]:
        """The channel finished jobs are announced on; ``None`` when the table is missing."""
        return (yield st.job_done_channel_of(self.table)).scalar()  # type: ignore[no-any-return]

    def results(
        self, steps: Table, ids: Sequence[uuid.UUID], *, dependencies: Table | None = None
    ) -> Op[dict[uuid.UUID, JobResult]]:
        """The state and result of each of these jobs that exists, by id; given the
        ``dependencies`` table, a job still waiting there is ``pending`` and ``waiting``."""
        found = {}
        for job_id, status, error, value, recorded in (
            yield st.select_job_results(self.table, steps, ids)
        ):
            status = JobStatus(status)
            if status is not JobStatus.SUCCEEDED or not recorded:
                value = None
            found[job_id] = JobResult(job_id, status, value, error)
        missing = [job_id for job_id in ids if job_id not in found]
        if missing and dependencies is not None:
            for (job_id,) in (yield st.select_waiting(dependencies, missing)):
                found[job_id] = JobResult(job_id, JobStatus.PENDING, None, None, waiting=True)
        return found

    def held_cancelled(self, pairs: Sequence[Pair]) -> Op[set[Pair]]:
        """Which of these held (id, token) pairs were cancelled while running."""
        return {(row[0], row[1]) for row in (yield st.held_cancelled_jobs(self.table, pairs))}

    def finish_cancelled(self, pairs: Sequence[Pair]) -> Op[set[Pair]]:
        """End the cancellation of these pairs (clear their lease); returns those ended."""
        stmt = st.finish_cancelled_jobs(self.table, pairs, clock=self.clock)
        return {(row[0], row[1]) for row in (yield stmt)}

    def release_many(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Op[BatchResult]:
        rows = (yield st.release_jobs(self.table, pairs, clock=self.clock)).all()
        if rows:  # released jobs are ready now: wake the workers that listen
            yield st.notify_jobs(self.table, {row[2] for row in rows})
        return _batch(pairs, rows)

    def notify_channel(self) -> Op[str | None]:
        return (yield st.job_notify_channel_of(self.table)).scalar()  # type: ignore[no-any-return]

    def reclaim(self, limit: int, *, notify_done: bool = False) -> Op[list[ReclaimedJob]]:
        """Reclaim expired leases (`st.reclaim_expired_jobs`); ``notify_done``: announce the
        jobs that ended ``failed`` at max_attempts to the waiters for results."""
        stmt = st.reclaim_expired_jobs(
            self.table, backoff=self.backoff, limit=limit, clock=self.clock
        )
        reclaimed = [ReclaimedJob(r[0], JobStatus(r[1]), r[2], r[3]) for r in (yield stmt)]
        failed = [job.id for job in reclaimed if job.status is JobStatus.FAILED]
        if notify_done and failed:
            yield from self.notify_done(failed)
        return reclaimed

    def requeue_failed(
        self,
        ids: Sequence[uuid.UUID] | None,
        kinds: str | Sequence[str] | None,
        queues: str | Sequence[str] | None,
        reset_attempts: bool,
    ) -> Op[RetriedJobs]:
        stmt = st.requeue_failed_jobs(
            self.table,
            ids=ids,
            kinds=kinds,
            queues=queues,
            reset_attempts=reset_attempts,
            clock=self.clock,
        )
        retried = [row[0] for row in (yield stmt)]
        skipped: dict[uuid.UUID, uuid.UUID] = {}
        if self.has_unique:  # which failed unique jobs it skipped: their key is held
            held = st.select_unique_held_failed_jobs(
                self.table, ids=ids, kinds=kinds, queues=queues
            )
            skipped = {row[0]: row[1] for row in (yield held)}
        return RetriedJobs(retried, skipped)

    def prune(
        self, older_than: dt.timedelta | float, statuses: Iterable[JobStatus | str], batch: int
    ) -> Op[int]:
        stmt = st.prune_jobs(
            self.table, older_than=older_than, statuses=statuses, batch=batch, clock=self.clock
        )
        return (yield stmt).rowcount  # type: ignore[no-any-return]

    def counts(self) -> Op[dict[JobStatus, int]]:
        found = {JobStatus(s): n for s, n in (yield st.count_jobs_by_status(self.table))}
        return {s: found.get(s, 0) for s in JobStatus}
