"""Read an outbox event out of what a broker's client hands a consumer.

Each function takes the client's own received object and reads it by its attributes, so
this module imports no client library: aio-pika's ``IncomingMessage``, nats-py's ``Msg``,
a redis-py stream entry, confluent-kafka's ``Message``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._exceptions import InvalidArgumentType
from .._wire import HEADER_EVENT_TYPE, HEADER_ID, NATS_MSG_ID
from ._message import (
    MalformedMessage,
    ReceivedMessage,
    as_text,
    decode_json,
    from_fields,
    from_headers,
)

__all__ = ["from_kafka", "from_nats", "from_rabbitmq", "from_redis"]


def _text_headers(pairs: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        text = as_text(value)
        if text is not None:
            headers[str(name)] = text
    return headers


def from_rabbitmq(message: Any) -> ReceivedMessage:
    """The event in an aio-pika ``IncomingMessage`` (or any AMQP message with the same
    properties): ``message_id`` and ``type`` properties, ``outbox-*`` headers, JSON body.

    It neither acknowledges nor rejects the message: that stays yours, after your
    transaction commits (``async with message.process():`` around it).

    Examples:
        async with incoming.process():
            message = from_rabbitmq(incoming)
            with Session(engine) as session, session.begin():
                if inbox.accept(session, message.message_id, source="orders"):
                    apply(session, message)
    """
    headers = _text_headers((message.headers or {}).items())
    payload = decode_json(message.body, "RabbitMQ message body")
    return from_headers(
        "RabbitMQ",
        headers,
        payload,
        # The publisher sets both the headers and the properties; a property may also come
        # from elsewhere (a client that fills message_id in), so the header wins.
        message_id=headers.get(HEADER_ID) or as_text(message.message_id),
        event_type=headers.get(HEADER_EVENT_TYPE) or as_text(message.type),
    )


def from_nats(message: Any) -> ReceivedMessage:
    """The event in a nats-py ``Msg`` (JetStream or core): ``outbox-*`` headers (the id also
    as ``Nats-Msg-Id``), JSON data. Acknowledge it yourself once your transaction commits.

    Examples:
        message = from_nats(msg)
        with Session(engine) as session, session.begin():
            if inbox.accept(session, message.message_id, source="orders"):
                apply(session, message)
        await msg.ack()
    """
    headers = _text_headers((message.headers or {}).items())
    payload = decode_json(message.data, "NATS message data")
    return from_headers(
        "NATS",
        headers,
        payload,
        message_id=headers.get(HEADER_ID) or headers.get(NATS_MSG_ID),
        drop=(NATS_MSG_ID,),
    )


def _stream_fields(entry: object) -> Mapping[Any, Any]:
    if isinstance(entry, Mapping):
        return entry
    if (
        isinstance(entry, Sequence)
        and not isinstance(entry, str | bytes)
        and len(entry) == 2
        and isinstance(entry[1], Mapping)
    ):
        return entry[1]
    raise InvalidArgumentType(
        "a Redis stream entry is an (entry_id, fields) pair, as XREAD / XREADGROUP return "
        f"it, or its fields mapping; got {type(entry).__name__}"
    )


def from_redis(entry: object) -> ReceivedMessage:
    """The event in a Redis stream entry, ``(entry_id, fields)`` as redis-py's ``xread`` /
    ``xreadgroup`` return it (or the fields alone), with or without ``decode_responses``.

    Fields as ``RedisStreamsPublisher`` writes them: ``id``, ``event_type``,
    ``aggregate_type``, ``aggregate_id``, ``seq``, ``created_at``, ``headers`` (JSON) and
    ``payload`` (JSON); other fields are ignored. ``XACK`` it once your transaction commits.

    Examples:
        for entry_id, fields in entries:
            message = from_redis((entry_id, fields))
            with Session(engine) as session, session.begin():
                if inbox.accept(session, message.message_id, source="orders"):
                    apply(session, message)
            client.xack(stream, group, entry_id)
    """
    fields = {as_text(name): value for name, value in _stream_fields(entry).items()}
    headers = decode_json(as_text(fields.get("headers")) or "{}", "Redis entry's headers field")
    if not isinstance(headers, dict):
        raise MalformedMessage(f"Redis entry's headers field is not a JSON object: {headers!r}")
    return from_fields(
        "Redis",
        message_id=as_text(fields.get("id")),
        event_type=as_text(fields.get("event_type")),
        aggregate_type=as_text(fields.get("aggregate_type")),
        aggregate_id=as_text(fields.get("aggregate_id")),
        seq=as_text(fields.get("seq")),
        created_at=as_text(fields.get("created_at")),
        payload=decode_json(as_text(fields.get("payload")), "Redis entry's payload field"),
        headers=headers,
    )


def from_kafka(message: Any) -> ReceivedMessage:
    """The event in a confluent-kafka ``Message``: ``outbox-*`` headers, JSON value (the key
    is the aggregate id). A message that is an error report (``message.error()``) is refused.
    Commit its offset yourself once your transaction commits.

    Examples:
        record = consumer.poll(1.0)
        message = from_kafka(record)
        with Session(engine) as session, session.begin():
            if inbox.accept(session, message.message_id, source="orders"):
                apply(session, message)
        consumer.commit(record, asynchronous=False)
    """
    error = message.error()
    if error is not None:
        raise MalformedMessage(f"the Kafka message is an error report, not a record: {error}")
    headers = _text_headers(message.headers() or [])
    payload = decode_json(message.value(), "Kafka record value")
    return from_headers("Kafka", headers, payload)
