"""`AsyncRelay`: the outbox relay on an asyncio engine (layer 4, a runtime).

Examples:
    relay = AsyncRelay(async_engine, OutboxEvent, NatsPublisher("nats://localhost:4222"))
    await relay.run()  # until relay.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from typing import TYPE_CHECKING

import tenacity
from sqlalchemy import URL, Table
from sqlalchemy.exc import DBAPIError

from .._backoff import Backoff
from .._clock import Clock
from .._connect_args import harden
from .._exceptions import InvalidArgumentType
from .._pooler import prepare_for_pooler
from ..maintenance._vacuum import DEFAULT_VACUUM, AsyncVacuumer, VacuumPolicy, VacuumReport
from ..ops import OutboxOps as _OutboxOps
from ..ops import arun as _adrive
from ..queue import ClaimedEvent
from ..statements import DEFAULT_MAX_PAYLOAD_BYTES
from ._config import DEFAULT_RETENTION, RelaySettings
from ._core import (
    LOGGER,
    GuardedPublisher,
    describe,
    finish,
    retry_wait,
    retryable,
    settle,
)
from ._listen import DEAF_WARNING, AsyncListener
from ._plan import BatchPlan, RelayReport
from ._publisher import Publisher, PublisherUnavailable
from ._spans import end_publish_spans, traced_wave
from ._sync import _log, _log_retry
from .metrics import CycleRecorder, RelayMetrics

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["AsyncRelay"]


class AsyncRelay:
    """`Relay` for asyncio: the same cycle, options and guarantees, on an ``AsyncEngine``.

    ``stop`` may be called from the loop, another thread or a signal handler.

    Examples:
        relay = AsyncRelay(async_engine, OutboxEvent, publisher, batch=100)
        report = await relay.run_once()
        task = asyncio.create_task(relay.run())
        ...
        relay.stop()
        await task
        await relay.aclose()
    """

    def __init__(
        self,
        engine: AsyncEngine,
        model: object,
        publisher: Publisher,
        *,
        name: str | None = None,
        batch: int = 100,
        per_aggregate: int | None = None,
        lease: dt.timedelta | float = 30.0,
        publish_timeout: dt.timedelta | float | None = None,
        max_attempts: int = 10,
        backoff: Backoff | None = None,
        poll_interval: dt.timedelta | float = 1.0,
        listen: bool = True,
        retention: dt.timedelta | float | None = DEFAULT_RETENTION,
        prune_interval: dt.timedelta | float = 300.0,
        vacuum: VacuumPolicy | None = DEFAULT_VACUUM,
        retry_initial: dt.timedelta | float = 0.5,
        retry_max: dt.timedelta | float = 30.0,
        clock: Clock | None = None,
        listen_url: str | URL | None = None,
        metrics: RelayMetrics | None = None,
    ) -> None:
        if not hasattr(engine, "sync_engine"):
            raise InvalidArgumentType(
                f"AsyncRelay needs an AsyncEngine, got {type(engine).__name__} "
                "(use Relay with a synchronous Engine)"
            )
        if not isinstance(publisher, Publisher):
            raise InvalidArgumentType(
                f"publisher must have async publish(events) and aclose(), got {publisher!r}"
            )
        self.settings = RelaySettings.build(
            name=name,
            batch=batch,
            per_aggregate=per_aggregate,
            lease=lease,
            publish_timeout=publish_timeout,
            max_attempts=max_attempts,
            backoff=backoff,
            poll_interval=poll_interval,
            listen=listen,
            retention=retention,
            prune_interval=prune_interval,
            retry_initial=retry_initial,
            retry_max=retry_max,
            listen_url=listen_url,
        )
        self.engine = engine
        harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
        if metrics is not None and not isinstance(metrics, RelayMetrics):
            raise InvalidArgumentType(
                f"metrics must be a RelayMetrics (sa_outbox.relay.metrics), got {metrics!r}"
            )
        #: The `RelayMetrics` hooks each cycle calls (``None``: none); may be set later.
        self.metrics = metrics
        self.publisher = publisher
        self._guarded = GuardedPublisher(
            self.settings.name, self.settings.publish_timeout.total_seconds()
        )
        self._ops = _OutboxOps(
            model,
            clock=clock,
            dumps=None,
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
            backoff=self.settings.backoff,
        )
        self._stop_requested = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: AsyncListener | None = None
        #: Set while the relay's LISTEN connection is open (``listen=True``, in `run`):
        #: ``await relay.listening.wait()`` after starting `run` elsewhere.
        self.listening = asyncio.Event()
        self._next_prune = 0.0
        self._vacuumer = None if vacuum is None else AsyncVacuumer(engine, model, vacuum)

    @property
    def name(self) -> str:
        """The relay's name in logs and reports (default ``host:pid``)."""
        return self.settings.name

    @property
    def table(self) -> Table:
        """The outbox table the relay publishes."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"AsyncRelay({self._ops.table.fullname!r}, {self.publisher!r}, name={self.name!r})"

    async def run_once(self) -> RelayReport:
        """See `Relay.run_once`.

        Examples:
            report = await relay.run_once()
        """
        s = self.settings
        recorder = CycleRecorder(self.metrics)
        async with self.engine.begin() as conn:
            events = await _adrive(conn, self._ops.claim(s.batch, s.lease, s.per_aggregate))
        recorder.claimed(events)
        if not events:
            return RelayReport(self.name)
        deadline = time.monotonic() + (s.lease - s.publish_timeout).total_seconds()
        plan = BatchPlan(events)
        while not plan.done:
            if self._stop_requested.is_set() or time.monotonic() > deadline:
                plan.stop()
                break
            for isolated in await self._publish(plan, plan.next_wave(), recorder):
                await self._publish(plan, [isolated], recorder)
                if plan.unavailable:
                    break
        async with self.engine.begin() as conn:
            report = await _adrive(conn, finish(self._ops, plan, self.name, s.max_attempts))
        _log(report)
        recorder.finished(plan, report)
        return report

    async def _publish(
        self, plan: BatchPlan, wave: list[ClaimedEvent], recorder: CycleRecorder
    ) -> list[ClaimedEvent]:
        error: BaseException | None = None
        sent, spans = traced_wave(wave)
        recorder.publishing()
        try:
            # Bounded by publish_timeout; a publish that timed out or was cancelled resets
            # the publisher, so the next one does not reuse a half-open connection.
            await self._guarded.publish(self.publisher, sent)
        except Exception as exc:
            error = exc
        if spans is not None:
            end_publish_spans(spans, error)
        isolated = settle(plan, wave, error)
        recorder.published(plan, wave, error)
        return isolated

    async def prune_once(self) -> int:
        """See `Relay.prune_once`.

        Examples:
            deleted = await relay.prune_once()
        """
        retention = self.settings.retention
        if retention is None:
            return 0
        deleted = 0
        while True:
            async with self.engine.begin() as conn:
                n = await _adrive(conn, self._ops.prune(retention, 1000))
            deleted += n
            if n < 1000:
                return deleted

    async def vacuum_once(self) -> VacuumReport | None:
        """Vacuum the outbox table now if it has ``vacuum.threshold`` dead tuples (see
        `sa_outbox.Vacuumer`); ``None`` when the relay was built with ``vacuum=None``.

        Examples:
            report = await relay.vacuum_once()
        """
        if self._vacuumer is None:
            return None
        return await self._vacuumer.run_once()

    async def run(self) -> None:
        """Relay until `stop` is called.

        Examples:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, relay.stop)
            await relay.run()
        """
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested.is_set():
            self._stop_requested.clear()
        LOGGER.info("relay %s: relaying %s", self.name, self._ops.table.fullname)
        try:
            while not self._stop_requested.is_set():
                report = await self._cycle_with_retries()
                if report is None:
                    break
                await self._prune_if_due()
                await self._vacuum_if_due()
                if report.claimed == 0 or report.published == 0:
                    await self._wait_for_work()
        finally:
            if self._listener is not None:
                await self._listener.close()
                self._listener = None
                self.listening.clear()
            self._loop = None
        LOGGER.info("relay %s: stopped", self.name)

    def stop(self) -> None:
        """Ask `run` to return after the current cycle; safe from any thread.

        Examples:
            relay.stop()
        """
        self._stop_requested.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)

    async def aclose(self) -> None:
        """Stop and close the publisher.

        Examples:
            await relay.aclose()
        """
        self.stop()
        await self.publisher.aclose()

    async def __aenter__(self) -> AsyncRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _cycle_with_retries(self) -> RelayReport | None:
        s = self.settings
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(retryable(self.engine)),
            wait=retry_wait(s),
            stop=lambda _state: self._stop_requested.is_set(),
            sleep=self._pause,
            before_sleep=_log_retry(self.name),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    report = await self.run_once()
                    if report.unavailable is not None:
                        raise PublisherUnavailable(report.unavailable)
                    return report
        except tenacity.RetryError:
            return None
        return None  # pragma: no cover - the loop always returns or raises

    async def _pause(self, seconds: float) -> None:
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _prune_if_due(self) -> None:
        now = time.monotonic()
        if self.settings.retention is None or now < self._next_prune:
            return
        self._next_prune = now + self.settings.prune_interval.total_seconds()
        try:
            deleted = await self.prune_once()
        except DBAPIError as exc:
            LOGGER.warning("relay %s: pruning failed: %s", self.name, describe(exc))
        else:
            if deleted:
                LOGGER.info("relay %s: pruned %d published events", self.name, deleted)

    async def _vacuum_if_due(self) -> None:
        if self._vacuumer is None or not self._vacuumer.due():
            return
        try:
            report = await self._vacuumer.run_once()
        except DBAPIError as exc:
            LOGGER.warning("relay %s: vacuum failed: %s", self.name, describe(exc))
        else:
            for table in report.vacuumed:
                LOGGER.info(
                    "relay %s: vacuumed %s (%d dead tuples)",
                    self.name,
                    table,
                    report.dead_tuples[table],
                )

    async def _wait_for_work(self) -> None:
        assert self._stopping is not None
        timeout = self.settings.poll_interval.total_seconds()
        if self.settings.listen and self._listener is None:
            try:
                self._listener = await AsyncListener.open(
                    self.engine, self._ops, self.settings.listen_url
                )
            except Exception as exc:
                LOGGER.warning("relay %s: cannot LISTEN (%s): polling", self.name, describe(exc))
            else:
                if self._listener is not None:
                    # What committed since the last claim sent its NOTIFY to nobody: claim
                    # again now instead of waiting for the next one.
                    self.listening.set()
                    return
        if self._listener is None:
            await self._pause(timeout)
            return
        try:
            await self._listener.wait(timeout, self._stopping)
            if self._listener.deaf():
                LOGGER.warning(DEAF_WARNING, self.name, timeout)
        except Exception as exc:
            LOGGER.warning("relay %s: LISTEN connection lost (%s)", self.name, describe(exc))
            self.listening.clear()
            await self._listener.close()
            self._listener = None
