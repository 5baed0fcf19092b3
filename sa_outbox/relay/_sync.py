"""`Relay`: the outbox relay on a synchronous engine (layer 4, a runtime).

Examples:
    relay = Relay(engine, OutboxEvent, RabbitMQPublisher("amqp://guest:guest@localhost/"))
    relay.run()  # until relay.stop(), SIGTERM with `sa-outbox relay`
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import tenacity
from sqlalchemy import URL, Engine, Table
from sqlalchemy.exc import DBAPIError

from .._backoff import Backoff
from .._clock import Clock
from .._connect_args import harden
from .._exceptions import InvalidArgumentType
from .._pooler import prepare_for_pooler
from ..maintenance._vacuum import DEFAULT_VACUUM, Vacuumer, VacuumPolicy, VacuumReport
from ..ops import OutboxOps as _OutboxOps
from ..ops import run as _drive
from ..queue import ClaimedEvent
from ..statements import DEFAULT_MAX_PAYLOAD_BYTES
from ._config import DEFAULT_RETENTION, RelaySettings
from ._core import (
    LOGGER,
    RESET_TIMEOUT,
    GuardedPublisher,
    describe,
    finish,
    retry_wait,
    retryable,
    settle,
)
from ._listen import DEAF_WARNING, SyncListener, WakePipe
from ._plan import BatchPlan, RelayReport
from ._publisher import Publisher, PublisherUnavailable
from ._spans import end_publish_spans, traced_wave
from .metrics import CycleRecorder, RelayMetrics

__all__ = ["Relay"]

T = TypeVar("T")


class _Portal:
    """An event loop in a thread of its own, on which the (async) publisher runs.

    It lives as long as the relay, so broker connections stay open between batches (their
    heartbeats keep being answered while the relay waits for work).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name=f"sa-outbox relay {self._name}", daemon=True
            )
            self._thread.start()
            self._loop = loop
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # cancels the task on the loop (which resets a guarded publish)
            raise PublisherUnavailable(f"the publisher did not finish within {timeout} s") from None

    def close(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join()
        self._loop.close()
        self._loop = None


class Relay:
    """Publishes committed outbox events through ``publisher``: claim → publish → mark.

    Each cycle (`run_once`) claims up to ``batch`` events (aggregate heads and the events
    after them, see `sa_outbox.statements.claim_events`), publishes them in waves that
    keep each aggregate's order, and in one transaction marks what the broker took,
    records what it rejected (backoff, then parked at ``max_attempts``) and gives back the
    rest. `run` repeats it: at once while events keep coming, else it waits for a NOTIFY
    from the outbox table (``listen``) or ``poll_interval``; when the broker or the
    database cannot be reached it backs off (tenacity: exponential with jitter, from
    ``retry_initial`` to ``retry_max``); every ``prune_interval`` it deletes events
    published more than ``retention`` ago (``None``: never); and it vacuums the outbox
    table past ``vacuum.threshold`` dead tuples (`sa_outbox.Vacuumer`; ``None``: never),
    because every published event leaves a dead entry in the index that claims walk.

    ``lease``: how long a claim holds its events; another relay takes them over after it
    (so a relay killed mid-batch loses nothing). ``publish_timeout`` (default half the
    lease) bounds one publish: a publish that does not finish in time counts as the broker
    being unreachable, and no wave starts unless it can finish within the lease.
    ``clock`` is for tests (`FakeClock`), ``backoff`` is a rejected event's delay.
    ``metrics``: the `RelayMetrics` hooks each cycle calls (claim, each publish, each
    event's fate; ``sa_outbox.metrics.PrometheusRelayMetrics`` counts them for Prometheus).
    ``listen_url``: a direct PostgreSQL URL for the LISTEN connection alone, when the
    engine goes through a transaction pooler such as PgBouncer (docs/pgbouncer.md); without
    it, a LISTEN through a pooler is detected and warned about once, and the relay polls.

    The publisher (async, as every publisher is) runs on an event loop in a thread of the
    relay's own. Use `AsyncRelay` from asyncio code.

    Examples:
        from sa_outbox.publishers.callable import CallablePublisher

        relay = Relay(engine, OutboxEvent, CallablePublisher(print), batch=100)
        report = relay.run_once()  # one cycle, for scripts and tests
        relay.run()  # until relay.stop()

        # behind PgBouncer (transaction mode): LISTEN on a direct connection
        Relay(pooled_engine, OutboxEvent, publisher, listen_url=os.environ["DIRECT_URL"])
    """

    def __init__(
        self,
        engine: Engine,
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
        if not isinstance(engine, Engine):
            raise InvalidArgumentType(
                f"Relay needs a synchronous Engine, got {type(engine).__name__} "
                "(use AsyncRelay with an AsyncEngine)"
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
        self._portal = _Portal(self.settings.name)
        self._stopping = threading.Event()
        self._wake = WakePipe()
        self._listener: SyncListener | None = None
        #: Set while the relay's LISTEN connection is open (``listen=True``, in `run`):
        #: ``relay.listening.wait(10)`` after starting `run` elsewhere.
        self.listening = threading.Event()
        self._next_prune = 0.0
        self._vacuumer = None if vacuum is None else Vacuumer(engine, model, vacuum)

    @property
    def name(self) -> str:
        """The relay's name in logs and reports (default ``host:pid``)."""
        return self.settings.name

    @property
    def table(self) -> Table:
        """The outbox table the relay publishes."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"Relay({self._ops.table.fullname!r}, {self.publisher!r}, name={self.name!r})"

    # -- one cycle --------------------------------------------------------------------

    def run_once(self) -> RelayReport:
        """Claim one batch, publish it, and record the outcome; returns what it did.

        Examples:
            report = relay.run_once()
            print(report.published, "published,", report.parked, "parked")
        """
        s = self.settings
        recorder = CycleRecorder(self.metrics)
        with self.engine.begin() as conn:
            events = _drive(conn, self._ops.claim(s.batch, s.lease, s.per_aggregate))
        recorder.claimed(events)
        if not events:
            return RelayReport(self.name)
        deadline = time.monotonic() + (s.lease - s.publish_timeout).total_seconds()
        plan = BatchPlan(events)
        while not plan.done:
            if self._stopping.is_set() or time.monotonic() > deadline:
                plan.stop()  # not enough lease left to publish another wave safely
                break
            for isolated in self._publish(plan, plan.next_wave(), recorder):
                self._publish(plan, [isolated], recorder)
                if plan.unavailable:
                    break
        with self.engine.begin() as conn:
            report = _drive(conn, finish(self._ops, plan, self.name, s.max_attempts))
        _log(report)
        recorder.finished(plan, report)
        return report

    def _publish(
        self, plan: BatchPlan, wave: list[ClaimedEvent], recorder: CycleRecorder
    ) -> list[ClaimedEvent]:
        error: BaseException | None = None
        sent, spans = traced_wave(wave)
        recorder.publishing()
        # The publish is bounded on the loop, where a timeout also resets the publisher;
        # the outer bound is only a guard against a publisher that ignores cancellation.
        guard = self.settings.publish_timeout.total_seconds() + RESET_TIMEOUT + 1.0
        try:
            self._portal.call(self._guarded.publish(self.publisher, sent), guard)
        except Exception as exc:
            error = exc
        if spans is not None:
            end_publish_spans(spans, error)
        isolated = settle(plan, wave, error)
        recorder.published(plan, wave, error)
        return isolated

    def prune_once(self) -> int:
        """Delete the events published more than ``retention`` ago, in batches; returns how
        many. Parked and unpublished events are never deleted.

        Examples:
            deleted = relay.prune_once()
        """
        retention = self.settings.retention
        if retention is None:
            return 0
        deleted = 0
        while True:
            with self.engine.begin() as conn:
                n = _drive(conn, self._ops.prune(retention, 1000))
            deleted += n
            if n < 1000:
                return deleted

    def vacuum_once(self) -> VacuumReport | None:
        """Vacuum the outbox table now if it has ``vacuum.threshold`` dead tuples (see
        `sa_outbox.Vacuumer`); ``None`` when the relay was built with ``vacuum=None``.

        Examples:
            report = relay.vacuum_once()
        """
        if self._vacuumer is None:
            return None
        return self._vacuumer.run_once()

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        """Relay until `stop` is called (from a signal handler or another thread).

        Examples:
            signal.signal(signal.SIGTERM, lambda *_: relay.stop())
            relay.run()
        """
        self._stopping.clear()
        self._wake.drain()
        LOGGER.info("relay %s: relaying %s", self.name, self._ops.table.fullname)
        try:
            while not self._stopping.is_set():
                report = self._cycle_with_retries()
                if report is None:
                    break
                self._prune_if_due()
                self._vacuum_if_due()
                if report.claimed == 0 or report.published == 0:
                    self._wait_for_work()
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
                self.listening.clear()
        LOGGER.info("relay %s: stopped", self.name)

    def stop(self) -> None:
        """Ask `run` to return after the current cycle; safe from signal handlers.

        Examples:
            relay.stop()
        """
        self._stopping.set()
        self._wake.wake()

    def close(self) -> None:
        """Stop, close the publisher and the relay's event loop.

        Examples:
            relay.close()
        """
        self.stop()
        try:
            self._portal.call(self.publisher.aclose(), None)
        finally:
            self._portal.close()
            self._wake.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _cycle_with_retries(self) -> RelayReport | None:
        s = self.settings
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(retryable(self.engine)),
            wait=retry_wait(s),
            stop=lambda _state: self._stopping.is_set(),
            sleep=self._pause,
            before_sleep=_log_retry(self.name),
        )
        try:
            for attempt in retrying:
                with attempt:
                    report = self.run_once()
                    if report.unavailable is not None:
                        raise PublisherUnavailable(report.unavailable)
                    return report
        except tenacity.RetryError:
            return None  # stopped while backing off
        return None  # pragma: no cover - the loop always returns or raises

    def _pause(self, seconds: float) -> None:
        if self._stopping.wait(seconds):
            return

    def _prune_if_due(self) -> None:
        now = time.monotonic()
        if self.settings.retention is None or now < self._next_prune:
            return
        self._next_prune = now + self.settings.prune_interval.total_seconds()
        try:
            deleted = self.prune_once()
        except DBAPIError as exc:
            LOGGER.warning("relay %s: pruning failed: %s", self.name, describe(exc))
        else:
            if deleted:
                LOGGER.info("relay %s: pruned %d published events", self.name, deleted)

    def _vacuum_if_due(self) -> None:
        if self._vacuumer is None or not self._vacuumer.due():
            return
        try:
            report = self._vacuumer.run_once()
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

    def _wait_for_work(self) -> None:
        timeout = self.settings.poll_interval.total_seconds()
        if self.settings.listen and self._listener is None:
            try:
                self._listener = SyncListener.open(self.engine, self._ops, self.settings.listen_url)
            except Exception as exc:
                LOGGER.warning("relay %s: cannot LISTEN (%s): polling", self.name, describe(exc))
            else:
                if self._listener is not None:
                    # What committed since the last claim sent its NOTIFY to nobody: claim
                    # again now instead of waiting for the next one.
                    self.listening.set()
                    return
        if self._listener is None:
            self._stopping.wait(timeout)
            return
        try:
            self._listener.wait(timeout, self._wake)
            if self._listener.deaf():
                LOGGER.warning(DEAF_WARNING, self.name, timeout)
        except Exception as exc:  # the connection broke: poll now, listen again next time
            LOGGER.warning("relay %s: LISTEN connection lost (%s)", self.name, describe(exc))
            self.listening.clear()
            self._listener.close()
            self._listener = None
        self._wake.drain()


def _log(report: RelayReport) -> None:
    if report.rejected or report.lost or report.unavailable:
        LOGGER.warning(
            "relay %s: %d published, %d rejected (%d parked), %d released, %d lost%s",
            report.relay,
            report.published,
            report.rejected,
            report.parked,
            report.released,
            report.lost,
            f"; broker unavailable: {report.unavailable}" if report.unavailable else "",
        )
    elif report.published:
        LOGGER.debug("relay %s: %d published", report.relay, report.published)


def _log_retry(name: str) -> Any:
    def log(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        LOGGER.warning(
            "relay %s: %s; trying again in %.1f s",
            name,
            describe(error) if error else "failed",
            delay,
        )

    return log
