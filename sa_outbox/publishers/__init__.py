"""Publishers for the outbox relay, one module per target.

=====================================  ===============================  =========================
module                                 class                            extra
=====================================  ===============================  =========================
``sa_outbox.publishers.rabbitmq``      ``RabbitMQPublisher``            ``sa-outbox[rabbitmq]``
``sa_outbox.publishers.kafka``         ``KafkaPublisher``               ``sa-outbox[kafka]``
``sa_outbox.publishers.nats``          ``NatsPublisher``                ``sa-outbox[nats]``
``sa_outbox.publishers.redis``         ``RedisStreamsPublisher``        ``sa-outbox[redis]``
``sa_outbox.publishers.webhook``       ``WebhookPublisher``             ``sa-outbox[webhook]``
``sa_outbox.publishers.callable``      ``CallablePublisher``            (none)
=====================================  ===============================  =========================

Each implements `Publisher` (``async publish(events)``, ``async aclose()``) and carries
the outbox row's id as the message id, so consumers can de-duplicate; each but the callable
also has ``async reset()``, which the relay calls after a publish that timed out or was
cancelled, to drop a connection the network may have left half-open. Importing this package
imports no client library; each module imports its own.

Examples:
    >>> from sa_outbox.publishers import message_headers
    >>> import uuid
    >>> from sa_outbox.queue import ClaimedEvent
    >>> event = ClaimedEvent(uuid.UUID(int=1), 7, "OrderPlaced", "order", "42", {}, {}, 1,
    ...                      None, uuid.UUID(int=2), None)
    >>> message_headers(event)["outbox-seq"]
    '7'
"""

from ..relay._publisher import EventsRejected, Publisher, PublishError, PublisherUnavailable
from ._message import body_of, envelope_of, message_headers

__all__ = [
    "EventsRejected",
    "PublishError",
    "Publisher",
    "PublisherUnavailable",
    "body_of",
    "envelope_of",
    "message_headers",
]
