"""The reclaimer: expired leases go back to ``pending`` with backoff, or to ``failed``.

A job whose worker died (SIGKILL, a lost machine) or stalled past its lease stays
``running`` until someone reclaims it. Every `Worker` runs a reclaimer (every half lease by
default, with jitter); `Reclaimer` and `AsyncReclaimer` also run alone, for deployments that
keep maintenance apart. Many reclaimers at once are safe: the statement skips rows another
one holds. The delay it gives is the app's `Backoff`, computed in SQL from the job's
attempts, so a job that kills every worker that takes it comes back later and later, and
ends ``failed`` at ``max_attempts`` instead of looping hot.

Examples:
    reclaimer = Reclaimer(app, engine, interval=15)
    reclaimer.run_once()   # one pass, now
    reclaimer.run()        # until stop() / SIGTERM
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime as dt
import logging
import threading
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._backoff import Backoff
from .._clock import Clock
from .._connect_args import harden
from .._pooler import note_prepared_statement_error, prepare_for_pooler
from .._validation import count, duration
from ..queue import AsyncJobQueue, JobQueue, ReclaimedJob
from ..schema import JobStatus
from ..statements import DEFAULT_BACKOFF
from ._retry import async_retrying, retrying
from ._settings import check_engine, jittered
from ._signals import install_stop_signals
from .metrics import WorkerMetrics
from .registry import JobApp

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: F401 (named in _Base["AsyncEngine"])

__all__ = ["AsyncReclaimer", "Reclaimer"]

log = logging.getLogger("sa_outbox.worker")


def _model_and_backoff(
    source: object, backoff: Backoff | None
) -> tuple[object, Backoff, object | None]:
    """The job model, the backoff and the steps model (its failed jobs are announced to
    the waiters for results) of a `JobApp`, or of a bare model."""
    if isinstance(source, JobApp):
        return source.model, backoff or source.backoff, source.steps_table
    return source, backoff or DEFAULT_BACKOFF, None


E = TypeVar("E")


class _Base(abc.ABC, Generic[E]):
    def __init__(
        self,
        source: object,
        engine: E,
        *,
        interval: dt.timedelta | float = 15.0,
        limit: int = 1000,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._check(engine)
        self.model, self.backoff, self.steps = _model_and_backoff(source, backoff)
        self.interval = duration(interval, "interval").total_seconds()
        self.limit = count(limit, "limit")
        self.clock = clock
        self.metrics = metrics
        self.engine = engine
        harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
        self._ready()

    def _check(self, engine: E) -> None:
        """Refuse a wrong engine before anything is done with it."""

    @abc.abstractmethod
    def _ready(self) -> None:
        """Build the queue and the stop event of this kind of reclaimer."""

    def _report(self, batch: list[ReclaimedJob]) -> None:
        if not batch:
            return
        failed = sum(1 for job in batch if job.status is JobStatus.FAILED)
        log.warning(
            "reclaimed %d expired leases (%d back to pending, %d failed at max_attempts)",
            len(batch),
            len(batch) - failed,
            failed,
        )
        self._hook("reclaimed", len(batch) - failed, failed)

    def _hook(self, name: str, *args: Any) -> None:
        if self.metrics is not None:
            try:
                getattr(self.metrics, name)(*args)
            except Exception:
                log.exception("metrics hook %s raised", name)

    def _database_error(self, operation: str, error: BaseException) -> None:
        note_prepared_statement_error(getattr(self, "engine", None), error)  # see _pooler
        self._hook("database_error", operation, error)


class Reclaimer(_Base["Engine"]):
    """Return expired leases, now (`run_once`) or every ``interval`` seconds (`run`).

    ``source`` is a `JobApp` (its model and backoff) or a job model / table.

    Examples:
        reclaimer = Reclaimer(app, engine)
        returned = reclaimer.run_once()
    """

    def _check(self, engine: Engine) -> None:
        check_engine(engine, "Reclaimer")

    def _ready(self) -> None:
        self.queue = JobQueue(self.model, clock=self.clock, backoff=self.backoff, steps=self.steps)
        self._stop = threading.Event()

    def run_once(self) -> list[ReclaimedJob]:
        """Reclaim every expired lease, ``limit`` per transaction; returns them all."""
        reclaimed: list[ReclaimedJob] = []
        while True:
            with self.engine.begin() as conn:
                batch = self.queue.reclaim_expired(conn, limit=self.limit)
            self._report(batch)
            reclaimed.extend(batch)
            if len(batch) < self.limit:
                return reclaimed

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Reclaim every ``interval`` (± 20 %) until `stop` (or SIGTERM / SIGINT)."""
        restore = install_stop_signals(lambda _: self.stop()) if install_signal_handlers else None
        try:
            attempt = retrying(
                "reclaim",
                stop=self._stop.is_set,
                sleep=self._stop.wait,  # type: ignore[arg-type]
                report=self._database_error,
            )
            while not self._stop.is_set():
                attempt(self.run_once)
                self._stop.wait(jittered(self.interval))
        finally:
            if restore is not None:
                restore()

    def stop(self) -> None:
        """Ask `run` to return."""
        self._stop.set()


class AsyncReclaimer(_Base["AsyncEngine"]):
    """`Reclaimer` for asyncio, on an `AsyncEngine`.

    Examples:
        reclaimer = AsyncReclaimer(app, async_engine)
        await reclaimer.run_once()
    """

    def _ready(self) -> None:
        self.queue = AsyncJobQueue(
            self.model, clock=self.clock, backoff=self.backoff, steps=self.steps
        )
        self._stop: asyncio.Event | None = None

    async def run_once(self) -> list[ReclaimedJob]:
        """See `Reclaimer.run_once`."""
        reclaimed: list[ReclaimedJob] = []
        while True:
            async with self.engine.begin() as conn:
                batch = await self.queue.reclaim_expired(conn, limit=self.limit)
            self._report(batch)
            reclaimed.extend(batch)
            if len(batch) < self.limit:
                return reclaimed

    async def run(self) -> None:
        """See `Reclaimer.run` (signals are the caller's: call `stop`)."""
        stop = self._stop = asyncio.Event()

        async def sleep(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

        attempt = async_retrying(
            "reclaim", stop=stop.is_set, sleep=sleep, report=self._database_error
        )
        while not stop.is_set():
            await attempt(self.run_once)
            await sleep(jittered(self.interval))

    def stop(self) -> None:
        """Ask `run` to return."""
        if self._stop is not None:
            self._stop.set()
