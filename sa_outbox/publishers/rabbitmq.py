"""`RabbitMQPublisher`: AMQP 0-9-1 with publisher confirms (``pip install "sa-outbox[rabbitmq]"``).

Each event becomes one persistent message, published with ``mandatory`` on a confirming
channel: `publish` returns only once RabbitMQ has confirmed every message (so the relay marks
an event only after the broker took it). ``message_id`` is the outbox row's id, ``type`` the
event type, the body the payload as JSON, the headers `message_headers`. The exchange and
the routing key come from the event (by default: the default exchange ``""`` and the event
type as routing key, i.e. a queue named like the event type; give ``exchange="events"`` for
a topic exchange of yours).

A nack (a queue that refuses, ``x-overflow: reject-publish``), an unroutable message, or an
exchange that does not exist rejects that event; a broker that cannot be reached, a
connection that drops, or a confirm that does not come in ``publish_timeout`` makes the whole
batch unavailable (the relay backs off and reconnects). When the relay's own publish timeout
comes first (a network gone silent leaves the connection half-open: no error, no confirm),
the relay calls `RabbitMQPublisher.reset`, which drops the channel and the connection
without waiting on the broker more than ``RESET_CLOSE_TIMEOUT``: the next publish reconnects.

Examples:
    publisher = RabbitMQPublisher(
        "amqp://guest:guest@127.0.0.1:5672/",
        exchange="events",
        routing_key=lambda event: f"{event.aggregate_type}.{event.event_type}",
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions
from aio_pika.connection import make_url

from .._exceptions import InvalidArgumentType
from ..queue import ClaimedEvent
from ..relay._core import describe
from ..relay._publisher import EventsRejected, PublisherUnavailable
from ._message import body_of, message_headers

__all__ = ["RESET_CLOSE_TIMEOUT", "RabbitMQPublisher"]

#: How long `RabbitMQPublisher.reset` waits for a connection to close: on a half-open one
#: aiormq waits 2 s for the broker's Close-Ok, which never comes, before closing the socket.
RESET_CLOSE_TIMEOUT = 3.0

Naming = str | Callable[[ClaimedEvent], str]

#: Errors that mean "RabbitMQ cannot be reached now", not "this message is refused".
_UNREACHABLE: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPConnectionError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    TimeoutError,
    asyncio.CancelledError,
)


def _naming(value: Naming, what: str) -> Callable[[ClaimedEvent], str]:
    if isinstance(value, str):
        return lambda _event: value
    if callable(value):
        return value
    raise InvalidArgumentType(f"{what} must be a str or a function of the event, got {value!r}")


def _event_type(event: ClaimedEvent) -> str:
    return event.event_type


class RabbitMQPublisher:
    """Publish to RabbitMQ with publisher confirms; see the module's documentation.

    Examples:
        publisher = RabbitMQPublisher("amqp://guest:guest@localhost/", exchange="events")
        relay = Relay(engine, OutboxEvent, publisher)
    """

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        *,
        exchange: Naming = "",
        routing_key: Naming = _event_type,
        persistent: bool = True,
        connect_timeout: float = 10.0,
        publish_timeout: float = 10.0,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidArgumentType(f"url must be a str, got {url!r}")
        self.url = url
        self._exchange_of = _naming(exchange, "exchange")
        self._routing_key_of = _naming(routing_key, "routing_key")
        self._delivery_mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        self._connect_timeout = connect_timeout
        self._publish_timeout = publish_timeout
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._closing: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        host = self.url.rpartition("@")[2]
        return f"RabbitMQPublisher({host!r})"

    async def _open(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            await self._reset()
            # What aio_pika.connect does, except that a connection that fails to open is
            # closed here (aio-pika would leave it to its __del__, outside any event loop).
            self._connection = aio_pika.Connection(make_url(self.url))
            try:
                await self._connection.connect(timeout=self._connect_timeout)
                self._channel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
            except Exception as exc:  # refused, timed out, authentication failed…
                await self._reset()
                raise PublisherUnavailable(f"RabbitMQ {self!r}: {describe(exc)}") from exc
        return self._channel

    async def _exchange(
        self, channel: aio_pika.abc.AbstractChannel, name: str
    ) -> aio_pika.abc.AbstractExchange:
        if name == "":
            return channel.default_exchange
        if name not in self._exchanges:
            self._exchanges[name] = await channel.get_exchange(name, ensure=False)
        return self._exchanges[name]

    async def _publish_one(self, channel: aio_pika.abc.AbstractChannel, event: ClaimedEvent) -> Any:
        exchange = await self._exchange(channel, self._exchange_of(event))
        message = aio_pika.Message(
            body_of(event),
            message_id=str(event.id),
            type=event.event_type,
            content_type="application/json",
            delivery_mode=self._delivery_mode,
            headers=dict(message_headers(event)),
            timestamp=event.created_at,
        )
        return await exchange.publish(
            message,
            routing_key=self._routing_key_of(event),
            mandatory=True,
            timeout=self._publish_timeout,
        )

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """Publish the batch concurrently and wait for every confirm.

        Examples:
            await publisher.publish(events)
        """
        channel = await self._open()
        results = await asyncio.gather(
            *(self._publish_one(channel, event) for event in events), return_exceptions=True
        )
        rejected: dict[uuid.UUID, str] = {}
        unreachable: BaseException | None = None
        for event, result in zip(events, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            if isinstance(result, aio_pika.exceptions.PublishError):  # a DeliveryError too
                rejected[event.id] = f"RabbitMQ returned the message (unroutable): {result}"
            elif isinstance(result, aio_pika.exceptions.DeliveryError):
                rejected[event.id] = f"RabbitMQ nacked the message: {describe(result)}"
            elif isinstance(result, aio_pika.exceptions.ChannelClosed) and not isinstance(
                result, aiormq.exceptions.ConnectionClosed
            ):
                rejected[event.id] = f"RabbitMQ closed the channel: {describe(result)}"
            elif isinstance(result, _UNREACHABLE):
                unreachable = result
            else:
                rejected[event.id] = describe(result)
        if unreachable is not None or (self._channel is not None and self._channel.is_closed):
            await self._reset()  # reconnect on the next batch
        if unreachable is not None:
            raise PublisherUnavailable(f"RabbitMQ {self!r}: {describe(unreachable)}")
        if rejected:
            raise EventsRejected(rejected)

    async def _reset(self, timeout: float | None = None) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._exchanges.clear()
        if connection is None:
            return
        # The close goes on in the background past ``timeout`` (on a half-open connection
        # aiormq waits for a Close-Ok that never comes, then closes the socket): a close
        # cut short would leave aio-pika to schedule another one when it is collected.
        closing = asyncio.ensure_future(connection.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closed)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(closing), timeout or self._connect_timeout)

    def _closed(self, closing: asyncio.Future[Any]) -> None:
        self._closing.discard(closing)
        if not closing.cancelled():
            closing.exception()  # retrieved: a close that failed is no news

    async def reset(self) -> None:
        """Drop the channel and the connection; the next publish opens new ones.

        The relay calls it after a publish that timed out or was cancelled: the connection
        may be half-open, or the cancelled publish left the channel mid-confirm. It waits
        at most ``RESET_CLOSE_TIMEOUT`` for the close, which goes on in the background.

        Examples:
            await publisher.reset()
        """
        await self._reset(RESET_CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close the connection (and wait for those `reset` left closing).

        Examples:
            await publisher.aclose()
        """
        await self._reset()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=self._connect_timeout)
