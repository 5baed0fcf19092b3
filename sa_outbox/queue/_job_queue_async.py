"""`AsyncJobQueue`: the job operations on the caller's connection or session, on asyncio.
`JobQueue` (``_job_queue_sync.py``) is generated from this file.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import statements as st
from .._exceptions import InvalidArgument
from .._validation import as_uuid
from ..ops import ClaimParams, arun, check_parents
from ..ops._results import (
    Batch,
    BatchResult,
    CancelResult,
    ClaimedJob,
    EnqueueResult,
    JobResult,
    ReclaimedJob,
    RetriedJobs,
    RetryResult,
    WorkflowRetry,
)
from ..schema import JobStatus
from ._copy import copy_jobs_async
from ._job_queue import FINISHED, JobQueueBase, Pairs, aenqueue_on, ain_transaction

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..ops import AsyncConn

__all__ = ["AsyncJobQueue"]


class AsyncJobQueue(JobQueueBase):
    """The job queue on the caller's `AsyncConnection` or `AsyncSession`, in its transaction.

    Every fenced write (``complete``, ``retry``, ``fail``, ``heartbeat``) raises `LeaseLost`
    when the job is no longer running under the given token, and leaves the row untouched.
    `enqueue` also takes the `AsyncEngine` itself: then the job is one autocommit ``INSERT``.
    Given ``steps=`` (the `JobStepMixin` table of durable steps), `send_signal` signals jobs
    that wait for one.

    Examples:
        queue = AsyncJobQueue(Job)
        async with async_engine.begin() as conn:
            await queue.enqueue(conn, "send-email", {"to": "ana@example.com"})
        await queue.enqueue(async_engine, "send-email", {"to": "bob@example.com"})  # autocommit
        async with async_engine.begin() as conn:
            jobs = await queue.claim(conn, worker_id="w1", batch=20)
        # … run the jobs outside any transaction, then:
        async with async_engine.begin() as conn:
            await queue.complete_many(conn, [(j.id, j.lease_token) for j in jobs])
    """

    async def enqueue(
        self,
        conn: AsyncConn | AsyncEngine,
        kind: str,
        payload: Any,
        *,
        queue: str = st.DEFAULT_QUEUE,
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = st.DEFAULT_MAX_ATTEMPTS,
        deduplication_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        lock_key: str | None = None,
        unique: st.Unique | None = None,
        after: Sequence[uuid.UUID] | None = None,
        on_failure: str = "cancel",
    ) -> EnqueueResult:
        """Add one job; ``inserted`` is False when its deduplication key is already taken (or,
        for a ``unique`` job, its unique key: `Unique`, docs/unique.md).

        ``after`` (job ids) makes it wait for those jobs: it runs once they have all
        succeeded (see `enqueue_after`).

        On a connection or session the job joins the caller's transaction and commits with
        it. Given the `AsyncEngine` itself, it is one autocommit ``INSERT``: one round trip,
        committed when this returns (for a producer with no transaction of its own).

        ``headers`` (str to str, at most `MAX_HEADERS_BYTES` as JSON) travel with the job
        (`JobContext.headers`); with OpenTelemetry installed, the current trace context joins
        them, so the worker's span of the job continues the caller's trace (docs/tracing.md).

        ``lock_key`` makes it a serial job: the jobs sharing a key run one at a time, in the
        order they were committed (docs/concurrency.md).

        Examples:
            result = await queue.enqueue(conn, "index-book", {"book_id": 7},
                                         deduplication_key="index-book:7")
            result.inserted
            # -> True
            await queue.enqueue(async_engine, "index-book", {"book_id": 8})  # committed already
        """
        job = st.NewJob(
            kind,
            payload,
            queue,
            priority,
            run_at,
            delay,
            max_attempts,
            deduplication_key,
            headers,
            lock_key,
            unique,
        )
        if after is not None:
            return await self.enqueue_after(conn, job, after, on_failure=on_failure)
        return await self.enqueue_one(conn, job)

    async def enqueue_after(
        self,
        conn: AsyncConn | AsyncEngine,
        job: st.NewJob,
        after: Sequence[uuid.UUID],
        *,
        on_failure: str = "cancel",
    ) -> EnqueueResult:
        """Add a job that waits for the jobs ``after`` names, in the caller's transaction.

        It waits in the dependencies table, where no claim meets it, and goes into the job
        table when the last of them has succeeded. When one fails or is cancelled,
        ``on_failure`` decides: ``"cancel"`` (it is ``cancelled``, and so are the jobs that
        wait for it), ``"fail"`` (it is ``failed``), ``"run"`` (it runs once all of them
        have finished). The jobs waited for may be new in this transaction, pending,
        running, waiting themselves, or finished (then it is decided at once). They are
        locked ``FOR SHARE`` until the caller's transaction ends. Needs
        ``AsyncJobQueue(Job, dependencies=JobDependency)``; a dependant may have no
        ``deduplication_key`` nor ``unique``. See docs/workflows.md.

        Examples:
            async with async_engine.begin() as conn:
                a = (await queue.enqueue(conn, "reserve", {"order": 7})).id
                b = (await queue.enqueue(conn, "charge", {"order": 7}, after=[a])).id
                await queue.enqueue_after(conn, NewJob("ship", {"order": 7}), [b])
        """
        deps = self._dependency_ops("enqueue with after=")
        parents = check_parents(after)
        policy = st.check_on_failure(on_failure)
        session = ain_transaction(conn, "enqueue with after=")
        return await arun(session, deps.enqueue(self._ops.job_values(job), parents, policy))

    async def enqueue_one(self, conn: AsyncConn | AsyncEngine, job: st.NewJob) -> EnqueueResult:
        """`enqueue` for a job given as a `NewJob`.

        Examples:
            result = await queue.enqueue_one(conn, NewJob("index-book", {"book_id": 7}, priority=5))
            result.inserted
            # -> True
        """
        return await aenqueue_on(conn, self._ops, self._ops.job_values(job))

    async def enqueue_many(self, conn: AsyncConn, jobs: Iterable[st.NewJob]) -> list[EnqueueResult]:
        """Add many jobs in one statement; results come in input order.

        Each `NewJob` may have ``headers`` of its own; the current trace context (with
        OpenTelemetry installed) joins them, under them. Unique jobs (``NewJob(...,
        unique=Unique(...))``) and ordinary ones mix in one batch; a unique job whose key is
        held, by an earlier job or one earlier in the batch, comes back ``inserted=False``.

        Examples:
            await queue.enqueue_many(conn, [NewJob("a", {}), NewJob("b", {})])
        """
        return await arun(conn, self._ops.enqueue_many(jobs))

    async def enqueue_batch(
        self, conn: AsyncConn | AsyncEngine, jobs: Iterable[st.NewJob], callback: st.NewJob
    ) -> Batch:
        """Add ``jobs`` and a ``callback`` job that runs once, when the last of them has
        finished (succeeded, failed or been cancelled), in the caller's transaction.

        The callback is a job that waits for the batch's jobs (`enqueue_after`, with
        ``on_failure="run"``): released by the worker that finishes the last one, across
        workers, crashes and retries (a job retried is not finished yet). Its handler reads
        what became of each (`JobContext.parent_statuses`) and what they returned
        (`JobContext.parent_results`). More jobs may join while it waits (`add_to_batch`).
        A job whose deduplication key was taken is not inserted, and not in the batch.
        Needs ``AsyncJobQueue(Job, dependencies=JobDependency)``.

        Examples:
            async with async_engine.begin() as conn:
                batch = await queue.enqueue_batch(
                    conn,
                    [NewJob("resize", {"photo": p}) for p in photos],
                    callback=NewJob("album-ready", {"album": 7}),
                )
            batch.id, len(batch.jobs)
        """
        deps = self._dependency_ops("enqueue_batch")
        session = ain_transaction(conn, "enqueue_batch")
        values = self._ops.job_values(callback)  # a bad callback is refused before any row
        listed = list(jobs)
        if not listed:
            raise InvalidArgument("a batch needs at least one job")
        added = await self.enqueue_many(session, listed)
        members = [result.id for result in added if result.id is not None]
        if not members:
            raise InvalidArgument("a batch needs at least one job that was inserted")
        await arun(session, deps.enqueue(values, members, "run"))
        return Batch(id=values["job_id"], jobs=members)

    async def add_to_batch(
        self, conn: AsyncConn | AsyncEngine, batch: uuid.UUID, jobs: Iterable[st.NewJob]
    ) -> list[uuid.UUID]:
        """Add ``jobs`` to a batch whose callback still waits (`enqueue_batch`), in the
        caller's transaction; returns their ids. A batch whose jobs have all finished is
        over: adding to it is refused in one line. The callback's row is locked until the
        caller's transaction ends, so it cannot be released meanwhile.

        Examples:
            async with async_engine.begin() as conn:  # in a batch job's handler, say
                await queue.add_to_batch(conn, batch.id, [NewJob("resize", {"photo": 8})])
        """
        deps = self._dependency_ops("add_to_batch")
        session = ain_transaction(conn, "add_to_batch")
        batch = as_uuid(batch, "batch id")
        await arun(session, deps.lock_batch(batch))
        listed = list(jobs)
        added = await self.enqueue_many(session, listed) if listed else []
        members = [result.id for result in added if result.id is not None]
        await arun(session, deps.add_to_batch(batch, members))
        return members

    async def enqueue_copy(self, conn: AsyncConn, jobs: Iterable[st.NewJob]) -> int:
        """Add many jobs with PostgreSQL's ``COPY``, the fastest path; returns how many.

        For large batches without deduplication keys (a job with one, or a unique job, is
        refused: COPY has no ON CONFLICT; use `enqueue_many`). Every job is checked before
        any row is sent, ids follow input order, nothing commits here, and workers are
        notified once at commit. Needs the psycopg (3) driver. See docs/worker.md,
        "Enqueueing many jobs". As with `enqueue_many`, the current trace context joins
        every job's headers.

        Examples:
            await queue.enqueue_copy(conn, [NewJob("resize", {"image": n}) for n in range(1000)])
            # -> 1000
        """
        return await copy_jobs_async(conn, self._ops, jobs)

    async def claim(
        self,
        conn: AsyncConn,
        *,
        worker_id: str,
        batch: int = 1,
        lease: dt.timedelta | float = st.DEFAULT_LEASE,
        queues: str | Sequence[str] | None = None,
        kinds: str | Sequence[str] | None = None,
        limits: st.ClaimLimits | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to ``batch`` ready jobs (commit right after, then run them).

        ``limits`` (`sa_outbox.statements.ClaimLimits`, e.g. a `JobApp`'s ``limits``): the
        claim first takes the limits' lock (`sa_outbox.statements.lock_claim_limits`), then
        claims no more than they allow; ``conn`` must be in a transaction, committed right
        after, for the lock to serialise the claims.

        Examples:
            jobs = await queue.claim(conn, worker_id="w1", batch=20)
        """
        params = ClaimParams(worker_id, batch, lease, queues, kinds, limits=limits)
        return await arun(conn, self._ops.claim(params))

    async def heartbeat(
        self,
        conn: AsyncConn,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        lease: dt.timedelta | float = st.DEFAULT_LEASE,
        worker_id: str | None = None,
    ) -> dt.datetime:
        """Extend a live lease; returns the new ``lease_until`` or raises `LeaseLost`.

        Examples:
            await queue.heartbeat(conn, job.id, job.lease_token, lease=30)
        """
        return await arun(conn, self._ops.heartbeat(job_id, token, lease, worker_id))

    async def heartbeat_many(
        self, conn: AsyncConn, pairs: Pairs, *, lease: dt.timedelta | float = st.DEFAULT_LEASE
    ) -> BatchResult:
        """Extend many leases in one statement; ``lost`` lists the ones no longer held.

        Examples:
            await queue.heartbeat_many(conn, [(j.id, j.lease_token) for j in jobs])
        """
        return await arun(conn, self._ops.heartbeat_many(pairs, lease))

    async def complete(self, conn: AsyncConn, job_id: uuid.UUID, token: uuid.UUID) -> None:
        """Mark one job ``succeeded``, or raise `LeaseLost`.

        Examples:
            await queue.complete(conn, job.id, job.lease_token)
        """
        await arun(conn, self._ops.complete(job_id, token))

    async def complete_many(self, conn: AsyncConn, pairs: Pairs) -> BatchResult:
        """Mark many jobs ``succeeded`` in one statement; ``lost`` lists those not held.

        Examples:
            await queue.complete_many(conn, [(j.id, j.lease_token) for j in jobs])
        """
        return await arun(conn, self._ops.complete_many(pairs))

    async def retry(
        self,
        conn: AsyncConn,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        error: str | None = None,
        delay: dt.timedelta | float | None = None,
    ) -> RetryResult:
        """Back to ``pending`` after ``delay`` (default: the backoff), or ``failed`` at max.

        Examples:
            result = await queue.retry(conn, job.id, job.lease_token, error="timeout")
            result.status
            # -> <JobStatus.PENDING: 'pending'>
        """
        return await arun(conn, self._ops.retry(job_id, token, error, delay))

    async def fail(
        self, conn: AsyncConn, job_id: uuid.UUID, token: uuid.UUID, *, error: str | None = None
    ) -> None:
        """Mark a job ``failed`` at once (a permanent error), or raise `LeaseLost`.

        Examples:
            await queue.fail(conn, job.id, job.lease_token, error="bad payload")
        """
        await arun(conn, self._ops.fail(job_id, token, error))

    async def release_many(self, conn: AsyncConn, pairs: Pairs) -> BatchResult:
        """Give claimed jobs back to ``pending`` without counting the attempt; fenced.

        For a worker that stops before it ran them: ``attempts`` goes back down, the lease
        is cleared, and listening workers are notified at commit. ``lost`` lists the pairs
        no longer held.

        Examples:
            await queue.release_many(conn, [(j.id, j.lease_token) for j in unstarted])
        """
        return await arun(conn, self._ops.release_many(pairs))

    async def send_signal(
        self, conn: AsyncConn, job_id: uuid.UUID, name: str, payload: Any = None
    ) -> bool:
        """Send signal ``name`` with ``payload`` (JSON) to a job that waits, or will wait, for
        it (`JobContext.receive_signal`), in the caller's transaction: it commits with the
        caller's rows. A job asleep waiting for it is due at once and workers are notified
        at commit; one sent before the job waits is found when it does. Returns False when
        nothing was sent: the job is finished or unknown, or already has this signal (the
        first one stays). It takes the job's row lock first, so that a wait in progress
        either sees the signal or is asleep when it is sent, then woken. Needs
        ``AsyncJobQueue(Job, steps=JobStep)``.

        Examples:
            async with async_engine.begin() as conn:
                await conn.execute(update(Order).values(approved=True).where(Order.id == 7))
                await queue.send_signal(conn, job_id, "approved", {"by": "ana"})
        """
        steps = self._steps_table("send_signal")
        return await arun(conn, self._ops.send_signal(steps, job_id, name, payload))

    async def read_result(self, conn: AsyncConn, job_id: uuid.UUID) -> JobResult | None:
        """Where job ``job_id`` stands and, once it ``succeeded``, what its handler returned
        (`JobResult`), read in the caller's transaction; ``None`` for an unknown id (or a job
        pruned). A worker records a handler's return value (JSON) with the job's completion
        when its `JobApp` has the steps table. Needs ``AsyncJobQueue(Job, steps=JobStep)``;
        to wait for a job to finish, `AsyncJobResults`.

        Examples:
            async with async_engine.connect() as conn:
                found = await queue.read_result(conn, job_id)
            found.status, found.value
            # -> (<JobStatus.SUCCEEDED: 'succeeded'>, {'total': 42})
        """
        steps = self._steps_table("read_result")
        job_id = as_uuid(job_id, "job id")
        deps = None if self._deps is None else self._deps.deps
        found = await arun(conn, self._ops.results(steps, [job_id], dependencies=deps))
        return found.get(job_id)

    async def notify_channel(self, conn: AsyncConn) -> str | None:
        """The channel the table's NOTIFY trigger sends on (``None`` if the table is absent).

        Examples:
            await queue.notify_channel(conn)
            # -> 'public.jobs'
        """
        return await arun(conn, self._ops.notify_channel())

    async def reclaim_expired(self, conn: AsyncConn, *, limit: int = 1000) -> list[ReclaimedJob]:
        """Return up to ``limit`` expired leases to ``pending`` (with backoff) or ``failed``;
        with ``steps=``, the failed ones are announced to the waiters for results.

        Examples:
            await queue.reclaim_expired(conn)
            # -> []
        """
        announce = self._steps is not None
        return await arun(conn, self._ops.reclaim(limit, notify_done=announce))

    async def requeue_failed(
        self,
        conn: AsyncConn,
        *,
        ids: Sequence[uuid.UUID] | None = None,
        kinds: str | Sequence[str] | None = None,
        queues: str | Sequence[str] | None = None,
        reset_attempts: bool = True,
    ) -> RetriedJobs:
        """Send failed jobs back to ``pending`` now; returns their ids.

        A unique job whose key another job holds is left ``failed``: the result's
        ``skipped`` maps it to the job holding its key (`RetriedJobs`, docs/unique.md).

        Examples:
            await queue.requeue_failed(conn, kinds="send-email")
        """
        return await arun(conn, self._ops.requeue_failed(ids, kinds, queues, reset_attempts))

    async def cancel(
        self, conn: AsyncConn, ids: Iterable[uuid.UUID | str] | uuid.UUID | str
    ) -> CancelResult:
        """Cancel jobs by id, in your transaction; returns what became of each id.

        A waiting job (``pending``, due or scheduled, new or to be retried) becomes
        ``cancelled`` and never runs. A running job becomes ``cancelled`` too, and keeps its
        lease token: its worker's heartbeat finds it lost, cancels the handler's token with
        reason `CancelReason.CANCELLED`, and whatever the handler then returns or raises, the
        job stays ``cancelled`` (every result write is fenced by ``status = 'running'``).
        Finished jobs are left alone (`CancelResult.finished`); unknown ids are reported.
        Given ``dependencies=``, a job waiting for others is cancelled too, and the jobs
        that wait for a cancelled job are decided by their ``on_failure``.

        Examples:
            async with async_engine.begin() as conn:
                result = await queue.cancel(conn, [job_id])
            result.cancelled, result.cancelling, result.finished, result.unknown
        """
        announce = self._steps is not None
        if self._deps is not None:  # waiting jobs too, and what waits for the cancelled
            return await arun(conn, self._deps.cancel(self._ops, ids, notify_done=announce))
        return await arun(conn, self._ops.cancel(ids, notify_done=announce))

    async def retry_workflow(self, conn: AsyncConn, job_id: uuid.UUID | str) -> WorkflowRetry:
        """Run again what failed or was cancelled in the workflow of ``job_id`` (any job of
        it), in the caller's transaction (``dependencies=`` needed).

        A failed or cancelled job whose parents all succeeded (or the job that started the
        workflow) goes back to ``pending`` now with all its attempts (``last_error`` kept;
        a unique job only if its key is free, else `WorkflowRetry.skipped`). One whose
        parents did not all succeed waits again, out of the job table, and is decided anew
        when they finish: the dependants cancelled because a parent failed run once it
        succeeds. Jobs that succeeded are never run again; a cancelled job its worker is
        still stopping is left until it has stopped.

        Examples:
            async with async_engine.begin() as conn:
                retry = await queue.retry_workflow(conn, failed_job_id)
            retry.requeued, retry.waiting
        """
        deps = self._dependency_ops("retry_workflow")
        return await arun(conn, deps.retry_workflow(self._ops, as_uuid(job_id, "job id")))

    async def prune(
        self,
        conn: AsyncConn,
        *,
        older_than: dt.timedelta | float,
        statuses: Iterable[JobStatus | str] = FINISHED,
        batch: int = 1000,
    ) -> int:
        """Delete one batch of finished jobs older than ``older_than``; returns how many.

        Examples:
            await queue.prune(conn, older_than=dt.timedelta(days=7))
            # -> 0
        """
        return await arun(conn, self._ops.prune(older_than, statuses, batch))

    async def counts(self, conn: AsyncConn) -> dict[JobStatus, int]:
        """How many jobs are in each status (every status present, zero included).

        Examples:
            counts = await queue.counts(conn)
            counts[JobStatus.PENDING]
            # -> 0
        """
        return await arun(conn, self._ops.counts())
