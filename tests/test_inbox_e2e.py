"""The inbox end to end: relay → real broker → consumer, every event applied exactly once.

For each broker: outbox events are committed; ``sa-outbox relay`` (a real process) publishes
them and is SIGKILLed between the publish and the mark; a second relay, once the first one's
lease has run out, publishes them all again. A consumer receives every message and, in ONE
transaction per message, accepts it in its inbox and applies it to a table of its own only
when ``accept`` said it was new; it acknowledges after the commit. Where the broker removes
the relay's duplicate itself (JetStream, by ``Nats-Msg-Id``), a consumer that dies after
its commit and before its ack makes the broker redeliver instead. At the end: each event
applied once, the inbox holding each id once, and the broker having delivered duplicates
(so the de-duplication was exercised). Webhooks: a real HTTP server verifies the signature
of each request; a tampered body, a missing or wrong signature change nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from sa_outbox import AsyncInbox, FakeClock, Inbox, Outbox
from sa_outbox.consumers import (
    InvalidSignature,
    MalformedMessage,
    ReceivedMessage,
    from_kafka,
    from_nats,
    from_rabbitmq,
    from_redis,
    from_webhook,
)

from .brokers import NATS, RABBITMQ, REDIS, require
from .conftest import TEST_SCHEMA, OutboxEvent
from .inbox_bed import (
    SOURCE,
    Applied,
    InboxEntry,
    amounts_total,
    applied_counts,
    create_consumer_tables,
    drop_consumer_tables,
    handle,
    inbox_keys,
    publisher,
    truncate_consumer_tables,
)
from .test_relay_processes import read_line

ROOT = Path(__file__).resolve().parents[1]
WAIT = 120.0
N = 12
SECRET = "e2e-webhook-secret"


@pytest.fixture(scope="module")
def consumer_tables(engine: Engine) -> Iterator[None]:
    create_consumer_tables(engine)
    yield
    drop_consumer_tables(engine)


@pytest.fixture(autouse=True)
def _empty(engine: Engine, consumer_tables: None) -> None:
    truncate_consumer_tables(engine)


@pytest.fixture
def tag() -> str:
    return f"sa_outbox_inbox_{uuid.uuid4().hex[:12]}"


def append_events(engine: Engine) -> list[str]:
    """N events, one aggregate each (so one relay batch takes them all); amounts 1..N."""
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        return [
            str(
                outbox.append(
                    conn,
                    event_type="Credited",
                    aggregate_type="account",
                    aggregate_id=f"acct-{i}",
                    payload={"amount": i + 1},
                )
            )
            for i in range(N)
        ]


def unpublished(engine: Engine) -> int:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar_one()
        )


def kill_between_publish_and_mark(
    engine: Engine, database_url: str, broker: str, target: str, ids: list[str], **env: str
) -> None:
    """``sa-outbox relay`` publishes every event, then is SIGKILLed before it marks them."""
    environment = {
        **os.environ,
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": TEST_SCHEMA,
        "INBOX_APP_BROKER": broker,
        "INBOX_APP_TARGET": target,
        "RELAY_APP_HANG_AFTER_PUBLISH": "1",
        **env,
    }
    relay = subprocess.Popen(
        [sys.executable, "-m", "sa_outbox", "relay", "tests.inbox_bed:relay"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(relay, WAIT)
        assert line.split()[0] == "published"
        assert sorted(line.split()[1:]) == sorted(ids)
    finally:
        relay.send_signal(signal.SIGKILL)  # the broker has them; the outbox does not know
        relay.communicate(timeout=WAIT)
    assert relay.returncode == -signal.SIGKILL
    assert unpublished(engine) == N


def republish(engine: Engine, broker: str, target: str, secret: str | None = None) -> None:
    """Another relay, once the dead one's lease (600 s) ran out, publishes them all again."""
    from sa_outbox.relay import Relay

    later = FakeClock(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    with Relay(engine, OutboxEvent, publisher(broker, target, secret), clock=later) as survivor:
        published = 0
        while (report := survivor.run_once()).claimed:
            published += report.published
    assert published == N
    assert unpublished(engine) == 0


def assert_applied_exactly_once(
    engine: Engine, ids: list[str], deliveries: collections.Counter[str], accepted: int
) -> None:
    assert set(deliveries) == set(ids)  # every event reached the consumer
    assert sum(deliveries.values()) > N  # and some more than once: the dedup was exercised
    assert accepted == N  # accept said "new" once per event, "seen" for every duplicate
    assert applied_counts(engine) == {message_id: 1 for message_id in ids}
    assert amounts_total(engine) == N * (N + 1) // 2
    assert inbox_keys(engine) == sorted((SOURCE, message_id) for message_id in ids)


async def handle_async(
    async_engine: AsyncEngine, inbox: AsyncInbox, message: ReceivedMessage
) -> bool:
    """`tests.inbox_bed.handle` on asyncio: one transaction, accept then apply if new."""
    async with AsyncSession(async_engine) as session, session.begin():
        accepted = await inbox.accept(session, message.message_id, source=SOURCE)
        if accepted:
            session.add(Applied(message_id=message.message_id, amount=message.payload["amount"]))
    return accepted


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture
async def rabbit(tag: str) -> AsyncIterator[Any]:
    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@{RABBITMQ}/")
    try:
        channel = await connection.channel()
        await channel.declare_queue(tag)
        yield connection
        await channel.queue_delete(tag)
    finally:
        await connection.close()


async def test_rabbitmq_relay_killed_and_consumer_killed_each_event_applied_once(
    engine: Engine, async_engine: AsyncEngine, database_url: str, rabbit: Any, tag: str
) -> None:
    import aio_pika

    ids = append_events(engine)
    await asyncio.to_thread(
        kill_between_publish_and_mark, engine, database_url, "rabbitmq", tag, ids
    )
    await asyncio.to_thread(republish, engine, "rabbitmq", tag)

    inbox = AsyncInbox(InboxEntry)
    deliveries: collections.Counter[str] = collections.Counter()
    accepted = 0
    redelivered: list[str] = []

    # A first consumer commits 5 messages and dies before acknowledging them.
    doomed = await aio_pika.connect(f"amqp://guest:guest@{RABBITMQ}/")
    try:
        channel = await doomed.channel()
        await channel.set_qos(prefetch_count=5)  # it holds 5 at most: those come back
        queue = await channel.get_queue(tag)
        async with asyncio.timeout(WAIT), queue.iterator() as messages:
            async for incoming in messages:
                message = from_rabbitmq(incoming)
                deliveries[message.message_id] += 1
                accepted += await handle_async(async_engine, inbox, message)
                if sum(deliveries.values()) == 5:
                    break  # committed, never acknowledged
    finally:
        await doomed.close()  # RabbitMQ requeues the 5 unacknowledged messages

    # A second consumer takes everything left: 2N - 5 messages, and the 5 again.
    channel = await rabbit.channel()
    queue = await channel.get_queue(tag)
    async with asyncio.timeout(WAIT), queue.iterator() as messages:
        async for incoming in messages:
            async with incoming.process():  # acknowledged once the transaction committed
                message = from_rabbitmq(incoming)
                deliveries[message.message_id] += 1
                if incoming.redelivered:
                    redelivered.append(message.message_id)
                accepted += await handle_async(async_engine, inbox, message)
            if sum(deliveries.values()) == 2 * N + 5:
                break
    assert await queue.get(fail=False) is None  # nothing left, nothing more
    assert len(redelivered) == 5
    assert sorted(deliveries.values()) == [2] * (N - 5) + [3] * 5
    assert_applied_exactly_once(engine, ids, deliveries, accepted)


# -- Redis Streams -------------------------------------------------------------------------


@pytest.fixture
def redis_client(tag: str) -> Iterator[Any]:
    require("Redis", REDIS, "redis")
    import redis

    client = redis.Redis.from_url(f"redis://{REDIS}/0")
    try:
        client.xgroup_create(tag, "consumers", id="0", mkstream=True)
        yield client
    finally:
        client.delete(tag)
        client.close()


def test_redis_relay_killed_and_consumer_killed_each_event_applied_once(
    engine: Engine, database_url: str, redis_client: Any, tag: str
) -> None:
    ids = append_events(engine)
    kill_between_publish_and_mark(engine, database_url, "redis", tag, ids)
    republish(engine, "redis", tag)
    assert redis_client.xlen(tag) == 2 * N  # Redis keeps both copies

    inbox = Inbox(InboxEntry)
    deliveries: collections.Counter[str] = collections.Counter()
    accepted = 0

    def consume(entries: list[Any], *, ack: bool) -> None:
        nonlocal accepted
        for entry_id, fields in entries:
            message = from_redis((entry_id, fields))
            deliveries[message.message_id] += 1
            accepted += handle(engine, inbox, message)
            if ack:
                redis_client.xack(tag, "consumers", entry_id)

    # "doomed" reads 4 entries, commits them, and dies before XACK: they stay pending.
    [(_, doomed)] = redis_client.xreadgroup("consumers", "doomed", {tag: ">"}, count=4)
    consume(doomed, ack=False)
    # "survivor" reads the rest, then claims what "doomed" left pending.
    while reply := redis_client.xreadgroup("consumers", "survivor", {tag: ">"}, count=5):
        consume(reply[0][1], ack=True)
    _next, claimed, _deleted = redis_client.xautoclaim(tag, "consumers", "survivor", 0)
    assert len(claimed) == 4
    consume(claimed, ack=True)

    assert redis_client.xpending(tag, "consumers")["pending"] == 0
    assert sum(deliveries.values()) == 2 * N + 4
    assert_applied_exactly_once(engine, ids, deliveries, accepted)


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


async def test_nats_broker_dedups_the_relay_and_the_inbox_dedups_redelivery(
    engine: Engine, async_engine: AsyncEngine, database_url: str, jetstream: Any, tag: str
) -> None:
    import nats
    import nats.errors
    from nats.js.api import ConsumerConfig

    subject = f"{tag}.accounts"
    ids = append_events(engine)
    await asyncio.to_thread(
        kill_between_publish_and_mark, engine, database_url, "nats", subject, ids
    )
    await asyncio.to_thread(republish, engine, "nats", subject)
    # JetStream stored each event once: the second publish had the same Nats-Msg-Id.
    assert (await jetstream.stream_info(tag)).state.messages == N

    inbox = AsyncInbox(InboxEntry)
    deliveries: collections.Counter[str] = collections.Counter()
    accepted = 0
    config = ConsumerConfig(ack_wait=1.0, max_ack_pending=N)

    # A first consumer commits 5 messages and dies before acknowledging them.
    doomed = await nats.connect(f"nats://{NATS}")
    try:
        subscription = await doomed.jetstream().pull_subscribe(subject, "inbox", config=config)
        for msg in await subscription.fetch(5, timeout=WAIT):
            message = from_nats(msg)
            deliveries[message.message_id] += 1
            accepted += await handle_async(async_engine, inbox, message)
    finally:
        await doomed.close()  # after ack_wait, JetStream redelivers those 5

    subscription = await jetstream.pull_subscribe(subject, "inbox", config=config)
    redelivered = 0
    async with asyncio.timeout(WAIT):
        while sum(deliveries.values()) < N + 5:
            try:
                batch = await subscription.fetch(N, timeout=2)
            except nats.errors.TimeoutError:
                continue  # the redeliveries come once ack_wait has passed
            for msg in batch:
                message = from_nats(msg)
                deliveries[message.message_id] += 1
                redelivered += msg.metadata.num_delivered > 1
                accepted += await handle_async(async_engine, inbox, message)
                await msg.ack_sync()  # acknowledged once the transaction committed
    assert redelivered == 5
    assert sorted(deliveries.values()) == [1] * (N - 5) + [2] * 5
    assert_applied_exactly_once(engine, ids, deliveries, accepted)


# -- Kafka ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from .kafka import run_broker

    yield from run_broker(tmp_path_factory)


@pytest.fixture
def topic(kafka_broker: Any, tag: str) -> Iterator[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_broker.address})
    admin.create_topics([NewTopic(tag, 3, 1)])[tag].result(WAIT)
    yield tag
    admin.delete_topics([tag])[tag].result(WAIT)


def test_kafka_relay_killed_each_event_applied_once(
    engine: Engine, database_url: str, kafka_broker: Any, topic: str
) -> None:
    import logging

    import confluent_kafka

    from sa_outbox.publishers.kafka import KafkaPublisher
    from sa_outbox.relay import Relay

    from .kafka import start_relay

    ids = append_events(engine)
    doomed = start_relay(database_url, TEST_SCHEMA, kafka_broker.address, topic)
    try:
        line = read_line(doomed, WAIT)
        assert line.split()[0] == "published" and sorted(line.split()[1:]) == sorted(ids)
    finally:
        doomed.send_signal(signal.SIGKILL)  # after Kafka acknowledged, before the mark
        doomed.communicate(timeout=WAIT)
    assert doomed.returncode == -signal.SIGKILL and unpublished(engine) == N
    later = FakeClock(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    kafka = KafkaPublisher(kafka_broker.address, topic=topic, publish_timeout=20)
    with Relay(engine, OutboxEvent, kafka, clock=later) as survivor:
        while survivor.run_once().claimed:
            pass
    assert unpublished(engine) == 0

    inbox = Inbox(InboxEntry)
    deliveries: collections.Counter[str] = collections.Counter()
    accepted = 0
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_broker.address,
            "group.id": f"{topic}-inbox",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "logger": logging.getLogger("tests.kafka"),
        }
    )
    try:
        consumer.subscribe([topic])
        for _ in range(int(WAIT)):
            record = consumer.poll(1.0)
            if record is None:
                continue
            message = from_kafka(record)
            deliveries[message.message_id] += 1
            accepted += handle(engine, inbox, message)
            consumer.commit(record, asynchronous=False)  # once the transaction committed
            if sum(deliveries.values()) == 2 * N:
                break
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
    assert sorted(deliveries.values()) == [2] * N  # Kafka kept both copies of each
    assert_applied_exactly_once(engine, ids, deliveries, accepted)


# -- webhooks ------------------------------------------------------------------------------


class WebhookReceiver:
    """A real HTTP server, on a thread: it verifies each request's signature and applies
    its event in one transaction (200); a bad signature gets 401, a bad body 400."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.inbox = Inbox(InboxEntry)
        self.deliveries: collections.Counter[str] = collections.Counter()
        self.accepted = 0
        self.refused: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.receive(self.headers, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/outbox"

    def receive(self, headers: Any, body: bytes) -> int:
        try:
            message = from_webhook(headers, body, secret=SECRET)
        except InvalidSignature as exc:
            with self.lock:
                self.refused.append((401, str(exc)))
            return 401
        except MalformedMessage as exc:
            with self.lock:
                self.refused.append((400, str(exc)))
            return 400
        accepted = handle(self.engine, self.inbox, message)
        with self.lock:
            self.deliveries[message.message_id] += 1
            self.accepted += accepted
        return 200

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT)


@pytest.fixture
def receiver(engine: Engine) -> Iterator[WebhookReceiver]:
    pytest.importorskip("httpx", reason="httpx is not installed")
    server = WebhookReceiver(engine)
    try:
        yield server
    finally:
        server.close()


def test_webhook_relay_killed_each_event_applied_once_and_forgeries_refused(
    engine: Engine, database_url: str, receiver: WebhookReceiver
) -> None:
    import httpx

    from sa_outbox.publishers.webhook import WebhookPublisher

    ids = append_events(engine)
    kill_between_publish_and_mark(
        engine, database_url, "webhook", receiver.url, ids, INBOX_APP_SECRET=SECRET
    )
    assert receiver.accepted == N  # the server applied them all before the relay died
    republish(engine, "webhook", receiver.url, SECRET)
    assert sorted(receiver.deliveries.values()) == [2] * N
    assert receiver.refused == []
    assert_applied_exactly_once(engine, ids, receiver.deliveries, receiver.accepted)

    # Requests that are not the publisher's: a changed body, no or a wrong signature.
    from sa_outbox.queue import ClaimedEvent

    forged_id = uuid.uuid4()
    event = ClaimedEvent(
        forged_id, 1, "Credited", "account", "acct-x", {"amount": 1000}, {}, 1, None,
        uuid.uuid4(), None,
    )  # fmt: skip
    _url, body, headers = WebhookPublisher(receiver.url, secret=SECRET).request_for(event)
    envelope = json.loads(body)
    envelope["payload"]["amount"] = 1_000_000
    changed = json.dumps(envelope, separators=(",", ":")).encode()
    other = WebhookPublisher(receiver.url, secret="not-the-secret").request_for(event)[2]
    unsigned = {k: v for k, v in headers.items() if k != "X-Outbox-Signature"}
    with httpx.Client(timeout=WAIT) as client:
        answers = [
            client.post(receiver.url, content=changed, headers=headers).status_code,
            client.post(receiver.url, content=body, headers=unsigned).status_code,
            client.post(receiver.url, content=body, headers=other).status_code,
            client.post(receiver.url, content=b"[]", headers=unsigned | {"X": "y"}).status_code,
        ]
    assert answers == [401, 401, 401, 401]
    assert [status for status, _reason in receiver.refused] == [401, 401, 401, 401]
    assert "does not match the body" in receiver.refused[0][1]
    assert "has no X-Outbox-Signature header" in receiver.refused[1][1]
    assert str(forged_id) not in receiver.deliveries
    assert_applied_exactly_once(engine, ids, receiver.deliveries, receiver.accepted)
