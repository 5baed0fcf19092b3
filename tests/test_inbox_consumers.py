"""`sa_outbox.consumers`: each helper reads, from the object the broker's real client hands a
consumer, exactly what the library's real publisher sent (id, type, aggregate, seq, time,
payload, the event's own headers); messages the publishers never send are refused as
`MalformedMessage`; a webhook's signature is checked as `WebhookPublisher` signs it, and a
changed body, a missing or wrong signature are `InvalidSignature`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sa_outbox import InvalidArgumentType
from sa_outbox._wire import sign
from sa_outbox.consumers import (
    InvalidSignature,
    MalformedMessage,
    ReceivedMessage,
    from_kafka,
    from_nats,
    from_rabbitmq,
    from_redis,
    from_webhook,
    verify_signature,
)
from sa_outbox.queue import ClaimedEvent

from .brokers import NATS, RABBITMQ, REDIS, require

SECRET = "webhook-s3cret"
CREATED = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)


def an_event(**changes: Any) -> ClaimedEvent:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "seq": 41,
        "event_type": "OrderPlaced",
        "aggregate_type": "order",
        "aggregate_id": "42",
        "payload": {"amount": 1200, "items": ["a", "é"]},
        "headers": {"traceparent": "00-abc-def-01", "attempt": 2},
        "attempts": 1,
        "relay_until": None,
        "relay_token": uuid.uuid4(),
        "created_at": CREATED,
    }
    return ClaimedEvent(**{**fields, **changes})


def expected(event: ClaimedEvent, headers: dict[str, Any]) -> ReceivedMessage:
    return ReceivedMessage(
        message_id=str(event.id),
        event_type=event.event_type,
        aggregate_type=event.aggregate_type,
        aggregate_id=event.aggregate_id,
        seq=event.seq,
        created_at=event.created_at,
        payload=event.payload,
        headers=headers,
    )


#: The event's own headers as the header-carrying brokers deliver them: strings.
AS_STRINGS = {"traceparent": "00-abc-def-01", "attempt": "2"}


@pytest.fixture
def tag() -> str:
    return f"sa_outbox_inbox_{uuid.uuid4().hex[:12]}"


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture
async def rabbit_queue(tag: str) -> AsyncIterator[Any]:
    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@{RABBITMQ}/")
    try:
        channel = await connection.channel()
        yield await channel.declare_queue(tag, auto_delete=False)
        await channel.queue_delete(tag)
    finally:
        await connection.close()


async def test_rabbitmq_reads_what_the_publisher_sent(rabbit_queue: Any, tag: str) -> None:
    import aio_pika

    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    event = an_event()
    publisher = RabbitMQPublisher(f"amqp://guest:guest@{RABBITMQ}/", routing_key=tag)
    try:
        await publisher.publish([event])
    finally:
        await publisher.aclose()
    incoming = await rabbit_queue.get(timeout=30)
    assert from_rabbitmq(incoming) == expected(event, AS_STRINGS)
    await incoming.ack()

    # A message some other producer put on the queue: not this format.
    exchange = rabbit_queue.channel.default_exchange
    await exchange.publish(aio_pika.Message(b'{"amount": 1}'), routing_key=tag)
    foreign = await rabbit_queue.get(timeout=30)
    with pytest.raises(MalformedMessage, match=r"RabbitMQ message has no event type"):
        from_rabbitmq(foreign)
    await foreign.ack()
    await exchange.publish(aio_pika.Message(b"not json", message_id="m"), routing_key=tag)
    garbled = await rabbit_queue.get(timeout=30)
    with pytest.raises(MalformedMessage, match="RabbitMQ message body is not JSON"):
        from_rabbitmq(garbled)
    await garbled.ack()


# -- NATS JetStream ------------------------------------------------------------------------


@pytest.fixture
async def jetstream(tag: str) -> AsyncIterator[Any]:
    require("NATS", NATS, "nats")
    import nats

    client = await nats.connect(f"nats://{NATS}")
    js = client.jetstream()
    await js.add_stream(name=tag, subjects=[f"{tag}.>"])
    try:
        yield js
    finally:
        await js.delete_stream(tag)
        await client.close()


async def test_nats_reads_what_the_publisher_sent(jetstream: Any, tag: str) -> None:
    from sa_outbox.publishers.nats import NatsPublisher

    event = an_event(created_at=None)
    publisher = NatsPublisher(f"nats://{NATS}", subject=f"{tag}.orders")
    try:
        await publisher.publish([event])
    finally:
        await publisher.aclose()
    subscription = await jetstream.pull_subscribe(f"{tag}.orders", durable="reader")
    [msg] = await subscription.fetch(1, timeout=30)
    assert from_nats(msg) == expected(event, AS_STRINGS)  # Nats-Msg-Id is not the event's
    await msg.ack()

    await jetstream.publish(f"{tag}.orders", b"{}", headers={"outbox-id": "m"})
    [foreign] = await subscription.fetch(1, timeout=30)
    with pytest.raises(MalformedMessage, match=r"NATS message has no event type"):
        from_nats(foreign)
    await foreign.ack()


# -- Redis Streams -------------------------------------------------------------------------


@pytest.fixture
def redis_client(tag: str) -> Iterator[Any]:
    require("Redis", REDIS, "redis")
    import redis

    client = redis.Redis.from_url(f"redis://{REDIS}/0")
    try:
        yield client
    finally:
        client.delete(tag)
        client.close()


def test_redis_reads_what_the_publisher_sent_decoded_or_not(redis_client: Any, tag: str) -> None:
    import redis

    from sa_outbox.publishers.redis import RedisStreamsPublisher

    event = an_event()

    async def publish() -> None:
        publisher = RedisStreamsPublisher(f"redis://{REDIS}/0", stream=tag)
        try:
            await publisher.publish([event])
        finally:
            await publisher.aclose()

    asyncio.run(publish())
    raw = redis_client.xrange(tag)
    assert isinstance(raw[0][1][b"id"], bytes)
    own = {"traceparent": "00-abc-def-01", "attempt": 2}  # the stored JSON, types kept
    assert from_redis(raw[0]) == expected(event, own)  # the (entry_id, fields) pair
    assert from_redis(raw[0][1]) == expected(event, own)  # or its fields
    with redis.Redis.from_url(f"redis://{REDIS}/0", decode_responses=True) as decoded:
        assert from_redis(decoded.xrange(tag)[0]) == expected(event, own)

    redis_client.xadd(tag, {"id": "m", "event_type": "E", "payload": "{}"})
    with pytest.raises(MalformedMessage, match=r"Redis message has no aggregate type"):
        from_redis(redis_client.xrange(tag)[-1])
    with pytest.raises(InvalidArgumentType, match=r"an \(entry_id, fields\) pair"):
        from_redis("1-0")


# -- Kafka (the record's shape, without a broker: confluent-kafka's consumer Message) ------


class KafkaRecord:
    """What confluent-kafka's ``Message`` offers a consumer: ``error()``, ``headers()``,
    ``value()`` (its own class cannot be built outside a consumer; tests/test_inbox_e2e.py
    reads real records from a real broker)."""

    def __init__(self, headers: list[tuple[str, bytes]] | None, value: bytes, error: Any) -> None:
        self._headers, self._value, self._error = headers, value, error

    def error(self) -> Any:
        return self._error

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def value(self) -> bytes:
        return self._value


def test_kafka_reads_the_publishers_record_and_refuses_an_error_report() -> None:
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    from sa_outbox.publishers.kafka import KafkaPublisher

    event = an_event()
    record = KafkaPublisher("127.0.0.1:1")._record(event)  # exactly what it produces
    message = KafkaRecord(record["headers"], record["value"], None)
    assert from_kafka(message) == expected(event, AS_STRINGS)
    with pytest.raises(MalformedMessage, match="an error report, not a record: broker down"):
        from_kafka(KafkaRecord(None, b"", "broker down"))
    bad_seq = [(k, b"x" if k == "outbox-seq" else v) for k, v in record["headers"]]
    with pytest.raises(MalformedMessage, match="has a seq that is not a number: 'x'"):
        from_kafka(KafkaRecord(bad_seq, record["value"], None))


# -- webhooks ------------------------------------------------------------------------------


def signed_request(event: ClaimedEvent) -> tuple[dict[str, str], bytes]:
    """The headers and body `WebhookPublisher` sends for ``event``."""
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox.publishers.webhook import WebhookPublisher

    _url, body, headers = WebhookPublisher("http://127.0.0.1/x", secret=SECRET).request_for(event)
    return headers, body


def test_webhook_verifies_and_reads_what_the_publisher_sent() -> None:
    event = an_event()
    headers, body = signed_request(event)
    own = {"traceparent": "00-abc-def-01", "attempt": 2}
    assert from_webhook(headers, body, secret=SECRET) == expected(event, own)
    lower = {name.lower(): value for name, value in headers.items()}  # servers lower-case
    assert from_webhook(lower, bytearray(body), secret=SECRET.encode()).message_id == str(event.id)
    verify_signature(headers, body, secret=SECRET)


def tampered(body: bytes) -> bytes:
    envelope = json.loads(body)
    envelope["payload"]["amount"] = 1
    return json.dumps(envelope, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h, b: (h, tampered(b)), "does not match the body: the body was changed"),
        (lambda h, b: (h, b + b" "), "does not match the body"),
        (
            lambda h, b: ({k: v for k, v in h.items() if k != "X-Outbox-Signature"}, b),
            "the request has no X-Outbox-Signature header: it is not signed",
        ),
        (
            lambda h, b: ({**h, "X-Outbox-Signature": sign(b"another secret", b)}, b),
            "signed with another secret",
        ),
        (
            lambda h, b: ({**h, "X-Outbox-Signature": "md5=abc"}, b),
            "is not sha256=<hex HMAC-SHA256>",
        ),
        (lambda h, b: ({**h, "X-Outbox-Signature": "sha256=é"}, b), "does not match the body"),
    ],
)
def test_webhook_refuses_a_bad_or_missing_signature(change: Any, message: str) -> None:
    headers, body = change(*signed_request(an_event()))
    with pytest.raises(InvalidSignature, match=message):
        from_webhook(headers, body, secret=SECRET)
    with pytest.raises(InvalidSignature, match=message):
        verify_signature(headers, body, secret=SECRET)


def test_webhook_malformed_bodies_and_arguments() -> None:
    event = an_event()
    headers, body = signed_request(event)

    def signed(raw: bytes) -> dict[str, str]:
        return {"X-Outbox-Signature": sign(SECRET.encode(), raw)}

    with pytest.raises(MalformedMessage, match="webhook body is not JSON"):
        from_webhook(signed(b"<html>"), b"<html>", secret=SECRET)
    with pytest.raises(MalformedMessage, match="webhook body is not a JSON object"):
        from_webhook(signed(b"[1]"), b"[1]", secret=SECRET)
    with pytest.raises(MalformedMessage, match=r"webhook message has no message id"):
        from_webhook(signed(b"{}"), b"{}", secret=SECRET)
    with pytest.raises(MalformedMessage, match="Idempotency-Key header 'other' is not the body"):
        from_webhook({**headers, "Idempotency-Key": "other"}, body, secret=SECRET)
    with pytest.raises(InvalidArgumentType, match="body must be the request's raw bytes"):
        from_webhook(headers, body.decode(), secret=SECRET)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="secret must be a str or bytes, got int"):
        from_webhook(headers, body, secret=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidSignature, match="the webhook secret is empty"):
        from_webhook(headers, body, secret="")
    with pytest.raises(InvalidArgumentType, match="headers must be the request's headers"):
        from_webhook(None, body, secret=SECRET)  # type: ignore[arg-type]
    # secret=None, said explicitly: no signature checked (a publisher without a secret).
    unsigned = {k: v for k, v in headers.items() if k != "X-Outbox-Signature"}
    assert from_webhook(unsigned, tampered(body), secret=None).payload["amount"] == 1
