"""`JobApp`: the job table and the handlers, by kind, that a worker runs.

Examples:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> from sa_outbox import Backoff, JobMixin
    >>> class Base(DeclarativeBase): pass
    >>> class Job(JobMixin, Base): __tablename__ = "jobs"
    >>> app = JobApp(Job)
    >>> @app.handler("send-email", timeout=30, backoff=Backoff(base=5, max=600, jitter=1))
    ... def send_email(job):
    ...     print("to", job.payload["to"])
    >>> app.kinds
    ('send-email',)
    >>> app["send-email"].retry_delay(attempts=3, jitter=False).total_seconds()
    20.0
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias, TypeVar

import tenacity
from sqlalchemy import Table
from tenacity.wait import wait_base

from .._backoff import Backoff
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import duration, text
from ..schema import resolve_table
from ..statements import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    ClaimLimits,
    Limit,
)
from .context import JobContext
from .schedule import Missed, Schedule

__all__ = ["Handler", "HandlerSpec", "JobApp", "backoff_wait"]

#: A handler: ``def handler(job: JobContext) -> None`` (or ``async def`` for `AsyncWorker`).
Handler: TypeAlias = Callable[[JobContext], Any]
F = TypeVar("F", bound=Handler)

_RETRYING = tenacity.Retrying()


def _seconds(value: dt.timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def backoff_wait(backoff: Backoff, *, jitter: bool = True) -> wait_base:
    """A tenacity wait strategy for ``min(base * 2**(attempts - 1), max) + uniform(0, jitter)``.

    Examples:
        >>> wait = backoff_wait(Backoff(base=2, max=60, jitter=0))
        >>> import tenacity
        >>> state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        >>> state.attempt_number = 4
        >>> wait(state)
        16.0
    """
    exponential = tenacity.wait_exponential(
        multiplier=_seconds(backoff.base), max=_seconds(backoff.max), exp_base=2, min=0
    )
    spread = _seconds(backoff.jitter)
    if not jitter or spread == 0:
        return exponential
    return exponential + tenacity.wait_random(0, spread)


@dataclasses.dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and its per-kind options (see `JobApp.handler`).

    Examples:
        >>> spec = HandlerSpec.build("ping", lambda job: None)
        >>> spec.kind, spec.timeout, spec.is_async
        ('ping', None, False)
    """

    kind: str
    function: Handler
    timeout: float | None = None
    backoff: Backoff = DEFAULT_BACKOFF
    wait: wait_base | None = None
    parse: Callable[[Any], Any] | None = None
    permanent: tuple[type[BaseException], ...] = ()
    is_async: bool = False

    @classmethod
    def build(
        cls,
        kind: str,
        function: Handler,
        *,
        timeout: dt.timedelta | float | None = None,
        backoff: Backoff | wait_base | None = None,
        parse: Callable[[Any], Any] | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        default_backoff: Backoff = DEFAULT_BACKOFF,
    ) -> HandlerSpec:
        """Check the options and build the spec; errors name the kind."""
        name = text(kind, "job kind")
        if not callable(function):
            raise InvalidArgumentType(f"the handler of kind {name!r} is not callable")
        seconds = None
        if timeout is not None:
            seconds = duration(timeout, f"timeout of kind {name!r}").total_seconds()
        if not isinstance(permanent, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in permanent
        ):
            raise InvalidArgumentType(
                f"permanent of kind {name!r} must be a tuple of exception classes"
            )
        if parse is not None and not callable(parse):
            raise InvalidArgumentType(f"parse of kind {name!r} must be callable")
        wait: wait_base | None = None
        if isinstance(backoff, wait_base):
            wait, backoff = backoff, None
        elif backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgumentType(
                f"backoff of kind {name!r} must be a Backoff or a tenacity wait strategy, "
                f"got {type(backoff).__name__}"
            )
        chosen = backoff or default_backoff
        return cls(
            kind=name,
            function=function,
            timeout=seconds,
            backoff=chosen,
            wait=wait if wait is not None else backoff_wait(chosen),
            parse=parse,
            permanent=permanent,
            is_async=_is_async(function),
        )

    def retry_delay(self, attempts: int, *, jitter: bool = True) -> dt.timedelta:
        """The delay before retrying a job of this kind that failed at attempt ``attempts``."""
        wait = self.wait if jitter else backoff_wait(self.backoff, jitter=False)
        assert wait is not None
        state = tenacity.RetryCallState(_RETRYING, None, (), {})
        state.attempt_number = max(attempts, 1)
        return dt.timedelta(seconds=max(float(wait(state)), 0.0))


def _is_async(function: Callable[..., Any]) -> bool:
    while isinstance(function, functools.partial):
        function = function.func
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - an object's async __call__
    return call is not None and inspect.iscoroutinefunction(call)


class JobApp:
    """The job table a worker serves and its handlers, registered by kind.

    Register with the `handler` decorator, with `register`, or all at once with a plain
    mapping: ``JobApp(Job, handlers={"send-email": send_email})``. Per-kind options:
    ``timeout`` (seconds; the job is cancelled and retried when it runs longer),
    ``backoff`` (a `Backoff`, or any tenacity wait strategy, for the delay before a retry;
    the app's ``backoff`` by default), ``parse`` (called with the payload before the
    handler; whatever it raises is a bad payload, a permanent error, and what it returns is
    ``job.payload``), ``permanent`` (exception classes that fail the job at once, besides
    `PermanentError`).

    The app's ``backoff`` is also what the reclaimer applies (in SQL) to jobs whose lease
    expired. ``sa-outbox worker myapp.tasks:app`` loads a `JobApp` by that path.

    Periodic jobs: `periodic` (a decorator: the handler and its schedule) or `schedule` (the
    schedule alone) enqueue a job of a kind at every tick of a cron expression or interval;
    `schedules` lists them. See docs/worker.md, "Periodic jobs".

    Limits: `limit` caps how many jobs of a kind (or queue) run at once across all workers,
    per payload key if asked, or start per period; ``rate_log`` is the `RateLimitLogMixin`
    table rate limits count in. See docs/control.md, "Concurrency and rate limits".

    Durable steps: ``steps`` is the `JobStepMixin` table in which `JobContext.step` records
    each completed step, so a retry resumes after it; ``dependencies``, the
    `JobDependencyMixin` table of jobs that wait for others (``enqueue(..., after=)``),
    which the worker releases as their parents finish. See docs/workflows.md.

    Examples:
        app = JobApp(Job, backoff=Backoff(base=1, max=300, jitter=1))

        @app.handler("send-email", timeout=30, permanent=(InvalidAddress,))
        def send_email(job: JobContext) -> None:
            mailer.send(job.payload["to"], idempotency_key=job.deduplication_key)
    """

    def __init__(
        self,
        model: object,
        *,
        handlers: Mapping[str, Handler] | None = None,
        backoff: Backoff | None = None,
        rate_log: object | None = None,
        steps: object | None = None,
        dependencies: object | None = None,
    ) -> None:
        self._table = resolve_table(model)
        self._rate_log = None if rate_log is None else resolve_table(rate_log)
        self._steps = None if steps is None else resolve_table(steps)
        self._dependencies = None if dependencies is None else resolve_table(dependencies)
        self._limits: dict[str, Limit] = {}
        self.model = model
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgumentType(f"backoff must be a Backoff, got {type(backoff).__name__}")
        self.backoff: Backoff = backoff or DEFAULT_BACKOFF
        self._specs: dict[str, HandlerSpec] = {}
        self._schedules: dict[str, Schedule] = {}
        if handlers is not None:
            if not isinstance(handlers, Mapping):
                raise InvalidArgumentType(
                    f"handlers must be a mapping of kind to handler, got {type(handlers).__name__}"
                )
            for kind, function in handlers.items():
                self.register(kind, function)

    @property
    def table(self) -> Table:
        """The job table."""
        return self._table

    @property
    def steps_table(self) -> Table | None:
        """The `JobStepMixin` table durable steps record in (``steps=``), if any."""
        return self._steps

    @property
    def dependencies_table(self) -> Table | None:
        """The `JobDependencyMixin` table of jobs waiting for others (``dependencies=``)."""
        return self._dependencies

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds that have a handler, in registration order."""
        return tuple(self._specs)

    def register(
        self,
        kind: str,
        function: Handler,
        *,
        timeout: dt.timedelta | float | None = None,
        backoff: Backoff | wait_base | None = None,
        parse: Callable[[Any], Any] | None = None,
        permanent: tuple[type[BaseException], ...] = (),
    ) -> HandlerSpec:
        """Register ``function`` for ``kind`` (once per kind); see the class for the options.

        Examples:
            app.register("resize-image", resize_image, timeout=120)
        """
        spec = HandlerSpec.build(
            kind,
            function,
            timeout=timeout,
            backoff=backoff,
            parse=parse,
            permanent=permanent,
            default_backoff=self.backoff,
        )
        if spec.kind in self._specs:
            raise InvalidArgument(f"job kind {spec.kind!r} already has a handler")
        self._specs[spec.kind] = spec
        return spec

    def handler(
        self,
        kind: str,
        *,
        timeout: dt.timedelta | float | None = None,
        backoff: Backoff | wait_base | None = None,
        parse: Callable[[Any], Any] | None = None,
        permanent: tuple[type[BaseException], ...] = (),
    ) -> Callable[[F], F]:
        """Decorator: register the function for ``kind`` and return it unchanged.

        Examples:
            @app.handler("send-email", timeout=30)
            def send_email(job: JobContext) -> None: ...
        """

        def decorate(function: F) -> F:
            self.register(
                kind, function, timeout=timeout, backoff=backoff, parse=parse, permanent=permanent
            )
            return function

        return decorate

    # -- periodic jobs -------------------------------------------------------------------

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules of periodic jobs, in registration order; each says its
        ``next_tick(now)``."""
        return tuple(self._schedules.values())

    def schedule(
        self,
        cron: str | None = None,
        *,
        kind: str,
        every: dt.timedelta | float | None = None,
        name: str | None = None,
        tz: str | None = None,
        queue: str = DEFAULT_QUEUE,
        payload: Any = None,
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        missed: Missed = "skip",
        backfill: int | None = None,
    ) -> Schedule:
        """Enqueue a job of ``kind`` at every tick of ``cron`` (in ``tz``, UTC by default;
        needs ``pip install "sa-outbox[cron]"``) or ``every`` interval; the kind's handler is
        registered on its own (or by another app). ``name`` (default: the kind) must be unique
        in the app: it makes the ticks' deduplication keys. See `Schedule` for ``missed`` and
        ``backfill``; the job gets ``queue``, ``payload``, ``priority``, ``max_attempts``,
        and ``run_at`` = the tick.

        Examples:
            app.schedule("0 3 * * *", kind="cleanup", tz="Europe/Lisbon")
        """
        schedule = Schedule.build(
            kind,
            cron,
            every=every,
            name=name,
            tz=tz,
            queue=queue,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            missed=missed,
            backfill=backfill,
        )
        self._add_schedule(schedule)
        return schedule

    def _add_schedule(self, schedule: Schedule) -> None:
        if schedule.name in self._schedules:
            raise InvalidArgument(
                f"a schedule named {schedule.name!r} already exists: give the second one "
                "another name= (two schedules of one kind need names of their own)"
            )
        self._schedules[schedule.name] = schedule

    def periodic(
        self,
        cron: str | None = None,
        *,
        kind: str,
        every: dt.timedelta | float | None = None,
        name: str | None = None,
        tz: str | None = None,
        queue: str = DEFAULT_QUEUE,
        payload: Any = None,
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        missed: Missed = "skip",
        backfill: int | None = None,
        timeout: dt.timedelta | float | None = None,
    ) -> Callable[[F], F]:
        """Decorator: the function is the handler of ``kind`` (with ``timeout``), and a job
        of that kind is enqueued at every tick (the options of `schedule`). Placed above
        ``@app.handler(kind, ...)`` on the same function, it adds only the schedule, so the
        handler keeps all of `handler`'s options. Bad input raises here, at registration.

        Examples:
            @app.periodic("*/5 * * * *", kind="report", tz="Europe/Lisbon")
            def report(job: JobContext) -> None: ...
        """
        schedule = Schedule.build(
            kind,
            cron,
            every=every,
            name=name,
            tz=tz,
            queue=queue,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            missed=missed,
            backfill=backfill,
        )

        def decorate(function: F) -> F:
            spec = self._specs.get(schedule.kind)
            stacked = spec is not None and spec.function is function
            if stacked and timeout is not None:
                raise InvalidArgument(
                    f"kind {schedule.kind!r}: give timeout= to @app.handler, not to "
                    "@app.periodic, when both decorate the handler"
                )
            if schedule.name in self._schedules:
                self._add_schedule(schedule)  # raises, before the handler is registered
            if not stacked:
                self.register(schedule.kind, function, timeout=timeout)
            self._add_schedule(schedule)
            return function

        return decorate

    # -- limits ----------------------------------------------------------------------------

    def limit(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        running: int | None = None,
        by: str | None = None,
        rate: int | None = None,
        per: dt.timedelta | float | None = None,
    ) -> Limit:
        """Limit the jobs of ``kind`` (or ``queue``) across every worker of this table.

        ``running=N``: at most N run at once (per value of ``payload[by]`` when ``by`` is
        given); ``rate=R, per=P``: at most R start in any window of P (needs the app's
        ``rate_log``). Every worker's claim obeys it in its own SQL (`Limit`,
        `sa_outbox.statements.lock_claim_limits`), so all the workers of a table must be
        given the same limits: declare them where the app is defined. One `limit` per kind
        or queue; bad input raises here.

        Examples:
            app.limit(kind="call-partner-api", running=10, rate=100, per=60)
            app.limit(kind="sync-account", running=1, by="account_id")
            app.limit(queue="imports", running=2)
        """
        lim = Limit(kind=kind, queue=queue, running=running, by=by, rate=rate, per=per)  # type: ignore[arg-type]
        if lim.scope in self._limits:
            raise InvalidArgument(
                f"{lim.scope} is limited already: give one limit() per kind or queue, "
                "with every option it needs"
            )
        if lim.rate is not None and self._rate_log is None:
            raise InvalidArgument(
                f"{lim.scope} has a rate limit: give JobApp a rate_log= table "
                "(a model of sa_outbox.RateLimitLogMixin) to count its claims in"
            )
        self._limits[lim.scope] = lim
        return lim

    @property
    def limits(self) -> ClaimLimits | None:
        """The app's limits for the claim (`ClaimLimits`), or ``None`` when it has none."""
        if not self._limits:
            return None
        return ClaimLimits(tuple(self._limits.values()), log=self._rate_log)

    def get(self, kind: str) -> HandlerSpec | None:
        """The spec registered for ``kind``, or ``None``."""
        return self._specs.get(kind)

    def __getitem__(self, kind: str) -> HandlerSpec:
        return self._specs[kind]

    def __contains__(self, kind: object) -> bool:
        return kind in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        shown = f"JobApp({self._table.fullname!r}, kinds={list(self._specs)!r}"
        if self._schedules:
            shown += f", schedules={list(self._schedules)!r}"
        if self._limits:
            shown += f", limits={list(self._limits)!r}"
        return shown + ")"
