"""`CallablePublisher`: publish to a function of yours, in-process (tests, custom targets).

Examples:
    >>> import asyncio, uuid
    >>> from sa_outbox.queue import ClaimedEvent
    >>> seen = []
    >>> publisher = CallablePublisher(lambda event: seen.append(event.message_id))
    >>> event = ClaimedEvent(uuid.UUID(int=1), 1, "OrderPlaced", "order", "42", {}, {}, 1,
    ...                      None, uuid.UUID(int=2), None)
    >>> asyncio.run(publisher.publish([event]))
    >>> seen
    ['00000000-0000-0000-0000-000000000001']
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Sequence

from .._exceptions import InvalidArgumentType
from ..queue import ClaimedEvent
from ..relay._core import describe
from ..relay._publisher import EventsRejected, PublisherUnavailable

__all__ = ["CallablePublisher"]

Target = Callable[[ClaimedEvent], Awaitable[object] | object]


class CallablePublisher:
    """Calls ``target(event)`` for each event of a batch, in order; sync or async.

    An exception from ``target`` rejects that event (it backs off, and is parked after
    ``max_attempts``) and the batch goes on; raise `PublisherUnavailable` instead to say
    the target is down (nothing more is tried, the relay backs off, nothing is parked).

    A sync ``target`` runs on the relay's event loop: keep it quick, or make it async.

    Examples:
        def send(event):
            my_bus.publish(event.event_type, event.payload, message_id=event.message_id)

        relay = Relay(engine, OutboxEvent, CallablePublisher(send))
    """

    def __init__(self, target: Target) -> None:
        if not callable(target):
            raise InvalidArgumentType(f"target must be callable, got {target!r}")
        self.target = target

    def __repr__(self) -> str:
        return f"CallablePublisher({getattr(self.target, '__qualname__', self.target)!r})"

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """Call the target with each event; raise `EventsRejected` for those that raised.

        Examples:
            await publisher.publish(events)
        """
        rejected: dict[uuid.UUID, str] = {}
        for event in events:
            try:
                result = self.target(event)
                if inspect.isawaitable(result):
                    await result
            except PublisherUnavailable:
                raise
            except Exception as exc:
                rejected[event.id] = describe(exc)
        if rejected:
            raise EventsRejected(rejected)

    async def aclose(self) -> None:
        """Nothing to close.

        Examples:
            await publisher.aclose()
        """
