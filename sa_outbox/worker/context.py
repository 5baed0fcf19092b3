"""What a handler receives: `JobContext` (the job) and its `CancelToken`.

Examples:
    >>> import uuid
    >>> from sa_outbox.queue import ClaimedJob
    >>> claimed = ClaimedJob(id=uuid.UUID(int=1), queue="default", kind="send-email",
    ...                      payload={"to": "ana@example.com"}, priority=0, run_at=None,
    ...                      attempts=1, max_attempts=8, lease_until=None,
    ...                      lease_token=uuid.UUID(int=2), worker_id="w1",
    ...                      deduplication_key="welcome:ana", created_at=None)
    >>> job = JobContext(claimed)
    >>> job.kind, job.payload["to"], job.attempts, job.cancel.cancelled
    ('send-email', 'ana@example.com', 1, False)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import threading
import types
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .._tracing import current_trace_headers
from ..queue import ClaimedJob
from ..schema import JobStatus
from ..statements import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, NewJob, Unique, snooze_delay
from ._steps import SessionChoice, check_name, check_step
from ._steps_async import AsyncSteps
from ._steps_sync import Steps
from .errors import JobCancelled, StepsUnavailable

T = TypeVar("T")


__all__ = ["CancelReason", "CancelToken", "JobContext"]


class CancelReason(enum.StrEnum):
    """Why a job's token was cancelled.

    Examples:
        >>> CancelReason("lease lost") is CancelReason.LEASE_LOST
        True
    """

    #: The worker is stopping (SIGTERM, SIGINT, `Worker.stop`): finish soon or give up.
    SHUTDOWN = "shutdown"
    #: A heartbeat found the lease gone (reclaimed, maybe taken by another worker), or could
    #: not renew it in time: the result of this run may no longer be written.
    LEASE_LOST = "lease lost"
    #: The kind's timeout passed; the job has been sent back to be retried.
    TIMEOUT = "timeout"
    #: The job was cancelled (`JobQueue.cancel`) while it ran: whatever the handler now
    #: returns or raises, the job ends ``cancelled``; stop as soon as it is safe.
    CANCELLED = "cancelled"


class CancelToken:
    """Tells a running handler that it should stop: shutdown asked, lease lost, timeout, or
    the job cancelled.

    Cancellation is cooperative: long work checks ``cancelled``, waits with ``wait`` (threads)
    or ``await wait_async()`` (asyncio) instead of sleeping, or calls `raise_if_cancelled`.
    The first reason given sticks.

    Examples:
        >>> token = CancelToken()
        >>> token.wait(timeout=0)
        False
        >>> token.cancel(CancelReason.SHUTDOWN)
        True
        >>> token.cancelled, token.reason
        (True, <CancelReason.SHUTDOWN: 'shutdown'>)
        >>> token.raise_if_cancelled()
        Traceback (most recent call last):
        ...
        sa_outbox.worker.errors.JobCancelled: job cancelled: shutdown
    """

    # A worker makes one token per job: the event and the waiters' list exist only once a
    # handler waits, and one lock (`_LOCK`) serves every token (cancelling is rare).
    __slots__ = ("_event", "_reason", "_waiters")

    def __init__(self) -> None:
        self._event: threading.Event | None = None
        self._reason: CancelReason | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the job should stop."""
        return self._reason is not None

    @property
    def reason(self) -> CancelReason | None:
        """Why it should stop, once cancelled."""
        return self._reason

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; True if cancelled.

        Use it instead of ``time.sleep`` in a handler that waits: it wakes up at once on a
        shutdown or a lost lease.
        """
        if self._reason is not None:
            return True
        with _LOCK:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    async def wait_async(self) -> None:
        """Wait (asyncio) until cancelled; wrap it in ``asyncio.timeout`` to bound it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with _LOCK:
            if self._reason is not None:
                return
            if self._waiters is None:
                self._waiters = []
            self._waiters.append((loop, future))
        await future

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelled` if cancelled; a handler that lets it propagate gives up."""
        if self._reason is not None:
            raise JobCancelled(f"job cancelled: {self._reason}")

    def cancel(self, reason: CancelReason) -> bool:
        """Cancel (the worker does it); False if it was already cancelled."""
        with _LOCK:
            if self._reason is not None:
                return False
            self._reason = reason
            event, waiters, self._waiters = self._event, self._waiters, None
        if event is not None:
            event.set()
        for loop, future in waiters or ():
            loop.call_soon_threadsafe(_resolve, future)
        return True

    def __repr__(self) -> str:
        return f"CancelToken({self._reason or 'active'})"


#: Guards every token's state: taken to cancel, and to start waiting (both rare).
_LOCK = threading.Lock()
#: The headers of a job that has none.
_NO_HEADERS: Mapping[str, str] = types.MappingProxyType({})


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class JobContext:
    """A running job, as its handler sees it.

    ``id``, ``kind``, ``payload`` (what the kind's ``parse`` returned, if it has one),
    ``attempts`` (this run included), ``max_attempts``, ``deduplication_key``, ``queue``,
    ``priority``, ``created_at``, ``lease_token``, ``headers``; ``cancel``, the job's
    `CancelToken`; and `enqueue`, for follow-up jobs. ``claimed`` is the `ClaimedJob` as the
    claim returned it (raw payload included).

    Examples:
        def send_receipt(job: JobContext) -> None:
            order = load_order(job.payload["order_id"])
            if job.cancel.cancelled:
                return
            mailer.send(order.email, idempotency_key=str(job.id))
            job.enqueue("index-order", {"order_id": order.id})
    """

    __slots__ = ("_check", "_followups", "_recorded", "_steps", "cancel", "claimed", "payload")

    def __init__(
        self,
        claimed: ClaimedJob,
        payload: Any = None,
        *,
        parsed: bool = False,
        check: Callable[[NewJob], object] | None = None,
        steps: Steps | AsyncSteps | None = None,
    ) -> None:
        self.claimed = claimed
        self._steps = steps
        self._recorded: dict[str, Any] | None = None
        self.payload: Any = payload if parsed else claimed.payload
        self.cancel = CancelToken()
        self._followups: list[NewJob] | None = None  # most jobs enqueue none
        self._check = check

    @property
    def id(self) -> uuid.UUID:
        """The job's id."""
        return self.claimed.id

    @property
    def kind(self) -> str:
        """The job's kind."""
        return self.claimed.kind

    @property
    def queue(self) -> str:
        """The queue the job was claimed from."""
        return self.claimed.queue

    @property
    def priority(self) -> int:
        """The job's priority."""
        return self.claimed.priority

    @property
    def attempts(self) -> int:
        """How many times the job has been claimed, this run included (1 on the first)."""
        return self.claimed.attempts

    @property
    def max_attempts(self) -> int:
        """After this many attempts a failure is final."""
        return self.claimed.max_attempts

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now would end in ``failed``."""
        return self.claimed.attempts >= self.claimed.max_attempts

    @property
    def deduplication_key(self) -> str | None:
        """The job's deduplication key: an idempotency key for the outside world."""
        return self.claimed.deduplication_key

    @property
    def created_at(self) -> dt.datetime:
        """When the job was enqueued."""
        return self.claimed.created_at

    @property
    def lease_token(self) -> uuid.UUID:
        """The fencing token of this run."""
        return self.claimed.lease_token

    @property
    def headers(self) -> Mapping[str, str]:
        """The job's headers (read-only; empty when it has none): those given at enqueue,
        and the trace context it was enqueued in (``traceparent``, docs/tracing.md)."""
        headers = self.claimed.headers
        return _NO_HEADERS if headers is None else types.MappingProxyType(headers)

    def enqueue(
        self,
        kind: str,
        payload: Any,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        deduplication_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        lock_key: str | None = None,
        unique: Unique | None = None,
    ) -> None:
        """Enqueue a follow-up job, written in the transaction that completes this one.

        The follow-up exists exactly when this job's completion commits: not if the handler
        fails, nor if the lease was lost (the run that completes the job enqueues it). Give
        it a ``deduplication_key`` if it must never be enqueued twice across runs. To
        enqueue at once instead, use `JobQueue.enqueue` in a transaction of your own. Bad
        input (an unserialisable payload…) raises here, in the handler. The trace context
        current here (this job's span, with OpenTelemetry) joins ``headers``, under them.
        A ``unique`` follow-up (`Unique`) is skipped when its unique key is held when the
        completion is written (docs/unique.md).
        """
        trace = current_trace_headers()
        if trace is not None and (headers is None or isinstance(headers, Mapping)):
            headers = {**trace, **(headers or {})}
        job = NewJob(
            kind,
            payload,
            queue=queue,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            deduplication_key=deduplication_key,
            headers=headers,
            lock_key=lock_key,
            unique=unique,
        )
        if self._check is not None:
            self._check(job)
        if self._followups is None:
            self._followups = []
        self._followups.append(job)

    def step(self, name: str, fn: Callable[..., T], *, session: SessionChoice = False) -> T:
        """Run step ``name`` once: its recorded result if an earlier attempt completed it,
        else ``fn`` run now and its result (JSON, at most 1 MiB) recorded under the lease.

        A retry after a crash or an error resumes after the last completed step. With
        ``session=True`` (or your ``sessionmaker``, to keep its ``sa_outbox.install`` hooks)
        ``fn`` gets a Session: what it writes and the step's record commit in one
        transaction, so the step's effects in the database happen exactly once. Without, the
        step may run again if the worker dies between ``fn`` and the record (at least once:
        make it idempotent). The result returned is the recorded one (JSON round trip),
        the same on every attempt. A lease lost before the record raises `LeaseLost` (and
        rolls back the Session's writes). Needs ``JobApp(Job, steps=JobStep)`` and a thread
        `Worker`; in an ``async def`` handler, use `astep`. Give each step its own name
        (``f"charge-{i}"`` in a loop).

        Examples:
            @app.handler("place-order")
            def place_order(job: JobContext) -> None:
                order_id = job.step("reserve", lambda db: reserve_stock(db, job.payload),
                                    session=True)
                charge = job.step("charge", lambda: payments.charge(order_id))
                job.step("ship", lambda: shipping.create(order_id, charge["id"]))
        """
        checked = check_step(name, fn, session)
        steps, recorded = self._thread_steps("step")
        result: T = steps.run(self.id, self.lease_token, recorded, checked, fn, session)
        return result

    async def astep(
        self, name: str, fn: Callable[..., T | Awaitable[T]], *, session: SessionChoice = False
    ) -> T:
        """`step` for ``async def`` handlers on an `AsyncWorker`: ``fn`` may be a coroutine
        function; with ``session`` it gets an `AsyncSession` (or your
        ``async_sessionmaker``'s).

        Examples:
            @app.handler("place-order")
            async def place_order(job: JobContext) -> None:
                async def reserve(db: AsyncSession) -> int:
                    db.add(Reservation(order=job.payload["order"]))
                    return job.payload["order"]

                order_id = await job.astep("reserve", reserve, session=True)
                await job.astep("charge", lambda: payments.charge(order_id))
        """
        checked = check_step(name, fn, session)
        steps, recorded = await self._asyncio_steps("astep")
        result: T = await steps.run(self.id, self.lease_token, recorded, checked, fn, session)
        return result

    def sleep(self, name: str, delay: dt.timedelta | float) -> None:
        """Wait ``delay`` durably, without holding a worker while waiting.

        The first call records the wake-up time (``now + delay`` on the database's clock)
        as step ``name`` and ends this run with `Snooze` (the attempt given back, the worker
        free for other jobs); the job runs again at that time, its earlier steps return
        their recorded results, and this call returns. Let the `Snooze` it raises propagate
        (do not catch it with ``except Exception``). Up to a year. `asleep` in ``async
        def`` handlers.

        Examples:
            @app.handler("trial")
            def trial(job: JobContext) -> None:
                job.step("welcome", lambda: mailer.send_welcome(job.payload["user"]))
                job.sleep("trial-period", dt.timedelta(days=14))
                job.step("convert", lambda: billing.start(job.payload["user"]))
        """
        checked, wait = check_name(name), snooze_delay(delay)
        steps, recorded = self._thread_steps("sleep")
        steps.sleep(self.id, self.lease_token, recorded, checked, wait)

    async def asleep(self, name: str, delay: dt.timedelta | float) -> None:
        """`sleep` for ``async def`` handlers on an `AsyncWorker`.

        Examples:
            await job.asleep("trial-period", dt.timedelta(days=14))
        """
        checked, wait = check_name(name), snooze_delay(delay)
        steps, recorded = await self._asyncio_steps("asleep")
        await steps.sleep(self.id, self.lease_token, recorded, checked, wait)

    def receive_signal(self, name: str, timeout: dt.timedelta | float) -> Any:
        """Wait for signal ``name`` (`JobQueue.send_signal`, from any transaction) without
        holding a worker; returns its payload.

        A signal sent before this call is found at once. Otherwise the job sleeps as
        `sleep` does (`Snooze`: let it propagate) and a signal sent meanwhile wakes it at
        once; the next run finds the payload here. Past ``timeout`` (counted from the first
        call, up to a year) it raises `SignalTimeout`, a permanent error unless caught.
        `areceive_signal` in ``async def`` handlers.

        Examples:
            @app.handler("refund")
            def refund(job: JobContext) -> None:
                try:
                    approval = job.receive_signal("approved", dt.timedelta(days=2))
                except SignalTimeout:
                    job.step("escalate", lambda: notify_manager(job.id))
                    raise
                job.step("pay", lambda: payments.refund(job.payload["order"], approval["by"]))
        """
        checked, wait = check_name(name), snooze_delay(timeout)
        steps, recorded = self._thread_steps("receive_signal")
        return steps.receive_signal(self.id, self.lease_token, recorded, checked, wait)

    async def areceive_signal(self, name: str, timeout: dt.timedelta | float) -> Any:
        """`receive_signal` for ``async def`` handlers on an `AsyncWorker`.

        Examples:
            approval = await job.areceive_signal("approved", dt.timedelta(days=2))
        """
        checked, wait = check_name(name), snooze_delay(timeout)
        steps, recorded = await self._asyncio_steps("areceive_signal")
        return await steps.receive_signal(self.id, self.lease_token, recorded, checked, wait)

    def parent_results(self) -> dict[uuid.UUID, Any]:
        """What each job this one waited for (``enqueue(..., after=[...])``) returned, by id,
        in the order they were named (``None`` for one that returned nothing, or failed when
        this job runs anyway); empty for a job that waited for none. Needs
        ``JobApp(Job, steps=JobStep, dependencies=JobDependency)``.

        Examples:
            @app.handler("ship")
            def ship(job: JobContext) -> None:
                [charge] = job.parent_results().values()
                carrier.ship(job.payload["order"], paid_with=charge["charge_id"])
        """
        steps = self._steps
        if not isinstance(steps, Steps):
            raise StepsUnavailable(self._no_steps("parent_results", "aparent_results", steps))
        return steps.parent_results(self.id)

    async def aparent_results(self) -> dict[uuid.UUID, Any]:
        """`parent_results` for ``async def`` handlers on an `AsyncWorker`.

        Examples:
            results = await job.aparent_results()
        """
        steps = self._steps
        if not isinstance(steps, AsyncSteps):
            raise StepsUnavailable(self._no_steps("aparent_results", "parent_results", steps))
        return await steps.parent_results(self.id)

    def parent_statuses(self) -> dict[uuid.UUID, JobStatus]:
        """What became of each job this one waited for: its status by id (a batch's
        callback counts them). Needs ``JobApp(Job, steps=JobStep, dependencies=...)``.

        Examples:
            @app.handler("album-ready")
            def album_ready(job: JobContext) -> None:
                counts = collections.Counter(job.parent_statuses().values())
                notify(job.payload["album"], resized=counts[JobStatus.SUCCEEDED])
        """
        steps = self._steps
        if not isinstance(steps, Steps):
            raise StepsUnavailable(self._no_steps("parent_statuses", "aparent_statuses", steps))
        return steps.parent_statuses(self.id)

    async def aparent_statuses(self) -> dict[uuid.UUID, JobStatus]:
        """`parent_statuses` for ``async def`` handlers on an `AsyncWorker`.

        Examples:
            counts = collections.Counter((await job.aparent_statuses()).values())
        """
        steps = self._steps
        if not isinstance(steps, AsyncSteps):
            raise StepsUnavailable(self._no_steps("aparent_statuses", "parent_statuses", steps))
        return await steps.parent_statuses(self.id)

    def _thread_steps(self, called: str) -> tuple[Steps, dict[str, Any]]:
        """The thread worker's `Steps` and the job's recorded steps (read at the first call),
        or `StepsUnavailable` naming ``called`` and its asyncio twin."""
        steps = self._steps
        if not isinstance(steps, Steps):
            raise StepsUnavailable(self._no_steps(called, "a" + called, steps))
        if self._recorded is None:
            self._recorded = steps.recorded(self.id)
        return steps, self._recorded

    async def _asyncio_steps(self, called: str) -> tuple[AsyncSteps, dict[str, Any]]:
        """`_thread_steps` for the asyncio methods (``called`` starts with its ``a``)."""
        steps = self._steps
        if not isinstance(steps, AsyncSteps):
            raise StepsUnavailable(self._no_steps(called, called[1:], steps))
        if self._recorded is None:
            self._recorded = await steps.recorded(self.id)
        return steps, self._recorded

    def _no_steps(self, called: str, other: str, steps: object) -> str:
        if steps is None:
            return (
                f"job.{called}() needs a steps table: JobApp(Job, steps=JobStep), with JobStep "
                "a model on sa_outbox.schema.JobStepMixin"
            )
        worker = "AsyncWorker" if isinstance(steps, AsyncSteps) else "Worker"
        return f"job.{called}() cannot run on a {worker}: use job.{other}() there"

    @property
    def followups(self) -> list[NewJob]:
        """The follow-up jobs `enqueue` collected so far."""
        return list(self._followups or ())

    @property
    def has_followups(self) -> bool:
        """Whether `enqueue` collected any follow-up job."""
        return bool(self._followups)

    def __repr__(self) -> str:
        return f"JobContext(kind={self.kind!r}, id={self.id}, attempts={self.attempts})"
