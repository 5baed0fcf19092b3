"""Receive a webhook from ``WebhookPublisher``: check its signature, then read the event.

The publisher signs the exact bytes of the body with HMAC-SHA256 under the shared secret
(``X-Outbox-Signature: sha256=<hex>``, `sa_outbox._wire.sign`); the receiver recomputes it
over the bytes it received and compares in constant time (``hmac.compare_digest``). The
publisher signs no timestamp, so there is no clock tolerance to check: a captured request
replayed later carries an id the inbox has already seen, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import InvalidArgumentType
from .._wire import (
    SIGNATURE_PREFIX,
    WEBHOOK_IDEMPOTENCY_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    signature_matches,
)
from ._message import InvalidSignature, MalformedMessage, ReceivedMessage, decode_json, from_fields

__all__ = ["from_webhook", "verify_signature"]


def _header(headers: Any, name: str) -> str | None:
    """``headers[name]``, whatever the case of the name (HTTP header names are not
    case-sensitive): a dict, Starlette's or Werkzeug's headers, ``http.server``'s."""
    if not hasattr(headers, "items"):
        raise InvalidArgumentType(
            f"headers must be the request's headers (a mapping), got {type(headers).__name__}"
        )
    wanted = name.lower()
    for key, value in headers.items():
        if str(key).lower() == wanted:
            return value if isinstance(value, str) else str(value)
    return None


def _body(body: object) -> bytes:
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise InvalidArgumentType(
        "body must be the request's raw bytes, exactly as received (the signature covers "
        f"those bytes), got {type(body).__name__}"
    )


def _secret(secret: object) -> bytes | None:
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes):
        raise InvalidArgumentType(f"secret must be a str or bytes, got {type(secret).__name__}")
    if not secret:
        raise InvalidSignature("the webhook secret is empty: give the publisher's secret")
    return secret


def verify_signature(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secret: str | bytes,
    signature_header: str = WEBHOOK_SIGNATURE_HEADER,
) -> None:
    """Raise `InvalidSignature` unless ``signature_header`` signs ``body`` under ``secret``.

    ``body`` must be the raw bytes received (not re-serialised JSON); the comparison is in
    constant time.

    Examples:
        >>> from sa_outbox._wire import sign
        >>> body = b'{"id":"1"}'
        >>> verify_signature({"X-Outbox-Signature": sign(b"s3cret", body)}, body, secret="s3cret")
        >>> verify_signature({"X-Outbox-Signature": sign(b"other", body)}, body, secret="s3cret")
        Traceback (most recent call last):
        ...
        sa_outbox.consumers.InvalidSignature: the X-Outbox-Signature header does not match the \
body: the body was changed, or signed with another secret
    """
    key = _secret(secret)
    raw = _body(body)
    if key is None:
        raise InvalidArgumentType("secret must be a str or bytes, got NoneType")
    found = _header(headers, signature_header)
    if found is None:
        raise InvalidSignature(f"the request has no {signature_header} header: it is not signed")
    if not found.startswith(SIGNATURE_PREFIX):
        raise InvalidSignature(
            f"the {signature_header} header is not {SIGNATURE_PREFIX}<hex HMAC-SHA256>"
        )
    if not signature_matches(key, raw, found):
        raise InvalidSignature(
            f"the {signature_header} header does not match the body: the body was changed, "
            "or signed with another secret"
        )


def from_webhook(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secret: str | bytes | None,
    signature_header: str = WEBHOOK_SIGNATURE_HEADER,
    idempotency_header: str = WEBHOOK_IDEMPOTENCY_HEADER,
) -> ReceivedMessage:
    """Verify a ``WebhookPublisher`` request's signature, then read the event from its body.

    ``headers`` and ``body`` are the request's, ``body`` as the raw bytes received;
    ``secret`` is the publisher's. A missing or wrong signature raises `InvalidSignature`
    (answer 401) before the body is read; a body that is not the publisher's JSON envelope
    raises `MalformedMessage` (answer 400). ``secret=None`` skips the check, for a publisher
    without a secret: say so explicitly, as anyone can then post events. The message id is
    the signed body's ``id``; an ``Idempotency-Key`` header that says otherwise is refused.

    Examples:
        >>> from sa_outbox._wire import sign
        >>> body = (b'{"id":"0190","event_type":"OrderPlaced","aggregate_type":"order",'
        ...         b'"aggregate_id":"42","seq":7,"created_at":null,"headers":{},'
        ...         b'"payload":{"total":12}}')
        >>> headers = {"x-outbox-signature": sign(b"s3cret", body)}
        >>> message = from_webhook(headers, body, secret="s3cret")
        >>> message.message_id, message.seq, message.payload
        ('0190', 7, {'total': 12})
    """
    key = _secret(secret)
    raw = _body(body)
    if key is not None:
        verify_signature(headers, raw, secret=key, signature_header=signature_header)
    envelope = decode_json(raw, "webhook body")
    if not isinstance(envelope, dict):
        raise MalformedMessage(f"webhook body is not a JSON object: {envelope!r}"[:200])
    own = envelope.get("headers") or {}
    if not isinstance(own, dict):
        raise MalformedMessage(f"webhook body's headers is not a JSON object: {own!r}"[:200])
    message_id = _string(envelope.get("id"))
    claimed = _header(headers, idempotency_header)
    if claimed is not None and message_id and claimed != message_id:
        raise MalformedMessage(
            f"the {idempotency_header} header {claimed!r} is not the body's id {message_id!r}"
        )
    return from_fields(
        "webhook",
        message_id=message_id,
        event_type=_string(envelope.get("event_type")),
        aggregate_type=_string(envelope.get("aggregate_type")),
        aggregate_id=_string(envelope.get("aggregate_id")),
        seq=_string(envelope.get("seq")),
        created_at=_string(envelope.get("created_at")),
        payload=envelope.get("payload"),
        headers=own,
    )


def _string(value: object) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)
