# generated from _async.py by tools/async_to_sync.py — do not edit
# (edit _async.py and run `python tools/async_to_sync.py`)
"""`Relay`: the outbox relay on an ``Engine`` (layer 4, a runtime).

Examples:
    relay = Relay(engine, OutboxEvent, NatsPublisher("nats://localhost:4222"))
    relay.run()  # until relay.stop(), SIGTERM with `sa-outbox relay`
"""

from __future__ import annotations

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
from ..maintenance._vacuum import DEFAULT_VACUUM, Vacuumer, VacuumPolicy, VacuumReport
from ..ops import OutboxOps, run
from ..queue import ClaimedEvent
from ..statements import DEFAULT_MAX_PAYLOAD_BYTES
from ._config import DEFAULT_RETENTION, RelaySettings
from ._core import (
    LOGGER,
    RESET_TIMEOUT,
    GuardedPublisher,
    describe,
    finish,
    log_report,
    log_retry,
    require_publisher,
    retry_wait,
    retryable,
    settle,
)
from ._listen import DEAF_WARNING, SyncListener
from ._plan import BatchPlan, RelayReport
from ._publisher import Publisher, PublisherUnavailable
from ._runtime import Portal, StopSignal, require_engine
from ._spans import end_publish_spans, traced_wave
from .metrics import CycleRecorder, RelayMetrics

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["Relay"]


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
        relay.close()

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
        require_engine(engine)
        require_publisher(publisher)
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
        self._ops = OutboxOps(
            model,
            clock=clock,
            dumps=None,
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
            backoff=self.settings.backoff,
        )
        self._portal = Portal(self.settings.name)
        self._stopping = StopSignal()
        self._listener: SyncListener | None = None
        #: Set while the relay's LISTEN connection is open (``listen=True``, in `run`):
        #: ``relay.listening.wait()`` after starting `run` elsewhere.
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
            events = run(conn, self._ops.claim(s.batch, s.lease, s.per_aggregate))
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
            report = run(conn, finish(self._ops, plan, self.name, s.max_attempts))
        log_report(report)
        recorder.finished(plan, report)
        return report

    def _publish(
        self, plan: BatchPlan, wave: list[ClaimedEvent], recorder: CycleRecorder
    ) -> list[ClaimedEvent]:
        error: BaseException | None = None
        sent, spans = traced_wave(wave)
        recorder.publishing()
        # Bounded by publish_timeout; a publish that timed out or was cancelled resets the
        # publisher, so the next one does not reuse a half-open connection. `Portal`'s outer
        # bound (the publisher on a loop in another thread) is only a guard against a
        # publisher that ignores cancellation.
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
                n = run(conn, self._ops.prune(retention, 1000))
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
        self._stopping.begin()
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
            self._stopping.end()
        LOGGER.info("relay %s: stopped", self.name)

    def stop(self) -> None:
        """Ask `run` to return after the current cycle; safe from signal handlers and other
        threads.

        Examples:
            relay.stop()
        """
        self._stopping.set()

    def close(self) -> None:
        """Stop and close the publisher (and, for `Relay`, the event loop it runs on).

        Examples:
            relay.close()
        """
        self.stop()
        try:
            self._portal.close(self.publisher)
        finally:
            self._stopping.close()

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
            sleep=self._stopping.pause,
            before_sleep=log_retry(self.name),
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
            self._stopping.pause(timeout)
            return
        try:
            self._stopping.wait_on(self._listener, timeout)
            if self._listener.deaf():
                LOGGER.warning(DEAF_WARNING, self.name, timeout)
        except Exception as exc:  # the connection broke: poll now, listen again next time
            LOGGER.warning("relay %s: LISTEN connection lost (%s)", self.name, describe(exc))
            self.listening.clear()
            self._listener.close()
            self._listener = None
