"""The worker's logic, written once for `Worker` (threads) and `AsyncWorker` (asyncio).

`Core` holds what a worker knows: the jobs it holds (each with its lease and cancel token),
the results waiting to be written, how many handlers are busy. It decides when to claim and
when to write, classifies a handler's exception, expires timeouts, and builds the one
operation that writes a batch of results and claims the next batch in a single transaction
(a generator over statements, driven sync or async like the executors'). It does no I/O and
takes no locks: the sync driver calls it under its lock, the async one from its event loop.

It stays whole because `Core` is one state machine: the held jobs, the queued entries,
the results waiting and the busy counts change together (under the one lock of the sync
driver), and the invariants that tie them read best in one class; the records it passes to
the drivers (`Entry`, `Result`, `Beat`, `Written`) are its vocabulary, kept beside it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Table

from .. import statements as st
from .._exceptions import InvalidArgument, InvalidArgumentType, LeaseLost
from .._tracing import trace_id_of
from ..ops import ClaimParams, DependencyOps, JobOps, Op
from ..queue import BatchResult, ClaimedJob
from ..schema import JobStatus
from ._settings import PREFETCH_BATCHES, PREFETCH_HORIZON, Settings, error_text, log
from ._steps import returned_json
from ._steps_async import AsyncSteps
from ._steps_sync import Steps
from .context import CancelReason, JobContext
from .errors import (
    InvalidPayload,
    JobCancelled,
    JobTimeout,
    PermanentError,
    Slept,
    Snooze,
    UnknownJobKind,
)
from .metrics import JobOutcome, WorkerMetrics
from .registry import HandlerSpec, JobApp

Pair = tuple[uuid.UUID, uuid.UUID]


class Action(enum.Enum):
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    RELEASE = "release"
    SNOOZE = "snooze"
    SLEPT = "slept"  # a snooze the handler wrote itself (a wait for a signal): write nothing
    CANCEL = "cancel"  # cancelled while held: end the cancellation (clear the lease)


@dataclasses.dataclass(eq=False, slots=True)
class Entry:
    """A job this worker holds, from its claim until its result is written."""

    job: ClaimedJob
    context: JobContext
    spec: HandlerSpec | None
    claimed_at: float
    lease_deadline: float
    pair: Pair = dataclasses.field(init=False)  # (id, lease token): the key of its writes
    deadline: float | None = None
    started: float | None = None
    running: bool = False
    queued: bool = False  # claimed ahead, waiting for a free handler
    abandoned: bool = False
    task: Any = None  # the asyncio task running it, for AsyncWorker
    result: str | None = None  # what the handler returned, as JSON, to record (`keep_result`)

    def __post_init__(self) -> None:
        self.pair = (self.job.id, self.job.lease_token)


@dataclasses.dataclass(slots=True)
class Result:
    """What to write for one job."""

    entry: Entry
    action: Action
    error: str | None = None
    delay: dt.timedelta | None = None
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Beat:
    """What one heartbeat found: the renewed and lost leases, and which of the lost jobs
    were cancelled (`JobQueue.cancel`) while this worker held them."""

    result: BatchResult
    cancelled: frozenset[Pair]


@dataclasses.dataclass(slots=True)
class Written:
    """What one write transaction did."""

    outcomes: list[tuple[Result, JobOutcome]]
    claimed: list[ClaimedJob]


class Core:
    """The state and decisions of one worker (see the module documentation)."""

    def __init__(
        self,
        app: JobApp,
        ops: JobOps,
        settings: Settings,
        metrics: WorkerMetrics | None,
        timer: Callable[[], float],
    ) -> None:
        self.app = app
        self.ops = ops
        self.settings = settings
        self.metrics = metrics
        self.timer = timer
        self.in_flight: dict[Pair, Entry] = {}
        self.queued: deque[Entry] = deque()  # claimed ahead of a free handler, in claim order
        self.results: list[Result] = []
        #: The jobs whose results could not be written (`dropped`), for the last log line.
        self.dropped_ids: list[Any] = []
        self.first_result_at: float | None = None
        self.busy = 0
        self.run_time: float | None = None  # moving average of the handlers' run time
        self.notified = True  # claim at once when starting
        self.notifications = 0  # counts wake-ups, so one during a claim is not forgotten
        self.backlog = False
        self.next_poll = timer()
        self.stopping = False
        #: What `JobContext.step` runs on: set by the worker when the app has a steps table.
        self.steps: Steps | AsyncSteps | None = None
        #: The steps table: with it, a handler's return value is recorded with its job's
        #: completion and every finished job is announced to the waiters for results.
        self.results_table: Table | None = app.steps_table
        deps = app.dependencies_table
        #: Jobs that wait for others (``JobApp(dependencies=)``), released after each write
        #: that finished jobs (`release_op`) and by the keeper's sweep (`sweep_op`).
        self.dependencies = (
            None if deps is None else DependencyOps(app.table, deps, clock=ops.clock)
        )
        self.to_release: list[uuid.UUID] = []  # finished jobs whose dependants wait (`note_ended`)
        self.to_release_since: float | None = None
        self.swept_at: float | None = None  # the keeper's last sweep (`sweep_due`)
        limits = app.limits
        #: What this worker's claims ask for (the batch aside: `claim_params_for`).
        self.claim_params = ClaimParams(
            worker_id=settings.worker_id,
            lease=settings.lease,
            queues=settings.queues,
            kinds=settings.kinds,
            limits=limits,
        )
        self._claim_params: dict[int, ClaimParams] = {}
        self._wanted_queues = None if settings.queues is None else frozenset(settings.queues)
        #: Whether this worker's claims touch a limited kind or queue (`JobApp.limit`).
        self.limited = limits is not None and (
            limits.applying(settings.queues, settings.kinds) is not None
        )

    def skip_paused(self, pauses: Table) -> None:
        """Claim around the queues paused in ``pauses`` (a `QueuePauseMixin` table)."""
        self.claim_params = dataclasses.replace(self.claim_params, paused=pauses)
        self._claim_params.clear()

    def claim_params_for(self, batch: int) -> ClaimParams:
        """`claim_params` for a claim of up to ``batch`` jobs (made once per batch size)."""
        params = self._claim_params.get(batch)
        if params is None:
            params = self._claim_params[batch] = self.claim_params.with_batch(batch)
        return params

    # -- hooks ---------------------------------------------------------------------------

    def hook(self, name: str, *args: Any) -> None:
        """Call a metrics hook; a hook that raises is logged, never fatal."""
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, name)(*args)
        except Exception:
            log.exception("metrics hook %s raised", name)

    # -- claiming ------------------------------------------------------------------------

    def free(self) -> int:
        return self.settings.concurrency - self.busy

    def unfinished(self) -> int:
        """Jobs held that have not finished: running, or queued for a handler."""
        return self.busy + len(self.queued)

    def ahead(self) -> int:
        """How many claimed jobs may wait for a free handler.

        ``prefetch`` when set; else adaptive: none until a handler has returned, then as
        many as the handlers get through in `PREFETCH_HORIZON` at their average run time,
        up to two batches. Short jobs then share a claim and an acknowledgement per batch
        even at ``concurrency=1``, and the loop claims the next batch while the handlers
        work through the last one instead of waiting for them to drain it; long jobs are
        not hoarded away from other workers.
        """
        s = self.settings
        if s.prefetch is not None:
            return s.prefetch
        if self.run_time is None:
            return 0
        most = PREFETCH_BATCHES * s.batch
        if self.run_time * most <= PREFETCH_HORIZON * s.concurrency:
            return most
        return int(PREFETCH_HORIZON * s.concurrency / self.run_time)

    def room(self) -> int:
        """How many more jobs this worker may hold unfinished now."""
        return self.settings.concurrency + self.ahead() - self.unfinished()

    def refill(self) -> int:
        """While there is a backlog, claim again once there is room for this many."""
        return max(1, min(self.settings.batch, self.settings.concurrency + self.ahead()) // 2)

    def claim_size(self, now: float) -> int:
        """How many jobs to claim now (0: not now)."""
        if self.stopping:
            return 0
        room = self.room()
        if room <= 0:
            return 0
        if (self.backlog and room >= self.refill()) or self.notified or now >= self.next_poll:
            return min(self.settings.batch, room)
        return 0

    def on_notify(self, payload: str) -> bool:
        """A notification arrived; True if it concerns a queue this worker serves."""
        if self._wanted_queues is not None:
            named = st.parse_notify_payload(payload)
            if named is not None and not named & self._wanted_queues:
                return False
        self.wake()
        return True

    def wake(self) -> None:
        """Claim at the next occasion (jobs may have arrived)."""
        self.notified = True
        self.notifications += 1

    def admit(
        self,
        jobs: Sequence[ClaimedJob],
        requested: int,
        claimed_at: float,
        notifications: int | None = None,
    ) -> list[Entry]:
        """Take claimed jobs in; returns those to start now, marked running (unknown kinds
        fail at once; the others wait in `queued` for a free handler, see `next_entry`).

        ``notifications`` is what the counter was when the claim began: a notification that
        came in while the claim ran may be about jobs the claim could not see yet.
        """
        if requested:
            self.backlog = len(jobs) >= requested
            self.notified = notifications is not None and notifications != self.notifications
            self.next_poll = self.timer() + self.settings.poll_interval
        for job in jobs:
            spec = self.app.get(job.kind)
            entry = Entry(
                job=job,
                context=JobContext(job, check=self._check_followup, steps=self.steps),
                spec=spec,
                claimed_at=claimed_at,
                lease_deadline=claimed_at + self.settings.lease,
            )
            self.in_flight[entry.pair] = entry
            if spec is None:
                known = ", ".join(self.app.kinds) or "none"
                error = UnknownJobKind(
                    f"no handler for job kind {job.kind!r} on worker {self.settings.worker_id} "
                    f"(handlers: {known})"
                )
                self.add(Result(entry, Action.FAIL, error_text(error, 4000)))
                continue
            entry.queued = True
            self.queued.append(entry)
        start: list[Entry] = []
        while (ready := self.next_entry()) is not None:
            start.append(ready)
        return start

    def next_entry(self) -> Entry | None:
        """The next queued job, marked running and begun, if a handler is free for it.

        A handler thread (or task) that finished a job takes the next one itself, so a batch
        runs through without waking the loop for every job.
        """
        while self.queued and self.busy < self.settings.concurrency:
            entry = self.queued.popleft()
            entry.queued = False
            if entry.context.cancel.cancelled:  # shutdown or lease lost while it waited
                self.add(Result(entry, _give_up(entry)))
                continue
            entry.running = True
            self.busy += 1
            self.begin(entry)
            return entry
        return None

    def wants_loop(self, started: Entry | None) -> bool:
        """After a handler finished (and maybe ``started`` the next job): whether the loop has
        something new to decide (write, claim, a timeout to watch), so that it is woken up
        for those only, not after every job."""
        if self.stopping or len(self.results) == 1:
            return True
        if started is not None and started.deadline is not None:
            return True
        now = self.timer()
        return self.should_write(now, 0) or self.claim_size(now) > 0

    def _check_followup(self, job: st.NewJob) -> object:
        return st.enqueue_jobs(
            self.ops.table,
            [job],
            dumps=self.ops.dumps,
            max_payload_bytes=self.ops.max_payload_bytes,
        )

    # -- running -------------------------------------------------------------------------

    def begin(self, entry: Entry) -> None:
        """The handler starts now: its timeout starts now too."""
        entry.started = self.timer()
        self.hook("job_started", entry.job, max(0.0, entry.started - entry.claimed_at))
        if entry.spec is not None and entry.spec.timeout is not None:
            entry.deadline = entry.started + entry.spec.timeout

    @staticmethod
    def parse(entry: Entry) -> None:
        """Run the kind's ``parse`` on the payload; a refusal is `InvalidPayload`."""
        spec = entry.spec
        if spec is not None and spec.parse is not None:
            try:
                entry.context.payload = spec.parse(entry.job.payload)
            except Exception as exc:
                raise InvalidPayload(
                    f"payload of job kind {entry.job.kind!r} is invalid: {exc}"
                ) from exc

    def keep_result(self, entry: Entry, returned: Any) -> None:
        """What the handler returned, as the JSON its completion records (with a steps
        table; ``None`` records nothing). A value that is not JSON, or too large, raises
        the one-line error that fails the job: its result could not be kept."""
        if self.results_table is None or returned is None or isinstance(returned, Snooze):
            return
        entry.result = returned_json(returned, entry.job.id, entry.job.kind)

    def finished(self, entry: Entry, error: BaseException | None) -> None:
        """A handler returned (``error`` None) or raised: decide what to write."""
        entry.running = False
        self.busy -= 1
        if entry.abandoned:
            log.info(
                "job %s (%s) finished after it was given up (%s); its result is dropped",
                entry.job.id,
                entry.job.kind,
                entry.context.cancel.reason,
            )
            return
        seconds = self.timer() - (entry.started or entry.claimed_at)
        self._ran_for(seconds)
        cancel = entry.context.cancel
        spec = entry.spec
        if cancel.reason is CancelReason.CANCELLED:
            # The row is 'cancelled' already: no result can be written over it (fenced by
            # status), whatever the handler did; end the cancellation instead.
            self.add(Result(entry, Action.CANCEL, seconds=seconds))
        elif error is None:
            self.add(Result(entry, Action.COMPLETE, seconds=seconds))
        elif isinstance(error, Slept):
            self.add(Result(entry, Action.SLEPT, None, error.delay, seconds))
        elif isinstance(error, Snooze):
            self.add(Result(entry, Action.SNOOZE, None, error.delay, seconds))
        elif isinstance(error, JobCancelled) and cancel.cancelled:
            self.add(Result(entry, Action.RELEASE, seconds=seconds))
        elif isinstance(error, PermanentError | InvalidArgument | InvalidArgumentType) or (
            spec is not None and spec.permanent and isinstance(error, spec.permanent)
        ):
            # InvalidArgument*: the library refused the handler's own input (a follow-up job
            # with a bad payload, say); the same run would be refused again.
            self.add(
                Result(
                    entry,
                    Action.FAIL,
                    error_text(error, self.settings.max_error_chars),
                    None,
                    seconds,
                )
            )
        else:
            delay = spec.retry_delay(entry.job.attempts) if spec is not None else None
            log.info(
                "job %s (%s) attempt %d/%d raised %s: %s",
                entry.job.id,
                entry.job.kind,
                entry.job.attempts,
                entry.job.max_attempts,
                type(error).__name__,
                error,
            )
            self.add(
                Result(
                    entry,
                    Action.RETRY,
                    error_text(error, self.settings.max_error_chars),
                    delay,
                    seconds,
                )
            )

    def _ran_for(self, seconds: float) -> None:
        previous = self.run_time
        self.run_time = seconds if previous is None else 0.8 * previous + 0.2 * seconds

    def add(self, result: Result) -> None:
        if not self.results:
            self.first_result_at = self.timer()
        self.results.append(result)

    def expire(self, now: float) -> list[Entry]:
        """Give up the jobs that ran past their kind's timeout: cancel, and retry them."""
        expired = []
        for entry in self.in_flight.values():
            if (
                entry.running
                and not entry.abandoned
                and entry.deadline is not None
                and now >= entry.deadline
            ):
                spec = entry.spec
                assert spec is not None
                assert spec.timeout is not None
                entry.abandoned = True
                seconds = now - (entry.started or entry.claimed_at)
                if entry.context.cancel.reason is CancelReason.CANCELLED:
                    self._ran_for(seconds)
                    self.add(Result(entry, Action.CANCEL, seconds=seconds))
                    expired.append(entry)
                    continue
                entry.context.cancel.cancel(CancelReason.TIMEOUT)
                error = JobTimeout(
                    f"job kind {entry.job.kind!r} ran longer than its timeout of {spec.timeout:g} s"
                )
                log.warning("job %s: %s; it will be retried", entry.job.id, error)
                delay = spec.retry_delay(entry.job.attempts)
                self._ran_for(seconds)
                self.add(Result(entry, Action.RETRY, error_text(error, 4000), delay, seconds))
                expired.append(entry)
        return expired

    # -- writing -------------------------------------------------------------------------

    def should_write(self, now: float, claim: int) -> bool:
        if not self.results:
            return False
        return (
            claim > 0
            or self.stopping
            or self.unfinished() == 0
            or len(self.results) >= self.settings.ack_batch
            or (
                self.first_result_at is not None
                and now >= self.first_result_at + self.settings.ack_delay
            )
        )

    def take_results(self) -> list[Result]:
        results, self.results = self.results, []
        self.first_result_at = None
        return results

    def one_statement(self, results: Sequence[Result], claim: int) -> bool:
        """Whether `write_op` runs a single statement for these results (only completions
        without follow-up jobs, or nothing but a claim): then it needs no transaction of its
        own, and the driver runs it in autocommit mode (one round trip, one commit). A claim
        under limits is two statements (the limits' lock, then the claim) in a transaction;
        so are completions without a claim when results are recorded and announced."""
        if claim and self.limited:
            return False
        if results and not claim and self.results_table is not None:
            return False
        for result in results:
            if result.action is not Action.COMPLETE or result.entry.context.has_followups:
                return False
        return True

    def write_op(self, results: Sequence[Result], claim: int) -> Op[Written]:
        """Write ``results`` and claim up to ``claim`` jobs: one transaction, one commit.

        Completions alone (no follow-up jobs) and a claim are one statement
        (`st.complete_and_claim_jobs`); see `one_statement`.
        """
        ops = self.ops
        outcomes: list[tuple[Result, JobOutcome]] = []
        if results and claim and self.one_statement(results, claim):
            returned = [
                (r.entry.job.id, r.entry.result) for r in results if r.entry.result is not None
            ]
            done, taken = yield from ops.complete_and_claim(
                [r.entry.pair for r in results],
                self.claim_params_for(claim),
                steps=self.results_table,
                results=returned,
            )
            succeeded, lost = JobOutcome.SUCCEEDED, JobOutcome.LOST
            outcomes = [(r, succeeded if r.entry.pair in done else lost) for r in results]
            outcomes = yield from self._cancelled_or_lost(outcomes)
            return Written(outcomes, taken)
        completes = [r for r in results if r.action is Action.COMPLETE]
        if completes:
            done = yield from ops.complete_rows([r.entry.pair for r in completes])
            followups = []
            returned = []
            for result in completes:
                entry = result.entry
                ok = entry.pair in done
                outcomes.append((result, JobOutcome.SUCCEEDED if ok else JobOutcome.LOST))
                if ok and entry.context.has_followups:
                    followups.extend(entry.context.followups)
                if ok and entry.result is not None:
                    returned.append((entry.job.id, entry.result))
            if returned:
                assert self.results_table is not None
                yield from ops.record_results(self.results_table, returned)
            if followups:  # each took its trace context when the handler enqueued it
                yield from ops.enqueue_many(followups, trace=False)
        releases = [r for r in results if r.action is Action.RELEASE]
        if releases:
            batch = yield from ops.release_many([r.entry.pair for r in releases])
            released = set(batch.done)
            outcomes.extend(
                (r, JobOutcome.RELEASED if r.entry.job.id in released else JobOutcome.LOST)
                for r in releases
            )
        for result in results:
            job = result.entry.job
            try:
                if result.action is Action.RETRY:
                    retried = yield from ops.retry(
                        job.id, job.lease_token, result.error, result.delay
                    )
                    pending = retried.status is JobStatus.PENDING
                    outcomes.append((result, JobOutcome.RETRIED if pending else JobOutcome.FAILED))
                elif result.action is Action.FAIL:
                    yield from ops.fail(job.id, job.lease_token, result.error)
                    outcomes.append((result, JobOutcome.FAILED))
                elif result.action is Action.SNOOZE:
                    assert result.delay is not None
                    yield from ops.snooze(job.id, job.lease_token, result.delay)
                    outcomes.append((result, JobOutcome.SNOOZED))
                elif result.action is Action.SLEPT:
                    outcomes.append((result, JobOutcome.SNOOZED))  # written by the handler
                elif result.action is Action.CANCEL:
                    outcomes.append((result, JobOutcome.LOST))  # unless ended just below
            except LeaseLost:
                outcomes.append((result, JobOutcome.LOST))
        outcomes = yield from self._cancelled_or_lost(outcomes)
        if self.results_table is not None:
            ended = [r.entry.job.id for r, outcome in outcomes if outcome in _FINISHED]
            if ended:
                yield from ops.notify_done(ended)
        claimed: list[ClaimedJob] = []
        if claim:
            claimed = yield from ops.claim(self.claim_params_for(claim))
        return Written(outcomes, claimed)

    def _cancelled_or_lost(
        self, outcomes: list[tuple[Result, JobOutcome]]
    ) -> Op[list[tuple[Result, JobOutcome]]]:
        """A write that matched no row: the job was reclaimed, or cancelled while held
        (`JobQueue.cancel` sets 'cancelled' and keeps the token). End the cancellations
        (`st.finish_cancelled_jobs`, fenced by the token); those are ``cancelled``, the
        others ``lost``. Rare: one more statement only when some pair was not written."""
        missing = [r.entry.pair for r, outcome in outcomes if outcome is JobOutcome.LOST]
        if not missing:
            return outcomes
        ended = yield from self.ops.finish_cancelled(missing)
        if not ended:
            return outcomes
        cancelled = JobOutcome.CANCELLED
        return [
            (r, cancelled if outcome is JobOutcome.LOST and r.entry.pair in ended else outcome)
            for r, outcome in outcomes
        ]

    def written(self, written: Written) -> None:
        """A write committed: forget the written jobs and report their outcomes."""
        for result, outcome in written.outcomes:
            entry = result.entry
            self.in_flight.pop(entry.pair, None)
            extra = outcome_fields(result, outcome)
            if outcome is JobOutcome.CANCELLED:
                log.info(
                    "job %s (%s) was cancelled while it ran",
                    entry.job.id,
                    entry.job.kind,
                    extra=extra,
                )
            elif outcome is JobOutcome.LOST:
                log.warning(
                    "job %s (%s): lease lost before its result (%s) was written; the row was "
                    "left as it is",
                    entry.job.id,
                    entry.job.kind,
                    result.action.value,
                    extra=extra,
                )
            elif outcome is JobOutcome.FAILED:
                log.warning(
                    "job %s (%s) failed: %s",
                    entry.job.id,
                    entry.job.kind,
                    extra["error"],
                    extra=extra,
                )
            else:
                log.info(
                    "job %s (%s) attempt %d %s in %.3f s",
                    entry.job.id,
                    entry.job.kind,
                    entry.job.attempts,
                    outcome.value,
                    result.seconds,
                    extra=extra,
                )
            self.hook("job_finished", entry.job.kind, outcome, result.seconds)
            self.hook("job_settled", entry.job, outcome, result.seconds)

    def note_ended(self, written: Written) -> None:
        """Keep the jobs a committed write finished, when jobs may wait for them: their
        dependants are released after it (`release_due`)."""
        if self.dependencies is None:
            return
        ended = [r.entry.job.id for r, outcome in written.outcomes if outcome in _FINISHED]
        if ended:
            if not self.to_release:
                self.to_release_since = self.timer()
            self.to_release.extend(ended)

    def release_due(self, now: float, claimed: int) -> list[uuid.UUID]:
        """The finished jobs whose dependants to release now: once `RELEASE_BATCH` have
        gathered or the oldest waited `RELEASE_DELAY`, or after a write that ``claimed``
        nothing (no more work in sight), or when the worker stops. Releasing them together
        costs one transaction for many writes of a busy worker."""
        waited = self.to_release_since
        if not self.to_release or waited is None:
            return []
        if (
            len(self.to_release) < RELEASE_BATCH
            and now < waited + RELEASE_DELAY
            and claimed > 0
            and not self.stopping
        ):
            return []
        parents, self.to_release, self.to_release_since = self.to_release, [], None
        return parents

    def release_op(self, parents: Sequence[uuid.UUID]) -> Op[int]:
        """Release the jobs waiting for ``parents`` that these now decide (`DependencyOps.
        release`), announcing those released finished; how many were released."""
        assert self.dependencies is not None
        yield st.index_walks_only()  # this transaction is the worker's own
        released = yield from self.dependencies.release(parents=parents)
        yield from self._announce(released)
        return len(released)

    def sweep_due(self, now: float, reclaimed: int) -> bool:
        """Whether the keeper sweeps the waiting jobs now (`sweep_op`): at its first pass (a
        worker killed before this one started may have lost a release), after a reclaim
        that found ``reclaimed`` expired leases (a worker died: so may its last releases
        have been), and every `SWEEP_INTERVAL` seconds otherwise (a death that left no
        lease behind). A sweep reads every waiting row: not at every reclaim."""
        if self.dependencies is None:
            return False
        if self.swept_at is not None and not reclaimed and now < self.swept_at + SWEEP_INTERVAL:
            return False
        self.swept_at = now
        return True

    def sweep_soon(self) -> None:
        """Make the keeper's next pass sweep (a release failed: its jobs wait for it)."""
        self.swept_at = None

    def sweep_op(self, after: uuid.UUID | None) -> Op[tuple[int, uuid.UUID | None]]:
        """One page of the sweep of the waiting jobs (`DependencyOps.sweep_page`)."""
        assert self.dependencies is not None
        yield st.index_walks_only()
        released, after = yield from self.dependencies.sweep_page(after)
        yield from self._announce(released)
        return len(released), after

    def _announce(self, released: Sequence[tuple[uuid.UUID, JobStatus]]) -> Op[None]:
        ended = [job_id for job_id, status in released if status is not JobStatus.PENDING]
        if ended and self.results_table is not None:
            yield from self.ops.notify_done(ended)

    def isolate(self, results: Sequence[Result], error: BaseException) -> list[list[Result]] | None:
        """A write of ``results`` was refused for its values (`is_bad_data`: a follow-up job
        the database would not take, say): what to write instead, group by group.

        Several results are tried one by one, so only the culprit is affected; a single
        completion with follow-up jobs becomes a permanent failure that records the
        database's refusal. ``None``: nothing to isolate, the error stands.
        """
        if len(results) > 1:
            return [[result] for result in results]
        [result] = results
        if result.action is Action.COMPLETE and result.entry.context.has_followups:
            text = error_text(error, self.settings.max_error_chars)
            log.warning(
                "job %s (%s): its follow-up jobs were refused by the database; it fails: %s",
                result.entry.job.id,
                result.entry.job.kind,
                text.splitlines()[0],
            )
            return [[Result(result.entry, Action.FAIL, text, None, result.seconds)]]
        return None

    def dropped(self, results: Sequence[Result]) -> None:
        """Results that could not be written (the database stayed away): the leases expire
        and the reclaimer returns the jobs; forget them here."""
        for result in results:
            self.in_flight.pop(result.entry.pair, None)
            self.dropped_ids.append(result.entry.job.id)
        if results:
            log.error(
                "%d job results could not be written; those jobs run again once their lease "
                "expires",
                len(results),
            )

    # -- heartbeats ----------------------------------------------------------------------

    def heartbeat_pairs(self) -> list[Pair]:
        return list(self.in_flight)

    def heartbeat_op(self, pairs: Sequence[Pair]) -> Op[Beat]:
        """Renew the leases; for those found lost (rare), ask which were cancelled."""
        result = yield from self.ops.heartbeat_many(pairs, self.settings.lease)
        cancelled: frozenset[Pair] = frozenset()
        if result.lost:
            lost_ids = set(result.lost)
            lost = [pair for pair in pairs if pair[0] in lost_ids]
            cancelled = frozenset((yield from self.ops.held_cancelled(lost)))
        return Beat(result, cancelled)

    def beaten(self, pairs: Sequence[Pair], beat: Beat, sent_at: float) -> int:
        """A heartbeat returned: move the local lease deadlines, cancel the lost and the
        cancelled; returns how many of the jobs still held were found lost."""
        lost_ids = set(beat.result.lost)
        lost = 0
        for pair in pairs:
            entry = self.in_flight.get(pair)
            if entry is None:
                continue
            if pair in beat.cancelled:
                if entry.queued:
                    self._unqueue(entry, CancelReason.CANCELLED)
                elif entry.running and entry.context.cancel.cancel(CancelReason.CANCELLED):
                    log.info(
                        "job %s (%s) was cancelled; its handler is told to stop",
                        entry.job.id,
                        entry.job.kind,
                    )
            elif pair[0] in lost_ids:
                # A job whose result waits to be written: the fenced write will tell.
                if entry.queued:
                    self._unqueue(entry)
                elif entry.running and entry.context.cancel.cancel(CancelReason.LEASE_LOST):
                    lost += 1
                    log.warning(
                        "job %s (%s): heartbeat found the lease lost; its handler is cancelled",
                        entry.job.id,
                        entry.job.kind,
                    )
            else:
                entry.lease_deadline = sent_at + self.settings.lease
        return lost

    def expire_leases(self, now: float) -> int:
        """Cancel the jobs whose lease may have expired because heartbeats failed."""
        lost = 0
        for entry in [e for e in self.queued if now >= e.lease_deadline]:
            self._unqueue(entry)
        for entry in self.in_flight.values():
            if (
                entry.running
                and now >= entry.lease_deadline
                and entry.context.cancel.cancel(CancelReason.LEASE_LOST)
            ):
                lost += 1
                log.warning(
                    "job %s (%s): no heartbeat renewed its lease in time; its handler is cancelled",
                    entry.job.id,
                    entry.job.kind,
                )
        return lost

    def _unqueue(self, entry: Entry, reason: CancelReason = CancelReason.LEASE_LOST) -> None:
        """A queued job that may no longer be held (or was cancelled): never run it;
        release it, or end its cancellation (fenced)."""
        self.queued.remove(entry)
        entry.queued = False
        entry.context.cancel.cancel(reason)
        self.add(Result(entry, _give_up(entry)))

    # -- shutdown ------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Stop claiming, release the queued jobs (never started: no attempt counted), and
        tell the running handlers that shutdown was asked."""
        self.stopping = True
        while self.queued:
            entry = self.queued.popleft()
            entry.queued = False
            entry.context.cancel.cancel(CancelReason.SHUTDOWN)
            self.add(Result(entry, Action.RELEASE))
        for entry in self.in_flight.values():
            if entry.running:
                entry.context.cancel.cancel(CancelReason.SHUTDOWN)

    def abandon_running(self) -> list[Entry]:
        """The grace period is over: release what still runs (no attempt counted)."""
        abandoned = []
        now = self.timer()
        for entry in self.in_flight.values():
            if entry.running and not entry.abandoned:
                entry.abandoned = True
                entry.context.cancel.cancel(CancelReason.SHUTDOWN)
                seconds = now - (entry.started or entry.claimed_at)
                self.add(Result(entry, Action.RELEASE, seconds=seconds))
                abandoned.append(entry)
        if abandoned:
            log.warning(
                "grace period over: releasing %d running jobs back to pending", len(abandoned)
            )
        return abandoned

    # -- timing --------------------------------------------------------------------------

    def next_wakeup(self, now: float) -> float | None:
        """Seconds until something is due (a poll, an ack, a timeout); None: nothing."""
        due: list[float] = []
        if not self.stopping and self.room() > 0:
            due.append(self.next_poll)
        if self.first_result_at is not None:
            due.append(self.first_result_at + self.settings.ack_delay)
        for e in self.in_flight.values():
            if e.running and not e.abandoned:
                # A timeout, and the local lease end: the keeper may be stuck in a heartbeat
                # that a dead network never answers; the loop then cancels by its own clock.
                if e.deadline is not None:
                    due.append(e.deadline)
                if not e.context.cancel.cancelled:
                    due.append(e.lease_deadline)
        return max(0.0, min(due) - now) if due else None


#: A worker releases the dependants of the jobs it finished once this many gathered, or
#: after `RELEASE_DELAY` seconds, or when it has nothing else to run (`Core.release_due`).
RELEASE_BATCH = 1000
RELEASE_DELAY = 0.05
#: The longest a keeper goes without sweeping the waiting jobs (`Core.sweep_due`).
SWEEP_INTERVAL = 600.0

#: The outcomes after which a job is finished (what waiters for results wait for).
_FINISHED = frozenset({JobOutcome.SUCCEEDED, JobOutcome.FAILED, JobOutcome.CANCELLED})


def outcome_fields(result: Result, outcome: JobOutcome) -> dict[str, Any]:
    """The ``extra=`` fields of a job's outcome log line (docs/metrics.md lists them)."""
    job = result.entry.job
    fields: dict[str, Any] = {
        "job_id": str(job.id),
        "kind": job.kind,
        "queue": job.queue,
        "attempt": job.attempts,
        "lease_token": str(job.lease_token),
        "outcome": outcome.value,
        "duration": round(result.seconds, 6),
        "error": (result.error or "").splitlines()[0] if result.error else None,
    }
    if job.headers is not None:
        trace_id = trace_id_of(job.headers)
        if trace_id is not None:  # the trace the job continues (docs/tracing.md)
            fields["trace_id"] = trace_id
    return fields


def _give_up(entry: Entry) -> Action:
    """What to write for a job given up before it ran: a cancelled job's cancellation is
    ended (it stays 'cancelled'), any other job is released to 'pending'."""
    if entry.context.cancel.reason is CancelReason.CANCELLED:
        return Action.CANCEL
    return Action.RELEASE
