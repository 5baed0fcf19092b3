"""The relay against a broker whose network goes silent, then comes back (a half-open
connection): every publisher, behind a `BlackholeProxy` that drops what is sent to it.

What must hold, for each publisher with its default settings and a relay whose publish
timeout (half its lease) comes before the publisher's own timeouts: the publish that the
silence swallowed times out, the relay resets the publisher (logging it), and once the
network is back the relay publishes again, within a bound that proves it did not stay stuck
on the dead connection. At the end the broker holds exactly the events enqueued: nothing
lost; a duplicate only where at-least-once allows one (an event whose publish the silence
interrupted), and counted.
"""

from __future__ import annotations

import asyncio
import collections
import http.server
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sa_outbox import Outbox
from sa_outbox.relay import AsyncRelay, Relay

from .blackhole import BlackholeProxy
from .brokers import NATS, RABBITMQ, REDIS, require
from .conftest import OutboxEvent

#: The relay's lease: its publish timeout is half of it (the default), shorter than every
#: publisher's own timeouts, as with any lease of 20 s or less.
LEASE = 8.0
#: Per phase of a test (the relay publishing what was enqueued), and after the restore.
BOUND = 30.0
N = 5


@pytest.fixture
def tag() -> str:
    return f"sa_outbox_half_open_{uuid.uuid4().hex[:12]}"


def append(engine: Engine, n: int, phase: str) -> list[str]:
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        return [
            str(
                outbox.append(
                    conn,
                    event_type="Tick",
                    aggregate_type="tick",
                    aggregate_id=f"{phase}-{i}",
                    payload={"phase": phase, "i": i},
                )
            )
            for i in range(n)
        ]


def unpublished(engine: Engine) -> int:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(t.c.published_at.is_(None), t.c.parked_at.is_(None))
            ).scalar_one()
        )


def timed_out(engine: Engine) -> bool:
    """Whether a publish timed out (the relay's timeout, recorded in last_error)."""
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        n = conn.execute(
            select(func.count()).where(t.c.last_error.like("%did not finish within%"))
        ).scalar_one()
    return bool(n)


def wait_for(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition`` until it holds; returns how long it took (fails after ``within``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > within:
            pytest.fail(f"{what}: not within {within} s")
        time.sleep(0.1)
    return time.monotonic() - start


class Running:
    """A relay running in a thread of its own (`Relay`, or `AsyncRelay` on its own loop)."""

    def __init__(self, engine: Engine, publisher: Any, kind: str) -> None:
        self._stop: Callable[[], None]
        self._thread = threading.Thread(target=self._run, args=(engine, publisher, kind))
        self._ready = threading.Event()
        self._thread.start()
        assert self._ready.wait(BOUND)

    def _run(self, engine: Engine, publisher: Any, kind: str) -> None:
        if kind == "sync":
            relay = Relay(engine, OutboxEvent, publisher, lease=LEASE)
            self._stop = relay.stop
            self._ready.set()
            try:
                relay.run()
            finally:
                relay.close()
        else:
            asyncio.run(self._run_async(engine, publisher))

    async def _run_async(self, engine: Engine, publisher: Any) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        async_engine = create_async_engine(engine.url)
        relay = AsyncRelay(async_engine, OutboxEvent, publisher, lease=LEASE)
        self._stop = relay.stop
        self._ready.set()
        try:
            await relay.run()
        finally:
            await relay.aclose()
            await async_engine.dispose()

    def stop(self) -> None:
        self._stop()
        self._thread.join(BOUND)
        assert not self._thread.is_alive(), "the relay did not stop"


def through_silence(
    engine: Engine,
    publisher: Any,
    proxy: BlackholeProxy,
    received: Callable[[], list[str]],
    caplog: pytest.LogCaptureFixture,
    kind: str = "sync",
    drop: bool = True,
) -> int:
    """Publish, go silent until a publish timed out, restore; check the broker got it all.
    ``drop``: the silence discards the bytes (else holds them and delivers them late, as
    TCP retransmits once a network is back). Returns how many copies the broker got."""
    caplog.set_level(logging.WARNING, logger="sa_outbox.relay")
    relay = Running(engine, publisher, kind)
    try:
        before = append(engine, N, "before")
        wait_for(lambda: unpublished(engine) == 0, BOUND, "publishing before the silence")
        proxy.blackhole(drop=drop)
        during = append(engine, N, "during")
        # Silent for longer than the publish timeout: until the relay gave up on a publish.
        wait_for(lambda: timed_out(engine), BOUND, "a publish timing out in the silence")
        assert proxy.holding.is_set()  # the relay's bytes went into the silence
        assert (proxy.dropped > 0) == drop
        proxy.restore()
        after = append(engine, N, "after")
        took = wait_for(lambda: unpublished(engine) == 0, BOUND, "publishing after the restore")
    finally:
        proxy.restore()
        relay.stop()
    assert took < BOUND  # did not stay stuck on the dead connection
    resets = [r.getMessage() for r in caplog.records if "its connection was reset" in r.message]
    assert resets, "the relay did not say it reset the publisher"
    enqueued = set(before + during + after)
    got = received()
    copies = collections.Counter(got)
    assert set(copies) == enqueued, (
        f"missing {enqueued - set(copies)}, unexpected {set(copies) - enqueued}"
    )
    duplicated = {event for event, n in copies.items() if n > 1}
    # At-least-once: only an event whose publish the silence interrupted may come twice.
    assert duplicated <= set(during), duplicated
    assert len(got) - len(enqueued) <= len(during), f"{len(got) - len(enqueued)} duplicates"
    return len(got) - len(enqueued)


# -- RabbitMQ -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "drop"), [("sync", True), ("async", True), ("sync", False)], ids=str
)
def test_rabbitmq_publishes_again_after_a_silent_network(
    engine: Engine, tag: str, kind: str, drop: bool, caplog: pytest.LogCaptureFixture
) -> None:
    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    url = f"amqp://guest:guest@{RABBITMQ}/"

    async def declare() -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(tag, auto_delete=False)

    async def drain() -> list[str]:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(tag)
            ids = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                ids.append(str(message.message_id))
            await queue.delete(if_unused=False, if_empty=False)
            return ids

    asyncio.run(declare())
    with BlackholeProxy(RABBITMQ) as proxy:
        publisher = RabbitMQPublisher(f"amqp://guest:guest@{proxy.address}/", routing_key=tag)
        copies = through_silence(
            engine, publisher, proxy, lambda: asyncio.run(drain()), caplog, kind, drop
        )
    if drop:  # what the silence swallowed never reached the broker: no copy
        assert copies == 0


# -- NATS JetStream -------------------------------------------------------------------------


def test_nats_publishes_again_after_a_silent_network(
    engine: Engine, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    require("NATS", NATS, "nats")
    import nats

    from sa_outbox.publishers.nats import NatsPublisher

    async def add_stream() -> None:
        client = await nats.connect(f"nats://{NATS}")
        await client.jetstream().add_stream(name=tag, subjects=[f"{tag}.>"])
        await client.close()

    async def messages() -> list[str]:
        client = await nats.connect(f"nats://{NATS}")
        js = client.jetstream()
        info = await js.stream_info(tag)
        found = [await js.get_msg(tag, seq) for seq in range(1, info.state.messages + 1)]
        await js.delete_stream(tag)
        await client.close()
        return [(m.headers or {})["Nats-Msg-Id"] for m in found]

    asyncio.run(add_stream())
    with BlackholeProxy(NATS) as proxy:
        publisher = NatsPublisher(f"nats://{proxy.address}", subject=f"{tag}.tick")
        through_silence(engine, publisher, proxy, lambda: asyncio.run(messages()), caplog)


# -- Redis Streams --------------------------------------------------------------------------


def test_redis_publishes_again_after_a_silent_network(
    engine: Engine, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    require("Redis", REDIS, "redis")
    import redis

    from sa_outbox.publishers.redis import RedisStreamsPublisher

    def entries() -> list[str]:
        client = redis.Redis.from_url(f"redis://{REDIS}/0", decode_responses=True)
        try:
            return [fields["id"] for _, fields in client.xrange(tag)]
        finally:
            client.delete(tag)
            client.close()

    with BlackholeProxy(REDIS) as proxy:
        publisher = RedisStreamsPublisher(f"redis://{proxy.address}/0", stream=tag)
        through_silence(engine, publisher, proxy, entries, caplog)


# -- webhook --------------------------------------------------------------------------------


@pytest.fixture
def hook_server() -> Iterator[tuple[int, list[str]]]:
    received: list[str] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connection

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(self.headers["Idempotency-Key"])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.block_on_close = False  # a request the blackhole swallowed never ends
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(BOUND)


def test_webhook_publishes_again_after_a_silent_network(
    engine: Engine, hook_server: tuple[int, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("httpx", reason="the webhook client (httpx) is not installed")
    from sa_outbox.publishers.webhook import WebhookPublisher

    port, received = hook_server
    with BlackholeProxy(("127.0.0.1", port)) as proxy:
        publisher = WebhookPublisher(f"http://{proxy.address}/hook")
        through_silence(engine, publisher, proxy, lambda: list(received), caplog)


# -- Kafka ----------------------------------------------------------------------------------


def test_kafka_publishes_again_after_a_silent_network(
    engine: Engine, tag: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from .kafka import broker_behind_blackhole

    with broker_behind_blackhole(tmp_path) as (address, proxy):
        from confluent_kafka.admin import AdminClient, NewTopic

        from sa_outbox.publishers.kafka import KafkaPublisher

        admin = AdminClient({"bootstrap.servers": address, "logger": logging.getLogger("tests")})
        admin.create_topics([NewTopic(tag, 1, 1)])[tag].result(BOUND)
        del admin  # closed now, not by the collector once the broker is gone
        publisher = KafkaPublisher(address, topic=tag)
        through_silence(engine, publisher, proxy, lambda: records(address, tag, 3 * N), caplog)


def records(address: str, topic: str, n: int) -> list[str]:
    """The ``outbox-id`` of the records of the topic's one partition: ``n`` distinct ones,
    then any copies that follow (read by assignment: no consumer group to join, which takes
    the broker many seconds)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
            "logger": logging.getLogger("tests.kafka"),
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        ids: list[str] = []
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                if len(set(ids)) >= n:
                    break  # and nothing more came within a second: no copy behind them
                continue
            assert message.error() is None, message.error()
            ids.append(dict(message.headers() or [])["outbox-id"].decode())
        return ids
    finally:
        consumer.close()


# -- the relay's side, without a broker -----------------------------------------------------


class Hanging:
    """A publisher whose publish never ends (a half-open connection), counting resets."""

    def __init__(self) -> None:
        self.publishing = asyncio.Event()
        self.resets = 0

    async def publish(self, events: Any) -> None:
        self.publishing.set()
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        pass

    async def reset(self) -> None:
        self.resets += 1


async def test_a_cancelled_publish_resets_the_publisher(engine: Engine, async_engine: Any) -> None:
    append(engine, 1, "cancelled")
    publisher = Hanging()
    relay = AsyncRelay(async_engine, OutboxEvent, publisher, lease=LEASE)
    cycle = asyncio.create_task(relay.run_once())
    await asyncio.wait_for(publisher.publishing.wait(), BOUND)
    cycle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cycle
    assert publisher.resets == 1
    assert unpublished(engine) == 1  # still claimed until its lease ends: nothing lost


def test_a_publisher_without_reset_still_times_out_cleanly(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    class NoReset:
        async def publish(self, events: Any) -> None:
            await asyncio.Event().wait()

        async def aclose(self) -> None:
            pass

    append(engine, 2, "no-reset")
    caplog.set_level(logging.WARNING, logger="sa_outbox.relay")
    with Relay(engine, OutboxEvent, NoReset(), lease=1.0) as relay:
        report = relay.run_once()
    assert report.unavailable == "the publisher did not finish within 0.5 s"
    assert report.released == 2 and unpublished(engine) == 2
    assert any("has no reset()" in r.getMessage() for r in caplog.records)
