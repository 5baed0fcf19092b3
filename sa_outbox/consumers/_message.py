"""`ReceivedMessage`, what every consumer helper returns, and the errors they raise."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from .._exceptions import InvalidArgument
from .._wire import (
    HEADER_AGGREGATE_ID,
    HEADER_AGGREGATE_TYPE,
    HEADER_CREATED_AT,
    HEADER_EVENT_TYPE,
    HEADER_ID,
    HEADER_SEQ,
    IDENTITY_HEADERS,
)

__all__ = ["InvalidSignature", "MalformedMessage", "ReceivedMessage"]


class MalformedMessage(InvalidArgument):
    """A received message that is not what the outbox's publishers send.

    No message id, a body that is not JSON, a ``seq`` that is not a number, a broker's
    error report instead of a message…: the message says what is wrong. A consumer usually
    dead-letters such a message rather than retrying it.

    Examples:
        >>> raise MalformedMessage("RabbitMQ message has no message id (outbox-id)")
        Traceback (most recent call last):
        ...
        sa_outbox.consumers.MalformedMessage: RabbitMQ message has no message id (outbox-id)
    """

    __module__ = "sa_outbox.consumers"  # its public home, as tracebacks show it


class InvalidSignature(InvalidArgument):
    """A webhook request whose signature is missing or does not match its body.

    Answer it with 401 and do not act on it: the body may have been forged or changed.

    Examples:
        >>> raise InvalidSignature("the request has no X-Outbox-Signature header")
        Traceback (most recent call last):
        ...
        sa_outbox.consumers.InvalidSignature: the request has no X-Outbox-Signature header
    """

    __module__ = "sa_outbox.consumers"


@dataclasses.dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """An outbox event as a consumer received it, whatever the broker.

    ``message_id`` is the outbox row's id: pass it to `sa_outbox.Inbox.accept`. ``headers``
    are the event's own headers (trace context, …) without the ``outbox-*`` identity headers:
    as strings from RabbitMQ, NATS and Kafka (the publishers send non-strings as JSON), as
    the event stored them from Redis Streams and webhooks. ``seq`` and ``created_at`` are
    ``None`` when the message did not carry them.

    Examples:
        >>> message = ReceivedMessage("0190", "OrderPlaced", "order", "42", 7, None,
        ...                           {"total": 12}, {})
        >>> message.message_id, message.payload["total"]
        ('0190', 12)
    """

    message_id: str
    event_type: str
    aggregate_type: str
    aggregate_id: str
    seq: int | None
    created_at: dt.datetime | None
    payload: Any
    headers: dict[str, Any]


def as_text(value: object) -> str | None:
    """A header or field value as text: bytes are decoded as UTF-8; ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise MalformedMessage(f"a header or field is not UTF-8 text: {value!r}") from None
    return value if isinstance(value, str) else str(value)


def decode_json(data: object, what: str) -> Any:
    """``data`` (bytes or text) decoded as JSON, or `MalformedMessage` naming ``what``."""
    if data is None:
        raise MalformedMessage(f"{what} is missing")
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, str | bytes):
        raise MalformedMessage(f"{what} is not bytes or text: {type(data).__name__}")
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes
        raise MalformedMessage(f"{what} is not JSON: {exc}") from None


def _seq(value: str | None, broker: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise MalformedMessage(
            f"{broker} message has a seq that is not a number: {value!r}"
        ) from None


def _created_at(value: str | None, broker: str) -> dt.datetime | None:
    if value is None or value == "":
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        raise MalformedMessage(
            f"{broker} message has a created_at that is not an ISO 8601 time: {value!r}"
        ) from None


def _required(value: str | None, broker: str, what: str) -> str:
    if not value:
        raise MalformedMessage(f"{broker} message has no {what}")
    return value


def from_fields(
    broker: str,
    *,
    message_id: str | None,
    event_type: str | None,
    aggregate_type: str | None,
    aggregate_id: str | None,
    seq: str | None,
    created_at: str | None,
    payload: Any,
    headers: dict[str, Any],
) -> ReceivedMessage:
    """A `ReceivedMessage` from fields already read as text, each one checked."""
    return ReceivedMessage(
        message_id=_required(message_id, broker, f"message id ({HEADER_ID})"),
        event_type=_required(event_type, broker, f"event type ({HEADER_EVENT_TYPE})"),
        aggregate_type=_required(
            aggregate_type, broker, f"aggregate type ({HEADER_AGGREGATE_TYPE})"
        ),
        aggregate_id=_required(aggregate_id, broker, f"aggregate id ({HEADER_AGGREGATE_ID})"),
        seq=_seq(seq, broker),
        created_at=_created_at(created_at, broker),
        payload=payload,
        headers=headers,
    )


def from_headers(
    broker: str,
    headers: Mapping[str, str],
    payload: Any,
    *,
    message_id: str | None = None,
    event_type: str | None = None,
    drop: tuple[str, ...] = (),
) -> ReceivedMessage:
    """A `ReceivedMessage` from the headers `message_headers` wrote (RabbitMQ, NATS, Kafka).

    ``message_id`` / ``event_type`` are what the broker's own properties say, preferred
    when given; ``drop`` names broker headers that are not the event's own.
    """
    own = {
        name: value
        for name, value in headers.items()
        if name not in IDENTITY_HEADERS and name not in drop
    }
    return from_fields(
        broker,
        message_id=message_id or headers.get(HEADER_ID),
        event_type=event_type or headers.get(HEADER_EVENT_TYPE),
        aggregate_type=headers.get(HEADER_AGGREGATE_TYPE),
        aggregate_id=headers.get(HEADER_AGGREGATE_ID),
        seq=headers.get(HEADER_SEQ),
        created_at=headers.get(HEADER_CREATED_AT),
        payload=payload,
        headers=own,
    )
