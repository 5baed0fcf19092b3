"""`NatsPublisher`: NATS JetStream with broker-side de-duplication (``sa-outbox[nats]``).

Each event is published to JetStream with the header ``Nats-Msg-Id`` set to the outbox row's
id: within the stream's duplicate window (two minutes by default), JetStream stores a
re-published event once, so the duplicates at-least-once delivery allows are removed by the
broker itself. `publish` returns once JetStream acknowledged every message (stored it). The
subject comes from the event (by default ``"{aggregate_type}.{event_type}"``); a stream must
capture it (create it yourself, or with ``nats stream add``). The other headers are
`message_headers`; the body is the payload as JSON.

An error reply from JetStream (no stream for the subject, a message over the stream's
``max_msg_size``…) rejects that event; a server that cannot be reached, a connection that
drops, or an acknowledgement that does not come in ``publish_timeout`` makes the batch
unavailable (the relay backs off, and the publisher reconnects). When the relay's own publish
timeout comes first (a network gone silent leaves the connection half-open, and nats-py
notices only after minutes of unanswered pings), the relay calls `NatsPublisher.reset`,
which closes the connection without waiting more than ``RESET_CLOSE_TIMEOUT``: the next
publish connects afresh.

Examples:
    publisher = NatsPublisher(
        "nats://127.0.0.1:4222",
        subject=lambda event: f"orders.{event.event_type}",
        stream="ORDERS",
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from .._exceptions import InvalidArgumentType
from ..queue import ClaimedEvent
from ..relay._core import LOGGER, describe
from ..relay._publisher import EventsRejected, PublisherUnavailable
from ._message import body_of, message_headers

__all__ = ["RESET_CLOSE_TIMEOUT", "NatsPublisher"]

#: How long `NatsPublisher.reset` waits for the connection to close (it flushes first,
#: which on a half-open connection never ends).
RESET_CLOSE_TIMEOUT = 1.0

_UNREACHABLE: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    ConnectionError,
    OSError,
    TimeoutError,
)

_CONNECT_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, *_UNREACHABLE)


def _subject(event: ClaimedEvent) -> str:
    return f"{event.aggregate_type}.{event.event_type}"


class NatsPublisher:
    """Publish to NATS JetStream with ``Nats-Msg-Id``; see the module's documentation.

    Examples:
        relay = Relay(engine, OutboxEvent, NatsPublisher("nats://localhost:4222"))
    """

    def __init__(
        self,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        subject: str | Callable[[ClaimedEvent], str] = _subject,
        stream: str | None = None,
        connect_timeout: float = 5.0,
        publish_timeout: float = 5.0,
    ) -> None:
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        if isinstance(subject, str):
            fixed = subject
            self._subject_of: Callable[[ClaimedEvent], str] = lambda _event: fixed
        elif callable(subject):
            self._subject_of = subject
        else:
            raise InvalidArgumentType(f"subject must be a str or a function, got {subject!r}")
        self.stream = stream
        self._connect_timeout = connect_timeout
        self._publish_timeout = publish_timeout
        self._client: Client | None = None
        self._js: JetStreamContext | None = None

    def __repr__(self) -> str:
        return f"NatsPublisher({self.servers!r})"

    async def _open(self) -> JetStreamContext:
        if self._js is None or self._client is None or not self._client.is_connected:
            await self._reset()
            try:
                # One try per server, no background reconnection: when the connection is
                # lost the relay backs off, and the next batch connects afresh. (nats-py's
                # connect never returns with allow_reconnect=False and no server up, hence
                # one "reconnect" attempt, and the outer timeout as a guard.)
                self._client = await asyncio.wait_for(
                    nats.connect(
                        self.servers,
                        connect_timeout=self._connect_timeout,
                        max_reconnect_attempts=1,
                        reconnect_time_wait=0.1,
                        error_cb=self._on_error,
                        disconnected_cb=self._on_disconnect,
                    ),
                    self._connect_timeout * (len(self.servers) + 1),
                )
            except _CONNECT_ERRORS as exc:
                await self._reset()
                raise PublisherUnavailable(f"NATS {self.servers}: {describe(exc)}") from exc
            self._js = self._client.jetstream(timeout=self._publish_timeout)
        return self._js

    async def _on_error(self, error: Exception) -> None:
        LOGGER.debug("NATS %s: %s", self.servers, describe(error))

    async def _on_disconnect(self) -> None:
        LOGGER.debug("NATS %s: disconnected", self.servers)

    async def _publish_one(self, js: JetStreamContext, event: ClaimedEvent) -> Any:
        headers = {**message_headers(event), "Nats-Msg-Id": str(event.id)}
        return await js.publish(
            self._subject_of(event),
            body_of(event),
            timeout=self._publish_timeout,
            stream=self.stream,
            headers=headers,
        )

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """Publish the batch concurrently and wait for every JetStream acknowledgement.

        Examples:
            await publisher.publish(events)
        """
        js = await self._open()
        results = await asyncio.gather(
            *(self._publish_one(js, event) for event in events), return_exceptions=True
        )
        rejected: dict[uuid.UUID, str] = {}
        unreachable: BaseException | None = None
        for event, result in zip(events, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            if isinstance(result, _UNREACHABLE):
                unreachable = result
            elif isinstance(result, nats.errors.NoRespondersError):
                subject = self._subject_of(event)
                rejected[event.id] = f"no JetStream stream captures the subject {subject!r}"
            else:
                rejected[event.id] = f"JetStream refused the message: {describe(result)}"
        if unreachable is not None:
            await self._reset()
            raise PublisherUnavailable(f"NATS {self.servers}: {describe(unreachable)}")
        if rejected:
            raise EventsRejected(rejected)

    async def _reset(self, timeout: float | None = None) -> None:
        client, self._client, self._js = self._client, None, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), timeout or self._connect_timeout)

    async def reset(self) -> None:
        """Close the connection; the next publish connects afresh.

        The relay calls it after a publish that timed out or was cancelled. Closing waits
        at most ``RESET_CLOSE_TIMEOUT``.

        Examples:
            await publisher.reset()
        """
        await self._reset(RESET_CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close the connection.

        Examples:
            await publisher.aclose()
        """
        await self._reset()
