"""The outbox relay: claim → publish → mark, in each aggregate's order.

`Relay` runs on a synchronous ``Engine``, `AsyncRelay` on an ``AsyncEngine``; both publish
through a `Publisher` (``sa_outbox.publishers``: RabbitMQ, NATS JetStream, Redis Streams,
webhook, a callable). ``sa-outbox relay myapp.outbox:relay`` runs one from the command line.
docs/relay.md tells how to run it, what each publisher sends, and why the order holds.

Examples:
    >>> from sa_outbox.relay import BatchPlan, RelayReport
    >>> RelayReport("relay-1").idle
    True
"""

from ._async import AsyncRelay
from ._config import DEFAULT_RETENTION, RelaySettings
from ._plan import BatchPlan, RelayReport
from ._publisher import (
    EventsRejected,
    Publisher,
    PublishError,
    PublisherUnavailable,
    reset_publisher,
)
from ._sync import Relay
from .metrics import CountingRelayMetrics, PublishOutcome, RelayMetrics

__all__ = [
    "DEFAULT_RETENTION",
    "AsyncRelay",
    "BatchPlan",
    "CountingRelayMetrics",
    "EventsRejected",
    "PublishError",
    "PublishOutcome",
    "Publisher",
    "PublisherUnavailable",
    "Relay",
    "RelayMetrics",
    "RelayReport",
    "RelaySettings",
    "reset_publisher",
]
