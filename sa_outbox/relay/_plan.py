"""The pure part of one relay cycle: waves of a claimed batch, and what becomes of each event.

A claimed batch holds, for each aggregate, a run of consecutive events that starts at the
aggregate's oldest unpublished one. `BatchPlan` publishes it in *waves*: wave ``k`` holds the
``k``-th event of every aggregate still going, so no wave holds two events of one aggregate,
and an aggregate's event goes out only after the one before it was confirmed. An event that
fails stops its aggregate: the events after it are given back untried (they keep their
order, behind the failed one). A broker that cannot be reached stops the whole batch.

Examples:
    >>> import uuid
    >>> from sa_outbox.queue import ClaimedEvent
    >>> def event(n, aggregate):
    ...     return ClaimedEvent(uuid.UUID(int=n), n, "E", "order", aggregate, {}, {}, 1, None,
    ...                         uuid.UUID(int=100 + n), None)
    >>> plan = BatchPlan([event(1, "a"), event(2, "b"), event(3, "a"), event(4, "a")])
    >>> [e.seq for e in plan.next_wave()]
    [1, 2]
    >>> plan.published(plan.next_wave()); plan.reject(event(3, "a"), "nack")
    >>> [e.seq for e in plan.next_wave()]
    []
    >>> plan.report("relay-1").published, plan.report("relay-1").released
    (2, 1)
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import deque
from collections.abc import Iterable, Sequence

from ..queue import ClaimedEvent

__all__ = ["BatchPlan", "RelayReport"]

Pair = tuple[uuid.UUID, uuid.UUID]


@dataclasses.dataclass(frozen=True, slots=True)
class RelayReport:
    """What one relay cycle (`Relay.run_once`) did, in numbers of events.

    ``claimed`` = ``published`` + ``rejected`` + ``released``. ``parked`` counts the rejected
    events that reached ``max_attempts``; ``lost`` the events whose relay lease had passed
    to another relay by the time this one wrote their outcome (they were left alone).
    ``unavailable`` holds the error when the broker could not be reached (the events were
    given back, their attempt not counted); the relay then backs off.

    Examples:
        >>> report = RelayReport("relay-1", claimed=3, published=2, rejected=1)
        >>> report.idle, report.unavailable is None
        (False, True)
    """

    relay: str
    claimed: int = 0
    published: int = 0
    rejected: int = 0
    parked: int = 0
    released: int = 0
    lost: int = 0
    unavailable: str | None = None
    #: The ids published, in the order they were confirmed.
    published_ids: tuple[uuid.UUID, ...] = ()
    #: The ids of the rejected events that were parked.
    parked_ids: tuple[uuid.UUID, ...] = ()

    @property
    def idle(self) -> bool:
        """True when there was nothing to claim."""
        return self.claimed == 0


def _aggregate(event: ClaimedEvent) -> tuple[str, str]:
    return (event.aggregate_type, event.aggregate_id)


class BatchPlan:
    """Waves of a claimed batch and the outcome of each event (see the module docstring).

    Examples:
        >>> BatchPlan([]).next_wave()
        []
    """

    def __init__(self, events: Iterable[ClaimedEvent]) -> None:
        self.claimed = sorted(events, key=lambda e: e.seq)
        self._runs: dict[tuple[str, str], deque[ClaimedEvent]] = {}
        for event in self.claimed:
            self._runs.setdefault(_aggregate(event), deque()).append(event)
        self._published: list[ClaimedEvent] = []
        self._rejected: list[tuple[ClaimedEvent, str]] = []
        self._unreachable: list[ClaimedEvent] = []
        self._untried: list[ClaimedEvent] = []
        self.unavailable: str | None = None

    def next_wave(self) -> list[ClaimedEvent]:
        """The next untried event of every aggregate still going, in ``seq`` order."""
        return sorted((run[0] for run in self._runs.values() if run), key=lambda e: e.seq)

    def _take(self, event: ClaimedEvent) -> deque[ClaimedEvent]:
        run = self._runs[_aggregate(event)]
        if not run or run[0].id != event.id:
            raise ValueError(f"event {event.id} is not the next of its aggregate in this batch")
        run.popleft()
        return run

    def published(self, events: Sequence[ClaimedEvent]) -> None:
        """The broker took ``events`` (each the next of its aggregate)."""
        for event in events:
            self._take(event)
            self._published.append(event)

    def reject(self, event: ClaimedEvent, error: str) -> None:
        """The broker refused ``event``: its aggregate stops; the rest of it goes back."""
        run = self._take(event)
        self._rejected.append((event, error))
        self._untried.extend(run)
        run.clear()

    def unreachable(self, events: Sequence[ClaimedEvent], error: str) -> None:
        """The broker could not be reached while publishing ``events``: everything stops."""
        for event in events:
            self._take(event)
            self._unreachable.append(event)
        self.unavailable = error
        self.stop()

    def stop(self) -> None:
        """Give every untried event back (the relay is stopping, or its lease runs out)."""
        for run in self._runs.values():
            self._untried.extend(run)
            run.clear()

    @property
    def done(self) -> bool:
        """True when no aggregate has an untried event left."""
        return not any(self._runs.values())

    @property
    def published_events(self) -> list[ClaimedEvent]:
        """The events the broker took, in the order it confirmed them."""
        return list(self._published)

    @property
    def rejected_events(self) -> list[ClaimedEvent]:
        """The events the broker refused."""
        return [event for event, _error in self._rejected]

    def published_pairs(self) -> list[Pair]:
        """(id, relay_token) of the events to mark published."""
        return [(e.id, e.relay_token) for e in self._published]

    def rejected_triples(self) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
        """(id, relay_token, error) of the events to record as rejected."""
        return [(e.id, e.relay_token, error) for e, error in self._rejected]

    def unreachable_pairs(self) -> list[Pair]:
        """(id, relay_token) of the events tried while the broker was unreachable."""
        return [(e.id, e.relay_token) for e in self._unreachable]

    def untried_pairs(self) -> list[Pair]:
        """(id, relay_token) of the events never tried in this cycle."""
        return [(e.id, e.relay_token) for e in self._untried]

    def report(
        self,
        relay: str,
        *,
        parked: int = 0,
        lost: int = 0,
        parked_ids: tuple[uuid.UUID, ...] = (),
    ) -> RelayReport:
        """The cycle's `RelayReport`."""
        return RelayReport(
            relay=relay,
            claimed=len(self.claimed),
            published=len(self._published),
            rejected=len(self._rejected),
            parked=parked,
            released=len(self._unreachable) + len(self._untried),
            lost=lost,
            unavailable=self.unavailable,
            published_ids=tuple(e.id for e in self._published),
            parked_ids=parked_ids,
        )
