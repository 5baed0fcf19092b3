"""The consumer's side of each publisher's message format.

It imports no broker client: each helper reads the client's received object by its
attributes. The inbox these helpers feed is `sa_outbox.Inbox`, which the consumer calls
itself.

=====================  ==================================================================
helper                 takes
=====================  ==================================================================
`from_rabbitmq`        aio-pika's ``IncomingMessage``
`from_nats`            nats-py's ``Msg`` (JetStream or core)
`from_redis`           a Redis stream entry, ``(entry_id, fields)``
`from_kafka`           confluent-kafka's ``Message``
`from_webhook`         a webhook request's headers and raw body, and the shared secret
=====================  ==================================================================

Each returns a `ReceivedMessage` (``message_id``, ``event_type``, ``aggregate_type``,
``aggregate_id``, ``seq``, ``created_at``, ``payload``, ``headers``), or raises
`MalformedMessage` (not an outbox message) or, for a webhook, `InvalidSignature`. None of
them acknowledges anything: acknowledge once the transaction that accepted the message in
the inbox has committed. See docs/inbox.md.

Examples:
    >>> from sa_outbox._wire import sign
    >>> body = (b'{"id":"0190","event_type":"OrderPlaced","aggregate_type":"order",'
    ...         b'"aggregate_id":"42","seq":7,"created_at":null,"headers":{},"payload":{}}')
    >>> from_webhook({"X-Outbox-Signature": sign(b"s3cret", body)}, body,
    ...              secret="s3cret").event_type
    'OrderPlaced'
"""

from ._brokers import from_kafka, from_nats, from_rabbitmq, from_redis
from ._message import InvalidSignature, MalformedMessage, ReceivedMessage
from ._webhook import from_webhook, verify_signature

__all__ = [
    "InvalidSignature",
    "MalformedMessage",
    "ReceivedMessage",
    "from_kafka",
    "from_nats",
    "from_rabbitmq",
    "from_redis",
    "from_webhook",
    "verify_signature",
]
