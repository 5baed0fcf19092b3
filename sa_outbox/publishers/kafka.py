"""`KafkaPublisher`: an idempotent Kafka producer (``pip install "sa-outbox[kafka]"``).

Built on confluent-kafka (librdkafka): manylinux wheels, and the idempotent producer and
delivery reports are librdkafka's own, as every other Kafka client in production uses them.
Each event becomes one record: the **key** is the aggregate id (so all events of one
aggregate land on one partition, in the relay's order), the value the payload as JSON, the
headers `message_headers` (``outbox-id`` and the event's own headers, trace context
included), the timestamp the event's ``created_at``. The topic defaults to the aggregate
type: a topic that depended on the event type would split one aggregate over several
topics and lose its order.

The producer always runs with ``enable.idempotence=true`` and ``acks=all`` (a config that
says otherwise is refused), and ``message.timeout.ms`` is ``publish_timeout``: `publish`
returns only once Kafka has acknowledged every record (its delivery report came back
without error), so the relay marks an event only after the broker stored it. A broker that
cannot be reached, or a record not acknowledged within ``publish_timeout``, makes the batch
unavailable (nothing is marked; the relay backs off and re-publishes); an error Kafka will
not retry (record too large, topic that does not exist and may not be created, not
authorised) rejects that event.

When the relay's own publish timeout comes first (a network gone silent: librdkafka waits
for its request and socket timeouts), the relay calls `KafkaPublisher.reset`: the records
not yet delivered are purged (the relay re-publishes them) and the next publish uses a new
producer, with fresh connections.

Examples:
    publisher = KafkaPublisher(
        "127.0.0.1:9092",
        topic=lambda event: f"outbox.{event.aggregate_type}",
        config={"compression.type": "zstd"},
    )
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import confluent_kafka

from .._exceptions import InvalidArgument, InvalidArgumentType
from ..queue import ClaimedEvent
from ..relay._core import LOGGER
from ..relay._publisher import EventsRejected, PublisherUnavailable
from ._message import body_of, message_headers

__all__ = ["KafkaPublisher"]

_E = confluent_kafka.KafkaError

#: Delivery errors that mean "Kafka cannot take it now", besides those librdkafka flags
#: as retriable: the batch stays unpublished and is tried again, never parked.
_UNREACHABLE_CODES = frozenset(
    {
        _E._MSG_TIMED_OUT,
        _E._TIMED_OUT,
        _E._TRANSPORT,
        _E._ALL_BROKERS_DOWN,
        _E._PURGE_QUEUE,
        _E._PURGE_INFLIGHT,
        _E._QUEUE_FULL,
        _E._RESOLVE,
        _E.NOT_ENOUGH_REPLICAS,
        _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        _E.REQUEST_TIMED_OUT,
        _E.LEADER_NOT_AVAILABLE,
        _E.NOT_LEADER_FOR_PARTITION,
    }
)

#: Settings the publisher's guarantees rest on: a config may repeat them, not change them.
_REQUIRED = {"enable.idempotence": "true", "acks": "all"}
_OWN = ("bootstrap.servers", "message.timeout.ms", "delivery.timeout.ms")


def _aggregate_type(event: ClaimedEvent) -> str:
    return event.aggregate_type


def _aggregate_id(event: ClaimedEvent) -> str:
    return event.aggregate_id


def _naming(value: str | Callable[[ClaimedEvent], str], what: str) -> Callable[[ClaimedEvent], str]:
    if isinstance(value, str):
        if not value:
            raise InvalidArgument(f"{what} must not be empty")
        return lambda _event: value
    if callable(value):
        return value
    raise InvalidArgumentType(f"{what} must be a str or a function of the event, got {value!r}")


def _producer_config(
    bootstrap_servers: str, config: Mapping[str, Any] | None, publish_timeout: float
) -> dict[str, Any]:
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise InvalidArgument(
            f"bootstrap_servers must be a non-empty 'host:port[,host:port…]' str,"
            f" got {bootstrap_servers!r}"
        )
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise InvalidArgumentType(
            f"config must be a mapping of librdkafka settings, got {config!r}"
        )
    for name, value in config.items():
        if not isinstance(name, str):
            raise InvalidArgumentType(f"config keys must be str, got {name!r}")
        if name in _OWN:
            raise InvalidArgument(
                f"config must not set {name!r}: give bootstrap_servers= / publish_timeout="
            )
        required = _REQUIRED.get(name)
        if required is not None and str(value).lower() not in {required, "-1"}:
            raise InvalidArgument(
                f"config {name}={value!r} would break the outbox's guarantees:"
                f" the Kafka publisher runs with {name}={required}"
            )
    if not isinstance(publish_timeout, int | float) or publish_timeout <= 0:
        raise InvalidArgument(f"publish_timeout must be a positive number, got {publish_timeout!r}")
    return {
        "logger": LOGGER,  # librdkafka's log lines go to logging, not to stderr
        **config,
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": max(1, int(publish_timeout * 1000)),
    }


class KafkaPublisher:
    """Publish to Kafka with an idempotent producer; see the module's documentation.

    ``config`` holds further librdkafka producer settings (``security.protocol``,
    ``sasl.*``, ``compression.type``, ``linger.ms``…); an unknown setting raises
    `InvalidArgument` here, not at the first publish.

    Examples:
        publisher = KafkaPublisher("kafka-1:9092,kafka-2:9092", topic="orders")
        relay = Relay(engine, OutboxEvent, publisher)
    """

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        *,
        topic: str | Callable[[ClaimedEvent], str] = _aggregate_type,
        key: Callable[[ClaimedEvent], str] = _aggregate_id,
        config: Mapping[str, Any] | None = None,
        publish_timeout: float = 30.0,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._config = _producer_config(bootstrap_servers, config, publish_timeout)
        self._topic_of = _naming(topic, "topic")
        if not callable(key):
            raise InvalidArgumentType(f"key must be a function of the event, got {key!r}")
        self._key_of = key
        self._publish_timeout = float(publish_timeout)
        self._lock = threading.Lock()
        self._producer: confluent_kafka.Producer | None = self._new_producer()

    def __repr__(self) -> str:
        return f"KafkaPublisher({self.bootstrap_servers!r})"

    def _new_producer(self) -> confluent_kafka.Producer:
        try:
            return confluent_kafka.Producer(self._config)
        except confluent_kafka.KafkaException as exc:  # unknown or invalid setting
            raise InvalidArgument(f"Kafka producer config refused: {exc.args[0].str()}") from exc

    def _record(self, event: ClaimedEvent) -> dict[str, Any]:
        headers = [(name, value.encode()) for name, value in message_headers(event).items()]
        record: dict[str, Any] = {
            "topic": self._topic_of(event),
            "key": self._key_of(event).encode(),
            "value": body_of(event),
            "headers": headers,
        }
        if event.created_at is not None:
            record["timestamp"] = int(event.created_at.timestamp() * 1000)
        return record

    def _deliver(self, events: Sequence[ClaimedEvent]) -> dict[uuid.UUID, _E | str | None]:
        """Produce every event and wait for its delivery report (runs in a thread)."""
        with self._lock:
            if self._producer is None:
                self._producer = self._new_producer()
            producer = self._producer
            reports: dict[uuid.UUID, _E | str | None] = {}

            def on_delivery(event_id: uuid.UUID) -> Callable[[Any, Any], None]:
                return lambda error, _message: reports.__setitem__(event_id, error)

            for event in events:
                record = self._record(event)
                while True:
                    try:
                        producer.produce(**record, on_delivery=on_delivery(event.id))
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.1)
                    except confluent_kafka.KafkaException as exc:  # e.g. record too large
                        reports[event.id] = exc.args[0]
                        break
                    except (TypeError, ValueError) as exc:
                        reports[event.id] = f"the record could not be built: {exc}"
                        break
            # message.timeout.ms bounds every report; the margin covers librdkafka's tick.
            producer.flush(self._publish_timeout + 5.0)
            return reports

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """Produce the batch and wait until Kafka acknowledged every record.

        Examples:
            await publisher.publish(events)
        """
        reports = await asyncio.to_thread(self._deliver, events)
        rejected: dict[uuid.UUID, str] = {}
        unreachable: str | None = None
        for event in events:
            if event.id not in reports:
                unreachable = f"no delivery report within {self._publish_timeout + 5.0} s"
                continue
            error = reports[event.id]
            if error is None:
                continue
            if isinstance(error, str):
                rejected[event.id] = error
                continue
            if error.fatal():  # the idempotent producer cannot go on: a new one next time
                self._producer = None
                unreachable = f"fatal producer error: {error.str()}"
            elif error.retriable() or error.code() in _UNREACHABLE_CODES:
                unreachable = error.str()
            else:
                topic = self._topic_of(event)
                rejected[event.id] = f"Kafka refused the record for {topic!r}: {error.str()}"
        if unreachable is not None:
            raise PublisherUnavailable(f"Kafka {self.bootstrap_servers}: {unreachable}")
        if rejected:
            raise EventsRejected(rejected)

    def _drop(self) -> None:
        # Not under the lock: a publish that timed out may still hold it, waiting in its
        # flush, which the purge ends (its records' reports come back as purged).
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.flush(0)

    def _close(self) -> None:
        self._drop()

    async def reset(self) -> None:
        """Purge the records not yet delivered and replace the producer at the next publish.

        The relay calls it after a publish that timed out or was cancelled; the records it
        purges were not acknowledged, so the relay publishes them again.

        Examples:
            await publisher.reset()
        """
        await asyncio.to_thread(self._drop)

    async def aclose(self) -> None:
        """Drop the records not yet delivered (the relay re-publishes them) and close.

        Examples:
            await publisher.aclose()
        """
        await asyncio.to_thread(self._close)
