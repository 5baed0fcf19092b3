"""Metrics hooks of the relay: what `Relay` and `AsyncRelay` report, for an exporter to count.

Subclass `RelayMetrics` and override what you need (each method is a no-op here), or use
`CountingRelayMetrics`, which counts in memory; ``sa_outbox.metrics`` has the Prometheus
one. The hooks are called from the relay's own thread (or its event loop, for
`AsyncRelay`): keep them fast. An exception a hook raises is logged and otherwise ignored.

Examples:
    >>> metrics = CountingRelayMetrics()
    >>> metrics.batch_claimed(3, 0.002)
    >>> metrics.publish_finished(3, PublishOutcome.PUBLISHED, 0.01)
    >>> metrics.totals["claimed"], metrics.publishes[PublishOutcome.PUBLISHED]
    (3, 1)
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
import uuid
from collections.abc import Sequence

from ..queue import ClaimedEvent
from ._plan import BatchPlan, RelayReport
from ._publisher import EventsRejected, PublisherUnavailable

__all__ = ["CountingRelayMetrics", "PublishOutcome", "RelayMetrics"]

LOGGER = logging.getLogger("sa_outbox.relay")


class PublishOutcome(enum.StrEnum):
    """How one call of the publisher (a wave of events, or one tried alone) ended.

    Examples:
        >>> [str(o) for o in PublishOutcome]
        ['published', 'rejected', 'unavailable', 'error']
    """

    #: The broker took every event of the call.
    PUBLISHED = "published"
    #: The broker refused some of them (`EventsRejected`); the others were taken.
    REJECTED = "rejected"
    #: The broker could not be reached, or the call timed out (`PublisherUnavailable`).
    UNAVAILABLE = "unavailable"
    #: Any other exception (an event the broker cannot take, a bug in the publisher).
    ERROR = "error"

    @classmethod
    def of(cls, error: BaseException | None) -> PublishOutcome:
        """The outcome of a call that raised ``error`` (``None``: none)."""
        if error is None:
            return cls.PUBLISHED
        if isinstance(error, EventsRejected):
            return cls.REJECTED
        if isinstance(error, PublisherUnavailable):
            return cls.UNAVAILABLE
        return cls.ERROR


class RelayMetrics:
    """The hooks a relay calls; every method does nothing unless overridden.

    Examples:
        class MyMetrics(RelayMetrics):
            def event_published(self, event, lag):
                PUBLISHED.labels(event.event_type).inc()
                LAG.labels(event.event_type).observe(lag)

        relay = Relay(engine, OutboxEvent, publisher, metrics=MyMetrics())
    """

    def batch_claimed(self, claimed: int, seconds: float) -> None:
        """A claim took ``claimed`` events (more than zero) in ``seconds``."""

    def publish_finished(self, events: int, outcome: PublishOutcome, seconds: float) -> None:
        """One call of the publisher with ``events`` events ended ``outcome`` after
        ``seconds``."""

    def event_published(self, event: ClaimedEvent, lag: float) -> None:
        """The broker took ``event``, ``lag`` seconds after the relay claimed it."""

    def event_rejected(self, event: ClaimedEvent, parked: bool) -> None:
        """The broker refused ``event``; ``parked`` when that was its last attempt."""

    def cycle_finished(self, report: RelayReport, seconds: float) -> None:
        """A cycle that claimed something ended (its writes committed) after ``seconds``."""


class CountingRelayMetrics(RelayMetrics):
    """`RelayMetrics` that count in memory: ``totals[name]`` (claimed, published, rejected,
    parked, released, lost, cycles), ``publishes[outcome]``, and per event type
    ``published[event_type]`` / ``rejected[event_type]`` / ``parked[event_type]``.

    Examples:
        >>> m = CountingRelayMetrics()
        >>> m.cycle_finished(RelayReport("r", claimed=2, published=2), 0.01)
        >>> m.totals["published"], m.totals["cycles"]
        (2, 1)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: collections.Counter[str] = collections.Counter()
        self.publishes: collections.Counter[PublishOutcome] = collections.Counter()
        self.published: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.parked: collections.Counter[str] = collections.Counter()
        self.lags: list[float] = []

    def batch_claimed(self, claimed: int, seconds: float) -> None:
        with self._lock:
            self.totals["claimed"] += claimed

    def publish_finished(self, events: int, outcome: PublishOutcome, seconds: float) -> None:
        with self._lock:
            self.publishes[outcome] += 1

    def event_published(self, event: ClaimedEvent, lag: float) -> None:
        with self._lock:
            self.published[event.event_type] += 1
            self.lags.append(lag)

    def event_rejected(self, event: ClaimedEvent, parked: bool) -> None:
        with self._lock:
            self.rejected[event.event_type] += 1
            if parked:
                self.parked[event.event_type] += 1

    def cycle_finished(self, report: RelayReport, seconds: float) -> None:
        with self._lock:
            self.totals["cycles"] += 1
            for name in ("published", "rejected", "parked", "released", "lost"):
                self.totals[name] += getattr(report, name)


class CycleRecorder:
    """What one cycle tells its relay's `RelayMetrics`: times the claim, each publish and
    the cycle, and reports each event once the cycle's writes committed.

    Examples:
        >>> recorder = CycleRecorder(None)
        >>> recorder.claimed([])
    """

    def __init__(self, metrics: RelayMetrics | None) -> None:
        self.metrics = metrics
        self.started = time.monotonic()
        self._claimed_at = self.started
        self._began = self.started
        self._confirmed: dict[uuid.UUID, float] = {}

    def _call(self, hook: str, *args: object) -> None:
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, hook)(*args)
        except Exception:
            LOGGER.exception("relay metrics: %s raised; ignored", hook)

    def claimed(self, events: Sequence[ClaimedEvent]) -> None:
        """The claim returned ``events`` (nothing is reported for an empty claim)."""
        self._claimed_at = time.monotonic()
        if events:
            self._call("batch_claimed", len(events), self._claimed_at - self.started)

    def published(
        self, plan: BatchPlan, wave: Sequence[ClaimedEvent], error: BaseException | None
    ) -> None:
        """The publish of ``wave`` begun at `publishing` ended with ``error`` (``None``: the
        broker took it all), and `settle` recorded that in ``plan``."""
        now = time.monotonic()
        self._call("publish_finished", len(wave), PublishOutcome.of(error), now - self._began)
        for event in plan.published_events[len(self._confirmed) :]:
            self._confirmed[event.id] = now - self._claimed_at

    def publishing(self) -> None:
        """A publish starts now."""
        self._began = time.monotonic()

    def finished(self, plan: BatchPlan, report: RelayReport) -> None:
        """The cycle's writes committed: each event's fate, then the cycle."""
        if self.metrics is None:
            return
        for event in plan.published_events:
            self._call("event_published", event, self._confirmed.get(event.id, 0.0))
        parked = set(report.parked_ids)
        for event in plan.rejected_events:
            self._call("event_rejected", event, event.id in parked)
        self._call("cycle_finished", report, time.monotonic() - self.started)
