"""The one interface every publisher implements, and the two ways a publish can fail.

A publisher is an object with ``async publish(events)`` and ``async aclose()``. The relay
hands ``publish`` a batch in which no two events share an aggregate, so a publisher may send
them concurrently or pipelined; ``publish`` returns once the broker has taken every event
(confirmed it, for brokers that confirm), and raises otherwise:

- `EventsRejected`: the broker refused some events (a nack, an error reply, a 4xx): its
  ``rejected`` maps their ids to the reason; every event *not* in it was published. A
  rejected event backs off and, after ``max_attempts``, is parked.
- `PublisherUnavailable`: the broker could not be reached or did not answer in time: nothing
  of the batch counts as published; the relay keeps the events, backs off and tries again;
  the attempt does not count against ``max_attempts``, so an outage never parks an event.
- anything else: a bug or an error the publisher did not classify. The relay tries the
  batch's events one by one, so the error can be pinned on the event that causes it.

A publish that does not finish within the relay's ``publish_timeout`` is cancelled. Its
connection may then be half-open (the network went silent: no error, no answer), or left
mid-request by the cancellation, so a publisher may also have ``async reset()``: drop its
connection (channel, producer, client) without waiting on the broker, so that the next
publish connects afresh. The relay calls it after every publish that timed out or was
cancelled; `reset_publisher` is that call, and does nothing for a publisher without one
(``reset`` is optional: `Publisher` checks only ``publish`` and ``aclose``).

Examples:
    >>> class Printer:
    ...     async def publish(self, events):
    ...         for event in events:
    ...             print(event.event_type, event.message_id)
    ...     async def aclose(self):
    ...         pass
    >>> isinstance(Printer(), Publisher)
    True
    >>> import asyncio
    >>> asyncio.run(reset_publisher(Printer()))  # no reset(): nothing to do
    False
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from .._exceptions import SaOutboxError
from ..queue import ClaimedEvent

__all__ = [
    "EventsRejected",
    "PublishError",
    "Publisher",
    "PublisherUnavailable",
    "reset_publisher",
]


@runtime_checkable
class Publisher(Protocol):
    """Publishes batches of outbox events to a broker; see the module's documentation.

    Examples:
        class StdoutPublisher:
            async def publish(self, events: Sequence[ClaimedEvent]) -> None:
                for event in events:
                    print(event.message_id, event.event_type, event.payload)

            async def aclose(self) -> None:
                pass

            # optional: drop the connection after a publish timed out or was cancelled
            async def reset(self) -> None:
                pass
    """

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """Publish every event, or raise `EventsRejected` / `PublisherUnavailable`."""
        ...

    async def aclose(self) -> None:
        """Release connections; the relay calls it when it closes."""
        ...


class PublishError(SaOutboxError):
    """Root of the errors a publisher raises to tell the relay what happened.

    Examples:
        >>> issubclass(PublisherUnavailable, PublishError)
        True
    """


class PublisherUnavailable(PublishError):
    """The broker could not be reached or did not answer in time: nothing was published.

    Examples:
        >>> str(PublisherUnavailable("RabbitMQ at 127.0.0.1:5672: connection refused"))
        'RabbitMQ at 127.0.0.1:5672: connection refused'
    """


class EventsRejected(PublishError):
    """The broker refused the events in ``rejected`` (id → reason); the others went out.

    Examples:
        >>> error = EventsRejected({uuid.UUID(int=1): "message too large"})
        >>> print(error)
        the broker rejected 1 event: 00000000-0000-0000-0000-000000000001: message too large
    """

    def __init__(self, rejected: Mapping[uuid.UUID, str]) -> None:
        self.rejected: dict[uuid.UUID, str] = dict(rejected)
        first = next(iter(self.rejected.items()), None)
        detail = "" if first is None else f": {first[0]}: {first[1]}"
        n = len(self.rejected)
        super().__init__(f"the broker rejected {n} event{'s' if n != 1 else ''}{detail}")


async def reset_publisher(publisher: object) -> bool:
    """Call ``publisher.reset()`` if it has one (see the module); returns whether it had.

    Examples:
        >>> import asyncio
        >>> class Connected:
        ...     async def publish(self, events): ...
        ...     async def aclose(self): ...
        ...     async def reset(self):
        ...         print("connection dropped")
        >>> asyncio.run(reset_publisher(Connected()))
        connection dropped
        True
    """
    reset = getattr(publisher, "reset", None)
    if reset is None or not callable(reset):
        return False
    result = reset()
    if inspect.isawaitable(result):
        await result
    return True


def ids_of(events: Sequence[ClaimedEvent]) -> list[uuid.UUID]:
    """The ids of ``events``, in order.

    Examples:
        >>> ids_of([])
        []
    """
    return [event.id for event in events]
