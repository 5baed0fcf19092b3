"""The outbox's message format on the wire: header names and the webhook's signature.

One definition for both ends: the publishers (``sa_outbox.publishers``) write these
headers and sign webhook bodies, the consumer helpers (``sa_outbox.consumers``) read them
and check the signature. Nothing here imports a broker's client.

Examples:
    >>> sign(b"secret", b'{"id":"1"}')
    'sha256=6146142a2ce0159e84c0767881e4ec80bc397da62526e7d19f70795eb79460c0'
    >>> signature_matches(b"secret", b'{"id":"1"}', sign(b"secret", b'{"id":"1"}'))
    True
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = [
    "HEADER_AGGREGATE_ID",
    "HEADER_AGGREGATE_TYPE",
    "HEADER_CREATED_AT",
    "HEADER_EVENT_TYPE",
    "HEADER_ID",
    "HEADER_SEQ",
    "IDENTITY_HEADERS",
    "NATS_MSG_ID",
    "SIGNATURE_PREFIX",
    "WEBHOOK_EVENT_TYPE_HEADER",
    "WEBHOOK_IDEMPOTENCY_HEADER",
    "WEBHOOK_SIGNATURE_HEADER",
    "sign",
    "signature_matches",
]

#: The outbox row's id: the message id consumers de-duplicate on.
HEADER_ID = "outbox-id"
HEADER_EVENT_TYPE = "outbox-event-type"
HEADER_AGGREGATE_TYPE = "outbox-aggregate-type"
HEADER_AGGREGATE_ID = "outbox-aggregate-id"
HEADER_SEQ = "outbox-seq"
#: Sent only when the event has a ``created_at`` (ISO 8601).
HEADER_CREATED_AT = "outbox-created-at"
#: The headers that carry the event's identity, beside its own headers.
IDENTITY_HEADERS = (
    HEADER_ID,
    HEADER_EVENT_TYPE,
    HEADER_AGGREGATE_TYPE,
    HEADER_AGGREGATE_ID,
    HEADER_SEQ,
    HEADER_CREATED_AT,
)
#: JetStream's de-duplication header; the NATS publisher sets it to the outbox row's id.
NATS_MSG_ID = "Nats-Msg-Id"

#: The webhook's default header names (``WebhookPublisher``'s keyword arguments).
WEBHOOK_SIGNATURE_HEADER = "X-Outbox-Signature"
WEBHOOK_IDEMPOTENCY_HEADER = "Idempotency-Key"
WEBHOOK_EVENT_TYPE_HEADER = "X-Outbox-Event-Type"
SIGNATURE_PREFIX = "sha256="


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Outbox-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of ``body``.

    Examples:
        >>> sign(b"secret", b'{"id":"1"}')
        'sha256=6146142a2ce0159e84c0767881e4ec80bc397da62526e7d19f70795eb79460c0'
    """
    return SIGNATURE_PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def signature_matches(secret: bytes, body: bytes, signature: str) -> bool:
    """Whether ``signature`` is `sign` of ``body`` under ``secret``, compared in constant time.

    Examples:
        >>> signature_matches(b"secret", b"{}", "sha256=00")
        False
    """
    expected = sign(secret, body).encode()
    return hmac.compare_digest(expected, signature.encode("utf-8", "replace"))
