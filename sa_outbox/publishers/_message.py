"""What every publisher sends: the payload as JSON, and the event's identity beside it.

The body is the event's payload as compact JSON (the webhook sends `envelope_of` instead).
`message_headers` are the event's own headers plus ``outbox-id`` (the row's id, the message
id consumers de-duplicate on), ``outbox-event-type``, ``outbox-aggregate-type``,
``outbox-aggregate-id``, ``outbox-seq`` and ``outbox-created-at``; the event's own headers
win no clash with these.

Examples:
    >>> import uuid
    >>> from sa_outbox.queue import ClaimedEvent
    >>> event = ClaimedEvent(uuid.UUID(int=1), 7, "OrderPlaced", "order", "42",
    ...                      {"total": 12}, {"trace": "t1"}, 1, None, uuid.UUID(int=2), None)
    >>> body_of(event)
    b'{"total":12}'
    >>> sorted(message_headers(event))  # doctest: +NORMALIZE_WHITESPACE
    ['outbox-aggregate-id', 'outbox-aggregate-type', 'outbox-event-type', 'outbox-id',
     'outbox-seq', 'trace']
"""

from __future__ import annotations

import json
from typing import Any

from .._wire import (
    HEADER_AGGREGATE_ID,
    HEADER_AGGREGATE_TYPE,
    HEADER_CREATED_AT,
    HEADER_EVENT_TYPE,
    HEADER_ID,
    HEADER_SEQ,
)
from ..queue import ClaimedEvent
from ..statements import compact_json

__all__ = ["body_of", "envelope_of", "message_headers"]


def body_of(event: ClaimedEvent) -> bytes:
    """The event's payload as compact UTF-8 JSON.

    Examples:
        body = body_of(event)  # b'{"total_cents":1200}'
    """
    return compact_json(event.payload).encode()


def _header_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def message_headers(event: ClaimedEvent) -> dict[str, str]:
    """The event's own headers (non-strings as JSON) and its identity, all as strings.

    Examples:
        headers = message_headers(event)  # {"outbox-id": "0190…", "outbox-seq": "7", …}
    """
    headers = {str(k): _header_value(v) for k, v in (event.headers or {}).items()}
    headers.update(
        {
            HEADER_ID: str(event.id),
            HEADER_EVENT_TYPE: event.event_type,
            HEADER_AGGREGATE_TYPE: event.aggregate_type,
            HEADER_AGGREGATE_ID: event.aggregate_id,
            HEADER_SEQ: str(event.seq),
        }
    )
    if event.created_at is not None:
        headers[HEADER_CREATED_AT] = event.created_at.isoformat()
    return headers


def envelope_of(event: ClaimedEvent) -> dict[str, Any]:
    """The whole event as one JSON object (the webhook's body).

    Examples:
        >>> import uuid
        >>> from sa_outbox.queue import ClaimedEvent
        >>> event = ClaimedEvent(uuid.UUID(int=1), 7, "OrderPlaced", "order", "42", {}, {},
        ...                      1, None, uuid.UUID(int=2), None)
        >>> sorted(envelope_of(event))  # doctest: +NORMALIZE_WHITESPACE
        ['aggregate_id', 'aggregate_type', 'created_at', 'event_type', 'headers', 'id',
         'payload', 'seq']
    """
    return {
        "id": str(event.id),
        "event_type": event.event_type,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "seq": event.seq,
        "created_at": None if event.created_at is None else event.created_at.isoformat(),
        "headers": dict(event.headers or {}),
        "payload": event.payload,
    }
