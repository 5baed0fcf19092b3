"""`RedisStreamsPublisher`: ``XADD`` to Redis Streams (``pip install "sa-outbox[redis]"``).

Each event becomes one stream entry (``XADD stream * …``) whose fields are ``id`` (the
outbox row's id: consumers de-duplicate on it), ``event_type``, ``aggregate_type``,
``aggregate_id``, ``seq``, ``created_at``, ``headers`` (JSON) and ``payload`` (JSON). A
batch goes out in one pipeline; `publish` returns once Redis answered every ``XADD``. The
stream key comes from the event (by default ``"outbox"``); ``maxlen`` trims it
(approximately, ``MAXLEN ~``).

An error reply to an ``XADD`` (the key holds another type, …) rejects that event; a server
that cannot be reached or does not answer in ``socket_timeout`` makes the batch unavailable.
After a publish that timed out or was cancelled, the relay calls
`RedisStreamsPublisher.reset`, which disconnects the connection pool (waiting at most
``RESET_CLOSE_TIMEOUT``): the next publish connects afresh.

Examples:
    publisher = RedisStreamsPublisher(
        "redis://127.0.0.1:6379/0",
        stream=lambda event: f"events:{event.aggregate_type}",
        maxlen=1_000_000,
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from .._exceptions import InvalidArgumentType
from ..queue import ClaimedEvent
from ..relay._core import describe
from ..relay._publisher import EventsRejected, PublisherUnavailable
from ..statements import compact_json

__all__ = ["RESET_CLOSE_TIMEOUT", "RedisStreamsPublisher"]

#: How long `RedisStreamsPublisher.reset` waits for the pool's connections to close.
RESET_CLOSE_TIMEOUT = 1.0

_UNREACHABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    ConnectionError,
    OSError,
    TimeoutError,
)


class RedisStreamsPublisher:
    """``XADD`` each event to a Redis stream; see the module's documentation.

    Examples:
        relay = Relay(engine, OutboxEvent, RedisStreamsPublisher("redis://localhost:6379/0"))
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        stream: str | Callable[[ClaimedEvent], str] = "outbox",
        maxlen: int | None = None,
        socket_timeout: float = 5.0,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidArgumentType(f"url must be a str, got {url!r}")
        if isinstance(stream, str):
            fixed = stream
            self._stream_of: Callable[[ClaimedEvent], str] = lambda _event: fixed
        elif callable(stream):
            self._stream_of = stream
        else:
            raise InvalidArgumentType(f"stream must be a str or a function, got {stream!r}")
        self.url = url
        self.maxlen = maxlen
        self._socket_timeout = socket_timeout
        self._client: redis.asyncio.Redis | None = None

    def __repr__(self) -> str:
        return f"RedisStreamsPublisher({self.url.rpartition('@')[2]!r})"

    def fields(self, event: ClaimedEvent) -> dict[str, str]:
        """The entry's fields for ``event`` (override to add your own).

        Examples:
            fields = publisher.fields(event)  # {"id": "0190…", "event_type": …}
        """
        return {
            "id": str(event.id),
            "event_type": event.event_type,
            "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id,
            "seq": str(event.seq),
            "created_at": "" if event.created_at is None else event.created_at.isoformat(),
            "headers": json.dumps(event.headers or {}, separators=(",", ":")),
            "payload": compact_json(event.payload),
        }

    def _open(self) -> redis.asyncio.Redis:
        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(
                self.url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
            )
        return self._client

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """``XADD`` the batch in one pipeline.

        Examples:
            await publisher.publish(events)
        """
        client = self._open()
        pipe = client.pipeline(transaction=False)
        for event in events:
            fields: dict[Any, Any] = self.fields(event)
            pipe.xadd(self._stream_of(event), fields, maxlen=self.maxlen, approximate=True)
        try:
            results = await pipe.execute(raise_on_error=False)
        except _UNREACHABLE as exc:
            await self._reset()
            raise PublisherUnavailable(f"Redis {self!r}: {describe(exc)}") from exc
        rejected: dict[uuid.UUID, str] = {}
        for event, result in zip(events, results, strict=True):
            if isinstance(result, _UNREACHABLE):
                await self._reset()
                raise PublisherUnavailable(f"Redis {self!r}: {describe(result)}")
            if isinstance(result, BaseException):
                rejected[event.id] = f"Redis refused XADD: {describe(result)}"
        if rejected:
            raise EventsRejected(rejected)

    async def _reset(self, timeout: float | None = None) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), timeout or self._socket_timeout)

    async def reset(self) -> None:
        """Disconnect the connection pool; the next publish connects afresh.

        The relay calls it after a publish that timed out or was cancelled: a connection
        whose reply never came must not be reused. Waits at most ``RESET_CLOSE_TIMEOUT``.

        Examples:
            await publisher.reset()
        """
        await self._reset(RESET_CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close the connections.

        Examples:
            await publisher.aclose()
        """
        await self._reset()
